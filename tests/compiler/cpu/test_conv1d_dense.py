"""1-D convolutions with long kernels and few output positions as one matrix product of
their windows (compiler/cpu/conv1d_dense.py): CPU builds against onnxruntime and a float64
evaluation on seeded random inputs of odd sizes (batch, channels, strides, overlapping and
disjoint windows), which convolutions it takes and which it leaves."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.graph.ops import conv
from celosia.runtime.cpu import CpuModel

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _model(n, c, length, m, k, stride, pads=(0, 0), bias=False, dilation=1):
    r = np.random.default_rng(n * 1000 + c * 100 + k)
    w = r.standard_normal((m, c, k)).astype(np.float32) * 0.2
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(r.standard_normal(m).astype(np.float32), "b"))
        ins.append("b")
    out = (length + sum(pads) - dilation * (k - 1) - 1) // stride + 1
    node = helper.make_node("Conv", ins, ["y"], strides=[stride], pads=list(pads),
                            dilations=[dilation])
    m_ = make_model([node], [vi("x", [n, c, length])], [vi("y", [n, m, out])], inits)
    x = r.standard_normal((n, c, length)).astype(np.float32)
    return m_, x, w, inits


@pytest.mark.parametrize("n, c, length, m, k, stride", [
    (1, 1, 576, 258, 256, 128),   # Silero's STFT: 3 overlapping windows
    (2, 3, 101, 7, 33, 17),       # batch 2, 3 channels, odd sizes
    (1, 2, 96, 5, 32, 32),        # disjoint windows
    (3, 1, 47, 9, 40, 1),         # stride 1: 8 positions
])
def test_long_kernel_convolutions_are_products(n, c, length, m, k, stride):
    model, x, w, _ = _model(n, c, length, m, k, stride)
    built = CpuModel.build(model, {"x": x.shape})
    ops = {(s["op"], s["kind"]) for s in built.program.steps}
    assert ("MatMul", "kernel") in ops and ("Conv", "numpy") not in ops, ops
    got = built.run({"x": x})["y"]
    want = conv({"kernel_shape": [k], "strides": [stride], "pads": [0, 0], "dilations": [1],
                 "group": 1},
                x.astype(np.float64), w.astype(np.float64))
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = s.run(None, {"x": x})[0]
    assert got.shape == want.shape == theirs.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    {"k": 31},                       # a short kernel: the 2-D kernels (conv1d.py)
    {"k": 32, "pads": (1, 2)},       # padded
    {"k": 32, "bias": True},         # a bias (fused into the convolution kernel)
    {"k": 32, "dilation": 2},
    {"k": 32, "stride": 1, "length": 60},   # 29 positions: more than MAX_POSITIONS
])
def test_other_convolutions_stay_convolutions(kwargs):
    args = {"n": 1, "c": 2, "length": 70, "m": 4, "stride": 8, **kwargs}
    model, x, _, _ = _model(**args)
    built = CpuModel.build(model, {"x": x.shape})
    ops = {(s["op"], s["kind"]) for s in built.program.steps}
    assert ("Conv", "kernel") in ops and ("MatMul", "kernel") not in ops, ops
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(built.run({"x": x})["y"], s.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)
