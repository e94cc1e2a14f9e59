"""DepthToSpace and SpaceToDepth on the CPU build as one compiled 6-D strided copy
(lowering_nn.depth_space): bit-exact with the numpy reference and onnxruntime, both modes,
batches, block sizes, and a value that reaches them in the blocked layout (after a
convolution, as super-resolution's pixel shuffle does)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import cpu_build_checked, make_model, vi

from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize("op, shape, bs, mode, conv", [
    ("DepthToSpace", (1, 64, 9, 11), 2, "DCR", True),
    ("DepthToSpace", (2, 48, 5, 7), 4, "CRD", False),
    ("DepthToSpace", (1, 12, 6, 5), 2, "CRD", True),
    ("SpaceToDepth", (2, 3, 12, 20), 2, None, False),
    ("SpaceToDepth", (1, 16, 8, 12), 4, None, True),
])
def test_depth_space_against_references(op, shape, bs, mode, conv):
    rng = np.random.default_rng(bs * shape[1])
    attrs = {"blocksize": bs, **({"mode": mode} if mode else {})}
    nodes, inits, src = [], [], "x"
    if conv:  # the input comes blocked from a convolution
        inits.append(numpy_helper.from_array(
            (rng.normal(size=(shape[1], shape[1], 3, 3)) / 10).astype(np.float32), "w"))
        nodes.append(helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]))
        src = "c"
    nodes.append(helper.make_node(op, [src], ["y"], **attrs))
    model = make_model(nodes, [vi("x", None)], [vi("y", None)], inits)
    x = rng.normal(size=shape).astype(np.float32)
    built, got = cpu_build_checked(model, {"x": x}, rtol=1e-5)
    if not conv:  # a permutation: exactly the reference's values
        ref = ReferenceModel.load(model, {"x": shape}).run({"x": x})["y"]
        np.testing.assert_array_equal(got, ref)
    assert [s["kind"] for s in built.program.steps if s["op"] == op] == ["kernel", "view"]


def test_depth_to_space_int8():
    x = np.random.default_rng(1).integers(-128, 128, size=(1, 8, 3, 5), dtype=np.int8)
    node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD")
    model = make_model([node], [vi("x", None, TensorProto.INT8)],
                       [vi("y", None, TensorProto.INT8)])
    built = CpuModel.build(model, {"x": x.shape})
    want = ReferenceModel.load(model, {"x": x.shape}).run({"x": x})["y"]
    np.testing.assert_array_equal(built.run({"x": x})["y"], want)
