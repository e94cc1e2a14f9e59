"""onnx's backend test suite run against the compiled CPU build (import + optimize +
lowering + LLVM kernels, numpy steps for the rest: ``CpuModel``), the build `celosia
compile` makes. Which cases, the exclusions with their reasons and the fast subset of the
default run: onnx_suite.py; the others are marked slow (`make test-slow`)."""

from onnx_suite import backend_tests

from celosia.runtime.onnx_backend import CelosiaCpuBackend

globals().update(backend_tests(CelosiaCpuBackend, __name__, "cpu"))
