"""onnx's backend test suite as celosia runs it, for both executors (the numpy reference,
test_onnx_backend.py; the compiled CPU build, test_onnx_cpu.py): which cases run, which
are excluded and why, and the fast subset of the CPU build's cases in the default run.

Which cases: node cases (the ones onnx generates in Python, with the "_expanded" function
bodies) and the model cases the wheel ships (simple, pytorch-converted, pytorch-operator),
every one whose operators are all in the importer's SUPPORTED_OPS (default domain). A case
of an operator celosia does not import is not a celosia case (the importer refuses the
model with UnsupportedOperatorError, a test of its own); ``suite_counts()`` says how many
such cases there are.

EXCLUDED is the one table of cases that are celosia's but do not run, each with the
executors it applies to and the reason. Only what no exported model contains may be here:
exotic element types, random draws, non-tensor types.
"""

from __future__ import annotations

import os
import re
import zlib
from functools import cache

import onnx
from onnx.backend.test.loader import load_model_tests

from celosia.compiler.frontend.functions import expand_functions
from celosia.compiler.frontend.onnx import SUPPORTED_OPS

BOTH = ("reference", "cpu")

# pattern (re.search on the case name) -> (executors, reason)
EXCLUDED = {
    # numpy has no bfloat16, float8, float4, int4 or int2 dtypes; no exported float32 or
    # int8 model has these types.
    r"^test_cast(like)?_.*(BFLOAT16|FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2)": (BOTH, "exotic dtype"),
    r"^test_cast_e8m0": (BOTH, "exotic dtype"),
    r"^test_(de)?quantizelinear_(e4m3fn|e5m2|float4e2m1|u?int4|u?int2)": (BOTH, "exotic dtype"),
    r"bfloat16": (BOTH, "exotic dtype"),
    r"_bf16": (BOTH, "exotic dtype"),
    # Dropout in training mode draws random masks: no fixed expected output (inference
    # exports have no training-mode Dropout).
    r"^test_training_dropout": (BOTH, "training mode (random)"),
    # Bernoulli draws: its cases' expected outputs come from numpy's legacy generator
    # (onnx's reference), which no other generator reproduces, onnxruntime's included;
    # tests/compiler/graph/test_ops_random.py checks celosia's draws by distribution.
    r"^test_bernoulli": (BOTH, "random draws"),
    # Tensors only: no strings, sequences or optionals.
    r"^test_equal_string": (BOTH, "string tensors"),
    r"^test_identity_sequence": (BOTH, "sequence type"),
    r"^test_identity_opt": (BOTH, "optional type"),
    # align_corners with a non-integral scaled size (4 x 0.6 = 2.4): onnx's reference maps
    # by the unrounded size, onnxruntime (whose answer celosia follows) by the output size
    # it makes, which keeps the corners on the corners.
    r"^test_resize_downsample_scales_(linear|cubic)_align_corners": (
        BOTH, "onnxruntime's meaning (checked: onnxruntime gives celosia's answer)"),
    # MaxUnpool with an output_shape larger than the unpooled size: onnx's reference puts
    # the values by their indices into the unpooled size and pads that; onnxruntime (whose
    # answer celosia follows) reads the indices as positions in the output_shape tensor,
    # which is where the MaxPool that made them found them.
    r"^test_maxunpool_export_with_output_shape": (
        BOTH, "onnxruntime's meaning (checked: onnxruntime gives celosia's answer)"),
    # A Slice in a Loop body whose starts are the iteration number: its shape is known only
    # at run time, inside a body (run-time shapes are taken in the main graph only).
    r"^test_loop11(_|$)": (BOTH, "run-time shaped Slice in a loop body"),
    # Opset-8 Scan has a batch axis; onnx's version converter makes it a Scan-9 without
    # one (and drops the axis from the model's inputs), so the case's batched data no
    # longer fits. No exporter writes opset-8 Scan today.
    r"^test_scan_sum(_|$)": (BOTH, "opset-8 Scan (batch axis)"),
}

# The light model zoo ("real" cases: AlexNet, DenseNet-121, Inception, ResNet-50, ...) is
# not run: every weight is a ConstantOfShape filled with 0.02 (light_resnet50: 239 of
# them), not trained or random weights, and its expected outputs are made at run time by
# onnx's Python ReferenceEvaluator (minutes per model) into ~/.onnx. celosia's own
# ResNet-18/50 and MobileNetV2 builders (models/zoo.py) with random weights are checked
# against onnxruntime and a float64 evaluation instead (tests/runtime/test_cpu_accuracy.py).
KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator")

# The default run takes this share of the CPU build's cases (every case compiles its
# kernels with LLVM); `make test-slow` runs the rest. The choice is by a hash of the name:
# stable across runs and spread over all operators.
FAST_SHARE = 0.3
# Cases that found bugs in the CPU build: always in the default run.
REGRESSIONS = {
    "test_size": "a 0-d constant output came back 1-d (np.ascontiguousarray)",
    "test_shape": "a graph folded to a constant output had no storage in the arena plan",
    "test_constant": "the same, for a Constant node's output",
    "test_reduce_l1_empty_set_expanded": "a zero-size tensor given to a compiled kernel",
    "test_MaxPool2d_stride_padding_dilation": "a 60x80 pooling window unrolled as a chain "
                                              "of 4800 max operations (recursion limit)",
}


def _model(case):
    if case.model is not None:
        return case.model
    return onnx.load(os.path.join(case.model_dir, "model.onnx"))


def _ops(graph) -> set:
    """The operators of a graph, including those in subgraphs (If, Loop and Scan bodies)."""
    found = set()
    for n in graph.node:
        found.add(n.op_type)
        for a in n.attribute:
            if a.HasField("g"):
                found |= _ops(a.g)
    return found


@cache
def _cases() -> tuple:
    """((name, kind, celosia's?) ...) for every node and model case of KINDS."""
    rows = []
    for kind in KINDS:
        for case in load_model_tests(kind=kind):
            model = _model(case)
            ops = _ops(model.graph)
            opset = next((o.version for o in model.opset_import
                          if o.domain in ("", "ai.onnx")), None)
            if opset is not None and not ops <= set(SUPPORTED_OPS):
                # operators onnx defines as functions import as their bodies
                ops = _ops(expand_functions(model, opset, SUPPORTED_OPS).graph)
            ours = ops <= set(SUPPORTED_OPS) and all(
                o.domain in ("", "ai.onnx") for o in model.opset_import)
            rows.append((case.name, kind, ours))
    return tuple(rows)


def excluded(name: str, executor: str) -> str | None:
    """The reason ``name`` is excluded for ``executor``, or None."""
    for pattern, (executors, reason) in EXCLUDED.items():
        if executor in executors and re.search(pattern, name):
            return reason
    return None


def included() -> list[str]:
    """Names of celosia's cases, the same for both executors (the excluded ones among
    them: they show as skips with their reason)."""
    return [name for name, _, ours in _cases() if ours]


def fast(name: str) -> bool:
    """Whether a CPU-build case is in the default run (the rest are slow)."""
    return name in REGRESSIONS or zlib.crc32(name.encode()) % 1000 < FAST_SHARE * 1000


def suite_counts() -> dict:
    """{kind: {"cases": all, "celosia": whose operators celosia imports}}."""
    out: dict = {}
    for _, kind, ours in _cases():
        row = out.setdefault(kind, {"cases": 0, "celosia": 0})
        row["cases"] += 1
        row["celosia"] += ours
    return out


def backend_tests(backend, module_name: str, executor: str, *, node_ids=None) -> dict:
    """onnx's BackendTest classes for ``backend``, holding celosia's cases only; excluded
    ones are skipped with their reason."""
    import onnx.backend.test

    names = {f"{n}_cpu" for n in included()}  # "_cpu": onnx's device suffix
    bt = onnx.backend.test.BackendTest(backend, module_name)
    for name in names:
        bt.include(rf"^{name}$")
    classes = bt.test_cases  # built anew on every access: take it once
    for cls in classes.values():
        for attr in [a for a in vars(cls) if a.startswith("test_")]:
            if attr not in names:
                delattr(cls, attr)
                continue
            reason = excluded(attr[:-len("_cpu")], executor)
            if reason:
                setattr(cls, attr, _skip(reason))
    return classes


def _skip(reason: str):
    import unittest

    @unittest.skip(reason)
    def test(self):
        pass
    return test
