"""ONNX -> graph IR: load, check opset and operators, make every shape static, canonicalize.

``import_onnx`` keeps the model's nodes (constant folding is a pass, graph_passes.py) but
needs the values of shape-like inputs (Reshape's shape, Slice's starts, ...) to make shapes
static: it propagates the values of nodes whose inputs are all known (and of Shape/Size,
known from static shapes) with the numpy kernels, and turns those inputs into attributes.

Opsets: the contract is the default-domain opsets 11 to 21. A model of an older opset is
upgraded to 11 by onnx's version converter first. A newer model (up to the installed onnx's
latest) is taken node by node when each node's operator version is at most
``MAX_OP_VERSION``: the versions 22 to 28 of the supported operators only add tensor types
(bfloat16, float8, int4, ...), so their meaning is unchanged.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ..graph.ir import (
    DynamicShapeError,
    Graph,
    GraphError,
    InputShapeError,
    ModelLoadError,
    Node,
    NodeError,
    TensorType,
    UnsupportedOperatorError,
    UnsupportedOpsetError,
    constant,
    verify_graph,
)
from ..graph.ops import KERNELS
from ..graph.reference import evaluate_node, infer_node, stand_in

__all__ = ["import_onnx", "SUPPORTED_OPS", "MIN_OPSET", "MAX_OPSET", "MAX_OP_VERSION"]

MIN_OPSET, MAX_OPSET = 11, 21
MAX_OP_VERSION = 28
# Ops rewritten at import: Constant becomes an initializer, CastLike a Cast.
_IMPORT_ONLY = ("Constant", "CastLike")
SUPPORTED_OPS = tuple(sorted(set(KERNELS) | set(_IMPORT_ONLY)))
# Ops always evaluated at compile time when their input's shape is static.
_SHAPE_OPS = ("Shape", "Size")


# ---- loading ---------------------------------------------------------------------------------


def _load(model):
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        return model, "<model>"
    where = str(model) if isinstance(model, (str, os.PathLike)) else "<bytes>"
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model)), where
        if not Path(model).is_file():
            raise ModelLoadError(f"{where}: no such file")
        return onnx.load(str(model)), where
    except ModelLoadError:
        raise
    except (DecodeError, RuntimeError, ValueError, OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{where}: not a readable ONNX model (truncated or corrupt file?): "
                             f"{type(e).__name__}: {e}") from None


def _default_opset(model, where) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise UnsupportedOpsetError(f"{where}: the model imports no default-domain (ai.onnx) "
                                    "opset; re-export it with an opset from 11 to 21")
    return versions[0]


def _upgrade(model, opset, where):
    import onnx
    import onnx.defs
    import onnx.version_converter

    latest = onnx.defs.onnx_opset_version()
    if opset > latest:
        raise UnsupportedOpsetError(
            f"{where}: opset {opset} is newer than this onnx ({latest}) knows; re-export the "
            f"model with an opset from {MIN_OPSET} to {MAX_OPSET}")
    if opset >= MIN_OPSET:
        return model, opset
    try:
        model = onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # the converter raises bare RuntimeErrors and C++ errors
        raise UnsupportedOpsetError(
            f"{where}: opset {opset} is older than {MIN_OPSET} and onnx's version converter "
            f"cannot upgrade it ({e}); re-export the model with an opset from {MIN_OPSET} to "
            f"{MAX_OPSET}") from None
    return model, MIN_OPSET


def _check_operators(model, opset, where):
    import onnx.defs

    bad = []
    for k, n in enumerate(model.graph.node):
        name = n.name or f"{n.op_type}_{k}"
        if n.domain not in ("", "ai.onnx"):
            bad.append((name, n.op_type, f"domain {n.domain}"))
        elif n.op_type not in SUPPORTED_OPS:
            bad.append((name, n.op_type, ""))
        else:
            try:
                version = onnx.defs.get_schema(n.op_type, opset).since_version
            except Exception:
                version = None
            if version is None or version > MAX_OP_VERSION:
                bad.append((name, n.op_type, f"version {version} is newer than the importer "
                                             f"knows ({MAX_OP_VERSION})"))
    if bad:
        raise UnsupportedOperatorError(bad)


# ---- the import ------------------------------------------------------------------------------


def import_onnx(model, input_shapes: dict | None = None, *, bind_inputs: dict | None = None
                ) -> Graph:
    """Import an ONNX model (a path, bytes or ``onnx.ModelProto``) into a static graph.

    ``input_shapes`` ({input name: shape}) fixes inputs whose shapes are dynamic in the
    model (or overrides them). ``bind_inputs`` ({input name: array}) turns inputs into
    constants, for inputs that hold shapes (a Reshape's target given as an input).
    Raises a GraphError subclass for every model it cannot take.
    """
    from onnx import helper, numpy_helper

    proto, where = _load(model)
    source_opset = _default_opset(proto, where)
    proto, opset = _upgrade(proto, source_opset, where)
    _check_operators(proto, opset, where)
    g = proto.graph
    ctx = _Importer(opset, where, source_opset)
    try:
        for init in g.initializer:
            ctx.add_constant(init.name, numpy_helper.to_array(init))
    except Exception as e:
        raise ModelLoadError(f"{where}: initializer {init.name!r} cannot be read "
                             f"({type(e).__name__}: {e}); is the file truncated?") from None
    bind_inputs = dict(bind_inputs or {})
    shapes = dict(input_shapes or {})
    names = [i.name for i in g.input if i.name not in ctx.values]
    unknown = (set(shapes) | set(bind_inputs)) - set(names)
    if unknown:
        raise InputShapeError(f"{where}: no input named {sorted(unknown)}; the model's inputs "
                              f"are {names}")
    dynamic = []
    for vi in g.input:
        if vi.name in ctx.values:
            continue  # an initializer listed as an input (older exporters): a constant
        if vi.name in bind_inputs:
            ctx.add_constant(vi.name, np.asarray(bind_inputs[vi.name]))
            continue
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise GraphError(f"{where}: input {vi.name!r} is not a tensor (sequences, maps "
                             "and optionals are not supported)")
        dtype = _np_dtype(t.elem_type, f"input {vi.name!r}", where)
        # A dimension: its size, or its symbolic name (dim_param), or None when unnamed.
        dims = ([d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in t.shape.dim] if t.HasField("shape") else None)
        if vi.name in shapes:
            shape = tuple(int(d) for d in shapes[vi.name])
            if dims is not None and (len(dims) != len(shape) or any(
                    isinstance(d, int) and d != s for d, s in zip(dims, shape))):
                raise InputShapeError(
                    f"{where}: input {vi.name!r} is {_dims_str(dims)} in the model; the given "
                    f"shape {_dims_str(shape)} does not match it")
            if any(s < 0 for s in shape):
                raise InputShapeError(f"{where}: input {vi.name!r}: shape {_dims_str(shape)} "
                                      "has a negative size")
        elif dims is None or not all(isinstance(d, int) for d in dims):
            dynamic.append((vi.name, dims))
            continue
        else:
            shape = tuple(dims)
        ctx.inputs.append(vi.name)
        ctx.types[vi.name] = TensorType(dtype, shape)
        ctx.depends[vi.name] = frozenset([vi.name])
    if dynamic:
        listed = "; ".join(f"{n!r} is {_dims_str(d)}" for n, d in dynamic)
        example = " ".join(
            f"{n}=" + ",".join(str(x) if isinstance(x, int) else "<size>" for x in (d or ["..."]))
            for n, d in dynamic)
        raise DynamicShapeError(
            f"{where}: inputs with dynamic shapes: {listed}. celosia compiles static shapes: "
            f"give each one (input_shapes={{name: shape}}; command line: --input-shape "
            f"{example})")
    used = set()
    for k, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{k}"
        while name in used:
            name += "_"
        used.add(name)
        attrs = {a.name: _attr_value(a, helper, numpy_helper) for a in n.attribute}
        node = Node(n.op_type, tuple(n.input), tuple(n.output), attrs, name)
        for i in node.inputs:
            if i and i not in ctx.types:
                raise ModelLoadError(
                    f"{where}: node {name!r} ({n.op_type}) reads {i!r}, which no input, "
                    "initializer or earlier node defines (nodes out of order, or a "
                    "truncated file)")
        ctx.add_node(node)
    outputs = [o.name for o in g.output]
    for o in outputs:
        if o not in ctx.types:
            raise ModelLoadError(f"{where}: graph output {o!r} is never computed")
    graph = Graph(g.name or "model", tuple(ctx.inputs), tuple(outputs), tuple(ctx.nodes),
                  ctx.initializers, ctx.types)
    verify_graph(graph)
    return graph


def _dims_str(dims) -> str:
    if dims is None:
        return "of unknown rank"
    return "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"  # N for dim_param


def _np_dtype(elem_type, what, where) -> str:
    from onnx import helper

    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        dtype = None
    if dtype is None or dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise GraphError(f"{where}: {what} has element type "
                         f"{helper.tensor_dtype_to_string(elem_type)}, which celosia does not "
                         "support (bool, integers and float16/32/64 are)")
    return str(dtype)


def _attr_value(a, helper, numpy_helper):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    if hasattr(v, "dims") and hasattr(v, "data_type"):  # a TensorProto
        return numpy_helper.to_array(v)
    return v


class _Importer:
    """The state of one import: types and compile-time-known values of every name so far."""

    def __init__(self, opset, where, source_opset):
        self.opset, self.where, self.source_opset = opset, where, source_opset
        self.inputs: list[str] = []
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}
        self.values: dict[str, np.ndarray] = {}
        self.initializers: dict[str, np.ndarray] = {}
        self.depends: dict[str, frozenset] = {}  # value -> the graph inputs it depends on

    def add_constant(self, name, array):
        a = constant(array)
        if a.dtype.kind not in "biuf":
            raise GraphError(f"{self.where}: constant {name!r} has dtype {a.dtype}, which "
                             "celosia does not support")
        self.initializers[name] = self.values[name] = a
        self.types[name] = TensorType(str(a.dtype), a.shape)

    def value(self, node: Node, index: int, what: str):
        """The compile-time value of an input that determines a shape."""
        if index >= len(node.inputs) or not node.inputs[index]:
            return None
        name = node.inputs[index]
        if name not in self.values:
            inputs = sorted(self.depends.get(name, ()))
            err = DynamicShapeError(
                f"node {node.name!r} ({node.op}): its {what} {name!r} is only known at run "
                f"time (it depends on the inputs {inputs}), so the output shape is not static; "
                "make it a constant (an initializer) or bind those inputs (bind_inputs)")
            err.inputs = inputs
            raise err
        return self.values[name]

    def add_node(self, node: Node):
        canon = _CANONICALIZE.get(node.op)
        nodes = canon(self, node) if canon else [node]
        for n in nodes:
            self._add(n)

    def _add(self, node: Node):
        if node.op == "Constant":
            self.add_constant(node.outputs[0], _constant_value(node))
            return
        types = [self.types[i] if i else None for i in node.inputs]
        values = [self.values.get(i) if i else None for i in node.inputs]
        out_types = infer_node(node, types, values)
        deps = frozenset().union(*(self.depends.get(i, ()) for i in node.inputs))
        for o, t in zip(node.outputs, out_types):
            if o:
                self.types[o] = t
                self.depends[o] = deps
        known = node.op in _SHAPE_OPS or all(v is not None for i, v in zip(node.inputs, values)
                                             if i)
        if node.op in _SHAPE_OPS:
            values = [stand_in(types[0])]
        if known and not (node.op == "BatchNormalization" and node.attrs.get("training_mode")):
            for o, v in zip(node.outputs, evaluate_node(node, values)):
                if o:
                    self.values[o] = v
        self.nodes.append(node)


def _constant_value(node: Node) -> np.ndarray:
    a = node.attrs
    if "value" in a:
        return a["value"]
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in a:
            return np.array(a[key], dtype=dtype)
    raise NodeError(node, f"constant of kind {sorted(a)} is not supported (tensor, float(s) "
                          "and int(s) are)")


# ---- canonical forms (see graph.py) ----------------------------------------------------------


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
                 {"to": _np_dtype(node.attrs["to"], f"node {node.name!r} target", ctx.where)},
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
        out = _np_dtype(node.attrs["output_dtype"], f"node {node.name!r} output", ctx.where)
    else:
        out = "uint8"
    precision = (_np_dtype(node.attrs["precision"], f"node {node.name!r} precision", ctx.where)
                 if node.attrs.get("precision") else ctx.types[node.inputs[1]].dtype)
    attrs = {**_quantize_axis(ctx, node), "output_dtype": out, "precision": precision}
    return [Node(node.op, node.inputs, node.outputs, attrs, node.name)]


def _dequantize_linear(ctx, node):
    """Explicit output type (``output_dtype``, else the scale's type)."""
    out = (_np_dtype(node.attrs["output_dtype"], f"node {node.name!r} output", ctx.where)
           if node.attrs.get("output_dtype") else ctx.types[node.inputs[1]].dtype)
    attrs = {**_quantize_axis(ctx, node), "output_dtype": out}
    return [Node(node.op, node.inputs, node.outputs, attrs, node.name)]


def _dropout(ctx, node):
    if len(node.outputs) > 1 and node.outputs[1]:
        return [Node("Dropout", node.inputs[:1], node.outputs, {}, node.name)]
    return [Node("Identity", node.inputs[:1], node.outputs[:1], {}, node.name)]


_CANONICALIZE = {
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
}
