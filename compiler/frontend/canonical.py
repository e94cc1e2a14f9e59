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
from .einsum import einsum_as_matmul
from .specs import check_value
from .tensors import check_size

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


def _conv_like(weight_index):
    """Conv and the integer convolutions (ConvInteger, QLinearConv), whose weight is input
    ``weight_index``: explicit window attributes and group."""
    def canon(ctx, node):
        weight = ctx.types[node.inputs[weight_index]].shape[2:]
        kernel = list(node.attrs.get("kernel_shape") or weight)
        if len(kernel) != _rank(ctx, node) - 2 or min(kernel, default=0) < 1 or (
                len(weight) == len(kernel) and list(weight) != kernel):
            raise NodeError(node, f"kernel {kernel} (from the weight "
                                  f"{ctx.types[node.inputs[weight_index]]}) does not suit the "
                                  f"input {ctx.types[node.inputs[0]]}")
        attrs = _window_attrs(ctx, node, kernel)
        attrs["group"] = attrs.pop("group", 1)
        return [Node(node.op, node.inputs, node.outputs, attrs, node.name)]
    return canon


_conv = _conv_like(1)


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
    target = _ints(ctx, node, 1, "shape", required=True)
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
        axes = _ints(ctx, node, 1, "axes", required=True)
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
        sizes = _ints(ctx, node, 1, "split")
    if sizes is None:
        n = node.attrs.get("num_outputs", len(node.outputs))
        each = -(-shape[axis] // n)
        sizes = [min(each, shape[axis] - k * each) for k in range(n)]
    if sum(sizes) != shape[axis] or min(sizes, default=0) < 0 or len(sizes) != len(
            node.outputs):
        raise NodeError(node, f"split sizes {sizes} are not {len(node.outputs)} sizes >= 0 "
                              f"that add up to {shape[axis]}")
    return [Node("Split", node.inputs[:1], node.outputs, {"axis": axis, "split": list(sizes)},
                 node.name)]


def _slice(ctx, node):
    shape = ctx.types[node.inputs[0]].shape
    starts = _ints(ctx, node, 1, "starts", required=True)
    ends = _ints(ctx, node, 2, "ends", required=True)
    axes = _ints(ctx, node, 3, "axes")
    axes = list(range(len(starts))) if axes is None else [_axis(node, x, len(shape))
                                                          for x in axes]
    steps = _ints(ctx, node, 4, "steps")
    steps = [1] * len(starts) if steps is None else steps
    if 0 in steps:
        raise NodeError(node, "a step of 0")
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) < len(axes):
        raise NodeError(node, f"starts {starts}, ends {ends}, axes {axes} and steps {steps} "
                              "must have one value each per axis, each axis once")
    return [Node("Slice", node.inputs[:1], node.outputs,
                 {"starts": starts, "ends": ends, "axes": axes, "steps": steps}, node.name)]


def _pad(ctx, node):
    rank = _rank(ctx, node)
    pads = _ints(ctx, node, 1, "pads", required=True)
    axes = ctx.value(node, 3, "axes")
    if axes is not None:
        full = [0] * (2 * rank)
        axes = [_axis(node, int(x), rank) for x in np.reshape(axes, -1)]
        if len(pads) != 2 * len(axes):
            raise NodeError(node, f"{len(pads)} pads for {len(axes)} axes")
        for k, ax in enumerate(axes):
            full[ax], full[ax + rank] = pads[k], pads[k + len(axes)]
        pads = full
    if len(pads) != 2 * rank:
        raise NodeError(node, f"{len(pads)} pads for rank {rank}")
    attrs = {"mode": node.attrs.get("mode", "constant"), "pads": pads}
    value = node.inputs[2] if len(node.inputs) > 2 else ""
    if value in ctx.values:
        if ctx.values[value].size != 1:
            raise NodeError(node, f"constant_value {ctx.types[value]} is not one value")
        attrs["value"] = np.asarray(ctx.values[value]).item()
    elif value:  # a fill value known only at run time stays an input
        return [Node("Pad", (node.inputs[0], value), node.outputs, attrs, node.name)]
    return [Node("Pad", node.inputs[:1], node.outputs, attrs, node.name)]


def _ints(ctx, node, index, what, required=False) -> list[int] | None:
    """A shape-like input's compile-time value as a list of ints (None if it is absent)."""
    v = ctx.value(node, index, what)
    if v is None:
        if required:
            raise NodeError(node, f"its {what} is required: give it as input {index}")
        return None
    return [int(x) for x in np.reshape(v, -1)]


def _from_value(key, index, what):
    def canon(ctx, node):
        v = _ints(ctx, node, index, what, required=True)
        return [Node(node.op, node.inputs[:index], node.outputs, {**node.attrs, key: v},
                     node.name)]
    return canon


def _constant_of_shape(ctx, node):
    shape = _ints(ctx, node, 0, "shape", required=True)
    v = node.attrs.get("value")
    if min(shape, default=0) < 0 or (v is not None and v.size != 1):
        raise NodeError(node, f"shape {shape} has a negative size, or value {v} is not one "
                              "value")
    value = np.zeros((), np.float32) if v is None else np.reshape(v, ())
    check_size(math.prod(shape) * value.itemsize, f"{ctx.where}: node {node.name!r} "
                                                  f"(ConstantOfShape) output {shape}")
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
    if any(v.size != 1 for v in (start, limit, delta)):
        raise NodeError(node, "start, limit and delta must be scalars")
    s, lim, d = (float(np.reshape(v, ()).item()) for v in (start, limit, delta))
    span = (lim - s) / d if d else math.nan
    if not math.isfinite(span):
        raise NodeError(node, f"Range({start}, {limit}, {delta}) has no finite length")
    check_size(max(math.ceil(span), 0) * start.itemsize,
               f"{ctx.where}: node {node.name!r} (Range) output")
    return [Node("Constant", (), node.outputs,
                 {"value": KERNELS["Range"]({}, start, limit, delta)}, node.name)]


def _cast(ctx, node):
    return _cast_to(ctx, node, np_dtype(node.attrs["to"], f"node {node.name!r} target",
                                        ctx.where))


def _cast_to(ctx, node, to: str):
    # A Cast to the type its input has is a copy (exporters write them: Silero's STFT).
    if ctx.types[node.inputs[0]].dtype == to:
        return [Node("Identity", node.inputs[:1], node.outputs[:1], {}, node.name)]
    return [Node("Cast", node.inputs[:1], node.outputs, {"to": to}, node.name)]


def _pow(ctx, node):
    """Pow by a constant 2 of a float is x * x, by 3 (x * x) * x (GPT-2's tanh GELU):
    compiled element-wise products, and what onnxruntime computes for them (its Pow
    multiplies for these two exponents), where numpy's power calls pow()."""
    x, y = node.inputs[:2]
    e, tx = ctx.values.get(y), ctx.types[x]
    if e is not None and e.size == 1 and e.ndim <= len(tx.shape) \
            and tx.dtype in ("float32", "float64"):
        k = float(np.reshape(e, -1)[0])
        if k == 2.0:
            return [Node("Mul", (x, x), node.outputs, {}, node.name)]
        if k == 3.0:
            square = node.outputs[0] + "/square"
            return [Node("Mul", (x, x), (square,), {}, node.name + "/square"),
                    Node("Mul", (square, x), node.outputs, {}, node.name)]
    return [node]


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
    "Cast": _cast, "CastLike": lambda ctx, node: _cast_to(ctx, node,
                                                          ctx.types[node.inputs[1]].dtype),
    "Pow": _pow, "Einsum": einsum_as_matmul,
    "Shape": _shape, "Range": _range, "PRelu": _prelu, "Dropout": _dropout,
    "QuantizeLinear": _quantize_linear, "DequantizeLinear": _dequantize_linear,
    # If, Loop, Scan (bodies imported with the outer scope visible), LSTM, GRU, RNN
    **CONTROL_CANONICALIZE,
}


# ---- operators of issue #12: normalizations, activations, indexing, Resize, ConvTranspose --


# The attributes' kinds and values (choices, ranges, axes) are held to the operator table
# (specs.py) before these run, and so are the compile-time inputs read through
# ``_optional_value`` (TopK's k, OneHot's depth, ...): what is left here are the rules that
# need the input types.


def _with_defaults(defaults):
    def canon(ctx, node):
        return [Node(node.op, node.inputs, node.outputs, {**defaults, **node.attrs},
                     node.name)]
    return canon


def _optional_value(ctx, node, index, what):
    """A compile-time input that may be absent or empty (None then), held to its rule in
    the operator table."""
    v = ctx.value(node, index, what)
    if v is None or np.size(v) == 0:
        return None
    return check_value(node, index, np.asarray(v), _rank(ctx, node))


def _scalar(ctx, node, index, what, default=None):
    v = _optional_value(ctx, node, index, what)
    if v is None:
        if default is None:
            raise NodeError(node, f"its {what} input is required")
        return default
    if v.size != 1:
        raise NodeError(node, f"its {what} must be one value, got shape {list(v.shape)}")
    return v.reshape(-1)[0].item()


def _stash_type(ctx, node, a):
    return np_dtype(a.get("stash_type", 1), f"node {node.name!r} stash_type", ctx.where)


def _layer_norm(ctx, node):
    a = {"axis": -1, "epsilon": 1e-5, **node.attrs}
    a["axis"] = _axis(node, a["axis"], _rank(ctx, node))
    a["stash_type"] = _stash_type(ctx, node, a)
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


def _group_norm(ctx, node):
    """Scale and bias per channel (opset 21); opset 18's per-group ones (G values) are
    repeated C/G times by nodes in front (folded when they are constants)."""
    a = {"epsilon": 1e-5, **node.attrs}
    if _rank(ctx, node) < 2:
        raise NodeError(node, f"input {ctx.types[node.inputs[0]]} must be [N, C, ...]")
    a["stash_type"] = _stash_type(ctx, node, a)
    groups, channels = a["num_groups"], ctx.types[node.inputs[0]].shape[1]
    if channels % groups:
        raise NodeError(node, f"{channels} channels do not split into num_groups={groups}")
    want = channels if ctx.opset >= 21 else groups
    for v in node.inputs[1:3]:
        if ctx.types[v].shape != (want,):
            raise NodeError(node, f"scale and bias must have shape [{want}] (opset "
                                  f"{ctx.opset}), {v!r} is {ctx.types[v]}")
    if ctx.opset >= 21:
        return [Node(node.op, node.inputs, node.outputs, a, node.name)]
    nodes, inputs = [], [node.inputs[0]]
    for v, what in zip(node.inputs[1:3], ("scale", "bias")):
        out = f"{node.outputs[0]}/{what}"
        nodes += [Node("Reshape", (v,), (out + "/g1",), {"shape": [groups, 1]},
                       f"{node.name}/{what}/reshape"),
                  Node("Expand", (out + "/g1",), (out + "/gc",),
                       {"shape": [groups, channels // groups]}, f"{node.name}/{what}/expand"),
                  Node("Reshape", (out + "/gc",), (out,), {"shape": [channels]},
                       f"{node.name}/{what}/flatten")]
        inputs.append(out)
    return nodes + [Node(node.op, tuple(inputs), node.outputs, a, node.name)]


def _lp_norm(ctx, node):
    a = {"axis": -1, "p": 2, **node.attrs}
    a["axis"] = _axis(node, a["axis"], _rank(ctx, node))
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


def _arg_extreme(ctx, node):
    a = {"axis": 0, "keepdims": 1, "select_last_index": 0, **node.attrs}
    a["axis"] = _axis(node, a["axis"], _rank(ctx, node))
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


def _top_k(ctx, node):
    a = {"axis": -1, "largest": 1, "sorted": 1, **node.attrs}
    a["axis"] = _axis(node, a["axis"], _rank(ctx, node))
    a["k"] = int(_scalar(ctx, node, 1, "K"))
    return [Node("TopK", node.inputs[:1], node.outputs, a, node.name)]


def _cum_sum(ctx, node):
    """CumSum and CumProd: the axis input as an attribute."""
    a = {"exclusive": 0, "reverse": 0, **node.attrs}
    a["axis"] = _axis(node, int(_scalar(ctx, node, 1, "axis")), _rank(ctx, node))
    return [Node(node.op, node.inputs[:1], node.outputs, a, node.name)]


def _scatter_elements(ctx, node):
    a = {"axis": 0, "reduction": "none", **node.attrs}
    a["axis"] = _axis(node, a["axis"], _rank(ctx, node))
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


def _trilu(ctx, node):
    if _rank(ctx, node) < 2:
        raise NodeError(node, f"input {ctx.types[node.inputs[0]]} must have rank >= 2")
    a = {"upper": 1, **node.attrs, "k": int(_scalar(ctx, node, 1, "k", 0))}
    return [Node("Trilu", node.inputs[:1], node.outputs, a, node.name)]


def _non_zero(ctx, node):
    ctx.value(node, 0, "input")  # the output's size is the count of nonzero values
    return [node]


def _one_hot(ctx, node):
    rank = _rank(ctx, node) + 1
    depth = _scalar(ctx, node, 1, "depth")
    a = {"axis": _axis(node, node.attrs.get("axis", -1), rank), "depth": int(depth)}
    if ctx.types[node.inputs[2]].size != 2:
        raise NodeError(node, f"values must hold [off, on], got {ctx.types[node.inputs[2]]}")
    return [Node("OneHot", (node.inputs[0], node.inputs[2]), node.outputs, a, node.name)]


def _blocks(ctx, node):
    if _rank(ctx, node) != 4:
        raise NodeError(node, f"input {ctx.types[node.inputs[0]]} must be 4-D")
    a = {"mode": "DCR", **node.attrs}
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


def _conv_transpose(ctx, node):
    """Explicit kernel_shape, strides, pads, dilations, output_padding, group;
    ``output_shape`` and ``auto_pad`` become pads (ONNX's total_padding rule; a larger
    output_shape gives negative pads, extra zeros)."""
    x, w = ctx.types[node.inputs[0]].shape, ctx.types[node.inputs[1]].shape
    nd = len(x) - 2
    a = dict(node.attrs)
    kernel = list(a.pop("kernel_shape", None) or w[2:])
    strides = list(a.pop("strides", [1] * nd))
    dil = list(a.pop("dilations", [1] * nd))
    out_pad = list(a.pop("output_padding", [0] * nd))
    auto, pads = a.pop("auto_pad", "NOTSET"), list(a.pop("pads", [0] * (2 * nd)))
    out_shape = a.pop("output_shape", None)
    if out_shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [x[2 + i] * strides[i] for i in range(nd)]
    if auto == "VALID":
        pads = [0] * (2 * nd)
    if out_shape is not None:
        for i in range(nd):
            total = (strides[i] * (x[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1
                     - out_shape[i])
            if auto == "SAME_UPPER":  # halves rounded toward zero, as onnxruntime
                pads[i] = int(total / 2)
                pads[i + nd] = total - pads[i]
            else:
                pads[i], pads[i + nd] = total - total // 2, total // 2
    if [len(kernel), len(strides), len(dil), len(out_pad), len(pads)] != [nd] * 4 + [2 * nd]:
        raise NodeError(node, f"kernel_shape {kernel}, strides {strides}, dilations {dil}, "
                              f"output_padding {out_pad} and pads {pads} do not fit a "
                              f"{nd}-d input")
    a.update(kernel_shape=kernel, strides=strides, pads=pads, dilations=dil,
             output_padding=out_pad, group=a.get("group", 1))
    return [Node("ConvTranspose", node.inputs, node.outputs, a, node.name)]


_RESIZE = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
           "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75, "exclude_outside": 0,
           "extrapolation_value": 0.0, "antialias": 0}


def _resize_shape(node, in_shape, axes, scales, sizes, policy):
    """(output sizes, scales) for every axis from the given scales or sizes. Sizes from
    scales are floor(float32(scale) * size), as onnxruntime computes them; scales from
    sizes are the exact ratios (the kernel rounds them to its coordinate type)."""
    f32, rank = np.float32, len(in_shape)
    out, factors = list(in_shape), [1.0] * rank
    if sizes is not None:
        ratio = {ax: s / max(in_shape[ax], 1) for ax, s in zip(axes, sizes)}
        if policy != "stretch":  # one factor for every axis, the sizes rounded
            keep = (min if policy == "not_larger" else max)(ratio.values())
            ratio = dict.fromkeys(axes, keep)
            sizes = [int(math.floor(keep * in_shape[ax] + 0.5)) for ax in axes]
        for ax, s in zip(axes, sizes):
            out[ax], factors[ax] = int(s), float(ratio[ax])
    else:
        for ax, s in zip(axes, scales):
            if not s > 0:
                raise NodeError(node, f"scale {s} on axis {ax} must be positive")
            out[ax], factors[ax] = int(f32(s) * f32(in_shape[ax])), float(f32(s))
    if min(out, default=0) < 0:
        raise NodeError(node, f"output sizes {out} must not be negative")
    return out, factors


def _resize(ctx, node):
    in_shape = ctx.types[node.inputs[0]].shape
    rank = len(in_shape)
    legacy = {}
    if ctx.source_opset < 11 and "coordinate_transformation_mode" not in node.attrs:
        # Made by onnx's version converter from an opset-10 Resize or an Upsample, which
        # it does not give their asymmetric coordinates: the opset-11 default would shift
        # the picture by half a pixel.
        legacy = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    a = {**_RESIZE, "keep_aspect_ratio_policy": "stretch", **legacy, **node.attrs}
    policy = a.pop("keep_aspect_ratio_policy")
    axes = a.pop("axes", None)
    axes = list(range(rank)) if axes is None else [_axis(node, x, rank) for x in axes]
    # Shape-like inputs are read flat, as Reshape's shape and the others are.
    scales, sizes = (None if v is None else v.reshape(-1) for v in (
        _optional_value(ctx, node, 2, "scales"), _optional_value(ctx, node, 3, "sizes")))
    if (scales is None) == (sizes is None):
        raise NodeError(node, "exactly one of scales and sizes must be given")
    given = scales if sizes is None else sizes
    if given.size != len(axes):
        raise NodeError(node, f"{given.size} scales or sizes for {len(axes)} axes")
    out, factors = _resize_shape(node, in_shape, axes, None if scales is None else
                                 [float(s) for s in scales], None if sizes is None else
                                 [int(s) for s in sizes], policy)
    a.update(sizes=out, scales=factors)
    if a["coordinate_transformation_mode"] == "tf_crop_and_resize":
        roi = _optional_value(ctx, node, 1, "roi")
        roi = None if roi is None else roi.reshape(-1)
        if roi is None or roi.size != 2 * len(axes):
            raise NodeError(node, f"tf_crop_and_resize needs a roi of {2 * len(axes)} values")
        full = [0.0] * rank + [1.0] * rank
        for k, ax in enumerate(axes):
            full[ax], full[ax + rank] = float(roi[k]), float(roi[k + len(axes)])
        a["roi"] = full
    return [Node("Resize", node.inputs[:1], node.outputs, a, node.name)]


def _upsample(ctx, node):
    """Upsample (deprecated since opset 10) is Resize with asymmetric coordinates and
    the floor of them for nearest."""
    mode = {"bilinear": "linear"}.get(node.attrs.get("mode", "nearest"),
                                      node.attrs.get("mode", "nearest"))
    scales = node.attrs.get("scales")
    if scales is None:
        scales = [float(s) for s in np.reshape(ctx.value(node, 1, "scales"), -1)]
    in_shape = ctx.types[node.inputs[0]].shape
    if len(scales) != len(in_shape):
        raise NodeError(node, f"scales {list(scales)} must have one value per axis of the "
                              f"input {ctx.types[node.inputs[0]]}")
    out, factors = _resize_shape(node, in_shape, range(len(in_shape)), scales, None,
                                 "stretch")
    a = {**_RESIZE, "mode": mode, "coordinate_transformation_mode": "asymmetric",
         "nearest_mode": "floor", "sizes": out, "scales": factors}
    return [Node("Resize", node.inputs[:1], node.outputs, a, node.name)]


CANONICALIZE.update({
    "LayerNormalization": _layer_norm, "GroupNormalization": _group_norm,
    "InstanceNormalization": _with_defaults({"epsilon": 1e-5}),
    "LpNormalization": _lp_norm, "Hardmax": _softmax,
    "Gelu": _with_defaults({"approximate": "none"}),
    "Celu": _with_defaults({"alpha": 1.0}), "ThresholdedRelu": _with_defaults({"alpha": 1.0}),
    "Shrink": _with_defaults({"bias": 0.0, "lambd": 0.5}),
    "Mod": _with_defaults({"fmod": 0}),
    "IsInf": _with_defaults({"detect_negative": 1, "detect_positive": 1}),
    "ReduceL1": _reduce, "ReduceL2": _reduce, "ReduceLogSum": _reduce,
    "ReduceLogSumExp": _reduce, "ReduceSumSquare": _reduce,
    "ArgMax": _arg_extreme, "ArgMin": _arg_extreme, "TopK": _top_k, "CumSum": _cum_sum,
    "GatherElements": _with_axis(0), "ScatterElements": _scatter_elements,
    "GatherND": _with_defaults({"batch_dims": 0}),
    "ScatterND": _with_defaults({"reduction": "none"}),
    "Trilu": _trilu, "NonZero": _non_zero, "OneHot": _one_hot,
    "DepthToSpace": _blocks, "SpaceToDepth": _blocks,
    "ConvTranspose": _conv_transpose, "Resize": _resize, "Upsample": _upsample,
})


# ---- element-wise math, integer products, signals (graph/ops_signal.py) ---------------------


def _rms_norm(ctx, node):
    a = {"epsilon": 1e-5, "stash_type": 1, **node.attrs}
    a["axis"] = _axis(node, a.get("axis", -1), _rank(ctx, node))
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


def _reverse_sequence(ctx, node):
    a = {"batch_axis": 1, "time_axis": 0, **node.attrs}
    if a["batch_axis"] == a["time_axis"] or _rank(ctx, node) < 2:
        raise NodeError(node, f"batch_axis {a['batch_axis']} and time_axis {a['time_axis']} "
                              f"must differ, on an input of rank >= 2 "
                              f"({ctx.types[node.inputs[0]]})")
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


def _dft(ctx, node):
    """The DFT's length and axis (an attribute before opset 20, an input from it, default
    -2: an axis of the signal, never its last, complex axis) as attributes."""
    rank = _rank(ctx, node)
    if len(node.inputs) > 2 and node.inputs[2]:
        axis = int(_scalar(ctx, node, 2, "axis"))
    else:
        axis = node.attrs.get("axis", 1 if ctx.source_opset < 20 else -2)
    axis = _axis(node, axis, rank)
    if axis == rank - 1:
        raise NodeError(node, f"axis {axis} is the signal's last axis (real and imaginary "
                              f"parts) of {ctx.types[node.inputs[0]]}; transform another")
    a = {"inverse": node.attrs.get("inverse", 0), "onesided": node.attrs.get("onesided", 0),
         "axis": axis, "length": int(_scalar(ctx, node, 1, "dft_length", 0))}
    return [Node("DFT", node.inputs[:1], node.outputs, a, node.name)]


def _stft(ctx, node):
    """STFT's frame step and length as attributes; the window stays an input."""
    a = {"onesided": node.attrs.get("onesided", 1),
         "frame_step": int(_scalar(ctx, node, 1, "frame_step")),
         "frame_length": int(_scalar(ctx, node, 3, "frame_length", 0))}
    window = node.inputs[2] if len(node.inputs) > 2 else ""
    inputs = (node.inputs[0], window) if window else node.inputs[:1]
    return [Node("STFT", inputs, node.outputs, a, node.name)]


def _signal_constant(ctx, node):
    """A window or mel filter bank of compile-time sizes: a constant."""
    values = [ctx.value(node, i, f"input {i}") for i in range(len(node.inputs))]
    if node.op.endswith("Window"):
        size = int(_scalar(ctx, node, 0, "size"))
        check_size(max(size, 0) * 8, f"{ctx.where}: node {node.name!r} ({node.op}) output")
    out = KERNELS[node.op](node.attrs, *values)
    check_size(out.nbytes, f"{ctx.where}: node {node.name!r} ({node.op}) output")
    return [Node("Constant", (), node.outputs, {"value": out}, node.name)]


CANONICALIZE.update({
    "Swish": _with_defaults({"alpha": 1.0}), "EyeLike": _with_defaults({"k": 0}),
    "CumProd": _cum_sum, "ReverseSequence": _reverse_sequence, "RMSNormalization": _rms_norm,
    "ConvInteger": _conv_like(1), "QLinearConv": _conv_like(3),
    "DFT": _dft, "STFT": _stft, "HannWindow": _signal_constant,
    "HammingWindow": _signal_constant, "BlackmanWindow": _signal_constant,
    "MelWeightMatrix": _signal_constant,
})


# ---- vision and detection operators (graph/ops_vision.py) -----------------------------------


def _grid_sample(ctx, node):
    """Modes by their opset-20 names (opset 16's bilinear and bicubic mean the same)."""
    if _rank(ctx, node) < 3:
        raise NodeError(node, f"input {ctx.types[node.inputs[0]]} must have rank >= 3")
    a = {"align_corners": 0, "padding_mode": "zeros", **node.attrs}
    mode = a.get("mode", "linear")
    a["mode"] = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    return [Node("GridSample", node.inputs, node.outputs, a, node.name)]


def _shape_value(ctx, node, index, what):
    """A shape input as ints, held to its rule in the operator table."""
    v = _ints(ctx, node, index, what, required=True)
    check_value(node, index, np.array(v, np.int64), _rank(ctx, node))
    return v


def _affine_grid(ctx, node):
    size = _shape_value(ctx, node, 1, "size")
    if len(size) not in (4, 5):
        raise NodeError(node, f"size {size} must be [N, C, H, W] or [N, C, D, H, W]")
    a = {"align_corners": 0, **node.attrs, "size": size}
    return [Node("AffineGrid", node.inputs[:1], node.outputs, a, node.name)]


def _roi_align(ctx, node):
    """Opset 16 added half_pixel, its new default; before it the regions were not shifted
    (output_half_pixel)."""
    mode = "half_pixel" if ctx.opset >= 16 else "output_half_pixel"
    a = {"coordinate_transformation_mode": mode, "mode": "avg", "output_height": 1,
         "output_width": 1, "sampling_ratio": 0, "spatial_scale": 1.0, **node.attrs}
    return [Node("RoiAlign", node.inputs, node.outputs, a, node.name)]


def _lp_pool(ctx, node):
    attrs = _window_attrs(ctx, node, node.attrs["kernel_shape"])
    attrs.setdefault("ceil_mode", 0)
    attrs.setdefault("p", 2)
    return [Node("LpPool", node.inputs, node.outputs, attrs, node.name)]


def _mvn(ctx, node):
    rank = _rank(ctx, node)
    axes = [_axis(node, ax, rank) for ax in node.attrs.get("axes", [0, 2, 3])]
    return [Node(node.op, node.inputs, node.outputs, {"axes": axes}, node.name)]


def _max_unpool(ctx, node):
    x = ctx.types[node.inputs[0]].shape
    kernel = node.attrs["kernel_shape"]
    nd = len(kernel)
    strides = node.attrs.get("strides", [1] * nd)
    pads = node.attrs.get("pads", [0] * (2 * nd))
    given = _optional_value(ctx, node, 2, "output_shape")
    if given is not None:
        out = [int(v) for v in given.reshape(-1)]
    else:
        out = [x[0], x[1]] + [(x[2 + i] - 1) * strides[i] - pads[i] - pads[i + nd] + kernel[i]
                              for i in range(nd)]
        if min(out) < 1:
            raise NodeError(node, f"kernel {kernel}, strides {strides} and pads {pads} leave "
                                  f"no output for the input {ctx.types[node.inputs[0]]}")
    a = {"kernel_shape": kernel, "strides": strides, "pads": pads, "output_shape": out}
    return [Node("MaxUnpool", node.inputs[:2], node.outputs, a, node.name)]


def _col2im(ctx, node):
    image = _shape_value(ctx, node, 1, "image_shape")
    block = _shape_value(ctx, node, 2, "block_shape")
    nd = len(image)
    if len(block) != nd:
        raise NodeError(node, f"image_shape {image} and block_shape {block} must have the "
                              "same length")
    a = {"dilations": [1] * nd, "pads": [0] * (2 * nd), "strides": [1] * nd, **node.attrs,
         "image_shape": image, "block_shape": block}
    for key, want in (("dilations", nd), ("pads", 2 * nd), ("strides", nd)):
        if len(a[key]) != want:
            raise NodeError(node, f"attribute {key!r} = {a[key]} must have {want} values for "
                                  f"images of {nd} dimensions")
    return [Node("Col2Im", node.inputs[:1], node.outputs, a, node.name)]


def _center_crop_pad(ctx, node):
    rank = _rank(ctx, node)
    shape = _shape_value(ctx, node, 1, "shape")
    axes = [_axis(node, ax, rank) for ax in node.attrs.get("axes", range(rank))]
    if len(shape) != len(axes):
        raise NodeError(node, f"shape {shape} must have one size per axis of {axes}")
    return [Node("CenterCropPad", node.inputs[:1], node.outputs,
                 {"axes": axes, "shape": shape}, node.name)]


def _deform_conv(ctx, node):
    w = ctx.types[node.inputs[1]].shape
    if _rank(ctx, node) != 4 or len(w) != 4:
        raise NodeError(node, f"input {ctx.types[node.inputs[0]]} and weight "
                              f"{ctx.types[node.inputs[1]]} must be 4-D (celosia takes 2-D "
                              "DeformConv)")
    kernel = list(node.attrs.get("kernel_shape", w[2:]))
    if kernel != list(w[2:]):
        raise NodeError(node, f"kernel_shape {kernel} differs from the weight's "
                              f"{ctx.types[node.inputs[1]]}")
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1,
         "offset_group": 1, **node.attrs, "kernel_shape": kernel}
    return [Node("DeformConv", node.inputs, node.outputs, a, node.name)]


CANONICALIZE.update({
    "GridSample": _grid_sample, "AffineGrid": _affine_grid,
    "NonMaxSuppression": _with_defaults({"center_point_box": 0}),
    "RoiAlign": _roi_align, "MaxRoiPool": _with_defaults({"spatial_scale": 1.0}),
    "LRN": _with_defaults({"alpha": 1e-4, "beta": 0.75, "bias": 1.0}),
    "LpPool": _lp_pool, "GlobalLpPool": _with_defaults({"p": 2}),
    "MeanVarianceNormalization": _mvn, "MaxUnpool": _max_unpool, "Col2Im": _col2im,
    "CenterCropPad": _center_crop_pad, "DeformConv": _deform_conv,
})


# ---- data-dependent operators (graph/ops_data.py) -----------------------------------------


def _tensor_scatter(ctx, node):
    """The sequence axis non-negative, after the batch axis; the update the cache's shape
    but along it."""
    past, update = ctx.types[node.inputs[0]], ctx.types[node.inputs[1]]
    rank = len(past.shape)
    axis = _axis(node, node.attrs.get("axis", -2), rank)
    if axis == 0:
        raise NodeError(node, f"axis {node.attrs.get('axis', -2)} is the batch axis; the "
                              "sequence axis must come after it")
    fits = len(update.shape) == rank and all(
        u is None or p is None or (u <= p if i == axis else u == p)
        for i, (u, p) in enumerate(zip(update.shape, past.shape)))
    if not fits:
        raise NodeError(node, f"update {update} must have the shape of the cache {past} but "
                              f"along axis {axis}, at most as long there")
    a = {"mode": "linear", **node.attrs, "axis": axis}
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


CANONICALIZE.update({
    "TensorScatter": _tensor_scatter,
})


# ---- random operators (graph/ops_random.py) -------------------------------------------------


def _random(ctx, node):
    """Onnx's defaults made explicit, and the spreads a distribution needs: a positive
    scale (onnxruntime's normal distribution aborts the process on 0) and low <= high."""
    a = dict(node.attrs)
    if node.op.startswith("RandomNormal"):
        a = {"mean": 0.0, "scale": 1.0, **a}
        if not a["scale"] > 0:
            raise NodeError(node, f"scale {a['scale']} must be positive (the normal "
                                  "distribution's standard deviation)")
    elif node.op.startswith("RandomUniform"):
        a = {"low": 0.0, "high": 1.0, **a}
        if not a["low"] <= a["high"]:
            raise NodeError(node, f"low {a['low']} must not exceed high {a['high']}")
    return [Node(node.op, node.inputs, node.outputs, a, node.name)]


CANONICALIZE.update({op: _random for op in ("RandomNormal", "RandomUniform",
                                            "RandomNormalLike", "RandomUniformLike")})
