"""Small ONNX models written with onnx.helper, for the tests that build models node by node
(tests/conftest.py puts this folder on sys.path)."""

from onnx import TensorProto, helper


def make_model(nodes, inputs, outputs, inits=(), opset=17):
    """A model of one graph "g"; IR version 10, which onnxruntime loads."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def vi(name, shape, elem=TensorProto.FLOAT):
    """A value's type: ``shape`` None for an unknown rank."""
    return helper.make_tensor_value_info(name, elem, shape)
