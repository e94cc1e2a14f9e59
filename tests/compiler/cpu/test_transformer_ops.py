"""Operators of the transformer and recurrent models (issue #12) through the CPU build,
against onnxruntime on seeded random inputs."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from celosia.runtime.cpu import CpuModel


def _model(nodes, inputs, outputs, opset, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _both(m, feeds):
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    got = CpuModel.build(m, {k: v.shape for k, v in feeds.items()}).run(feeds)
    return list(got.values()), want


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceL1", "ReduceSumSquare", "ReduceLogSumExp"])
def test_reduce_with_axes_attribute_before_opset_18(op):
    """Before opset 18 these reductions take ``axes`` as an attribute (all-MiniLM's
    ReduceL2 at opset 14); the importer refused it ("has no attribute 'axes'")."""
    x = np.random.default_rng(0).normal(size=(2, 5, 7)).astype(np.float32)
    node = helper.make_node(op, ["x"], ["y"], axes=[-1], keepdims=1)
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], opset=14)
    (got,), (want,) = _both(m, {"x": x})
    assert got.shape == want.shape == (2, 5, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
