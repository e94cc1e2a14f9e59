"""Dilated convolutions on the accelerator (partition.conv_weight): a QConv of dilation d runs
as its kernel with zeros between the taps, the same integer sums. Small ONNX models
(dilated 3x3 with padding, a dilated depthwise one, a 1-D dilated one, an image input with a
zero point so the padding reads a nonzero value, a stride-2 one with asymmetric padding)
quantized to int8 and built with AccelModel.build are bit-exact with the all-CPU int8 build
on fsim and the cycle model, with every convolution on the accelerator; a dilation whose
spread kernel would cost too much stays on the CPU and says so."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.graph.qops import pad_value
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel, compare_outputs

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _conv(rng, inits, name, x, y, cin, cout, k, dil, pads, group=1, stride=1, dims=2):
    shape = (cout, cin // group) + (k,) * dims
    inits.append(numpy_helper.from_array(
        rng.normal(0, 1 / np.sqrt(cin // group * k ** dims), shape).astype(np.float32),
        f"{name}_w"))
    inits.append(numpy_helper.from_array(rng.normal(0, 0.2, cout).astype(np.float32),
                                         f"{name}_b"))
    return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], kernel_shape=[k] * dims,
                            dilations=[dil] * dims, pads=list(pads), group=group,
                            strides=[stride] * dims)


def _check(model, shape, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)

    def feed():  # an offset input: the quantized image has a zero point (pad_value != 0)
        return {"x": (rng.normal(size=shape) + offset).astype(np.float32)}

    q = quantize_model(model, [feed() for _ in range(4)])
    built = AccelModel.build(q)
    convs = [n for n in q.nodes if n.op == "QConv"]
    assert convs and all(built.placements[n.name].target == "accel" for n in convs), \
        {n.name: built.placements[n.name].reason for n in convs}
    feeds = feed()
    want = built.cpu_build().run(feeds)
    for target in ("fsim", "cycle"):
        same, detail = compare_outputs(built.run(feeds, target=target), want, exact=True)
        assert same, f"{target}: {detail['summary']}"
    return q, built


def test_dilated_2d_convolutions_run_on_the_accelerator_bit_exact():
    rng = np.random.default_rng(1)
    inits = []
    h = helper.make_node
    nodes = [_conv(rng, inits, "a", "x", "a", 3, 16, 3, 2, (2, 2, 2, 2)),
             h("Sigmoid", ["a"], ["ar"]),  # a table's output: zero point -128
             _conv(rng, inits, "dw", "ar", "d", 16, 16, 3, 2, (2, 2, 2, 2), group=16),
             h("Relu", ["d"], ["dr"]),
             _conv(rng, inits, "s2", "dr", "s", 16, 24, 3, 3, (3, 2, 2, 3), stride=2),
             h("Relu", ["s"], ["y"])]
    model = make_model(nodes, [vi("x", [1, 3, 12, 12])], [vi("y", None)], inits)
    q, _ = _check(model, (1, 3, 12, 12), offset=1.5)
    # the dilated layers' padding reads the zero point (border bias tables, border.py)
    assert [pad_value(n.attrs) for n in q.nodes if n.op == "QConv"][1:] == [-128, -128]


def test_dilated_1d_convolution_runs_on_the_accelerator_bit_exact():
    rng = np.random.default_rng(2)
    inits = []
    nodes = [_conv(rng, inits, "a", "x", "a", 8, 16, 3, 1, (1, 1), dims=1),
             _conv(rng, inits, "b", "a", "y", 16, 16, 5, 2, (4, 4), dims=1)]
    model = make_model(nodes, [vi("x", [1, 8, 40])], [vi("y", None)], inits)
    _check(model, (1, 8, 40))


def test_a_large_dilation_stays_on_the_cpu_with_its_reason():
    rng = np.random.default_rng(3)
    inits = []
    nodes = [_conv(rng, inits, "a", "x", "a", 16, 16, 3, 1, (1, 1, 1, 1)),
             _conv(rng, inits, "far", "a", "y", 16, 16, 3, 6, (6, 6, 6, 6))]
    model = make_model(nodes, [vi("x", [1, 16, 16, 16])], [vi("y", None)], inits)
    q = quantize_model(model, [{"x": rng.normal(size=(1, 16, 16, 16)).astype(np.float32)}])
    built = AccelModel.build(q)
    far = next(n for n in q.nodes if n.op == "QConv" and n.attrs["dilations"] == [6, 6])
    reason = built.placements[far.name].reason
    assert built.placements[far.name].target == "cpu"
    assert reason.startswith("dilations [6, 6]: run as a kernel with zeros between its taps "
                             "it would do 18.8x the multiply-adds")
