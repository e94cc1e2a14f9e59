"""Convolutions whose output channels have no block of 8 or more (YOLO's 255 = 3 x 85,
21 or 19 segmentation classes, 17 keypoints, 3 colours, one depth map): the CPU build
computes ``padded_channels`` of them in blocks of 16 (zero weights and bias for the extra
ones) and drops the extra ones in the unpack to the plain layout. Checked against the numpy
reference and onnxruntime on seeded random inputs, with biases, activations, strides,
widened outputs, batches and a reader that wants the value blocked again."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import cpu_build_checked, make_model, vi

from celosia.compiler.cpu.schedules import channel_block, dense_columns, padded_channels
from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.usefixtures("private_cache")


def test_padded_channel_counts():
    for channels, want in [(255, 256), (85, 96), (21, 32), (17, 32), (36, 48), (3, 8), (1, 8),
                           (5, 8), (8, 8), (16, 16), (24, 24), (1000, 1000), (126, 128)]:
        got = padded_channels(channels)
        assert got == want, (channels, got)
        assert got >= channels and channel_block(got) >= 8


def _model(c, m, kernel, stride, act, bias, seed, after=None):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(
        (rng.normal(size=(m, c, kernel, kernel)) / np.sqrt(c * kernel ** 2)).astype(np.float32),
        "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(size=m).astype(np.float32), "b"))
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"],
                              pads=[kernel // 2] * 4, strides=[stride, stride])]
    last = "c"
    if act:
        nodes.append(helper.make_node(act, ["c"], ["a"]))
        last = "a"
    if after == "conv":  # a reader that takes the value in a blocked layout again
        inits.append(numpy_helper.from_array(
            (rng.normal(size=(16, m, 3, 3)) / np.sqrt(9 * m)).astype(np.float32), "w2"))
        nodes.append(helper.make_node("Conv", [last, "w2"], ["y"], pads=[1, 1, 1, 1]))
    elif after == "pool":
        nodes.append(helper.make_node("MaxPool", [last], ["y"], kernel_shape=[2, 2],
                                      strides=[2, 2]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    return make_model(nodes, [vi("x", None)], [vi("y", None)], inits)


@pytest.mark.parametrize("c, m, kernel, stride, act, bias, shape, after", [
    (64, 255, 1, 1, None, True, (1, 40, 40), None),       # YOLO's head
    (32, 85, 1, 1, "Sigmoid", True, (2, 20, 20), None),   # batch 2, an activation fused
    (16, 21, 3, 1, "Relu", False, (1, 29, 29), None),     # widened output (29 -> 30)
    (8, 3, 9, 1, "Tanh", True, (1, 33, 33), None),        # style transfer's last layer
    (16, 1, 3, 2, None, True, (1, 31, 31), None),         # a depth map, stride 2
    (24, 17, 3, 1, None, True, (1, 12, 12), "conv"),      # read blocked again
    (16, 36, 3, 1, "Relu", True, (1, 14, 14), "pool"),
])
def test_padded_channels_against_references(c, m, kernel, stride, act, bias, shape, after):
    model = _model(c, m, kernel, stride, act, bias, m * 7 + kernel, after)
    full = (shape[0], c, *shape[1:])
    x = np.random.default_rng(m).normal(size=full).astype(np.float32)
    built, _ = cpu_build_checked(model, {"x": x})
    # the convolution computed the padded channels, and the unpack cropped them
    convs = [s for s in built.program.steps if s["op"] == "Conv"]
    first = built.program.values[convs[0]["outputs"][0]]["shape"]
    assert first[1] * first[4] == padded_channels(m) and first[4] >= 8
    crops = [s for s in built.program.steps if s["op"] == "unpack"
             and "out" in built.program.specs[s["kernel"]]]
    assert len(crops) == 1 and built.program.specs[crops[0]["kernel"]]["out"][1] == m


def test_operand_epilogue_keeps_exact_channels():
    """A per-channel operand in the epilogue (a Mul by a [C, 1, 1] constant) is not
    padded: that layer keeps its own block."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(size=(21, 16, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(21, 1, 1)).astype(np.float32), "s")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    model = make_model(nodes, [vi("x", None)], [vi("y", None)], inits)
    x = rng.normal(size=(1, 16, 10, 10)).astype(np.float32)
    built = CpuModel.build(model, {"x": x.shape})
    want = ReferenceModel.load(model, {"x": x.shape}).run({"x": x})["y"]
    np.testing.assert_allclose(built.run({"x": x})["y"], want, rtol=1e-4,
                               atol=1e-5 * np.abs(want).max())


def test_dense_column_counts():
    for n, want in [(1000, 1008), (5000, 5008), (30, 32), (10, 16), (9, 16), (24, 24),
                    (64, 64), (100, 112), (8, 8)]:
        assert dense_columns(n) == want, n


def _dense_model(m, k, n, op, bias, act, residual, seed):
    rng = np.random.default_rng(seed)
    w = (rng.normal(size=(k, n)) / np.sqrt(k)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(rng.normal(size=n).astype(np.float32), "b")]
    if op == "Gemm":
        nodes = [helper.make_node("Gemm", ["x", "w"] + (["b"] if bias else []), ["t"])]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["u"]),
                 helper.make_node("Add" if bias else "Identity",
                                  ["u", "b"] if bias else ["u"], ["t"])]
    last = "t"
    if act:
        nodes.append(helper.make_node(act, ["t"], ["a"]))
        last = "a"
    if residual:  # an (m, n) operand in the epilogue: the columns stay n
        nodes.append(helper.make_node("Add", [last, "r"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    inputs = [vi("x", None)] + ([vi("r", None)] if residual else [])
    return make_model(nodes, inputs, [vi("y", None)], inits)


@pytest.mark.parametrize("shape, n, op, bias, act, residual", [
    ((197, 384), 1000, "Gemm", True, "Relu", False),   # padded rows and columns
    ((1, 512), 10, "Gemm", True, None, False),
    ((2, 64, 256), 30, "MatMul", False, "Sigmoid", False),
    ((1, 16, 96), 100, "MatMul", True, None, False),
    ((40, 64), 100, "Gemm", True, None, True),
])
def test_dense_padded_columns_against_references(shape, n, op, bias, act, residual):
    model = _dense_model(shape[-2], shape[-1], n, op, bias, act, residual, n + len(shape))
    rng = np.random.default_rng(n)
    feeds = {"x": rng.normal(size=shape).astype(np.float32)}
    if residual:
        feeds["r"] = rng.normal(size=(*shape[:-1], n)).astype(np.float32)
    built, _ = cpu_build_checked(model, feeds)
    (dense,) = [built.program.specs[s["kernel"]] for s in built.program.steps
                if s.get("kernel") and built.program.specs[s["kernel"]]["op"] == "dense"]
    columns = dense["weight"][0] * dense["weight"][2]
    assert columns == (n if residual else dense_columns(n))


@pytest.mark.parametrize("m, kernel, relu", [(255, 1, False), (21, 3, True), (3, 3, False)])
def test_int8_padded_channels_bit_exact(m, kernel, relu):
    """int8: a QConv of such a channel count computes the padded channels on the host's
    dot-product form, its unpack crops them; bit-exact with qops.py's definition."""
    from celosia.compiler.cpu.int8_forms import host_form
    from celosia.compiler.graph.reference import run_graph
    from celosia.compiler.pipeline import quantize_model

    if host_form() is None:
        pytest.skip("no int8 dot-product form on this CPU")
    rng = np.random.default_rng(m)
    model = _model(16, m, kernel, 1, "Relu" if relu else None, True, m)
    calib = rng.normal(size=(4, 16, 12, 12)).astype(np.float32)
    q = quantize_model(model, {"x": calib}, input_shapes={"x": (1, 16, 12, 12)})
    built = CpuModel.from_graph(q)
    x = {"x": rng.normal(size=(1, 16, 12, 12)).astype(np.float32)}
    np.testing.assert_array_equal(built.run(x)["y"], run_graph(q, x)["y"])
    specs = [built.program.specs[s["kernel"]] for s in built.program.steps if s.get("kernel")]
    qdot = [s for s in specs if s["op"] == "qdot"]
    if m == 3:  # 16 -> 3 is too little work for the dot-product kernel: the other int8 one
        assert not qdot
        return
    assert qdot[0]["out_channels"] == padded_channels(m) and qdot[0]["out"][4] >= 8
    assert any(s["op"] == "unpack" and s.get("out", [0, 0])[1] == m for s in specs)
