"""The runtime: compiled models saved, loaded and run.

- cpu.py: CpuModel, the all-CPU build (compiled LLVM kernels over a planned arena).
- accel.py: AccelModel, a model split between the accelerator (programs resident in a
  Device's DRAM) and compiled CPU segments; the .cel artifact.
- executor.py, report.py: running a graph node by node, per-node reports.
- reference.py, onnx_backend.py: the numpy reference executor as a model and as an ONNX
  backend (for onnx's conformance suite).

May import: celosia.compiler (its pipeline and backends), celosia.driver (never a particular
executor).
"""
