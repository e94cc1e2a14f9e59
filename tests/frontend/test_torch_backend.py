"""celosia.torch: the torch.compile backend "celosia" and compile_module (docs/torch.md).

fp32 builds equal eager PyTorch within float tolerance; int8 builds on the functional
simulator equal celosia's all-CPU int8 build of the same quantized graph bit for bit; graphs
celosia cannot take run in PyTorch and are reported with the reason."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("celosia.torch")


class Net(torch.nn.Module):
    """Convolutions, then attention over the pixels with LayerNorm, then a classifier."""

    def __init__(self, channels: int = 16, heads: int = 2, classes: int = 10):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.c2 = torch.nn.Conv2d(channels, channels, 3, padding=1, stride=2)
        self.ln = torch.nn.LayerNorm(channels)
        self.att = torch.nn.MultiheadAttention(channels, heads, batch_first=True)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        t = self.ln(y.flatten(2).transpose(1, 2))
        a, _ = self.att(t, t, t, need_weights=False)
        return self.fc((t + a).mean(1))


class Broken(Net):
    """Net with a graph break between the convolutions and the attention."""

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        torch._dynamo.graph_break()
        t = self.ln(y.flatten(2).transpose(1, 2))
        a, _ = self.att(t, t, t, need_weights=False)
        return self.fc((t + a).mean(1))


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    ct.reset_report()
    yield
    torch._dynamo.reset()


def _net(cls=Net, seed=0):
    torch.manual_seed(seed)
    return cls().eval()


def _inputs(n, seed=1, shape=(1, 3, 8, 8)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]


def _close(ours, eager):
    scale = eager.abs().max().item()
    assert ours.shape == eager.shape and ours.dtype == eager.dtype
    assert (ours - eager).abs().max().item() <= 1e-5 * max(scale, 1.0)


def test_fp32_cpu_equals_eager():
    m = _net()
    f = torch.compile(m, backend="celosia")
    with torch.no_grad():
        for x in _inputs(3):
            _close(f(x), m(x))
    r = ct.report()
    assert r["taken"] == 1 and r["refused"] == 0
    g = r["graphs"][0]
    assert g["ran_on"] == "celosia:cpu" and g["builds"] == 1
    assert {"Conv", "LayerNormalization", "Softmax", "MatMul"} <= set(g["onnx_ops"])


@pytest.mark.parametrize("target", ["fsim", "cycle"])
def test_int8_accelerator_bit_exact_with_cpu_int8_build(target, tmp_path):
    m, cal = _net(), _inputs(4, seed=2)
    f = torch.compile(m, backend="celosia", options={"target": target, "quantize": "int8",
                                                     "calibration": cal})
    x = _inputs(1, seed=3)[0]
    with torch.no_grad():
        ours, eager = f(x), m(x)
    assert ct.report()["graphs"][0]["ran_on"] == f"celosia:{target}"
    [(_, built)] = ct.built_models()
    assert built.build_info["accel_nodes"] > 0  # layers really ran on the accelerator
    name = built.graph.inputs[0]
    cpu = built.cpu_build().run({name: x.numpy()})
    [out] = built.graph.outputs
    assert np.array_equal(ours.numpy(), cpu[out])
    # int8, not a copy of eager: close to it, not equal
    scale = eager.abs().max().item()
    assert 0 < (ours - eager).abs().max().item() < 0.1 * scale
    # ahead of time, the same module and calibration: the same int8 graph, the same bits,
    # also from the saved .cel
    from celosia.runtime.accel import AccelModel

    path = tmp_path / "net.cel"
    aot = ct.compile_module(m, (x,), target=target, quantize="int8", calibration=cal,
                            save=str(path))
    assert np.array_equal(aot(x).numpy(), ours.numpy())
    loaded = AccelModel.load(path)
    assert np.array_equal(loaded.run({"x": x.numpy()}, target=target)["output_0"],
                          ours.numpy())


def test_int8_cpu_target_runs_the_cpu_build(monkeypatch):
    """target "cpu" with int8: the all-CPU int8 build (a CpuModel, LLVM kernels), never the
    accelerator model or its simulator; bit-exact with cpu_build() of the same graph."""
    from celosia.runtime.accel import AccelModel
    from celosia.runtime.cpu import CpuModel

    m, cal = _net(), _inputs(4, seed=2)
    f = torch.compile(m, backend="celosia", options={"target": "cpu", "quantize": "int8",
                                                     "calibration": cal})
    x = _inputs(1, seed=3)[0]

    def no_accel_run(*a, **k):
        raise AssertionError("AccelModel.run called for target cpu")
    monkeypatch.setattr(AccelModel, "run", no_accel_run)
    with torch.no_grad():
        ours = f(x)
    assert ct.report()["graphs"][0]["ran_on"] == "celosia:cpu"
    [(_, built)] = ct.built_models()
    assert isinstance(built, CpuModel)
    assert any(s["op"] == "QConv" for s in built.program.steps)  # the integer kernels
    monkeypatch.undo()
    aot = ct.compile_module(m, (x,), target="cpu", quantize="int8", calibration=cal)
    assert isinstance(aot.built, CpuModel)
    assert torch.equal(aot(x), ours)
    # the accelerator build of the same graph (checked against its cpu_build() above)
    torch._dynamo.reset()
    q = torch.compile(m, backend="celosia", options={"target": "fsim", "quantize": "int8",
                                                     "calibration": cal})
    with torch.no_grad():
        assert torch.equal(q(x), ours)


def test_graph_break_falls_back_and_is_reported():
    m = _net(Broken)
    f = torch.compile(m, backend="celosia")
    x = _inputs(1)[0]
    with torch.no_grad():
        _close(f(x), m(x))
    r = ct.report()
    assert r["taken"] == 2  # one graph either side of the break, both built
    assert any("graph_break" in reason for reason in r["graph_breaks"])
    # int8: the samples give forward's argument; the graph after the break takes another
    # value, so it runs in PyTorch and says why
    torch._dynamo.reset()
    ct.reset_report()
    g = torch.compile(m, backend="celosia", options={"quantize": "int8",
                                                     "calibration": _inputs(2, seed=2)})
    with torch.no_grad():
        y = g(x)
    r = ct.report()
    assert [row["ran_on"] for row in r["graphs"]] == ["celosia:cpu", "pytorch"]
    assert "graph break" in r["graphs"][1]["reason"]
    [(_, built)] = ct.built_models()  # target cpu: the int8 CPU build, a CpuModel
    [name], [out] = built.program.inputs, built.program.outputs
    with torch.no_grad():
        mid = built.run({name: x.numpy()})[out]
        t = m.ln(torch.from_numpy(mid).flatten(2).transpose(1, 2))
        a, _ = m.att(t, t, t, need_weights=False)
        # (PyTorch's own graph and nn.MultiheadAttention's fused path round differently)
        _close(y, m.fc((t + a).mean(1)))


def test_unsupported_operator_runs_in_pytorch_with_reason():
    def fn(x):
        return torch.cumprod(torch.relu(x), 0) + 1

    f = torch.compile(fn, backend="celosia")
    x = torch.randn(4, 5)
    with torch.no_grad():
        assert torch.equal(f(x), fn(x))
    [row] = ct.report()["graphs"]
    assert row["ran_on"] == "pytorch" and "cumprod" in row["reason"]


def test_input_written_in_place_runs_in_pytorch():
    def fn(x):
        x[0].add_(1)  # through a view of the input
        return torch.relu(x * 2)

    def fine(x):  # in place on values the graph made: taken
        y = torch.relu(x * 3)
        y.relu_()
        return torch.nn.functional.relu(y + 1, inplace=True)

    for h, taken in ((fn, False), (fine, True)):
        torch._dynamo.reset()
        ct.reset_report()
        f = torch.compile(h, backend="celosia")
        a = torch.randn(2, 3)
        b = a.clone()
        with torch.no_grad():
            assert torch.equal(f(a), h(b))
        assert torch.equal(a, b)  # the caller's tensor written as eager writes it
        [row] = ct.report()["graphs"]
        assert row["ran_on"] == ("celosia:cpu" if taken else "pytorch")
        if not taken:
            assert "writes its input 'l_x_'" in row["reason"] and "add_" in row["reason"]


def test_autograd_on_is_refused_with_reason():
    m = _net()
    f = torch.compile(m, backend="celosia")
    x = _inputs(1)[0]
    assert torch.allclose(f(x), m(x))
    [row] = ct.report()["graphs"]
    assert row["ran_on"] == "pytorch" and "torch.no_grad()" in row["reason"]


def test_new_shapes_and_changed_weights_build_again():
    m = _net()
    f = torch.compile(m, backend="celosia")
    with torch.no_grad():
        for shape in [(1, 3, 8, 8), (2, 3, 6, 10)]:
            x = _inputs(1, shape=shape)[0]
            _close(f(x), m(x))
        m.fc.weight.mul_(2)  # in place: the build's constants are stale
        _close(f(x), m(x))
    assert all(row["ran_on"] == "celosia:cpu" for row in ct.report()["graphs"])


def test_compile_module_saves_a_cel(tmp_path):
    from celosia.runtime.cpu import CpuModel

    m = _net()
    x = _inputs(1)[0]
    path = tmp_path / "net.cel"
    c = ct.compile_module(m, x, save=str(path))
    with torch.no_grad():
        _close(c(x), m(x))
    loaded = CpuModel.load(path)
    out = loaded.run({"x": x.numpy()})["output_0"]
    assert np.array_equal(out, c(x).numpy())


@pytest.mark.parametrize("options, match", [
    ({"targt": "cpu"}, r"unknown option\(s\) \['targt'\]"),
    ({"target": "gpu"}, r"'target' is 'gpu'; it must be one of 'cpu', 'fsim', 'cycle'"),
    ({"target": "fsim"}, r"target 'fsim' runs int8 models"),
    ({"quantize": "int4", "calibration": [1]}, r"'quantize' is 'int4'"),
    ({"quantize": "int8"}, r"needs \"calibration\""),
    ({"quantize": "int8", "calibration": [[1.0]]}, r"calibration sample 0 \[0\] is a float"),
    ({"calibration": []}, r"'calibration' is for int8"),
    ({"quantize": "int8", "calibration": [], "config": "nope"}, r"needs \"calibration\""),
    ("cpu", r"options must be a dict"),
])
def test_bad_options_are_clear_errors(options, match):
    with pytest.raises(ct.TorchOptionsError, match=match):
        ct.check_options(options)


def test_bad_options_through_torch_compile():
    f = torch.compile(lambda x: x + 1, backend="celosia", options={"target": "gpu"})
    with pytest.raises(Exception, match="'target' is 'gpu'"):
        f(torch.ones(2))
    torch._dynamo.reset()
    f = torch.compile(lambda x: x + 1, backend="celosia", mode="max-autotune")
    with pytest.raises(Exception, match="mode='max-autotune' is a setting of the inductor"):
        f(torch.ones(2))


def test_bad_config_names_the_presets():
    from celosia.config import ConfigError

    with pytest.raises(ConfigError, match="neither a preset"):
        ct.check_options({"quantize": "int8", "calibration": [torch.ones(1)], "config": "nope"})


class Tokens(torch.nn.Module):
    """Token ids and a mask (two inputs, one int64), a Transformer encoder layer, BatchNorm."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.enc = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.bn = torch.nn.BatchNorm1d(16)
        self.fc = torch.nn.Linear(16, 3)

    def forward(self, ids, mask):
        h = self.enc(self.emb(ids) * mask.unsqueeze(-1))
        return self.fc(self.bn(h.mean(1)))


def _tokens(seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(2, 7)
    mask[1, 5:] = 0
    return torch.randint(0, 50, (2, 7), generator=g), mask


def test_two_inputs_transformer_layer_and_the_fast_path_hint():
    torch.manual_seed(0)
    m = Tokens().eval()
    ids, mask = _tokens(1)
    fast = torch.backends.mha.get_fastpath_enabled()
    try:
        torch.backends.mha.set_fastpath_enabled(True)
        f = torch.compile(m, backend="celosia")
        with torch.no_grad():
            assert torch.equal(f(ids, mask), m(ids, mask))
        [row] = ct.report()["graphs"]
        assert row["ran_on"] == "pytorch"
        assert "set_fastpath_enabled(False)" in row["reason"]

        torch.backends.mha.set_fastpath_enabled(False)
        torch._dynamo.reset()
        ct.reset_report()
        with torch.no_grad():
            _close(torch.compile(m, backend="celosia")(ids, mask), m(ids, mask))
        # int8: samples as tuples in forward's order and as dicts by name map alike
        for cal in ([_tokens(s) for s in (2, 3)],
                    [dict(zip(("ids", "mask"), _tokens(s))) for s in (2, 3)]):
            torch._dynamo.reset()
            ct.reset_report()
            q = torch.compile(m, backend="celosia", options={
                "target": "fsim", "quantize": "int8", "calibration": cal})
            with torch.no_grad():
                ours = q(ids, mask)
            [(_, built)] = ct.built_models()
            assert built.build_info["accel_nodes"] > 0
            names = {"l_ids_": ids.numpy(), "l_mask_": mask.numpy()}
            assert set(built.graph.inputs) == set(names)
            cpu = built.cpu_build().run(names)
            assert np.array_equal(ours.numpy(), cpu[built.graph.outputs[0]])
            if isinstance(cal[0], tuple):
                first = ours
            else:
                assert torch.equal(ours, first)  # the same scales either way
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)
