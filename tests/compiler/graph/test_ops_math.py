"""Element-wise math and logic, the extra reductions, ArgMax/ArgMin, TopK, CumSum and
Einsum (compiler/graph/ops_math.py): each against onnxruntime over its attributes, opset
versions and dtypes, through import + reference executor and the compiled CpuModel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_nodes import check_node

RNG = np.random.default_rng(1234)


def _normal(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _ints(*shape, lo=-20, hi=20, dtype=np.int32, seed=0):
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(dtype)


@pytest.mark.parametrize("op, opsets", [
    ("Erf", (11, 13)), ("Sin", (11, 21)), ("Cos", (11, 21)), ("Round", (11, 21)),
    ("Sign", (11, 13)), ("IsNaN", (11, 13, 20))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_float(op, opsets, dtype):
    x = _normal(3, 4, 5, dtype=dtype) * 3
    x[0, 0, :3] = [0.5, 1.5, -2.5]  # Round's halves go to even
    if op == "IsNaN":
        x[1, 1, ::2] = np.nan
    # onnxruntime has no double Erf: onnx's reference evaluator is the oracle there.
    which = "onnx" if op == "Erf" and dtype == np.float64 else "onnxruntime"
    for opset in opsets:
        check_node(op, ["x"], {"x": x}, opset=opset, which=which)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_sign_integer(dtype):
    check_node("Sign", ["x"], {"x": _ints(4, 6, dtype=dtype)}, opset=13)


@pytest.mark.parametrize("negative, positive", [(1, 1), (0, 1), (1, 0), (0, 0)])
@pytest.mark.parametrize("opset", [11, 20])
def test_is_inf(negative, positive, opset):
    x = _normal(4, 5)
    x[0, :4] = [np.inf, -np.inf, np.nan, 0]
    check_node("IsInf", ["x"], {"x": x}, opset=opset,
               attrs={"detect_negative": negative, "detect_positive": positive})


@pytest.mark.parametrize("dtype, fmod", [(np.int32, 0), (np.int64, 0), (np.int32, 1),
                                         (np.int64, 1), (np.float32, 1), (np.float64, 1)])
@pytest.mark.parametrize("opset", [11, 13])
def test_mod(dtype, fmod, opset):
    a = _ints(3, 4, 5, lo=-50, hi=50, dtype=dtype, seed=1)
    b = _ints(4, 1, lo=1, hi=9, dtype=dtype, seed=2) * np.where(_ints(4, 1, seed=3) < 0, -1, 1
                                                                ).astype(dtype)
    if dtype in (np.float32, np.float64):
        a = a + _normal(3, 4, 5, dtype=dtype)
    check_node("Mod", ["a", "b"], {"a": a, "b": b}, opset=opset, attrs={"fmod": fmod})


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift(dtype, direction):
    bits = np.dtype(dtype).itemsize * 8
    x = _ints(3, 8, lo=0, hi=200, dtype=dtype, seed=4)
    y = _ints(8, lo=0, hi=bits, dtype=dtype, seed=5)
    check_node("BitShift", ["x", "y"], {"x": x, "y": y}, opset=11,
               attrs={"direction": direction})


@pytest.mark.parametrize("op, dtype", [
    (op, dtype) for op in ("GreaterOrEqual", "LessOrEqual")
    for dtype in (np.float32, np.int32, np.int64)] + [("Xor", np.bool_)])
@pytest.mark.parametrize("opset", [12, 16, 21])
def test_comparisons_and_xor(op, dtype, opset):
    x = _ints(2, 3, 4, lo=-3, hi=3, seed=6).astype(dtype)
    y = _ints(3, 1, lo=-3, hi=3, seed=7).astype(dtype)  # broadcast, many equal pairs
    check_node(op, ["x", "y"], {"x": x, "y": y}, opset=opset)


_REDUCE_OPS = ["ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", _REDUCE_OPS)
@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axes", [None, [1], [-1, 0]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions(op, opset, axes, keepdims):
    x = _normal(3, 4, 5, seed=8)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    if op == "ReduceLogSumExp":
        x = x * 30  # exp overflows without the shift by the maximum
    attrs, inputs, consts = {"keepdims": keepdims}, ["x"], {}
    if axes is not None and opset >= 18:
        inputs, consts = ["x", "axes"], {"axes": np.array(axes, np.int64)}
    elif axes is not None:
        attrs["axes"] = axes
    check_node(op, inputs, {"x": x}, consts=consts, attrs=attrs, opset=opset, rtol=1e-5)


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reductions_integer(op, dtype):
    check_node(op, ["x"], {"x": _ints(4, 6, dtype=dtype, seed=9)}, attrs={"axes": [1]},
               opset=13)


@pytest.mark.parametrize("op", _REDUCE_OPS)
def test_reductions_over_nothing(op):
    """An empty reduction is 0 for the sums and -inf for the logs (onnx's reference: the
    case onnxruntime rejects)."""
    check_node(op, ["x", "axes"], {"x": np.zeros((2, 0, 4), np.float32)},
               consts={"axes": np.array([1], np.int64)}, opset=18, which="onnx")


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("opset, last", [(11, 0), (12, 0), (12, 1), (13, 0), (13, 1)])
@pytest.mark.parametrize("axis", [0, 2, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg_extremes(op, opset, axis, keepdims, last):
    x = _ints(3, 4, 5, lo=-3, hi=3, seed=10).astype(np.float32)  # many ties
    attrs = {"axis": axis, "keepdims": keepdims, **({"select_last_index": last} if last
                                                     else {})}
    check_node(op, ["x"], {"x": x}, attrs=attrs, opset=opset)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("k", [0, 3, 6])
def test_top_k(dtype, axis, largest, k):
    x = _ints(4, 6, 6, lo=-4, hi=4, dtype=dtype, seed=11)  # ties: lower index first
    check_node("TopK", ["x", "k"], {"x": x}, consts={"k": np.array([k], np.int64)},
               attrs={"axis": axis, "largest": largest}, opset=11, outputs=2)


def test_top_k_unsorted_and_distinct_values():
    x = RNG.permutation(60).reshape(3, 20).astype(np.float32)
    check_node("TopK", ["x", "k"], {"x": x}, consts={"k": np.array([5], np.int64)},
               attrs={"sorted": 0}, opset=21, outputs=2, sort_axis=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("opset", [11, 14])
def test_cum_sum(dtype, axis, exclusive, reverse, opset):
    x = _ints(3, 4, 5, dtype=dtype, seed=12)
    check_node("CumSum", ["x", "axis"], {"x": x}, consts={"axis": np.array(axis, np.int32)},
               attrs={"exclusive": exclusive, "reverse": reverse}, opset=opset)


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 2)]),
    ("ii->i", [(4, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("i,i", [(6,), (6,)]),
    ("ij->", [(3, 4)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_einsum(equation, shapes, dtype):
    feeds = {f"x{k}": _ints(*s, lo=-5, hi=5, dtype=dtype, seed=13 + k) if dtype == np.int32
             else _normal(*s, seed=13 + k) for k, s in enumerate(shapes)}
    check_node("Einsum", list(feeds), feeds, attrs={"equation": equation}, opset=12,
               rtol=1e-5, atol=1e-5)
