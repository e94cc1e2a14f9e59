"""`celosia sweep`: design-space exploration over hardware configurations and workloads on
the cycle model, on this machine or a Ray cluster (docs/sweep.md).

    spec.py       the TOML spec: space, workloads, objectives, constraints, search
    workloads.py  what a workload is and how a point evaluates it (compile, cycle model)
    resources.py  LUT/FF/BRAM/DSP: the analytic estimate, or a synthesis report
    task.py       one point (the function every engine runs) and one synthesis
    engines.py    local worker processes and Ray tasks
    results.py    DIR: rows, caches, results.parquet, summary.json, pareto.png, report.md
    run.py        the driver (run_sweep)
    cli.py        the command line
"""

from .run import run_sweep
from .spec import Spec, SpecError, load_spec, parse_spec

__all__ = ["run_sweep", "Spec", "SpecError", "load_spec", "parse_spec"]
