"""The conformance tests share onnx_suite.py (which cases run, the exclusions): pytest runs
with --import-mode=importlib, which does not put test folders on sys.path. The CPU build's
cases outside the fast subset (onnx_suite.fast) are marked slow."""

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def pytest_collection_modifyitems(items):
    from onnx_suite import fast

    for item in items:
        if Path(str(item.path)).name == "test_onnx_cpu.py" \
                and item.name.endswith("_cpu") and not fast(item.name[:-len("_cpu")]):
            item.add_marker(pytest.mark.slow)
