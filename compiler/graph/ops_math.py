"""numpy definitions of the element-wise math and logic operators, the extra reductions
(L1, L2, LogSum, LogSumExp, SumSquare), scans (CumSum), selections (ArgMax, ArgMin, TopK)
and Einsum. ops.py merges ``KERNELS`` and ``SHAPE_RULES`` into its tables; this module
imports nothing of ops.py, so there is no cycle.

Kernels take attributes in the importer's canonical form (frontend/canonical.py): ``k`` of
TopK and ``axis`` of CumSum are attributes, axes are non-negative.
"""

from __future__ import annotations

import string

import numpy as np
from scipy import special

from .ir import NodeError, TensorType

__all__ = ["KERNELS", "SHAPE_RULES", "erf", "one_value", "scan"]


def _same_type(fn):
    """A unary float function whose result keeps the input's dtype."""
    return lambda attrs, x: fn(x).astype(x.dtype, copy=False)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function (scipy's: numpy has none), in the input's float type."""
    return special.erf(x).astype(x.dtype, copy=False)


def mod(attrs, a, b):
    # fmod=1 is C's fmod (the sign of the dividend); fmod=0 Python's % (the sign of the
    # divisor), which opset 28 extends to floats with numpy's special cases.
    return (np.fmod if attrs.get("fmod", 0) else np.mod)(a, b).astype(a.dtype, copy=False)


def bit_shift(attrs, x, y):
    """Shifts; an amount past the type's width (or negative) gives what the sign alone
    gives, as opset 28 defines (numpy's own shifts are undefined there)."""
    bits = x.dtype.itemsize * 8
    ok = (y >= 0) & (y < bits)
    amount = np.where(ok, y, 0).astype(x.dtype)
    if attrs["direction"] == "LEFT":
        return np.where(ok, np.left_shift(x, amount), x.dtype.type(0)).astype(x.dtype)
    sign = (x < 0).astype(x.dtype) * x.dtype.type(-1) if x.dtype.kind == "i" else 0
    return np.where(ok, np.right_shift(x, amount), sign).astype(x.dtype)


def is_inf(attrs, x):
    y = np.isinf(x)
    if not attrs.get("detect_negative", 1):
        y &= x > 0
    if not attrs.get("detect_positive", 1):
        y &= x < 0
    return y


# ---- reductions -------------------------------------------------------------------------


def _reduction(fn, empty):
    """A reduction over ``axes`` (None: all) computed in the input's type; ``empty`` is
    its value over no elements (ONNX: 0 for sums, -inf for logs of sums)."""

    def kernel(attrs, x):
        axes = attrs.get("axes")
        axes = tuple(range(x.ndim)) if axes is None else tuple(axes)
        keep = bool(attrs.get("keepdims", 1))
        if any(x.shape[a] == 0 for a in axes):
            shape = [1 if a in axes else d for a, d in enumerate(x.shape)]
            y = np.full(shape, empty, x.dtype)
            return y if keep else y.reshape([d for a, d in enumerate(x.shape) if a not in axes])
        return np.asarray(fn(x, axes, keep)).astype(x.dtype, copy=False)
    return kernel


def _log_sum_exp(x, axes, keep):
    # Shifted by the maximum so large inputs do not overflow exp.
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    y = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return y if keep else np.squeeze(y, axis=axes)


def _sum(x, axes, keep):
    return np.sum(x, axis=axes, keepdims=keep, dtype=x.dtype)


def _l2(x, axes, keep):
    s = _sum(x * x, axes, keep)
    # Integer inputs: the square root in float64, truncated back (as onnxruntime does).
    return np.sqrt(s) if s.dtype.kind == "f" else np.floor(np.sqrt(s.astype(np.float64)))


# ---- selections and scans ---------------------------------------------------------------


def arg_extreme(largest):
    def kernel(attrs, x):
        axis = attrs["axis"]
        pick = np.argmax if largest else np.argmin
        if attrs.get("select_last_index", 0):  # the last of equal extremes
            i = x.shape[axis] - 1 - pick(np.flip(x, axis=axis), axis=axis)
        else:
            i = pick(x, axis=axis)
        i = i.astype(np.int64)
        return np.expand_dims(i, axis) if attrs.get("keepdims", 1) else i
    return kernel


def one_value(v, what) -> int:
    """A compile-time-shaped input given at run time (ONNX's TopK K, OneHot depth)."""
    if np.size(v) != 1:
        raise ValueError(f"{what} must hold one value, not shape {list(np.shape(v))}")
    return int(np.reshape(v, -1)[0])


def top_k(attrs, x, k=None):
    """The k largest (or smallest) along ``axis``, sorted; equal values in index order.
    Canonical: ``k`` an attribute; in run-time form (graph/dynamic.py) ONNX's K input and
    axis, which may be negative."""
    axis = attrs.get("axis", -1)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for rank {x.ndim}")
    axis %= x.ndim
    k = attrs["k"] if k is None else one_value(k, "K")
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"k={k} is outside [0, {n}] (the size of axis {axis})")
    if attrs.get("largest", 1):
        # Descending with ties by lower index: a stable ascending sort of the reversed
        # axis, read backwards.
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis=axis), axis=axis, kind="stable"),
                                axis=axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    index = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return np.take_along_axis(x, index, axis=axis), index


def scan(attrs, x, fn, identity):
    """CumSum's and CumProd's scan ``fn`` (np.cumsum, np.cumprod) along ``axis``: reversed,
    and exclusive (each result without its own element: shifted by one, ``identity``
    first) as the attributes say."""
    axis = attrs["axis"]
    y = np.flip(x, axis) if attrs.get("reverse", 0) else x
    y = fn(y, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive", 0):
        head = np.full_like(np.take(y, [0], axis=axis), identity)
        y = np.concatenate([head, np.take(y, np.arange(y.shape[axis] - 1), axis=axis)],
                           axis=axis)
    return np.ascontiguousarray(np.flip(y, axis) if attrs.get("reverse", 0) else y)


def cum_sum(attrs, x):
    return scan(attrs, x, np.cumsum, 0)


# ---- Einsum -----------------------------------------------------------------------------


def einsum(attrs, *xs):
    eq = attrs["equation"].replace(" ", "")
    # optimize: contractions through BLAS (7x faster on attention's bhqd,bhkd->bhqk).
    y = np.einsum(eq, *xs, optimize=True)
    return np.asarray(y).astype(xs[0].dtype, copy=False)


def _einsum_terms(node, equation, ranks):
    """(input terms, output term) with '...' as one character '.', the implicit output
    (ellipsis then the letters used once, sorted) made explicit."""
    eq = equation.replace(" ", "").replace("...", ".")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise NodeError(node, f"equation {equation!r} has {len(terms)} operands, the node "
                              f"{len(ranks)}")
    letters = set(string.ascii_letters + ".")
    if any(set(t) - letters for t in terms + [rhs]):
        raise NodeError(node, f"equation {equation!r}: only letters, ',', '->' and '...'")
    if not arrow:
        once = sorted(c for c in set(lhs) - {",", "."} if lhs.count(c) == 1)
        rhs = ("." if "." in lhs else "") + "".join(once)
    return terms, rhs


def _einsum_types(node, types):
    """Output shape from the equation alone (the kernel would run the full contraction)."""
    terms, rhs = _einsum_terms(node, node.attrs["equation"], [len(t.shape) for t in types])
    sizes, ellipses = {}, []
    for term, t in zip(terms, types):
        named = len(term) - ("." in term)
        if named > len(t.shape) or ("." not in term and named != len(t.shape)):
            raise NodeError(node, f"term {term!r} does not fit the operand {t}")
        head = term.index(".") if "." in term else len(term)
        extra = len(t.shape) - named
        ellipses.append(t.shape[head:head + extra])
        dims = list(t.shape[:head]) + list(t.shape[head + extra:])
        for c, d in zip(term.replace(".", ""), dims):
            if sizes.setdefault(c, d) != d and 1 not in (sizes[c], d):
                raise NodeError(node, f"index {c!r} is {sizes[c]} in one operand and {d} in "
                                      "another")
            sizes[c] = max(sizes[c], d)
    try:
        ellipsis = np.broadcast_shapes(*ellipses)
    except ValueError:
        raise NodeError(node, f"the '...' parts {ellipses} do not broadcast") from None
    shape = []
    for c in rhs:
        if c == ".":
            shape += ellipsis
        elif c not in sizes:
            raise NodeError(node, f"output index {c!r} is in no operand")
        else:
            shape.append(sizes[c])
    return [TensorType(types[0].dtype, tuple(int(d) for d in shape))]


def _top_k_types(node, types):
    x = types[0]
    a = node.attrs
    if not 0 <= a["k"] <= x.shape[a["axis"]]:
        raise NodeError(node, f"k={a['k']} is outside [0, {x.shape[a['axis']]}] (the size of "
                              f"axis {a['axis']} of {x})")
    shape = list(x.shape)
    shape[a["axis"]] = a["k"]
    return [TensorType(x.dtype, tuple(shape)), TensorType("int64", tuple(shape))]


KERNELS = {
    # element-wise math
    "Erf": lambda a, x: erf(x),
    "Sin": _same_type(np.sin),
    "Cos": _same_type(np.cos),
    "Round": _same_type(np.rint),                           # halves to even
    "Sign": lambda a, x: np.sign(x).astype(x.dtype, copy=False),
    "Mod": mod,
    "IsNaN": lambda a, x: np.isnan(x),
    "IsInf": is_inf,
    # comparison and logic
    "GreaterOrEqual": lambda a, x, y: x >= y,
    "LessOrEqual": lambda a, x, y: x <= y,
    "Xor": lambda a, x, y: np.logical_xor(x, y),
    "BitShift": bit_shift,
    # reductions
    "ReduceL1": _reduction(lambda x, axes, keep: _sum(np.abs(x), axes, keep), 0),
    "ReduceL2": _reduction(_l2, 0),
    "ReduceSumSquare": _reduction(lambda x, axes, keep: _sum(x * x, axes, keep), 0),
    "ReduceLogSum": _reduction(lambda x, axes, keep: np.log(_sum(x, axes, keep)), -np.inf),
    "ReduceLogSumExp": _reduction(_log_sum_exp, -np.inf),
    # selections, scans, contractions
    "ArgMax": arg_extreme(largest=True),
    "ArgMin": arg_extreme(largest=False),
    "TopK": top_k,
    "CumSum": cum_sum,
    "Einsum": einsum,
}

SHAPE_RULES = {"Einsum": _einsum_types, "TopK": _top_k_types}
