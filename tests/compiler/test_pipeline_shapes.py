"""quantize_model on a model with dynamic dims takes the sizes from the first calibration
feed when no input_shapes are given (as `celosia run` takes them from its arrays), and the
result is the same graph as with input_shapes given."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.graph.ir import DynamicShapeError
from celosia.compiler.pipeline import quantize_model


def _dynamic_model():
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32),
                                "w")
    return make_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                       helper.make_node("Relu", ["m"], ["y"])],
                      [vi("x", ["batch", "time", 8])], [vi("y", ["batch", "time", 4])], [w])


def test_dynamic_dims_take_the_first_feeds_sizes():
    feeds = [{"x": np.random.default_rng(s).normal(size=(2, 5, 8)).astype(np.float32)}
             for s in range(3)]
    q = quantize_model(_dynamic_model(), feeds)
    assert q.types["x"].shape == (2, 5, 8) and q.types["y"].shape == (2, 5, 4)
    given = quantize_model(_dynamic_model(), feeds, input_shapes={"x": (2, 5, 8)})
    assert [n.op for n in q.nodes] == [n.op for n in given.nodes]
    for name, value in given.initializers.items():
        np.testing.assert_array_equal(q.initializers[name], value)
    # samples along a leading axis (one dict) still need the sizes: the error says so
    with pytest.raises(DynamicShapeError, match="input_shapes"):
        quantize_model(_dynamic_model(), {"x": np.zeros((3, 2, 5, 8), np.float32)})
