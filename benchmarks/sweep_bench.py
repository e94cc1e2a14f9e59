"""`celosia bench sweep`: design points per hour of `celosia sweep` (docs/sweep.md).

The workload is ResNet-18's ten conv layers (resnet18-conv), the space 8 configurations
around the default 1x16x16 core (INP buffer 16/32 KiB, bus 8/16 bytes, DRAM latency 16/32
cycles; `--quick`: 2 configurations), so 80 points, each a schedule search (compile and
cycle-model runs of the best candidates) and the chosen schedule's counters. Caches are
cold: every sweep writes to a new results directory and a new CELOSIA_CACHE, so every
schedule is searched. Resources are the analytic estimate (synthesis excluded).

Each round runs the three sweeps (local engine with 2 workers, Ray with 1 and with 2, each
Ray sweep on a local cluster it starts and stops), ``ROUNDS`` rounds interleaved, the order
rotated from round to round (so no engine always runs first or last). Every sweep is timed
whole: worker or cluster start, points, outputs and stopping the engine. The driver's own
imports (Ray, pyarrow, matplotlib) are made once before the first round, so every round
times the same work (``ray_import_s`` is that import's time, paid once by a `celosia sweep
--engine ray`).

Metrics, each the median over the rounds (``_iqr``: the interquartile range over the rounds,
``_min`` / ``_max`` the extreme round; benchmarks/spread.py), ratios taken within a round:
- ``points_per_hour``: points / wall time of the local engine with 2 workers;
- ``ray_scaling``: points per hour of the Ray engine with 2 workers over 1;
- ``overhead_ray_vs_local``: wall time with Ray (2 workers) over the local engine (2
  workers), the cluster's start included; ``overhead_ray_vs_local_points`` leaves the
  engines' start out (points only);
- ``points_per_hour_2_idle_cores``: 2 x 3600 / the points' own CPU time per point (what two
  idle cores would give, at most);
- ``ray_engine_start_s``: the Ray cluster's start (2 workers); ``rounds``; ``load_avg``: the
  1-minute load average (median of the values before and after every sweep; each sweep's
  are in ``runs``).

Goals (issue 17): >= 2000 points/h, ray_scaling >= 1.6, overhead <= 1.2, on the medians. The
machine may be shared: a loaded machine gives the two workers less than two cores, which
lowers ``ray_scaling`` most.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

SPACE = """
[space]
log_inp_buff_size = [14, 15]
bus_bytes = [8, 16]
dram_latency = [16, 32]
[workloads]
layers = ["resnet18-conv"]
"""
QUICK = """
[space]
bus_bytes = [8, 16]
[workloads]
layers = ["resnet18-conv"]
"""


ROUNDS = 3
RUNS = (("local", 2, "local2"), ("ray", 1, "ray1"), ("ray", 2, "ray2"))
TIMING_COLUMNS = ["eval_s", "eval_cpu_s"]  # the only columns that depend on the machine


def _warm_driver() -> dict:
    """Import what the driver of a sweep imports, so that no round pays it: the import
    time of Ray (seconds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (the Pareto picture)
    import pyarrow.parquet  # noqa: F401

    import celosia.sweep.run  # noqa: F401

    t0 = time.perf_counter()
    try:
        import ray  # noqa: F401
    except ImportError:
        from celosia.errors import CelosiaError

        raise CelosiaError("`celosia bench sweep` compares the local engine with Ray: "
                           "pip install 'celosia[sweep]'") from None
    return {"ray_import_s": round(time.perf_counter() - t0, 2)}


def _one(spec_text: str, engine: str, workers: int, root: Path, name: str, label: str):
    """One sweep, timed whole: its row of ``runs`` and its results table (timings dropped)."""
    import pyarrow.parquet as pq

    from celosia.sweep import parse_spec, run_sweep

    old = os.environ.get("CELOSIA_CACHE")
    os.environ["CELOSIA_CACHE"] = str(root / f"cache-{name}")  # cold caches
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        summary = run_sweep(parse_spec(spec_text), root / name, engine=engine, workers=workers,
                            progress=False)
    finally:
        if old is None:
            os.environ.pop("CELOSIA_CACHE", None)
        else:
            os.environ["CELOSIA_CACHE"] = old
    wall = time.perf_counter() - t0
    run = summary["this_run"]
    table = pq.read_table(root / name / "results.parquet")
    cpu = table.column("eval_cpu_s").to_pylist()
    row = {"engine": engine, "workers": workers, "points": run["evaluated"],
           "status": summary["status"], "wall_s": round(wall, 2),
           "points_s": run["points_s"], "engine_start_s": run.get("engine_start_s"),
           # writing the outputs while the engine stops
           "outputs_and_stop_s": round(wall - run["points_s"], 2),
           "points_per_hour": round(run["evaluated"] / wall * 3600, 1),
           # the points' own CPU time (the workers'), which the machine's load does not
           # stretch: what 2 idle cores would give, at most
           "cpu_s_per_point": round(sum(cpu) / len(cpu), 3),
           "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}
    print(f"  {label} {engine:<5} {workers} worker{'s' if workers > 1 else ' '}: "
          f"{row['points']} points in {wall:.1f} s ({row['points_per_hour']:.0f} points/h; "
          f"engine start {row['engine_start_s']} s, outputs and stop "
          f"{row['outputs_and_stop_s']} s; load {row['load_before']} -> "
          f"{row['load_after']})", flush=True)
    return row, table.drop(TIMING_COLUMNS)


def aggregate(rounds: list[dict]) -> dict:
    """The metrics (medians over the rounds, with their spread) of ``rounds``: one
    {"local2": row, "ray1": row, "ray2": row} per round, rows as ``_one`` makes them."""
    from .spread import summary

    per_round: dict = {k: [] for k in (
        "points_per_hour", "ray_scaling", "overhead_ray_vs_local",
        "overhead_ray_vs_local_points", "points_per_hour_2_idle_cores", "ray_engine_start_s")}
    loads = []
    for r in rounds:
        local, ray1, ray2 = r["local2"], r["ray1"], r["ray2"]
        per_round["points_per_hour"].append(local["points_per_hour"])
        per_round["ray_scaling"].append(ray2["points_per_hour"] / ray1["points_per_hour"])
        per_round["overhead_ray_vs_local"].append(ray2["wall_s"] / local["wall_s"])
        per_round["overhead_ray_vs_local_points"].append(
            (ray2["points_s"] - ray2["engine_start_s"]) /
            (local["points_s"] - local["engine_start_s"]))
        per_round["points_per_hour_2_idle_cores"].append(2 * 3600 / local["cpu_s_per_point"])
        per_round["ray_engine_start_s"].append(ray2["engine_start_s"])
        loads += [x for row in (local, ray1, ray2)
                  for x in (row["load_before"], row["load_after"])]
    spread = {k: summary(v) for k, v in per_round.items()}
    spread["load_avg"] = summary(loads)
    metrics: dict = {}
    for k, s in spread.items():
        digits = 1 if k.startswith("points_per_hour") else 3
        metrics[k] = round(s["median"], digits)
        if k in ("points_per_hour", "ray_scaling", "overhead_ray_vs_local"):
            metrics[k + "_iqr"] = round(s["iqr"], digits)
            worst = "max" if k.startswith("overhead") else "min"
            metrics[f"{k}_{worst}"] = round(s[worst], digits)
    metrics["rounds"] = len(rounds)
    return {"metrics": metrics, "spread": spread,
            "per_round": {k: [round(x, 3) for x in v] for k, v in per_round.items()}}


GOALS = {"points_per_hour": (">=", 2000), "ray_scaling": (">=", 1.6),
         "overhead_ray_vs_local": ("<=", 1.2)}


def run(quick: bool = False, rounds: int = ROUNDS) -> dict:
    text = QUICK if quick else SPACE
    warm = _warm_driver()
    points = 20 if quick else 80
    print(f"  {rounds} rounds of 3 sweeps of {points} points (local 2 workers, ray 1 and 2 "
          f"workers; order rotated each round); Ray imported in {warm['ray_import_s']} s",
          flush=True)
    results, identical = [], True
    first = None
    with tempfile.TemporaryDirectory(prefix="celosia-bench-sweep-") as tmp:
        for i in range(rounds):
            order = RUNS[i % len(RUNS):] + RUNS[:i % len(RUNS)]
            rows = {}
            for engine, workers, name in order:
                root = Path(tmp) / f"round{i + 1}"
                rows[name], table = _one(text, engine, workers, root, name,
                                         f"round {i + 1}/{rounds}:")
                if first is None:
                    first = table
                identical = identical and table.equals(first)
            results.append(rows)
            r = aggregate([rows])["metrics"]
            print(f"  round {i + 1}/{rounds}: points/h {r['points_per_hour']:.0f}, "
                  f"ray_scaling {r['ray_scaling']:.3f}, overhead_ray_vs_local "
                  f"{r['overhead_ray_vs_local']:.3f}", flush=True)
    agg = aggregate(results)
    m = agg["metrics"]
    met = {k: (m[k] >= v if op == ">=" else m[k] <= v) for k, (op, v) in GOALS.items()}
    print(f"  medians over {rounds} rounds: points/h {m['points_per_hour']:.0f} (IQR "
          f"{m['points_per_hour_iqr']:.0f}), ray_scaling {m['ray_scaling']:.3f} (IQR "
          f"{m['ray_scaling_iqr']:.3f}, min {m['ray_scaling_min']:.3f}), "
          f"overhead_ray_vs_local {m['overhead_ray_vs_local']:.3f} (IQR "
          f"{m['overhead_ray_vs_local_iqr']:.3f}, max {m['overhead_ray_vs_local_max']:.3f}); "
          f"load {m['load_avg']:.2f}", flush=True)
    return {
        "metrics": m,
        "goals": {k: f"{op} {v}" for k, (op, v) in GOALS.items()},
        "goals_met_by_median": met,
        "spread": agg["spread"],
        "per_round": agg["per_round"],
        "runs": [{"round": i + 1, **row} for i, rows in enumerate(results)
                 for row in rows.values()],
        "rows_identical_across_engines": identical,
        "ray_import_s": warm["ray_import_s"],
        "workload": "resnet18-conv (ResNet-18's conv layers C2-C11), cold schedule caches, "
                    "analytic resources (synthesis excluded)",
        "space": text.strip(),
        "note": "medians over interleaved rounds (the order of the three sweeps rotated each "
                "round), ratios taken within a round; wall time includes starting the engine "
                "(worker processes, or a local Ray cluster), writing the outputs and "
                "stopping it; shared machine: see load_avg and each run's load",
    }
