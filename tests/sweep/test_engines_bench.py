"""The Ray engine's local cluster (its workers at the driver's priority, the driver's
environment left as it was; sweeps one after another in a process), and
`celosia bench sweep`'s medians and spread over rounds."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from celosia.benchmarks.sweep_bench import aggregate
from celosia.sweep.engines import LOCAL_CLUSTER_ENV, run_ray
from celosia.sweep import parse_spec, run_sweep


def test_local_ray_cluster_runs_its_workers_at_the_drivers_priority():
    pytest.importorskip("ray")
    import ray

    assert not ray.is_initialized()
    before = {k: os.environ.get(k) for k in LOCAL_CLUSTER_ENV}
    timing: dict = {}

    def niceness(_):  # a local function: pickled by value, so the workers need not import it
        import os

        return os.nice(0)

    got = list(run_ray(niceness, [0, 1, 2, 3], 2, None, timing))
    assert not ray.is_initialized()  # the cluster it started is stopped
    assert [r for _, r, _ in got] == [os.nice(0)] * 4
    assert all(reason == "" for _, _, reason in got)
    assert timing["start_s"] > 0
    assert {k: os.environ.get(k) for k in LOCAL_CLUSTER_ENV} == before


TINY = """
[base]
preset = "ecp5"
[space]
bus_bytes = [8, 16]
[workloads]
layers = ["conv:8x8x16->32:k1:s2"]
"""


def test_ray_sweeps_one_after_another_in_one_process(tmp_path, monkeypatch):
    """Each sweep starts and stops its own cluster, and the next one in the same process
    starts a new one: the bench's rounds. (Writing the outputs in a thread while Ray
    stopped killed the process at the next sweep: a garbage collection in that thread
    released Ray object references while the core worker was shutting down.)"""
    pytest.importorskip("ray")
    import ray

    monkeypatch.setenv("CELOSIA_CACHE", str(tmp_path / "cache"))
    rows = []
    for i in range(2):
        summary = run_sweep(parse_spec(TINY), tmp_path / f"out{i}", engine="ray", workers=1,
                            progress=False)
        assert summary["status"] == {"ok": 2} and not ray.is_initialized()
        rows.append(pq.read_table(tmp_path / f"out{i}" / "results.parquet")
                    .drop(["eval_s", "eval_cpu_s"]))
        assert (tmp_path / f"out{i}" / "pareto.png").stat().st_size > 0
    assert rows[0].equals(rows[1])


def _row(wall, points=80, start=0.0, cpu=0.5, load=(1.0, 1.2)):
    return {"points": points, "wall_s": wall, "points_s": wall - 0.5, "engine_start_s": start,
            "points_per_hour": points / wall * 3600, "cpu_s_per_point": cpu,
            "load_before": load[0], "load_after": load[1]}


def test_bench_aggregate_takes_medians_of_per_round_ratios():
    rng = np.random.default_rng(17)
    rounds, want = [], {"scaling": [], "overhead": [], "pph": []}
    for _ in range(5):
        local, r1, r2 = rng.uniform(20, 30), rng.uniform(45, 55), rng.uniform(25, 33)
        rounds.append({"local2": _row(local), "ray1": _row(r1, start=2.0),
                       "ray2": _row(r2, start=3.0)})
        want["scaling"].append(r1 / r2)  # the same points: the ratio of the wall times
        want["overhead"].append(r2 / local)
        want["pph"].append(80 / local * 3600)
    m = aggregate(rounds)["metrics"]
    assert m["rounds"] == 5
    assert m["ray_scaling"] == pytest.approx(np.median(want["scaling"]), abs=1e-3)
    assert m["overhead_ray_vs_local"] == pytest.approx(np.median(want["overhead"]), abs=1e-3)
    assert m["points_per_hour"] == pytest.approx(np.median(want["pph"]), abs=0.1)
    q = np.percentile(want["overhead"], [25, 75])
    assert m["overhead_ray_vs_local_iqr"] == pytest.approx(q[1] - q[0], abs=1e-3)
    assert m["overhead_ray_vs_local_max"] == pytest.approx(max(want["overhead"]), abs=1e-3)
    assert m["ray_scaling_min"] == pytest.approx(min(want["scaling"]), abs=1e-3)
    assert m["ray_engine_start_s"] == 3.0
    assert m["points_per_hour_2_idle_cores"] == pytest.approx(2 * 3600 / 0.5, abs=0.1)
    assert m["load_avg"] == pytest.approx(1.1, abs=1e-3)  # the median of 1.0s and 1.2s
    # one round: its own ratios, no spread
    one = aggregate(rounds[:1])["metrics"]
    assert one["overhead_ray_vs_local"] == pytest.approx(want["overhead"][0], abs=1e-3)
    assert one["overhead_ray_vs_local_iqr"] == 0 and one["rounds"] == 1
