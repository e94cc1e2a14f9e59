"""`celosia bench fpga`: the RTL on FPGAs with open tools, and what its pipeline costs.

- Place and route (yowasp Yosys + nextpnr-ecp5, speed grade 8, 100 MHz target, one thread)
  of the small preset and the ``ecp5`` preset on the LFE5U-85F: Fmax and resources.
- Yosys synthesis of the default preset for the xc7z020 (PYNQ-Z1): whether it fits, its
  resources and logic depth.
- The cycles of ResNet-18's ten conv layers (resnet18-layers' shapes, schedules chosen
  with virtual threads on the default core) on the cycle model with the pipelined RTL's
  timing and with the timing of the RTL before it was pipelined (Timing.unpipelined, whose
  counts equal the earlier cycle model's on these schedules).

Synthesis takes tens of minutes per run (place and route of the ecp5 preset the longest),
so each report is cached under ``out/fpga-bench/`` (``$CELOSIA_FPGA_BENCH_CACHE``), keyed on
the exported Verilog, the part, the speed grade, the target clock and the tool versions: a
run reuses a report whose design and tools have not changed (``"cached": true`` in its
details) and synthesises the rest, one tool at a time, each with a time limit.
``--quick`` measures three of the layers (the synthesis runs are the same).

Metrics: small_ecp5_fmax_mhz, ecp5_preset_fmax_mhz, default_xc7z020_fits (1 or 0), their
resources (_lut, _ff, _bram or _bram36, _dsp, and _logic_depth for the xc7z020),
resnet18_conv_cycles_before / _after and resnet18_conv_cycle_ratio (after / before).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from celosia.config import HwConfig
from celosia.errors import CelosiaError

# (metric prefix, preset, part)
RUNS = [("small_ecp5", "small", "lfe5u-85f"), ("ecp5_preset", "ecp5", "lfe5u-85f"),
        ("default_xc7z020", "default", "xc7z020")]
TOOL_TIME_LIMIT = 3600.0
SPEED = 8


def cache_dir() -> Path:
    return Path(os.environ.get("CELOSIA_FPGA_BENCH_CACHE", "out/fpga-bench"))


def cache_key(cfg: HwConfig, part_name: str, speed: int = SPEED) -> str:
    """What a synthesis report depends on: the Verilog the flow exports for ``cfg`` and the
    part, the part, speed grade, target clock and the tool wheels' versions."""
    from celosia.fpga.synth import part, tool_versions, verilog_digest

    p = part(part_name)
    digest = hashlib.sha256(bytes.fromhex(verilog_digest(cfg, p.gemm_products)))
    digest.update(json.dumps({"part": p.name, "speed": speed, "clock": cfg.clock_mhz,
                              "tools": tool_versions()}, sort_keys=True).encode())
    return digest.hexdigest()[:20]


def cache_path(prefix: str, cfg: HwConfig, part_name: str) -> Path:
    return cache_dir() / f"{prefix}-{cache_key(cfg, part_name)}.json"


def kept_result(cfg: HwConfig, part_name: str, results: Path | None = None) -> dict | None:
    """A report of (cfg, part) among the kept results (fpga/results/*.json, written by
    ``celosia fpga synth --out``) made from the same Verilog, with the same tools, speed
    grade, target clock and nextpnr's default seed, or None. Its ``source`` names the file."""
    from celosia.fpga.clock import RESULTS
    from celosia.fpga.synth import part, tool_versions, verilog_digest

    p = part(part_name)
    want = {"verilog_sha256": verilog_digest(cfg, p.gemm_products), "tools": tool_versions()}
    for path in sorted(Path(results or RESULTS).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        entry = data.get(p.name) if isinstance(data, dict) else None
        if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in want.items()):
            continue
        if p.place_and_route and (entry.get("speed_grade") != SPEED or entry.get("seed")
                                  or entry.get("target_mhz") != cfg.clock_mhz):
            continue
        return {**entry, "source": str(path)}
    return None


def cached_synth(prefix: str, cfg: HwConfig, part_name: str) -> dict:
    """The report of (cfg, part) from the cache or the kept results (kept_result), or
    synthesised (work files kept beside the cache under ``<prefix>/``) and cached."""
    from celosia.fpga.synth import synth

    path = cache_path(prefix, cfg, part_name)
    if path.exists():
        report = json.loads(path.read_text())
        report["cached"] = True
        report.setdefault("source", str(path))
        return report
    kept = kept_result(cfg, part_name)
    if kept is not None:
        kept["cached"] = True
        return kept
    work = cache_dir() / prefix
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report = synth(cfg, part_name, work, speed=SPEED, time_limit=TOOL_TIME_LIMIT)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    path.write_text(json.dumps(report, indent=2) + "\n")
    report["cached"] = False
    return report


def _synth(metrics: dict, details: dict) -> None:
    from celosia.fpga.synth import SynthError, summary

    for prefix, preset, part_name in RUNS:
        try:
            report = cached_synth(prefix, HwConfig.preset(preset), part_name)
        except SynthError as exc:  # recorded, not fatal: the other runs still count
            details[prefix] = {"error": str(exc)}
            print(f"  {prefix}: {exc}", flush=True)
            continue
        details[prefix] = report
        origin = ""
        if report["cached"]:  # where the figure comes from: which design, which file
            origin = (f" (cached: hw/ at {report.get('hw_commit') or 'an unrecorded commit'}, "
                      f"{report.get('source')})")
        print(f"  {prefix}{origin}: {summary(report)}", flush=True)
        for key in ("lut", "ff", "bram", "bram36", "dsp", "logic_depth"):
            if report.get(key) is not None:
                metrics[f"{prefix}_{key}"] = report[key]
        metrics[f"{prefix}_fits"] = int(report["fits"])
        if part_name != "xc7z020":  # place and routed: an Fmax
            metrics[f"{prefix}_fmax_mhz"] = report.get("fmax_mhz")


def _resnet_layers(quick: bool, metrics: dict, details: dict) -> None:
    from celosia.benchmarks.resnet_layers import LAYERS
    from celosia.compiler.accel.ops import ConvSpec, Epilogue
    from celosia.compiler.accel.tune import measure_conv, tune_conv
    from celosia.sim.cycle_timing import Timing

    cfg = HwConfig()
    rows, before, after = [], 0, 0
    for name, hw, cin, cout, k, stride in (LAYERS[-3:] if quick else LAYERS):
        spec = ConvSpec(1, cin, hw, hw, cout, k, k, stride, k // 2, Epilogue(shift=8, relu=True))
        knobs, _ = tune_conv(cfg, spec, vthreads=True)
        old = measure_conv(cfg, spec, knobs, timing=Timing.unpipelined(cfg))
        new = measure_conv(cfg, spec, knobs)
        before += old["cycles"]
        after += new["cycles"]
        rows.append({"layer": name, "knobs": knobs.__dict__, "cycles_before": old["cycles"],
                     "cycles_after": new["cycles"],
                     "pipeline_cycles": new["compute_stall_pipeline_cycles"],
                     "hazard_cycles": new["compute_stall_hazard_cycles"],
                     "ratio": new["cycles"] / old["cycles"]})
        print(f"  {name:<4} cycles {old['cycles']:>9} -> {new['cycles']:>9} "
              f"({new['cycles'] / old['cycles']:.4f})", flush=True)
    metrics.update(resnet18_conv_cycles_before=before, resnet18_conv_cycles_after=after,
                   resnet18_conv_cycle_ratio=after / before)
    details["resnet18_layers"] = rows


def design() -> dict:
    """What the figures are for: the commit of hw/ in this checkout and, per run, the sha256
    of the Verilog it synthesises (every report used, fresh or cached, was made from that
    Verilog: the cache and the kept results are keyed on it)."""
    from celosia.fpga.synth import hw_commit, part, tool_versions, verilog_digest

    return {"hw_commit": hw_commit(), "tools": tool_versions(),
            "verilog_sha256": {prefix: verilog_digest(HwConfig.preset(preset),
                                                      part(part_name).gemm_products)
                               for prefix, preset, part_name in RUNS}}


def run(quick: bool = False) -> dict:
    metrics: dict = {}
    details: dict = {}
    made_from = design()
    print(f"  hw/ at {made_from['hw_commit'] or 'an unknown commit'}", flush=True)
    _resnet_layers(quick, metrics, details)
    _synth(metrics, details)
    for prefix, digest in made_from["verilog_sha256"].items():
        report = details.get(prefix, {})
        # a report made from other Verilog would be a wrong figure, not a stale one
        if "error" not in report and report.get("verilog_sha256") != digest:
            raise CelosiaError(f"fpga bench: the {prefix} report ({report.get('source')}) "
                               f"was made from other Verilog than hw/ exports now; delete "
                               f"it and run again")
    return {"metrics": metrics, "design": made_from, **details, "cache": str(cache_dir()),
            "note": "Fmax after nextpnr-ecp5 place and route (speed grade 8, 100 MHz target, "
                    "one thread, default seed); xc7z020 from Yosys alone; synthesis reports "
                    "reused from the cache when the Verilog and tools are unchanged; "
                    "ResNet-18 cycles on the cycle model, schedules chosen for the pipelined "
                    "core, before = the same schedules under the unpipelined RTL's timing"}
