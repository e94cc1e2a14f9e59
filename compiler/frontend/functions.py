"""Operators celosia has no definition of, but ONNX defines as functions of others: each such
node is replaced by its function body, as onnx's own schema gives it for the model's opset
(the body of the node's attributes and input types, for context-dependent functions), before
the operator check. Attention (opsets 23-25, as torch's exporter writes
scaled_dot_product_attention from opset 23), RotaryEmbedding, SwiGLU, the loss functions,
MeanVarianceNormalization and the others then import as the MatMul, Softmax, ... they are
made of, which the CPU build compiles and the quantizer sees.

A node is expanded only when the whole body can be taken as it is: its operators have the
same definitions at the model's opset as at the body's (a body written for a newer opset is
not reinterpreted under an older one), and it holds no subgraphs. Otherwise the node stays
and the operator check names it, as before.
"""

from __future__ import annotations

import onnx
import onnx.defs
import onnx.shape_inference

__all__ = ["expand_functions"]

# Expansion rounds: a body may use another function operator.
_ROUNDS = 4


def expand_functions(model: onnx.ModelProto, opset: int, supported) -> onnx.ModelProto:
    """``model`` with every default-domain node whose operator is not in ``supported`` but
    has a function body at ``opset`` replaced by that body (names made unique under the
    node's name). Returns ``model`` itself when nothing is expanded."""
    changed = False
    for _ in range(_ROUNDS):
        todo = [n for n in model.graph.node
                if n.domain in ("", "ai.onnx") and n.op_type not in supported
                and _schema(n.op_type, opset) is not None]
        if not todo:
            break
        types = _value_types(model) if any(
            not _schema(n.op_type, opset).has_function for n in todo) else {}
        nodes, expanded = [], False
        for k, n in enumerate(model.graph.node):
            body = _body(n, opset, types, k, supported) if n in todo else None
            if body is None:
                nodes.append(n)
            else:
                nodes.extend(body)
                expanded = True
        if not expanded:
            break
        if not changed:
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            model = copy
            changed = True
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return model


def _schema(op: str, opset: int):
    """The operator's schema at ``opset`` when it has a function body there, else None."""
    try:
        schema = onnx.defs.get_schema(op, opset)
    except Exception:
        return None
    if schema.deprecated:
        return None
    if schema.has_function and _version(schema.function_opset_versions, opset):
        return schema
    if schema.has_context_dependent_function and _version(
            schema.context_dependent_function_opset_versions, opset):
        return schema
    return None


def _version(versions, opset: int):
    """The newest body version not newer than the model's opset."""
    fit = [v for v in versions if v <= opset]
    return max(fit) if fit else None


def _value_types(model) -> dict:
    """TypeProto of every value onnx's inference types (inputs, initializers, nodes')."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    g = inferred.graph
    types = {vi.name: vi.type for vi in (*g.input, *g.value_info, *g.output)}
    for t in g.initializer:
        types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


def _body(node, opset: int, types: dict, index: int, supported):
    """The node's function body as nodes of the graph, or None when it cannot be taken."""
    schema = _schema(node.op_type, opset)
    if schema.has_function:
        raw = schema.get_function_with_opset_version(
            _version(schema.function_opset_versions, opset))
    else:
        args = []
        for name in node.input:
            if name and name not in types:
                return None  # an input type inference could not give
            args.append((types[name] if name else onnx.TypeProto()).SerializeToString())
        try:
            raw = schema.get_context_dependent_function_with_opset_version(
                _version(schema.context_dependent_function_opset_versions, opset),
                node.SerializeToString(), args)
        except Exception:
            return None
    fn = onnx.FunctionProto()
    fn.ParseFromString(raw)
    body_opset = next((o.version for o in fn.opset_import if o.domain in ("", "ai.onnx")),
                      opset)
    prefix = f"{node.name or node.op_type}#{index}/"
    names = {"": ""}
    names.update({formal: actual for formal, actual in zip(fn.input, node.input)})
    names.update({formal: "" for formal in fn.input[len(node.input):]})
    for k, formal in enumerate(fn.output):
        actual = node.output[k] if k < len(node.output) else ""
        names[formal] = actual or prefix + formal  # an output the node does not use
    attrs = {a.name: a for a in node.attribute}
    # defaults: the function's own, else the schema's (MeanVarianceNormalization's axes)
    defaults = {name: a.default_value for name, a in schema.attributes.items()
                if a.default_value.type != onnx.AttributeProto.UNDEFINED}
    defaults.update({a.name: a for a in fn.attribute_proto})
    out = []
    for n in fn.node:
        if n.domain not in ("", "ai.onnx") or not _same_definition(n.op_type, body_opset,
                                                                      opset):
            return None
        if n.op_type not in supported and _schema(n.op_type, opset) is None:
            return None  # the check then names this node's operator, not the body's
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in n.attribute):
            return None
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.name = prefix + (n.name or f"{n.op_type}_{len(out)}")
        del m.input[:]
        m.input.extend(names.get(i, prefix + i) if i else "" for i in n.input)
        del m.output[:]
        m.output.extend(names.get(o, prefix + o) if o else "" for o in n.output)
        del m.attribute[:]
        for a in n.attribute:
            if a.ref_attr_name:  # the caller's attribute, else the function's default
                given = attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if given is None:
                    continue
                b = onnx.AttributeProto()
                b.CopyFrom(given)
                b.name = a.name
                m.attribute.append(b)
            else:
                m.attribute.append(a)
        out.append(m)
    return out


def _same_definition(op: str, body_opset: int, opset: int) -> bool:
    """Whether ``op`` means the same at the model's opset as at the body's."""
    if body_opset == opset:
        return True
    try:
        return (onnx.defs.get_schema(op, body_opset).since_version
                == onnx.defs.get_schema(op, opset).since_version)
    except Exception:
        return False
