"""`celosia bench resnet18-e2e`: ResNet-18 at 224x224, int8, split between the accelerator
(cycle model, default configuration) and the CPU, end to end.

The model (models/zoo.py, random weights) is quantized from a few random calibration
images, partitioned and compiled (schedule search on the cycle model), then one image runs
through the whole model on the cycle model. Compilation and simulation are timed
separately, each cold (nothing cached) and warm:

- ``build_s_cold``: quantize, partition, schedule search, programs and CPU kernels with
  empty caches (a temporary CELOSIA_CACHE, the first build in the process);
  ``build_s_warm``: the same build again (schedules and kernels from that cache);
- ``wall_s``: wall time of the first simulated run, cold: the simulators' caches emptied
  (``sim.base.clear_caches``) and the model's executor new, so every program is decoded,
  checked, planned and compiled into kernels in this run (the goal is at most 3 s on two
  cores); ``sim_wall_s_warm``: the second run;
- ``latency_ms``: the model's latency, accelerator time at the configured clock plus the
  measured CPU time of the CPU nodes and of packing/unpacking at region borders, of the
  warm (second) run; ``latency_ms_cold``: the same of the cold run (its CPU nodes pay
  one-time set-up, such as starting the CPU worker threads); ``accel_ms`` and ``cpu_ms``
  (CPU nodes plus layout) are the warm run's two shares;
- ``utilization``: the accelerated layers' real multiply-adds (the model's own, no
  padding) over cycles x MACs per cycle; ``padding_overhead``: the GEMM core's
  multiply-adds on padded channels relative to the real ones (compiler/graph/macs.py);
- ``accel_speedup_vs_cpu``: the accelerated layers' time on celosia's fp32 CPU build (LLVM,
  all cores of this machine, median of several runs) over their accelerator time.

The int8 result is also checked bit for bit against the all-CPU build of the same
quantized graph. The JSON holds the per-layer table.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError
from celosia.sim.base import clear_caches

from .cpu_resnet18 import _env


def run(quick: bool = False) -> dict:
    from celosia.models import zoo as models
    from celosia.runtime.accel import AccelModel, compare_outputs
    from celosia.runtime.cpu import CpuModel
    from celosia.runtime.report import format_table

    size = 112 if quick else 224
    cfg = HwConfig()
    onnx_model = models.resnet18(image_size=size)
    data = onnx_model.SerializeToString()
    rng = np.random.default_rng(0)
    calib = {"image": rng.normal(size=(4, 3, size, size)).astype(np.float32)}
    x = {"image": rng.normal(size=(1, 3, size, size)).astype(np.float32)}

    def build():
        t0 = time.perf_counter()
        built = AccelModel.from_onnx(data, cfg, calibration=calib, target="cycle",
                                     progress=lambda line: print(line, flush=True))
        return built, time.perf_counter() - t0

    with tempfile.TemporaryDirectory(prefix="celosia-bench-cache-") as cache, \
            _env("CELOSIA_CACHE", cache):
        _, build_s_cold = build()  # empty caches: schedule search, CPU kernels compiled
        model, build_s_warm = build()  # from the cache the first build filled
    clear_caches()  # the first run of every program: nothing decoded, planned or compiled
    t0 = time.perf_counter()
    model.run(x, target="cycle")
    wall_s = time.perf_counter() - t0
    latency_ms_cold = model.summary()["latency_ms"]
    t0 = time.perf_counter()
    out = model.run(x, target="cycle")  # the figures: the second run (warm)
    sim_wall_s_warm = time.perf_counter() - t0
    rows, summary = model.report, model.summary()
    same, _ = compare_outputs(out, model.cpu_build().run(x), exact=True)
    if not same:
        raise CelosiaError("resnet18-e2e: the accelerator build differs from the all-CPU "
                           "build of the same quantized graph")

    # The same layers on celosia's fp32 CPU build: per-node medians of several runs.
    cpu = CpuModel.build(data)
    cpu.run(x)
    per_node: dict[str, list[float]] = {}
    for _ in range(3 if quick else 7):
        cpu.run(x, profile=True)
        for step in cpu.report()["nodes"]:
            per_node.setdefault(step["node"], []).append(step["ms"])
    cpu_ms = {name: float(np.median(v)) for name, v in per_node.items()}
    accel_rows = [r for r in rows if r["target"] == "accel"]
    matched = [r for r in accel_rows if r["node"] in cpu_ms]
    if len(matched) != len(accel_rows):
        missing = sorted(r["node"] for r in accel_rows if r["node"] not in cpu_ms)
        raise CelosiaError(f"resnet18-e2e: accelerator nodes {missing} have no counterpart in "
                           f"the CPU build's profile")
    for r in accel_rows:
        r["cpu_build_ms"] = cpu_ms[r["node"]]
    accel_layers_ms = sum(r["accel_ms"] for r in accel_rows)
    cpu_layers_ms = sum(r["cpu_build_ms"] for r in accel_rows)
    table = format_table(rows, summary)
    print(table)
    print(f"compile: {build_s_cold:.2f} s cold, {build_s_warm:.2f} s warm; simulation: "
          f"{wall_s:.2f} s cold (first run), {sim_wall_s_warm:.2f} s warm; latency "
          f"{latency_ms_cold:.2f} ms cold, {summary['latency_ms']:.2f} ms warm (the table)")
    return {
        "metrics": {
            "wall_s": wall_s,
            "sim_wall_s_warm": sim_wall_s_warm,
            "build_s_cold": build_s_cold,
            "build_s_warm": build_s_warm,
            "latency_ms": summary["latency_ms"],
            "latency_ms_cold": latency_ms_cold,
            "accel_ms": summary["accel_ms"],
            "cpu_ms": summary["cpu_ms"] + summary["layout_ms"],
            "utilization": summary["utilization"],
            "padding_overhead": summary["padding_overhead"],
            "accel_speedup_vs_cpu": cpu_layers_ms / accel_layers_ms,
        },
        "image_size": size,
        "config": cfg.to_dict(),
        "timed_run": "warm: latency, shares and the table are the second run's",
        "accel_share": summary["accel_share"],
        "macs": summary["macs"],
        "gemm_macs": summary["gemm_macs"],
        "cycles": summary["cycles"],
        "accel_layers_ms": accel_layers_ms,
        "cpu_build_same_layers_ms": cpu_layers_ms,
        "bit_exact_vs_cpu_build": same,
        "layers": rows,
        "table": table,
    }
