"""A CPU build whose graph outputs are constants: a Shape of a static input, a NonZero of an
initializer, an initializer named as an output (folded at compile time). They were a
KeyError in the memory plan; now they come out beside outputs computed at run time, equal
to onnxruntime's, as fresh arrays, through a profiled run and the .cel round trip."""

import numpy as np
import pytest
from onnx_builders import onnxruntime_run as _onnxruntime
from onnx import TensorProto, helper, numpy_helper

from celosia.runtime.cpu import CpuModel
from celosia.runtime.executor import plan_memory

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _model(outputs, nodes, inputs=True):
    rng = np.random.default_rng(7)
    mask = (rng.random((3, 4)) < 0.5).astype(np.float32)
    graph = helper.make_graph(
        nodes, "constant_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])] if inputs else [],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(mask, "mask"),
         numpy_helper.from_array(np.arange(5, dtype=np.int64), "table")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m



NODES = [helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("NonZero", ["mask"], ["where"]),
         helper.make_node("Relu", ["x"], ["relu"]),
         helper.make_node("Add", ["shape", "shape"], ["twice"])]


def _check(built, model, feeds):
    got, want = built.run(feeds), _onnxruntime(model, feeds)
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    return got


def test_constant_outputs_beside_computed_ones(tmp_path):
    model = _model(["shape", "relu", "where", "table", "twice"], NODES)
    built = CpuModel.build(model)
    plan_memory(built.program)  # (was the KeyError)
    x = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    got = _check(built, model, {"x": x})
    got["shape"][0] = 99  # a fresh array: the constant itself is untouched
    assert built.run({"x": x})["shape"].tolist() == [2, 3]
    built.run({"x": x}, profile=True)
    assert "Relu" in [p["op"] for p in built.profile]
    path = tmp_path / "m.cel"
    built.save(path)
    _check(CpuModel.load(path), model, {"x": x})


def test_every_output_constant():
    """A model without inputs, all of it folded."""
    model = _model(["where", "table"], NODES[1:2], inputs=False)
    _check(CpuModel.build(model), model, {})
