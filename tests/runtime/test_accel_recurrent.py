"""Quantized LSTM, GRU and RNN layers (compiler/graph/qrecurrent.py) on the accelerator
(runtime/accel_recurrent.py): the int8 CPU build and the accelerator build of the same
quantized graph agree bit for bit on fsim and the cycle model (directions, layouts,
sequence lengths, initial states, peepholes, GRU's two reset forms, a batch, both presets),
the layers are on the accelerator with every multiply-add, the quantized layer stays close
to onnxruntime's float one, a .cel round trip keeps it, and a layer the quantizer cannot
take says why."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, onnxruntime_run, recurrent_layer, vi

from celosia.benchmarks.zoo_int8 import cosine
from celosia.compiler.graph.macs import node_macs
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel, compare_outputs
from celosia.runtime.reference import ReferenceModel

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _feeds(model, seed):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"X": np.random.default_rng(seed).normal(size=shape).astype(np.float32)}


CASES = [  # op, layer arguments, configuration
    ("LSTM", dict(direction="forward", peepholes=True, seq_lens=[6, 0, 4]), "default"),
    ("LSTM", dict(direction="bidirectional", hidden=20, size=33, batch=1, steps=9), "default"),
    ("GRU", dict(direction="bidirectional", linear_before_reset=0), "default"),
    ("GRU", dict(direction="reverse", linear_before_reset=1, layout=1, seq_lens=[2, 6, 5]),
     "default"),
    ("RNN", dict(direction="reverse", layout=1, initial=False, bias=False), "default"),
    ("LSTM", dict(direction="forward", hidden=8, batch=2, steps=4), "small"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1].get('direction')}-{c[2]}")
def test_cpu_and_accelerator_builds_agree_bit_for_bit(case):
    op, args, config = case
    model = recurrent_layer(op, seed=len(str(args)), **args)
    calib = [_feeds(model, s) for s in range(1, 4)]
    test = _feeds(model, 100)
    q = quantize_model(model, calib, input_shapes={"X": test["X"].shape})
    (layer,) = [n for n in q.nodes if n.op == "Q" + op]
    built = AccelModel.build(q, config)
    assert built.placements[layer.name].target == "accel", built.placements[layer.name].reason
    want = built.cpu_build().run(test)
    for target in ("fsim", "cycle"):
        got = built.run(test, target=target)
        same, detail = compare_outputs(got, want, exact=True)
        assert same, f"{target}: {detail['summary']}"
    row = {r["node"]: r for r in built.report}[layer.name]
    assert row["target"] == "accel" and row["cycles"] > 0
    assert row["macs"] == node_macs(layer, q.types)  # each multiply-add once, not per pass
    steps = q.types[layer.inputs[0]].shape[1 if layer.attrs["layout"] else 0]
    dirs = 2 if layer.attrs["direction"] == "bidirectional" else 1
    per_step = 2 if op == "GRU" else 1
    assert row["launches"] == dirs * (1 + per_step * steps)
    # the integer layer stays close to the float one (onnxruntime's, or for batch-first
    # layers, which it does not run, celosia's float reference, held to it elsewhere)
    if args.get("layout"):
        ref = ReferenceModel.load(model, {"X": test["X"].shape}).run(test)
    else:
        ref = onnxruntime_run(model, test)
    for name, value in got.items():
        assert cosine(value, ref[name]) > 0.999, name


def test_saved_and_loaded(tmp_path):
    model = recurrent_layer("GRU", direction="forward", hidden=12, seed=3)
    q = quantize_model(model, [_feeds(model, s) for s in range(2)],
                       input_shapes={"X": _feeds(model, 0)["X"].shape})
    built = AccelModel.build(q)
    built.save(tmp_path / "m.cel")
    loaded = AccelModel.load(tmp_path / "m.cel")
    test = _feeds(model, 7)
    want = built.run(test, target="cycle")
    got = loaded.run(test, target="cycle")
    assert compare_outputs(got, want, exact=True)[0]
    assert loaded.summary()["cycles"] == built.summary()["cycles"]


def test_a_layer_with_run_time_weights_says_why():
    """An LSTM whose W is computed at run time stays float, with that reason, on the CPU."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(1, 16, 3)).astype(np.float32)
    r = rng.normal(size=(1, 16, 4)).astype(np.float32)
    nodes = [helper.make_node("Mul", ["Wc", "s"], ["W"]),
             helper.make_node("LSTM", ["X", "W", "R"], ["Y"], hidden_size=4)]
    m = make_model(nodes, [vi("X", [5, 1, 3]), vi("s", [1])], [vi("Y", None)],
                   [numpy_helper.from_array(w, "Wc"), numpy_helper.from_array(r, "R")])
    feeds = [{"X": rng.normal(size=(5, 1, 3)).astype(np.float32),
              "s": np.ones(1, np.float32)} for _ in range(2)]
    q = quantize_model(m, feeds, input_shapes={"X": (5, 1, 3), "s": (1,)})
    (lstm,) = [n for n in q.nodes if n.op == "LSTM"]
    built = AccelModel.build(q)
    reason = built.placements[lstm.name].reason
    assert "its W 'W' is computed at run time" in reason, reason


def test_a_head_reading_the_recurrence_keeps_16_bits():
    """A Gemm reading a recurrent layer's state (through Squeeze) becomes QMatMulWide, not an
    int8 QGemm: both on the accelerator, bit-exact, and closer to onnxruntime than an int8
    head (the zoo LSTM's quick size: 0.9999938 with an int8 head, 0.99999993 with this)."""
    rng = np.random.default_rng(9)
    hs = 12
    nodes = [helper.make_node("LSTM", ["X", "W", "R"], ["Y", "Yh"], hidden_size=hs),
             helper.make_node("Squeeze", ["Yh", "ax0"], ["h"]),
             helper.make_node("Gemm", ["h", "V", "c"], ["out"], transB=1)]
    inits = [numpy_helper.from_array((0.3 * rng.normal(size=s)).astype(np.float32), n)
             for n, s in (("W", (1, 4 * hs, 5)), ("R", (1, 4 * hs, hs)), ("V", (3, hs)),
                          ("c", (3,)))]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "ax0"))
    m = make_model(nodes, [vi("X", [7, 2, 5])], [vi("out", None)], inits)
    feeds = [{"X": rng.normal(size=(7, 2, 5)).astype(np.float32)} for _ in range(4)]
    q = quantize_model(m, feeds[:3], input_shapes={"X": (7, 2, 5)})
    assert [n.op for n in q.nodes if n.op.startswith("Q")] == ["QLSTM", "QMatMulWide"]
    built = AccelModel.build(q)
    assert all(p.target == "accel" for n, p in built.placements.items()
               if n in {x.name for x in q.nodes if x.op.startswith("Q")})
    want = built.cpu_build().run(feeds[3])
    got = built.run(feeds[3], target="cycle")
    assert compare_outputs(got, want, exact=True)[0]
    assert cosine(got["out"], onnxruntime_run(m, feeds[3])["out"]) > 0.99999
