"""Kernel taps that read only padding (cpu/dead_taps.py): small images through ImageNet
networks (3x3 convolutions on a 1x1 or 1xN map), dilations, strides and asymmetric pads;
the CPU build against the numpy reference and onnxruntime on seeded random inputs, with
the kernel it compiled cut to the live taps."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import cpu_build_checked, make_model, vi

from celosia.compiler.cpu.dead_taps import _live

pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.usefixtures("private_cache")


def test_live_taps():
    assert _live(1, 1, 3, 1, 1, 1) == (1, 1)        # 1x1 map, 3x3 kernel, pad 1
    assert _live(5, 5, 3, 1, 1, 1) == (0, 2)        # every tap reads the image somewhere
    assert _live(1, 1, 3, 1, 2, 2) == (1, 1)        # dilation 2, pad 2
    assert _live(2, 1, 3, 2, 1, 1) == (1, 2)        # stride 2: the first tap only pads


@pytest.mark.parametrize("shape, kernel, attrs, live", [
    ((1, 32, 1, 1), (3, 3), {"pads": [1, 1, 1, 1]}, (1, 1)),
    ((2, 16, 1, 7), (3, 3), {"pads": [1, 1, 1, 1]}, (1, 3)),
    ((1, 16, 2, 2), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, (1, 1)),
    ((1, 16, 2, 6), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, (2, 3)),
    ((1, 16, 1, 9), (5, 3), {"pads": [2, 1, 2, 1]}, (1, 3)),
    ((1, 16, 6, 6), (3, 3), {"pads": [1, 1, 1, 1]}, (3, 3)),   # nothing to cut
])
def test_dead_taps_against_references(shape, kernel, attrs, live):
    rng = np.random.default_rng(sum(shape))
    c = shape[1]
    inits = [numpy_helper.from_array((rng.normal(size=(24, c, *kernel)) / np.sqrt(
        c * np.prod(kernel))).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=24).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [vi("x", None)], [vi("y", None)], inits)
    x = rng.normal(size=shape).astype(np.float32)
    built, _ = cpu_build_checked(model, {"x": x})
    (conv,) = [built.program.specs[s["kernel"]] for s in built.program.steps
               if s["op"] == "Conv"]
    assert tuple(conv["weight"][2:4]) == live  # [O/b, I/b, KH, KW, ...]
