"""Float residual sums for dense layers (compiler/graph/residual.py): on a random pre-norm
transformer stack the float graph keeps its outputs, the layers stay integer while the
residual Adds stay float with their reason, the int8 build gets closer to float than with
int8 residual sums, and the CPU build is bit-exact with the quantized graph's reference
where its results are integer; a convolution's residual is left fused."""

import numpy as np
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.graph.residual import float_residuals
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.cpu import CpuModel
from celosia.benchmarks.zoo_int8 import cosine as _cosine

B, T, D, F = 2, 8, 32, 64


def _stack(seed, blocks=4):
    """x -> blocks of x + fc2(relu(fc1(LayerNorm(x)))) (pre-norm), biases on every Linear."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], {}, "x"
    for b in range(blocks):
        p = f"b{b}_"
        inits.update({p + "g": rng.uniform(0.5, 1.5, D), p + "be": rng.normal(0, 0.1, D),
                      p + "w1": rng.normal(0, D ** -0.5, (D, F)), p + "c1": rng.normal(0, .1, F),
                      p + "w2": rng.normal(0, F ** -0.5, (F, D)), p + "c2": rng.normal(0, .1, D)})
        nodes += [helper.make_node("LayerNormalization", [x, p + "g", p + "be"], [p + "n"],
                                   axis=-1),
                  helper.make_node("MatMul", [p + "n", p + "w1"], [p + "m1"]),
                  helper.make_node("Add", [p + "m1", p + "c1"], [p + "a1"]),
                  helper.make_node("Relu", [p + "a1"], [p + "r"]),
                  helper.make_node("MatMul", [p + "r", p + "w2"], [p + "m2"]),
                  helper.make_node("Add", [p + "m2", p + "c2"], [p + "a2"]),
                  helper.make_node("Add", [p + "a2", x], [p + "y" if b < blocks - 1 else "y"])]
        x = p + "y"
    model = make_model(nodes, [vi("x", [B, T, D])], [vi("y", None)],
                       [numpy_helper.from_array(v.astype(np.float32), k)
                        for k, v in inits.items()])
    return optimize(import_onnx(model))


def _feeds(seed, n=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (B, T, D)).astype(np.float32)} for _ in range(n)]


def test_float_residuals_keep_the_float_graph():
    g = _stack(0)
    fused = [n for n in g.nodes if n.op in ("MatMul", "Gemm")
             and any(s[0] == "Add" and g.types.get(n.inputs[s[1]]) == g.types[n.outputs[0]]
                     and n.inputs[s[1]] not in g.initializers for s in n.attr("epilogue", ()))]
    assert len(fused) == 4  # fc2 + residual in each block
    f = float_residuals(g)
    assert sum(n.op == "Add" for n in f.nodes) == sum(n.op == "Add" for n in g.nodes) + 4
    assert float_residuals(f) is f  # nothing left to split
    for feeds in _feeds(1, 2):
        np.testing.assert_allclose(run_graph(f, feeds)["y"], run_graph(g, feeds)["y"],
                                   rtol=1e-6, atol=1e-6)


def test_float_residuals_improve_int8_and_stay_bit_exact():
    errs = {}
    for seed in range(3):
        g = _stack(seed)
        calib, test = _feeds(seed + 10, 6), _feeds(seed + 20)[0]
        want = run_graph(g, test)["y"]
        for int8_residuals in (True, False):
            q = quantize_model(g, calib, smooth=None, int8_residuals=int8_residuals)
            layers = [n for n in q.nodes if n.op in ("QGemm", "QMatMul")]
            assert len(layers) == 8  # every Linear is integer either way
            adds = [n for n in q.nodes if n.op == "Add"]
            if int8_residuals:
                assert adds == []
            else:
                assert len(adds) == 4 and all("float" in n.attr("float_reason", "")
                                              for n in adds), [n.attrs for n in adds]
            got = CpuModel.from_graph(q).run(test)["y"]
            ref = run_graph(q, test)["y"]
            if int8_residuals:  # the output is a Dequantize of an integer result
                np.testing.assert_array_equal(got, ref)
            else:  # a float Add's (the float LayerNorms before it: to rounding)
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
            errs.setdefault(int8_residuals, []).append(1 - _cosine(got, want))
    assert all(f < i for f, i in zip(errs[False], errs[True])), errs
    assert np.mean(errs[False]) < 0.7 * np.mean(errs[True]), errs


def test_convolution_residuals_stay_fused():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["y"])]
    g = optimize(import_onnx(make_model(nodes, [vi("x", [1, 4, 6, 6])], [vi("y", None)], [w])))
    assert any(n.attr("epilogue") for n in g.nodes)
    assert float_residuals(g) is g
