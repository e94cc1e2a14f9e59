"""What fuzzing the operators of issue #12 and the vision operators found (tests/fuzz), and
a Gemm the whole-model fuzzing found, one case each: against onnxruntime (or the definition) where it takes the
model, else celosia's one-line error naming the node."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from onnx_nodes import check_node, node_model

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph import ops_nn
from celosia.compiler.graph.ir import GraphError, Node, NodeError, TensorType
from celosia.compiler.graph.reference import infer_node
from celosia.errors import CelosiaError
from celosia.limits import ResourceLimitError
from celosia.runtime.reference import ReferenceModel

F32, I64 = np.float32, np.int64


def _normal(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(F32)


def _error(model, cls=GraphError) -> str:
    with pytest.raises(cls) as e:
        import_onnx(model)
    text = str(e.value)
    assert isinstance(e.value, CelosiaError) and "\n" not in text
    return text


def _direct_conv_transpose(x, w, attrs):
    """ConvTranspose by its definition, one input pixel at a time: pixel (i, j) adds
    x * w[:, :, a, b] at (i * stride + a * dilation - pad_begin, ...) when that is inside
    the output (a negative pad leaves zeros)."""
    s, d, pads, g = attrs["strides"], attrs["dilations"], attrs["pads"], attrs["group"]
    kernel, cg, mg = w.shape[2:], x.shape[1] // g, w.shape[1]
    sizes = ops_nn.conv_transpose_output_size(x.shape[2:], kernel, s, d, pads,
                                              attrs["output_padding"])
    want = np.zeros((x.shape[0], g * mg, *sizes), np.float64)
    for n, c, i, j in np.ndindex(*x.shape):
        group = c // cg
        for a, b in np.ndindex(*kernel):
            p, q = i * s[0] + a * d[0] - pads[0], j * s[1] + b * d[1] - pads[1]
            if 0 <= p < sizes[0] and 0 <= q < sizes[1]:
                want[n, group * mg:(group + 1) * mg, p, q] += x[n, c, i, j] * w[c, :, a, b]
    return want


def test_conv_transpose_memory_is_the_outputs():
    """A huge stride with an output_shape: the kernel allocated the whole uncropped output
    (704 GiB); now the output only, and the taps that land in it. onnxruntime and onnx's
    evaluator reject the stride: the definition is the oracle."""
    x, w = _normal(1, 2, 5, 5), _normal(2, 2, 3, 3, seed=1)
    model = node_model("ConvTranspose", ["x", "w"], {"x": x}, consts={"w": w}, opset=17,
                       attrs={"strides": [2**31, 2], "output_shape": [10, 10]})
    graph = import_onnx(model)
    tracemalloc.start()
    got = ReferenceModel.load(model).run({"x": x})["y0"]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert got.shape == (1, 2, 10, 10) and peak < 1 << 20, peak
    np.testing.assert_allclose(got, _direct_conv_transpose(x, w, graph.nodes[0].attrs),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strides, dilations, pads, output_padding", [
    ([2, 3], [1, 1], [1, 0, 2, 1], [1, 2]), ([1, 2], [2, 1], [0, 0, 0, 0], [1, 0]),
    ([3, 1], [1, 2], [-1, 2, 0, -2], [0, 0]),
])
def test_conv_transpose_taps_against_the_definition(strides, dilations, pads,
                                                    output_padding):
    x, w = _normal(2, 4, 3, 4), _normal(4, 3, 2, 3, seed=1)
    attrs = {"kernel_shape": [2, 3], "strides": strides, "dilations": dilations, "pads": pads,
             "group": 2, "output_padding": output_padding}
    np.testing.assert_allclose(ops_nn.conv_transpose(attrs, x, w),
                               _direct_conv_transpose(x, w, attrs), rtol=1e-5, atol=1e-5)


def test_resize_reads_two_dimensional_scales_and_sizes_flat():
    x = _normal(1, 2, 3, 4)
    for consts, inputs in (({"s": np.array([[1, 1], [2, 1.5]], F32)}, ["x", "", "s"]),
                           ({"z": np.array([[1, 2], [5, 6]], I64)}, ["x", "", "", "z"])):
        graph = import_onnx(node_model("Resize", inputs, {"x": x}, consts=consts, opset=13,
                                       infer=False))
        assert graph.types["y0"].shape == ((1, 2, 6, 6) if "s" in consts else (1, 2, 5, 6))


def test_celu_with_a_huge_alpha_as_onnxruntime():
    """exp(x / alpha) - 1 as ONNX's function body, not expm1 (0 for a huge alpha)."""
    check_node("Celu", ["x"], {"x": _normal(3, 4)}, attrs={"alpha": 1e30}, opset=12)


def test_instance_normalization_scale_per_channel():
    x = _normal(1, 1, 3, 3)
    consts = {"s": np.ones(4, F32), "b": np.zeros(4, F32)}
    assert "scale and bias must have shape [1] (one value per channel of float32[1,1,3,3]), " \
           "not float32[4]" in _error(node_model("InstanceNormalization", ["x", "s", "b"],
                                                 {"x": x}, consts=consts, opset=17))


@pytest.mark.parametrize("k", [-2**63, -5, 7, 2**63 - 1])
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_diagonals_past_the_matrix(k, upper):
    """np.tri overflowed on k = -2^63; a k past the matrix keeps all or nothing."""
    check_node("Trilu", ["x", "k"], {"x": _normal(2, 3, 4)}, consts={"k": np.array(k, I64)},
               attrs={"upper": upper}, opset=14)


def test_an_axis_no_tensor_has_is_rejected_before_onnx_infers_it():
    """onnx's shape inference crashes the process on a LayerNormalization axis of 2^31."""
    model = node_model("LayerNormalization", ["x", "s"], {"x": _normal(2, 3)},
                       consts={"s": np.ones(3, F32)}, attrs={"axis": 2**31}, opset=17,
                       infer=False)
    assert "attribute 'axis' = 2147483648 cannot be an axis: tensors have at most 64 " \
           "dimensions" in _error(model)


@pytest.mark.parametrize("op, inputs, feeds, consts", [
    ("OneHot", ["i", "d", "v"], {"i": np.zeros(1000, I64)},
     {"d": np.array(1 << 30, I64), "v": np.array([0, 1], F32)}),
    ("GatherND", ["x", "i"], {"x": np.zeros((100, 100), F32)},
     {"i": np.zeros((100, 100, 1), I64)}),
    ("Mod", ["a", "b"], {"a": np.ones((4096, 1), np.int32)},
     {"b": np.ones((1, 4096), np.int32)}),
])
def test_outputs_larger_than_the_limit_before_a_kernel_allocates(monkeypatch, op, inputs,
                                                                 feeds, consts):
    monkeypatch.setenv("CELOSIA_MAX_BYTES", str(1 << 20))
    model = node_model(op, inputs, feeds, consts=consts, opset=13, infer=False)
    text = _error(model, ResourceLimitError)
    assert f"({op}) output 'y0'" in text and "CELOSIA_MAX_BYTES" in text


def test_group_normalization_18_runs():
    """Deprecated by onnx, run by onnxruntime: imported, and equal to onnxruntime through
    both of celosia's executors."""
    params = {"s": _normal(2, seed=1), "b": _normal(2, seed=2)}
    check_node("GroupNormalization", ["x", "s", "b"], {"x": _normal(2, 4, 3)}, consts=params,
               attrs={"num_groups": 2}, opset=18, rtol=1e-5, atol=1e-5)


def test_gemm_and_matmul_shape_rules_hold_the_ranks():
    """A Gemm reading a 4-D value whose shape onnx's inference could not know (a Reshape
    mutated into a ReduceSum) was a ValueError in the shape rule."""
    x4, w = TensorType("float32", (1, 2, 3, 4)), TensorType("float32", (4, 5))
    with pytest.raises(NodeError, match=r"A float32\[1,2,3,4\] and B float32\[4,5\] must be "
                                        r"matrices \(rank 2\)"):
        infer_node(Node("Gemm", ("a", "b"), ("y",), {}, "g"), [x4, w], [None, None])
    with pytest.raises(NodeError, match="a scalar is not a matrix operand"):
        infer_node(Node("MatMul", ("a", "b"), ("y",), {}, "m"),
                   [TensorType("float32", ()), w], [None, None])


# ---- the vision operators (ops_vision.py) ----------------------------------------------------


def test_max_roi_pool_far_off_boxes_pool_as_onnxruntime():
    """Box corners far outside any image (1e30, 2^40): onnxruntime converts them to C ints
    (INT_MIN out of range) and wraps its 32-bit sums; celosia pools what it pools."""
    x = _normal(1, 2, 5, 5)
    rois = np.array([[0, 0, 0, 3, 1e30], [0, -1, 2, 2, 2.0**40], [0, 1, 0.5, 4.5, 2]], F32)
    check_node("MaxRoiPool", ["x", "r"], {"x": x}, consts={"r": rois},
               attrs={"pooled_shape": [2, 2]}, opset=11)


def test_non_max_suppression_threshold_of_several_values():
    """A threshold input of several values (onnxruntime reads its first): refused at
    import, naming the input."""
    model = node_model("NonMaxSuppression", ["b", "s", "m", "i"],
                       {"b": np.zeros((1, 6, 4), F32), "s": np.zeros((1, 2, 6), F32),
                        "i": np.zeros((1, 6, 4), F32)}, consts={"m": np.array([3], I64)},
                       opset=11, infer=False)
    assert "iou_threshold is float32[1,6,4] but must hold one value" in _error(model)


def test_lrn_huge_size_pads_by_the_channels():
    """size 2^40: the kernel padded the channels by it (onnxruntime fails to allocate it);
    now by at most C, as the channels past the ends add nothing: every window holds all
    channels. The definition, in float64, decides."""
    x, size = _normal(1, 3, 2, 2), 2**40 + 1
    model = node_model("LRN", ["x"], {"x": x}, attrs={"size": size, "alpha": 1e9}, opset=13)
    sq = (x.astype(np.float64) ** 2).sum(axis=1, keepdims=True)
    want = x / (1.0 + 1e9 / size * sq) ** 0.75
    got = ReferenceModel.load(model).run({"x": x})["y0"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
