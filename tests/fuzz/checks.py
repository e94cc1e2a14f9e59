"""What every fuzz case must satisfy, in process and through the command line.

In process (:func:`check_executors`): fsim and the cycle model each either return or raise a
CelosiaError with a one-line message (never another exception), never do more work than
their (small) ``max_work``, and agree: the same DRAM and counters when both accept the
program, the same error when both reject it. The cycle model may stop at ``max_cycles``
where fsim finishes or fails later. Programs that are small enough also run on the
reference interpreter (tests/sim/reference.py): if it finds the program race-free and
completes it, fsim must give its DRAM and counters; and fsim gives the same result with its
long-instruction paths (chunked) forced on.

Through the command line (:func:`check_cli_result`): exit 0 with a result, or exit 2 with
exactly one line on stderr (``celosia CMD: error: ...``) and no traceback.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np

from celosia.errors import CelosiaError, SimulationLimitError
from celosia.isa import INSN_BYTES, AluInsn, GemmInsn, decode_program
from celosia.sim import datapath
from celosia.sim.base import make_executor
from mutate import CONFIGS, Case
from reference import RefDeadlock, RefIllegal, RefRace, run_reference

__all__ = ["MAX_WORK", "MAX_CYCLES", "run_case", "check_executors", "check_cli_result",
           "one_line"]

MAX_WORK = 50_000  # small, so that every case is quick
MAX_CYCLES = 3_000_000
# A case must finish well within this (at MAX_WORK, the slowest paths take about 0.2 s).
CASE_SECONDS = 20.0
# Programs at most this long (work, GEMM micro-ops) are also run on the reference.
_REF_WORK, _REF_GEMM_UOPS = 2000, 200


def one_line(message: str) -> bool:
    return bool(message) and "\n" not in message and "Traceback" not in message


def run_case(target: str, case: Case):
    """("ok", dram, stats) | ("limit", message) | ("error", class name, message); any other
    exception propagates."""
    cfg = CONFIGS[case.config]
    options = {"max_work": MAX_WORK}
    if target == "cycle":
        options["max_cycles"] = MAX_CYCLES
    try:
        ex = make_executor(target, cfg, case.dram.size, **options)
        ex.write_dram(0, case.dram)
        stats = ex.run(case.insn_addr, case.insn_count)
        return "ok", ex.read_dram(0, case.dram.size), stats
    except SimulationLimitError as exc:
        return "limit", str(exc)
    except CelosiaError as exc:
        return "error", type(exc).__name__, str(exc)


def check_executors(case: Case) -> list[str]:
    """What is wrong with fsim and the cycle model on ``case`` ([] if nothing)."""
    problems = []
    outcomes = {}
    for target in ("fsim", "cycle"):
        t0 = time.perf_counter()
        try:
            outcomes[target] = run_case(target, case)
        except Exception as exc:  # noqa: BLE001 - the defect the fuzzer looks for
            return [f"{target} raised {type(exc).__name__}: {exc}"]
        took = time.perf_counter() - t0
        if took > CASE_SECONDS:
            problems.append(f"{target} took {took:.1f} s")
        out = outcomes[target]
        if out[0] == "ok" and out[2]["work"] > MAX_WORK:
            problems.append(f"{target} did {out[2]['work']} work, past max_work={MAX_WORK}")
        if out[0] != "ok" and not one_line(out[-1]):
            problems.append(f"{target}'s error is not one line: {out[-1]!r}")
    f, c = outcomes["fsim"], outcomes["cycle"]
    if f[0] == "ok" and c[0] == "ok":
        if not np.array_equal(f[1], c[1]):
            problems.append(f"fsim and cycle DRAMs differ at {np.flatnonzero(f[1] != c[1])[:8]}")
        differ = {k for k in f[2] if f[2][k] != c[2].get(k)}
        if differ:
            problems.append(f"fsim and cycle counters differ: {sorted(differ)}")
        problems += _check_reference(case, f)
        problems += _check_chunked(case, f)
    elif f[0] == "error" and c[0] == "error":
        if f[1:] != c[1:]:
            problems.append(f"different errors: fsim {f[1:]}, cycle {c[1:]}")
    elif c[0] == "limit" and "max_cycles" in c[1]:
        pass  # the cycle model may stop at its cycle limit before fsim's outcome
    elif f[0] == "limit" and c[0] == "limit":
        if f[1] != c[1]:
            problems.append(f"different limits: fsim {f[1]!r}, cycle {c[1]!r}")
    else:
        problems.append(f"fsim {f[0]} ({f[-1] if f[0] != 'ok' else 'ran'}), cycle {c[0]} "
                        f"({c[-1] if c[0] != 'ok' else 'ran'})")
    return problems


@contextmanager
def _small_chunks():
    """The datapath's long-instruction paths (chunked, planned on every run) for every
    instruction of more than a few executions, chunks cutting through its patterns."""
    saved = datapath._KERNEL_EXECS, datapath._CHUNK
    datapath._KERNEL_EXECS, datapath._CHUNK = 8, 13
    try:
        yield
    finally:
        datapath._KERNEL_EXECS, datapath._CHUNK = saved


def _check_chunked(case: Case, fsim) -> list[str]:
    with _small_chunks():
        out = run_case("fsim", case)
    if out[0] != "ok":
        return [f"fsim with small chunks: {out[-1]}"]
    if not np.array_equal(out[1], fsim[1]) or out[2] != fsim[2]:
        return ["fsim with small chunks gives another result"]
    return []


def _check_reference(case: Case, fsim) -> list[str]:
    _, dram, stats = fsim
    cfg = CONFIGS[case.config]
    program = case.dram[case.insn_addr:case.insn_addr + INSN_BYTES * case.insn_count]
    # The reference pays a Python step per byte moved and per loop iteration, even of an
    # empty micro-op range.
    loops = sum(i.iter_out * i.iter_in for i in decode_program(program, cfg)
                if isinstance(i, (GemmInsn, AluInsn)))
    moved = sum(v for k, v in stats.items() if k.endswith("_bytes"))
    if stats["work"] + loops + moved // 8 > _REF_WORK or stats["gemm_uops"] > _REF_GEMM_UOPS:
        return []
    try:
        ref_dram, ref_counters = run_reference(case.dram, case.insn_addr, case.insn_count, cfg)
    except RefRace:
        return []  # racy: the result depends on the schedule, fsim's is one of them
    except (RefIllegal, RefDeadlock) as exc:
        return [f"fsim ran a program the reference rejects: {exc!r}"]
    problems = []
    if bytes(dram) != ref_dram:
        problems.append("fsim's DRAM differs from the reference's")
    differ = {k for k in ref_counters if ref_counters[k] != stats.get(k)}
    if differ:
        problems.append(f"fsim's counters differ from the reference's: {sorted(differ)}")
    return problems


def check_cli_result(command: str, result: dict) -> list[str]:
    """What is wrong with one command line's result: {"rc", "stdout", "stderr"} (and
    "traceback" when an exception escaped main)."""
    if result.get("traceback"):
        return [f"an exception escaped: {result['traceback'].strip().splitlines()[-1]}"]
    rc, err = result["rc"], result["stderr"]
    if rc == 0:
        return [] if "Traceback" not in err else ["exit 0 with a traceback"]
    if rc != 2:
        return [f"exit status {rc}: {err.strip()[-300:]!r}"]
    if not (err.endswith("\n") and err.count("\n") == 1 and one_line(err[:-1])
            and err.startswith(f"celosia {command}: error: ")):
        return [f"exit 2 without exactly one error line: {err[-300:]!r}"]
    return []
