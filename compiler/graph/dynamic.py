"""Shapes known only at run time: unknown dims (None) in the graph IR, and nodes in run-time form.

Most shapes are static: the importer computes every shape-like input (a Reshape target, a
Slice's bounds, ...) and turns it into an attribute (the canonical form, ir.py). When such
an input depends on a value only known at run time (a model input's values, a NonZero's
count), the node keeps ONNX's form instead: its shape inputs stay inputs and it carries
``runtime_shape=1``. The kernels below run that form by ONNX's rules, computing the
canonical attributes from the values they are given and calling the canonical kernel of
ops.py, so both forms share one definition.

Types downstream of such a node have unknown dims: ``TensorType.shape`` holds None there
(the rank is always known). Every table here is keyed by operator:

- ``VALUE_SHAPED``: the inputs whose *values* decide the output shape. A node of such an
  operator whose listed inputs are not all known at import time is put in run-time form.
- ``RUNTIME_KERNELS``: the kernel of the run-time form where the canonical kernel does not
  take it as it is (ops.py's Range, and ONNX-form kernels added elsewhere such as NonZero,
  run unchanged).
- ``RUNTIME_TYPES``: the output types of the run-time form, with None where the size is
  only known at run time.
- ``UNKNOWN_DIM_TYPES``: shape rules that accept unknown dims for the operators whose
  ordinary rule is a formula (ops.SHAPE_RULES); any other operator's types come from
  running its kernel on stand-ins of several sizes (reference.infer_node).

An operator added elsewhere whose output shape depends on its inputs' values (TopK's k,
NonZero, If/Loop) registers itself with :func:`register_runtime_form`; NonZero, TopK and
OneHot are listed here already (their types: NonZero [rank, ?], TopK ? along its axis,
OneHot ? at its axis), so their kernels only need to take ONNX's inputs. If and Loop type
their outputs with :func:`join_types` (branches that differ in a size give None there) and
list their condition / trip count in ``value_inputs``.
"""

from __future__ import annotations

import numpy as np

from .ir import DynamicShapeError, NodeError, TensorType
from .ops import KERNELS, pool_output_shape
from .ops_data import compress_runtime_types, unique_runtime_types
from .ops_vision import nms_runtime_types

__all__ = ["VALUE_SHAPED", "RUNTIME_KERNELS", "RUNTIME_TYPES", "UNKNOWN_DIM_TYPES",
           "register_runtime_form", "is_runtime_form", "runtime_kernel", "broadcast_dims",
           "join_types"]

_REDUCE = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd")

# op -> inputs whose values decide the output's shape.
VALUE_SHAPED: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 3),
    "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "ConstantOfShape": (0,),
    "Range": (0, 1, 2), "NonZero": (0,), "TopK": (1,), "OneHot": (1,),
    **{op: (1,) for op in _REDUCE},
}


def is_runtime_form(node) -> bool:
    return bool(node.attrs.get("runtime_shape"))


# ---- kernels of the run-time forms (ONNX's meaning, canonical attributes computed) ----------


def _ints(v) -> list[int]:
    return [int(x) for x in np.reshape(v, -1)]


def _axes(values, rank) -> list[int]:
    out = []
    for a in _ints(values):
        if not -rank <= a < max(rank, 1):
            raise ValueError(f"axis {a} is out of range for rank {rank}")
        out.append(a + rank if a < 0 else a)
    return out


def reshape(a, x, shape):
    target = _ints(shape)
    if not a.get("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)  # numpy resolves a -1 as ONNX does; a mismatch is a ValueError


def expand(a, x, shape):
    return KERNELS["Expand"]({"shape": _ints(shape)}, x)


def tile(a, x, repeats):
    return KERNELS["Tile"]({"repeats": _ints(repeats)}, x)


def slice_(a, x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else _axes(axes, x.ndim)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    if 0 in steps:
        raise ValueError("a Slice step of 0")
    return KERNELS["Slice"]({"starts": starts, "ends": ends, "axes": axes, "steps": steps}, x)


def pad(a, x, pads, value=None, axes=None):
    pads, rank = _ints(pads), x.ndim
    if axes is not None:
        full = [0] * (2 * rank)
        axes = _axes(axes, rank)
        for k, ax in enumerate(axes):
            full[ax], full[ax + rank] = pads[k], pads[k + len(axes)]
        pads = full
    if len(pads) != 2 * rank:
        raise ValueError(f"{len(pads)} pads for rank {rank}")
    return KERNELS["Pad"]({"mode": a.get("mode", "constant"), "pads": pads}, x, value)


def split(a, x, sizes=None):
    axis = _axes([a.get("axis", 0)], x.ndim)[0]
    if sizes is not None:
        sizes = _ints(sizes)
    else:  # equal parts, the last one smaller (the importer records the output count)
        n, dim = a["num_outputs"], x.shape[axis]
        each = -(-dim // n)
        sizes = [max(min(each, dim - k * each), 0) for k in range(n)]
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"split sizes {sizes} do not add up to {x.shape[axis]}")
    return KERNELS["Split"]({"axis": axis, "split": sizes}, x)


def squeeze(a, x, axes=None):
    if axes is None and "squeezed" in a:  # no axes, sizes only known at run time
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if ones != list(a["squeezed"]):
            raise ValueError(
                f"without axes it removes every dim of size 1: dims {ones} of "
                f"[{','.join(map(str, x.shape))}] here, where the model was built to remove "
                f"dims {list(a['squeezed'])} (the sizes known then) and so to keep a rank of "
                f"{x.ndim - len(a['squeezed'])}; give the Squeeze its axes in the model")
        axes = a["squeezed"]
    if axes is None:
        return np.squeeze(x)
    return KERNELS["Squeeze"]({"axes": _axes(axes, x.ndim)}, x)


def unsqueeze(a, x, axes):
    n = np.size(axes)
    return KERNELS["Unsqueeze"]({"axes": sorted(_axes(axes, x.ndim + n))}, x)


def _reduce(op):
    def kernel(a, x, axes=None):
        axes = None if axes is None else _axes(axes, x.ndim)
        if not axes and a.get("noop_with_empty_axes", 0):
            return x
        return KERNELS[op]({"axes": axes or None, "keepdims": a.get("keepdims", 1)}, x)
    return kernel


def constant_of_shape(a, shape):
    v = a.get("value")
    value = np.zeros((), np.float32) if v is None else np.reshape(v, ())
    return np.full(_ints(shape), value)


RUNTIME_KERNELS = {
    "Reshape": reshape, "Expand": expand, "Tile": tile, "Slice": slice_, "Pad": pad,
    "Split": split, "Squeeze": squeeze, "Unsqueeze": unsqueeze,
    "ConstantOfShape": constant_of_shape, **{op: _reduce(op) for op in _REDUCE},
}


def runtime_kernel(op: str):
    """The kernel of ``op``'s run-time form: its own, else the operator's kernel (which
    then takes ONNX's inputs as they are, like Range)."""
    return RUNTIME_KERNELS.get(op) or KERNELS[op]


# ---- types of the run-time forms ---------------------------------------------------------


def _length(node, types, index, what) -> int:
    """The static length of a 1-D shape-like input (its element count decides a rank)."""
    t = types[index]
    if len(t.shape) > 1 or None in t.shape:
        raise DynamicShapeError(
            f"node {node.name!r} ({node.op}): the length of its {what} {node.inputs[index]!r} "
            f"({t}) is only known at run time, so its output's rank is unknown; celosia needs "
            "the rank: make that input's length fixed in the model")
    return int(np.prod(t.shape, dtype=np.int64))


def _given(values, index):
    return values[index] if index < len(values) else None


def _reshape_types(node, types, values):
    x, n = types[0], _length(node, types, 1, "shape")
    target = _given(values, 1)
    if target is None:
        return [TensorType(x.dtype, (None,) * n)]
    dims = []
    for i, d in enumerate(_ints(target)):
        if d == 0 and not node.attrs.get("allowzero", 0):
            dims.append(x.shape[i] if i < len(x.shape) else None)
        else:
            dims.append(d if d > 0 else None)
    return [TensorType(x.dtype, tuple(dims))]


def _expand_types(node, types, values):
    x, n = types[0], _length(node, types, 1, "shape")
    rank = max(len(x.shape), n)
    padded = (1,) * (rank - len(x.shape)) + tuple(x.shape)
    # A size of x other than 1 is the output's whatever the shape says (or the node fails).
    return [TensorType(x.dtype, tuple(d if d is not None and d != 1 else None
                                      for d in padded))]


def _tile_types(node, types, values):
    x = types[0]
    return [TensorType(x.dtype, (None,) * len(x.shape))]


def _slice_types(node, types, values):
    x = types[0]
    axes = _given(values, 3)
    if axes is None and not (len(node.inputs) > 3 and node.inputs[3]):
        n = _length(node, types, 1, "starts")
        axes = list(range(n))
    if axes is None:
        return [TensorType(x.dtype, (None,) * len(x.shape))]
    sliced = set(_axes(axes, len(x.shape)))
    return [TensorType(x.dtype, tuple(None if i in sliced else d
                                      for i, d in enumerate(x.shape)))]


def _pad_types(node, types, values):
    x = types[0]
    axes = _given(values, 3)
    if axes is None:
        return [TensorType(x.dtype, (None,) * len(x.shape))]
    padded = set(_axes(axes, len(x.shape)))
    return [TensorType(x.dtype, tuple(None if i in padded else d
                                      for i, d in enumerate(x.shape)))]


def _split_types(node, types, values):
    x = types[0]
    axis = _axes([node.attrs.get("axis", 0)], len(x.shape))[0]
    t = TensorType(x.dtype, tuple(None if i == axis else d for i, d in enumerate(x.shape)))
    return [t] * len(node.outputs)


def _squeeze_types(node, types, values):
    x = types[0]
    if (len(node.inputs) < 2 or not node.inputs[1]) and "squeezed" in node.attrs:
        # Without axes: the dims of size 1 when it was imported go; a size only known at
        # run time is taken as not 1 (the kernel checks it), so the rank is known.
        gone = set(node.attrs["squeezed"])
        return [TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in gone))]
    if len(node.inputs) < 2 or not node.inputs[1]:
        raise DynamicShapeError(
            f"node {node.name!r} (Squeeze): without axes it removes every dim of size 1, and "
            f"its input {node.inputs[0]!r} ({x}) has sizes only known at run time, so the "
            "output's rank is unknown; give the Squeeze its axes in the model")
    n = _length(node, types, 1, "axes")
    return [TensorType(x.dtype, (None,) * (len(x.shape) - n))]


def _unsqueeze_types(node, types, values):
    x, n = types[0], _length(node, types, 1, "axes")
    return [TensorType(x.dtype, (None,) * (len(x.shape) + n))]


def _reduce_types(node, types, values):
    x, a = types[0], node.attrs
    n = _length(node, types, 1, "axes") if len(node.inputs) > 1 and node.inputs[1] else 0
    if n == 0 and a.get("noop_with_empty_axes", 0):  # no axes: the input itself
        return [x]
    if a.get("keepdims", 1):
        return [TensorType(x.dtype, (None,) * len(x.shape))]
    if n == 0:
        return [TensorType(x.dtype, ())]
    return [TensorType(x.dtype, (None,) * (len(x.shape) - n))]


def _constant_of_shape_types(node, types, values):
    n = _length(node, types, 0, "shape")
    v = node.attrs.get("value")
    dtype = "float32" if v is None else str(np.asarray(v).dtype)
    return [TensorType(dtype, (None,) * n)]


def _range_types(node, types, values):
    return [TensorType(types[0].dtype, (None,))]


def _nonzero_types(node, types, values):
    return [TensorType("int64", (len(types[0].shape), None))]


def _topk_types(node, types, values):
    x = types[0]
    axis = _axes([node.attrs.get("axis", -1)], len(x.shape))[0]
    shape = tuple(None if i == axis else d for i, d in enumerate(x.shape))
    return [TensorType(x.dtype, shape), TensorType("int64", shape)][:len(node.outputs)]


def _onehot_types(node, types, values):
    """The indices' shape with the depth (known when it runs) inserted at ``axis``."""
    indices, vals = types[0], types[2]
    shape = list(indices.shape)
    shape.insert(_axes([node.attrs.get("axis", -1)], len(shape) + 1)[0], None)
    return [TensorType(vals.dtype, tuple(shape))]


RUNTIME_TYPES = {
    "Reshape": _reshape_types, "Expand": _expand_types, "Tile": _tile_types,
    "Slice": _slice_types, "Pad": _pad_types, "Split": _split_types,
    "Squeeze": _squeeze_types, "Unsqueeze": _unsqueeze_types,
    "ConstantOfShape": _constant_of_shape_types, "Range": _range_types,
    "NonZero": _nonzero_types, "TopK": _topk_types, "OneHot": _onehot_types,
    **{op: _reduce_types for op in _REDUCE},
}


def register_runtime_form(op: str, value_inputs: tuple[int, ...], types, kernel=None) -> None:
    """Declare that ``op``'s output shape depends on the values of ``value_inputs``:
    ``types(node, input types, compile-time values) -> output types`` (None for sizes only
    known at run time); ``kernel`` runs ONNX's form of the node when ops.py's kernel for
    ``op`` does not take it as it is."""
    VALUE_SHAPED[op] = tuple(value_inputs)
    RUNTIME_TYPES[op] = types
    if kernel is not None:
        RUNTIME_KERNELS[op] = kernel


# Operators of ops_vision.py whose output size depends on their inputs' values: the count
# of boxes NonMaxSuppression selects.
register_runtime_form("NonMaxSuppression", (0, 1, 2, 3, 4), nms_runtime_types)
# ops_data.py's: the count of true conditions Compress selects, of distinct values Unique
# finds.
register_runtime_form("Compress", (1,), compress_runtime_types)
register_runtime_form("Unique", (0,), unique_runtime_types)


def join_types(a: TensorType, b: TensorType) -> TensorType:
    """The type of a value that is either ``a`` or ``b`` (If's branches, a Loop's carried
    value before and after an iteration): sizes that differ become None. The rank and the
    dtype must agree (the graph IR always knows the rank)."""
    if a.dtype != b.dtype or len(a.shape) != len(b.shape):
        raise DynamicShapeError(f"a value is {a} or {b}: celosia needs one dtype and rank")
    return TensorType(a.dtype, tuple(x if x == y else None for x, y in zip(a.shape, b.shape)))


# ---- shape rules that take unknown dims ------------------------------------------------------


def broadcast_dims(*shapes) -> tuple:
    """numpy's broadcast of shapes with unknown (None) dims: a known size other than 1
    decides a position (a valid run has that size or 1 there), else it stays unknown."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        big = {d for d in dims if d is not None and d != 1}
        if len(big) > 1:
            raise ValueError(f"shapes {[list(s) for s in shapes]} do not broadcast")
        if big:
            out.append(big.pop())
        else:
            out.append(None if None in dims else 1)
    return tuple(out)


def _window_types(node, types, kernel, channels, pool_outputs):
    x, a = types[0], node.attrs
    out = []
    for i, d in enumerate(x.shape[2:]):
        if d is None:
            out.append(None)
            continue
        pads = [a["pads"][i], a["pads"][i + len(kernel)]]
        (o,) = pool_output_shape([d], [kernel[i]], [a["strides"][i]], [a["dilations"][i]],
                                 pads, a.get("ceil_mode", 0))
        if o < 1:
            raise NodeError(node, f"kernel {list(kernel)} does not fit the input {x}")
        out.append(o)
    shape = (x.shape[0], channels, *out)
    if pool_outputs:
        return [TensorType(x.dtype, shape), TensorType("int64", shape)][:len(node.outputs)]
    return [TensorType(x.dtype, shape)]


def _conv_types(node, types, values):
    x, w = types[0], types[1]
    if len(x.shape) != len(w.shape) or len(x.shape) < 3:
        raise NodeError(node, f"input {x} and weight {w} must have the same rank (>= 3)")
    c, wc, g = x.shape[1], w.shape[1], node.attrs["group"]
    if c is not None and wc is not None and c != wc * g:
        raise NodeError(node, f"input has {c} channels but weight {w} with group={g} "
                              f"expects {wc * g}")
    return _window_types(node, types, node.attrs["kernel_shape"], w.shape[0], False)


def _pool_types(node, types, values):
    return _window_types(node, types, node.attrs["kernel_shape"], types[0].shape[1], True)


def _gemm_types(node, types, values):
    a, b = types[0].shape, types[1].shape
    m, k = (a[1], a[0]) if node.attrs.get("transA", 0) else a
    k2, n = (b[1], b[0]) if node.attrs.get("transB", 0) else b
    if k is not None and k2 is not None and k != k2:
        raise NodeError(node, f"inner sizes differ: A {types[0]}, B {types[1]}")
    return [TensorType(types[0].dtype, (m, n))]


def _matmul_types(node, types, values):
    a, b = types[0].shape, types[1].shape
    a2, b2 = (1,) + a if len(a) == 1 else a, b + (1,) if len(b) == 1 else b
    if a2[-1] is not None and b2[-2] is not None and a2[-1] != b2[-2]:
        raise NodeError(node, f"inner sizes differ: {types[0]} @ {types[1]}")
    try:
        batch = broadcast_dims(a2[:-2], b2[:-2])
    except ValueError:
        raise NodeError(node, f"batch shapes do not broadcast: {types[0]} @ {types[1]}") from None
    shape = batch + (a2[-2],) * (len(a) > 1) + (b2[-1],) * (len(b) > 1)
    return [TensorType(types[0].dtype, tuple(shape))]


UNKNOWN_DIM_TYPES = {"Conv": _conv_types, "MaxPool": _pool_types, "AveragePool": _pool_types,
                     "Gemm": _gemm_types, "MatMul": _matmul_types}

