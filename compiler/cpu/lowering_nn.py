"""Lowering of the transformer models' row-wise operators (issue #12) to the kernels of
rowwise.py: LayerNormalization and Softmax, float32, plain layout, the leading axes
flattened into rows (views, no copies).

Each handler takes the lowering (lowering._Lowering) and a node and returns False to leave
the node to the numpy fallback: LayerNorm with the Mean/InvStdDev outputs asked for, a stash
type other than float32, or a scale/bias that is neither constant nor of the normalized
shape. Softmax over another axis runs as the kernel's strided form.
"""

from __future__ import annotations

import math

import numpy as np

from ..graph.ir import Node
from .copies import copy_spec

__all__ = ["layer_norm", "instance_norm", "softmax", "batch_matmul", "transpose", "slice_",
           "broadcast_operand"]

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


def instance_norm(lw, node: Node) -> bool:
    """InstanceNormalization of [N, C, ...] with a scale of ones and a bias of zeros (how
    torch exports GroupNorm: the groups as channels, its own affine a Mul and an Add after)
    as the LayerNorm kernel over rows of N*C (each image's channel its own row)."""
    x, scale, bias = node.inputs[:3]
    tx = lw.type(x)
    if tx.dtype != F32 or lw.is_const(x) or len(tx.shape) < 3 or \
            not (lw.is_const(scale) and lw.is_const(bias)):
        return False
    if np.any(np.asarray(lw.const(scale)) != 1) or np.any(np.asarray(lw.const(bias)) != 0):
        return False
    rows, cols = math.prod(tx.shape[:2]), math.prod(tx.shape[2:])
    data = _rows(lw, x, rows, cols)
    ones = lw.add_const(f"{scale}@{node.name}@ones{cols}", np.ones(cols, np.float32))
    out = lw.produce(node.outputs[0], 0)
    flat = lw.define(f"{out}@2d", F32, (rows, cols))
    spec = {"op": "layernorm", "rows": rows, "cols": cols,
            "epsilon": float(node.attrs.get("epsilon", 1e-5)), "bias": False}
    lw.kernel(node, spec, [data, ones, flat], flat)
    lw.step("view", node, [flat], [out])
    return True


def softmax(lw, node: Node) -> bool:
    """Softmax over the last axis as the row-wise kernel; over another one (class scores
    of a segmentation or audio model in NCHW / NCL: axis 1) its strided form on the value
    seen as ``[A, C, B]`` (rowwise.py)."""
    x = node.inputs[0]
    tx = lw.type(x)
    if tx.dtype != F32 or lw.is_const(x) or not tx.shape or 0 in tx.shape:
        return False
    op = "logsoftmax" if node.op == "LogSoftmax" else "softmax"
    axis = node.attrs["axis"] % len(tx.shape)
    cols = tx.shape[axis]
    inner = math.prod(tx.shape[axis + 1:])
    rows = math.prod(tx.shape[:axis]) * inner
    out = lw.produce(node.outputs[0], 0)
    if inner == 1 or cols == 1:  # the softmax axis is the last one that is not 1
        data = _rows(lw, x, rows, cols)
        flat = out if (rows, cols) == tuple(tx.shape) \
            else lw.define(f"{out}@2d", F32, (rows, cols))
        lw.kernel(node, {"op": op, "rows": rows, "cols": cols}, [data, flat], flat)
        if flat != out:
            lw.step("view", node, [flat], [out])
        return True
    outer = rows // inner
    data = lw.view_of(lw.plain(x), (outer, cols, inner), f"{x}@{outer}x{cols}x{inner}")
    flat = lw.define(f"{out}@3d", F32, (outer, cols, inner))
    lw.kernel(node, {"op": op, "rows": outer, "cols": cols, "inner": inner},
              [data, flat], flat)
    lw.step("view", node, [flat], [out])
    return True


# ---- attention's batched products ----------------------------------------------------------


def _tile_rows(m: int) -> int:
    """The rows the batched product computes for ``m``: m itself when it has a divisor from
    4 to 8 (the register tile), else the next count that has one (ViT's 197 -> 198,
    a sequence of 1 -> 4); the extra rows are copies of the last one, dropped after."""
    from .schedules_nn import batch_matmul_tiles
    rows = m
    while batch_matmul_tiles(rows, 8) is None:
        rows += 1
    return rows


def _padded(lw, v: str, shape: tuple, want: tuple) -> str:
    """The [z, r, c] value ``v`` padded to ``want`` by a compiled copy (clamped: the last
    row or column repeated), or ``v`` when no padding is needed."""
    if tuple(shape) == tuple(want):
        return v
    name = f"{v}@pad{want[1]}x{want[2]}"
    if name not in lw.values:
        lw.define(name, F32, want)
        lw.kernel(None, copy_spec(F32, shape, want), [v, name], name)
    return name


def batch_matmul(lw, node: Node) -> bool:
    """A MatMul of two run-time float32 operands of rank >= 3 with the same batch dims
    (attention's Q @ K^T and P @ V): one kernel over the batches, viewed as 3-D, with M
    and N padded by compiled copies where the register tile needs it (ViT's 197 tokens)
    and the output cropped; a scaling (Div or Mul by a scalar) computed in its output stage,
    an epilogue's mask Add as an element-wise kernel after it. A right operand without
    batch dims (or with batch dims of 1: two embeddings' similarities, ``x @ y.T``) is one
    product of A's rows, every batch of A stacked. Other broadcast batches stay numpy."""
    a_in, b_in = node.inputs[:2]
    ta, tb = lw.type(a_in), lw.type(b_in)
    if ta.dtype != F32 or tb.dtype != F32 or len(ta.shape) < 2 or len(tb.shape) < 2 \
            or len(tb.shape) > len(ta.shape) or lw.is_const(a_in) or lw.is_const(b_in):
        return False
    shared = all(d == 1 for d in tb.shape[:-2])  # B broadcast over every batch of A
    if not shared and ta.shape[:-2] != tb.shape[:-2]:
        return False
    epilogue = _inner_steps(lw, node)
    if epilogue is None:
        return False
    (m, k), n = ta.shape[-2:], tb.shape[-1]
    z = math.prod(ta.shape[:-2])
    if shared:  # A's batches as more rows of one product
        z, m = 1, z * m
        if not epilogue[1] and _shared_as_dense(lw, node, m, k, n, epilogue[0]):
            return True
    rows, cols = _tile_rows(m), -(-n // 8) * 8
    a = _padded(lw, lw.view_of(lw.plain(a_in), (z, m, k), f"{a_in}@3d"), (z, m, k),
                (z, rows, k))
    b = _padded(lw, lw.view_of(lw.plain(b_in), (z, k, n), f"{b_in}@3d"), (z, k, n),
                (z, k, cols))
    result, (steps, rest) = node.outputs[0], epilogue
    scale = None if node.attrs.get("epilogue") else _scaling(lw, node)
    if scale is not None:  # the scores' 1 / sqrt(d): computed in the kernel's output stage
        lw.absorbed.add(scale[0].name)
        result, steps = scale[0].outputs[0], [scale[1]]
    if rest:  # the other epilogue steps (a mask Add): element-wise kernels after it
        result = f"{node.outputs[0]}@product"
        lw.extra_types[result] = lw.type(node.outputs[0])
    flat = lw.define(f"{result}@{rows}x{cols}", F32, (z, rows, cols))
    spec = {"op": "batch_matmul", "a": [z, rows, k], "b": [z, k, cols]}
    if steps:
        spec["epilogue"] = steps
    lw.kernel(node, spec, [a, b, flat], flat)
    if (rows, cols) != (m, n):
        crop = lw.define(f"{result}@3d", F32, (z, m, n))
        lw.kernel(node, copy_spec(F32, (z, rows, cols), (z, m, n)), [flat, crop], crop)
        flat = crop
    lw.step("view", node, [flat], [lw.produce(result, 0)])
    for k, (op, operand) in enumerate(rest):
        last = k == len(rest) - 1
        out = node.outputs[0] if last else f"{node.outputs[0]}@step{k}"
        if not last:
            lw.extra_types[out] = lw.type(node.outputs[0])
        step = Node(op, (result, node.inputs[operand]), (out,), {}, f"{node.name}@{op}{k}")
        if not lw.eltwise(step):
            lw.fallback(step)
        result = out
    return True


def _shared_as_dense(lw, node: Node, m: int, k: int, n: int, steps: list) -> bool:
    """``A [.., m, k] @ B [k, n]`` with B computed at run time, as the dense kernel (its
    column blocks in parallel; the batched kernel runs batches in parallel and this is one
    batch): B packed by a compiled copy into the dense layout ``[n / nb, k, nb]`` each run,
    A's rows padded as the dense lowering pads them (``dense_product``)."""
    from .schedules import dense_block

    nb = dense_block(n)
    if nb < 8:
        return False
    a_in, b_in = node.inputs[:2]
    b = lw.view_of(lw.plain(b_in), (k, n // nb, nb), f"{b_in}@{k}x{n // nb}x{nb}")
    packed = lw.define(f"{b_in}@dense{nb}", F32, (n // nb, k, nb))
    lw.kernel(node, copy_spec(F32, (k, n // nb, nb), (n // nb, k, nb), perm=[1, 0, 2]),
              [b, packed], packed)
    data = lw.view_of(lw.plain(a_in), (m, k), f"{a_in}@{m}x{k}")
    return lw.dense_product(node, data, packed, [], (m, k, n), n, nb, False, steps)


def _inner_steps(lw, node: Node) -> tuple[list, list] | None:
    """(spec steps, remaining steps) of a batched product's epilogue: its leading unary
    steps and scalar Mul/Add go into the kernel's output stage; from the first other
    operand on ((op, input index): a mask Add), element-wise kernels follow it."""
    from .kernels import BINARY, UNARY

    steps = list(node.attrs.get("epilogue", ()))
    inner = []
    while steps:
        op, *args = steps[0]
        if op in UNARY:
            inner.append([op, *[None if a is None else float(a) for a in args]])
        elif op in BINARY and lw.is_const(node.inputs[args[0]]) \
                and np.asarray(lw.const(node.inputs[args[0]])).size == 1 \
                and lw.type(node.inputs[args[0]]).dtype == F32:
            value = float(np.asarray(lw.const(node.inputs[args[0]])).reshape(-1)[0])
            inner.append([op, ["scalar", value]])
        else:
            break
        steps.pop(0)
    rest = [(op, args[0]) for op, *args in steps]
    if any(op not in BINARY for op, _ in rest):
        return None  # a unary step after a tensor operand: the node stays numpy
    return inner, rest


def _scaling(lw, node: Node):
    """(node, epilogue step) when the product's only reader divides or multiplies it by a
    constant scalar (attention's scores / sqrt(d), which fuse_epilogues leaves alone: it
    fuses Add and Mul only), else None."""
    out = node.outputs[0]
    readers = lw.consumers.get(out, [])
    if out in lw.g.outputs or len(readers) != 1:
        return None
    c = readers[0]
    if c.op not in ("Div", "Mul") or len(c.inputs) != 2 or c.attrs.get("epilogue") \
            or (c.op == "Div" and c.inputs[0] != out) or c.inputs[0] == c.inputs[1]:
        return None
    other = c.inputs[1] if c.inputs[0] == out else c.inputs[0]
    if not lw.is_const(other) or np.asarray(lw.const(other)).size != 1 \
            or lw.type(other).dtype != F32 or lw.type(c.outputs[0]).shape != lw.type(out).shape:
        return None
    return c, [c.op, ["scalar", float(np.asarray(lw.const(other)).reshape(-1)[0])]]


# ---- data movement: Transpose, Slice -------------------------------------------------------


def transpose(lw, node: Node) -> bool:
    """Transpose as a compiled strided copy (a view when only axes of size 1 move)."""
    x = node.inputs[0]
    tx = lw.type(x)
    if lw.is_const(x) or tx.dtype not in _COPY_DTYPES or not tx.shape:
        return False
    perm = list(node.attrs.get("perm") or range(len(tx.shape) - 1, -1, -1))
    moved = [p for p in perm if tx.shape[p] != 1]
    src = lw.plain(x)
    out = lw.produce(node.outputs[0], 0)
    if moved == sorted(moved):
        lw.step("view", node, [src], [out])
        return True
    lw.kernel(node, copy_spec(tx.dtype, tx.shape, lw.type(node.outputs[0]).shape, perm=perm),
              [src, out], out)
    return True


def depth_space(lw, node: Node) -> bool:
    """DepthToSpace / SpaceToDepth (super-resolution's pixel shuffle, YOLOv5's Focus) as
    what they are, a 6-D transpose: views of the plain value before and after one compiled
    strided copy (graph/ops_tensor.py's reshape-transpose-reshape)."""
    x = node.inputs[0]
    tx, a = lw.type(x), node.attrs
    if lw.is_const(x) or tx.dtype not in _COPY_DTYPES or len(tx.shape) != 4:
        return False
    bs, (n, c, h, w) = int(a["blocksize"]), tx.shape
    dcr = a.get("mode", "DCR") == "DCR"
    if node.op == "DepthToSpace":
        if c % (bs * bs):
            return False
        shape = (n, bs, bs, c // bs ** 2, h, w) if dcr else (n, c // bs ** 2, bs, bs, h, w)
        perm = (0, 3, 4, 1, 5, 2) if dcr else (0, 1, 4, 2, 5, 3)
    else:
        if h % bs or w % bs:
            return False
        shape = (n, c, h // bs, bs, w // bs, bs)
        perm = (0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4)
    moved = tuple(shape[p] for p in perm)
    src = lw.view_of(lw.plain(x), shape, f"{x}@6d")
    out6 = lw.define(f"{node.outputs[0]}@6d", tx.dtype, moved)
    lw.kernel(node, copy_spec(tx.dtype, shape, moved, perm=list(perm)), [src, out6], out6)
    lw.step("view", node, [out6], [lw.produce(node.outputs[0], 0)])
    return True


def slice_(lw, node: Node) -> bool:
    """Slice with constant starts, ends and steps (attributes after import) as a compiled
    strided copy."""
    x = node.inputs[0]
    tx, a = lw.type(x), node.attrs
    out_shape = lw.type(node.outputs[0]).shape
    if lw.is_const(x) or tx.dtype not in _COPY_DTYPES or not tx.shape or 0 in out_shape:
        return False
    if len(tx.shape) >= 2 and tx.shape[0] == 1 and [int(v) for v in a["axes"]] == [1] \
            and [int(v) for v in a["steps"]] == [1]:
        return False  # one contiguous run of x: the executor places it in x (in_place), no copy
    starts, steps = [0] * len(tx.shape), [1] * len(tx.shape)
    for s, e, axis, step in zip(a["starts"], a["ends"], a["axes"], a["steps"]):
        r = range(*slice(int(s), int(e), int(step)).indices(tx.shape[axis]))
        if len(r) != out_shape[axis]:
            return False
        starts[axis], steps[axis] = r.start, r.step
    out = lw.produce(node.outputs[0], 0)
    lw.kernel(node, copy_spec(tx.dtype, tx.shape, out_shape, starts=starts, steps=steps),
              [lw.plain(x), out], out)
    return True


_COPY_DTYPES = ("float32", "int32", "int64", "int8", "uint8")


# ---- broadcast operands of element-wise kernels --------------------------------------------


def broadcast_operand(lw, v: str, out_type, dtype: str):
    """(["broadcast", shape], value) for an operand of a plain element-wise node that numpy
    broadcasts to the output (attention's mask [B, 1, 1, S] on the scores, a [1, S, D]
    embedding on a batch of sequences), its shape padded with leading 1s; None else."""
    t = lw.type(v)
    rank = len(out_type.shape)
    if t.dtype != dtype or len(t.shape) > rank:
        return None
    shape = (1,) * (rank - len(t.shape)) + tuple(t.shape)
    if any(d not in (1, o) for d, o in zip(shape, out_type.shape)):
        return None
    if lw.is_const(v):
        a = np.asarray(lw.const(v), dtype).reshape(shape)
        return ["broadcast", list(shape)], lw.add_const(f"{v}@{'x'.join(map(str, shape))}", a)
    src = lw.plain(v)
    if tuple(lw.values[src]["shape"]) != shape:
        src = lw.view_of(src, shape, f"{v}@{rank}d")
    return ["broadcast", list(shape)], src
