"""onnx's backend test suite run against celosia (import + optimize + numpy executor).

Node cases: every case whose operators are all in SUPPORTED_OPS (the cases onnx generates
in Python, including the "_expanded" function bodies). Model cases: the simple,
pytorch-converted and pytorch-operator models the wheel ships, when their operators are
supported. The exclusions below are the cases celosia cannot run, each with its reason.
"""

import os

import onnx
import onnx.backend.test
from onnx.backend.test.loader import load_model_tests

from celosia.compiler.frontend.onnx import SUPPORTED_OPS
from celosia.runtime.onnx_backend import CelosiaBackend

EXCLUDED = {
    # numpy has no bfloat16, float8, float4, int4 or int2 dtypes.
    r"^test_cast(like)?_.*(BFLOAT16|FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2)": "exotic dtype",
    r"^test_cast_e8m0": "exotic dtype",
    r"^test_(de)?quantizelinear_(e4m3fn|e5m2|float4e2m1|u?int4|u?int2)": "exotic dtype",
    r"bfloat16": "exotic dtype",
    r"_bf16": "exotic dtype",
    # Dropout in training mode draws random masks: no fixed expected output.
    r"^test_training_dropout": "random",
    # align_corners with a non-integral scaled size (4 x 0.6 = 2.4): onnx's reference maps
    # by the unrounded size, onnxruntime (whose answer celosia follows) by the output size
    # it makes, which keeps the corners on the corners.
    r"^test_resize_downsample_scales_(linear|cubic)_align_corners": "onnxruntime's meaning",
    # Tensors only: no strings, sequences or optionals.
    r"^test_equal_string": "string tensors",
    r"^test_identity_sequence": "sequence type",
    r"^test_identity_opt": "optional type",
    # A Slice in a Loop body whose starts are the iteration number: its shape is known only
    # at run time (the static importer asks for constant starts).
    r"^test_loop11_": "run-time shaped Slice in a loop body",
    # Opset-8 Scan has a batch axis; onnx's version converter makes it a Scan-9 without
    # one (and drops the axis from the model's inputs), so the case's batched data no
    # longer fits.
    r"^test_scan_sum_": "opset-8 Scan (batch axis)",
}


def _ops(case):
    """The operators of a case, including those in subgraphs (If, Loop and Scan bodies)."""
    if case.model is not None:
        model = case.model
    else:
        model = onnx.load(os.path.join(case.model_dir, "model.onnx"))

    def ops(graph):
        found = set()
        for n in graph.node:
            found.add(n.op_type)
            for a in n.attribute:
                if a.HasField("g"):
                    found |= ops(a.g)
        return found
    return ops(model.graph), model


def _included():
    names = []
    for kind in ("node", "simple", "pytorch-converted", "pytorch-operator"):
        for case in load_model_tests(kind=kind):
            ops, model = _ops(case)
            if ops <= set(SUPPORTED_OPS) and all(
                    o.domain in ("", "ai.onnx") for o in model.opset_import):
                names.append(case.name)
    return names


backend_test = onnx.backend.test.BackendTest(CelosiaBackend, __name__)
_INCLUDED = {f"{name}_cpu" for name in _included()}
for _name in _INCLUDED:
    backend_test.include(rf"^{_name}$")
for _pattern in EXCLUDED:
    backend_test.exclude(_pattern)

# Cases of operators celosia does not claim are dropped rather than reported as skipped; the
# explicit EXCLUDED cases stay visible as skips with their reason.
_cases = backend_test.test_cases  # built anew on every access: take it once
for _cls in _cases.values():
    for _attr in [a for a in vars(_cls) if a.startswith("test_")]:
        if _attr not in _INCLUDED:
            delattr(_cls, _attr)

globals().update(_cases)
