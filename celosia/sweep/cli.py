"""`celosia sweep SPEC.toml --out DIR [--engine local|ray] [--address ADDR] [--workers N]
[--resume] [--limit N] [--synth] [--rtl-sample N]`."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="the sweep spec (TOML; docs/sweep.md)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="results directory: rows, caches, results.parquet, summary.json, "
                        "pareto.png, report.md")
    p.add_argument("--engine", default="local", choices=["local", "ray"],
                   help="local worker processes (default) or Ray tasks")
    p.add_argument("--address", metavar="ADDR",
                   help="ray: join this cluster (auto: the running one); without it a local "
                        "Ray cluster of --workers CPUs is started and stopped")
    p.add_argument("--workers", type=int, metavar="N",
                   help="points evaluated at once (default: the machine's cores)")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in DIR: points already there are skipped")
    p.add_argument("--limit", type=int, metavar="N",
                   help="evaluate at most N points in this run (--resume does the rest)")
    p.add_argument("--synth", action="store_true",
                   help="resources from Yosys synthesis (fpga/synth.py; minutes per "
                        "configuration, cached in DIR) instead of the analytic estimate")
    p.add_argument("--rtl-sample", type=int, default=0, metavar="N",
                   help="also run the first N layer points on the RTL (Verilator, built once "
                        "per configuration): their cycles must equal the cycle model's")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")


def command(args) -> int:
    from .run import run_sweep
    from .spec import load_spec

    spec = load_spec(args.spec)  # every error of the spec before any work
    summary = run_sweep(spec, args.out, engine=args.engine, address=args.address,
                        workers=args.workers, resume=args.resume, limit=args.limit,
                        synth=args.synth, rtl_sample=args.rtl_sample,
                        progress=not args.quiet)
    run = summary["this_run"]
    status = ", ".join(f"{k} {v}" for k, v in sorted(summary["status"].items()))
    rate = f", {run['points_per_hour']:.0f} points/h" if run["points_per_hour"] else ""
    print(f"sweep: {run['evaluated']} points evaluated in {run['points_s']:.1f} s{rate} "
          f"({run['skipped_done']} already done); {summary['points']} rows ({status}); "
          f"Pareto front {len(summary['pareto_front'])} of "
          f"{summary['feasible_configurations']} feasible configurations; wrote "
          f"{args.out}/results.parquet, summary.json, pareto.png, report.md")
    missing = len(spec.configs()) * len(spec.workloads) - summary["points"]
    if missing > 0:
        print(f"sweep: {missing} points not evaluated yet (--limit): run again with --resume",
              file=sys.stderr)
    return 0
