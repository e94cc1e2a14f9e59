"""The operators of compiler/graph/ops_signal.py (inverse and hyperbolic trigonometry, Swish,
bitwise operators, EyeLike, CumProd, ReverseSequence, RMSNormalization, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv, DFT, STFT, the windows,
MelWeightMatrix): each against onnxruntime on seeded random inputs over its attributes,
through import + reference executor and the compiled CpuModel (onnx_nodes.check_node); then
whole models as users bring them: onnxruntime's dynamically quantized MLP and a QOperator
convolution, and torch's export of an STFT front end."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_nodes import check_node

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.ir import NodeError
from celosia.runtime.cpu import CpuModel


def _normal(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _ints(*shape, lo, hi, dtype, seed=0):
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(dtype)


@pytest.mark.parametrize("op, lo, hi", [
    ("Tan", -1.4, 1.4), ("Asin", -0.99, 0.99), ("Acos", -0.99, 0.99), ("Atan", -9, 9),
    ("Sinh", -5, 5), ("Cosh", -5, 5), ("Asinh", -9, 9), ("Acosh", 1.01, 9),
    ("Atanh", -0.99, 0.99)])
def test_trigonometry(op, lo, hi):
    x = np.random.default_rng(3).uniform(lo, hi, (3, 4, 5)).astype(np.float32)
    check_node(op, ["x"], {"x": x}, opset=13, rtol=2e-6)


@pytest.mark.parametrize("alpha", [None, 1.7, -0.5])
def test_swish(alpha):
    x = _normal(4, 33) * 8
    x[0, :3] = [0, -100, 100]
    check_node("Swish", ["x"], {"x": x}, opset=24,
               attrs={} if alpha is None else {"alpha": alpha})


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.uint16])
def test_bitwise(op, dtype):
    info = np.iinfo(dtype)
    a = _ints(3, 1, 6, lo=info.min, hi=info.max, dtype=dtype, seed=1)
    b = _ints(4, 6, lo=info.min, hi=info.max, dtype=dtype, seed=2)
    if op == "BitwiseNot":
        check_node(op, ["a"], {"a": a}, opset=18)
    else:
        check_node(op, ["a", "b"], {"a": a, "b": b}, opset=18)


@pytest.mark.parametrize("k", [0, 2, -1, 7])
@pytest.mark.parametrize("dtype", [None, TensorProto.INT32, TensorProto.DOUBLE])
def test_eye_like(k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check_node("EyeLike", ["x"], {"x": _normal(4, 6)}, opset=13, attrs=attrs)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, -1, 1])
def test_cum_prod(exclusive, reverse, axis):
    x = np.random.default_rng(5).uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)
    check_node("CumProd", ["x", "axis"], {"x": x}, consts={"axis": np.array(axis)},
               opset=26, attrs={"exclusive": exclusive, "reverse": reverse}, rtol=1e-6)


@pytest.mark.parametrize("batch_axis, time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis):
    x = _normal(5, 4, 3) if time_axis == 0 else _normal(4, 5, 3)
    lens = np.array([1, 5, 3, 2], np.int64)
    check_node("ReverseSequence", ["x", "lens"], {"x": x, "lens": lens}, opset=13,
               attrs={"batch_axis": batch_axis, "time_axis": time_axis})


@pytest.mark.parametrize("axis", [-1, 1, 2])
def test_rms_normalization(axis):
    x = _normal(2, 3, 8) * 3
    scale = _normal(*x.shape[axis:], seed=1) if axis != -1 else _normal(8, seed=1)
    check_node("RMSNormalization", ["x", "scale"], {"x": x}, consts={"scale": scale},
               opset=23, attrs={"axis": axis, "epsilon": 1e-4}, rtol=2e-6)


# ---- integer products ----------------------------------------------------------------------


def test_dynamic_quantize_linear():
    for seed, (lo, hi) in enumerate([(-3, 5), (0.5, 2), (-4, -1), (0, 0)]):
        x = np.random.default_rng(seed).uniform(lo, hi, (3, 17)).astype(np.float32)
        check_node("DynamicQuantizeLinear", ["x"], {"x": x}, opset=13, outputs=3)


@pytest.mark.parametrize("a_type, b_type", [(np.uint8, np.int8), (np.uint8, np.uint8),
                                            (np.int8, np.int8)])
@pytest.mark.parametrize("zero_points", ["none", "scalar", "vector"])
def test_matmul_integer(a_type, b_type, zero_points):
    a = _ints(2, 5, 7, lo=np.iinfo(a_type).min, hi=np.iinfo(a_type).max, dtype=a_type, seed=1)
    b = _ints(7, 6, lo=np.iinfo(b_type).min, hi=np.iinfo(b_type).max, dtype=b_type, seed=2)
    consts, inputs = {}, ["a", "b"]
    if zero_points != "none":
        consts["a_zp"] = np.array(3, a_type)
        n = 6 if zero_points == "vector" else None
        consts["b_zp"] = (_ints(n, lo=0, hi=9, dtype=b_type, seed=3) if n
                          else np.array(5, b_type))
        inputs += ["a_zp", "b_zp"]
    check_node("MatMulInteger", inputs, {"a": a, "b": b}, consts=consts, opset=13)


@pytest.mark.parametrize("group, strides, pads", [(1, [1, 1], [1, 1, 1, 1]),
                                                  (2, [2, 1], [0, 1, 2, 0])])
def test_conv_integer(group, strides, pads):
    x = _ints(1, 4, 7, 6, lo=0, hi=255, dtype=np.uint8, seed=1)
    w = _ints(6, 4 // group, 3, 2, lo=0, hi=255, dtype=np.uint8, seed=2)
    check_node("ConvInteger", ["x", "w", "xz", "wz"], {"x": x},
               consts={"w": w, "xz": np.array(7, np.uint8), "wz": np.array(130, np.uint8)},
               opset=13, attrs={"group": group, "strides": strides, "pads": pads})


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(dtype, per_column):
    info = np.iinfo(dtype)
    a = _ints(3, 4, 16, lo=info.min, hi=info.max, dtype=dtype, seed=1)
    b = _ints(16, 5, lo=info.min, hi=info.max, dtype=dtype, seed=2)
    n = 5 if per_column else 1
    consts = {"sa": np.array(0.02, np.float32), "za": np.array(3, dtype), "b": b,
              "sb": (np.random.default_rng(4).uniform(0.001, 0.01, n).astype(np.float32)
                     if per_column else np.array(0.004, np.float32)),
              "zb": np.zeros(n, dtype) if per_column else np.array(-2 if dtype == np.int8
                                                                  else 9, dtype),
              "sy": np.array(0.5, np.float32), "zy": np.array(10, dtype)}
    check_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], {"a": a},
               consts=consts, opset=21 if per_column else 13)


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(per_channel):
    x = _ints(1, 3, 8, 8, lo=0, hi=255, dtype=np.uint8, seed=1)
    w = _ints(5, 3, 3, 3, lo=-127, hi=127, dtype=np.int8, seed=2)
    ws = (np.random.default_rng(3).uniform(0.002, 0.02, 5).astype(np.float32) if per_channel
          else np.array(0.01, np.float32))
    consts = {"sx": np.array(0.03, np.float32), "zx": np.array(120, np.uint8), "w": w,
              "sw": ws, "zw": np.zeros(5 if per_channel else (), np.int8),
              "sy": np.array(0.2, np.float32), "zy": np.array(100, np.uint8),
              "bias": _ints(5, lo=-500, hi=500, dtype=np.int32, seed=4)}
    check_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"], {"x": x},
               consts=consts, opset=13, attrs={"pads": [1, 1, 1, 1], "strides": [2, 1]})


# ---- signals -------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("inverse, onesided", [(0, 0), (0, 1), (1, 0)])
@pytest.mark.parametrize("complex_in, length", [(False, None), (True, None), (False, 12)])
def test_dft(opset, inverse, onesided, complex_in, length):
    if onesided and complex_in:
        pytest.skip("a one-sided DFT takes a real signal (onnx's shape inference)")
    x = _normal(2, 10, 3, 2 if complex_in or inverse else 1)
    inputs, consts = ["x"], {}
    if length is not None:
        inputs.append("n")
        consts["n"] = np.array(length, np.int64)
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset == 17:
        attrs["axis"] = 1
    else:
        inputs += [""] * (1 - len(inputs) + 1) + ["axis"]
        consts["axis"] = np.array(-3, np.int64)
    check_node("DFT", inputs, {"x": x}, consts=consts, opset=opset, attrs=attrs,
               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window, frame_length, onesided", [
    ("hann", None, 1), (None, 16, 1), ("hann", 16, 0)])
def test_stft(window, frame_length, onesided):
    x = _normal(2, 100, 1)
    inputs, consts = ["x", "step"], {"step": np.array(7, np.int64)}
    inputs.append("w" if window else "")
    if window:
        consts["w"] = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype(np.float32)
    if frame_length:
        inputs.append("n")
        consts["n"] = np.array(frame_length, np.int64)
    check_node("STFT", inputs, {"x": x}, consts=consts, opset=17,
               attrs={"onesided": onesided}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic, size", [(1, 16), (0, 11), (1, 1)])
def test_windows(op, periodic, size):
    check_node(op, ["n"], {}, consts={"n": np.array(size, np.int64)}, opset=17,
               attrs={"periodic": periodic}, atol=1e-6)


@pytest.mark.parametrize("bins, length, rate, lo, hi", [(8, 64, 16000, 0.0, 8000.0),
                                                        (40, 400, 16000, 20.0, 7600.0)])
def test_mel_weight_matrix(bins, length, rate, lo, hi):
    consts = {"b": np.array(bins, np.int64), "n": np.array(length, np.int64),
              "r": np.array(rate, np.int64), "lo": np.array(lo, np.float32),
              "hi": np.array(hi, np.float32)}
    check_node("MelWeightMatrix", ["b", "n", "r", "lo", "hi"], {}, consts=consts, opset=17,
               atol=1e-6)


def test_bad_input_is_named():
    """A frame longer than the signal: the node is named at import, with the sizes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 40, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    consts = [numpy_helper.from_array(np.array(4, np.int64), "step"),
              numpy_helper.from_array(np.array(64, np.int64), "n")]
    node = helper.make_node("STFT", ["x", "step", "", "n"], ["y"], name="spec")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], consts),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(NodeError, match=r"spec.*frame_length 64 \(window 64\) is longer than the signal \(40"):
        import_onnx(model)


# ---- models as users bring them --------------------------------------------------------------


def _save(model, path):
    model.ir_version = 10
    onnx.save(model, path)
    return path


def test_onnxruntime_dynamic_quantization(tmp_path):
    """quantize_dynamic's MLP (DynamicQuantizeLinear, MatMulInteger, Cast, Mul) runs on the
    CPU build with onnxruntime's outputs."""
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 64)).astype(np.float32) * 0.2, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32) * 0.2, "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])],
                              [w1, b1, w2])
    fp32 = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                 tmp_path / "mlp.onnx")
    q8 = tmp_path / "mlp_q8.onnx"
    quantize_dynamic(str(fp32), str(q8), weight_type=QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(q8).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    x = rng.standard_normal((4, 32)).astype(np.float32)
    want = onnxruntime.InferenceSession(str(q8), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = CpuModel.build(str(q8)).run({"x": x})
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)


def test_stft_front_end_from_torch(tmp_path):
    """torch.stft exported (opset 17: STFT with a Hann window) and a log-magnitude."""
    torch = pytest.importorskip("torch")
    import onnxruntime

    class Spec(torch.nn.Module):
        def forward(self, wave):
            s = torch.stft(wave, n_fft=64, hop_length=16, window=torch.hann_window(64),
                           center=False, return_complex=False)
            return torch.log(s.pow(2).sum(-1) + 1e-6)

    wave = torch.randn(2, 400)
    path = tmp_path / "spec.onnx"
    torch.onnx.export(Spec(), (wave,), str(path), dynamo=False, opset_version=17,
                      input_names=["wave"])
    model = onnx.load(path)
    assert "STFT" in {n.op_type for n in model.graph.node}
    _save(model, path)
    want = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"wave": wave.numpy()})[0]
    got = CpuModel.build(str(path)).run({"wave": wave.numpy()})
    out = next(iter(got.values()))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
