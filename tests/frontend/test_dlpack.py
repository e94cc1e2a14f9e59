"""DLPack in and out of a compiled CPU model (runtime/dlpack.py): inputs read and outputs
written in the caller's memory where the layout allows, the copying path otherwise, the same
values either way."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("celosia.torch")

from celosia.compiler.graph.ir import InputShapeError  # noqa: E402


class TwoHeads(torch.nn.Module):
    """A conv body whose output is both a model output and read by a classifier."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y, self.fc(y.amax((2, 3)))  # ReduceMax: a numpy step reads y


@pytest.fixture(scope="module")
def built():
    torch.manual_seed(0)
    m = TwoHeads().eval()
    x = torch.randn(1, 3, 8, 8)
    c = ct.compile_module(m, x)
    return m, c.built


def _aligned(shape, dtype=np.float32, offset=0):
    """A numpy array whose data starts 64-byte aligned (plus ``offset`` bytes)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    return raw[start:start + n].view(dtype).reshape(shape)


def test_torch_tensors_in_and_out_without_copies(built, monkeypatch):
    m, cm = built
    x = torch.randn(1, 3, 8, 8)
    expected = cm.run({"x": x.numpy().copy()})
    copies = []  # (source, destination) of every np.copyto during the run
    real = np.copyto
    monkeypatch.setattr(np, "copyto", lambda dst, src, **kw: (copies.append((src, dst)),
                                                              real(dst, src, **kw))[1])
    out = {"output_0": torch.empty(1, 8, 8, 8), "output_1": torch.empty(1, 5)}
    got = cm.run_dlpack({"x": x}, out=out)
    # output_0 is also read by a numpy step (the ReduceMax): written by the kernels in the
    # arena, then copied into the caller's buffer; output_1 comes straight from its kernel
    assert cm.zero_copy.last == {"inputs": ["x"], "outputs": ["output_1"]}
    for n, t in out.items():
        assert got[n].ctypes.data == t.data_ptr()  # the caller's buffer itself
        assert np.array_equal(t.numpy(), expected[n])
    xs, o1 = x.numpy(), out["output_1"].numpy()
    assert not [c for c in copies if np.may_share_memory(c[0], xs)]  # x read in place
    assert not [c for c in copies if np.may_share_memory(c[1], o1)]  # written by the kernel
    assert len([c for c in copies if np.may_share_memory(c[1], out["output_0"].numpy())]) == 1
    with torch.no_grad():
        y, z = m(x)
    assert torch.allclose(out["output_0"], y, atol=1e-5)
    assert torch.allclose(out["output_1"], z, atol=1e-5)
    # the next ordinary run uses the arena again
    again = cm.run({"x": x.numpy()})
    assert all(np.array_equal(again[n], expected[n]) for n in expected)


def test_numpy_through_dlpack_and_the_copying_path(built):
    _, cm = built
    rng = np.random.default_rng(1)
    x = _aligned((1, 3, 8, 8))
    x[...] = rng.standard_normal(x.shape)
    expected = cm.run({"x": x.copy()})
    out = {"output_1": _aligned((1, 5))}
    got = cm.run_dlpack({"x": x}, out=out)
    assert cm.zero_copy.last == {"inputs": ["x"], "outputs": ["output_1"]}
    assert got["output_1"].ctypes.data == out["output_1"].ctypes.data
    assert np.array_equal(out["output_1"], expected["output_1"])
    assert np.array_equal(got["output_0"], expected["output_0"])
    # unaligned and strided arrays: copied, the same values
    xu = _aligned((1, 3, 8, 8), offset=4)
    xu[...] = x
    xs = np.asfortranarray(x)
    for feed in (xu, xs, torch.from_numpy(xs)):
        ou = {"output_1": _aligned((1, 5), offset=4)}
        got = cm.run_dlpack({"x": feed}, out=ou)
        assert cm.zero_copy.last["inputs"] == [] and cm.zero_copy.last["outputs"] == []
        assert got["output_1"].ctypes.data == ou["output_1"].ctypes.data
        assert np.array_equal(ou["output_1"], expected["output_1"])
    # run() itself takes DLPack tensors
    assert np.array_equal(cm.run({"x": torch.from_numpy(x)})["output_1"], expected["output_1"])


def test_bad_buffers_are_clear_errors(built):
    _, cm = built
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(InputShapeError, match=r"out\['output_1'\] is float32\[1,4\]; output "
                                              r"'output_1' is float32\[1,5\]"):
        cm.run_dlpack({"x": x}, out={"output_1": torch.empty(1, 4)})
    with pytest.raises(InputShapeError, match=r"out\['nope'\]: the model's outputs are"):
        cm.run_dlpack({"x": x}, out={"nope": torch.empty(1, 5)})
    ro = np.zeros((1, 5), np.float32)
    ro.flags.writeable = False
    with pytest.raises(InputShapeError, match="read-only"):
        cm.run_dlpack({"x": x}, out={"output_1": ro})
    with pytest.raises(InputShapeError, match="cannot be read through DLPack"):
        cm.run_dlpack({"x": torch.randn(1, 3, 8, 8, requires_grad=True)})
    with pytest.raises(InputShapeError, match="pass a float32 array"):
        cm.run_dlpack({"x": torch.randn(1, 3, 8, 8, dtype=torch.float64)})


def test_view_of_an_input_takes_the_copying_path():
    m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)).eval()
    x = torch.randn(2, 3, 4)
    cm = ct.compile_module(m, x).built
    out = {"output_0": torch.empty(2, 3)}
    cm.run_dlpack({"input": x}, out=out)
    assert "input" not in cm.zero_copy.last["inputs"]  # the Flatten view lives in its memory
    with torch.no_grad():
        assert torch.allclose(out["output_0"], m(x), atol=1e-5)


def test_torch_compile_outputs_come_from_the_kernels():
    torch._dynamo.reset()
    ct.reset_report()
    torch.manual_seed(0)
    m = TwoHeads().eval()
    f = torch.compile(m, backend="celosia")
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        y, z = f(x)
        ey, ez = m(x)
    assert torch.allclose(y, ey, atol=1e-5) and torch.allclose(z, ez, atol=1e-5)
    [(_, cm)] = ct.built_models()
    assert cm.zero_copy.last == {"inputs": ["l_x_"], "outputs": ["output_1"]}
    torch._dynamo.reset()
