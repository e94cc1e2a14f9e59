"""Register tiles of the float convolution for output widths with few divisors
(cpu/schedules.py conv_columns; cpu/lowering.py widens an output with no tile of 4 or more
columns and crops it): the tile sizes, and whole models at such widths against the numpy
reference and onnxruntime on seeded random inputs."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.cpu.lowering import _wider_output
from celosia.compiler.cpu.schedules import conv_columns
from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

ort = pytest.importorskip("onnxruntime")

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def test_tile_columns():
    for width, ob, want in [(80, 16, 10), (56, 16, 14), (7, 16, 7), (19, 16, 19), (38, 16, 19),
                            (17, 16, 17), (29, 16, 1), (15, 16, 15), (19, 8, 19), (12, 32, 12),
                            (26, 32, 13), (1, 16, 1)]:
        got = conv_columns(width, ob)
        assert got == want and width % got == 0, (width, ob, got)
    assert _wider_output(29, 16) == 30 and _wider_output(31, 16) == 32
    assert _wider_output(58, 16) == 60 and _wider_output(61, 8) == 63
    assert all(_wider_output(w, 16) is None for w in (1, 2, 3, 7, 19, 20, 38, 80))


def _model(width, channels, seed):
    """Conv 3x3 stride 2 (out width ``width``) -> Relu, a 1x1 Conv with a per-channel Mul,
    a 3x3 Conv with a residual Add (a full-size epilogue operand: not widened)."""
    rng = np.random.default_rng(seed)
    c = channels
    w = lambda *s: numpy_helper.from_array(  # noqa: E731
        (rng.normal(size=s) / np.sqrt(np.prod(s[1:]))).astype(np.float32))
    inits = [w(c, 3, 3, 3), w(c), w(c, c, 1, 1), w(c, 1, 1), w(c, c, 3, 3)]
    for t, name in zip(inits, ("w0", "b0", "w1", "scale", "w2")):
        t.name = name
    nodes = [helper.make_node("Conv", ["image", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"]),
             helper.make_node("Mul", ["c1", "scale"], ["m1"]),
             helper.make_node("Conv", ["m1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r0"], ["y"])]
    return make_model(nodes, [vi("image", None)], [vi("y", None)], inits)


@pytest.mark.parametrize("width, channels, batch, height", [
    (29, 32, 1, 5),    # no tile of 4 or more: widened to 30, cropped
    (31, 24, 2, 3),    # block 8, batch 2
    (19, 16, 1, 1),    # a tile of 19 columns; height 1
    (58, 16, 1, 2),    # only 2-column tiles (58 = 2 x 29): widened to 60
])
def test_odd_widths_against_references(width, channels, batch, height):
    model = _model(width, channels, width)
    shape = (batch, 3, 2 * height - 1, 2 * width - 1)
    x = np.random.default_rng(batch).normal(size=shape).astype(np.float32)
    built = CpuModel.build(model, {"image": shape})
    got = built.run({"image": x})["y"]
    ref = ReferenceModel.load(model, {"image": shape}).run({"image": x})["y"]
    (want,) = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"image": x})
    assert got.shape == want.shape == (batch, channels, height, width)
    for other in (ref, want):
        np.testing.assert_allclose(got, other, rtol=1e-4, atol=1e-5 * np.abs(other).max())
    crops = [s for s in built.program.steps if s["op"] == "Slice"]
    widened = _wider_output(width, 16 if channels % 16 == 0 else 8) is not None
    # The two convolutions without a full-size operand are widened and cropped.
    assert len(crops) == (2 if widened else 0)
    assert all(s["kind"] == "numpy" and "@wide" in s["inputs"][0] for s in crops)
