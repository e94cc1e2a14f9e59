"""Test-run summary that says what is covered: the stack's own tests apart from the ONNX
conformance cases (tests/conformance), counted per executor: the numpy reference (the graph
level's definitions) and the compiled CPU build (LLVM kernels, what `celosia compile`
makes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Helpers beside these tests (onnx_builders.py) are imported by name; pytest's importlib
# mode does not put test folders on sys.path.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

_CONFORMANCE = Path(__file__).resolve().parent / "conformance"
# conformance test module -> the executor its cases run on
_EXECUTORS = {"test_onnx_backend.py": "reference", "test_onnx_cpu.py": "cpu"}
_NAMES = {"stack": "celosia's own tests (hardware, simulators, driver, compiler, runtime)",
          "reference": "ONNX conformance cases on the numpy reference executor",
          "cpu": "ONNX conformance cases on the compiled CPU build",
          "conformance": "ONNX conformance, other tests"}


def pytest_collection_modifyitems(items):
    for item in items:
        if _CONFORMANCE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.conformance)


def _group(nodeid: str) -> str:
    if "tests/conformance/" not in nodeid:
        return "stack"
    return _EXECUTORS.get(nodeid.split("::")[0].rsplit("/", 1)[-1], "conformance")


def pytest_terminal_summary(terminalreporter):
    counts: dict = {}
    for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") not in ("call", "setup") or (
                    outcome == "passed" and report.when != "call"):
                continue
            group = counts.setdefault(_group(report.nodeid), {})
            group[outcome] = group.get(outcome, 0) + 1
    if not counts:
        return
    terminalreporter.section("what the tests cover")
    for group in _NAMES:
        if group in counts:
            shown = ", ".join(f"{n} {o}" for o, n in sorted(counts[group].items()))
            terminalreporter.write_line(f"{_NAMES[group]}: {shown}")


@pytest.fixture
def private_cache(tmp_path_factory, monkeypatch):
    """Kernels compiled into one cache of this test session's own (CELOSIA_CACHE under
    pytest's base temporary directory), not the user's: test modules that build take it
    with ``pytestmark = pytest.mark.usefixtures("private_cache")``."""
    monkeypatch.setenv("CELOSIA_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
