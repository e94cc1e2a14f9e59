"""A whole attention block as torch exports it (heads split with Reshape + Transpose, Q @ K^T
divided by sqrt(d), an additive mask broadcast over heads and queries, Softmax, @ V, heads
merged) through the CPU build: every node a kernel or a view, against onnxruntime on
seeded random inputs, odd sequence lengths and batch > 1."""

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.runtime.cpu import CpuModel


def _attention_model(batch, seq, heads, d, scale_op):
    hidden = heads * d
    n = helper.make_node
    split = np.array([batch, seq, heads, d], np.int64)
    merged = np.array([batch, seq, hidden], np.int64)
    scale = np.array(math.sqrt(d) if scale_op == "Div" else 1 / math.sqrt(d), np.float32)
    inits = [numpy_helper.from_array(split, "split"), numpy_helper.from_array(merged, "merged"),
             numpy_helper.from_array(scale, "scale")]
    nodes = [n("Reshape", ["q", "split"], ["q4"]), n("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
             n("Reshape", ["k", "split"], ["k4"]), n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
             n("Reshape", ["v", "split"], ["v4"]), n("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
             n("MatMul", ["qh", "kt"], ["s"]), n(scale_op, ["s", "scale"], ["ss"]),
             n("Add", ["ss", "mask"], ["sm"]), n("Softmax", ["sm"], ["p"], axis=-1),
             n("MatMul", ["p", "vh"], ["o"]), n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
             n("Reshape", ["ot", "merged"], ["y"])]
    inputs = [vi(x, [batch, seq, hidden]) for x in "qkv"] + [vi("mask", [batch, 1, 1, seq])]
    return make_model(nodes, inputs, [vi("y", None)], inits)


@pytest.mark.parametrize("batch,seq,heads,d,scale_op", [
    (1, 1, 2, 8, "Div"),        # a sequence of one token
    (2, 7, 3, 16, "Mul"),       # batch 2, odd sequence, scaling by 1/sqrt(d)
    (1, 197, 2, 16, "Div"),     # ViT's sequence (prime)
])
def test_attention_block_is_all_kernels(batch, seq, heads, d, scale_op):
    m = _attention_model(batch, seq, heads, d, scale_op)
    rng = np.random.default_rng(seq)
    feeds = {x: rng.normal(size=(batch, seq, heads * d)).astype(np.float32) for x in "qkv"}
    mask = np.zeros((batch, 1, 1, seq), np.float32)
    mask[..., seq // 2 + 1:] = -10000.0  # padding tokens masked out (BERT's mask)
    feeds["mask"] = mask
    built = CpuModel.build(m, {k: v.shape for k, v in feeds.items()})
    assert not [s for s in built.program.steps if s["kind"] == "numpy"]
    specs = [built.program.specs[s["kernel"]] for s in built.program.steps
             if s["kind"] == "kernel"]
    scores = [s for s in specs if s["op"] == "batch_matmul"][0]
    assert scores["epilogue"] == [[scale_op, ["scalar", float(np.float32(
        math.sqrt(d) if scale_op == "Div" else 1 / math.sqrt(d)))]]]
    assert not [s for s in specs if s["op"] == "eltwise" and s["fn"] == scale_op]
    got = built.run(feeds)["y"]
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
