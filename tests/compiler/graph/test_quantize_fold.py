"""Conv arithmetic the quantizer used to leave in float, now int8 (issue #13):

- a constant of one value multiplying or adding after a table activation (PP-LCNetV3's
  learnable affine ``a * hardswish(x) + b``) goes into the table: QConv + QLut;
- a ConvTranspose whose stride equals its kernel (the 2x2 s2 upsampler) is a 1x1 QConv and
  an int8 pixel shuffle (Reshape, Transpose, Reshape); an overlapping one stays float,
  saying why.

Each model has random weights (seeded): the quantized graph's structure, its output against
onnxruntime on the float model (cosine), the compiled CPU int8 build bit for bit against
the numpy definitions, and the conv placed on the accelerator by partition.annotate."""

import numpy as np
from onnx import helper, numpy_helper
from onnx_builders import make_model, onnxruntime_run, vi

from celosia import HwConfig
from celosia.compiler.accel.partition import annotate
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.cpu import CpuModel


def _cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _quantized(nodes, x_shape, weights, seed=0, method="mse"):
    """(float model, quantized graph, test feed): calibration on 4 normal samples."""
    rng = np.random.default_rng(seed)
    model = make_model(nodes, [vi("x", list(x_shape))], [vi("y", None)],
                       [numpy_helper.from_array(np.asarray(v, np.float32), k)
                        for k, v in weights.items()])
    calib = [{"x": rng.normal(size=x_shape).astype(np.float32)} for _ in range(4)]
    q = quantize_model(model, calib, method=method)
    return model, q, {"x": rng.normal(size=x_shape).astype(np.float32)}


def _check(model, q, test, min_cosine):
    """int8 close to onnxruntime's float result; the CPU build equal to the reference (to
    float32 rounding where a float layer is left: its compiled kernel sums in another
    order)."""
    want = onnxruntime_run(model, test)["y"]
    ref = run_graph(q, test)["y"]
    got = CpuModel.from_graph(q).run(test)["y"]
    if any("float_reason" in n.attrs for n in q.nodes):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, ref)
    assert _cosine(want, ref) > min_cosine, _cosine(want, ref)


def _affine_hardswish(scale, shift):
    """Conv -> HardSwish -> Mul by ``scale`` -> Add ``shift`` (PP-LCNetV3's blocks)."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4, name="conv"),
             helper.make_node("HardSwish", ["c"], ["h"]),
             helper.make_node("Mul", ["h", "s"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["y"])]
    weights = {"w": rng.normal(0, 0.3, (16, 8, 3, 3)), "b": rng.normal(0, 0.5, 16),
               "s": scale, "t": shift}
    return _quantized(nodes, (1, 8, 12, 12), weights)


def test_a_constant_affine_after_hardswish_goes_into_the_table():
    model, q, test = _affine_hardswish(np.array([0.43]), np.array([-0.08]))
    ops = [n.op for n in q.nodes]
    assert ops == ["Quantize", "QConv", "QLut", "Dequantize"], ops
    assert not any("float_reason" in n.attrs for n in q.nodes)
    _check(model, q, test, 0.999)
    # The table is a * hardswish(v) + b on the QLut's input steps: some entry is negative
    # (b < 0, where hardswish is 0) and the largest is a * max + b, not hardswish's max.
    lut = q.nodes[2]
    table = q.initializers[lut.inputs[1]].astype(np.float64) * lut.attrs["scale"]
    assert table.min() < 0 and np.isclose(table.min(), -0.08 - 0.43 * 0.375,
                                          atol=2 * lut.attrs["scale"])
    places = annotate(q, HwConfig())
    assert places["conv"].target == "accel", places["conv"]


def test_an_affine_table_output_takes_the_mse_range():
    """One channel in 64 twenty times the others' range: the table's output scale clips it
    (the MSE range, quantize._mse_ranges) instead of spending every step on it."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4, name="conv"),
             helper.make_node("HardSwish", ["c"], ["h"]),
             helper.make_node("Mul", ["h", "s"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["y"])]
    w = rng.normal(0, 0.3, (64, 8, 3, 3))
    w[0] *= 20  # the outlier channel
    weights = {"w": w, "b": np.zeros(64), "s": np.array([0.43]), "t": np.array([-0.08])}
    (model, q, test), (_, q_max, _) = (_quantized(nodes, (1, 8, 12, 12), weights, 6, m)
                                       for m in ("mse", "minmax"))
    assert [n.op for n in q.nodes] == ["Quantize", "QConv", "QLut", "Dequantize"]
    assert q.nodes[2].attrs["scale"] < 0.9 * q_max.nodes[2].attrs["scale"]
    _check(model, q, test, 0.99)


def test_a_per_channel_constant_after_the_table_stays_float_saying_why():
    """The conv and its table are int8 (the epilogue split after the table,
    matmul_epilogue.split_layer_epilogues); the per-channel Mul after it is a float node."""
    channel = np.linspace(0.2, 1.0, 16).reshape(1, 16, 1, 1)
    model, q, test = _affine_hardswish(channel, np.array([0.1]))
    ops = {n.name: n for n in q.nodes}
    assert ops["conv"].op == "QConv" and ops["conv/lut"].op == "QLut"
    mul = next(n for n in q.nodes if n.op == "Mul")
    assert "constant" in mul.attrs["float_reason"], mul.attrs["float_reason"]
    assert annotate(q, HwConfig())["conv"].target == "accel"
    _check(model, q, test, 0.999)


def _upsampler(kernel, strides, seed=2, **attrs):
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"], pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "w", "b"], ["u"], name="up",
                              kernel_shape=kernel, strides=strides, **attrs),
             helper.make_node("Relu", ["u"], ["v"]),
             helper.make_node("Conv", ["v", "w1"], ["y"], pads=[1] * 4)]
    weights = {"w0": rng.normal(0, 0.3, (12, 6, 3, 3)), "b0": rng.normal(0, 0.1, 12),
               "w": rng.normal(0, 0.3, (12, 5, *kernel)), "b": rng.normal(0, 0.1, 5),
               "w1": rng.normal(0, 0.3, (4, 5, 3, 3))}
    return _quantized(nodes, (2, 6, 7, 9), weights, seed)


def test_a_stride_two_upsampler_is_a_1x1_qconv_and_an_int8_pixel_shuffle():
    model, q, test = _upsampler([2, 2], [2, 2])
    up = next(n for n in q.nodes if n.name == "up")
    assert up.op == "QConv" and up.attrs["kernel_shape"] == [1, 1]
    assert q.types[up.outputs[0]].shape == (2, 5 * 2 * 2, 7, 9)
    # The shuffle moves int8 values; the Relu after it too: no float node is left.
    after = [n.op for n in q.nodes[q.nodes.index(up) + 1:]]
    assert after == ["Reshape", "Transpose", "Reshape", "Relu", "QConv", "Dequantize"], after
    assert all(q.types[n.outputs[0]].dtype == "int8" for n in q.nodes[:-1]
               if n.op != "Quantize")
    _check(model, q, test, 0.999)
    places = annotate(q, HwConfig())
    assert places["up"].target == "accel", places["up"]


def test_an_upsampler_of_another_kernel_and_stride_keeps_its_exact_form():
    model, q, test = _upsampler([3, 2], [3, 2], seed=3)
    assert next(n for n in q.nodes if n.name == "up").op == "QConv"
    _check(model, q, test, 0.999)


def test_a_dilated_conv_transpose_stays_float_saying_why():
    # (overlapping windows, pads and output_padding have an int8 form:
    # test_qtranspose_overlap.py)
    for kernel, strides, attrs, words in (([3, 3], [2, 2], {"dilations": [2, 2]},
                                           "dilations=[2, 2]"),):
        rng = np.random.default_rng(4)
        group = attrs.get("group", 1)
        nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
                 helper.make_node("ConvTranspose", ["a", "w"], ["y"], name="up",
                                  kernel_shape=kernel, strides=strides, **attrs)]
        weights = {"w0": rng.normal(0, 0.3, (4, 3, 1, 1)),
                   "w": rng.normal(0, 0.3, (4, 6 // group, *kernel))}
        model, q, test = _quantized(nodes, (1, 3, 6, 6), weights)
        up = next(n for n in q.nodes if n.name == "up")
        assert up.op == "ConvTranspose", (kernel, attrs)
        assert words in up.attrs["float_reason"], up.attrs["float_reason"]
        _check(model, q, test, 0.999)


def test_a_residual_add_after_silu_is_a_qlut_then_a_qadd():
    """YOLO's bottleneck x + silu(conv(x)): QConv (accelerator), QLut, QAdd."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["r"], pads=[1] * 4),
             helper.make_node("Conv", ["r", "w1", "b1"], ["a"], pads=[1] * 4, name="conv"),
             helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Mul", ["a", "s"], ["t"]),
             helper.make_node("Add", ["t", "r"], ["y"])]
    weights = {"w0": rng.normal(0, 0.3, (8, 6, 3, 3)), "b0": rng.normal(0, 0.1, 8),
               "w1": rng.normal(0, 0.3, (8, 8, 3, 3)), "b1": rng.normal(0, 0.1, 8)}
    model, q, test = _quantized(nodes, (1, 6, 10, 10), weights, seed=5)
    ops = [n.op for n in q.nodes]
    assert ops == ["Quantize", "QConv", "QConv", "QLut", "QAdd", "Dequantize"], ops
    _check(model, q, test, 0.999)
    assert annotate(q, HwConfig())["conv"].target == "accel"
