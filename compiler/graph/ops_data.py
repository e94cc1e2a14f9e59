"""numpy definitions of the data-dependent and reinterpreting operators: Compress, Unique,
TensorScatter, Det and BitCast. ops.py merges ``KERNELS`` and ``SHAPE_RULES`` into its
tables. (Scatter, the deprecated alias of ScatterElements, becomes one at import: onnx's
version converter rewrites it on the way from opset 9 or 10 to 11.)

Compress and Unique make outputs whose sizes depend on their inputs' values: their kernels
take ONNX's form as it is (a negative axis, an absent one), so the same kernel runs the
node whether its sizes are known at import or only at run time (graph/dynamic.py registers
their run-time forms with the types below).
"""

from __future__ import annotations

import numpy as np

from .ir import NodeError, TensorType

__all__ = ["KERNELS", "SHAPE_RULES", "compress_runtime_types", "unique_runtime_types"]


def _axis(axis, rank, what="axis"):
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def compress(attrs, x, condition):
    """The slices of ``x`` along ``axis`` (of ``x`` flattened without one) where
    ``condition`` is true. A condition shorter than the axis selects among its first
    slices only (ONNX); the values of a longer one past the axis are dropped, true or not
    (onnxruntime's reading: numpy's compress would fail on a true one there)."""
    cond = np.asarray(condition).reshape(-1).astype(bool)
    axis = attrs.get("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    else:
        axis = _axis(axis, x.ndim)
    return np.compress(cond[:x.shape[axis]], x, axis=axis)


def unique(attrs, x):
    """(Y, indices, inverse_indices, counts): the distinct values (slices along ``axis``
    when it is given, else of ``x`` flattened), sorted ascending or (``sorted=0``) in the
    order they first appear; the index of each one's first occurrence, the index in Y of
    every element (slice) of ``x``, and each one's count."""
    axis = attrs.get("axis")
    if axis is not None:
        axis = _axis(axis, x.ndim)
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not attrs.get("sorted", 1):  # in order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return (y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64))


def tensor_scatter(attrs, past, update, write_indices=None):
    """The cache ``past`` with ``update`` written along ``axis`` (the sequence axis) from
    each batch entry's write index: linearly (the slots must lie within the axis) or
    circularly (modulo its length)."""
    rank = past.ndim
    axis = _axis(attrs.get("axis", -2), rank)
    if axis == 0:
        raise ValueError(f"axis {attrs.get('axis', -2)} is the batch axis; the sequence axis "
                         "must come after it")
    if update.ndim != rank or any(u != p for i, (u, p) in enumerate(zip(update.shape,
                                                                         past.shape))
                                  if i != axis) or update.shape[axis] > past.shape[axis]:
        raise ValueError(f"update {list(update.shape)} must have the shape of the cache "
                         f"{list(past.shape)} but along axis {axis}, at most as long there")
    batch, length, steps = past.shape[0], past.shape[axis], update.shape[axis]
    if write_indices is None:
        starts = np.zeros(batch, np.int64)
    else:
        starts = np.asarray(write_indices).astype(np.int64).reshape(-1)
        if starts.size != batch:
            raise ValueError(f"write_indices has {starts.size} values for a batch of {batch}")
    if attrs.get("mode", "linear") == "circular":
        if np.any(starts < 0):
            raise ValueError(f"write_indices {starts.tolist()} must not be negative")
        # (the start reduced first: a start near 2^63 plus a step would wrap)
        positions = (starts[:, None] % max(length, 1) + np.arange(steps)) % max(length, 1)
    else:
        bad = (starts < 0) | (starts > length - steps)  # (no sum: it could wrap)
        if np.any(bad):
            b = int(np.argmax(bad))
            raise ValueError(f"write index {int(starts[b])} of batch entry {b} puts the "
                             f"{steps} updates outside the sequence axis of size {length} "
                             "(linear mode)")
        positions = starts[:, None] + np.arange(steps)  # [batch, steps]
    out = past.copy()
    # The sequence axis next to the batch axis (views): the write is one fancy assignment.
    np.moveaxis(out, axis, 1)[np.arange(batch)[:, None], positions] = \
        np.moveaxis(update, axis, 1)
    return out


def det(attrs, x):
    """The determinants of the trailing [M, M] matrices (float16 computed in float32)."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"input {list(x.shape)} must be [..., M, M]")
    if x.dtype.kind != "f":
        raise ValueError(f"input of type {x.dtype}: Det takes floats")
    work = x.astype(np.float32) if x.dtype == np.float16 else x
    return np.linalg.det(work).astype(x.dtype)


def bit_cast(attrs, x):
    """``x``'s bytes (little-endian) read as the element type ``to``, of the same size."""
    from onnx.helper import tensor_dtype_to_np_dtype

    to = np.dtype(tensor_dtype_to_np_dtype(attrs["to"])).newbyteorder("<")
    src = x.dtype.newbyteorder("<")
    if to.itemsize != src.itemsize:
        raise ValueError(f"BitCast from {x.dtype} ({src.itemsize * 8} bits) to {to} "
                         f"({to.itemsize * 8} bits): the types must have one size")
    # (a copy, C-ordered: ascontiguousarray would make a scalar 1-D)
    return np.array(x, src, order="C").view(to).astype(to.newbyteorder("="))


def compress_runtime_types(node, types, values):
    """Compress with a condition only known at run time: the selected count is unknown."""
    x, axis = types[0], node.attrs.get("axis")
    if axis is None:
        return [TensorType(x.dtype, (None,))]
    try:
        axis = _axis(axis, len(x.shape))
    except ValueError as e:
        raise NodeError(node, str(e)) from None
    return [TensorType(x.dtype, tuple(None if i == axis else d for i, d in enumerate(x.shape)))]


def unique_runtime_types(node, types, values):
    """Unique of values only known at run time: the count of distinct ones is unknown; the
    inverse indices have one per element (slice) of the input."""
    x, axis = types[0], node.attrs.get("axis")
    if axis is None:
        y, inverse = (None,), (x.size,)
    else:
        try:
            axis = _axis(axis, len(x.shape))
        except ValueError as e:
            raise NodeError(node, str(e)) from None
        y = tuple(None if i == axis else d for i, d in enumerate(x.shape))
        inverse = (x.shape[axis],)
    out = [TensorType(x.dtype, y), TensorType("int64", (None,)),
           TensorType("int64", inverse), TensorType("int64", (None,))]
    return out[:len(node.outputs)]


KERNELS = {
    "Compress": compress,
    "Unique": unique,
    "TensorScatter": tensor_scatter,    # opset 24: a KV cache's update, linear or circular
    "Det": det,
    "BitCast": bit_cast,                # opset 26
}

# Their types come from running the kernels on stand-ins (reference.infer_node).
SHAPE_RULES: dict = {}
