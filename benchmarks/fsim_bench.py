"""`celosia bench fsim`: how fast the functional simulator runs real workloads.

Two programs written with the driver API at the default configuration: a 256x256x256 int8
GEMM and ResNet-18's 56x56x64 -> 64 3x3 (pad 1) convolution, both with a requantizing ALU
epilogue. The metric is simulated MACs per wall second of `Device.synchronize` (encoding,
DRAM upload and the fsim run), the median of several runs; results are checked against numpy.
"""

from __future__ import annotations

import time

import numpy as np

from celosia.config import HwConfig
from celosia.driver import Device
from celosia.errors import CelosiaError

from .workloads import (conv2d_requant, conv2d_requant_reference, gemm_requant,
                        gemm_requant_reference)


def _measure(build, check, repeats: int) -> tuple[float, int, dict]:
    """Median seconds of synchronize() for the workload ``build(dev)`` records."""
    dev = Device(HwConfig(), target="fsim", dram_size=16 << 20)
    times, macs, stats = [], 0, {}
    for _ in range(repeats):
        workload = build(dev)
        t0 = time.perf_counter()
        stats = dev.synchronize()
        times.append(time.perf_counter() - t0)
        check(workload.result())
        macs = workload.macs
    return float(np.median(times)), macs, stats


def run(quick: bool = False) -> dict:
    rng = np.random.default_rng(0)
    repeats = 3 if quick else 7
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
    return {
        "metrics": {
            "gemm256_gmacs_per_s": gemm_macs / gemm_s / 1e9,
            "conv56_gmacs_per_s": conv_macs / conv_s / 1e9,
            "gemm256_s": gemm_s,
            "conv56_s": conv_s,
        },
        "workloads": {
            "gemm256": {"shape": [size, size, size], "macs": gemm_macs,
                        "median_s": gemm_s, "counters": gemm_stats},
            "conv56": {"input": list(x.shape), "kernel": list(k.shape), "pad": 1,
                       "macs": conv_macs, "median_s": conv_s, "counters": conv_stats},
        },
        "repeats": repeats,
    }
