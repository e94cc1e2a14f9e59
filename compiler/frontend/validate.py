"""onnx's own validation of a model, with its verdicts as celosia's one-line errors.

``check_with_onnx`` runs onnx's checker (``check_model``: structure, SSA form and topological
order, each node against its opset's schema, tensors' data sizes) and then onnx's strict
type and shape inference (what ``check_model(full_check=True)`` adds: input ranks and element
types each operator allows). Its failures become a :class:`NodeError`-like
:class:`ModelCheckError` naming the file and the node (name and operator).

Two adjustments, made on the proto for the duration of the check only:

- unnamed nodes get the names celosia gives them (``node_names``), so the error can name them;
- the checker wants a tensor type with an element type and a ``shape`` on every graph input
  and output, which onnxruntime and celosia do not (celosia infers its outputs' types; an
  input without a shape is a dynamic input, which ``--input-shape`` fixes), so a missing one
  is filled in (a float scalar) for ``check_model`` alone. The inference that follows sees
  the model as it is;
- onnx deprecated GroupNormalization-18 (opsets 18 to 20: scale and bias per group) and its
  checker rejects any node of it, but exporters wrote it and onnxruntime runs it, and so
  does celosia (canonical.py). For both checks such a node stands in as ``Identity(X)``,
  which has its output's type; celosia's operator table and canonical form check the node
  itself;
- a MeanVarianceNormalization without ``axes`` stands in as ``Identity(X)`` too: onnx's
  inference of its function body fails on the absent attribute (onnx 1.23), though the node
  is valid and onnxruntime runs it; its canonical form checks the default axes [0, 2, 3]
  against the input's rank;
- an input dim of -1 (dynamic: frontend/inputs.py) is made unknown: onnx's inference takes
  it for a size, and aborts the process on some (a Slice of it).
"""

from __future__ import annotations

import re
from contextlib import contextmanager

from ..graph.ir import GraphError, ModelLoadError

__all__ = ["ModelCheckError", "check_text", "check_with_onnx", "node_names"]


class ModelCheckError(GraphError):
    """A model onnx's checker or its strict shape inference rejects."""


def check_text(proto, where: str) -> None:
    """Every string field of the model is UTF-8. protobuf parses a file without looking, and
    then hands out bytes (upb) or raises UnicodeDecodeError wherever such a name is read; a
    corrupt name is found here, before anything reads one."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    def repeated(fd):  # protobuf 6 dropped ``label``; older ones lack ``is_repeated``
        flag = getattr(fd, "is_repeated", None)
        return flag if flag is not None else fd.label == FD.LABEL_REPEATED

    def walk(msg, path):
        for fd, value in msg.ListFields():
            many = repeated(fd)
            values = value if many else [value]
            if fd.type == FD.TYPE_MESSAGE:
                for k, item in enumerate(values):
                    walk(item, f"{path}.{fd.name}[{k}]" if many else f"{path}.{fd.name}")
            elif fd.type == FD.TYPE_STRING:
                try:  # upb gives bytes for a string that is not UTF-8; others raise
                    bad = any(not isinstance(v, str) for v in values)
                except UnicodeDecodeError:
                    bad = True
                if bad:
                    raise ModelLoadError(f"{where}: {path}.{fd.name} is not UTF-8 text; the "
                                         "file is corrupt, re-export the model")

    try:
        walk(proto, "model")
    except UnicodeDecodeError:  # raised while listing a message's fields
        raise ModelLoadError(f"{where}: a name in the model is not UTF-8 text; the file is "
                             "corrupt, re-export the model") from None


def node_names(graph) -> list[str]:
    """The name of every node as celosia reports it: its own, else ``{op}_{index}``, made
    unique with trailing underscores."""
    used, names = set(), []
    for k, n in enumerate(graph.node):
        name = n.name or f"{n.op_type}_{k}"
        while name in used:
            name += "_"
        used.add(name)
        names.append(name)
    return names


# Deprecated operator versions celosia takes (see the module docstring).
_KEPT_DEPRECATED = ("GroupNormalization",)


def _deprecated_kept(proto) -> list:
    import onnx.defs

    versions = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    found = []
    for n in proto.graph.node:
        if n.op_type in _KEPT_DEPRECATED and n.domain in ("", "ai.onnx") and versions:
            try:
                deprecated = onnx.defs.get_schema(n.op_type, versions[0]).deprecated
            except onnx.defs.SchemaError:
                continue
            if deprecated:
                found.append(n)
    return found


def _mvn_default_axes(graph) -> list:
    """MeanVarianceNormalization nodes that leave ``axes`` at its default: onnx's inference
    of the function body fails on the absent attribute (onnx 1.23), though the node is
    valid and onnxruntime runs it."""
    return [n for n in graph.node if n.op_type == "MeanVarianceNormalization"
            and n.domain in ("", "ai.onnx") and not any(a.name == "axes" for a in n.attribute)]


@contextmanager
def _prepared(proto, names):
    """Unnamed nodes named as celosia names them, deprecated nodes celosia takes as their
    stand-ins, input dims of -1 (dynamic, as exporters mark them) unknown; yields the graph
    inputs and outputs whose type, element type or shape is missing. Restores the names,
    nodes and dims on the way out."""
    g = proto.graph
    renamed = [(n, n.name) for n, name in zip(g.node, names) if n.name != name]
    for n, name in zip(g.node, names):
        n.name = name
    kept = [(n, n.SerializeToString()) for n in _deprecated_kept(proto) + _mvn_default_axes(g)]
    for n, _ in kept:
        x = n.input[0] if n.input else ""
        n.op_type = "Identity"
        del n.input[:], n.attribute[:], n.output[1:]
        n.input.append(x)
    # onnx's inference takes -1 for a size and can abort the process on it (Slice's clamp
    # asserts): an unknown dim is what it means.
    negative = [d for v in g.input if v.type.HasField("tensor_type")
                for d in v.type.tensor_type.shape.dim
                if d.HasField("dim_value") and d.dim_value < 0]
    for d in negative:
        d.Clear()
    untyped = [v for v in list(g.input) + list(g.output) if not (
        v.type.HasField("tensor_type") and v.type.tensor_type.HasField("elem_type")
        and v.type.tensor_type.HasField("shape"))]
    try:
        yield untyped
    finally:
        for d in negative:
            d.dim_value = -1
        for n, old in kept:
            n.ParseFromString(old)
        for n, old in renamed:
            n.name = old


_NODE_CONTEXT = (re.compile(r"[Nn]ame: (.*?) OpType: (\S+)"),
                 re.compile(r"\(op_type:(\S+?), node name: (.*?)\)"))


def _verdict(e: Exception, where: str, stage: str) -> ModelCheckError:
    text = str(e).split("==> Context")[0]
    name = op = None
    m = _NODE_CONTEXT[0].search(str(e))
    if m:
        name, op = m.groups()
    else:
        m = _NODE_CONTEXT[1].search(text)
        if m:
            op, name = m.groups()
    # What is wrong on one line, without onnx's error-kind tags and repeated node context.
    detail = " ".join(text.split())
    detail = _NODE_CONTEXT[1].sub("", detail)
    detail = re.sub(r"\[\w+Error\]\s*|Inference error\(s\):\s*", "", detail)
    detail = " ".join(detail.split()).strip(" :") or type(e).__name__
    if name is not None:
        return ModelCheckError(f"{where}: node {name!r} ({op}): {detail} ({stage}); fix the "
                               "node or re-export the model")
    return ModelCheckError(f"{where}: {detail} ({stage}); the file is corrupt or its exporter "
                           "wrote an invalid model: re-export it")


def check_with_onnx(proto, where: str) -> None:
    """Raise ModelCheckError if onnx's checker or strict shape inference rejects ``proto``."""
    import onnx.checker
    import onnx.shape_inference

    names = node_names(proto.graph)
    with _prepared(proto, names) as untyped:
        try:
            saved = [v.type.SerializeToString() for v in untyped]
            for v in untyped:  # what the checker wants, for it alone (the module's doc)
                t = v.type.tensor_type
                if not t.HasField("elem_type"):
                    t.elem_type = 1
                t.shape.SetInParent()
            try:
                onnx.checker.check_model(proto)
            finally:
                for v, old in zip(untyped, saved):
                    v.type.ParseFromString(old) if old else v.ClearField("type")
        except Exception as e:  # noqa: BLE001 - every failure of the checker is its verdict
            raise _verdict(e, where, "onnx checker") from None
        try:
            with _without_bulk_data(proto):
                onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
        except Exception as e:  # noqa: BLE001 - likewise for strict inference
            raise _verdict(e, where, "onnx shape inference") from None


@contextmanager
def _without_bulk_data(proto, least=1 << 16):
    """Large initializers' bytes held aside: inference needs their types, and the values of
    shape-like inputs only (small), while it copies the whole model twice (ResNet-18: 45 MB,
    most of an import's time)."""
    held = [(t, t.raw_data) for t in proto.graph.initializer if len(t.raw_data) >= least]
    for t, _ in held:
        t.ClearField("raw_data")
    try:
        yield
    finally:
        for t, data in held:
            t.raw_data = data
