"""ConvTranspose forms the CPU build rewrites before lowering: 1-D (vocoders' upsampling)
as 2-D of height 1 (cpu/conv1d.py), stride 1 as an ordinary convolution with the kernel
flipped (cpu/convt.py). Against the numpy reference and onnxruntime on seeded random
inputs."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import cpu_build_checked, make_model, vi


ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize("shape, m, kernel, attrs, bias, op", [
    ((1, 32, 50), 16, (16,), {"strides": [8], "pads": [4, 4]}, True, "ConvTranspose"),
    ((2, 16, 40), 8, (4,), {"strides": [2], "pads": [1, 1], "output_padding": [1]}, False,
     "ConvTranspose"),
    ((1, 16, 30), 16, (3,), {"strides": [2], "dilations": [2], "group": 2}, True,
     "ConvTranspose"),
    ((1, 16, 200), 1, (7,), {"pads": [3, 3]}, True, "Conv"),         # stride 1: a Conv
    ((1, 8, 9, 11), 3, (3, 3), {"pads": [1, 0, 2, 1]}, True, "Conv"),
    ((1, 8, 9, 11), 4, (3, 3), {"dilations": [2, 1], "pads": [1, 1, 1, 1]}, False, "Conv"),
    ((1, 8, 6, 6), 4, (3, 3), {"pads": [3, 0, 0, 0]}, False, "ConvTranspose"),  # pad > extent
])
def test_conv_transpose_forms(shape, m, kernel, attrs, bias, op):
    rng = np.random.default_rng(m + len(shape))
    c, g = shape[1], attrs.get("group", 1)
    inits = [numpy_helper.from_array(
        (rng.normal(size=(c, m // g, *kernel)) / np.sqrt(c * np.prod(kernel)))
        .astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(size=m).astype(np.float32), "b"))
    node = helper.make_node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), ["y"],
                            **attrs)
    model = make_model([node], [vi("x", None)], [vi("y", None)], inits)
    x = rng.normal(size=shape).astype(np.float32)
    built, _ = cpu_build_checked(model, {"x": x})
    ran = [s for s in built.program.steps if s["op"] in ("Conv", "ConvTranspose")]
    assert ran and all(s["kind"] == "kernel" for s in ran)
    assert {s["op"] for s in ran} == {op}
