"""Operands of element-wise computations in kernels (kernels.py's epilogues and
``eltwise``, kernels_q.py's QAdd/QMul): the tensor each operand kind reads and how it is
indexed from an output element's indices.

Kinds: ``"full"`` (the output's shape and layout), ``"channel"`` (one value per channel:
``[C//c, c]`` blocked, ``[N]`` for a dense output's columns, ``[C]`` for a plain 4-D
tensor), ``"image_channel"`` (one value per image and channel of a 4-D output: ``[N, C//c,
c]`` blocked, ``[N, C]`` plain), ``["scalar", v]`` (a constant folded into the code) or
``["broadcast", shape]`` (plain layout: a tensor of ``shape``, the output's rank, broadcast
along its axes of size 1 as numpy does).
"""

from __future__ import annotations

from ..tensor import te
from ..tensor.expr import as_expr

__all__ = ["operand_shape", "operand_read", "operand_placeholders"]


def _broadcast(kind) -> bool:
    return isinstance(kind, list) and kind[0] == "broadcast"


def operand_shape(kind, layout: str, out_shape) -> tuple | None:
    """The shape of an operand tensor of ``kind`` (None: a scalar, no tensor)."""
    if _broadcast(kind):  # ["broadcast", shape]: numpy's broadcast, shape padded to the rank
        return tuple(kind[1])
    if not isinstance(kind, str):
        return None
    if kind == "full":
        return tuple(out_shape)
    if kind == "image_channel":  # per image and channel ([N, C, 1, 1]: squeeze-excitation)
        return (out_shape[0], out_shape[1], out_shape[4]) if layout == "blocked" \
            else (out_shape[0], out_shape[1])
    if layout == "blocked":  # [N, C//c, H, W, c]
        return (out_shape[1], out_shape[4])
    if layout == "dense":  # [M, N]: per column
        return (out_shape[1],)
    return (out_shape[1],)  # plain [N, C, H, W]


def operand_read(kind, tensor, layout: str, idx):
    """The value of an operand of ``kind`` (``tensor``: its placeholder) at the output's
    indices ``idx``."""
    if _broadcast(kind):
        return tensor[tuple(0 if d == 1 else i for d, i in zip(kind[1], idx))]
    if not isinstance(kind, str):
        return as_expr(float(kind[1]))
    if kind == "full":
        return tensor[tuple(idx)]
    if kind == "image_channel":
        return tensor[idx[0], idx[1], idx[4]] if layout == "blocked" else tensor[idx[0], idx[1]]
    if layout == "blocked":
        return tensor[idx[1], idx[4]]
    return tensor[idx[1]]


def operand_placeholders(kinds, layout, out_shape, prefix, dtype="float32"):
    return [None if operand_shape(k, layout, out_shape) is None else
            te.placeholder(operand_shape(k, layout, out_shape), dtype, f"{prefix}{n}")
            for n, k in enumerate(kinds)]
