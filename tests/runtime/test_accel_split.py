"""YOLO's C2f on the accelerator: a layer (and its SiLU table) split in two channel halves,
the second through a bottleneck with a residual, and a channel Concat of the halves and the
bottleneck's output. The quantizer keeps the Slices and the Concat int8 (one shared scale
for the Concat's inputs); compiler/accel/split.py makes the sliced layer one layer per
slice, bit for bit the same graph (run_graph), so the Concat's inputs are all computed on
the accelerator and written into their slices of its output: only the model's input and
output cross."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from accel_helpers import crossings as count_crossings
from onnx_builders import make_model, vi

from celosia.compiler.accel.split import split_sliced_layers
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel, compare_outputs

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _conv_silu(rng, name, x, y, cin, cout, k):
    w = rng.normal(0, 1 / np.sqrt(cin * k * k), (cout, cin, k, k)).astype(np.float32)
    b = rng.normal(0, 0.2, cout).astype(np.float32)
    h = helper.make_node
    return ([h("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_c"], kernel_shape=[k, k],
               pads=[k // 2] * 4),
             h("Sigmoid", [f"{name}_c"], [f"{name}_s"]), h("Mul", [f"{name}_c", f"{name}_s"], [y])],
            [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")])


def _c2f(c, hw, seed):
    rng = np.random.default_rng(seed)
    h = helper.make_node
    half = c // 2
    parts = [_conv_silu(rng, "cv1", "x", "t", c, c, 1),
             ([h("Slice", ["t", "s0", "e0", "ax"], ["a"]),
               h("Slice", ["t", "s1", "e1", "ax"], ["b"])], []),
             _conv_silu(rng, "m1", "b", "m1y", half, half, 3),
             _conv_silu(rng, "m2", "m1y", "m2y", half, half, 3),
             ([h("Add", ["b", "m2y"], ["m"]), h("Concat", ["a", "b", "m"], ["cat"], axis=1)], []),
             _conv_silu(rng, "cv2", "cat", "y", 3 * half, c, 1)]
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("s0", [0]), ("e0", [half]), ("s1", [half]), ("e1", [c]), ("ax", [1]))]
    nodes = [n for ns, _ in parts for n in ns]
    inits = [i for _, its in parts for i in its] + consts
    shape = (1, c, hw, hw)
    m = make_model(nodes, [vi("x", list(shape))], [vi("y", None)], inits)
    calib = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(3)]
    q = quantize_model(m, calib, input_shapes={"x": shape})
    return q, {"x": rng.normal(0, 1, shape).astype(np.float32)}


@pytest.mark.parametrize("c,hw", [(32, 6), (64, 4)])
def test_c2f_stays_on_the_accelerator(c, hw):
    q, feeds = _c2f(c, hw, seed=c)
    ops = [n.op for n in q.nodes]
    assert ops.count("Slice") == 2 and ops.count("Concat") == 1, ops
    assert all(q.types[n.outputs[0]].dtype == "int8" for n in q.nodes
               if n.op in ("Slice", "Concat"))
    split = split_sliced_layers(q)
    assert [n.op for n in split.nodes].count("Slice") == 0
    assert [n.op for n in split.nodes].count("QConv") == ops.count("QConv") + 1
    quantized = {k: v for k, v in run_graph(q, feeds).items()}
    for name, value in run_graph(split, feeds).items():
        np.testing.assert_array_equal(value, quantized[name], err_msg=name)

    model = AccelModel.build(q)
    want = model.cpu_build().run(feeds)
    np.testing.assert_array_equal(want["y"], quantized["y"])
    for target in ("fsim", "cycle"):
        same, detail = compare_outputs(model.run(feeds, target=target), want, exact=True)
        assert same, f"{target}: {detail['summary']}"
    places = {n.name: model.placements[n.name] for n in model.graph.nodes}
    assert {n.op for n in model.graph.nodes if places[n.name].target == "cpu"} == \
        {"Quantize", "Dequantize", "QLut"}, [(n.op, places[n.name].reason) for n in
                                            model.graph.nodes if places[n.name].target == "cpu"]
    assert model.summary()["crossings"] == 2 == count_crossings(model.graph, model.placements)
    concat = next(p for p in model.programs.values() if p["kind"] == "concat")
    assert len(concat["spec"]["slices"]) == 3


def test_slices_that_overlap_or_leave_the_layer_shared_are_not_split():
    """A value also read by something other than a channel Slice, or sliced twice over
    the same channels, keeps its layer whole."""
    q, _ = _c2f(32, 4, seed=3)
    sliced = next(n.inputs[0] for n in q.nodes if n.op == "Slice")
    for extra in ("reader", "overlap"):
        from celosia.compiler.graph.ir import Node, TensorType

        if extra == "reader":
            node = Node("Relu", (sliced,), ("extra",), {}, "extra_reader")
            types = {**q.types, "extra": q.types[sliced]}
        else:
            node = Node("Slice", (sliced,), ("extra",),
                        {"starts": [8], "ends": [24], "axes": [1], "steps": [1]}, "extra_reader")
            types = {**q.types, "extra": TensorType("int8", (1, 16, 4, 4))}
        g = q.with_nodes([*q.nodes, node], types=types)
        g = type(g)(g.name, g.inputs, (*g.outputs, "extra"), g.nodes, g.initializers, g.types)
        assert split_sliced_layers(g) is g, extra
