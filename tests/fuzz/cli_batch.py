"""Run many `celosia` command lines in one process (start-up dominates a single one): reads a
JSON list of {"argv": [...]} and prints, per job, one JSON line with its exit code and what it
wrote on stderr. An exception other than the CLI's own handling escapes ``main`` and is
recorded with its traceback, as the real command would print it."""

import contextlib
import io
import json
import sys
import traceback

from celosia.cli import main


def run(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - what the test looks for
            traceback.print_exc()
            code = 1
    return code, err.getvalue()


if __name__ == "__main__":
    for job in json.loads(open(sys.argv[1]).read()):
        code, stderr = run(job["argv"])
        print(json.dumps({"code": code, "stderr": stderr}), flush=True)
