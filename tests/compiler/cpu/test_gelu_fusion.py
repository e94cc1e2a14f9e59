"""Exact GELU spelt out with Erf (torch's export before opset 20, Hugging Face's form) is
fused into the producing MatMul's epilogue (graph/passes.py's _gelu) and computed there by
the dense kernel; against onnxruntime on seeded random inputs."""

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.runtime.cpu import CpuModel


def _gelu_model(form: str, shape, n: int, seed: int):
    rng = np.random.default_rng(seed)
    k = shape[-1]
    inits = {"w": rng.normal(size=(k, n)) / math.sqrt(k), "b": rng.normal(size=(n,)),
             "sqrt2": np.array(math.sqrt(2)), "inv_sqrt2": np.array(1 / math.sqrt(2)),
             "one": np.array(1.0), "half": np.array(0.5)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["h"])]
    if form == "torch":  # Div, Erf, Add 1, Mul by h, Mul by 0.5
        nodes += [helper.make_node("Div", ["h", "sqrt2"], ["d"]),
                  helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["a"]),
                  helper.make_node("Mul", ["h", "a"], ["g"]),
                  helper.make_node("Mul", ["g", "half"], ["y"])]
    else:  # h * 0.5 * (1 + erf(h * (1/sqrt 2)))
        nodes += [helper.make_node("Mul", ["h", "inv_sqrt2"], ["d"]),
                  helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["one", "e"], ["a"]),
                  helper.make_node("Mul", ["half", "h"], ["g"]),
                  helper.make_node("Mul", ["g", "a"], ["y"])]
    return make_model(nodes, [vi("x", list(shape))], [vi("y", None)],
                      [numpy_helper.from_array(v.astype(np.float32), name)
                       for name, v in inits.items()])


@pytest.mark.parametrize("form,shape,n", [("torch", (2, 7, 24), 40), ("hf", (1, 197, 16), 48),
                                          ("torch", (3, 33), 16)])
def test_gelu_spelt_out_is_one_dense_kernel(form, shape, n):
    m = _gelu_model(form, shape, n, seed=n)
    graph = optimize(import_onnx(m))
    assert [node.op for node in graph.nodes] == ["MatMul"]
    assert graph.nodes[0].attrs["epilogue"][-1] == ("Gelu",)
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32) * 2
    built = CpuModel.build(m, {"x": shape})
    assert not [s for s in built.program.steps if s["kind"] == "numpy"]
    got = built.run({"x": x})["y"]
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_gelu_with_another_reader_is_not_fused():
    """The Erf's output also read elsewhere (a graph output): the nodes stay as they are."""
    m = _gelu_model("torch", (2, 8), 16, seed=2)
    m.graph.output.append(vi("e", None))
    graph = optimize(import_onnx(m))
    assert "Erf" in [node.op for node in graph.nodes]
    x = np.random.default_rng(3).normal(size=(2, 8)).astype(np.float32)
    got = CpuModel.build(m, {"x": x.shape}).run({"x": x})
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, w in zip(got.values(), want):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()
