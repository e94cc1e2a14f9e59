"""Test-run summary that says what is covered: the stack's own tests apart from the ONNX
conformance cases (tests/conformance), which check the graph level's numpy definitions
against onnx's backend suite rather than celosia's compiled paths."""

from __future__ import annotations

from pathlib import Path

import pytest

_CONFORMANCE = Path(__file__).resolve().parent / "conformance"


def pytest_collection_modifyitems(items):
    for item in items:
        if _CONFORMANCE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.conformance)


def pytest_terminal_summary(terminalreporter):
    counts = {}
    for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") not in ("call", "setup") or (
                    outcome == "passed" and report.when != "call"):
                continue
            group = "conformance" if "tests/conformance/" in report.nodeid else "stack"
            counts.setdefault(group, {}).setdefault(outcome, 0)
            counts[group][outcome] += 1
    if not counts:
        return
    terminalreporter.section("what the tests cover")
    names = {"stack": "celosia's own tests (hardware, simulators, driver, compiler, runtime)",
             "conformance": "ONNX conformance cases (onnx's backend suite)"}
    for group in ("stack", "conformance"):
        if group in counts:
            shown = ", ".join(f"{n} {o}" for o, n in sorted(counts[group].items()))
            terminalreporter.write_line(f"{names[group]}: {shown}")
