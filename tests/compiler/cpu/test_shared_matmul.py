"""A MatMul whose right operand is computed at run time and has no batch dims of its own
(``x @ y.T`` of two embeddings, an einsum ``bnd,de->bne`` with a run-time ``de``): A's
batches stacked into the rows of one product, on the dense kernel with B packed each run
(or the batched kernel with one batch when an epilogue operand follows), against the numpy
reference and onnxruntime on seeded random inputs."""

import numpy as np
import pytest
from onnx import helper
from onnx_builders import cpu_build_checked, make_model, vi


ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize("a, b, after, dense", [
    ((2, 5, 16), (16, 64), None, True),
    ((13, 24), (24, 96), "Relu", True),          # 13 rows: padded for the tile
    ((2, 3, 7, 32), (1, 1, 32, 64), None, True),  # B's batch dims all 1
    ((4, 16), (16, 36), None, False),            # 36 columns: no block of 8 -> batched
    ((2, 6, 16), (16, 32), "mask", False),       # a run-time operand after it
])
def test_shared_right_operand(a, b, after, dense):
    rng = np.random.default_rng(sum(a) + sum(b))
    feeds = {"a": rng.normal(size=a).astype(np.float32),
             "b": rng.normal(size=b).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["a", "b"], ["p"])]
    inputs = [vi("a", None), vi("b", None)]
    if after == "Relu":
        nodes.append(helper.make_node("Relu", ["p"], ["y"]))
    elif after == "mask":
        out = a[:-1] + (b[-1],)
        feeds["m"] = rng.normal(size=out).astype(np.float32)
        inputs.append(vi("m", None))
        nodes.append(helper.make_node("Add", ["p", "m"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["p"], ["y"]))
    model = make_model(nodes, inputs, [vi("y", None)])
    built, _ = cpu_build_checked(model, feeds, rtol=1e-5)
    ops = [built.program.specs[s["kernel"]]["op"] for s in built.program.steps
           if s["op"] == "MatMul" and s["kind"] == "kernel"]
    assert ("dense" in ops) == dense and ("batch_matmul" in ops) != dense
