"""QConvs whose padding reads a nonzero ``pad_value`` (the input's zero point) on the
accelerator, whose DMA pads with zeros: the bias table of compiler/accel/border.py. Every
case is checked bit for bit against qops.py (the all-CPU int8 build of the same graph) on
fsim and the cycle model, and one on the RTL (small configuration): strides, per-side
pads, windows larger than the image, crops, depthwise and grouped layers, 1-D ones, a
value read by several padded convolutions, and the bias table against a brute-force sum."""

import numpy as np
import pytest

from celosia.compiler.accel.border import axis_classes, bias_table
from celosia.compiler.graph.ir import Graph, Node, TensorType, constant
from celosia.compiler.graph.qops import qconv
from celosia.runtime.accel import AccelModel


class _Graph:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.inits, self.types, self.nodes = {}, {}, []

    def input(self, name, shape):
        self.types[name] = TensorType("int8", tuple(shape))

    def qconv(self, name, x, y, w_shape, out_shape, **attrs):
        """A QConv with random int8 weights, biases of about the size the zero points
        bring, multipliers and shift that spread the outputs over the int8 range."""
        o = w_shape[0]
        for suffix, a in (("w", self.rng.integers(-128, 128, w_shape, dtype=np.int8)),
                          ("b", self.rng.integers(-40000, 40000, o).astype(np.int32)),
                          ("m", self.rng.integers(1, 400, o).astype(np.int32))):
            self.inits[f"{name}_{suffix}"] = constant(a)
            self.types[f"{name}_{suffix}"] = TensorType(str(a.dtype), a.shape)
        dims = len(w_shape) - 2
        a = dict(kernel_shape=list(w_shape[2:]), strides=[1] * dims, pads=[0] * 2 * dims,
                 dilations=[1] * dims, group=1, shift=16, lo=-128, hi=127, scale=0.05)
        a.update(attrs)
        self.nodes.append(Node("QConv", (x, f"{name}_w", f"{name}_b", f"{name}_m"), (y,), a,
                               name))
        self.types[y] = TensorType("int8", tuple(out_shape))

    def graph(self, outputs):
        inputs = [v for v, t in self.types.items() if not any(v in n.outputs for n in self.nodes)
                  and v not in self.inits]
        return Graph("g", tuple(inputs), tuple(outputs), tuple(self.nodes), self.inits,
                     self.types)


def _run(g, kinds: dict, config="default", targets=("fsim", "cycle"), seed=1):
    """Build on the accelerator, check the nodes' kinds, and every target's outputs equal
    the all-CPU build's (qops.py's kernels, bit-exact) on -128/127-heavy random data."""
    model = AccelModel.build(g, config)
    for name, kind in kinds.items():
        assert model.placements[name].target == "accel", model.placements[name]
        assert model.programs[name]["kind"] == kind, (name, model.programs[name]["kind"])
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in g.inputs:
        x = rng.integers(-128, 128, g.types[v].shape, dtype=np.int8)
        u = rng.random(x.shape)
        x[u < 0.2], x[u > 0.8] = -128, 127
        feeds[v] = x
    want = model.cpu_build().run(feeds)
    for target in targets:
        got = model.run(feeds, target=target)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{target} {name}")
    return model, feeds, want


@pytest.mark.parametrize("case", [
    # (input C, H, W), weight, attrs, output (O, OH, OW), kind
    ((32, 12, 10), (48, 32, 3, 3), dict(pads=[1, 1, 1, 1], pad_value=-128), (48, 12, 10),
     "conv2d"),
    ((16, 11, 13), (32, 16, 3, 3), dict(pads=[1, 0, 2, 1], strides=[2, 1], pad_value=127),
     (32, 6, 12), "conv2d"),
    ((16, 9, 9), (16, 16, 5, 5), dict(pads=[2, 2, 2, 2], strides=[2, 2], pad_value=-77),
     (16, 5, 5), "conv2d"),
    ((24, 14, 14), (24, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=24, pad_value=-128),
     (24, 14, 14), "group_conv2d"),
    ((40, 15, 15), (40, 1, 5, 5), dict(pads=[2, 2, 2, 2], strides=[2, 2], group=40,
                                       pad_value=-100), (40, 8, 8), "group_conv2d"),
    ((32, 8, 8), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1], group=4, pad_value=55), (32, 8, 8),
     "group_conv2d"),
    ((16, 3, 4), (32, 16, 5, 5), dict(pads=[2, 2, 2, 2], pad_value=-128), (32, 3, 4),
     "conv2d"),  # every row and column touches the padding (identity classes)
    ((32, 1, 1), (16, 32, 3, 3), dict(pads=[1, 1, 1, 1], pad_value=-128), (16, 1, 1),
     "conv2d"),  # only the centre tap reads the image (crop_taps): one bias per channel
    ((16, 1, 2), (16, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=16, pad_value=-9), (16, 1, 2),
     "group_conv2d"),  # cropped rows, column classes
    ((16, 30), (24, 16, 5), dict(pads=[2, 1], strides=[2], pad_value=-128), (24, 15),
     "conv2d"),  # 1-D
    ((32, 21), (32, 1, 3), dict(pads=[1, 1], group=32, pad_value=100), (32, 21),
     "group_conv2d"),  # 1-D depthwise
], ids=["3x3", "asym-stride-2x1", "5x5-stride2", "depthwise", "depthwise-5x5-s2",
        "grouped", "small-image", "centre-only", "depthwise-cropped", "1d", "1d-depthwise"])
def test_padded_convolutions_with_pad_values_are_bit_exact(case):
    (c, *hw), w_shape, attrs, (o, *ohw), kind = case
    g = _Graph(len(str(case)))
    g.input("x", (1, c, *hw))
    g.qconv("conv", "x", "y", w_shape, (1, o, *ohw), **attrs)
    model, feeds, want = _run(g.graph(["y"]), {"conv": kind})
    # the all-CPU build is qops.py's meaning: the input padded by hand with pad_value
    node = g.nodes[0]
    nd = len(hw)
    pads = node.attrs["pads"]
    x = np.pad(feeds["x"], [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)],
               constant_values=attrs["pad_value"])
    consts = [np.asarray(g.inits[v]) for v in node.inputs[1:4]]
    np.testing.assert_array_equal(
        want["y"], qconv({**node.attrs, "pads": [0] * 2 * nd, "pad_value": 0}, x, *consts))


def test_a_value_read_by_several_padded_convolutions():
    """One value read by a 3x3 conv, a strided depthwise conv and a 1x1 conv (all with its
    zero point), and a chain: each reader's table is its own; on fsim, the cycle model and
    the RTL (small configuration, whose cycles the cycle model matches)."""
    g = _Graph(3)
    g.input("x", (1, 16, 10, 10))
    g.qconv("a", "x", "v", (32, 16, 3, 3), (1, 32, 10, 10), pads=[1, 1, 1, 1],
            pad_value=-128, lo=-128)
    g.qconv("b", "v", "y1", (16, 32, 3, 3), (1, 16, 10, 10), pads=[1, 1, 1, 1],
            pad_value=-128)
    g.qconv("dw", "v", "y2", (32, 1, 3, 3), (1, 32, 5, 5), pads=[0, 0, 1, 1],
            strides=[2, 2], group=32, pad_value=-128)
    g.qconv("pw", "v", "y3", (16, 32, 1, 1), (1, 16, 10, 10), pad_value=-128)
    graph = g.graph(["y1", "y2", "y3"])
    _run(graph, {"a": "conv2d", "b": "conv2d", "dw": "group_conv2d", "pw": "conv2d"})
    model, feeds, want = _run(graph, {}, config="small", targets=("rtl",), seed=2)
    rtl = [r["cycles"] for r in model.report if r["target"] == "accel"]
    got = model.run(feeds, target="cycle")
    assert [r["cycles"] for r in model.report if r["target"] == "accel"] == rtl
    assert all(c > 0 for c in rtl)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("size,taps,stride,pad,out", [
    (10, 3, 1, 1, 10), (11, 3, 2, 0, 5), (11, 3, 2, 1, 6), (9, 5, 2, 2, 5), (3, 5, 1, 2, 3),
    (1, 3, 1, 1, 1), (7, 7, 2, 3, 4), (20, 1, 1, 0, 20), (8, 4, 4, 3, 3)])
def test_axis_classes_and_table_against_brute_force(size, taps, stride, pad, out):
    """Every output position's entry of the table is the bias plus z times the weights of
    exactly the taps its window reads in the padding; positions of one class read the
    same taps there."""
    rng = np.random.default_rng(size * 100 + taps)
    w = rng.integers(-128, 128, (5, 3, taps, taps + 1), dtype=np.int8)
    bias = rng.integers(-2**31, 2**31, 5, dtype=np.int64).astype(np.int32)
    z = -128
    size2, pad2 = size + 2, pad + 1
    out2 = (size2 + 2 * pad2 - (taps + 1)) // stride + 1
    table, rows, cols = bias_table(bias, w, z, (size, size2), (stride, stride),
                                   (pad, pad2, pad, pad2), (out, out2))
    assert axis_classes(size, taps, stride, pad, out) == rows
    for y in range(out):
        for x in range(out2):
            dy = np.arange(taps) + y * stride - pad
            dx = np.arange(taps + 1) + x * stride - pad2
            off = ((dy < 0) | (dy >= size))[:, None] | ((dx < 0) | (dx >= size2))[None, :]
            want = (bias.astype(np.int64) + z * (w.astype(np.int64) * off).sum(axis=(1, 2, 3)))
            want = (want + 2**31) % 2**32 - 2**31
            np.testing.assert_array_equal(table[:, rows.of(y), cols.of(x)], want)
