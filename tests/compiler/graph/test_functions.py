"""Operators onnx defines as functions import as their bodies (compiler/frontend/functions.py):
Attention in its forms (4-D and 3-D with grouped heads, causal, masks, a KV cache),
RotaryEmbedding, MeanVarianceNormalization (ops_vision.py's definition since; its body is
expanded below when it is left out of the supported set) and SwiGLU against onnxruntime on
seeded random inputs, through import + reference executor and the compiled CpuModel; a body
that cannot be taken leaves the node to the operator check, which names it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_nodes import check_node

from celosia.compiler.frontend.functions import expand_functions
from celosia.compiler.frontend.onnx import SUPPORTED_OPS, import_onnx


def _normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_attention_4d(causal, mask):
    q, k, v = _normal(2, 4, 5, 8, seed=1), _normal(2, 4, 7, 8, seed=2), _normal(2, 4, 7, 6, seed=3)
    feeds, inputs = {"q": q, "k": k, "v": v}, ["q", "k", "v"]
    if mask == "bool":
        feeds["m"] = np.random.default_rng(4).random((5, 7)) > 0.3
        inputs.append("m")
    elif mask == "float":
        feeds["m"] = _normal(2, 1, 5, 7, seed=4)
        inputs.append("m")
    check_node("Attention", inputs, feeds, opset=23, attrs={"is_causal": causal},
               rtol=1e-5, atol=1e-5)


def test_attention_3d_grouped_heads_with_cache():
    """3-D inputs, 4 query heads over 2 key/value heads, a past cache and its present
    outputs, an explicit scale."""
    q, k, v = _normal(1, 3, 32, seed=1), _normal(1, 3, 16, seed=2), _normal(1, 3, 16, seed=3)
    past_k, past_v = _normal(1, 2, 4, 8, seed=4), _normal(1, 2, 4, 8, seed=5)
    check_node("Attention", ["q", "k", "v", "", "pk", "pv"],
               {"q": q, "k": k, "v": v, "pk": past_k, "pv": past_v}, opset=23, outputs=3,
               attrs={"q_num_heads": 4, "kv_num_heads": 2, "scale": 0.3, "is_causal": 1},
               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("positions", [False, True])
def test_rotary_embedding(interleaved, positions):
    x = _normal(2, 3, 6, 8, seed=1)  # [batch, heads, sequence, head size]
    cos, sin = np.cos(_normal(10, 4, seed=2)), np.sin(_normal(10, 4, seed=3))
    feeds, inputs = {"x": x}, ["x", "cos", "sin"]
    consts = {"cos": cos, "sin": sin}
    if positions:
        consts["pos"] = np.random.default_rng(4).integers(0, 10, (2, 6)).astype(np.int64)
        inputs.append("pos")
    else:
        consts = {"cos": cos[None, :6].repeat(2, 0), "sin": sin[None, :6].repeat(2, 0)}
    check_node("RotaryEmbedding", inputs, feeds, consts=consts, opset=23,
               attrs={"interleaved": interleaved}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axes", [[0, 2, 3], [1], [0, 1, 2, 3]])  # no axes: the onnx case
def test_mean_variance_normalization(axes):
    x = _normal(2, 3, 4, 5) * 3 + 1
    check_node("MeanVarianceNormalization", ["x"], {"x": x}, opset=13,
               attrs={"axes": axes}, rtol=1e-4, atol=1e-5)


def test_expansion_names_and_leaves_the_rest():
    """Body nodes are named under the node; supported nodes and the graph stay as they were,
    and a model with nothing to expand is returned as it is."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MeanVarianceNormalization", ["r"], ["y"], name="mvn")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 13)])
    # MVN has a definition of its own (ops_vision.py): expanded here as if it had none
    supported = set(SUPPORTED_OPS) - {"MeanVarianceNormalization"}
    out = expand_functions(model, 13, supported)
    assert out is not model and len(model.graph.node) == 2  # the caller's model untouched
    assert out.graph.node[0].name == "relu"
    body = out.graph.node[1:]
    assert body and all(n.name.startswith("mvn#1/") for n in body)
    assert body[-1].output[0] == "y" and {n.op_type for n in body} <= supported
    plain = helper.make_model(helper.make_graph(nodes[:1], "g", [x], [helper.make_tensor_value_info(
        "r", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 13)])
    assert expand_functions(plain, 13, supported) is plain
    assert expand_functions(model, 13, SUPPORTED_OPS) is model  # MVN is supported


def test_unusable_body_names_the_node():
    """Bernoulli's body draws random numbers by RandomUniformLike: with neither in the
    supported set, the body is unusable and the node stays as it is, for the operator
    check to name (test_ir.py checks that message); celosia takes Bernoulli itself
    (graph/ops_random.py), unexpanded."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Bernoulli", ["x"], ["y"], name="coin")], "g",
                          [x], [y]), opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model)
    without = tuple(op for op in SUPPORTED_OPS if op not in ("Bernoulli", "RandomUniformLike"))
    assert expand_functions(model, 22, without) is model
    assert [n.op for n in import_onnx(model).nodes] == ["Bernoulli"]
