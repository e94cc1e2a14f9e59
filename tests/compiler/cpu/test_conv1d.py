"""1-D convolutions on the compiled 2-D kernels (compiler/cpu/conv1d.py): whole CPU builds
against onnxruntime and a float64 evaluation on seeded random inputs over the attribute
space (strides, asymmetric pads, dilations, groups, depthwise, odd sizes, batch > 1),
fused activations and residual adds, chains (read as 2-D between convolutions) and values
read both by a convolution and by other nodes."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi, onnxruntime_run as _onnxruntime

from celosia.compiler.graph.ops import conv
from celosia.runtime.cpu import CpuModel

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _const(name, a):
    return numpy_helper.from_array(np.asarray(a), name)



def _kinds(model) -> dict:
    """{op: step kind} of the build's steps (after a profiled run)."""
    return {(p["op"], p["kind"]) for p in model.profile}


# (N, C, L, M, kernel, stride, pads, dilation, group, bias)
CASES = [
    (1, 1, 576, 258, 128, 64, (0, 0), 1, 1, False),   # Silero's STFT as a convolution
    (2, 129, 7, 128, 3, 1, (1, 1), 1, 1, True),        # its encoder, batch 2
    (3, 16, 33, 24, 5, 2, (2, 1), 1, 1, True),         # asymmetric pads, odd length
    (1, 12, 20, 8, 3, 1, (2, 2), 2, 4, True),          # groups, dilation
    (2, 32, 17, 32, 7, 1, (3, 3), 1, 32, False),       # depthwise
    (1, 5, 9, 3, 1, 1, (0, 0), 1, 1, True),            # pointwise, odd channels
]


@pytest.mark.parametrize("case", CASES, ids=[f"c{c[1]}l{c[2]}k{c[4]}s{c[5]}g{c[8]}"
                                              for c in CASES])
def test_conv1d_against_onnxruntime_and_float64(case):
    n, c, length, m, k, s, p, d, g, bias = case
    rng = np.random.default_rng(len(CASES) + sum(map(hash, map(str, case))) % 2**32)
    x = rng.normal(size=(n, c, length)).astype(np.float32)
    w = rng.normal(size=(m, c // g, k)).astype(np.float32)
    b = rng.normal(size=m).astype(np.float32)
    attrs = dict(kernel_shape=[k], strides=[s], pads=list(p), dilations=[d], group=g)
    inputs = ["x", "w"] + (["b"] if bias else [])
    m_ = make_model([helper.make_node("Conv", inputs, ["y"], **attrs)], [vi("x", list(x.shape))],
                    [vi("y", None)], [_const("w", w)] + ([_const("b", b)] if bias else []))
    built = CpuModel.build(m_)
    got = built.run({"x": x}, profile=True)["y"]
    # (a long kernel with few positions, Silero's STFT, is a product: conv1d_dense.py)
    assert {("Conv", "kernel"), ("MatMul", "kernel")} & _kinds(built)
    want = _onnxruntime(m_, {"x": x})["y"]
    assert got.shape == want.shape
    exact = conv(attrs, x.astype(np.float64), w.astype(np.float64),
                 b.astype(np.float64) if bias else None)
    scale = np.abs(exact).max()
    assert np.abs(got - exact).max() <= 2e-6 * scale
    assert np.abs(got - want).max() <= 4e-6 * scale


def test_a_chain_with_fused_epilogues_and_other_readers(tmp_path):
    """conv -> relu -> conv (+ residual add) -> conv: read as 2-D between convolutions;
    the middle value is also a graph output and read by a ReduceMean."""
    rng = np.random.default_rng(3)
    c, length = 24, 19
    ws = [rng.normal(size=(c, c, 3)).astype(np.float32) * 0.2 for _ in range(3)]
    bs = [rng.normal(size=c).astype(np.float32) for _ in range(3)]
    conv_ = dict(kernel_shape=[3], pads=[1, 1])
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], **conv_),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], **conv_),
             helper.make_node("Add", ["c1", "x"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["mid"]),
             helper.make_node("Conv", ["mid", "w2", "b2"], ["c2"], strides=[2], **conv_),
             helper.make_node("ReduceMean", ["mid"], ["mean"], axes=[2], keepdims=0)]
    inits = [_const(f"w{i}", ws[i]) for i in range(3)] + [_const(f"b{i}", bs[i])
                                                          for i in range(3)]
    m = make_model(nodes, [vi("x", [2, c, length])],
                   [vi("c2", None), vi("mid", None), vi("mean", None)], inits, opset=17)
    built = CpuModel.build(m)
    for seed in range(2):
        x = np.random.default_rng(seed).normal(size=(2, c, length)).astype(np.float32)
        got, want = built.run({"x": x}, profile=True), _onnxruntime(m, {"x": x})
        for name in want:
            assert got[name].shape == want[name].shape, name
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5,
                                       atol=1e-5 * np.abs(want[name]).max(), err_msg=name)
    steps = [p["op"] for p in built.profile if p["kind"] == "kernel" and p["op"] == "Conv"]
    assert len(steps) == 3
    built.save(tmp_path / "m.cel")
    x = np.random.default_rng(9).normal(size=(2, c, length)).astype(np.float32)
    np.testing.assert_array_equal(CpuModel.load(tmp_path / "m.cel").run({"x": x})["c2"],
                                  built.run({"x": x})["c2"])


def test_a_run_time_weight_or_a_2d_conv_is_left_as_it_was():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1, 4, 10)).astype(np.float32)
    w = rng.normal(size=(6, 4, 3)).astype(np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3])],
                   [vi("x", [1, 4, 10]), vi("w", [6, 4, 3])], [vi("y", None)])
    built = CpuModel.build(m)
    got = built.run({"x": x, "w": w}, profile=True)["y"]
    assert ("Conv", "numpy") in _kinds(built)
    np.testing.assert_allclose(got, _onnxruntime(m, {"x": x, "w": w})["y"], rtol=1e-5,
                               atol=1e-5)
