"""The random operators (compiler/graph/ops_random.py): RandomNormal, RandomUniform, their
*Like forms, Bernoulli and Multinomial. onnxruntime's draws cannot be matched (another
generator): the shapes and dtypes are onnxruntime's, the distributions (mean, spread,
range, frequencies over many seeded draws) the ones the attributes ask for, on both
executors. With a seed, one build gives the sequence of draws a fresh build gives; without
one, every run draws anew; nothing folds or caches a draw."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_nodes import node_model, oracle

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.ir import GraphError
from celosia.compiler.graph.passes import optimize
from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

BUILDS = {"reference": ReferenceModel.load, "cpu": CpuModel.build}
N = 20000  # draws per distribution check: the mean of N normals is within 4/sqrt(N) = 0.03


def _source(op, attrs, *, like=None, opset=21):
    """A model of one random node (reading input "x" of ``like``'s type for the *Like forms,
    Bernoulli and Multinomial)."""
    feeds = {} if like is None else {"x": like}
    inputs = [] if like is None else ["x"]
    return node_model(op, inputs, feeds, attrs=attrs, opset=opset), feeds


def _same_type_as_onnxruntime(model, feeds, got):
    (want,) = oracle(model, feeds)
    assert got.dtype == want.dtype and got.shape == want.shape


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype", [None, TensorProto.FLOAT, TensorProto.DOUBLE])
@pytest.mark.parametrize("op, attrs", [
    ("RandomNormal", {"mean": 2.0, "scale": 3.0}), ("RandomNormal", {}),
    ("RandomUniform", {"low": -2.0, "high": 5.0}), ("RandomUniform", {}),
])
def test_random_distributions(build, dtype, op, attrs):
    attrs = {**attrs, "shape": [4, N // 4], "seed": 3.0,
             **({} if dtype is None else {"dtype": dtype})}
    model, feeds = _source(op, attrs)
    y = BUILDS[build](model).run(feeds)["y0"]
    _same_type_as_onnxruntime(model, feeds, y)
    if op == "RandomNormal":
        mean, scale = attrs.get("mean", 0.0), attrs.get("scale", 1.0)
        assert abs(y.mean() - mean) < 4 * scale / np.sqrt(N)
        assert abs(y.std() - scale) < 0.03 * scale
    else:
        low, high = attrs.get("low", 0.0), attrs.get("high", 1.0)
        assert low <= y.min() and y.max() < high
        assert abs(y.mean() - (low + high) / 2) < 4 * (high - low) / np.sqrt(12 * N)
        # every tenth of the range holds its tenth of the draws
        counts = np.histogram(y, bins=10, range=(low, high))[0]
        assert np.all(np.abs(counts / N - 0.1) < 0.01)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("op, attrs", [
    ("RandomNormalLike", {"mean": -1.0, "scale": 0.5}),
    ("RandomUniformLike", {"low": 1.0, "high": 2.0}),
])
@pytest.mark.parametrize("source, dtype", [
    (np.float32, None), (np.float16, None), (np.float64, TensorProto.FLOAT),
    (np.int64, TensorProto.DOUBLE)])
def test_random_like(build, op, attrs, source, dtype):
    """The input's shape, its type or ``dtype`` (needed for a non-float input)."""
    x = np.zeros((50, N // 50), source)
    attrs = {**attrs, **({} if dtype is None else {"dtype": dtype})}
    model, feeds = _source(op, attrs, like=x)
    y = BUILDS[build](model).run(feeds)["y0"]
    _same_type_as_onnxruntime(model, feeds, y)
    y = y.astype(np.float64)
    if op == "RandomNormalLike":
        assert abs(y.mean() + 1) < 0.02 and abs(y.std() - 0.5) < 0.02
    else:
        assert 1 <= y.min() and y.max() <= 2 and abs(y.mean() - 1.5) < 0.01


def test_random_like_of_an_integer_input_needs_a_dtype():
    model = node_model("RandomUniformLike", ["x"], {"x": np.zeros(3, np.int64)}, infer=False)
    with pytest.raises(GraphError, match=r"node 'RandomUniformLike_0' \(RandomUniformLike\): "
                                         r"output has unsupported type tensor\(int64\)"):
        import_onnx(model)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype", [None, TensorProto.BOOL, TensorProto.INT32,
                                   TensorProto.DOUBLE])
def test_bernoulli(build, dtype):
    p = np.repeat(np.array([[0.0, 0.1, 0.5, 0.9, 1.0]], np.float32), N // 5, axis=0)
    # (opset 21: onnxruntime's Bernoulli-22 is a function of a RandomUniformLike-22 it lacks)
    model, feeds = _source("Bernoulli", {} if dtype is None else {"dtype": dtype}, like=p)
    y = BUILDS[build](model).run(feeds)["y0"]
    _same_type_as_onnxruntime(model, feeds, y)
    assert set(np.unique(y).astype(int)) <= {0, 1}
    freq = y.astype(np.float64).mean(axis=0)
    assert freq[0] == 0 and freq[4] == 1
    np.testing.assert_allclose(freq[1:4], [0.1, 0.5, 0.9], atol=0.025)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype", [None, TensorProto.INT64])
def test_multinomial(build, dtype):
    """Class frequencies of each row follow the softmax of its logits."""
    logits = np.log(np.array([[0.1, 0.2, 0.7, 0.0], [0.25, 0.25, 0.25, 0.25]], np.float32)
                    + 1e-30)
    attrs = {"sample_size": N, **({} if dtype is None else {"dtype": dtype})}
    model, feeds = _source("Multinomial", attrs, like=logits)
    y = BUILDS[build](model).run(feeds)["y0"]
    _same_type_as_onnxruntime(model, feeds, y)
    for row, p in zip(y, np.exp(logits) / np.exp(logits).sum(1, keepdims=True)):
        assert 0 <= row.min() and row.max() < 4
        np.testing.assert_allclose(np.bincount(row, minlength=4) / N, p, atol=0.015)


# ---- seeds, runs and builds -------------------------------------------------------------------


def _noisy_model(seed):
    """RandomNormal [2, 3] (an input-free node: its inputs are all "known") plus a
    constant: what constant folding and the importer's evaluation would fold."""
    attrs = {"shape": [2, 3], **({} if seed is None else {"seed": seed})}
    nodes = [helper.make_node("RandomNormal", [], ["r"], **attrs),
             helper.make_node("Add", ["r", "c"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.ones((2, 3), np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


@pytest.mark.parametrize("build", BUILDS)
def test_seeded_draws_repeat_from_build_to_build(build):
    """With a seed: successive runs differ, and a fresh build repeats the sequence (as a
    fresh onnxruntime session does)."""
    model = _noisy_model(5.0)
    first = [BUILDS[build](model).run({})["y"]]
    a, b = BUILDS[build](model), BUILDS[build](model)
    seq_a = [a.run({})["y"] for _ in range(3)]
    seq_b = [b.run({})["y"] for _ in range(3)]
    for x, y in zip(seq_a, seq_b):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(seq_a[0], first[0])
    assert not np.array_equal(seq_a[0], seq_a[1]) and not np.array_equal(seq_a[1], seq_a[2])
    other = BUILDS[build](_noisy_model(6.0)).run({})["y"]
    assert not np.array_equal(other, seq_a[0])


@pytest.mark.parametrize("build", BUILDS)
def test_unseeded_draws_are_new_every_run(build):
    model = _noisy_model(None)
    a, b = BUILDS[build](model), BUILDS[build](model)
    draws = [a.run({})["y"] for _ in range(3)] + [b.run({})["y"]]
    for i in range(len(draws)):
        for j in range(i):
            assert not np.array_equal(draws[i], draws[j])


@pytest.mark.parametrize("seed", [None, 5.0])
def test_random_nodes_are_never_folded(seed):
    """The importer does not evaluate a random node whose inputs are known, and constant
    folding leaves it (and what reads it) a node."""
    g = optimize(import_onnx(_noisy_model(seed)))
    assert [n.op for n in g.nodes][0] == "RandomNormal" and "y" not in g.initializers
    model, feeds = _source("RandomUniformLike", {"seed": 1.0},
                           like=np.zeros((2, 2), np.float32))
    model.graph.input.pop()  # its input a constant: still drawn at run time
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((2, 2), np.float32), "x"))
    g = optimize(import_onnx(model))
    assert [n.op for n in g.nodes] == ["RandomUniformLike"]
    ref = ReferenceModel.load(model)
    assert not np.array_equal(ref.run({})["y0"], ref.run({})["y0"])


def test_draws_inside_a_loop_are_new_every_iteration():
    """A RandomUniform in a Loop body (its inputs none: invariant to a hoisting pass):
    every iteration draws anew, on both executors."""
    body = helper.make_graph(
        [helper.make_node("RandomUniform", [], ["r"], shape=[4], seed=2.0),
         helper.make_node("Identity", ["cond"], ["c"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", ""], ["rs"], body=body)], "g", [],
        [helper.make_tensor_value_info("rs", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(np.array(3, np.int64), "n")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    for build in BUILDS.values():
        rs = build(model).run({})["rs"]
        assert rs.shape == (3, 4) and len({r.tobytes() for r in rs}) == 3


def test_a_saved_build_repeats_the_seeded_sequence(tmp_path):
    """A .cel holds the node and its seed, not a generator: every load starts the seed's
    sequence, the one the build it was saved from gave."""
    model = _noisy_model(5.0)
    built = CpuModel.build(model)
    built.save(tmp_path / "r.cel")
    want = [built.run({})["y"] for _ in range(2)]
    for _ in range(2):
        loaded = CpuModel.open(tmp_path / "r.cel")
        for w in want:
            np.testing.assert_array_equal(loaded.run({})["y"], w)


@pytest.mark.parametrize("op, attrs, message", [
    ("RandomNormal", {"shape": [2], "scale": 0.0}, r"scale 0.0 must be positive"),
    ("RandomNormalLike", {"scale": -1.0}, r"scale -1.0 must be positive"),
    ("RandomUniform", {"shape": [2], "low": 2.0, "high": 1.0},
     r"low 2.0 must not exceed high 1.0"),
    ("RandomUniformLike", {"low": 0.5, "high": 0.25}, r"low 0.5 must not exceed high 0.25"),
])
def test_spreads_a_distribution_cannot_have(op, attrs, message):
    """Refused at import, naming the node (onnxruntime's normal distribution aborts the
    process on a scale of 0)."""
    like = {} if op in ("RandomNormal", "RandomUniform") else {"x": np.zeros(2, np.float32)}
    model = node_model(op, list(like), like, attrs=attrs, infer=False)
    with pytest.raises(GraphError, match=rf"node '{op}_0' \({op}\): {message}"):
        import_onnx(model)
