"""Pad (reflect, edge, zeros) keeps int8 values in their scale: no Dequantize/Quantize
around it (style transfer's reflection pads, explicit zero pads). A zero Pad of a value
with a zero point pads with the zero point; a Pad by another value and a Resize stay
float, saying why. The int8 graph's CPU build
computes the numpy definition bit for bit, stays close to onnxruntime's float outputs, and
its accelerator build is bit-exact with it."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, onnxruntime_run, vi

from celosia.compiler.graph.reference import run_graph
from celosia.compiler.pipeline import quantize_model

C = 16

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _model(seed=0):
    rng = np.random.default_rng(seed)
    h = helper.make_node
    inits = {}

    def conv(name, x, y, k=3):
        inits[f"{name}_w"] = rng.normal(0, 1 / np.sqrt(C * k * k), (C, C, k, k))
        inits[f"{name}_b"] = rng.normal(0, 0.3, C)
        return h("Conv", [x, f"{name}_w", f"{name}_b"], [y], kernel_shape=[k, k], name=name)

    def const(name, v, dtype=np.int64):
        inits[name] = np.asarray(v, dtype)
        return name

    nodes = [
        h("Pad", ["x", const("p1", [0, 0, 1, 1, 0, 0, 1, 1])], ["xp"], mode="reflect"),
        conv("c1", "xp", "a"),
        h("Sigmoid", ["a"], ["s"]),  # a table's output: zero point -128
        # zeros, wider than the 3x3 kernel reaches (a Conv's own padding otherwise:
        # passes.fold_pads)
        h("Pad", ["s", const("p2", [0, 0, 3, 3, 0, 0, 3, 3])], ["sp"]),
        conv("c2", "sp", "b"),
        h("Pad", ["b", const("p3", [0, 0, 2, 1, 0, 0, 0, 1])], ["bp"], mode="edge"),
        h("Resize", ["bp", "", const("sc", [1, 1, 2, 2], np.float32)], ["u"], mode="nearest"),
        conv("c3", "u", "y1"),
        h("Resize", ["b", "", const("sc2", [1, 1, 2, 2], np.float32)], ["v"], mode="linear"),
        h("Pad", ["b", const("p4", [0, 0, 1, 1, 0, 0, 1, 1]), const("one", 1.0, np.float32)],
          ["w"]),
    ]
    inits = [numpy_helper.from_array(np.asarray(v, v.dtype if v.dtype != np.float64
                                                else np.float32), k) for k, v in inits.items()]
    return make_model(nodes, [vi("x", [1, C, 8, 8])],
                      [vi("y1", None), vi("v", None), vi("w", None)], inits)


def _feeds(seed):
    return {"x": np.random.default_rng(seed).normal(size=(1, C, 8, 8)).astype(np.float32)}


def test_pads_stay_int8_and_a_resize_says_why_it_stays_float():
    from celosia.runtime.accel import AccelModel, compare_outputs
    from celosia.runtime.cpu import CpuModel

    model = _model()
    q = quantize_model(model, [_feeds(s) for s in range(1, 5)])
    by_op = {}
    for n in q.nodes:
        by_op.setdefault(n.op, []).append(n)
    pads = [n for n in by_op["Pad"]]
    int8 = [n for n in pads + by_op["Resize"] if q.types[n.outputs[0]].dtype == "int8"]
    # the zero and edge pads (the reflection pad reads the float input)
    assert sorted(n.name for n in int8) == ["Pad_3", "Pad_5"]
    zero_pad = next(n for n in int8 if n.op == "Pad" and n.attrs["mode"] == "constant")
    assert zero_pad.attrs["value"] == -128
    floats = {n.name: n.attrs["float_reason"] for n in pads + by_op["Resize"]
              if n not in int8}
    assert "its input 'x' is float" in floats["Pad_0"]
    assert "its mode 'linear' interpolates" in floats["Resize_8"]
    assert "would share one scale with its input" in floats["Resize_6"]
    assert "pads with the value 1.0" in floats["Pad_9"]
    feeds = _feeds(100)
    cpu = CpuModel.from_graph(q).run(feeds)
    ref = run_graph(q, feeds)
    want = onnxruntime_run(model, feeds)
    for name in ("y1", "v", "w"):
        np.testing.assert_array_equal(cpu[name], ref[name])
        a, b = cpu[name].ravel().astype(np.float64), want[name].ravel().astype(np.float64)
        assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.999, name
    built = AccelModel.build(q)
    for target in ("fsim", "cycle"):
        same, detail = compare_outputs(built.run(feeds, target=target), cpu, exact=True)
        assert same, f"{target}: {detail['summary']}"
