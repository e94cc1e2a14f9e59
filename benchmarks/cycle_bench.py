"""`celosia bench cycle`: how fast the cycle model runs, against fsim and the RTL, cold and warm.

The programs are the fsim benchmark's (benchmarks/fsim_bench.py), written with the driver API
at the default configuration: a 256x256x256 int8 GEMM and ResNet-18's 56x56x64 -> 64 3x3
(pad 1) convolution, both with a requantizing epilogue. Each program image is run on fsim,
the cycle model and the RTL (Verilator, build excluded) in the same process, and the wall
time of ``executor.run`` (DRAM upload included) is kept per target, two ways:

- **cold**: the first run of the program, nothing cached: the simulators' caches and the
  executor's kernels are emptied first (``sim.base.clear_caches``: decoded programs, the
  cycle model's plans and fetch batches, datapath kernels), as for a program the process
  has not run before (the executor exists, as the RTL's does);
- **warm**: a repeated run of the program on the same executor (decoding, kernels and
  plans reused).

The RTL keeps nothing between runs (it simulates every cycle every time): its runs, the
first included, are one sample. Per repetition, fsim and the cycle model run FAST_RUNS
times cold and FAST_RUNS times warm each, interleaved and each first in turn, and the RTL
once, first or last in turn; medians (and interquartile ranges) over all samples
(``samples`` gives their counts).

Metrics, each ``_cold`` and ``_warm``: ``speedup_vs_rtl`` (RTL wall time / cycle-model wall
time; the smaller over the two programs; goal cold >= 100), ``time_ratio_vs_fsim``
(cycle-model wall time / fsim wall time, the same kind of run; the larger; goal cold <=
1.3), ``cycles_per_s`` (simulated cycles per wall second of the cycle model over both
programs), and the same three per program. The cycle counts of the cycle model and the
RTL must agree (the benchmark fails otherwise) and are reported.
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

# fsim and the cycle model run this many times cold and warm for each RTL run: a run of a
# few milliseconds is often preempted on a shared machine (a scheduler slice is longer than
# the run), so their medians need more samples than the RTL's, whose runs are long enough
# to average out.
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
    worst = {"cold": [float("inf"), 0.0], "warm": [float("inf"), 0.0]}  # speedup, ratio
    total_cycles, total_s = 0, {"cold": 0.0, "warm": 0.0}
    for name, image in workload_images(cfg, quick).items():
        times, cycles = _measure(cfg, name, image, repeats)
        med = {key: float(np.median(v)) for key, v in times.items()}
        for kind in ("cold", "warm"):
            speedup = med["rtl"] / med[f"cycle_{kind}"]
            ratio = med[f"cycle_{kind}"] / med[f"fsim_{kind}"]
            metrics[f"{name}_speedup_vs_rtl_{kind}"] = speedup
            metrics[f"{name}_time_ratio_vs_fsim_{kind}"] = ratio
            metrics[f"{name}_cycles_per_s_{kind}"] = cycles / med[f"cycle_{kind}"]
            worst[kind] = [min(worst[kind][0], speedup), max(worst[kind][1], ratio)]
            total_s[kind] += med[f"cycle_{kind}"]
        details[name] = {"insns": image.insn_count, "cycles": cycles, "median_s": med,
                         "iqr_s": {key: _iqr(v) for key, v in times.items()},
                         "runs_s": times}
        total_cycles += cycles
    head = {}
    for kind in ("cold", "warm"):
        head[f"speedup_vs_rtl_{kind}"] = worst[kind][0]
        head[f"time_ratio_vs_fsim_{kind}"] = worst[kind][1]
        head[f"cycles_per_s_{kind}"] = total_cycles / total_s[kind]
    return {"metrics": {**head, **metrics}, "workloads": details, "repeats": repeats,
            "samples": {"rtl": repeats, **{f"{t}_{kind}": repeats * FAST_RUNS
                                           for t in ("fsim", "cycle")
                                           for kind in ("cold", "warm")}},
            "config": "default", "cycles_equal_rtl": True}


def _measure(cfg: HwConfig, name: str, image: ProgramImage, repeats: int) -> tuple[dict, int]:
    """Wall seconds per kind of run (rtl, fsim_cold, cycle_cold, fsim_warm, cycle_warm) and
    the program's cycle count, checked equal on the cycle model and the RTL."""
    from celosia.sim.base import clear_caches

    rtl = make_executor("rtl", cfg, image.dram.size)
    warm = {t: make_executor(t, cfg, image.dram.size) for t in ("fsim", "cycle")}
    cold = {t: make_executor(t, cfg, image.dram.size) for t in ("fsim", "cycle")}
    for ex in (*warm.values(), *cold.values()):  # a first run each: not a sample
        time_run(ex, image)
    times: dict = {k: [] for k in ("rtl", "fsim_cold", "cycle_cold", "fsim_warm",
                                   "cycle_warm")}
    counts: dict = {}
    for k in range(repeats):
        # fsim and the cycle model alternate, each first in turn, so that they see the
        # same machine; the RTL runs first or last in turn
        pair = ["fsim", "cycle"] if (k // 2) % 2 == 0 else ["cycle", "fsim"]
        fast = []
        for i in range(FAST_RUNS):
            order = pair if i % 2 == 0 else pair[::-1]
            fast += [(t, "cold") for t in order] + [(t, "warm") for t in order]
        for target, kind in ([("rtl", "")] + fast if k % 2 == 0 else fast + [("rtl", "")]):
            if target == "rtl":
                seconds, stats = time_run(rtl, image)
                times["rtl"].append(seconds)
            elif kind == "cold":
                clear_caches(cold[target])
                seconds, stats = time_run(cold[target], image)
                times[f"{target}_cold"].append(seconds)
            else:
                seconds, stats = time_run(warm[target], image)
                times[f"{target}_warm"].append(seconds)
            if target != "fsim":
                counts.setdefault(target, set()).add(stats.get("cycles"))
    if len(counts["cycle"]) != 1 or counts["cycle"] != counts["rtl"]:
        raise CelosiaError(f"cycle bench: {name}: the cycle model counts {sorted(counts['cycle'])} "
                           f"cycles, the RTL {sorted(counts['rtl'])}")
    return times, counts["rtl"].pop()


def _iqr(values: list) -> float:
    """The interquartile range of samples."""
    q1, q3 = np.percentile(values, [25, 75])
    return float(q3 - q1)
