"""Resize and Upsample (compiler/graph/ops_resize.py): every mode, nearest rounding and
coordinate transformation, scales and sizes, axes and aspect-ratio policies, antialiasing
and the opset versions 11 to 21, against onnxruntime, through import + reference executor
and the compiled CpuModel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_nodes import check_node

_COORDINATES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                "tf_crop_and_resize"]
_NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# (input shape, scales or None, sizes or None): up, down, non-integral, to size 1.
_GEOMETRIES = [
    ((1, 2, 4, 5), [1, 1, 2.0, 3.0], None),
    ((2, 1, 8, 9), [1, 1, 0.5, 0.4], None),
    ((1, 3, 5, 7), [1, 1, 1.7, 0.8], None),
    ((1, 2, 5, 6), None, [1, 2, 9, 4]),
    ((1, 1, 6, 7), None, [1, 1, 1, 3]),
]


def _x(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _resize(x, scales, sizes, attrs, opset, roi=None, which="onnxruntime", tol=1e-5, atol=None,
            **kw):
    consts = {"roi": np.array(roi if roi is not None else [], np.float32),
              "scales": np.array(scales if scales is not None else [], np.float32)}
    inputs = ["x", "roi", "scales"]
    if sizes is not None:
        consts["sizes"] = np.array(sizes, np.int64)
        inputs.append("sizes")
    if opset >= 13:  # empty optional inputs may be left out
        inputs = [i if i == "x" or np.size(consts[i]) else "" for i in inputs]
        consts = {k: v for k, v in consts.items() if np.size(v)}
    check_node("Resize", inputs, {"x": x}, consts=consts, attrs=attrs, opset=opset,
               which=which, rtol=tol, atol=tol if atol is None else atol, **kw)


def _roi(mode, rank, spatial=2):
    """A crop reaching past the input on one side (extrapolated), for tf_crop_and_resize."""
    if mode != "tf_crop_and_resize":
        return None
    lo = [0.0] * (rank - spatial) + [0.2, -0.3][:spatial]
    hi = [1.0] * (rank - spatial) + [0.9, 1.1][:spatial]
    return lo + hi


@pytest.mark.parametrize("shape, scales, sizes", _GEOMETRIES)
@pytest.mark.parametrize("coordinates", _COORDINATES)
@pytest.mark.parametrize("nearest_mode", _NEAREST)
@pytest.mark.parametrize("opset", [11, 19])
def test_nearest(shape, scales, sizes, coordinates, nearest_mode, opset):
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coordinates,
             "nearest_mode": nearest_mode, "extrapolation_value": -7.0}
    _resize(_x(shape), scales, sizes, attrs, opset, roi=_roi(coordinates, len(shape)))


@pytest.mark.parametrize("shape, scales, sizes", _GEOMETRIES)
@pytest.mark.parametrize("coordinates, opset", [  # half_pixel_symmetric is opset 19
    (c, v) for c in _COORDINATES for v in (11, 19)] + [("half_pixel_symmetric", 19)])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_linear_and_cubic(shape, scales, sizes, coordinates, mode, opset):
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates}
    _resize(_x(shape), scales, sizes, attrs, opset, roi=_roi(coordinates, len(shape)))


@pytest.mark.parametrize("shape, scales, sizes", _GEOMETRIES)
@pytest.mark.parametrize("a, exclude", [(-0.5, 0), (-0.75, 1), (-0.5, 1)])
def test_cubic_parameters(shape, scales, sizes, a, exclude):
    attrs = {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude}
    _resize(_x(shape), scales, sizes, attrs, 13)


@pytest.mark.parametrize("shape, scales, sizes", [
    ((1, 2, 4, 5), [1, 1, 2.0, 3.0], None), ((1, 3, 5, 7), [1, 1, 1.7, 0.8], None),
    ((1, 2, 5, 6), None, [1, 2, 9, 4])])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32])
def test_integer_data(shape, scales, sizes, mode, dtype):
    """Interpolated in float64, rounded to the nearest integer and saturated, as onnx's
    reference evaluator does; onnxruntime's uint8 interpolation is fixed point and
    truncates, so it is up to one step below."""
    x = _x(shape, dtype)
    # onnx's reference computes cubic weights in float32 (the attribute's type): errors
    # of 1e-7 of the int32 range (2**31), not exact there.
    rough = mode == "cubic" and dtype == np.int32
    _resize(x, scales, sizes, {"mode": mode}, 19,
            which="onnxruntime" if mode == "nearest" else "onnx", exact=not rough,
            atol=2.0 ** 31 * 1e-6 if rough else None)
    if dtype == np.uint8 and mode == "linear":
        from onnx_nodes import node_model, oracle

        from celosia.runtime.reference import ReferenceModel

        consts = {"scales": np.array(scales, np.float32)} if sizes is None else \
            {"sizes": np.array(sizes, np.int64)}
        model = node_model("Resize", ["x", "", *(["scales"] if sizes is None else
                                                 ["", "sizes"])], {"x": x}, consts=consts,
                           attrs={"mode": mode}, opset=19)
        ours = ReferenceModel.load(model).run({"x": x})["y0"].astype(int)
        step = ours - oracle(model, {"x": x})[0].astype(int)
        assert step.min() >= 0 and step.max() <= 1


def test_tf_half_pixel_for_nn():
    """The opset-11-only coordinate mode of TensorFlow's nearest resize."""
    for shape, scales, sizes in _GEOMETRIES:
        _resize(_x(shape), scales, sizes, {"mode": "nearest", "coordinate_transformation_mode":
                                           "tf_half_pixel_for_nn"}, 11)


@pytest.mark.parametrize("shape, sizes, policy", [
    ((1, 2, 6, 8), [9, 10], "not_larger"), ((1, 2, 6, 8), [9, 10], "not_smaller"),
    ((1, 2, 7, 5), [3, 4], "not_larger"), ((1, 2, 7, 5), [3, 4], "stretch")])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_axes_and_aspect_ratio(shape, sizes, policy, mode):
    """Opset 18: sizes for the listed axes only, and one factor for all of them."""
    attrs = {"mode": mode, "axes": [2, 3], "keep_aspect_ratio_policy": policy}
    _resize(_x(shape), None, sizes, attrs, 18)


@pytest.mark.parametrize("axes", [[3, 2], [-1], [2]])
def test_axes_with_scales(axes):
    scales = {3: 2.5, 2: 0.5, -1: 1.5}
    attrs = {"mode": "linear", "axes": axes}
    _resize(_x((1, 2, 6, 8)), [scales[a] for a in axes], None, attrs, 19)


@pytest.mark.parametrize("shape, scales, sizes", [
    ((1, 2, 16, 12), [1, 1, 0.5, 0.25], None), ((1, 1, 15, 11), None, [1, 1, 4, 7]),
    ((1, 1, 5, 6), [1, 1, 2.0, 1.5], None)])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias(shape, scales, sizes, mode):
    """Opset 18: shrinking widens the filter by 1/scale (onnx's reference defines it;
    onnxruntime's antialiased filter differs from it at the borders)."""
    _resize(_x(shape), scales, sizes, {"mode": mode, "antialias": 1}, 18, which="onnx")


@pytest.mark.parametrize("shape, scales", [((2, 3, 4), [1, 2.0, 0.5]),
                                           ((1, 1, 3, 4, 5), [1, 1, 2.0, 1.5, 0.6])])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_other_ranks(shape, scales, mode):
    """3-d (linear along the last two axes) and 5-d (trilinear) inputs."""
    _resize(_x(shape), scales, None, {"mode": mode}, 13)


def test_resize_every_axis():
    """Interpolating the batch and channel axes too (onnxruntime takes only the inner
    ones for linear): onnx's reference evaluator decides."""
    _resize(_x((3, 4, 5, 6)), [0.7, 1.5, 2.0, 0.5], None, {"mode": "linear"}, 19, which="onnx")
    _resize(_x((3, 4, 5, 6)), [0.7, 1.5, 2.0, 0.5], None, {"mode": "cubic"}, 19, which="onnx")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(mode):
    """Upsample is Resize with asymmetric coordinates (floor for nearest): opset 9 (the
    version converter brings it to opset 11) and opset 7 (scales as an attribute)."""
    from onnx import helper, numpy_helper
    from onnx_nodes import oracle

    from celosia.runtime.cpu import CpuModel
    from celosia.runtime.reference import ReferenceModel

    x = _x((1, 2, 3, 4))
    scales = np.array([1, 1, 2.0, 2.5], np.float32)
    for opset in (7, 9):
        if opset == 9:
            node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode=mode)
            inits = [numpy_helper.from_array(scales, "scales")]
        else:
            node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=list(scales))
            inits = []
        graph = helper.make_graph([node], "up", [helper.make_tensor_value_info("x", 1, x.shape)],
                                  [helper.make_tensor_value_info("y", 1, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 7
        want = oracle(model, {"x": x})[0]
        assert want.shape == (1, 2, 6, 10)
        np.testing.assert_allclose(ReferenceModel.load(model).run({"x": x})["y"], want,
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(CpuModel.build(model).run({"x": x})["y"], want,
                                   rtol=1e-6, atol=1e-6)
