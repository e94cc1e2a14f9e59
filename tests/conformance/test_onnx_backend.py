"""onnx's backend test suite run against celosia's numpy reference executor (import +
optimize + graph.reference): the definitions of the graph level. Which cases, and the
exclusions with their reasons: onnx_suite.py."""

from onnx_suite import backend_tests

from celosia.runtime.onnx_backend import CelosiaBackend

globals().update(backend_tests(CelosiaBackend, __name__, "reference"))
