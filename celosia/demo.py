"""`celosia demo`: the bundled example, a small int8 GEMM with requantization.

It is written with the driver API, runs on the chosen executor, is checked against numpy,
and prints the result and the executor's counters. (The whole-model demo replaces it once
the compiler and the model runtime exist.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .config import HwConfig

M, K, N, SHIFT = 64, 256, 128, 11


def run_demo(*, target: str = "fsim", config: HwConfig | None = None, out_dir: str = "out") -> int:
    from celosia.benchmarks.workloads import gemm_requant, gemm_requant_reference
    from celosia.driver import Device

    config = config or HwConfig()
    rng = np.random.default_rng(2026)
    m = max(M, config.batch)
    a = rng.integers(-128, 128, (m, K), dtype=np.int8)
    w = rng.integers(-128, 128, (N, K), dtype=np.int8)
    print(f"celosia demo: int8 GEMM ({m}x{K}) x ({K}x{N}) -> int32 -> >>{SHIFT} -> clip int8")
    print(f"  target {target}, GEMM core {config.batch}x{config.block}x{config.block}")
    dev = Device(config, target=target)
    workload = gemm_requant(dev, a, w, SHIFT)
    print(f"  {len(dev.instructions)} instructions recorded; running ...")
    t0 = time.perf_counter()
    stats = dev.synchronize()
    wall = time.perf_counter() - t0
    out = workload.result()
    ref = gemm_requant_reference(a, w, SHIFT)
    ok = bool(np.array_equal(out, ref))
    print(f"  result[0, :8] = {out[0, :8].tolist()}")
    print(f"  matches numpy: {'yes, bit-exact' if ok else 'NO'}")
    print(f"  wall time {wall * 1e3:.1f} ms")
    print("  counters:")
    for key, value in stats.items():
        print(f"    {key:<16} {value}")
    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    report = {"workload": {"m": m, "k": K, "n": N, "shift": SHIFT}, "target": target,
              "matches_numpy": ok, "wall_s": wall, "counters": stats,
              "config": config.to_dict()}
    (out_path / "demo.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"  report written to {out_path / 'demo.json'}")
    return 0 if ok else 1
