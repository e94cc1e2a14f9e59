"""What celosia takes of each ONNX operator, declared once as data, and the checks that hold
every node to it before anything reads the node.

``SPECS[op]`` is an :class:`OpSpec`: the operator's inputs and outputs by name (``x?`` is
optional, ``x...`` one or more), and every attribute any opset from 11 on gives it, as an
:class:`Attr`: its kind (int, ints, float, floats, string, strings, tensor) and the values
celosia accepts (a minimum, a set of choices, a length tied to the input's rank, an axis of
the input). The table is a superset over opsets; onnx's checker (onnx.py) holds each node to
its own opset's schema on top of it.

- ``read_node`` checks a protobuf node's arity and each attribute's kind and shape-free range,
  and returns the attributes as Python values (strings decoded, tensors checked before they
  are read);
- ``check_ranks`` checks what needs the input's rank (lengths, axes) once its type is known;
- ``output_bounds`` gives, for operators whose output can outgrow their inputs (broadcasts,
  Expand, Tile, Gather, Pad, Cast), the output sizes to check against celosia.limits before a
  kernel runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..graph.ir import Node, NodeError
from .dtypes import supported_elem_type
from .tensors import read_tensor

__all__ = ["Attr", "OpSpec", "SPECS", "read_node", "check_ranks", "output_bounds"]


@dataclass(frozen=True)
class Attr:
    """One attribute: ``kind``, and what values are accepted.

    ``low``: the least value of an int/float or of each element of ints/floats;
    ``choices``: the only values accepted; ``length``: how many values relative to input 0's
    rank r ("spatial": r-2, "pads": 2(r-2), "rank": r); ``axis``: the value(s) are axes of
    input 0 ("in": [-r, r), "flatten": [-r, r], "out": axes of the output of Unsqueeze);
    ``dtype``: an ONNX element-type code of a type celosia supports; ``unique``: no value
    twice; ``required``: every opset requires it; ``outputs``: an int that equals the node's
    number of outputs, or ints with one value per output.
    """

    kind: str
    low: float | None = None
    choices: tuple = ()
    length: str | None = None
    axis: str | None = None
    dtype: bool = False
    unique: bool = False
    required: bool = False
    outputs: bool = False


@dataclass(frozen=True)
class OpSpec:
    """An operator's inputs and outputs (space-separated names; ``?`` optional, ``...`` one or
    more) and its attributes."""

    inputs: str
    outputs: str
    attrs: dict = field(default_factory=dict)


_BOOL = (0, 1)
_AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_WINDOW = {"kernel_shape": Attr("ints", low=1, length="spatial"),
           "strides": Attr("ints", low=1, length="spatial"),
           "dilations": Attr("ints", low=1, length="spatial"),
           "pads": Attr("ints", low=0, length="pads"),
           "auto_pad": Attr("string", choices=_AUTO_PAD)}
_KERNEL = {"kernel_shape": Attr("ints", low=1, length="spatial", required=True)}
_REDUCE = OpSpec("data axes?", "reduced", {
    "axes": Attr("ints", axis="in", unique=True), "keepdims": Attr("int", choices=_BOOL),
    "noop_with_empty_axes": Attr("int", choices=_BOOL)})
_UNARY = OpSpec("x", "y")
_BINARY = OpSpec("a b", "c")
_VARIADIC = OpSpec("data...", "result")
_ALPHA = OpSpec("x", "y", {"alpha": Attr("float")})
# Cast's saturate and round_mode only change float8 results, which celosia does not make.
_CAST_EXTRA = {"saturate": Attr("int", choices=_BOOL),
               "round_mode": Attr("string", choices=("up", "down", "nearest"))}
_QUANTIZE = {"axis": Attr("int"), "block_size": Attr("int", low=0),
             "output_dtype": Attr("int", dtype=True)}

SPECS: dict[str, OpSpec] = {
    "Conv": OpSpec("x w b?", "y", {**_WINDOW, "group": Attr("int", low=1)}),
    "MaxPool": OpSpec("x", "y indices?", {**_WINDOW, **_KERNEL,
                                          "ceil_mode": Attr("int", choices=_BOOL),
                                          "storage_order": Attr("int", choices=_BOOL)}),
    "AveragePool": OpSpec("x", "y", {**_WINDOW, **_KERNEL,
                                     "ceil_mode": Attr("int", choices=_BOOL),
                                     "count_include_pad": Attr("int", choices=_BOOL)}),
    "GlobalAveragePool": OpSpec("x", "y"), "GlobalMaxPool": OpSpec("x", "y"),
    "Gemm": OpSpec("a b c?", "y", {"alpha": Attr("float"), "beta": Attr("float"),
                                   "transA": Attr("int", choices=_BOOL),
                                   "transB": Attr("int", choices=_BOOL)}),
    "MatMul": _BINARY,
    "BatchNormalization": OpSpec("x scale b mean var", "y running_mean? running_var?", {
        "epsilon": Attr("float"), "momentum": Attr("float"),
        "training_mode": Attr("int", choices=_BOOL), "spatial": Attr("int", choices=_BOOL)}),
    "Softmax": OpSpec("x", "y", {"axis": Attr("int", axis="in")}),
    "LogSoftmax": OpSpec("x", "y", {"axis": Attr("int", axis="in")}),
    **{op: _BINARY for op in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater",
                              "And", "Or", "PRelu")},
    **{op: _VARIADIC for op in ("Max", "Min", "Sum", "Mean")},
    "Where": OpSpec("condition x y", "z"),
    "Clip": OpSpec("x min? max?", "y"),
    **{op: _UNARY for op in ("Not", "Relu", "Sigmoid", "HardSwish", "Tanh", "Exp", "Log",
                             "Sqrt", "Abs", "Neg", "Reciprocal", "Floor", "Ceil", "Softplus",
                             "Softsign", "Identity", "Size")},
    "LeakyRelu": _ALPHA, "Elu": _ALPHA,
    "HardSigmoid": OpSpec("x", "y", {"alpha": Attr("float"), "beta": Attr("float")}),
    "Selu": OpSpec("x", "y", {"alpha": Attr("float"), "gamma": Attr("float")}),
    "Dropout": OpSpec("data ratio? training_mode?", "output mask?", {
        "ratio": Attr("float", low=0.0), "seed": Attr("int")}),
    "Cast": OpSpec("x", "y", {"to": Attr("int", dtype=True, required=True), **_CAST_EXTRA}),
    "CastLike": OpSpec("x target_type", "y", _CAST_EXTRA),
    "QuantizeLinear": OpSpec("x scale zero_point?", "y", {
        **_QUANTIZE, "saturate": Attr("int", choices=_BOOL),
        "precision": Attr("int", dtype=True)}),
    "DequantizeLinear": OpSpec("x scale zero_point?", "y", _QUANTIZE),
    **{op: _REDUCE for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                              "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                              "ReduceLogSumExp", "ReduceSumSquare")},
    "Reshape": OpSpec("data shape", "reshaped", {"allowzero": Attr("int", choices=_BOOL)}),
    "Flatten": OpSpec("x", "y", {"axis": Attr("int", axis="flatten")}),
    "Transpose": OpSpec("data", "transposed", {"perm": Attr("ints", length="rank", axis="in",
                                                             unique=True)}),
    "Squeeze": OpSpec("data axes?", "squeezed", {"axes": Attr("ints", axis="in", unique=True)}),
    "Unsqueeze": OpSpec("data axes?", "expanded", {"axes": Attr("ints", axis="out",
                                                                 unique=True)}),
    "Concat": OpSpec("inputs...", "concat_result", {"axis": Attr("int", axis="in",
                                                                    required=True)}),
    "Split": OpSpec("x split?", "outputs...", {"axis": Attr("int", axis="in"),
                                               "split": Attr("ints", low=0, outputs=True),
                                               "num_outputs": Attr("int", low=1,
                                                                   outputs=True)}),
    "Slice": OpSpec("data starts ends axes? steps?", "output"),
    "Pad": OpSpec("data pads constant_value? axes?", "output", {
        "mode": Attr("string", choices=("constant", "reflect", "edge", "wrap"))}),
    "Gather": OpSpec("data indices", "output", {"axis": Attr("int", axis="in")}),
    "Expand": OpSpec("x shape", "y"),
    "Tile": OpSpec("x repeats", "y"),
    "Shape": OpSpec("data", "shape", {"start": Attr("int"), "end": Attr("int")}),
    "ConstantOfShape": OpSpec("shape", "output", {"value": Attr("tensor")}),
    "Range": OpSpec("start limit delta", "output", {"stash_type": Attr("int", dtype=True)}),
    "Constant": OpSpec("", "output", {
        "value": Attr("tensor"), "value_float": Attr("float"), "value_floats": Attr("floats"),
        "value_int": Attr("int"), "value_ints": Attr("ints"),
        "value_string": Attr("string"), "value_strings": Attr("strings"),
        "sparse_value": Attr("sparse_tensor")}),
}

# AttributeProto.type -> the kind it holds, and the field its value is in.
_KINDS = {1: ("float", "f"), 2: ("int", "i"), 3: ("string", "s"), 4: ("tensor", "t"),
          5: ("graph", "g"), 6: ("floats", "floats"), 7: ("ints", "ints"),
          8: ("strings", "strings"), 9: ("tensors", "tensors"), 10: ("graphs", "graphs"),
          11: ("sparse_tensor", "sparse_tensor"), 12: ("sparse_tensors", "sparse_tensors"),
          13: ("type_proto", "tp"), 14: ("type_protos", "type_protos")}
_ARTICLE = {"int": "an int", "ints": "a list of ints", "float": "a float",
            "floats": "a list of floats", "string": "a string", "strings": "a list of strings",
            "tensor": "a tensor"}


def _arity(node: Node, names: str, given: tuple, what: str) -> None:
    """Hold a node's inputs (or outputs) to ``names``: ``x`` required, ``x?`` optional (may
    be given as an empty name), ``x...`` one or more, ``x...?`` zero or more (last only)."""
    parts = names.split()
    variadic = bool(parts) and parts[-1].rstrip("?").endswith("...")
    fixed = parts[:-1] if variadic else parts
    least = max((k + 1 for k, p in enumerate(fixed) if not p.endswith("?")), default=0)
    if variadic and not parts[-1].endswith("?"):
        least = len(fixed) + 1
    most = None if variadic else len(parts)
    listed = ", ".join(parts) or "none"
    if len(given) < least or (most is not None and len(given) > most):
        count = f"{least}" if most == least else (
            f"{least} or more" if most is None else f"{least} to {most}")
        raise NodeError(node, f"has {len(given)} {what}{'s' * (len(given) != 1)} but "
                              f"{node.op} takes {count} "
                              f"({listed}); fix the node's {what} list")
    for k, name in enumerate(given[:len(fixed)]):
        if not name and not fixed[k].endswith("?"):
            raise NodeError(node, f"{what} {k} ({fixed[k]}) is required but empty; connect a "
                                  "value to it")
    if variadic and not all(given[len(fixed):]):
        raise NodeError(node, f"an empty {what} name among its {what}s ({listed}); connect a "
                              "value to each")


def _in_range(node, key, spec: Attr, value) -> None:
    values = value if isinstance(value, list) else [value]
    if spec.kind in ("float", "floats") and not all(math.isfinite(v) for v in values):
        raise NodeError(node, f"attribute {key!r} = {value} is not a finite number")
    if spec.low is not None and any(v < spec.low for v in values):
        raise NodeError(node, f"attribute {key!r} = {value}: every value must be at least "
                              f"{spec.low}")
    if spec.choices and any(v not in spec.choices for v in values):
        raise NodeError(node, f"attribute {key!r} = {value!r} is not one of "
                              f"{', '.join(map(repr, spec.choices))}")
    if spec.unique and len(set(values)) != len(values):
        raise NodeError(node, f"attribute {key!r} = {value} names a value twice")
    if spec.outputs and (value if spec.kind == "int" else len(values)) != len(node.outputs):
        raise NodeError(node, f"attribute {key!r} = {value} does not match its "
                              f"{len(node.outputs)} outputs")
    if spec.dtype:
        for v in values:
            if not supported_elem_type(v):
                raise NodeError(node, f"attribute {key!r} = {v} is not an element type celosia "
                                      "supports (bool, integers and float16/32/64 are)")


def _attr_value(node, a, spec: Attr, where):
    kind, field_name = _KINDS.get(a.type, (None, None))
    if kind is None:
        raise NodeError(node, f"attribute {a.name!r} has no valid type (AttributeProto.type "
                              f"{a.type}); re-export the model")
    if kind != spec.kind:
        raise NodeError(node, f"attribute {a.name!r} is {_ARTICLE.get(kind, 'a ' + kind)} but "
                              f"{node.op} takes {_ARTICLE.get(spec.kind, spec.kind)}")
    if kind == "tensor":
        return read_tensor(a.t, f"node {node.name!r} ({node.op}) attribute {a.name!r}", where)
    if kind in ("string", "strings"):
        raw = [a.s] if kind == "string" else list(a.strings)
        try:
            text = [s.decode("utf-8") for s in raw]
        except UnicodeDecodeError:
            raise NodeError(node, f"attribute {a.name!r} is not UTF-8 text ({raw[0][:20]!r}...)"
                                  "; re-export the model") from None
        return text[0] if kind == "string" else text
    value = getattr(a, field_name)
    return list(value) if kind in ("ints", "floats") else value


def _from_schema(op: str) -> OpSpec:
    """A spec read off onnx's latest schema (arity and attribute kinds, no ranges), for an
    operator supported without an entry in SPECS yet; the table test asks for one."""
    import onnx.defs

    schema = onnx.defs.get_schema(op)
    option = onnx.defs.OpSchema.FormalParameterOption

    def names(params):
        return " ".join(p.name + {option.Optional: "?", option.Variadic:
                                  "..." if p.min_arity else "...?"}.get(p.option, "")
                        for p in params)
    kinds = {t: kind for t, (kind, _) in _KINDS.items()}
    return OpSpec(names(schema.inputs), names(schema.outputs),
                  {k: Attr(kinds.get(int(a.type), "?")) for k, a in schema.attributes.items()})


def read_node(proto, name: str, where: str) -> Node:
    """The graph Node of an ONNX NodeProto of a supported operator, after checking its arity
    and each attribute's kind and value against ``SPECS``."""
    op = proto.op_type
    spec = SPECS.get(op) or _from_schema(op)
    node = Node(op, tuple(proto.input), tuple(proto.output), {}, name)
    _arity(node, spec.inputs, node.inputs, "input")
    _arity(node, spec.outputs, node.outputs, "output")
    attrs = {}
    for a in proto.attribute:
        if a.name in attrs:
            raise NodeError(node, f"attribute {a.name!r} is given twice")
        if a.name not in spec.attrs:
            known = ", ".join(sorted(spec.attrs)) or "none"
            raise NodeError(node, f"{op} has no attribute {a.name!r} (its attributes: {known})"
                                  "; remove it or re-export the model")
        attrs[a.name] = _attr_value(node, a, spec.attrs[a.name], where)
        if spec.attrs[a.name].kind in ("int", "ints", "float", "floats", "string", "strings"):
            _in_range(node, a.name, spec.attrs[a.name], attrs[a.name])
    missing = [k for k, rule in spec.attrs.items() if rule.required and k not in attrs]
    if missing:
        raise NodeError(node, f"attribute {missing[0]!r} is required but missing; re-export the "
                              "model")
    return Node(op, node.inputs, node.outputs, attrs, name)


def check_ranks(node: Node, rank: int) -> None:
    """The attribute rules that need input 0's rank: lengths and axes (``Attr.length``,
    ``Attr.axis``)."""
    spec = SPECS.get(node.op)
    if spec is None:
        return
    for key, rule in spec.attrs.items():
        if key not in node.attrs or (rule.length is None and rule.axis is None):
            continue
        value = node.attrs[key]
        values = value if isinstance(value, list) else [value]
        want = {"spatial": rank - 2, "pads": 2 * (rank - 2), "rank": rank}.get(rule.length)
        if want is not None and len(values) != want:
            raise NodeError(node, f"attribute {key!r} has {len(values)} values but the input "
                                  f"has rank {rank}, which needs {want}")
        if rule.axis:
            r = rank + len(values) if rule.axis == "out" else rank
            hi = r + 1 if rule.axis == "flatten" else r
            bad = [v for v in values if not -r <= v < max(hi, 1)]
            if bad:
                raise NodeError(node, f"attribute {key!r} = {value}: axis {bad[0]} is out of "
                                      f"range for rank {r} ([{-r}, {hi - 1}])")
            if rule.unique and len({v % max(r, 1) for v in values}) != len(values):
                raise NodeError(node, f"attribute {key!r} = {value} names an axis twice")


# ---- output sizes known before a kernel runs -------------------------------------------------


def _broadcast(node, types):
    shapes = [t.shape for t in types if t is not None]
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        return []  # not broadcastable: the kernel says so, allocating nothing
    return [(shape, max(np.dtype(t.dtype).itemsize for t in types if t is not None))]


def _same_as(index, itemsize):
    return lambda node, types: [(types[index].shape, itemsize(node, types))]


def _expand(node, types):
    try:
        shape = np.broadcast_shapes(types[0].shape, tuple(max(d, 0) for d in node.attrs["shape"]))
    except ValueError:
        return []
    return [(shape, np.dtype(types[0].dtype).itemsize)]


def _tile(node, types):
    repeats = node.attrs["repeats"]
    if len(repeats) != len(types[0].shape):
        return []
    return [(tuple(d * max(r, 0) for d, r in zip(types[0].shape, repeats)),
             np.dtype(types[0].dtype).itemsize)]


def _gather(node, types):
    data, indices, axis = types[0].shape, types[1].shape, node.attrs["axis"]
    return [(data[:axis] + indices + data[axis + 1:], np.dtype(types[0].dtype).itemsize)]


def _pad(node, types):
    shape, pads = types[0].shape, node.attrs["pads"]
    r = len(shape)
    if len(pads) != 2 * r:
        return []
    return [(tuple(max(d + pads[i] + pads[i + r], 0) for i, d in enumerate(shape)),
             np.dtype(types[0].dtype).itemsize)]


def _dtype_attr(key):
    return lambda node, types: np.dtype(node.attrs[key]).itemsize


_BOUNDS = {
    **{op: _broadcast for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean",
                                 "Equal", "Less", "Greater", "And", "Or", "Where", "PRelu",
                                 "Clip")},
    "Expand": _expand, "Tile": _tile, "Gather": _gather, "Pad": _pad,
    "Cast": _same_as(0, _dtype_attr("to")),
    "QuantizeLinear": _same_as(0, _dtype_attr("output_dtype")),
    "DequantizeLinear": _same_as(0, _dtype_attr("output_dtype")),
}


def output_bounds(node: Node, types: list) -> list[tuple[tuple, int]]:
    """(shape, bytes per element) of the outputs of a canonical node whose output can be
    larger than its inputs, computed without running it; [] for the others."""
    rule = _BOUNDS.get(node.op)
    if rule is None or any(t is None for t in types[:1]) or not all(
            t.static for t in types if t is not None):
        return []  # a size only known at run time: the inferred type bounds what it can
    return rule(node, types)


def nbytes(shape, itemsize) -> int:
    """Bytes of a tensor, in Python integers (no int64 overflow for absurd shapes); a size
    only known at run time (None) counts as 1, so the figure is a lower bound."""
    return math.prod(1 if d is None else d for d in shape) * itemsize
