"""Attention scores plus a run-time mask or bias (compiler/graph/matmul_epilogue.py): the
float graph keeps its outputs, the quantizer makes Q x K^T and P x V QMatMuls (all of the
model's multiply-adds integer) and leaves only the mask Add float with its true reason,
and the accelerator build runs the QMatMuls bit-exact with the all-CPU int8 build on fsim
and the cycle model."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.benchmarks.zoo_int8 import cosine
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


def _conv_blocks(seed=0, c=16, hw=8):
    """A diffusion U-Net's ResNet block (conv + a timestep embedding [1, C, 1, 1] computed
    from a model input, broadcast over the image) and EfficientDet's BiFPN fusion (a conv
    whose output, scaled by a constant weight, is summed with two other weighted run-time
    inputs and goes through SiLU): fuse_epilogues folds both sums into the convolutions;
    and a convolution gated by a run-time value of its shape, then SiLU (``gated``)."""
    c_ = helper.make_node
    rng = np.random.default_rng(seed)
    f = {"w0": rng.normal(size=(c, c, 3, 3)) / np.sqrt(9 * c), "b0": rng.normal(size=c) * 0.1,
         "wt": rng.normal(size=(4, c)) / 2, "w1": rng.normal(size=(c, c, 1, 1)) / np.sqrt(c),
         "b1": rng.normal(size=c) * 0.1, "w2": rng.normal(size=(c, c, 1, 1)) / np.sqrt(c),
         "w3": rng.normal(size=(c, c, 1, 1)) / np.sqrt(c),
         "k1": np.array(0.4), "k2": np.array(0.35), "k3": np.array(0.25),
         "shape": np.array([1, c, 1, 1])}
    nodes = [c_("MatMul", ["t", "wt"], ["te0"]), c_("Reshape", ["te0", "shape"], ["te"]),
             c_("Conv", ["x", "w0", "b0"], ["h0"], pads=[1, 1, 1, 1], name="block"),
             c_("Add", ["h0", "te"], ["h"]),
             c_("Conv", ["h", "w1", "b1"], ["p0"], name="pw"), c_("Mul", ["p0", "k1"], ["p1"]),
             c_("Conv", ["x", "w2"], ["q0"]), c_("Mul", ["q0", "k2"], ["q1"]),
             c_("Mul", ["h", "k3"], ["r1"]),
             c_("Add", ["p1", "q1"], ["s0"]), c_("Add", ["s0", "r1"], ["s1"]),
             c_("Sigmoid", ["s1"], ["g"]), c_("Mul", ["s1", "g"], ["y"]),
             c_("Conv", ["x", "w3"], ["u0"], name="gated"), c_("Mul", ["u0", "h"], ["u1"]),
             c_("Sigmoid", ["u1"], ["ug"]), c_("Mul", ["u1", "ug"], ["z"])]
    inits = [numpy_helper.from_array(v.astype(np.int64 if k == "shape" else np.float32), k)
             for k, v in f.items()]
    model = make_model(nodes, [vi("x", [1, c, hw, hw]), vi("t", [1, 4])],
                       [vi("y", [1, c, hw, hw]), vi("z", [1, c, hw, hw])], inits)

    def feeds(s):
        r = np.random.default_rng(s)
        return {"x": r.normal(size=(1, c, hw, hw)).astype(np.float32),
                "t": r.normal(size=(1, 4)).astype(np.float32)}
    return model, feeds


def test_a_convolution_keeps_the_epilogue_it_can_take():
    """Before, both convolutions stayed float ("its epilogue adds a run-time value of type
    float32[1,16,1,1], broadcast ...", "... a second run-time value ...")."""
    from celosia.compiler.graph.matmul_epilogue import split_layer_epilogues
    from celosia.compiler.graph.quantize import _Layer, _layer_form

    model, feeds = _conv_blocks()
    g = optimize(import_onnx(model))

    def takes(graph, node):
        return isinstance(_layer_form(graph, node), _Layer)

    convs = {n.name: n for n in g.nodes if n.op == "Conv"}
    assert not any(takes(g, convs[k]) for k in ("block", "pw", "gated"))
    s = split_layer_epilogues(g, takes)
    assert all(takes(s, n) for n in s.nodes if n.op == "Conv")
    assert split_layer_epilogues(s, takes) is s
    layers = {n.name: n for n in s.nodes if n.op == "Conv"}
    # BiFPN's two residuals are summed first: the layer keeps one, and its SiLU as a table
    assert [st[0] for st in layers["pw"].attrs["epilogue"]] == ["Mul", "Add", "SiLU"]
    assert any(n.op == "Add" and n.name.startswith("pw/") for n in s.nodes)
    # the gated one: Conv, then Mul, and its SiLU as x * Sigmoid(x)
    after = [n.op for n in s.nodes if n.name.startswith("gated/")]
    assert after == ["Mul", "Sigmoid", "Mul"], after
    for seed in (1, 2):
        want, got = run_graph(g, feeds(seed)), run_graph(s, feeds(seed))
        for k in ("y", "z"):
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)

    # (16 samples: with fewer the embedding's range from a 4-wide input is not covered)
    q = quantize_model(model, [feeds(k) for k in range(16)])
    assert not any(n.op == "Conv" for n in q.nodes), [n.op for n in q.nodes]
    built = AccelModel.build(q)
    layers = [n.name for n in q.nodes if n.op == "QConv"]  # (the constant scaling h too)
    assert {"block", "pw", "gated"} <= set(layers)
    assert all(built.placements[n].target == "accel" for n in layers)
    float_want = run_graph(optimize(import_onnx(model)), feeds(10))
    want = built.cpu_build().run(feeds(10))
    for k in ("y", "z"):
        assert cosine(want[k], float_want[k]) > 0.998, (k, cosine(want[k], float_want[k]))
        for target in ("fsim", "cycle"):
            np.testing.assert_array_equal(built.run(feeds(10), target=target)[k], want[k])


def _constant_queries(seed=0, heads=2, nq=6, seq=16, dim=32):
    """DETR's cross-attention: learned queries (constant once their projection is folded)
    times the image's keys, per head (``scores``: constant [1, H, Q, d] x Transpose(k));
    and a 2-D constant times a run-time [1, D, S] (``pooled``: a constant on the left)."""
    c = helper.make_node
    rng = np.random.default_rng(seed)
    hd = dim // heads
    f = {"wk": rng.normal(size=(dim, dim)) / np.sqrt(dim),
         "q": rng.normal(size=(1, heads, nq, hd)) / np.sqrt(hd),
         "wv": rng.normal(size=(dim, dim)) / np.sqrt(dim),
         "pool": rng.normal(size=(nq, seq)) / np.sqrt(seq)}
    consts = {"split": np.array([1, seq, heads, hd], np.int64)}
    nodes = [c("MatMul", ["x", "wk"], ["k0"]), c("Reshape", ["k0", "split"], ["k1"]),
             c("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
             c("MatMul", ["q", "kt"], ["s"], name="scores"),
             c("Softmax", ["s"], ["y"], axis=-1),
             c("MatMul", ["x", "wv"], ["v"]),
             c("MatMul", ["pool", "v"], ["z"], name="pooled")]
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in f.items()] + \
        [numpy_helper.from_array(v, k) for k, v in consts.items()]
    model = make_model(nodes, [vi("x", [1, seq, dim])],
                       [vi("y", [1, heads, nq, seq]), vi("z", [1, nq, dim])], inits)
    return model, lambda s: {"x": np.random.default_rng(s).normal(
        size=(1, seq, dim)).astype(np.float32)}


def test_a_constant_times_a_run_time_value_runs_on_the_accelerator():
    """Before, both products stayed float: "its weight ... is computed at run time"."""
    from celosia.compiler.graph.matmul_epilogue import swap_constant_lhs

    model, feeds = _constant_queries()
    g = optimize(import_onnx(model))
    s = swap_constant_lhs(g)
    assert swap_constant_lhs(s) is s
    # the keys' Transpose and the swap of 'scores' are one Transpose; each product's
    # result is transposed back, and 'pooled' transposes its data
    assert sum(n.op == "Transpose" for n in s.nodes) == sum(
        n.op == "Transpose" for n in g.nodes) + 3
    for seed in (1, 2):
        want, got = run_graph(g, feeds(seed)), run_graph(s, feeds(seed))
        for k in ("y", "z"):
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)

    q = quantize_model(model, [feeds(k) for k in range(8)])
    assert not any(n.op == "MatMul" for n in q.nodes), [n.op for n in q.nodes]
    built = AccelModel.build(q)
    for name in ("scores", "pooled"):
        assert built.placements[name].target == "accel", built.placements[name]
    cpu = built.cpu_build()
    for seed in (10, 11):
        float_want, want = run_graph(g, feeds(seed)), cpu.run(feeds(seed))
        for k in ("y", "z"):
            assert cosine(want[k], float_want[k]) > 0.998, (k, cosine(want[k], float_want[k]))
            for target in ("fsim", "cycle"):
                np.testing.assert_array_equal(built.run(feeds(seed), target=target)[k], want[k])
