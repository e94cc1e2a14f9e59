"""A stream of inputs pipelined between the CPU and the accelerator (runtime/overlap.py and
AccelModel.run_stream / run_batch): the schedule's invariants on random stage lists, one
hand-computed schedule, and a quantized model's stream on the cycle model, bit-exact with
one-at-a-time runs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celosia.errors import CelosiaError
from celosia.runtime.overlap import schedule, stages


def _rows(spec):
    """Report rows from (target, ms, layout_ms) triples."""
    rows = []
    for k, (target, ms, layout) in enumerate(spec):
        rows.append({"node": f"n{k}", "target": target, "layout_ms": layout,
                     "accel_ms": ms if target == "accel" else None,
                     "cpu_ms": ms if target == "cpu" else 0.0})
    return rows


def test_stages_merge_a_lane_and_put_layout_on_the_cpu():
    got = stages(_rows([("cpu", 1.0, 0.0), ("accel", 2.0, 0.5), ("accel", 1.0, 0.0),
                        ("cpu", 0.0, 0.0), ("cpu", 3.0, 0.25)]))
    assert [(s["lane"], s["ms"]) for s in got] == [("cpu", 1.5), ("accel", 3.0), ("cpu", 3.25)]
    assert got[0]["nodes"] == ["n0", "n1"]


def test_two_inputs_by_hand():
    one = _rows([("cpu", 1.0, 0.0), ("accel", 2.0, 0.0), ("cpu", 1.0, 0.0)])
    s = schedule([one, one], depth=2)
    # input 0: cpu [0,1] accel [1,3] cpu [3,4]; input 1: cpu [1,2] accel [3,5] cpu [5,6]
    assert s["makespan_ms"] == pytest.approx(6.0)
    assert s["serial_ms"] == pytest.approx(8.0)
    assert s["bound_ips"] == pytest.approx(500.0)
    assert s["throughput_vs_bound"] == pytest.approx(4.0 / 6.0)
    assert s["latency_ms"] == pytest.approx([4.0, 6.0])
    assert schedule([one, one], depth=1)["makespan_ms"] == pytest.approx(8.0)


_stage = st.tuples(st.sampled_from(["cpu", "accel"]),
                   st.floats(0.0, 5.0, allow_nan=False),
                   st.floats(0.0, 1.0, allow_nan=False))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_stage, min_size=0, max_size=8), min_size=1, max_size=6),
       st.integers(1, 4))
def test_schedule_invariants(specs, depth):
    reports = [_rows(s) for s in specs]
    s = schedule(reports, depth)
    eps = 1e-9
    for lane in ("cpu", "accel"):  # a lane runs one stage at a time
        spans = sorted((p for p in s["spans"] if p["lane"] == lane), key=lambda p: p["start"])
        assert all(a["end"] <= b["start"] + eps for a, b in zip(spans, spans[1:]))
    for k, rows in enumerate(reports):  # an input's stages in their order, none lost
        mine = [p for p in s["spans"] if p["input"] == k]
        want = stages(rows)
        assert [(p["lane"], round(p["end"] - p["start"], 9)) for p in mine] == \
            [(w["lane"], round(w["ms"], 9)) for w in want]
        assert all(a["end"] <= b["start"] + eps for a, b in zip(mine, mine[1:]))
    busiest = max(s["cpu_ms_per_input"], s["accel_ms_per_input"]) * len(reports)
    assert busiest - eps <= s["makespan_ms"] <= s["serial_ms"] + eps
    if depth == 1:
        assert s["makespan_ms"] == pytest.approx(s["serial_ms"])
    # at most ``depth`` inputs in flight: an input starts after input k - depth ended
    first = {k: min((p["start"] for p in s["spans"] if p["input"] == k), default=None)
             for k in range(len(reports))}
    last = {k: max((p["end"] for p in s["spans"] if p["input"] == k), default=0.0)
            for k in range(len(reports))}
    for k in range(depth, len(reports)):
        if first[k] is not None:
            assert first[k] >= last[k - depth] - eps


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="depth"):
        schedule([_rows([("cpu", 1.0, 0.0)])], depth=0)
    with pytest.raises(ValueError, match="no inputs"):
        schedule([], depth=2)
    with pytest.raises(ValueError, match="timed target"):
        schedule([_rows([("accel", None, 0.0)])], depth=2)


@pytest.fixture(scope="module")
def small_cnn():
    from celosia.compiler.pipeline import quantize_model
    from celosia.models.registry import entry
    from celosia.runtime.accel import AccelModel

    zoo = entry("small_cnn")
    calib = [zoo.make_feeds("small", seed=s) for s in (1, 2)]
    feeds = [zoo.make_feeds("small", seed=50 + k) for k in range(3)]
    q = quantize_model(zoo.model("small"), calib,
                       input_shapes={k: v.shape for k, v in feeds[0].items()})
    return AccelModel.build(q, "default"), feeds


def test_run_stream_outputs_are_run_outputs(small_cnn):
    model, feeds = small_cnn
    outs = model.run_stream(feeds, target="cycle", depth=2)
    for f, got in zip(feeds, outs):
        want = model.run(f, target="cycle")
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    s = model.stream
    assert s["inputs"] == 3 and len(model.stream_reports) == 3
    assert s["throughput_ips"] >= s["serial_throughput_ips"] * (1 - 1e-9)
    assert s["throughput_ips"] <= s["bound_ips"] * (1 + 1e-9)
    assert s["accel_ms_per_input"] > 0 and s["cpu_ms_per_input"] > 0


def test_run_batch_splits_and_concatenates(small_cnn):
    model, feeds = small_cnn
    batch = {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}
    got = model.run_batch(batch, target="cycle")
    for name, a in got.items():
        want = np.concatenate([model.run(f, target="cycle")[name] for f in feeds])
        np.testing.assert_array_equal(a, want)
    name, a = next(iter(batch.items()))
    with pytest.raises(CelosiaError, match="multiple of"):
        model.run_batch({name: a[..., :-1]}, target="cycle")
    with pytest.raises(CelosiaError, match="unknown input"):
        model.run_batch({"nope": a}, target="cycle")


def test_run_stream_needs_a_timed_target(small_cnn):
    model, feeds = small_cnn
    with pytest.raises(CelosiaError, match="timed target"):
        model.run_stream(feeds[:2], target="fsim")
