"""numpy definitions of the indexing and data-movement operators beyond ops.py's: the
Gather and Scatter families, Trilu, NonZero, DepthToSpace, SpaceToDepth and OneHot. ops.py
merges ``KERNELS`` and ``SHAPE_RULES`` into its tables.

Attributes are canonical (frontend/canonical.py): axes non-negative, Trilu's ``k`` and
OneHot's ``depth`` attributes. Index inputs may be negative (counted from the end); an index
out of range is a ValueError, which the executors report naming the node.
"""

from __future__ import annotations

import numpy as np

from .ir import NodeError
from .ops_math import one_value

__all__ = ["KERNELS", "SHAPE_RULES"]

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _in_range(indices, size, what):
    """Indices made non-negative; ``size`` the dimension each one indexes (broadcast)."""
    i = np.asarray(indices, np.int64)
    bad = (i < -size) | (i >= size)
    if np.any(bad):
        k = np.argwhere(bad)[0]
        sizes = np.broadcast_to(size, i.shape)
        raise ValueError(f"{what} {int(i[tuple(k)])} at {k.tolist()} is out of range for a "
                         f"dimension of size {int(sizes[tuple(k)])}")
    return np.where(i < 0, i + size, i)


def _scatter(y, key, updates, reduction):
    if reduction == "none":  # with repeated indices the last update wins, as onnxruntime
        y[key] = updates
    else:
        _REDUCE[reduction].at(y, key, updates)
    return y


def gather_elements(attrs, data, indices):
    axis = attrs["axis"]
    # The indices may be smaller than the data on the other axes: take that corner.
    corner = tuple(slice(None) if d == axis else slice(0, s)
                   for d, s in enumerate(indices.shape))
    return np.take_along_axis(data[corner], _in_range(indices, data.shape[axis], "index"),
                              axis=axis)


def scatter_elements(attrs, data, indices, updates):
    axis = attrs["axis"]
    key = list(np.indices(indices.shape, sparse=True))
    key[axis] = _in_range(indices, data.shape[axis], "index")
    return _scatter(data.copy(), tuple(key), updates, attrs.get("reduction", "none"))


def gather_nd(attrs, data, indices):
    b, k = attrs.get("batch_dims", 0), indices.shape[-1]
    if indices.shape[:b] != data.shape[:b] or b + k > data.ndim:
        raise ValueError(f"indices {list(indices.shape)} do not fit data {list(data.shape)} "
                         f"with batch_dims={b}")
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    flat = data.reshape(batch, *data.shape[b:])
    idx = _in_range(indices, np.array(data.shape[b:b + k]), "index").reshape(batch, -1, k)
    key = (np.arange(batch)[:, None],) + tuple(idx[..., j] for j in range(k))
    return flat[key].reshape(indices.shape[:-1] + data.shape[b + k:])


def scatter_nd(attrs, data, indices, updates):
    k = indices.shape[-1]
    want = indices.shape[:-1] + data.shape[k:]
    if k > data.ndim or updates.shape != want:
        raise ValueError(f"updates {list(updates.shape)} must have shape {list(want)} "
                         f"(indices {list(indices.shape)}, data {list(data.shape)})")
    idx = _in_range(indices, np.array(data.shape[:k]), "index").reshape(-1, k)
    key = tuple(idx[:, j] for j in range(k))
    return _scatter(data.copy(), key, updates.reshape(-1, *data.shape[k:]),
                    attrs.get("reduction", "none"))


def depth_to_space(attrs, x):
    bs, (n, c, h, w) = attrs["blocksize"], x.shape
    if c % (bs * bs):
        raise ValueError(f"{c} channels are not a multiple of blocksize^2 = {bs * bs}")
    if attrs.get("mode", "DCR") == "DCR":  # depth, column, row
        y = x.reshape(n, bs, bs, c // bs ** 2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:  # CRD: column, row, depth
        y = x.reshape(n, c // bs ** 2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // bs ** 2, h * bs, w * bs)


def space_to_depth(attrs, x):
    bs, (n, c, h, w) = attrs["blocksize"], x.shape
    if h % bs or w % bs:
        raise ValueError(f"height {h} and width {w} must be multiples of blocksize {bs}")
    y = x.reshape(n, c, h // bs, bs, w // bs, bs)
    perm = (0, 3, 5, 1, 2, 4) if attrs.get("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    return y.transpose(perm).reshape(n, c * bs * bs, h // bs, w // bs)


def trilu(attrs, x):
    # A diagonal past the matrix keeps everything or nothing: clamped there, so numpy's
    # index arithmetic cannot overflow (k = -2^63).
    rows, cols = x.shape[-2:]
    k = min(max(attrs.get("k", 0), -rows), cols)
    return (np.triu if attrs.get("upper", 1) else np.tril)(x, k)


def one_hot(attrs, indices, *operands):
    """Canonical: inputs (indices, values), attributes ``depth`` and ``axis``; in run-time
    form (graph/dynamic.py) ONNX's (indices, depth, values), its axis maybe negative."""
    if len(operands) == 2:
        depth, values = one_value(operands[0], "depth"), operands[1]
        if depth < 1 or np.size(values) != 2:
            raise ValueError(f"depth {depth} must be at least 1 and values {values.tolist()} "
                             "hold [off, on]")
        axis = attrs.get("axis", -1)
        if not -indices.ndim - 1 <= axis <= indices.ndim:
            raise ValueError(f"axis {axis} is out of range for rank {indices.ndim + 1}")
        axis %= indices.ndim + 1
    else:
        (values,), depth, axis = operands, attrs["depth"], attrs["axis"]
    i = np.asarray(indices).astype(np.int64)  # float indices are truncated
    i = np.where(i < 0, i + depth, i)  # out of range after this: all "off"
    positions = np.arange(depth).reshape((-1,) + (1,) * (i.ndim - axis))
    hot = np.expand_dims(i, axis) == positions
    values = values.reshape(-1)
    return np.where(hot, values[1], values[0]).astype(values.dtype)


def _scatter_elements_types(node, types):
    data, indices, updates = types
    if not len(data.shape) == len(indices.shape) or indices.shape != updates.shape:
        raise NodeError(node, f"indices {indices} and updates {updates} must have one shape "
                              f"and the rank of the data {data}")
    return [data]


def _scatter_nd_types(node, types):
    data, indices, updates = types
    k = indices.shape[-1] if indices.shape else 0
    want = indices.shape[:-1] + data.shape[k:]
    if not indices.shape or k > len(data.shape) or updates.shape != want:
        raise NodeError(node, f"updates {updates} must have shape {list(want)} for indices "
                              f"{indices} into data {data}")
    return [data]


KERNELS = {
    "GatherElements": gather_elements,
    "GatherND": gather_nd,
    "ScatterElements": scatter_elements,                    # reduction none/add/mul/max/min
    "ScatterND": scatter_nd,
    "Trilu": trilu,
    # The positions of the nonzero values: the output's size depends on the values, so
    # the importer needs the input at compile time (frontend/canonical.py).
    "NonZero": lambda a, x: np.array(np.nonzero(np.atleast_1d(x)), dtype=np.int64),
    "DepthToSpace": depth_to_space,
    "SpaceToDepth": space_to_depth,
    "OneHot": one_hot,
}

# The scatters copy their data: their type is the data's, without running them.
SHAPE_RULES = {"ScatterElements": _scatter_elements_types, "ScatterND": _scatter_nd_types}
