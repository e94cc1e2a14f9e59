"""Run many `celosia` command lines in one process: ``python cli_batch_records.py CASES.json
RESULTS.json``, CASES a JSON list of argument lists. Each runs the `main()` of
``python -m celosia.cli`` with its output captured; RESULTS gets one record per case (exit
status, stdout, stderr, or the traceback of an exception that escaped main). Starting
Python and numpy takes longer than most cases, so the fuzzer batches them."""

import contextlib
import io
import json
import sys
import traceback

from celosia.cli import main


def run(argv: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                rc = exc.code if isinstance(exc.code, int) else 2
    except Exception:  # noqa: BLE001 - what a real process would print as a traceback
        return {"rc": 1, "stdout": out.getvalue(), "stderr": err.getvalue(),
                "traceback": traceback.format_exc()}
    return {"rc": rc, "stdout": out.getvalue()[-2000:], "stderr": err.getvalue()}


if __name__ == "__main__":
    cases = json.loads(open(sys.argv[1]).read())
    results = [run(argv) for argv in cases]
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
