"""The `celosia` command line: exec, disasm, config, bench, demo, verilog."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import CelosiaError

__all__ = ["main"]


def _config(spec):
    from .config import HwConfig

    return HwConfig.load(spec)


def _write_json(path: str | Path, data: dict) -> None:
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


# ---- subcommands ---------------------------------------------------------------------------


def cmd_exec(args) -> int:
    import numpy as np

    from .image import ProgramImage
    from .sim.base import make_executor

    cfg = _config(args.config)
    image = ProgramImage.load(args.image)
    options = {}
    if args.target == "fsim" and (args.max_cycles is not None or args.trace):
        raise CelosiaError("--max-cycles and --trace apply to the timed targets (cycle, rtl), "
                           "not fsim")
    if args.timeline and args.target != "cycle":
        raise CelosiaError("--timeline is drawn by the cycle model: use --target cycle")
    if args.max_cycles is not None:
        options["max_cycles"] = args.max_cycles
    if args.trace:
        options["trace"] = args.trace
    executor = make_executor(args.target, cfg, image.dram.size, **options)
    executor.write_dram(0, image.dram)
    stats = executor.run(image.insn_addr, image.insn_count)
    dram = executor.read_dram(0, image.dram.size)
    if args.timeline:
        from .sim.cycle import plot_timeline
        plot_timeline(executor, args.timeline)
    np.savez_compressed(args.out, dram=dram)
    stats = {"target": args.target, **stats}
    if args.stats:
        _write_json(args.stats, stats)
    if not args.quiet:
        shown = ", ".join(f"{k}={v}" for k, v in stats.items()
                          if k in ("cycles", "insn_count", "gemm_uops", "alu_uops", "macs"))
        print(f"{args.image}: ran on {args.target}: {shown}; DRAM written to {args.out}")
    return 0


def cmd_disasm(args) -> int:
    from .image import ProgramImage
    from .isa import decode_program, disassemble

    cfg = _config(args.config)
    image = ProgramImage.load(args.image)
    print(disassemble(decode_program(image.program_bytes, cfg)))
    return 0


def cmd_config(args) -> int:
    cfg = _config(args.config)
    if args.format == "json":
        print(cfg.to_json())
    elif args.format == "vta":
        print(json.dumps(cfg.to_vta_dict(), indent=2))
    else:
        print(cfg.describe())
    return 0


def cmd_bench(args) -> int:
    from .benchmarks import BENCHMARKS, run_benchmark

    if args.list or not args.name:
        for name, (_, _, summary) in BENCHMARKS.items():
            print(name if args.names else f"{name:<18} {summary}")
        return 0
    result = run_benchmark(args.name, quick=args.quick)
    if args.out:
        _write_json(args.out, result)
    width = max(len(k) for k in result["metrics"]) if result["metrics"] else 0
    for key, value in result["metrics"].items():
        print(f"{key:<{width}}  {value:.6g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(target=args.target, config=_config(args.config), out_dir=args.out_dir)


def cmd_verilog(args) -> int:
    try:
        from celosia.hw.export import verilog_text
    except ModuleNotFoundError as exc:
        raise CelosiaError(f"Verilog export needs {exc.name}, which celosia installs; "
                           f"reinstall celosia (pip install celosia)") from None
    cfg = _config(args.config)
    text = verilog_text(cfg)
    Path(args.output).write_text(text)
    print(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


# ---- parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="celosia", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def config_option(p):
        p.add_argument("--config", metavar="CFG",
                       help="a preset name (default, small) or a JSON file (celosia's or VTA's "
                            "vta_config.json format); the default configuration if omitted")

    p = sub.add_parser("exec", help="run a program image on an executor")
    p.add_argument("image", help="program image (.npz with dram, insn_addr, insn_count)")
    p.add_argument("--target", default="fsim", choices=["fsim", "cycle", "rtl"])
    config_option(p)
    p.add_argument("--out", required=True, help="where to write the final DRAM (.npz, key dram)")
    p.add_argument("--stats", help="where to write the counters (JSON)")
    p.add_argument("--max-cycles", type=int, help="cycle limit for timed targets")
    p.add_argument("--trace", help="timed targets: write a trace (cycle: Perfetto JSON; rtl: FST)")
    p.add_argument("--timeline", help="cycle target: draw a PNG timeline of the modules")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_exec)

    p = sub.add_parser("disasm", help="print a program image's instructions, one per line")
    p.add_argument("image")
    config_option(p)
    p.set_defaults(func=cmd_disasm)

    p = sub.add_parser("config", help="show a hardware configuration")
    p.add_argument("action", choices=["show"])
    config_option(p)
    p.add_argument("--format", choices=["text", "json", "vta"], default="text",
                   help="text summary, celosia's JSON, or VTA's vta_config.json keys")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("bench", help="run a benchmark and write its metrics")
    p.add_argument("name", nargs="?")
    p.add_argument("--list", action="store_true", help="list the benchmarks")
    p.add_argument("--names", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help="write the result (metrics + machine) as JSON")
    p.add_argument("--quick", action="store_true", help="smaller problem sizes (smoke test)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="the main job: run the bundled example and show its result")
    p.add_argument("--target", default="fsim", choices=["fsim", "cycle", "rtl"])
    config_option(p)
    p.add_argument("--out-dir", default="out", help="where to write the demo's files")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("verilog", help="write the accelerator as one Verilog file")
    config_option(p)
    p.add_argument("-o", "--output", default="accel.v")
    p.set_defaults(func=cmd_verilog)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CelosiaError as exc:
        print(f"celosia {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("celosia: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
