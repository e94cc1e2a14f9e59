"""`celosia bench rtl`: how fast the RTL simulates (Verilator), and how long a build takes.

``cycles_per_s``: simulated cycles per wall second of ``executor.run`` (DRAM upload included,
build excluded) on the cycle benchmark's programs at the default configuration (a
256x256x256 GEMM and ResNet-18's 56x56x64 -> 64 3x3 convolution), the median of several
runs per program, over both programs. ``build_s``: a cold build (Amaranth elaboration,
Verilog, Verilator, C++ compile and link) of the default configuration (the small preset
when ``quick``) into a temporary cache directory, so the user's cache is neither used nor
touched.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from celosia.config import HwConfig
from celosia.sim.base import make_executor

from .cycle_bench import time_run, workload_images

__all__ = ["run"]


def cold_build_seconds(cfg: HwConfig) -> float:
    from celosia.sim.rtl import build_library

    old = os.environ.get("CELOSIA_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CELOSIA_CACHE"] = tmp
        try:
            t0 = time.perf_counter()
            build_library(cfg)
            return time.perf_counter() - t0
        finally:
            if old is None:
                os.environ.pop("CELOSIA_CACHE", None)
            else:
                os.environ["CELOSIA_CACHE"] = old


def run(quick: bool = False) -> dict:
    cfg = HwConfig()
    repeats = 3 if quick else 5
    metrics: dict = {}
    details: dict = {}
    total_cycles, total_s = 0, 0.0
    for name, image in workload_images(cfg, quick).items():
        ex = make_executor("rtl", cfg, image.dram.size)  # builds (or loads) first
        times, cycles = [], 0
        for _ in range(repeats):
            seconds, stats = time_run(ex, image)
            times.append(seconds)
            cycles = stats["cycles"]
        med = float(np.median(times))
        metrics[f"{name}_cycles_per_s"] = cycles / med
        details[name] = {"insns": image.insn_count, "cycles": cycles, "median_s": med,
                         "runs_s": times}
        total_cycles += cycles
        total_s += med
    build_cfg = HwConfig.preset("small") if quick else cfg
    build_s = cold_build_seconds(build_cfg)
    metrics = {"cycles_per_s": total_cycles / total_s, "build_s": build_s, **metrics}
    return {"metrics": metrics, "workloads": details, "repeats": repeats,
            "build_config": "small" if quick else "default"}
