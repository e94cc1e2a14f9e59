"""CNN kernels of compiler/cpu/schedules_conv.py (ConvTranspose) against the graph's numpy
definition (graph/ops_nn.py) on seeded random inputs over the attribute space, with a
float64 evaluation as the yardstick, and in whole builds against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from celosia.compiler.cpu.kernels import compile_spec
from celosia.compiler.cpu.schedules import pack_nchwc, unpack_nchwc
from celosia.compiler.cpu.schedules_conv import pack_conv_transpose_weight
from celosia.compiler.graph.ops_nn import conv_transpose

ort = pytest.importorskip("onnxruntime")

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


# (N, C, H, W, M, kernel, strides, pads, dilations, output_padding, group, cb, ob)
CASES = [
    (1, 32, 8, 8, 16, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), (0, 0), 1, 16, 16),  # U-Net's
    (2, 16, 5, 7, 8, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), (0, 0), 1, 8, 8),
    (1, 8, 6, 6, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 1, 8, 8),
    (1, 12, 7, 9, 4, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 1, 4, 4),
    (2, 8, 5, 6, 8, (3, 2), (1, 2), (0, 1, 2, 0), (2, 1), (0, 1), 2, 4, 4),  # groups, dilation
    (1, 16, 4, 5, 16, (4, 4), (2, 2), (1, 1, 1, 1), (1, 1), (0, 0), 4, 4, 4),
    (1, 4, 9, 1, 8, (5, 1), (1, 1), (2, 0, 2, 0), (1, 1), (0, 0), 1, 4, 8),  # kx1, width 1
    (1, 3, 4, 4, 6, (3, 3), (3, 3), (0, 0, 0, 0), (1, 1), (2, 1), 1, 1, 2),  # odd blocks
]


@pytest.mark.parametrize("case", CASES, ids=[f"k{c[5]}s{c[6]}p{c[7]}g{c[10]}" for c in CASES])
def test_conv_transpose_kernel(case):
    n, c, h, w, m, k, s, p, d, op, g, cb, ob = case
    rng = np.random.default_rng(sum(map(hash, map(str, case))) % 2**32)
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, m // g, *k)).astype(np.float32)
    b = rng.normal(size=m).astype(np.float32)
    attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(p), dilations=list(d),
                 output_padding=list(op), group=g)
    exact = conv_transpose(attrs, x.astype(np.float64), wt.astype(np.float64),
                           b.astype(np.float64))
    oh, ow = exact.shape[2:]
    packed = pack_conv_transpose_weight(wt, g, cb, ob)
    kernel = compile_spec({"op": "convT", "data": [n, c // cb, h, w, cb],
                           "weight": list(packed.shape), "strides": list(s), "pads": list(p),
                           "dilations": list(d), "out": [oh, ow], "groups": g, "bias": True})
    out = np.empty((n, m // ob, oh, ow, ob), np.float32)
    kernel(pack_nchwc(x, cb), packed, b.reshape(-1, ob), out)
    got = unpack_nchwc(out)
    scale = np.abs(exact).max()
    # float32 against float64: a sum of at most C/g * KH * KW products per output.
    assert np.abs(got - exact).max() <= 1e-6 * scale
    ref32 = conv_transpose(attrs, x, wt, b)  # the numpy definition in float32
    assert np.abs(got - ref32).max() <= 1e-6 * scale


def _unet_up(c=16, m=8, size=6):
    """ConvTranspose 2x2 stride 2 -> Relu -> Conv 3x3: U-Net's up-step."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), name)
             for name, s in (("w", (c, m, 2, 2)), ("b", (m,)), ("w1", (m, m, 3, 3)))]
    nodes = [helper.make_node("ConvTranspose", ["image", "w", "b"], ["u"], strides=[2, 2]),
             helper.make_node("Relu", ["u"], ["r"]),
             helper.make_node("Conv", ["r", "w1"], ["y"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "up", [helper.make_tensor_value_info(
        "image", TensorProto.FLOAT, [1, c, size, size])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_conv_transpose_in_a_build():
    """A U-Net up-step: ConvTranspose is a kernel step reading and writing blocked values
    (no layout change between it and the convolution after it), outputs as onnxruntime."""
    from celosia.runtime.cpu import CpuModel

    model = _unet_up()
    x = np.random.default_rng(8).normal(size=(1, 16, 6, 6)).astype(np.float32)
    built = CpuModel.build(model)
    ops = [(s["op"], s["kind"]) for s in built.program.steps]
    assert ops == [("pack", "kernel"), ("ConvTranspose", "kernel"), ("Relu", "kernel"),
                   ("Conv", "kernel"), ("unpack", "kernel")]
    got = built.run({"image": x})["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"image": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


# ---- Resize ----------------------------------------------------------------------------------

RESIZE_CASES = [  # (mode, coordinate mode, nearest mode, input [N,C,H,W], output H, W)
    ("nearest", "asymmetric", "floor", (1, 16, 5, 6), 10, 12),  # torch's nearest Upsample
    ("nearest", "half_pixel", "round_prefer_floor", (2, 8, 7, 5), 10, 3),
    ("nearest", "align_corners", "round_prefer_ceil", (1, 3, 4, 4), 9, 4),
    ("linear", "pytorch_half_pixel", "floor", (1, 16, 6, 6), 12, 12),  # bilinear x2
    ("linear", "half_pixel", "floor", (1, 12, 5, 8), 7, 3),
    ("linear", "align_corners", "floor", (2, 4, 6, 3), 11, 5),
    ("linear", "asymmetric", "floor", (1, 32, 3, 3), 1, 8),
]


def _resize_model(mode, ctm, nearest, shape, oh, ow):
    sizes = numpy_helper.from_array(np.array([*shape[:2], oh, ow], np.int64), "sizes")
    node = helper.make_node("Resize", ["image", "", "", "sizes"], ["y"], mode=mode,
                            coordinate_transformation_mode=ctm, nearest_mode=nearest)
    g = helper.make_graph([node], "resize", [helper.make_tensor_value_info(
        "image", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], [sizes])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("case", RESIZE_CASES, ids=[f"{c[0]}-{c[1]}" for c in RESIZE_CASES])
def test_resize_kernel(case):
    """The kernel against graph/ops_resize (the numpy definition), bit for bit, and
    onnxruntime."""
    from celosia.compiler.frontend.onnx import import_onnx
    from celosia.compiler.graph.reference import run_graph
    from celosia.runtime.cpu import CpuModel

    model = _resize_model(*case)
    x = np.random.default_rng(9).normal(size=case[3]).astype(np.float32)
    built = CpuModel.build(model)
    assert ("Resize", "kernel") in {(s["op"], s["kind"]) for s in built.program.steps}
    got = built.run({"image": x})["y"]
    want = run_graph(import_onnx(model), {"image": x})["y"]
    np.testing.assert_array_equal(got, want)  # the same float32 operations, in its order
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"image": x})[0]
    np.testing.assert_allclose(got, theirs, rtol=0, atol=1e-6 * np.abs(theirs).max())


# ---- ConvTranspose as a 1x1 convolution and a shuffle or fold (lowering.py) ----------------

# (N, C, H, W, M, kernel, strides, pads, dilations, output_padding, group, bias, kernels):
# two kernels for a direct one with output blocks under 8 and for one group with a stride,
# else one.
SPLIT_CASES = [
    (1, 24, 10, 12, 1, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), (0, 0), 1, True, 2),  # PP-OCR's
    (2, 8, 5, 7, 2, (3, 3), (3, 3), (0, 0, 0, 0), (1, 1), (0, 0), 1, True, 2),  # stride 3
    (1, 5, 3, 4, 3, (2, 3), (2, 3), (0, 0, 0, 0), (1, 1), (0, 0), 1, False, 2),  # no bias
    (3, 16, 4, 3, 4, (1, 2), (1, 2), (0, 0, 0, 0), (1, 1), (0, 0), 1, True, 2),
    (1, 32, 8, 8, 16, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), (0, 0), 1, True, 1),  # U-Net's
    (1, 6, 5, 5, 2, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), (1, 1), 1, True, 2),  # out padding
    (2, 16, 7, 5, 16, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 1, True, 2),
    (1, 12, 6, 9, 8, (4, 4), (2, 2), (1, 2, 2, 1), (1, 1), (0, 1), 1, False, 2),  # pads
    (2, 8, 5, 4, 12, (3, 2), (3, 2), (2, 0, 1, 1), (2, 1), (2, 1), 1, True, 2),  # dilation
    (1, 3, 4, 4, 6, (3, 3), (3, 3), (0, 0, 0, 0), (1, 1), (2, 1), 1, True, 2),  # odd blocks
    (2, 8, 4, 5, 4, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), (0, 0), 2, True, 1),  # groups
    # stride 1: an ordinary convolution (cpu/convt.py)
    (1, 8, 6, 6, 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), (0, 0), 1, True, 1),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[
    f"n{c[0]}c{c[1]}m{c[4]}k{c[5][0]}{c[5][1]}s{c[6][0]}{c[6][1]}op{c[9][0]}{c[9][1]}g{c[10]}"
    for c in SPLIT_CASES])
def test_conv_transpose_in_two_kernels(case):
    """Whole builds against graph/ops_nn (float64 and float32) and onnxruntime."""
    from celosia.runtime.cpu import CpuModel

    n, c, h, w, m, k, s, p, d, op, g, bias, kernels = case
    rng = np.random.default_rng(sum(map(hash, map(str, case))) % 2**32)
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, m // g, *k)).astype(np.float32)
    b = rng.normal(size=m).astype(np.float32) if bias else None
    attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(p), dilations=list(d),
                 output_padding=list(op), group=g)
    inits = [numpy_helper.from_array(wt, "w")] + ([numpy_helper.from_array(b, "b")]
                                                   if bias else [])
    node = helper.make_node("ConvTranspose", ["image", "w"] + (["b"] if bias else []), ["y"],
                            **attrs)
    graph = helper.make_graph([node], "convT", [helper.make_tensor_value_info(
        "image", TensorProto.FLOAT, list(x.shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    built = CpuModel.build(model)
    steps = [st["op"] for st in built.program.steps
             if st["kind"] == "kernel" and st["op"] in ("ConvTranspose", "Conv")]
    assert len(steps) == kernels
    assert set(steps) == ({"Conv"} if s == (1, 1) and g == 1 else {"ConvTranspose"})
    got = built.run({"image": x})["y"]
    exact = conv_transpose(attrs, x.astype(np.float64), wt.astype(np.float64),
                           None if b is None else b.astype(np.float64))
    scale = np.abs(exact).max()
    assert got.shape == exact.shape
    assert np.abs(got - exact).max() <= 1e-6 * scale
    assert np.abs(got - conv_transpose(attrs, x, wt, b)).max() <= 1e-6 * scale
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"image": x})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * scale)
