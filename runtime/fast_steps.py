"""Numpy steps over fixed memory as copies between views made once, or one numpy call.

A ``numpy`` step runs its node through graph/reference.py's evaluate_node: the operator's
dispatch, ``np.errstate``, a fresh result and its copy into the arena, 5-15 microseconds
a step, where the work of a small model's Slice or Pad is well under one. Every value of a
program has a fixed address, so many such steps are, once bound, a few copies between
views made at bind time, each ``np.copyto`` about half a microsecond:

    Slice          one copy of the sliced view (static starts, ends, axes, steps)
    Pad            the input into the middle, then each band: a fill (constant) or a
                   copy of the mirrored, edge or wrapped rows (graph/ops.py's _pad_bands,
                   on the output's own views, in its order)
    Concat         one copy per input into its part of the output
    Transpose      one copy of the transposed view
    Gather         one row of a scalar index (read each run: it may be a run-time value)

or one call of the reference's own function into the output: the unary ufuncs (Tanh,
Neg, Abs), the comparisons (Equal, Less, Greater: ``out=``), and the reductions (the
reference kernel itself, then one copy). Copies move the bytes the reference's indexing
moves and the ufuncs are the reference's, so results are bit for bit the reference's.

``bind_fast(step, arrays)`` is the call, or None when the step is not one of these or its
attributes do not fit its values (a .cel edited by hand): the generic step then runs it
and names the error.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..compiler.graph.ir import Node, NodeError
from ..compiler.graph.ops import KERNELS

__all__ = ["bind_fast"]

_ROW_VIEWS = 1 << 16  # rows of a Gather's data kept as views made once


def bind_fast(s: dict, arr: dict):
    """The call running numpy step ``s`` over the executor's fixed ``arr``, or None."""
    op, ins, outs = s["op"], s["inputs"], s["outputs"]
    attrs = s.get("attrs") or {}
    maker = _MAKERS.get(op)
    if maker is None or len(outs) != 1 or not outs[0] or not ins or not all(ins) \
            or attrs.get("epilogue") or not all(v in arr for v in (*ins, outs[0])):
        return None
    xs, y = [arr[v] for v in ins], arr[outs[0]]
    if not all(isinstance(a, np.ndarray) for a in (*xs, y)):
        return None
    try:
        return maker(attrs, xs, y, s)
    except (ValueError, TypeError, IndexError, KeyError):  # attributes that do not fit
        return None


def _copies(pairs: list):
    """One call making each ``np.copyto(dst, src)`` in order."""
    if len(pairs) == 1:
        return partial(np.copyto, *pairs[0])

    def run():
        for dst, src in pairs:
            np.copyto(dst, src)
    return run


def _ints(v) -> bool:
    return isinstance(v, (list, tuple)) and all(type(i) is int for i in v)


def _slice(a, xs, y, s):
    x, = xs
    starts, ends, axes, steps = (a[k] for k in ("starts", "ends", "axes", "steps"))
    if not all(_ints(v) for v in (starts, ends, axes, steps)) \
            or not len(starts) == len(ends) == len(axes) == len(steps):
        return None
    view = KERNELS["Slice"](a, x)  # the reference's own indexing: a view of x
    if view.shape != y.shape or view.dtype != y.dtype:
        return None
    return _copies([(y, view)])


def _pad(a, xs, y, s):
    x, = xs  # (a fill value read at run time: the generic step)
    pads, nd, mode = a["pads"], x.ndim, a.get("mode", "constant")
    if not _ints(pads) or len(pads) != 2 * nd or min(pads, default=0) < 0 \
            or x.dtype != y.dtype:
        return None
    widths = [(pads[i], pads[i + nd]) for i in range(nd)]
    if y.shape != tuple(d + b + e for d, (b, e) in zip(x.shape, widths)):
        return None
    pairs = [(y[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, widths))], x)]
    if mode == "constant":
        fill = np.empty((), x.dtype)
        np.copyto(fill, a.get("value", 0), casting="unsafe")  # as np.full converts it
        for axis, (b, e) in enumerate(widths):
            lead = (slice(None),) * axis
            pairs += [(y[lead + (slice(0, b),)], fill), (y[lead + (slice(y.shape[axis] - e,
                                                                         None),)], fill)]
        return _copies([(d, v) for d, v in pairs if d.size])
    fits = {"reflect": lambda d, b, e: max(b, e) <= d - 1,
            "edge": lambda d, b, e: d >= 1, "wrap": lambda d, b, e: max(b, e) <= d}.get(mode)
    if fits is None or not all(fits(d, b, e) for d, (b, e) in zip(x.shape, widths)):
        return None
    for axis, (d, (b, e)) in enumerate(zip(x.shape, widths)):  # ops._pad_bands, on y
        if not b and not e:
            continue
        v = y.swapaxes(0, axis)
        end = b + d
        if mode == "reflect":
            pairs += [(v[:b], v[2 * b:b:-1]),
                      (v[end:end + e], v[end - 2:end - 2 - e:-1] if end - 2 - e >= 0
                       else v[end - 2::-1][:e])]
        elif mode == "edge":
            pairs += [(v[:b], v[b:b + 1]), (v[end:], v[end - 1:end])]
        else:
            pairs += [(v[:b], v[d:end]), (v[end:end + e], v[b:b + e])]
    return _copies([(dst, src) for dst, src in pairs if dst.size])


def _concat(a, xs, y, s):
    axis = a["axis"]
    if type(axis) is not int or not 0 <= axis < y.ndim \
            or any(x.ndim != y.ndim or x.dtype != y.dtype for x in xs):
        return None
    pairs, at = [], 0
    lead = (slice(None),) * axis
    for x in xs:
        n = x.shape[axis]
        part = y[lead + (slice(at, at + n),)]
        if part.shape != x.shape:
            return None
        pairs.append((part, x))
        at += n
    if at != y.shape[axis]:
        return None
    return _copies([(d, x) for d, x in pairs if x.size])


def _transpose(a, xs, y, s):
    x, = xs
    perm = a["perm"]
    if not _ints(perm) or sorted(perm) != list(range(x.ndim)):
        return None
    view = x.transpose(perm)
    if view.shape != y.shape or view.dtype != y.dtype:
        return None
    return _copies([(y, view)])


def _gather(a, xs, y, s):
    """Gather of one index (x_t of a sequence, a layer of a state): the row copied."""
    x, index = xs
    axis = a.get("axis", 0)
    if index.shape != () or index.dtype.kind != "i" or x.ndim < 1 or type(axis) is not int \
            or not -x.ndim <= axis < x.ndim:
        return None
    axis %= x.ndim
    if x.shape[:axis] + x.shape[axis + 1:] != y.shape or x.dtype != y.dtype:
        return None
    lead, n = (slice(None),) * axis, x.shape[axis]
    rows = [x[lead + (k,)] for k in range(n)] if n <= _ROW_VIEWS else None
    node = Node(s["op"], tuple(s["inputs"]), tuple(s["outputs"]), a, s["node"])

    def gather():
        i = int(index)
        if not -n <= i < n:
            raise NodeError(node, f"failed at run time: index {i} is out of bounds for "
                                  f"axis {axis} with size {n}")
        np.copyto(y, rows[i] if rows is not None else x[lead + (i,)])
    return gather


def _ufunc(fn, dtypes):
    def make(a, xs, y, s):
        if len(xs) != 1 or xs[0].dtype != y.dtype or xs[0].dtype not in dtypes \
                or xs[0].shape != y.shape:
            return None
        return partial(fn, xs[0], out=y)
    return make


def _compare(fn):
    def make(a, xs, y, s):
        if len(xs) != 2 or y.dtype != bool or xs[0].dtype != xs[1].dtype \
                or np.broadcast_shapes(xs[0].shape, xs[1].shape) != y.shape:
            return None
        return partial(fn, xs[0], xs[1], out=y)
    return make


def _reduce(a, xs, y, s):
    x, = xs
    axes = a.get("axes")
    if not (axes is None or _ints(axes)) or x.dtype != y.dtype:
        return None
    kernel = partial(KERNELS[s["op"]], a, x)
    with np.errstate(all="ignore"):  # (x holds no values yet)
        if kernel().shape != y.shape:
            return None
    if s["op"] in ("ReduceMean", "ReduceSum") and x.dtype.kind == "f" and x.size:
        return _float_sum(a, x, y, s["op"] == "ReduceMean")

    def run():
        with np.errstate(all="ignore"):  # as evaluate_node
            np.copyto(y, kernel())
    return run


def _float_sum(a, x, y, mean: bool):
    """np.sum / np.mean of floats as numpy computes them (numpy's _methods._mean: the sum
    by np.add.reduce in the input's type, then a true division by the count), into y."""
    axes = a.get("axes")
    axis = None if axes is None else tuple(axes)
    keep = bool(a.get("keepdims", 1))
    count = x.size // max(y.size, 1)
    add = partial(np.add.reduce, x, axis=axis, keepdims=keep, out=y)
    if not mean:
        return add

    def run():
        add()
        np.true_divide(y, count, out=y)
    return run


_FLOATS = (np.float32, np.float64)
_MAKERS = {
    "Slice": _slice, "Pad": _pad, "Concat": _concat, "Gather": _gather,
    "Transpose": _transpose,
    "Tanh": _ufunc(np.tanh, _FLOATS), "Neg": _ufunc(np.negative, _FLOATS),
    "Abs": _ufunc(np.abs, _FLOATS),
    "Equal": _compare(np.equal), "Less": _compare(np.less), "Greater": _compare(np.greater),
    **{op: _reduce for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")},
}
