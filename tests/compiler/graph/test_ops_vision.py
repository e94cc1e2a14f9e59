"""The vision and detection operators (compiler/graph/ops_vision.py) as one-node models on
seeded random inputs, against onnxruntime (onnx's reference evaluator where onnxruntime
lacks the operator or the mode), through import + reference executor and the compiled CpuModel
(onnx_nodes.check_node): every GridSample mode x padding x align_corners in 4-D (both
opsets' mode names) and 5-D, AffineGrid 2-D and 3-D, NonMaxSuppression with several boxes
per class, ties and thresholds (run-time and constant inputs), RoiAlign's coordinate and
pooling modes, and the rest."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx_nodes import check_node, node_model, oracle

from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

F32 = np.float32
I64 = np.int64


def _rng(seed):
    return np.random.default_rng(seed)


# ---- GridSample, AffineGrid ------------------------------------------------------------------

_PADDING = ["zeros", "border", "reflection"]


@pytest.mark.parametrize("opset, mode", [(16, "bilinear"), (16, "nearest"), (16, "bicubic"),
                                         (20, "linear"), (20, "nearest"), (20, "cubic")])
@pytest.mark.parametrize("padding", _PADDING)
@pytest.mark.parametrize("aligned", [0, 1])
def test_grid_sample_2d(opset, mode, padding, aligned):
    rng = _rng(hash((opset, mode, padding, aligned)) % 2**32)
    x = rng.standard_normal((2, 3, 5, 7)).astype(F32)
    # beyond [-1, 1] on purpose: the padding modes decide there
    grid = rng.uniform(-1.4, 1.4, (2, 4, 6, 2)).astype(F32)
    check_node("GridSample", ["x", "g"], {"x": x, "g": grid}, opset=opset,
               attrs={"mode": mode, "padding_mode": padding, "align_corners": aligned},
               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", _PADDING)
@pytest.mark.parametrize("aligned", [0, 1])
def test_grid_sample_3d(mode, padding, aligned):
    rng = _rng(len(mode) * 10 + len(padding) + aligned)
    x = rng.standard_normal((1, 2, 4, 5, 3)).astype(F32)
    grid = rng.uniform(-1.3, 1.3, (1, 3, 2, 4, 3)).astype(F32)
    check_node("GridSample", ["x", "g"], {"x": x, "g": grid}, opset=20,
               attrs={"mode": mode, "padding_mode": padding, "align_corners": aligned},
               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("padding", ["zeros", "reflection"])
def test_grid_sample_3d_cubic(padding):
    """onnxruntime's cubic is 4-D only: onnx's reference decides 5-D (with border padding
    celosia keeps onnxruntime's 4-D rule, taps clamped, where the reference clamps the
    position)."""
    rng = _rng(len(padding))
    x = rng.standard_normal((1, 2, 4, 5, 3)).astype(F32)
    grid = rng.uniform(-1.3, 1.3, (1, 3, 2, 4, 3)).astype(F32)
    check_node("GridSample", ["x", "g"], {"x": x, "g": grid}, opset=20, which="onnx",
               attrs={"mode": "cubic", "padding_mode": padding}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("padding", _PADDING)
def test_grid_sample_nearest_half_way(padding):
    """Grid points that land half-way between pixels (and on the borders): nearest rounds
    them to even, as onnxruntime and PyTorch do."""
    x = _rng(3).standard_normal((1, 1, 4, 4)).astype(F32)
    # non-aligned: pixel position p = (g + 1) * 2 - 0.5, half-way at g = k/2 - 3/4
    g = (np.arange(-2, 10) / 4 - 0.75).astype(F32)
    grid = np.stack(np.meshgrid(g, g[::-1]), axis=-1)[None].astype(F32)
    check_node("GridSample", ["x", "g"], {"x": x, "g": grid}, opset=20,
               attrs={"mode": "nearest", "padding_mode": padding})


@pytest.mark.parametrize("shape, aligned", [((2, 3, 5, 7), 0), ((2, 3, 5, 7), 1),
                                            ((1, 2, 1, 4), 1), ((2, 1, 3, 4, 5), 0),
                                            ((2, 1, 3, 4, 5), 1)])
def test_affine_grid(shape, aligned):
    nd = len(shape) - 2
    theta = _rng(len(shape) + aligned).standard_normal((shape[0], nd, nd + 1)).astype(F32)
    check_node("AffineGrid", ["t", "s"], {"t": theta}, consts={"s": np.array(shape, I64)},
               opset=20, attrs={"align_corners": aligned}, rtol=1e-5, atol=1e-6)


# ---- NonMaxSuppression -----------------------------------------------------------------------


def _boxes(rng, batches, count, center):
    """Boxes in clusters (so that many overlap), some corners given flipped."""
    centers = rng.uniform(0, 10, (batches, 4, 2))[:, rng.integers(0, 4, count)]
    centers = centers + rng.normal(0, 0.4, (batches, count, 2))
    size = rng.uniform(0.5, 3, (batches, count, 2))
    if center:
        return np.concatenate([centers, size], axis=-1).astype(F32)
    lo, hi = centers - size / 2, centers + size / 2
    boxes = np.concatenate([lo[..., ::-1], hi[..., ::-1]], axis=-1)  # y1, x1, y2, x2
    flip = rng.random((batches, count)) < 0.3
    boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    return boxes.astype(F32)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("limit, iou, score", [(3, 0.5, None), (100, 0.3, 0.4), (2, 0.0, None),
                                               (50, 1.0, 0.0), (0, 0.5, None)])
def test_non_max_suppression(center, limit, iou, score):
    rng = _rng(center * 100 + limit)
    boxes = _boxes(rng, 2, 24, center)
    scores = rng.random((2, 3, 24)).astype(F32)
    scores[:, :, ::5] = scores[:, :, 1:2]  # ties in score within a class
    inputs = ["b", "s", "m", "i"] + (["t"] if score is not None else [])
    consts = {"m": np.array([limit], I64), "i": np.array([iou], F32)}
    if score is not None:
        consts["t"] = np.array([score], F32)
    # boxes and scores are graph inputs: the node runs in run-time form
    check_node("NonMaxSuppression", inputs, {"b": boxes, "s": scores}, consts=consts,
               attrs={"center_point_box": center}, opset=11)


@pytest.mark.parametrize("block, matrix", [(1, 1 << 20), (3, 1 << 20), (64, 100)])
def test_non_max_suppression_in_small_blocks(monkeypatch, block, matrix):
    """Candidates tested a block at a time (_NMS_BLOCK, fewer when the [block, remaining]
    matrix would pass _NMS_MATRIX elements) select what one at a time does."""
    from celosia.compiler.graph import ops_vision

    monkeypatch.setattr(ops_vision, "_NMS_BLOCK", block)
    monkeypatch.setattr(ops_vision, "_NMS_MATRIX", matrix)
    rng = _rng(11 + block)
    check_node("NonMaxSuppression", ["b", "s", "m", "i", "t"],
               {"b": _boxes(rng, 2, 40, 0), "s": rng.random((2, 3, 40)).astype(F32)},
               consts={"m": np.array([7], I64), "i": np.array([0.4], F32),
                       "t": np.array([0.2], F32)}, opset=11)


def test_non_max_suppression_constant_inputs_fold():
    """With every input known at import the selection is a constant of its static size."""
    rng = _rng(5)
    boxes, scores = _boxes(rng, 1, 12, 0), rng.random((1, 2, 12)).astype(F32)
    want, _ = check_node("NonMaxSuppression", ["b", "s", "m", "i"], {},
                         consts={"b": boxes, "s": scores, "m": np.array([4], I64),
                                 "i": np.array([0.3], F32)}, opset=11)
    assert want[0].shape[1] == 3 and len(want[0]) > 2


def test_non_max_suppression_defaults():
    """No max_output_boxes_per_class: nothing is selected (ONNX's default 0)."""
    rng = _rng(6)
    check_node("NonMaxSuppression", ["b", "s"], {"b": _boxes(rng, 1, 6, 0),
                                                 "s": rng.random((1, 1, 6)).astype(F32)})


# ---- RoiAlign, MaxRoiPool --------------------------------------------------------------------


def _rois(rng, count, height, width, scale):
    x1, y1 = rng.uniform(-2, width / scale, count), rng.uniform(-2, height / scale, count)
    w, h = rng.uniform(0.2, width / scale / 1.5, count), rng.uniform(0.2, height / scale / 1.5,
                                                                      count)
    return np.stack([x1, y1, x1 + w, y1 + h], axis=1).astype(F32)


@pytest.mark.parametrize("opset, coordinates", [
    (10, None), (11, None), (16, None), (16, "half_pixel"), (16, "output_half_pixel")])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ratio, scale", [(0, 1.0), (2, 0.5), (1, 0.25)])
def test_roi_align(opset, coordinates, mode, ratio, scale):
    rng = _rng(opset + len(mode) + ratio)
    x = rng.standard_normal((2, 3, 9, 11)).astype(F32)
    rois = _rois(rng, 7, 9, 11, scale)
    batch = rng.integers(0, 2, 7).astype(I64)
    attrs = {"mode": mode, "sampling_ratio": ratio, "spatial_scale": scale,
             "output_height": 3, "output_width": 4}
    if coordinates:
        attrs["coordinate_transformation_mode"] = coordinates
    check_node("RoiAlign", ["x", "r", "b"], {"x": x, "r": rois}, consts={"b": batch},
               attrs=attrs, opset=opset, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pooled, scale", [((2, 2), 1.0), ((3, 4), 0.5), ((1, 1), 0.7)])
def test_max_roi_pool(pooled, scale):
    rng = _rng(pooled[0] * 7 + pooled[1])
    x = rng.standard_normal((2, 3, 10, 12)).astype(F32)
    rois = _rois(rng, 5, 10, 12, scale)
    rois = np.concatenate([rng.integers(0, 2, (5, 1)).astype(F32), rois], axis=1)
    check_node("MaxRoiPool", ["x", "r"], {"x": x, "r": rois},
               attrs={"pooled_shape": list(pooled), "spatial_scale": scale}, opset=11)


# ---- LRN, LpPool, GlobalLpPool, MeanVarianceNormalization ------------------------------------


@pytest.mark.parametrize("size, attrs", [(3, {}), (5, {"alpha": 0.01, "beta": 0.5, "bias": 2.0}),
                                         (1, {}), (9, {"alpha": 0.1})])
def test_lrn(size, attrs):
    x = _rng(size).standard_normal((2, 7, 4, 5)).astype(F32) * 3
    check_node("LRN", ["x"], {"x": x}, attrs={"size": size, **attrs}, opset=13,
               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [2, 4])
def test_lrn_even_size(size):
    """An even size sums floor((size-1)/2) channels before and ceil((size-1)/2) after
    (ONNX's definition), which onnxruntime refuses and onnx's reference evaluator gets
    wrong (its loop runs over the batch, not the channels): the definition, in float64,
    decides."""
    x = _rng(size).standard_normal((2, 7, 3, 4)).astype(F32) * 3
    alpha, beta, bias = 1e-2, 0.75, 1.0
    sq = x.astype(np.float64) ** 2
    want = np.empty_like(sq)
    before, after = (size - 1) // 2, size // 2
    for c in range(x.shape[1]):
        s = sq[:, max(0, c - before):c + after + 1].sum(axis=1)
        want[:, c] = x[:, c] / (bias + alpha / size * s) ** beta
    model = node_model("LRN", ["x"], {"x": x}, attrs={"size": size, "alpha": alpha},
                       opset=13)
    ref = ReferenceModel.load(model).run({"x": x})["y0"]
    np.testing.assert_array_equal(CpuModel.build(model).run({"x": x})["y0"], ref)
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset, attrs", [
    (11, {"kernel_shape": [3, 3]}),
    (11, {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 1, 2], "p": 1}),
    (11, {"kernel_shape": [3, 2], "p": 3, "auto_pad": "SAME_UPPER"}),
    (18, {"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [2, 2], "ceil_mode": 1}),
    (18, {"kernel_shape": [3], "p": 2}),
])
def test_lp_pool(opset, attrs):
    shape = (2, 3, 9) if len(attrs["kernel_shape"]) == 1 else (2, 3, 7, 8)
    x = _rng(opset + len(attrs)).standard_normal(shape).astype(F32)
    check_node("LpPool", ["x"], {"x": x}, attrs=attrs, opset=opset, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool(p):
    x = _rng(p).standard_normal((2, 3, 5, 4)).astype(F32)
    check_node("GlobalLpPool", ["x"], {"x": x}, attrs={"p": p}, opset=11, rtol=1e-5)


@pytest.mark.parametrize("opset, axes", [(11, [0, 2, 3]), (13, [1]), (13, [0, 1, 2, 3]),
                                         (13, [-1, 2])])
def test_mean_variance_normalization(opset, axes):
    x = _rng(opset).standard_normal((2, 3, 4, 5)).astype(F32) * 2 + 1
    check_node("MeanVarianceNormalization", ["x"], {"x": x}, attrs={"axes": axes},
               opset=opset, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 13])
def test_mean_variance_normalization_default_axes(opset):
    """Without axes ([0, 2, 3]): onnx's strict inference fails on the node's function
    body (validate.py writes the default in for it), so the case is built by hand."""
    x = _rng(opset).standard_normal((2, 3, 4, 5)).astype(F32) * 2 + 1
    model = node_model("MeanVarianceNormalization", ["x"], {"x": x}, opset=opset,
                       infer=False)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y0", 1, x.shape))
    (want,) = oracle(model, {"x": x})
    ref = ReferenceModel.load(model).run({"x": x})["y0"]
    np.testing.assert_array_equal(CpuModel.build(model).run({"x": x})["y0"], ref)
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-5)


# ---- MaxUnpool, Col2Im, CenterCropPad, DeformConv --------------------------------------------


def _pooled_indices(rng, shape, kernel, strides, out_spatial):
    """Flat indices into [N, C, *out_spatial], one per pooling window (windows that do not
    overlap, so no index repeats), as MaxPool gives them."""
    n, c, h, w = shape
    ih = np.arange(h)[:, None] * strides[0] + rng.integers(0, kernel[0], (n, c, h, w))
    iw = np.arange(w)[None, :] * strides[1] + rng.integers(0, kernel[1], (n, c, h, w))
    plane = out_spatial[0] * out_spatial[1]
    base = (np.arange(n)[:, None] * c + np.arange(c)[None, :]) * plane
    return (base[:, :, None, None] + ih * out_spatial[1] + iw).astype(I64)


@pytest.mark.parametrize("output_shape", [None, (2, 3, 7, 9)])
def test_max_unpool(output_shape):
    rng = _rng(0 if output_shape is None else 1)
    x = rng.standard_normal((2, 3, 3, 4)).astype(F32)
    out = output_shape or (2, 3, 6, 8)
    i = _pooled_indices(rng, x.shape, (2, 2), (2, 2), out[2:])
    inputs, consts = ["x", "i"], {"i": i}
    if output_shape is not None:
        inputs.append("o")
        consts["o"] = np.array(output_shape, I64)
    check_node("MaxUnpool", inputs, {"x": x}, consts=consts,
               attrs={"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11)


@pytest.mark.parametrize("image, block, attrs", [
    ((5, 6), (2, 3), {}),
    ((7, 8), (3, 3), {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}),
    ((4, 5, 6), (2, 2, 3), {"strides": [1, 2, 1]}),
])
def test_col2im(image, block, attrs):
    from celosia.compiler.graph.ops_vision import col2im_blocks

    nd = len(image)
    counts = col2im_blocks(image, block, attrs.get("dilations", [1] * nd),
                           attrs.get("pads", [0] * 2 * nd), attrs.get("strides", [1] * nd))
    x = _rng(nd).standard_normal((2, 3 * int(np.prod(block)), int(np.prod(counts))))
    check_node("Col2Im", ["x", "i", "b"], {"x": x.astype(F32)},
               consts={"i": np.array(image, I64), "b": np.array(block, I64)}, attrs=attrs,
               opset=18, which="onnxruntime" if nd == 2 else "onnx", rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("x_shape, shape, axes", [
    ((4, 5, 3), (3, 6, 4), None), ((4, 5, 3), (2, 9), [0, 1]), ((4, 5), (2,), [-1]),
    ((4, 5, 3), (8, 1), [1, 2])])
def test_center_crop_pad(x_shape, shape, axes):
    x = _rng(len(shape)).standard_normal(x_shape).astype(F32)
    attrs = {} if axes is None else {"axes": axes}
    check_node("CenterCropPad", ["x", "s"], {"x": x}, consts={"s": np.array(shape, I64)},
               attrs=attrs, opset=18)


@pytest.mark.parametrize("attrs, with_bias, with_mask", [
    ({}, False, False),
    ({"pads": [1, 1, 1, 1], "strides": [2, 1]}, True, False),
    ({"group": 2, "offset_group": 2, "dilations": [1, 2]}, True, True),
])
def test_deform_conv(attrs, with_bias, with_mask):
    rng = _rng(len(attrs) + with_mask)
    g, og = attrs.get("group", 1), attrs.get("offset_group", 1)
    x = rng.standard_normal((2, 4, 7, 8)).astype(F32)
    w = rng.standard_normal((6, 4 // g, 3, 2)).astype(F32)
    sh, sw = attrs.get("strides", [1, 1])
    dh, dw = attrs.get("dilations", [1, 1])
    p = attrs.get("pads", [0] * 4)
    oh = (7 + p[0] + p[2] - dh * 2 - 1) // sh + 1
    ow = (8 + p[1] + p[3] - dw * 1 - 1) // sw + 1
    offset = (rng.standard_normal((2, og * 2 * 6, oh, ow)) * 1.5).astype(F32)
    inputs, feeds, consts = ["x", "w", "o"], {"x": x, "o": offset}, {"w": w}
    inputs += ["b"] if with_bias or with_mask else []
    if with_bias or with_mask:
        consts["b"] = rng.standard_normal(6).astype(F32) if with_bias else np.zeros(6, F32)
    if with_mask:
        inputs.append("m")
        feeds["m"] = rng.random((2, og * 6, oh, ow)).astype(F32)
    check_node("DeformConv", inputs, feeds, consts=consts, attrs=attrs, opset=19,
               rtol=1e-4, atol=1e-4)


def test_working_arrays_held_to_the_limit(monkeypatch):
    """A kernel's working arrays (RoiAlign's samples and their positions, Col2Im's padded
    images) are held to CELOSIA_MAX_BYTES before they are allocated: a one-line error
    naming the node."""
    from celosia.compiler.frontend.onnx import import_onnx
    from celosia.compiler.graph.ir import NodeError

    monkeypatch.setenv("CELOSIA_MAX_BYTES", str(1 << 20))
    x = np.zeros((1, 2, 5, 5), F32)
    for mode, ratio, what in (("max", 1 << 12, "4096 x 4096 bilinear samples"),
                              ("avg", 1 << 16, "65536 x 65536 sample positions")):
        model = node_model("RoiAlign", ["x", "r", "b"], {"x": x},
                           consts={"r": np.array([[0, 0, 3, 3]], F32), "b": np.zeros(1, I64)},
                           attrs={"sampling_ratio": ratio, "mode": mode}, opset=16,
                           infer=False)
        with pytest.raises(NodeError, match=f"RoiAlign_0.*region 0's {what} needs "
                                            r"[\d,]+ bytes, more than the limit of 1,048,576; "
                                            "lower sampling_ratio"):
            import_onnx(model)
    model = node_model("Col2Im", ["x", "i", "b"], {"x": np.zeros((1, 4, 9), F32)},
                       consts={"i": np.array([3, 3], I64), "b": np.array([2, 2], I64)},
                       attrs={"pads": [1000, 1000, 1000, 1000], "strides": [1000, 1000]},
                       opset=18, infer=False)
    with pytest.raises(NodeError, match=r"Col2Im_0.*the padded images \[2003, 2003\] needs "
                                        r"[\d,]+ bytes, more than the limit"):
        import_onnx(model)


@pytest.mark.parametrize("op", ["GridSample", "RoiAlign", "DeformConv", "LpPool", "GlobalLpPool",
                                "MaxUnpool", "MaxRoiPool"])
def test_opset_22(op):
    """Opset 22's versions (bfloat16 added to their types), against onnxruntime (its
    opset-21 kernel where it has no opset-22 one)."""
    rng = _rng(22)
    x = rng.standard_normal((1, 2, 6, 6)).astype(F32)
    rois = np.array([[0, 0, 3, 4], [1, 1.5, 5, 5]], F32)
    cases = {
        "GridSample": (["x", "g"], {"x": x, "g": rng.uniform(-1.2, 1.2, (1, 3, 4, 2)).astype(F32)},
                       {}, {"mode": "cubic", "padding_mode": "reflection"}),
        "RoiAlign": (["x", "r", "b"], {"x": x}, {"r": rois, "b": np.zeros(2, I64)},
                     {"output_height": 2, "output_width": 3}),
        "DeformConv": (["x", "w", "o"], {"x": x, "o": rng.standard_normal((1, 8, 5, 5)).astype(
            F32)}, {"w": rng.standard_normal((3, 2, 2, 2)).astype(F32)}, {}),
        "LpPool": (["x"], {"x": x}, {}, {"kernel_shape": [3, 3], "p": 3}),
        "GlobalLpPool": (["x"], {"x": x}, {}, {}),
        "MaxUnpool": (["x", "i"], {"x": x[:, :, :3, :3]}, {"i": np.arange(18).reshape(
            1, 2, 3, 3) * 4}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
        "MaxRoiPool": (["x", "r"], {"x": x}, {"r": np.concatenate([np.zeros((2, 1), F32), rois],
                                                                  1)}, {"pooled_shape": [2, 2]}),
    }
    inputs, feeds, consts, attrs = cases[op]
    if op not in ("RoiAlign", "GlobalLpPool", "MaxRoiPool"):
        check_node(op, inputs, feeds, consts=consts, attrs=attrs, opset=22, rtol=1e-4,
                   atol=1e-5)
        return
    # onnxruntime has no opset-22 kernel of these: its opset-21 answer (the same meaning)
    model = node_model(op, inputs, feeds, consts=consts, attrs=attrs, opset=22)
    (want,) = oracle(node_model(op, inputs, feeds, consts=consts, attrs=attrs, opset=21),
                     feeds)
    ref = ReferenceModel.load(model).run(feeds)["y0"]
    np.testing.assert_array_equal(CpuModel.build(model).run(feeds)["y0"], ref)
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-5)
