"""`celosia bench resnet18-layers`: ResNet-18's convolution layers on the cycle model.

The ten layers of VTA's conv2d benchmark (C2-C11), each compiled by the tensor compiler
with knobs chosen by the schedule search (compiler/tune.py), once among single-threaded
schedules and once with virtual threads allowed, run on the cycle model at the default
configuration with a requantizing ReLU epilogue (>> 8, clip to [0, 127]) on the ALU. Each
chosen schedule is also checked bit-exact against numpy. Metrics: MAC-weighted mean
utilisation (the layer's own multiply-adds over cycles x MACs per cycle,
compiler/graph/macs.py; these layers' channels are multiples of BLOCK, so their padding
overhead, reported per layer, is 0) with and without virtual threads (0..1). docs/compiler.md has each layer's bound
(the ALU epilogue and GEMM reset cost 4 compute cycles per output row) and what is left.
"""

from __future__ import annotations

import time

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError

# (H = W, Cin, Cout, kernel, stride); padding keeps "same" size (kernel // 2).
LAYERS = [
    ("C2", 56, 64, 64, 3, 1), ("C3", 56, 64, 128, 3, 2), ("C4", 56, 64, 128, 1, 2),
    ("C5", 28, 128, 128, 3, 1), ("C6", 28, 128, 256, 3, 2), ("C7", 28, 128, 256, 1, 2),
    ("C8", 14, 256, 256, 3, 1), ("C9", 14, 256, 512, 3, 2), ("C10", 14, 256, 512, 1, 2),
    ("C11", 7, 512, 512, 3, 1),
]


def run(quick: bool = False) -> dict:
    from celosia.compiler.accel.ops import ConvSpec, Epilogue
    from celosia.compiler.accel.tune import tune_conv
    from celosia.compiler.graph.macs import padding_overhead, utilization

    cfg = HwConfig()
    layers = LAYERS[-3:] if quick else LAYERS
    rows, totals = [], {True: [0.0, 0], False: [0.0, 0]}
    for name, hw, cin, cout, k, stride in layers:
        spec = ConvSpec(1, cin, hw, hw, cout, k, k, stride, k // 2, Epilogue(shift=8, relu=True))
        row = {"layer": name, "shape": f"{hw}x{hw}x{cin}->{cout} {k}x{k} s{stride}", "macs": spec.macs}
        for vthreads in (False, True):
            t0 = time.perf_counter()
            knobs, stats = tune_conv(cfg, spec, vthreads=vthreads)
            _check(cfg, spec, knobs)
            tag = "vthreads" if vthreads else "no_vthreads"
            row[f"cycles_{tag}"] = stats["cycles"]
            row[f"utilization_{tag}"] = utilization(spec.macs, stats["cycles"],
                                                    cfg.macs_per_cycle)
            row[f"padding_overhead_{tag}"] = padding_overhead(stats["macs"], spec.macs)
            row[f"knobs_{tag}"] = knobs.__dict__
            row[f"search_s_{tag}"] = time.perf_counter() - t0
            totals[vthreads][0] += row[f"utilization_{tag}"] * spec.macs
            totals[vthreads][1] += spec.macs
        print(f"  {name:<4} {row['shape']:<26} cycles {row['cycles_no_vthreads']:>9} -> "
              f"{row['cycles_vthreads']:>9}  utilisation {row['utilization_no_vthreads']:.3f} -> "
              f"{row['utilization_vthreads']:.3f}", flush=True)
        rows.append(row)
    return {
        "metrics": {
            "utilization_vthreads": totals[True][0] / totals[True][1],
            "utilization_no_vthreads": totals[False][0] / totals[False][1],
        },
        "layers": rows,
        "config": cfg.to_dict(),
        "note": "cycle model timing; utilisation = the layer's own MACs / (cycles x 256); "
                "padding_overhead = the GEMM core's MACs / the layer's - 1 (0: channels are "
                "multiples of BLOCK)",
    }


def _check(cfg, spec, knobs) -> None:
    """The chosen schedule computes the layer bit-exactly (on fsim)."""
    from celosia.compiler.accel.ops import conv2d, conv2d_reference, pack_nchw, pack_oihw, unpack_nchw
    from celosia.driver import Device

    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    out = np.zeros((1, spec.o // cfg.block, spec.oh, spec.ow, 1, cfg.block), np.int8)
    conv2d(cfg, spec, knobs)(Device(cfg, dram_size=16 << 20), pack_nchw(x, 1, cfg.block),
                             pack_oihw(w, cfg.block), out)
    if not np.array_equal(unpack_nchw(out), conv2d_reference(x, w, spec)):
        raise CelosiaError(f"resnet18-layers: {spec} with {knobs} differs from numpy")
