"""Make the helpers next to these tests (mutate.py, onnx_seeds.py, onnx_mutate.py,
onnx_oracle.py, ...) and the program generators of tests/sim (programs.py) importable:
pytest runs with --import-mode=importlib, which does not put test folders on sys.path."""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for folder in (_HERE, _HERE.parent / "sim"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
