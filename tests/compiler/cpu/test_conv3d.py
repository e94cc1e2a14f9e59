"""3-D convolutions on the CPU build as sums of 2-D ones (cpu/conv3d.py): against the numpy
reference and onnxruntime on seeded random inputs, over strides, dilations and padding of
the depth axis, groups, batches, a fused activation; one with a residual stays numpy."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import cpu_build_checked, make_model, vi

from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.usefixtures("private_cache")


def _model(c, m, kernel, strides, dilations, pads, group, bias, act, residual, seed):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(
        (rng.normal(size=(m, c // group, *kernel)) / np.sqrt(c * np.prod(kernel)))
        .astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(size=m).astype(np.float32), "b"))
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"],
                              strides=strides, dilations=dilations, pads=pads, group=group)]
    last = "c"
    if act:
        nodes.append(helper.make_node(act, ["c"], ["a"]))
        last = "a"
    inputs = [vi("x", None)]
    if residual:
        nodes.append(helper.make_node("Add", [last, "r"], ["y"]))
        inputs.append(vi("r", None))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    return make_model(nodes, inputs, [vi("y", None)], inits)


@pytest.mark.parametrize("shape, m, kernel, strides, dilations, pads, group, bias, act", [
    ((1, 8, 6, 10, 12), 16, (3, 3, 3), [1, 1, 1], [1, 1, 1], [1] * 6, 1, True, None),
    ((2, 4, 9, 7, 7), 8, (3, 3, 3), [2, 1, 2], [1, 1, 1], [1, 0, 1, 0, 1, 1], 1, False,
     "Relu"),
    ((1, 6, 11, 8, 8), 6, (2, 3, 3), [1, 1, 1], [3, 1, 1], [2, 1, 1, 1, 1, 1], 2, True,
     "Sigmoid"),
    ((1, 3, 4, 16, 16), 16, (1, 1, 1), [1, 1, 1], [1, 1, 1], [0] * 6, 1, True, None),
    ((1, 16, 5, 9, 9), 32, (3, 1, 1), [1, 1, 1], [1, 1, 1], [1, 0, 0, 1, 0, 0], 1, True,
     "Relu"),   # R(2+1)D's temporal convolution
])
def test_conv3d_against_references(shape, m, kernel, strides, dilations, pads, group, bias,
                                   act):
    model = _model(shape[1], m, kernel, strides, dilations, pads, group, bias, act, False,
                   m + shape[2])
    x = np.random.default_rng(shape[2]).normal(size=shape).astype(np.float32)
    built, got = cpu_build_checked(model, {"x": x})
    convs = [s for s in built.program.steps if s["op"] == "Conv"]
    assert len(convs) == kernel[0] and all(s["kind"] == "kernel" for s in convs)
    # each a 2-D convolution of the batch of output depths
    assert all(built.program.specs[s["kernel"]]["data"][0] == shape[0] * got.shape[2]
               for s in convs)


def test_conv3d_with_a_residual_stays_numpy():
    model = _model(4, 8, (3, 3, 3), [1, 1, 1], [1, 1, 1], [1] * 6, 1, True, None, True, 3)
    rng = np.random.default_rng(4)
    feeds = {"x": rng.normal(size=(1, 4, 5, 6, 6)).astype(np.float32),
             "r": rng.normal(size=(1, 8, 5, 6, 6)).astype(np.float32)}
    shapes = {k: v.shape for k, v in feeds.items()}
    built = CpuModel.build(model, shapes)
    want = ReferenceModel.load(model, shapes).run(feeds)["y"]
    np.testing.assert_allclose(built.run(feeds)["y"], want, rtol=1e-4,
                               atol=1e-5 * np.abs(want).max())
    assert [s["kind"] for s in built.program.steps if s["op"] == "Conv"] == ["numpy"]
