"""Canonical forms of ONNX nodes (see graph/ir.py): each function takes the importer's state
and one node and returns the nodes that replace it, with explicit pads and strides,
non-negative axes, and shape-like inputs (Reshape's shape, Slice's starts, ...) turned into
attributes from their compile-time values (``ctx.value``). ``CANONICALIZE`` maps an operator
to its function; an operator not in it is taken as it is.
"""

from __future__ import annotations

import math

import numpy as np

from ..graph.ir import Node, NodeError
from ..graph.ops import KERNELS
from .control import CONTROL_CANONICALIZE
from .dtypes import np_dtype

__all__ = ["CANONICALIZE"]


def _axis(node, axis, rank):
    if not -rank <= axis < max(rank, 1):
        raise NodeError(node, f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _rank(ctx, node, i=0):
    return len(ctx.types[node.inputs[i]].shape)


def _window_attrs(ctx, node, kernel):
    """Explicit kernel_shape, strides, pads, dilations (auto_pad resolved)."""
    a = dict(node.attrs)
    nd = len(kernel)
    in_shape = ctx.types[node.inputs[0]].shape[2:]
    strides = list(a.pop("strides", [1] * nd))
    dilations = list(a.pop("dilations", [1] * nd))
    auto = a.pop("auto_pad", "NOTSET")
    pads = list(a.pop("pads", [0] * (2 * nd)))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nd)
        for i in range(nd):
            out = -(-in_shape[i] // strides[i])
            span = (kernel[i] - 1) * dilations[i] + 1
            total = max((out - 1) * strides[i] + span - in_shape[i], 0)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + nd] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    a.pop("kernel_shape", None)
    return {"kernel_shape": list(kernel), "strides": strides, "pads": pads,
            "dilations": dilations, **a}


def _conv(ctx, node):
    kernel = list(node.attrs.get("kernel_shape") or ctx.types[node.inputs[1]].shape[2:])
    attrs = _window_attrs(ctx, node, kernel)
    attrs["group"] = attrs.pop("group", 1)
    return [Node("Conv", node.inputs, node.outputs, attrs, node.name)]


def _pool(ctx, node):
    attrs = _window_attrs(ctx, node, node.attrs["kernel_shape"])
    attrs.setdefault("ceil_mode", 0)
    if node.op == "AveragePool":
        attrs.setdefault("count_include_pad", 0)
    else:
        attrs.setdefault("storage_order", 0)
    return [Node(node.op, node.inputs, node.outputs, attrs, node.name)]


def _gemm(ctx, node):
    a = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0, **node.attrs}
    return [Node("Gemm", node.inputs, node.outputs, a, node.name)]


def _batch_norm(ctx, node):
    a = {"epsilon": 1e-5, "momentum": 0.9, **node.attrs}
    a.pop("spatial", None)
    if not a.get("training_mode"):
        a.pop("training_mode", None)
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


def _softmax(ctx, node):
    rank = _rank(ctx, node)
    axis = _axis(node, node.attrs.get("axis", 1 if ctx.opset < 13 else -1), rank)
    if ctx.opset >= 13 or axis == rank - 1:
        return [Node(node.op, node.inputs, node.outputs, {"axis": axis}, node.name)]
    # Opset 11: softmax over the input flattened to 2-D at `axis`.
    flat, soft = node.outputs[0] + "/flat", node.outputs[0] + "/2d"
    return [Node("Flatten", node.inputs, (flat,), {"axis": axis}, node.name + "/flatten"),
            Node(node.op, (flat,), (soft,), {"axis": 1}, node.name),
            Node("Reshape", (soft,), node.outputs,
                 {"shape": list(ctx.types[node.inputs[0]].shape)}, node.name + "/reshape")]


def _with_axis(default):
    def canon(ctx, node):
        rank = _rank(ctx, node)
        axis = _axis(node, node.attrs.get("axis", default), rank)
        return [Node(node.op, node.inputs, node.outputs, {**node.attrs, "axis": axis},
                     node.name)]
    return canon


def _flatten(ctx, node):
    rank = _rank(ctx, node)
    axis = node.attrs.get("axis", 1)
    if not -rank <= axis <= rank:
        raise NodeError(node, f"axis {axis} is out of range for rank {rank}")
    return [Node("Flatten", node.inputs, node.outputs, {"axis": axis % (rank + 1) if axis >= 0
                                                         else axis + rank}, node.name)]


def _reshape(ctx, node):
    target = [int(d) for d in ctx.value(node, 1, "shape")]
    in_shape = ctx.types[node.inputs[0]].shape
    if not node.attrs.get("allowzero", 0):
        target = [in_shape[i] if d == 0 else d for i, d in enumerate(target)]
    if target.count(-1) > 1:
        raise NodeError(node, f"shape {target} has more than one -1")
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        total = math.prod(in_shape)
        if known == 0 or total % known:
            raise NodeError(node, f"cannot reshape {in_shape} to {target}")
        target[target.index(-1)] = total // known
    if math.prod(target) != math.prod(in_shape):
        raise NodeError(node, f"cannot reshape {list(in_shape)} ({math.prod(in_shape)} "
                              f"elements) to {target}")
    return [Node("Reshape", node.inputs[:1], node.outputs, {"shape": target}, node.name)]


def _transpose(ctx, node):
    rank = _rank(ctx, node)
    perm = node.attrs.get("perm") or list(range(rank))[::-1]
    return [Node("Transpose", node.inputs, node.outputs,
                 {"perm": [_axis(node, p, rank) for p in perm]}, node.name)]


def _axes_from(ctx, node, rank, input_index=1, required=False):
    """Axes from the attribute (old opsets) or the second input (new opsets)."""
    axes = node.attrs.get("axes")
    if axes is None:
        v = ctx.value(node, input_index, "axes")
        axes = None if v is None else [int(x) for x in np.reshape(v, -1)]
    if axes is None:
        if required:
            raise NodeError(node, "axes are required")
        return None
    return sorted(_axis(node, x, rank) for x in axes)


def _squeeze(ctx, node):
    shape = ctx.types[node.inputs[0]].shape
    axes = _axes_from(ctx, node, len(shape))
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    return [Node("Squeeze", node.inputs[:1], node.outputs, {"axes": axes}, node.name)]


def _unsqueeze(ctx, node):
    axes = node.attrs.get("axes")
    if axes is None:
        axes = [int(x) for x in np.reshape(ctx.value(node, 1, "axes"), -1)]
    rank = _rank(ctx, node) + len(axes)
    return [Node("Unsqueeze", node.inputs[:1], node.outputs,
                 {"axes": sorted(_axis(node, x, rank) for x in axes)}, node.name)]


def _reduce(ctx, node):
    rank = _rank(ctx, node)
    axes = _axes_from(ctx, node, rank)
    keepdims = node.attrs.get("keepdims", 1)
    if not axes and node.attrs.get("noop_with_empty_axes", 0):
        return [Node("Identity", node.inputs[:1], node.outputs, {}, node.name)]
    return [Node(node.op, node.inputs[:1], node.outputs,
                 {"axes": axes or None, "keepdims": keepdims}, node.name)]


def _split(ctx, node):
    shape = ctx.types[node.inputs[0]].shape
    axis = _axis(node, node.attrs.get("axis", 0), len(shape))
    sizes = node.attrs.get("split")
    if sizes is None and len(node.inputs) > 1 and node.inputs[1]:
        sizes = [int(x) for x in ctx.value(node, 1, "split")]
    if sizes is None:
        n = node.attrs.get("num_outputs", len(node.outputs))
        each = -(-shape[axis] // n)
        sizes = [min(each, shape[axis] - k * each) for k in range(n)]
    if sum(sizes) != shape[axis]:
        raise NodeError(node, f"split sizes {sizes} do not add up to {shape[axis]}")
    return [Node("Split", node.inputs[:1], node.outputs, {"axis": axis, "split": list(sizes)},
                 node.name)]


def _slice(ctx, node):
    shape = ctx.types[node.inputs[0]].shape
    starts = [int(x) for x in ctx.value(node, 1, "starts")]
    ends = [int(x) for x in ctx.value(node, 2, "ends")]
    axes = ctx.value(node, 3, "axes")
    axes = list(range(len(starts))) if axes is None else [_axis(node, int(x), len(shape))
                                                          for x in axes]
    steps = ctx.value(node, 4, "steps")
    steps = [1] * len(starts) if steps is None else [int(x) for x in steps]
    if 0 in steps:
        raise NodeError(node, "a step of 0")
    return [Node("Slice", node.inputs[:1], node.outputs,
                 {"starts": starts, "ends": ends, "axes": axes, "steps": steps}, node.name)]


def _pad(ctx, node):
    rank = _rank(ctx, node)
    pads = [int(x) for x in ctx.value(node, 1, "pads")]
    axes = ctx.value(node, 3, "axes")
    if axes is not None:
        full = [0] * (2 * rank)
        axes = [_axis(node, int(x), rank) for x in axes]
        for k, ax in enumerate(axes):
            full[ax], full[ax + rank] = pads[k], pads[k + len(axes)]
        pads = full
    if len(pads) != 2 * rank:
        raise NodeError(node, f"{len(pads)} pads for rank {rank}")
    attrs = {"mode": node.attrs.get("mode", "constant"), "pads": pads}
    value = node.inputs[2] if len(node.inputs) > 2 else ""
    if value in ctx.values:
        attrs["value"] = np.asarray(ctx.values[value]).item()
    elif value:  # a fill value known only at run time stays an input
        return [Node("Pad", (node.inputs[0], value), node.outputs, attrs, node.name)]
    return [Node("Pad", node.inputs[:1], node.outputs, attrs, node.name)]


def _from_value(key, index, what):
    def canon(ctx, node):
        v = [int(x) for x in np.reshape(ctx.value(node, index, what), -1)]
        return [Node(node.op, node.inputs[:index], node.outputs, {**node.attrs, key: v},
                     node.name)]
    return canon


def _constant_of_shape(ctx, node):
    shape = [int(x) for x in ctx.value(node, 0, "shape")]
    v = node.attrs.get("value")
    value = np.zeros((), np.float32) if v is None else np.reshape(v, ())
    return [Node("Constant", (), node.outputs, {"value": np.full(shape, value)}, node.name)]


def _prelu(ctx, node):
    x, slope = (ctx.types[i].shape for i in node.inputs[:2])
    if ctx.source_opset >= 9 or len(slope) != 1 or len(x) < 3 or slope[0] != x[1]:
        return [node]
    # Before opset 9, a 1-D slope is per channel (axis 1); since, it broadcasts from the
    # right. The version converter does not reshape it.
    channel = node.inputs[1] + "/channel"
    return [Node("Reshape", node.inputs[1:2], (channel,),
                 {"shape": [slope[0]] + [1] * (len(x) - 2)}, node.name + "/slope"),
            Node("PRelu", (node.inputs[0], channel), node.outputs, {}, node.name)]


def _range(ctx, node):
    start, limit, delta = (ctx.value(node, i, w) for i, w in enumerate(("start", "limit",
                                                                         "delta")))
    return [Node("Constant", (), node.outputs,
                 {"value": KERNELS["Range"]({}, start, limit, delta)}, node.name)]


def _cast(ctx, node):
    return [Node("Cast", node.inputs, node.outputs,
                 {"to": np_dtype(node.attrs["to"], f"node {node.name!r} target", ctx.where)},
                 node.name)]


def _shape(ctx, node):
    rank = _rank(ctx, node)
    start, end = node.attrs.get("start", 0), node.attrs.get("end", rank)
    clamp = lambda v: min(max(v + rank if v < 0 else v, 0), rank)  # noqa: E731
    return [Node("Shape", node.inputs, node.outputs, {"start": clamp(start), "end": clamp(end)},
                 node.name)]


def _quantize_axis(ctx, node):
    """QuantizeLinear/DequantizeLinear ``axis`` made non-negative (it only matters for a
    per-axis or blocked scale) and ``block_size`` explicit."""
    rank, scale = _rank(ctx, node), ctx.types[node.inputs[1]]
    axis, block = node.attrs.get("axis", 1), node.attrs.get("block_size", 0)
    if scale.size != 1 or (block and len(scale.shape) > 1):
        axis = _axis(node, axis, rank)
    elif -rank <= axis < rank:
        axis %= rank
    return {"axis": axis, "block_size": block}


def _quantize_linear(ctx, node):
    """Explicit output type (the zero point's, else ``output_dtype``, else uint8) and
    division precision (``precision``, else the scale's type), as numpy dtype names."""
    zero = node.inputs[2] if len(node.inputs) > 2 else ""
    if zero:
        out = ctx.types[zero].dtype
    elif node.attrs.get("output_dtype"):
        out = np_dtype(node.attrs["output_dtype"], f"node {node.name!r} output", ctx.where)
    else:
        out = "uint8"
    precision = (np_dtype(node.attrs["precision"], f"node {node.name!r} precision", ctx.where)
                 if node.attrs.get("precision") else ctx.types[node.inputs[1]].dtype)
    attrs = {**_quantize_axis(ctx, node), "output_dtype": out, "precision": precision}
    return [Node(node.op, node.inputs, node.outputs, attrs, node.name)]


def _dequantize_linear(ctx, node):
    """Explicit output type (``output_dtype``, else the scale's type)."""
    out = (np_dtype(node.attrs["output_dtype"], f"node {node.name!r} output", ctx.where)
           if node.attrs.get("output_dtype") else ctx.types[node.inputs[1]].dtype)
    attrs = {**_quantize_axis(ctx, node), "output_dtype": out}
    return [Node(node.op, node.inputs, node.outputs, attrs, node.name)]


def _dropout(ctx, node):
    if len(node.outputs) > 1 and node.outputs[1]:
        return [Node("Dropout", node.inputs[:1], node.outputs, {}, node.name)]
    return [Node("Identity", node.inputs[:1], node.outputs[:1], {}, node.name)]


CANONICALIZE = {
    "Conv": _conv, "MaxPool": _pool, "AveragePool": _pool, "Gemm": _gemm,
    "BatchNormalization": _batch_norm, "Softmax": _softmax, "LogSoftmax": _softmax,
    "Flatten": _flatten, "Concat": _with_axis(0), "Gather": _with_axis(0),
    "Reshape": _reshape, "Transpose": _transpose, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Split": _split, "Slice": _slice, "Pad": _pad,
    "ReduceMean": _reduce, "ReduceSum": _reduce, "ReduceMax": _reduce, "ReduceMin": _reduce,
    "ReduceProd": _reduce, "Expand": _from_value("shape", 1, "shape"),
    "Tile": _from_value("repeats", 1, "repeats"), "ConstantOfShape": _constant_of_shape,
    "Cast": _cast, "CastLike": lambda ctx, node: [Node(
        "Cast", node.inputs[:1], node.outputs, {"to": ctx.types[node.inputs[1]].dtype},
        node.name)],
    "Shape": _shape, "Range": _range, "PRelu": _prelu, "Dropout": _dropout,
    "QuantizeLinear": _quantize_linear, "DequantizeLinear": _dequantize_linear,
    # If, Loop, Scan (bodies imported with the outer scope visible), LSTM, GRU, RNN
    **CONTROL_CANONICALIZE,
}
