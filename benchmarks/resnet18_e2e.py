"""`celosia bench resnet18-e2e`: ResNet-18 at 224x224, int8, split between the accelerator
(cycle model, default configuration) and the CPU, end to end.

The model (models/zoo.py, random weights) is quantized from a few random calibration
images, partitioned and compiled (schedule search on the cycle model, cached on disk), then
one image runs through the whole model on the cycle model. Figures:

- ``wall_s``: wall time of the first simulated run (the goal is at most 30 s on two cores);
- ``latency_ms``: the model's latency, accelerator time at the configured clock plus the
  measured CPU time of the CPU nodes and of packing/unpacking at region borders, from a
  second run (the first pays one-time costs such as starting the CPU worker threads);
  ``accel_ms`` and ``cpu_ms`` (CPU nodes plus layout) are its two shares;
- ``accel_speedup_vs_cpu``: the accelerated layers' time on celosia's fp32 CPU build (LLVM,
  all cores of this machine, median of several runs) over their accelerator time.

The int8 result is also checked bit for bit against the all-CPU build of the same
quantized graph. The JSON holds the per-layer table.
"""

from __future__ import annotations

import time

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError


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

    t0 = time.perf_counter()
    model = AccelModel.from_onnx(data, cfg, calibration=calib, target="cycle",
                                 progress=lambda line: print(line, flush=True))
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.run(x, target="cycle")
    wall_s = time.perf_counter() - t0  # the first run: DRAM image loaded, nothing warm
    out = model.run(x, target="cycle")  # the figures: a second run (CPU parts warm)
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
    return {
        "metrics": {
            "wall_s": wall_s,
            "latency_ms": summary["latency_ms"],
            "accel_ms": summary["accel_ms"],
            "cpu_ms": summary["cpu_ms"] + summary["layout_ms"],
            "accel_speedup_vs_cpu": cpu_layers_ms / accel_layers_ms,
        },
        "image_size": size,
        "config": cfg.to_dict(),
        "build_s": build_s,
        "accel_share": summary["accel_share"],
        "utilization": summary["utilization"],
        "cycles": summary["cycles"],
        "accel_layers_ms": accel_layers_ms,
        "cpu_build_same_layers_ms": cpu_layers_ms,
        "bit_exact_vs_cpu_build": same,
        "layers": rows,
        "table": table,
    }
