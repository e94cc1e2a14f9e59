"""`celosia bench zoo --accel` on the small CNN: the accelerator record's fields against
what the quantized graph and its placement say independently, the totals, the time limit
and the command line's checks."""

import json

import numpy as np
import pytest
from accel_helpers import crossings

from celosia.benchmarks import zoo_accel
from celosia.cli import main
from celosia.models.registry import ZOO


def test_bench_zoo_accel_record_on_the_small_cnn(tmp_path, capsys):
    from celosia.compiler.pipeline import quantize_model
    from celosia.compiler.accel.partition import annotate
    from celosia import HwConfig

    out = tmp_path / "zoo.json"
    assert main(["bench", "zoo", "--quick", "--models", "small_cnn", "--accel",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    r, metrics = result["models"]["small_cnn"], result["metrics"]
    assert r["ok_accel"] and "accel_error" not in r
    assert "int8_cosine" in r  # --accel measures the int8 graph too

    # The same graph again (same seeds), placed independently of the benchmark.
    entry = ZOO["small_cnn"]
    feeds = entry.make_feeds("small", seed=100)
    q = quantize_model(entry.model("small"), [entry.make_feeds("small", seed=s)
                                              for s in range(1, 7)],
                       input_shapes={k: v.shape for k, v in feeds.items()})
    places = annotate(q, HwConfig())
    # Its MACs by hand, batch 4: conv 1->8 3x3 on 8x8, conv 8->16 3x3 on 4x4, dense 256->10.
    macs = 4 * (8 * 8 * 8 * 9 + 16 * 4 * 4 * 8 * 9 + 256 * 10)
    assert r["macs"] == r["accel_macs"] == macs and r["accel_mac_share"] == 1.0
    assert r["accel_cpu_macs"] == {}
    # conv, conv, MaxPool (ALU), Reshape (a view), QGemm: one region; the quantized input
    # goes in, the QGemm's output comes back.
    assert [places[n.name].target for n in q.nodes if n.op in ("MaxPool", "Reshape")] == \
        ["accel", "accel"]
    assert r["cpu_accel_transitions"] == crossings(q, places) == 2
    assert r["accel_cycles"] > 0 and r["accel_sim_wall_s"] > 0
    assert r["utilization"] == pytest.approx(macs / (r["accel_cycles"] * 256))
    # the GEMM core's work: conv1 pads 1 input channel to 16 and 8 outputs to 16, conv2 8
    # inputs to 16, the dense its 10 outputs to 16 (batch 4 = 4 BATCH groups: no padding)
    gemm = 4 * (16 * 8 * 8 * 16 * 9 + 16 * 4 * 4 * 16 * 9 + 256 * 16)
    assert r["padding_overhead"] == pytest.approx(gemm / macs - 1)
    assert 0 < r["layout_share"] < 1 and r["accel_latency_ms"] > 0
    assert r["accel_nodes"] == 5 and r["cpu_nodes"] == len(q.nodes) - 5

    assert metrics["models_ok_accel"] == 1 and metrics["accel_mac_share_min"] == 1.0
    assert metrics["layout_share_max"] == pytest.approx(r["layout_share"])
    assert "small_cnn: accelerator MAC share 1.000" in capsys.readouterr().err


def _small_int8():
    from celosia.compiler.pipeline import quantize_model
    from celosia.runtime.cpu import CpuModel

    entry = ZOO["small_cnn"]
    feeds = entry.make_feeds("small", seed=100)
    q = quantize_model(entry.model("small"), [entry.make_feeds("small", seed=1)],
                       input_shapes={k: v.shape for k, v in feeds.items()})
    return q, feeds, CpuModel.from_graph(q).run(feeds)


def test_a_model_over_the_time_limit_is_recorded_with_the_reason():
    q, feeds, outputs = _small_int8()
    r = zoo_accel.measure(q, feeds, outputs, time_limit=0.0)
    assert r["ok_accel"] is False
    assert r["accel_error"].startswith("over the time limit of 0 s in the build, after: ")
    totals = zoo_accel.totals({"slow": r})
    assert totals == {"models_ok_accel": 0}


def test_outputs_that_differ_from_the_cpu_build_are_not_ok():
    q, feeds, outputs = _small_int8()
    wrong = {k: v + np.float32(1) for k, v in outputs.items()}
    r = zoo_accel.measure(q, feeds, wrong, time_limit=600)
    assert r["ok_accel"] is False and r["accel_mac_share"] == 1.0
    assert r["accel_error"].startswith("differs from the int8 CPU build: ")


def test_command_line_checks(capsys):
    assert main(["bench", "zoo", "--accel", "--time-limit", "-1"]) == 2
    assert "--time-limit must be a positive number of seconds, not -1" in capsys.readouterr().err
    assert main(["bench", "fsim", "--accel"]) == 2
    assert "--accel and --time-limit measure zoo models" in capsys.readouterr().err
