"""Normalizations, activations, Hardmax, LpNormalization and ConvTranspose
(compiler/graph/ops_nn.py): each against onnxruntime over its attributes, opset versions
and dtypes, through import + reference executor and the compiled CpuModel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_nodes import check_node


def _normal(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("op, attrs, opset", [
    ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20), ("Gelu", {"approximate": "none"}, 21),
    ("Mish", {}, 18), ("Celu", {}, 12), ("Celu", {"alpha": 0.3}, 21),
    ("ThresholdedRelu", {}, 11), ("ThresholdedRelu", {"alpha": -0.5}, 21),
    ("Shrink", {}, 11), ("Shrink", {"bias": 0.3, "lambd": 1.2}, 21)])
def test_activations(op, attrs, opset):
    x = _normal(2, 3, 4, 5) * 3
    check_node(op, ["x"], {"x": x}, attrs=attrs, opset=opset, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_shrink_other_types(dtype):
    x = (_normal(4, 6, dtype=np.float64) * 5).astype(dtype)
    check_node("Shrink", ["x"], {"x": x}, attrs={"bias": 1.0, "lambd": 2.0}, opset=11)


@pytest.mark.parametrize("axis", [-1, 1, 0])
@pytest.mark.parametrize("outputs", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_normalization(axis, outputs, bias, dtype):
    x = _normal(2, 3, 8, dtype=dtype) * 2 + 1
    shape = x.shape[axis % 3:]
    consts = {"scale": _normal(*shape, dtype=dtype, seed=1)}
    if bias:
        consts["bias"] = _normal(*shape, dtype=dtype, seed=2)
    check_node("LayerNormalization", ["x", *consts], {"x": x}, consts=consts, outputs=outputs,
               attrs={"axis": axis, "epsilon": 1e-3}, opset=17, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("constant", [True, False])
def test_group_normalization(opset, groups, constant):
    """Opset 18 scales per group, 21 per channel; as constants or as inputs (the
    importer's repetition of the per-group ones runs at run time then)."""
    x = _normal(2, 6, 5, 4) * 2 + 1
    n = groups if opset == 18 else 6
    params = {"scale": _normal(n, seed=1), "bias": _normal(n, seed=2)}
    feeds, consts = ({"x": x}, params) if constant else ({"x": x, **params}, {})
    # onnxruntime has no opset-21 GroupNormalization kernel: onnx's evaluator decides there.
    check_node("GroupNormalization", ["x", "scale", "bias"], feeds, consts=consts,
               attrs={"num_groups": groups, "epsilon": 1e-4}, opset=opset, rtol=1e-5,
               atol=1e-5, which="onnxruntime" if opset == 18 else "onnx")


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_instance_normalization(shape, dtype):
    x = _normal(*shape, dtype=dtype) * 3 + 2
    consts = {"scale": _normal(shape[1], dtype=dtype, seed=1),
              "bias": _normal(shape[1], dtype=dtype, seed=2)}
    # onnxruntime has no double InstanceNormalization: onnx's evaluator decides there.
    check_node("InstanceNormalization", ["x", "scale", "bias"], {"x": x}, consts=consts,
               attrs={"epsilon": 1e-4}, opset=11, rtol=1e-5, atol=1e-5,
               which="onnxruntime" if dtype == np.float32 else "onnx")


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization(axis, p):
    x = _normal(3, 4, 5)
    x[1, 1, :] = x[:, 2, 2] = 0  # a zero norm gives 0
    check_node("LpNormalization", ["x"], {"x": x}, attrs={"axis": axis, "p": p}, opset=11)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_hardmax(opset, axis):
    """Opset 11 takes the input as 2-D at ``axis``; 13 works along it."""
    x = np.random.default_rng(3).integers(-3, 3, (3, 4, 5)).astype(np.float32)  # ties
    check_node("Hardmax", ["x"], {"x": x}, attrs={"axis": axis}, opset=opset)


_CONV_TRANSPOSE = [
    # (input shape, weight shape, attributes)
    ((1, 3, 5, 5), (3, 2, 3, 3), {}),
    ((2, 4, 4, 6), (4, 3, 3, 3), {"strides": [2, 2]}),
    ((1, 4, 5, 4), (4, 2, 3, 2), {"strides": [3, 2], "pads": [1, 0, 2, 1]}),
    ((1, 4, 5, 5), (4, 2, 3, 3), {"strides": [2, 2], "output_padding": [1, 1]}),
    ((1, 4, 5, 5), (4, 2, 3, 3), {"dilations": [2, 1], "pads": [1, 1, 1, 1]}),
    ((1, 6, 4, 4), (6, 2, 3, 3), {"group": 3, "strides": [2, 2]}),
    ((2, 8, 3, 3), (8, 1, 4, 4), {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 4, 6, 6), (4, 2, 3, 3), {"strides": [2, 2], "output_shape": [13, 12]}),
    ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),  # larger
    ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8],
                                  "auto_pad": "SAME_UPPER"}),
    ((1, 4, 5, 5), (4, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 4, 5, 5), (4, 2, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 4, 5, 5), (4, 2, 3, 3), {"auto_pad": "VALID", "strides": [1, 2]}),
    ((2, 3, 10), (3, 5, 4), {"strides": [3], "pads": [2, 1]}),
    ((1, 2, 3, 4, 5), (2, 2, 2, 3, 2), {"strides": [2, 1, 2]}),
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", _CONV_TRANSPOSE)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("opset", [11, 21])
def test_conv_transpose(x_shape, w_shape, attrs, bias, opset):
    x = _normal(*x_shape)
    consts = {"w": _normal(*w_shape, seed=1)}
    if bias:
        consts["b"] = _normal(w_shape[1] * attrs.get("group", 1), seed=2)
    check_node("ConvTranspose", ["x", *consts], {"x": x}, consts=consts, attrs=attrs,
               opset=opset, rtol=1e-5, atol=1e-5)


def test_conv_transpose_weight_as_input():
    x, w = _normal(1, 4, 5, 5), _normal(4, 3, 3, 3, seed=1)
    check_node("ConvTranspose", ["x", "w"], {"x": x, "w": w}, attrs={"strides": [2, 2]},
               opset=11, rtol=1e-5, atol=1e-5)
