"""ReduceMean over H and W of a 4-D float32 value on the CPU build: the ``gap`` kernel on
the blocked layout (keepdims) or a view of it as [N, C], against the numpy reference and
onnxruntime on seeded random inputs; other axes stay numpy steps."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import cpu_build_checked, make_model, vi


ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize("shape, axes, keepdims, kernel", [
    ((2, 32, 9, 7), [2, 3], 1, True),     # squeeze-excitation's x.mean((2, 3), keepdim)
    ((1, 24, 14, 14), [-1, -2], 0, True),   # a classifier's mean over the image
    ((1, 5, 6, 6), [3, 2], 1, True),        # channels with no block of 8
    ((1, 16, 4, 4), [1, 2], 1, False),      # other axes: numpy
])
def test_spatial_mean_against_references(shape, axes, keepdims, kernel):
    rng = np.random.default_rng(shape[1])
    c = shape[1]
    w = numpy_helper.from_array((rng.normal(size=(c, c, 3, 3)) / 9).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["c"], ["m"], axes=axes, keepdims=keepdims),
             helper.make_node("Relu", ["m"], ["y"])]
    model = make_model(nodes, [vi("x", None)], [vi("y", None)], [w])
    x = rng.normal(size=shape).astype(np.float32)
    built, _ = cpu_build_checked(model, {"x": x}, rtol=1e-5, atol=1e-6)
    kinds = [s["kind"] for s in built.program.steps if s["op"] == "ReduceMean"]
    assert kinds[0] == ("kernel" if kernel else "numpy")
