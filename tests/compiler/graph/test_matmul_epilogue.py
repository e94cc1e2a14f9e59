"""Attention scores plus a run-time mask or bias (compiler/graph/matmul_epilogue.py): the
float graph keeps its outputs, the quantizer makes Q x K^T and P x V QMatMuls (all of the
model's multiply-adds integer) and leaves only the mask Add float with its true reason,
and the accelerator build runs the QMatMuls bit-exact with the all-CPU int8 build on fsim
and the cycle model."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.matmul_epilogue import split_matmul_epilogues
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel

SEQ, DIM, HEADS = 8, 32, 2


def _masked_attention(scale_first=True, seed=0):
    """GPT-2's export from transformers: scores = (q x k^T) * d**-0.5 + a causal/padding
    mask (a model input [1, 1, T, T]), Softmax, x P x V; T5's (``scale_first`` False):
    q x k^T + the bias, no scale."""
    c = helper.make_node
    rng = np.random.default_rng(seed)
    hd = DIM // HEADS
    w = {n: (rng.normal(size=(DIM, DIM)) / np.sqrt(DIM)).astype(np.float32)
         for n in ("wq", "wk", "wv", "wo")}
    consts = {"split": np.array([1, SEQ, HEADS, hd], np.int64),
              "merge": np.array([1, SEQ, DIM], np.int64),
              "scale": np.array(hd ** -0.5, np.float32)}
    nodes = [c("MatMul", ["x", "wq"], ["q0"]), c("MatMul", ["x", "wk"], ["k0"]),
             c("MatMul", ["x", "wv"], ["v0"]),
             c("Reshape", ["q0", "split"], ["q1"]),
             c("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
             c("Reshape", ["k0", "split"], ["k1"]),
             c("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
             c("Reshape", ["v0", "split"], ["v1"]),
             c("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
             c("MatMul", ["q", "kt"], ["s0"], name="scores")]
    if scale_first:
        nodes.append(c("Mul", ["s0", "scale"], ["s1"]))
    else:
        nodes.append(c("Identity", ["s0"], ["s1"]))
    nodes += [c("Add", ["s1", "mask"], ["s"]),
              c("Softmax", ["s"], ["p"], axis=-1),
              c("MatMul", ["p", "v"], ["ctx0"], name="context"),
              c("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]),
              c("Reshape", ["ctx1", "merge"], ["ctx"]),
              c("MatMul", ["ctx", "wo"], ["y"])]
    inits = [numpy_helper.from_array(v, k) for k, v in {**w, **consts}.items()]
    return make_model(nodes, [vi("x", [1, SEQ, DIM]), vi("mask", [1, 1, SEQ, SEQ])],
                      [vi("y", [1, SEQ, DIM])], inits)


def _feeds(seed):
    rng = np.random.default_rng(seed)
    causal = np.triu(np.full((SEQ, SEQ), -1e4, np.float32), 1)
    return {"x": rng.normal(size=(1, SEQ, DIM)).astype(np.float32),
            "mask": causal[None, None] + rng.normal(size=(1, 1, SEQ, SEQ)).astype(np.float32)}


def test_the_split_keeps_the_float_graph():
    for scale_first in (True, False):
        g = optimize(import_onnx(_masked_attention(scale_first)))
        scores = next(n for n in g.nodes if n.name == "scores")
        assert scores.attrs.get("epilogue"), "fuse_epilogues folds the mask Add"
        s = split_matmul_epilogues(g)
        split = next(n for n in s.nodes if n.name == "scores")
        assert split.attrs.get("epilogue", ()) == ((("Mul", 2),) if scale_first else ())
        assert split_matmul_epilogues(s) is s  # nothing left to split
        feeds = _feeds(1)
        np.testing.assert_allclose(run_graph(s, feeds)["y"], run_graph(g, feeds)["y"],
                                   rtol=1e-6, atol=1e-6)


def test_masked_scores_are_qmatmuls_on_the_accelerator_bit_exact():
    for scale_first in (True, False):
        q = quantize_model(_masked_attention(scale_first), [_feeds(s) for s in range(4)])
        mms = [n.name for n in q.nodes if n.op == "QMatMul"]
        assert len(mms) == 2, [n.op for n in q.nodes]
        assert not any(n.op == "MatMul" for n in q.nodes)  # every product integer
        model = AccelModel.build(q)
        assert all(model.placements[n].target == "accel" for n in mms), \
            {n: model.placements[n] for n in mms}
        adds = [n for n in q.nodes if n.op == "Add" and "mask" in n.inputs]
        assert len(adds) == 1
        reason = model.placements[adds[0].name].reason
        assert "float" in reason and "'mask'" in reason, reason  # the mask is float data
        cpu = model.cpu_build()
        for seed in (10, 11):
            feeds = _feeds(seed)
            want = cpu.run(feeds)["y"]
            for target in ("fsim", "cycle"):
                np.testing.assert_array_equal(model.run(feeds, target=target)["y"], want)


def test_a_non_float_or_constant_operand_is_left_alone():
    """A MatMul with a constant weight is a QGemm's business (its epilogue stays fused)."""
    c = helper.make_node
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    m = make_model([c("MatMul", ["x", "w"], ["m"]), c("Add", ["m", "b"], ["y"])],
                   [vi("x", [2, 4]), vi("b", [2, 4])], [vi("y", [2, 4], TensorProto.FLOAT)], [w])
    g = optimize(import_onnx(m))
    assert split_matmul_epilogues(g) is g


def _mobilebert_block(seed=0, seq=8, dim=32):
    """MobileBERT's shapes: a dense layer + a constant [1, S, D] (position embeddings, not
    per channel), then dense layers ending in + bias + residual, * gamma + beta (NoNorm)."""
    c = helper.make_node
    rng = np.random.default_rng(seed)
    f = {"w0": rng.normal(size=(dim, dim)) / np.sqrt(dim), "pos": rng.normal(size=(1, seq, dim)),
         "w1": rng.normal(size=(dim, dim)) / np.sqrt(dim), "b1": rng.normal(size=dim) * 0.1,
         "g1": rng.uniform(0.5, 1.5, dim), "be1": rng.normal(size=dim) * 0.1}
    nodes = [c("MatMul", ["x", "w0"], ["m0"]), c("Add", ["m0", "pos"], ["e"]),
             c("MatMul", ["e", "w1"], ["m1"]), c("Add", ["m1", "b1"], ["a1"]),
             c("Add", ["a1", "e"], ["r1"]), c("Mul", ["r1", "g1"], ["n1"]),
             c("Add", ["n1", "be1"], ["y"])]
    model = make_model(nodes, [vi("x", [1, seq, dim])], [vi("y", [1, seq, dim])],
                       [numpy_helper.from_array(v.astype(np.float32), k) for k, v in f.items()])
    return model, lambda s: {"x": np.random.default_rng(s).normal(
        size=(1, seq, dim)).astype(np.float32)}


def test_a_dense_layer_keeps_the_epilogue_it_can_take():
    from celosia.compiler.graph.matmul_epilogue import split_layer_epilogues
    from celosia.compiler.graph.quantize import _Layer, _layer_form

    model, feeds = _mobilebert_block()
    g = optimize(import_onnx(model))
    assert [n.op for n in g.nodes] == ["MatMul", "MatMul"]  # both epilogues fused

    def takes(graph, node):
        return isinstance(_layer_form(graph, node), _Layer)

    assert not any(takes(g, n) for n in g.nodes)
    s = split_layer_epilogues(g, takes)
    # the second layer keeps bias + residual (an int8 layer takes a residual sum)
    assert [n.op for n in s.nodes] == ["MatMul", "Add", "MatMul", "Mul", "Add"]
    assert [st[0] for st in s.nodes[2].attrs["epilogue"]] == ["Add", "Add"]
    assert all(takes(s, n) for n in s.nodes if n.op == "MatMul")
    assert split_layer_epilogues(s, takes) is s
    np.testing.assert_allclose(run_graph(s, feeds(1))["y"], run_graph(g, feeds(1))["y"],
                               rtol=1e-6, atol=1e-6)
    q = quantize_model(model, [feeds(k) for k in range(4)])
    layers = [n.name for n in q.nodes if n.op == "QGemm"]
    assert len(layers) == 2 and not any(n.op == "MatMul" for n in q.nodes)
    # quantize_model splits first, so the residual sum is float as for any dense layer
    # (residual.py): an Add reading the residual 'e' beside the NoNorm's Mul and Add
    assert [n.op for n in q.nodes if n.op != "Quantize" and ("e" in n.inputs or n.op == "Mul")] \
        == ["Add", "Mul"]
    built = AccelModel.build(q)
    assert all(built.placements[n].target == "accel" for n in layers)
    want = built.cpu_build().run(feeds(10))["y"]
    for target in ("fsim", "cycle"):
        np.testing.assert_array_equal(built.run(feeds(10), target=target)["y"], want)
