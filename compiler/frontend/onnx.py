"""ONNX -> graph IR: load, check opset and operators, type every value, canonicalize.

``import_onnx`` keeps the model's nodes (constant folding is a pass, graph/passes.py) but
needs the values of shape-like inputs (Reshape's shape, Slice's starts, ...) to make shapes
static: it propagates the values of nodes whose inputs are all known (and of Shape/Size,
known from static shapes) with the numpy kernels, and turns those inputs into attributes.
Where such a value is only known at run time, the node keeps ONNX's form and the sizes it
decides are None in the types downstream (graph/dynamic.py). Inputs: inputs.py.

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
from ..graph.dynamic import VALUE_SHAPED
from ..graph.ops_random import NONDETERMINISTIC
from ..graph.ops import KERNELS
from ..graph.ops_control import CONTROL_OPS
from ..graph.ops_recurrent import RECURRENT_KERNELS
from ..graph.reference import evaluate_node, infer_node, stand_in
from .canonical import CANONICALIZE
from .dtypes import np_dtype
from .functions import expand_functions
from .inputs import (declared_dims, dims_str, is_dynamic, shape_flags, shape_kwargs,
                     shape_problem, suggest)
from .specs import check_ranks, nbytes, output_bounds, read_node
from .tensors import check_size, inline_external_data, read_tensor
from .validate import check_text, check_with_onnx, node_names

__all__ = ["import_onnx", "declared_inputs", "SUPPORTED_OPS", "MIN_OPSET", "MAX_OPSET",
           "MAX_OP_VERSION"]

MIN_OPSET, MAX_OPSET = 11, 21
MAX_OP_VERSION = 28
# Ops rewritten at import: Constant becomes an initializer, CastLike a Cast, Upsample a
# Resize (canonical.py); Scatter (opsets 9 and 10, deprecated at 11) becomes a
# ScatterElements by onnx's version converter (_upgrade).
_IMPORT_ONLY = ("Constant", "CastLike", "Upsample", "Scatter")
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
    """Import an ONNX model (a path, bytes or ``onnx.ModelProto``) into a graph.

    ``input_shapes`` ({input name: shape}) gives the sizes of inputs with dynamic dims
    (inputs.py: -1, 0, a dim_param or an unnamed dim); a fixed dim must match. Inputs are
    static in the graph; a value whose size depends on run-time values has None there
    (dynamic.py). ``bind_inputs`` ({input name: array}) turns inputs into constants.
    Raises a GraphError subclass for every model it cannot take; one about input shapes
    proposes shapes that import.
    Raises a GraphError subclass for every model it cannot take, its message naming the file.
    """
    proto, where, base_dir = _load(model)
    check_text(proto, where)
    try:
        inline_external_data(proto, where, base_dir)
        proto, opset, source_opset, nodes = _validated(proto, where)
        return _import(proto, opset, source_opset, nodes, where, dict(input_shapes or {}),
                       dict(bind_inputs or {}), hints=True)
    except GraphError as e:
        # Errors raised below the file level (a node's, a value's) name the file too.
        if not str(e).startswith(f"{where}:"):
            e.args = (f"{where}: {e}",)
        raise


def _validated(proto, where):
    """The model checked by celosia's operator table (specs.py) and by onnx's checker and
    strict inference, at an opset from MIN_OPSET on: (proto, opset, source opset, nodes)."""
    source_opset = _default_opset(proto, where)
    # operators celosia lacks that onnx defines as functions of others: their bodies
    proto = expand_functions(proto, source_opset, SUPPORTED_OPS)
    _check_operators(proto, source_opset, where)
    for vi in proto.graph.input:  # onnx's inference says only "unknown" or "differ" of these
        if vi.type.HasField("tensor_type"):
            t = vi.type.tensor_type
            np_dtype(t.elem_type, f"input {vi.name!r}", where)
            # -1 and 0 are how exporters mark a dynamic dim (inputs.py); below -1 is an error.
            if any(d.HasField("dim_value") and d.dim_value < -1 for d in t.shape.dim):
                dims = [d.dim_value if d.HasField("dim_value") else "?" for d in t.shape.dim]
                raise InputShapeError(f"{where}: input {vi.name!r} is {dims_str(dims)}: a "
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


def declared_inputs(model) -> dict:
    """{input name: (numpy dtype name, dims)} of an ONNX model's inputs as it declares them
    (initializers listed as inputs left out): dims are ints for fixed sizes, strings for
    dynamic ones (inputs.py), None for an unknown rank."""
    proto, where, _ = _load(model)
    inits = {i.name for i in proto.graph.initializer}
    out = {}
    for vi in proto.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        out[vi.name] = (np_dtype(vi.type.tensor_type.elem_type, f"input {vi.name!r}", where),
                        declared_dims(vi))
    return out


def _import(proto, opset, source_opset, nodes, where, shapes, bind_inputs, hints) -> Graph:
    g = proto.graph
    ctx = _Importer(opset, where, source_opset)
    for init in g.initializer:
        ctx.add_constant(init.name, read_tensor(init, f"initializer {init.name!r}", where))
    _add_inputs(ctx, g, shapes, bind_inputs,
                (lambda s: _try_import(proto, opset, source_opset, nodes, where, s,
                                       bind_inputs)) if hints else None)
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


def _try_import(proto, opset, source_opset, nodes, where, shapes, bind_inputs) -> str | None:
    """None if the model imports with these input shapes, else why not."""
    try:
        _import(proto, opset, source_opset, nodes, where, dict(shapes), bind_inputs,
                hints=False)
    except GraphError as e:
        return str(e)
    return None


def _add_inputs(ctx, g, shapes, bind_inputs, try_shapes) -> None:
    """Type the graph inputs: declared fixed dims, given sizes for the dynamic ones.
    ``try_shapes`` (None: no hints) imports the model with proposed shapes."""
    names = [vi.name for vi in g.input if vi.name not in ctx.values]
    unknown = sorted((set(shapes) | set(bind_inputs)) - set(names))
    if unknown:
        raise InputShapeError(f"{ctx.where}: no input named {unknown}; the model's inputs "
                              f"are {names}")
    declared, dtypes = {}, {}
    for vi in g.input:
        if vi.name not in names or vi.name in bind_inputs:
            continue  # an initializer listed as an input (older exporters), or bound
        if not vi.type.HasField("tensor_type"):
            raise GraphError(f"{ctx.where}: input {vi.name!r} is not a tensor (sequences, "
                             "maps and optionals are not supported)")
        dtypes[vi.name] = np_dtype(vi.type.tensor_type.elem_type, f"input {vi.name!r}",
                                   ctx.where)
        declared[vi.name] = declared_dims(vi)
    for name, array in bind_inputs.items():
        ctx.add_constant(name, np.asarray(array))
    given = {n: _shape(n, s) for n, s in shapes.items() if n in declared}
    problems = [p for n, s in given.items() if (p := shape_problem(n, declared[n], s))]
    missing = [n for n, d in declared.items() if n not in given and is_dynamic(d)]
    if problems or missing:
        raise _input_error(ctx.where, declared, given, problems, missing, try_shapes)
    for name, dims in declared.items():
        shape = given[name] if name in given else tuple(dims)
        _check_input_shape(name, dtypes[name], shape, ctx.where)
        ctx.inputs.append(name)
        ctx.types[name] = TensorType(dtypes[name], shape)
        ctx.depends[name] = frozenset([name])


def _shape(name, shape) -> tuple:
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise InputShapeError(f"input_shapes[{name!r}] is {shape!r}: give a sequence of "
                              "integers, e.g. (1, 3, 224, 224)") from None


def _input_error(where, declared, given, problems, missing, try_shapes) -> GraphError:
    """InputShapeError (a given shape that does not fit) or DynamicShapeError (sizes not
    given), with shapes that import when ``try_shapes`` finds some."""
    if problems:
        text = f"{where}: " + "; ".join(problems)
    else:
        listed = ", ".join(f"{n!r} is {dims_str(declared[n])}" for n in missing)
        text = (f"{where}: {'an input has' if len(missing) == 1 else 'inputs have'} "
                f"dynamic dims and no size given ({listed}); a build has static input "
                "shapes")
    # A given shape of the right rank keeps its sizes in the dynamic dims (suggest).
    shapes, error = suggest(declared, given, try_shapes) if try_shapes else (None, "")
    if shapes and not any(is_dynamic(d) for d in declared.values()):
        text += (f": the model takes only {shape_flags(shapes)} (Python: "
                 f"{shape_kwargs(shapes)}); leave the shapes out to use its own")
    elif shapes:
        text += (f": pass e.g. {shape_flags(shapes)} (Python: {shape_kwargs(shapes)}), "
                 "with your data's sizes in the dynamic dims")
    elif try_shapes and not error:  # nothing to try: an input of unknown rank
        text += (": pass each input's shape with --input-shape NAME=D1,D2,... (Python: "
                 "input_shapes={NAME: shape}), the shape of your data")
    elif try_shapes:
        text += (": pass each input's sizes with --input-shape NAME=D1,D2,... (Python: "
                 "input_shapes={NAME: shape}); none of the sizes celosia tried imports "
                 f"({error})")
    if missing and not problems:
        text += ". `celosia run` and CpuModel.open take the sizes from the arrays given"
    err = (InputShapeError if problems else DynamicShapeError)(text)
    err.suggested = shapes
    return err


def _check_input_shape(name, dtype, shape, where):
    if any(d < 0 for d in shape):
        raise InputShapeError(f"{where}: input {name!r} is {dims_str(shape)}: a size is "
                              "negative; fix the model's input or give --input-shape")
    check_size(nbytes(shape, np.dtype(dtype).itemsize),
               f"{where}: input {name!r} {dtype}{dims_str(shape)}")


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
        """The compile-time value of an input that determines a shape (a canonical form
        needs it; operators in dynamic.VALUE_SHAPED never get here without it)."""
        if index >= len(node.inputs) or not node.inputs[index]:
            return None
        name = node.inputs[index]
        if name not in self.values:
            inputs = sorted(self.depends.get(name, ()))
            err = DynamicShapeError(
                f"node {node.name!r} ({node.op}): its {what} {name!r} is only known at run "
                f"time (it depends on the inputs {inputs}), and celosia cannot run {node.op} "
                f"with a run-time {what} yet; make {name!r} a constant in the model (or, in "
                f"Python, fix those inputs' values with bind_inputs)")
            err.inputs = inputs
            raise err
        return self.values[name]

    def static(self, name: str) -> bool:
        return not name or self.types[name].static

    def add_node(self, node: Node):
        form = self._runtime_form(node)
        if form is not None:
            nodes = [form]
        else:
            if node.inputs and node.inputs[0] and self.static(node.inputs[0]):
                check_ranks(node, len(self.types[node.inputs[0]].shape))
            canon = CANONICALIZE.get(node.op)
            try:
                nodes = canon(self, node) if canon else [node]
            except TypeError:  # arithmetic on a size only known at run time (None)
                if all(self.static(i) for i in node.inputs):
                    raise
                shown = ", ".join(str(self.types[i]) if i else "_" for i in node.inputs)
                raise DynamicShapeError(
                    f"node {node.name!r} ({node.op}): its canonical form needs the static "
                    f"sizes of its inputs ({shown}), which depend on values only known at "
                    f"run time; celosia cannot take {node.op} with these attributes there "
                    "yet (make the sizes before it fixed in the model)") from None
        for n in nodes:
            self._add(n)

    def _runtime_form(self, node: Node) -> Node | None:
        """ONNX's form of a node whose output shape depends on values only known at run
        time (dynamic.py), or None when its canonical form can be made: a shape-deciding
        input not known now, or a Reshape (0 and -1 resolve against the input's sizes) or
        Split (sizes add up to the axis) of an input whose sizes are not all known."""
        value_inputs = VALUE_SHAPED.get(node.op)
        if value_inputs is None:
            return None
        pending = any(i < len(node.inputs) and node.inputs[i] and
                      node.inputs[i] not in self.values for i in value_inputs)
        data = node.inputs[0] if node.inputs else ""
        if not pending and node.op == "Reshape" and not self.static(data):
            pending = True
        squeezed = None
        if not pending and node.op == "Squeeze" and not self.static(data) \
                and "axes" not in node.attrs and (len(node.inputs) < 2 or not node.inputs[1]):
            # Without axes its rank depends on which sizes are 1: the ones known to be 1
            # go, the run-time ones are taken as not 1 (checked when it runs).
            pending = True
            squeezed = [i for i, d in enumerate(self.types[data].shape) if d == 1]
        if not pending and node.op == "Split" and not self.static(data):
            rank = len(self.types[data].shape)
            axis = node.attrs.get("axis", 0)
            pending = -rank <= axis < rank and self.types[data].shape[axis] is None
        if not pending:
            return None
        attrs = {**node.attrs, "runtime_shape": 1}
        if squeezed is not None:
            attrs["squeezed"] = squeezed
        if node.op == "Split" and (len(node.inputs) < 2 or not node.inputs[1]):
            attrs.setdefault("num_outputs", len(node.outputs))
        return Node(node.op, node.inputs, node.outputs, attrs, node.name)

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
        try:
            out_types = infer_node(node, types, values)
        except DynamicShapeError as e:
            if node.op == "If" and not getattr(e, "inputs", None):
                # Branches of different shapes: binding what the condition depends on
                # (bind_inputs) makes it a constant, and only one branch is taken.
                e.inputs = sorted(self.depends.get(node.inputs[0], ()))
            raise
        for o, t in zip(node.outputs, out_types):
            self._check_size(node, o, str(t), nbytes(t.shape, np.dtype(t.dtype).itemsize))
        deps = frozenset().union(*(self.depends.get(i, ()) for i in node.inputs))
        for o, t in zip(node.outputs, out_types):
            if o:
                self.types[o] = t
                self.depends[o] = deps
        # Shape and Size are known from a static input; any other node from known inputs,
        # random draws never (new ones in every run).
        if node.op in _SHAPE_OPS:
            known = types[0].static
            values = [stand_in(types[0])] if known else values
        elif node.op in NONDETERMINISTIC:
            known = False
        else:
            known = all(v is not None for i, v in zip(node.inputs, values) if i)
        if known and not (node.op == "BatchNormalization" and node.attrs.get("training_mode")):
            for o, v in zip(node.outputs, evaluate_node(node, values)):
                if o:
                    self.values[o] = v
                    if not self.types[o].static:  # a run-time form whose inputs are known
                        self.types[o] = TensorType(str(v.dtype), v.shape)
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
