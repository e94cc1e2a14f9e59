"""Runs fuzz cases of test_fuzz_cel.py in one process (start-up would dominate otherwise).

    python cel_driver.py JOBS.json

Each job is ``{"id", "argv"}`` (a ``celosia`` command line, run through
``celosia.cli.main`` as the console script runs it) or ``{"id", "load"}`` (only load a
.cel). Before a job the driver prints ``start ID``, after it one JSON line: the exit
status, what went to stderr, and the traceback of any exception that escaped ``main`` (a
bug). A signal or a hang shows as a job that started and never finished; the test
harness names it and goes on with the next job in a new process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import warnings


def _load(path: str) -> None:
    from celosia.runtime.accel import AccelModel, is_accel_artifact
    from celosia.runtime.cpu import CpuModel

    (AccelModel if is_accel_artifact(path) else CpuModel).load(path)


def _run(job: dict) -> dict:
    from celosia.cli import main
    from celosia.errors import CelosiaError

    err = io.StringIO()
    result = {"id": job["id"], "rc": None, "stderr": "", "traceback": None}
    with open(os.devnull, "w") as out, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("always")  # a warning is stderr output the test sees
        try:
            if "load" in job:
                try:
                    _load(job["load"])
                    result["rc"] = 0
                except CelosiaError as e:
                    print(f"celosia load: error: {e}", file=sys.stderr)
                    result["rc"] = 2
            else:
                result["rc"] = main(job["argv"])
        except SystemExit as e:  # argparse
            result["rc"] = e.code
        except BaseException:  # noqa: BLE001 - reported as a bug, with its traceback
            result["traceback"] = traceback.format_exc()
    result["stderr"] = err.getvalue()
    return result


def main() -> None:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        print(f"start {job['id']}", flush=True)
        if os.environ.get("CELOSIA_FUZZ_SELF_TEST") and "--kill-me" in job.get("argv", ()):
            os.kill(os.getpid(), 9)  # the harness's own test: a job that dies
        print(json.dumps(_run(job)), flush=True)


if __name__ == "__main__":
    main()
