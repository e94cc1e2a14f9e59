"""Mutation fuzzing of program images (mutate.py) against the executors, the image loader and
the command line (checks.py says what each case must satisfy).

The default run takes a fast subset (a few hundred cases); the slow target runs more than
10,000. Every case is a function of its seed: a failure lists the seeds and what was
mutated, and ``make_case(seed)`` rebuilds it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from celosia.errors import CelosiaError
from celosia.image import ProgramImage
from checks import MAX_CYCLES, MAX_WORK, check_cli_result, check_executors, one_line, run_case
from mutate import CONFIGS, Case, base_images, make_case, write_mutated_file

HERE = Path(__file__).resolve().parent


def _report(failures: list[str], total: int) -> None:
    if failures:
        shown = "\n".join(failures[:12])
        pytest.fail(f"{len(failures)} of {total} cases failed:\n{shown}")


def test_base_images_are_valid_and_agree():
    """The mutations start from valid programs that fsim, the cycle model and the reference
    agree on (so a failure is the mutation's doing)."""
    for config in CONFIGS:
        for dram, addr, count in base_images(config):
            case = Case(config, dram.copy(), addr, count, [])
            assert run_case("fsim", case)[0] == "ok"
            assert check_executors(case) == []


# ---- executors in process ------------------------------------------------------------------


def _fuzz_executors(seeds) -> None:
    failures = []
    for seed in seeds:
        case = make_case(seed)
        problems = check_executors(case)
        if problems:
            failures.append(f"seed {seed} ({case.describe()}): {'; '.join(problems)}")
    _report(failures, len(seeds))


def test_fuzz_executors():
    _fuzz_executors(range(300))


@pytest.mark.slow
def test_fuzz_executors_long():
    _fuzz_executors(range(100_000, 108_000))


# ---- the image loader ----------------------------------------------------------------------


def _fuzz_loader(seeds, tmp_path: Path) -> None:
    failures = []
    for seed in seeds:
        rng = random.Random(seed)
        case = make_case(seed)
        path = tmp_path / f"case{seed}.npz"
        what = write_mutated_file(rng, case, path)
        try:
            image = ProgramImage.load(path)
        except CelosiaError as exc:
            if not one_line(str(exc)) or not str(exc).startswith(str(path)):
                failures.append(f"seed {seed} ({what}): error not one line naming the file: "
                                f"{str(exc)!r}")
            continue
        except Exception as exc:  # noqa: BLE001 - the defect the fuzzer looks for
            failures.append(f"seed {seed} ({what}): {type(exc).__name__}: {exc}")
            continue
        if image.dram.dtype != np.uint8 or image.dram.ndim != 1 or not image.dram.flags.writeable:
            failures.append(f"seed {seed} ({what}): loaded a DRAM of {image.dram.dtype} "
                            f"{image.dram.shape}")
        case.dram, case.insn_addr, case.insn_count = image.dram, image.insn_addr, image.insn_count
        problems = check_executors(case)
        if problems:
            failures.append(f"seed {seed} ({what}; {case.describe()}): {'; '.join(problems)}")
    _report(failures, len(seeds))


def test_fuzz_loader(tmp_path):
    _fuzz_loader(range(200), tmp_path)


@pytest.mark.slow
def test_fuzz_loader_long(tmp_path):
    _fuzz_loader(range(200_000, 202_000), tmp_path)


# ---- the command line ----------------------------------------------------------------------


def _cli_cases(seeds, tmp_path: Path) -> list[tuple[int, str, list[str], str]]:
    """(seed, command, arguments, what) of each case: exec on fsim or the cycle model (and
    sometimes disasm) of a mutated image file."""
    cases = []
    for seed in seeds:
        rng = random.Random(seed)
        case = make_case(seed)
        path = tmp_path / f"cli{seed}.npz"
        what = f"{write_mutated_file(rng, case, path)}; {case.describe()}"
        config = ["--config", case.config]
        if rng.random() < 0.15:
            cases.append((seed, "disasm", ["disasm", str(path), *config], what))
            continue
        target = rng.choice(["fsim", "cycle"])
        argv = ["exec", str(path), "--target", target, *config, "--out",
                str(tmp_path / f"out{seed}.npz"), "--stats", str(tmp_path / f"stats{seed}.json"),
                "--max-work", str(MAX_WORK), "-q"]
        if target == "cycle":
            argv += ["--max-cycles", str(MAX_CYCLES)]
        cases.append((seed, "exec", argv, what))
    return cases


def _check_exec_output(argv: list[str], result: dict) -> list[str]:
    """An exec that succeeded wrote the final DRAM (uint8, the image's size) and the stats."""
    if result["rc"] != 0 or argv[0] != "exec":
        return []
    out = Path(argv[argv.index("--out") + 1])
    stats = json.loads(Path(argv[argv.index("--stats") + 1]).read_text())
    with np.load(out) as data:
        dram = data["dram"]
    image = ProgramImage.load(argv[1])
    if dram.dtype != np.uint8 or dram.shape != image.dram.shape:
        return [f"--out holds {dram.dtype} {dram.shape}"]
    if stats["work"] > MAX_WORK:
        return [f"work {stats['work']} past --max-work {MAX_WORK}"]
    return []


def _fuzz_cli(seeds, tmp_path: Path, batch: int, timeout: float) -> None:
    cases = _cli_cases(seeds, tmp_path)
    failures = []
    for k in range(0, len(cases), batch):
        part = cases[k:k + batch]
        cases_file, results_file = tmp_path / f"batch{k}.json", tmp_path / f"results{k}.json"
        cases_file.write_text(json.dumps([argv for _, _, argv, _ in part]))
        proc = subprocess.run([sys.executable, str(HERE / "cli_batch_records.py"), str(cases_file),
                               str(results_file)], capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            failures.append(f"the batch of seeds {[s for s, *_ in part]} ended with status "
                            f"{proc.returncode}: {proc.stderr[-500:]!r}")
            continue
        for (seed, command, argv, what), result in zip(part, json.loads(results_file.read_text())):
            problems = check_cli_result(command, result) + _check_exec_output(argv, result)
            if problems:
                failures.append(f"seed {seed} (celosia {' '.join(argv[:4])} ...; {what}): "
                                f"{'; '.join(problems)}")
    _report(failures, len(cases))


def _fuzz_cli_processes(seeds, tmp_path: Path, timeout: float) -> None:
    """Each case as its own ``python -m celosia.cli`` process: no signal, no hang, exit 0 or
    exit 2 with one line on stderr."""
    failures = []
    for seed, command, argv, what in _cli_cases(seeds, tmp_path):
        proc = subprocess.run([sys.executable, "-m", "celosia.cli", *argv], capture_output=True,
                              text=True, timeout=timeout)
        result = {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        problems = check_cli_result(command, result) + _check_exec_output(argv, result)
        if problems:
            failures.append(f"seed {seed} ({what}): {'; '.join(problems)}")
    _report(failures, len(seeds))


def test_fuzz_cli(tmp_path):
    _fuzz_cli(range(300_000, 300_040), tmp_path, batch=40, timeout=300)


def test_fuzz_cli_processes(tmp_path):
    _fuzz_cli_processes(range(310_000, 310_004), tmp_path, timeout=120)


@pytest.mark.slow
def test_fuzz_cli_long(tmp_path):
    _fuzz_cli(range(400_000, 401_000), tmp_path, batch=100, timeout=900)


@pytest.mark.slow
def test_fuzz_cli_processes_long(tmp_path):
    _fuzz_cli_processes(range(410_000, 410_040), tmp_path, timeout=120)
