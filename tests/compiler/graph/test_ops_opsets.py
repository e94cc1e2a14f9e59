"""Every new operator at every opset from 11 to 21 that has it (and at 22+ where the
importer takes it), with its default attributes, against onnxruntime: the importer
handles each version's form (attributes that became inputs, renamed defaults)."""

from __future__ import annotations

import numpy as np
import onnx.defs
import pytest
from onnx_nodes import check_node

F = np.random.default_rng(7).standard_normal((2, 3, 4, 4)).astype(np.float32)
I = np.random.default_rng(8).integers(-9, 9, (2, 3, 4, 4)).astype(np.int64)
U = np.random.default_rng(9).integers(0, 9, (2, 3, 4, 4)).astype(np.uint32)
B = F > 0
IDX = np.random.default_rng(10).integers(0, 2, (2, 3, 4, 4)).astype(np.int64)
V = np.random.default_rng(11)
ROIS = np.array([[0, 0, 2, 3], [0.5, 1, 3.5, 2.5], [-1, 1, 2, 4]], np.float32)
BOXES = np.concatenate([V.uniform(0, 4, (1, 8, 2)), V.uniform(5, 8, (1, 8, 2))],
                       -1).astype(np.float32)


def _cases():
    """op -> (inputs, feeds, consts, attrs, outputs, opset-dependent consts)"""
    return {
        "Erf": (["x"], {"x": F}, {}, {}), "Sin": (["x"], {"x": F}, {}, {}),
        "Cos": (["x"], {"x": F}, {}, {}), "Round": (["x"], {"x": F}, {}, {}),
        "Sign": (["x"], {"x": F}, {}, {}), "IsNaN": (["x"], {"x": F}, {}, {}),
        "IsInf": (["x"], {"x": F}, {}, {}), "Mod": (["x", "y"], {"x": I}, {"y": I % 5 + 1}, {}),
        "GreaterOrEqual": (["x", "y"], {"x": F}, {"y": F[:1]}, {}),
        "LessOrEqual": (["x", "y"], {"x": F}, {"y": F[:1]}, {}),
        "Xor": (["x", "y"], {"x": B}, {"y": ~B[:1]}, {}),
        "BitShift": (["x", "y"], {"x": U}, {"y": U % 4}, {"direction": "LEFT"}),
        **{op: (["x"], {"x": F}, {}, {}) for op in (
            "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp")},
        "ReduceLogSum": (["x"], {"x": np.abs(F) + 1}, {}, {}),
        "ArgMax": (["x"], {"x": F}, {}, {}), "ArgMin": (["x"], {"x": F}, {}, {}),
        "TopK": (["x", "k"], {"x": F}, {"k": np.array([2], np.int64)}, {}),
        "CumSum": (["x", "a"], {"x": F}, {"a": np.array(2, np.int64)}, {}),
        "Einsum": (["x", "y"], {"x": F}, {"y": F}, {"equation": "nchw,nchv->nwv"}),
        "LayerNormalization": (["x", "s"], {"x": F}, {"s": F[0, 0, 0]}, {}),
        "GroupNormalization": (["x", "s", "b"], {"x": F}, "group", {"num_groups": 3}),
        "InstanceNormalization": (["x", "s", "b"], {"x": F}, {"s": F[0, :, 0, 0],
                                                            "b": F[1, :, 0, 0]}, {}),
        "LpNormalization": (["x"], {"x": F}, {}, {}), "Hardmax": (["x"], {"x": F}, {}, {}),
        "Gelu": (["x"], {"x": F}, {}, {}), "Mish": (["x"], {"x": F}, {}, {}),
        "Celu": (["x"], {"x": F}, {}, {}), "ThresholdedRelu": (["x"], {"x": F}, {}, {}),
        "Shrink": (["x"], {"x": F}, {}, {}),
        "ConvTranspose": (["x", "w"], {"x": F}, {"w": F[:, :, :3, :3].reshape(3, 2, 3, 3)}, {}),
        "GatherElements": (["x", "i"], {"x": F}, {"i": IDX}, {}),
        "GatherND": (["x", "i"], {"x": F}, {"i": IDX[0, 0, :, :2]}, {}),
        "ScatterElements": (["x", "i", "u"], {"x": F}, {"i": IDX[:1] * 0, "u": F[:1]}, {}),
        "ScatterND": (["x", "i", "u"], {"x": F}, {"i": np.array([[1], [0]]), "u": F}, {}),
        "Trilu": (["x"], {"x": F}, {}, {}), "DepthToSpace": (["x"], {"x": F[:, :1].repeat(4, 1)},
                                                          {}, {"blocksize": 2}),
        "SpaceToDepth": (["x"], {"x": F}, {}, {"blocksize": 2}),
        "OneHot": (["i", "d", "v"], {"i": IDX}, {"d": np.array(3, np.int64),
                                                "v": np.array([0, 1], np.float32)}, {}),
        "Resize": (["x", "roi", "s"], {"x": F}, {"roi": np.array([], np.float32),
                                                "s": np.array([1, 1, 2, 0.5], np.float32)}, {}),
        # the vision operators (ops_vision.py)
        "GridSample": (["x", "g"], {"x": F}, {"g": V.uniform(-1.2, 1.2, (2, 3, 5, 2)).astype(
            np.float32)}, {}),
        "AffineGrid": (["t", "s"], {"t": F[:, :2, 0, :3].copy()},
                       {"s": np.array([2, 3, 4, 5], np.int64)}, {}),
        "NonMaxSuppression": (["b", "s", "m", "i"], {"b": BOXES}, {
            "s": V.random((1, 2, 8)).astype(np.float32), "m": np.array([3], np.int64),
            "i": np.array([0.3], np.float32)}, {}),
        "RoiAlign": (["x", "r", "b"], {"x": F}, {"r": ROIS, "b": np.array([0, 1, 1])}, {}),
        "MaxRoiPool": (["x", "r"], {"x": F}, {"r": np.concatenate(
            [np.array([[0], [1], [1]], np.float32), ROIS], 1)}, {"pooled_shape": [2, 2]}),
        "LRN": (["x"], {"x": F}, {}, {"size": 3}),
        "LpPool": (["x"], {"x": F}, {}, {"kernel_shape": [2, 2]}),
        "GlobalLpPool": (["x"], {"x": F}, {}, {}),
        # (axes given: onnx's strict inference fails on the default, test_ops_vision.py)
        "MeanVarianceNormalization": (["x"], {"x": F}, {}, {"axes": [0, 2, 3]}),
        "MaxUnpool": (["x", "i"], {"x": F[:, :, :2, :2].copy()}, {
            "i": np.arange(0, 96, 4).reshape(2, 3, 2, 2) + (IDX[:, :, :2, :2] > 0)},
            {"kernel_shape": [2, 2], "strides": [2, 2]}),
        "Col2Im": (["x", "i", "b"], {"x": F.reshape(2, 12, 4)[:, :, :4].copy()},
                   {"i": np.array([3, 3], np.int64), "b": np.array([2, 2], np.int64)}, {}),
        "CenterCropPad": (["x", "s"], {"x": F}, {"s": np.array([2, 3, 3, 6], np.int64)}, {}),
        "DeformConv": (["x", "w", "o"], {"x": F, "o": V.normal(0, 1, (2, 8, 3, 3)).astype(
            np.float32)}, {"w": F[:2, :, :2, :2].copy()}, {}),
        # the data-dependent operators (ops_data.py)
        "Compress": (["x", "c"], {"x": F, "c": F[0, 0, 0] > 0}, {}, {"axis": -1}),
        "Unique": (["x"], {"x": I % 3}, {}, {}),
        "Det": (["x"], {"x": F}, {}, {}),
    }


def _versions(op):
    """The opsets from 11 to 21 at which ``op``'s definition changes, and 11 or its first."""
    first = {}
    for opset in range(11, 22):
        try:
            schema = onnx.defs.get_schema(op, opset)
        except onnx.defs.SchemaError:
            continue
        first.setdefault(schema.since_version, opset)
    return sorted(first.values())


_CASES = _cases()
_PARAMS = [(op, opset) for op in _CASES for opset in _versions(op)]


@pytest.mark.parametrize("op, opset", _PARAMS, ids=[f"{op}-{v}" for op, v in _PARAMS])
def test_every_version(op, opset):
    inputs, feeds, consts, attrs = _CASES[op]
    if consts == "group":  # opset 18 scales per group, 21 per channel
        n = 3 if opset < 21 else F.shape[1]
        consts = {"s": np.linspace(0.5, 2, n, dtype=np.float32),
                  "b": np.linspace(-1, 1, n, dtype=np.float32)}
    outputs = 2 if op == "TopK" else 1
    which = "onnx" if op == "GroupNormalization" and opset >= 21 else "onnxruntime"
    check_node(op, inputs, feeds, consts=consts, attrs=attrs, opset=opset, outputs=outputs,
               which=which, rtol=1e-5, atol=1e-5)


def test_opset_28_meanings():
    """Versions past 21 the importer takes (up to 28) that extend a meaning: signed
    BitShift (arithmetic right shift; amounts past the width give the sign alone),
    SpaceToDepth's CRD mode, Mod with fmod=0 on floats. onnxruntime has no opset 28:
    onnx's reference evaluator decides."""
    x = np.random.default_rng(0).integers(-100, 100, (3, 8)).astype(np.int32)
    y = np.array([0, 1, 3, 7, 31, 32, 40, -1], np.int32)
    for direction in ("LEFT", "RIGHT"):
        check_node("BitShift", ["x", "y"], {"x": x}, consts={"y": y}, opset=28, which="onnx",
                   attrs={"direction": direction})
    for mode in ("DCR", "CRD"):
        check_node("SpaceToDepth", ["x"], {"x": F[:, :, :, :4]}, opset=28, which="onnx",
                   attrs={"blocksize": 2, "mode": mode})
    b = np.array([1.5, -2, 3, -0.7], np.float32)
    check_node("Mod", ["a", "b"], {"a": F * 5}, consts={"b": b}, opset=28, which="onnx")
