"""`celosia bench cycle`: how fast the cycle model runs, against fsim and the RTL.

The programs are the fsim benchmark's (benchmarks/fsim_bench.py), written with the driver API
at the default configuration: a 256x256x256 int8 GEMM and ResNet-18's 56x56x64 -> 64 3x3
(pad 1) convolution, both with a requantizing epilogue. Each program image is run on fsim,
the cycle model and the RTL (Verilator, build excluded) in the same process, alternating
(fsim and the cycle model FAST_RUNS times each, interleaved, for each RTL run), and the
median wall time of ``executor.run`` (DRAM upload included) is kept per target.

Metrics: ``speedup_vs_rtl`` (RTL wall time / cycle-model wall time; the smaller over the two
programs), ``time_ratio_vs_fsim`` (cycle-model wall time / fsim wall time; the larger),
``cycles_per_s`` (simulated cycles per wall second of the cycle model over both programs),
and the same three per program. The cycle counts of the cycle model and the RTL must agree
(the benchmark fails otherwise) and are reported.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError
from celosia.image import ProgramImage
from celosia.sim.base import make_executor

from .workloads import conv2d_requant, gemm_requant

__all__ = ["run", "workload_images", "time_run"]

# fsim and the cycle model run this many times for each RTL run: a run of a few milliseconds
# is often preempted on a shared machine (a scheduler slice is longer than the run), so
# their medians need more samples than the RTL's, whose runs are long enough to average out.
FAST_RUNS = 5


def workload_images(cfg: HwConfig, quick: bool) -> dict[str, ProgramImage]:
    """The GEMM and conv2d program images of the fsim benchmark (smaller when ``quick``)."""
    from celosia.driver import Device

    rng = np.random.default_rng(0)
    size = 64 if quick else 256
    hw = 16 if quick else 56
    a = rng.integers(-128, 128, (size, size), dtype=np.int8)
    w = rng.integers(-128, 128, (size, size), dtype=np.int8)
    x = rng.integers(-128, 128, (1, 64, hw, hw), dtype=np.int8)
    k = rng.integers(-128, 128, (64, 64, 3, 3), dtype=np.int8)
    images = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, record in ((f"gemm{size}", lambda dev: gemm_requant(dev, a, w, 8)),
                             (f"conv{hw}", lambda dev: conv2d_requant(dev, x, k, 1, 10))):
            dev = Device(cfg, target="fsim", dram_size=16 << 20)
            record(dev)
            images[name] = dev.save_image(Path(tmp) / f"{name}.npz")
    return images


def time_run(executor, image: ProgramImage) -> tuple[float, dict]:
    """Wall seconds of uploading ``image`` and running it on ``executor``; its counters."""
    t0 = time.perf_counter()
    executor.write_dram(0, image.dram)
    stats = executor.run(image.insn_addr, image.insn_count)
    return time.perf_counter() - t0, stats


def run(quick: bool = False) -> dict:
    cfg = HwConfig()
    repeats = 3 if quick else 7
    metrics: dict = {}
    details: dict = {}
    worst_speedup, worst_ratio, total_cycles, total_s = float("inf"), 0.0, 0, 0.0
    for name, image in workload_images(cfg, quick).items():
        executors = {t: make_executor(t, cfg, image.dram.size) for t in ("fsim", "cycle", "rtl")}
        times: dict = {t: [] for t in executors}
        counts = {}
        for k in range(repeats):
            # fsim and the cycle model alternate, each first in turn, so that they see the
            # same machine; the RTL runs first or last in turn, and the run right after it
            # is fsim's or the cycle model's in turn
            fast = []
            for i in range(FAST_RUNS):
                fast += ["fsim", "cycle"] if (k // 2 + i) % 2 == 0 else ["cycle", "fsim"]
            for target in (["rtl"] + fast if k % 2 == 0 else fast + ["rtl"]):
                seconds, stats = time_run(executors[target], image)
                times[target].append(seconds)
                counts[target] = stats.get("cycles")
        if counts["cycle"] != counts["rtl"]:
            raise CelosiaError(f"cycle bench: {name}: the cycle model counts {counts['cycle']} "
                               f"cycles, the RTL {counts['rtl']}")
        med = {t: float(np.median(v)) for t, v in times.items()}
        speedup = med["rtl"] / med["cycle"]
        ratio = med["cycle"] / med["fsim"]
        cycles = counts["rtl"]
        metrics[f"{name}_speedup_vs_rtl"] = speedup
        metrics[f"{name}_time_ratio_vs_fsim"] = ratio
        metrics[f"{name}_cycles_per_s"] = cycles / med["cycle"]
        details[name] = {"insns": image.insn_count, "cycles": cycles,
                         "median_s": med, "runs_s": times}
        worst_speedup = min(worst_speedup, speedup)
        worst_ratio = max(worst_ratio, ratio)
        total_cycles += cycles
        total_s += med["cycle"]
    metrics = {"speedup_vs_rtl": worst_speedup, "time_ratio_vs_fsim": worst_ratio,
               "cycles_per_s": total_cycles / total_s, **metrics}
    return {"metrics": metrics, "workloads": details, "repeats": repeats,
            "fsim_cycle_runs": repeats * FAST_RUNS,
            "config": "default", "cycles_equal_rtl": True}
