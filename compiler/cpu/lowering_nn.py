"""Lowering of the transformer models' row-wise operators (issue #12) to the kernels of
rowwise.py: LayerNormalization and Softmax, float32, plain layout, the leading axes
flattened into rows (views, no copies).

Each handler takes the lowering (lowering._Lowering) and a node and returns False to leave
the node to the numpy fallback: LayerNorm with the Mean/InvStdDev outputs asked for, a stash
type other than float32, or a scale/bias that is neither constant nor of the normalized
shape; Softmax over an axis other than the last (graph/ops.py's kernel runs those).
"""

from __future__ import annotations

import math

import numpy as np

from ..graph.ir import Node

__all__ = ["layer_norm", "softmax"]

F32 = "float32"


def _rows(lw, v: str, rows: int, cols: int) -> str:
    """``v`` (a run-time value) as a [rows, cols] view."""
    src = lw.plain(v)
    if tuple(lw.values[src]["shape"]) == (rows, cols):
        return src
    return lw.view_of(src, (rows, cols), f"{v}@{rows}x{cols}")


def _vector(lw, v: str, trailing: tuple, node: Node) -> str | None:
    """LayerNorm's scale or bias as ``[prod(trailing)]``: a constant broadcast to the
    normalized shape, or a run-time value of exactly that shape (a view); None else."""
    cols = math.prod(trailing)
    if lw.is_const(v):
        a = np.asarray(lw.const(v), np.float32)
        try:
            full = np.broadcast_to(a, trailing)
        except ValueError:
            return None
        return lw.add_const(f"{v}@{node.name}@{cols}", full.reshape(cols))
    t = lw.type(v)
    if t.dtype != F32 or tuple(t.shape) != tuple(trailing):
        return None
    src = lw.plain(v)
    return src if len(trailing) == 1 else lw.view_of(src, (cols,), f"{v}@{cols}")


def layer_norm(lw, node: Node) -> bool:
    x, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    tx, a = lw.type(x), node.attrs
    if tx.dtype != F32 or lw.is_const(x) or any(node.outputs[1:]) \
            or np.dtype(a["stash_type"]) != np.float32 or not tx.shape:
        return False
    axis = a["axis"] % len(tx.shape)
    trailing = tuple(tx.shape[axis:])
    rows, cols = math.prod(tx.shape[:axis]), math.prod(trailing)
    vecs = [_vector(lw, v, trailing, node) for v in (scale, bias) if v]
    if any(v is None for v in vecs):
        return False
    data = _rows(lw, x, rows, cols)
    out = lw.produce(node.outputs[0], 0)
    flat = out if (rows, cols) == tuple(tx.shape) else lw.define(f"{out}@2d", F32, (rows, cols))
    spec = {"op": "layernorm", "rows": rows, "cols": cols, "epsilon": float(a["epsilon"]),
            "bias": bool(bias)}
    lw.kernel(node, spec, [data, *vecs, flat], flat)
    if flat != out:
        lw.step("view", node, [flat], [out])
    return True


def softmax(lw, node: Node) -> bool:
    x = node.inputs[0]
    tx = lw.type(x)
    if tx.dtype != F32 or lw.is_const(x) or not tx.shape \
            or node.attrs["axis"] % len(tx.shape) != len(tx.shape) - 1:
        return False
    cols = tx.shape[-1]
    rows = math.prod(tx.shape[:-1])
    data = _rows(lw, x, rows, cols)
    out = lw.produce(node.outputs[0], 0)
    flat = out if (rows, cols) == tuple(tx.shape) else lw.define(f"{out}@2d", F32, (rows, cols))
    lw.kernel(node, {"op": "softmax", "rows": rows, "cols": cols}, [data, flat], flat)
    if flat != out:
        lw.step("view", node, [flat], [out])
    return True
