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

import os
from collections import ChainMap
from pathlib import Path

import numpy as np

from ..graph.ir import (DynamicShapeError, Graph, GraphError, InputShapeError, ModelLoadError, Node,
                        NodeError, TensorType, UnsupportedOperatorError, UnsupportedOpsetError,
                        constant, verify_graph)
from ..graph.ops import KERNELS
from ..graph.ops_control import CONTROL_OPS
from ..graph.ops_recurrent import RECURRENT_KERNELS
from ..graph.reference import evaluate_node, infer_node, stand_in
from .canonical import CANONICALIZE
from .dtypes import np_dtype
from .specs import check_ranks, nbytes, output_bounds, read_node
from .tensors import check_size, inline_external_data, read_tensor
from .validate import check_text, check_with_onnx, node_names

__all__ = ["import_onnx", "SUPPORTED_OPS", "MIN_OPSET", "MAX_OPSET", "MAX_OP_VERSION"]

MIN_OPSET, MAX_OPSET = 11, 21
MAX_OP_VERSION = 28
# Ops rewritten at import: Constant becomes an initializer, CastLike a Cast, Upsample a
# Resize (canonical.py).
_IMPORT_ONLY = ("Constant", "CastLike", "Upsample")
SUPPORTED_OPS = tuple(sorted(set(KERNELS) | set(_IMPORT_ONLY) | set(RECURRENT_KERNELS)
                             | set(CONTROL_OPS)))
# Ops always evaluated at compile time when their input's shape is static.
_SHAPE_OPS = ("Shape", "Size")


# ---- loading ---------------------------------------------------------------------------------


def _load(model):
    """(ModelProto, how errors name it, the folder external data may come from or None)."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        return model, "<model>", None
    where = str(model) if isinstance(model, (str, os.PathLike)) else "<bytes>"
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model)), where, None
        if not Path(model).is_file():
            raise ModelLoadError(f"{where}: no such file")
        # External data is read by tensors.read_tensor, which checks where it points first.
        return onnx.load(str(model), load_external_data=False), where, Path(model).parent
    except ModelLoadError:
        raise
    except (DecodeError, RuntimeError, ValueError, OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{where}: not a readable ONNX model (truncated or corrupt file?): "
                             f"{type(e).__name__}: {e}") from None


def _default_opset(model, where) -> int:
    import onnx.defs

    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise UnsupportedOpsetError(f"{where}: the model imports no default-domain (ai.onnx) "
                                    "opset; re-export it with an opset from 11 to 21")
    latest = onnx.defs.onnx_opset_version()
    if not 1 <= versions[0] <= latest:
        raise UnsupportedOpsetError(
            f"{where}: opset {versions[0]} is not one this onnx (1 to {latest}) knows; "
            f"re-export the model with an opset from {MIN_OPSET} to {MAX_OPSET}")
    return versions[0]


def _upgrade(model, opset, where):
    import onnx.version_converter

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


def _shown(text: str) -> str:
    """Text from the file as it may appear in a one-line message (corrupt files hold
    newlines and control characters in names)."""
    return text if text.isprintable() else repr(text)


def _check_operators(model, opset, where):
    import onnx.defs

    bad = []
    for name, n in _all_nodes(model.graph):
        if n.domain not in ("", "ai.onnx"):
            bad.append((name, _shown(n.op_type), f"domain {_shown(n.domain)}"))
        elif n.op_type not in SUPPORTED_OPS:
            bad.append((name, _shown(n.op_type), ""))
        else:
            try:
                version = onnx.defs.get_schema(n.op_type, opset).since_version
            except Exception:
                version = None
            if version is None:
                bad.append((name, n.op_type, f"not an operator of opset {opset}"))
            elif version > MAX_OP_VERSION:
                bad.append((name, n.op_type, f"version {version} is newer than the importer "
                                             f"knows ({MAX_OP_VERSION})"))
    if bad:
        raise UnsupportedOperatorError(bad)


def _all_nodes(graph, prefix=""):
    """(name, NodeProto) of every node, including those of subgraphs (If's branches,
    Loop's and Scan's bodies), named as the importer names them (``loop/body/add``)."""
    for name, n in zip(node_names(graph), graph.node):
        name = prefix + name
        yield name, n
        for a in n.attribute:
            if a.HasField("g"):
                yield from _all_nodes(a.g, f"{name}/{a.name}/")


# ---- the import ------------------------------------------------------------------------------


def import_onnx(model, input_shapes: dict | None = None, *, bind_inputs: dict | None = None
                ) -> Graph:
    """Import an ONNX model (a path, bytes or ``onnx.ModelProto``) into a static graph.

    ``input_shapes`` ({input name: shape}) fixes inputs whose shapes are dynamic in the
    model (or overrides them). ``bind_inputs`` ({input name: array}) turns inputs into
    constants, for inputs that hold shapes (a Reshape's target given as an input).
    Raises a GraphError subclass for every model it cannot take, its message naming the file.
    """
    proto, where, base_dir = _load(model)
    check_text(proto, where)
    try:
        inline_external_data(proto, where, base_dir)
        return _import(proto, where, input_shapes, bind_inputs)
    except GraphError as e:
        # Errors raised below the file level (a node's, a value's) name the file too.
        if not str(e).startswith(f"{where}:"):
            e.args = (f"{where}: {e}",)
        raise


def _validated(proto, where):
    """The model checked by celosia's operator table (specs.py) and by onnx's checker and
    strict inference, at an opset from MIN_OPSET on: (proto, opset, source opset, nodes)."""
    source_opset = _default_opset(proto, where)
    _check_operators(proto, source_opset, where)
    for vi in proto.graph.input:  # onnx's inference says only "unknown" or "differ" of these
        if vi.type.HasField("tensor_type"):
            t = vi.type.tensor_type
            np_dtype(t.elem_type, f"input {vi.name!r}", where)
            if any(d.HasField("dim_value") and d.dim_value < 0 for d in t.shape.dim):
                dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
                raise InputShapeError(f"{where}: input {vi.name!r} is {_dims_str(dims)}: a "
                                      "size is negative; fix the model's input")
    if source_opset >= MIN_OPSET:
        # The table describes these opsets: its messages (which say what to do) come first.
        nodes = _read_nodes(proto.graph, where)
        check_with_onnx(proto, where)
        return proto, source_opset, source_opset, nodes
    # An older model is held to its own opset's schema before the converter touches it.
    check_with_onnx(proto, where)
    proto, opset = _upgrade(proto, source_opset, where)
    _check_operators(proto, opset, where)
    return proto, opset, source_opset, _read_nodes(proto.graph, where)


def _read_nodes(g, where) -> list[Node]:
    return [read_node(n, name, where) for name, n in zip(node_names(g), g.node)]


def _import(proto, where, input_shapes, bind_inputs) -> Graph:
    proto, opset, source_opset, nodes = _validated(proto, where)
    g = proto.graph
    ctx = _Importer(opset, where, source_opset)
    for init in g.initializer:
        ctx.add_constant(init.name, read_tensor(init, f"initializer {init.name!r}", where))
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
        dtype = np_dtype(t.elem_type, f"input {vi.name!r}", where)
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
        _check_input_shape(vi.name, dtype, shape, where)
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
    for node in nodes:
        for i in node.inputs:
            if i and i not in ctx.types:
                raise ModelLoadError(
                    f"{where}: node {node.name!r} ({node.op}) reads {i!r}, which no input, "
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


def _check_input_shape(name, dtype, shape, where):
    if any(d < 0 for d in shape):
        raise InputShapeError(f"{where}: input {name!r} is {_dims_str(shape)}: a size is "
                              "negative; fix the model's input or give --input-shape")
    check_size(nbytes(shape, np.dtype(dtype).itemsize),
               f"{where}: input {name!r} {dtype}{_dims_str(shape)}")


class _Importer:
    """The state of one import: types and compile-time-known values of every name so far.

    A body (a subgraph) is imported by a child whose lookups fall through to its parent's
    names (``ChainMap``): the outer scope is visible, and what the child defines stays its
    own."""

    def __init__(self, opset, where, source_opset, parent: "_Importer | None" = None):
        self.opset, self.where, self.source_opset = opset, where, source_opset
        self.inputs: list[str] = []
        self.nodes: list[Node] = []
        self.initializers: dict[str, np.ndarray] = {}
        if parent is None:
            self.types: dict[str, TensorType] = {}
            self.values: dict[str, np.ndarray] = {}
            self.depends: dict[str, frozenset] = {}  # value -> the graph inputs it depends on
        else:
            self.types = ChainMap({}, parent.types)
            self.values = ChainMap({}, parent.values)
            self.depends = ChainMap({}, parent.depends)

    def import_body(self, proto, input_types: list, name: str) -> Graph:
        """A subgraph (onnx GraphProto) as a body Graph: its inputs typed ``input_types``
        (the declared types only checked), its nodes named ``name/...``, and the enclosing
        values it reads as its ``outer`` list (in the order first read)."""
        child = _Importer(self.opset, self.where, self.source_opset, parent=self)
        for init in proto.initializer:
            child.add_constant(init.name, read_tensor(init, f"{name} initializer {init.name!r}",
                                                      self.where))
        if len(proto.input) != len(input_types):
            raise GraphError(f"{self.where}: {name} has {len(proto.input)} inputs where "
                             f"{len(input_types)} are expected")
        for vi, t in zip(proto.input, input_types):
            declared = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
            if declared and np_dtype(declared, f"{name} input {vi.name!r}", self.where) != \
                    t.dtype:
                raise GraphError(f"{self.where}: {name} declares input {vi.name!r} as "
                                 f"{np_dtype(declared, '', self.where)} but receives {t}")
            child.inputs.append(vi.name)
            child.types[vi.name] = t
            child.depends[vi.name] = frozenset()
        for local_name, n in zip(node_names(proto), proto.node):
            node_name = f"{name}/{local_name}"
            node = read_node(n, node_name, self.where)
            for i in node.inputs:
                if i and i not in child.types:
                    raise ModelLoadError(f"{self.where}: node {node_name!r} ({n.op_type}) "
                                         f"reads {i!r}, which nothing in its scope defines")
            child.add_node(node)
        outputs = tuple(o.name for o in proto.output)
        for o in outputs:
            if o not in child.types:
                raise ModelLoadError(f"{self.where}: {name} output {o!r} is never computed")
        local = child.types.maps[0]
        read = [i for n in child.nodes for i in n.inputs] + list(outputs)
        outer = tuple(dict.fromkeys(i for i in read if i and i not in local))
        types = {**local, **{o: self.types[o] for o in outer}}
        return Graph(name, tuple(child.inputs), outputs, tuple(child.nodes),
                     child.initializers, types, outer)

    def add_constant(self, name, array):
        check_size(array.nbytes, f"{self.where}: constant {name!r}")
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
        if node.inputs and node.inputs[0]:
            check_ranks(node, len(self.types[node.inputs[0]].shape))
        canon = CANONICALIZE.get(node.op)
        nodes = canon(self, node) if canon else [node]
        for n in nodes:
            self._add(n)

    def _add(self, node: Node):
        if node.op == "Constant":
            self.add_constant(node.outputs[0], _constant_value(node))
            return
        types = [self.types[i] if i else None for i in node.inputs]
        values = [self.values.get(i) if i else None for i in node.inputs]
        # Sizes are checked before a kernel allocates them: those known from the attributes
        # and input types first (inference runs some kernels), then the inferred ones (before
        # constant folding runs the node).
        for shape, itemsize in output_bounds(node, types):
            self._check_size(node, node.outputs[0], f"[{','.join(map(str, shape))}]",
                             nbytes(shape, itemsize))
        out_types = infer_node(node, types, values)
        for o, t in zip(node.outputs, out_types):
            self._check_size(node, o, str(t), nbytes(t.shape, np.dtype(t.dtype).itemsize))
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


    def _check_size(self, node, output, shown, size):
        check_size(size, f"{self.where}: node {node.name!r} ({node.op}) output {output!r} "
                         f"{shown}")


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
