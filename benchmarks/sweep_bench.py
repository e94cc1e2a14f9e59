"""`celosia bench sweep`: design points per hour of `celosia sweep` (docs/sweep.md).

The workload is ResNet-18's ten conv layers (resnet18-conv), the space 8 configurations
around the default 1x16x16 core (INP buffer 16/32 KiB, bus 8/16 bytes, DRAM latency 16/32
cycles; `--quick`: 2 configurations), so 80 points, each a schedule search (compile and
cycle-model runs of the best candidates) and the chosen schedule's counters. Caches are
cold: every sweep writes to a new results directory and a new CELOSIA_CACHE, so every
schedule is searched. Resources are the analytic estimate (synthesis excluded).

Metrics:
- ``points_per_hour``: points / wall time of the local engine with 2 workers (the whole
  run_sweep: worker start, points, outputs);
- ``ray_scaling``: points per hour of the Ray engine with 2 workers over 1 (each on a local
  cluster it starts; the cluster's start is in both);
- ``overhead_ray_vs_local``: wall time with Ray (2 workers) over the local engine (2
  workers), the cluster's start included; ``overhead_ray_vs_local_points`` leaves the
  engines' start out (points only).

Goals (issue 17): >= 2000 points/h, ray_scaling >= 1.6, overhead <= 1.2. The machine is
shared: the load average before and after each run is recorded.
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


def _one(spec_text: str, engine: str, workers: int, root: Path, name: str) -> dict:
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
    import pyarrow.parquet as pq

    cpu = pq.read_table(root / name / "results.parquet").column("eval_cpu_s").to_pylist()
    row = {"engine": engine, "workers": workers, "points": run["evaluated"],
           "status": summary["status"], "wall_s": round(wall, 2),
           "points_s": run["points_s"], "engine_start_s": run.get("engine_start_s"),
           "points_per_hour": round(run["evaluated"] / wall * 3600, 1),
           # the points' own CPU time (the workers'), which the machine's load does not
           # stretch: what 2 idle cores would give, at most
           "cpu_s_per_point": round(sum(cpu) / len(cpu), 3),
           "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}
    print(f"  {engine:<5} {workers} workers: {row['points']} points in {wall:.1f} s "
          f"({row['points_per_hour']:.0f} points/h; engine start {row['engine_start_s']} s; "
          f"load {row['load_before']} -> {row['load_after']})", flush=True)
    return row


def run(quick: bool = False) -> dict:
    import pyarrow.parquet as pq

    text = QUICK if quick else SPACE
    with tempfile.TemporaryDirectory(prefix="celosia-bench-sweep-") as tmp:
        root = Path(tmp)
        local = _one(text, "local", 2, root, "local2")
        ray1 = _one(text, "ray", 1, root, "ray1")
        ray2 = _one(text, "ray", 2, root, "ray2")
        tables = {name: pq.read_table(root / name / "results.parquet").drop(["eval_s", "eval_cpu_s"])
                  for name in ("local2", "ray1", "ray2")}
        same = tables["local2"].equals(tables["ray1"]) and tables["local2"].equals(tables["ray2"])
    return {
        "metrics": {
            "points_per_hour": local["points_per_hour"],
            "ray_scaling": round(ray2["points_per_hour"] / ray1["points_per_hour"], 3),
            "overhead_ray_vs_local": round(ray2["wall_s"] / local["wall_s"], 3),
            "points_per_hour_2_idle_cores": round(2 * 3600 / local["cpu_s_per_point"], 1),
            "overhead_ray_vs_local_points": round(
                (ray2["points_s"] - ray2["engine_start_s"]) /
                (local["points_s"] - local["engine_start_s"]), 3),
        },
        "runs": [local, ray1, ray2],
        "rows_identical_across_engines": same,
        "workload": "resnet18-conv (ResNet-18's conv layers C2-C11), cold schedule caches, "
                    "analytic resources (synthesis excluded)",
        "space": text.strip(),
        "goals": {"points_per_hour": ">= 2000", "ray_scaling": ">= 1.6",
                  "overhead_ray_vs_local": "<= 1.2"},
        "note": "shared machine: see each run's load average; wall time includes starting the "
                "engine (worker processes, or a local Ray cluster)",
    }
