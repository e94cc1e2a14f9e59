"""`celosia bench fsim`: how fast the functional simulator runs real workloads, cold and warm.

Two programs written with the driver API at the default configuration: a 256x256x256 int8
GEMM and ResNet-18's 56x56x64 -> 64 3x3 (pad 1) convolution, both with a requantizing ALU
epilogue. The metric is simulated MACs per wall second of `Device.synchronize` (encoding,
DRAM upload and the fsim run), the median of several runs of each kind:

- ``_cold``: the program's first run, nothing cached: the simulators' caches and the
  executor's kernels emptied first (``sim.base.clear_caches``), as for a program the process
  has not run before;
- ``_warm``: the program run again on the same device (decoded program and kernels reused).

Cold and warm runs alternate; results are checked against numpy every run.
"""

from __future__ import annotations

import time

import numpy as np

from celosia.config import HwConfig
from celosia.driver import Device
from celosia.errors import CelosiaError

from .workloads import (conv2d_requant, conv2d_requant_reference, gemm_requant,
                        gemm_requant_reference)


def _measure(build, check, repeats: int) -> tuple[dict, int, dict]:
    """Median seconds of synchronize() for the workload ``build(dev)`` records, cold (the
    simulator's caches and kernels emptied first) and warm (the same program again), on a
    device each, alternating."""
    from celosia.sim.base import clear_caches

    devices = {kind: Device(HwConfig(), target="fsim", dram_size=16 << 20)
               for kind in ("cold", "warm")}
    for dev in devices.values():  # a first run each: not a sample
        check(_synchronized(dev, build)[1])
    times: dict = {"cold": [], "warm": []}
    macs, stats = 0, {}
    for k in range(repeats):
        for kind in (("cold", "warm") if k % 2 == 0 else ("warm", "cold")):
            dev = devices[kind]
            seconds, out, stats, macs = _synchronized(
                dev, build, timed=True, before=(lambda: clear_caches(dev.executor))
                if kind == "cold" else None)
            times[kind].append(seconds)
            check(out)
    return {kind: float(np.median(v)) for kind, v in times.items()}, macs, stats


def _synchronized(dev, build, *, timed: bool = False, before=None):
    """Record the workload on ``dev``, call ``before`` and run it: (seconds, result,
    counters, MACs), or (counters, result) untimed."""
    workload = build(dev)
    if before is not None:
        before()
    t0 = time.perf_counter()
    stats = dev.synchronize()
    seconds = time.perf_counter() - t0
    out = workload.result()
    return (seconds, out, stats, workload.macs) if timed else (stats, out)


def run(quick: bool = False) -> dict:
    rng = np.random.default_rng(0)
    repeats = 3 if quick else 15
    size = 64 if quick else 256
    a = rng.integers(-128, 128, (size, size), dtype=np.int8)
    w = rng.integers(-128, 128, (size, size), dtype=np.int8)

    def gemm(dev):
        return gemm_requant(dev, a, w, 8)

    def check_gemm(out):
        if not np.array_equal(out, gemm_requant_reference(a, w, 8)):
            raise CelosiaError("fsim bench: GEMM result differs from numpy")

    hw = 14 if quick else 56
    x = rng.integers(-128, 128, (1, 64, hw, hw), dtype=np.int8)
    k = rng.integers(-128, 128, (64, 64, 3, 3), dtype=np.int8)

    def conv(dev):
        return conv2d_requant(dev, x, k, 1, 10)

    def check_conv(out):
        if not np.array_equal(out, conv2d_requant_reference(x, k, 1, 10)):
            raise CelosiaError("fsim bench: conv2d result differs from numpy")

    gemm_s, gemm_macs, gemm_stats = _measure(gemm, check_gemm, repeats)
    conv_s, conv_macs, conv_stats = _measure(conv, check_conv, repeats)
    metrics = {}
    for kind in ("cold", "warm"):
        metrics[f"gemm256_gmacs_per_s_{kind}"] = gemm_macs / gemm_s[kind] / 1e9
        metrics[f"conv56_gmacs_per_s_{kind}"] = conv_macs / conv_s[kind] / 1e9
    for kind in ("cold", "warm"):
        metrics[f"gemm256_s_{kind}"] = gemm_s[kind]
        metrics[f"conv56_s_{kind}"] = conv_s[kind]
    return {
        "metrics": metrics,
        "workloads": {
            "gemm256": {"shape": [size, size, size], "macs": gemm_macs,
                        "median_s": gemm_s, "counters": gemm_stats},
            "conv56": {"input": list(x.shape), "kernel": list(k.shape), "pad": 1,
                       "macs": conv_macs, "median_s": conv_s, "counters": conv_stats},
        },
        "repeats": repeats,
        "samples": {"cold": repeats, "warm": repeats},
    }
