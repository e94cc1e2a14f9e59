"""Attention scores with a run-time bias: a MatMul of two run-time values (Q x K^T) whose
fused epilogue adds or multiplies by something other than one constant positive scalar
becomes the MatMul (with its leading constant positive scalar Mul, if any) and the rest of
its epilogue as nodes of their own, so the product is a QMatMul and only the element-wise
rest stays float.

Why: fuse_epilogues (passes.py) folds what follows a MatMul into it, and QMatMul takes a
constant positive scalar factor as its only epilogue (the requantization takes it). The
attention of GPT-2 (``scores / sqrt(d) + causal mask``), DistilBERT, RoBERTa and BERT
exports from transformers (``+ attention mask``), T5 (``+ relative position bias``) and
Swin (``+ relative position bias + shift mask``) adds a run-time value to the scores: the
whole product stayed float on the CPU (2-3% of those models' multiply-adds, and a
CPU/accelerator crossing per head and layer). The split computes the same float function:
the steps run in the same order on the same operands.

``split_layer_epilogues`` does the same for a dense layer (MatMul/Gemm with a constant
2-D weight) whose whole epilogue the int8 layer cannot take: it keeps the longest prefix
the layer takes and makes the rest nodes of their own. MobileBERT's blocks end each dense
layer with ``+ bias + residual, * gamma + beta`` (its NoNorm): the residual Add in the
middle left 35% of its multiply-adds float; its embedding projection adds a constant
[1, S, D] (position embeddings, not per channel): 13% more.
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, Node
from .ops import OWN_INPUTS
from .residual import fresh_name

__all__ = ["split_matmul_epilogues", "split_layer_epilogues"]

# Epilogue steps that have an ONNX node of the same name and semantics (reference.py's
# apply_epilogue): binary steps read one more operand, unary ones only the running value.
_BINARY = ("Add", "Mul")
_UNARY = ("Relu", "Sigmoid", "Gelu")


def _positive_scalar(graph: Graph, node: Node, step) -> bool:
    if step[0] != "Mul":
        return False
    k = graph.initializers.get(node.inputs[step[1]])
    return k is not None and np.size(k) == 1 and float(np.asarray(k).reshape(())) > 0


def _splittable(graph: Graph, node: Node) -> int | None:
    """How many leading epilogue steps stay in the MatMul (0 or 1: a constant positive
    scalar Mul), or None when the node is not a MatMul of two run-time values of static
    float32 types of rank >= 2 whose epilogue the quantizer refuses, or its steps have no
    node form."""
    steps = node.attrs.get("epilogue") or ()
    if node.op != "MatMul" or not steps or len(node.outputs) != 1:
        return None
    if any(v in graph.initializers for v in node.inputs[:2]):
        return None
    ts = [graph.types.get(v) for v in (*node.inputs[:2], node.outputs[0])]
    if not all(t is not None and t.dtype == "float32" and t.static and len(t.shape) >= 2
               for t in ts):
        return None
    keep = 1 if _positive_scalar(graph, node, steps[0]) else 0
    if keep == len(steps):
        return None  # already a QMatMul's form
    return keep if _node_form(steps[keep:]) else None


def _nodes_for(node: Node, steps, current: str, out: str, types: dict,
               taken: set) -> list[Node]:
    """Epilogue ``steps`` of ``node`` as nodes from the value ``current`` to ``out``."""
    nodes = []
    for k, step in enumerate(steps):
        result = out if k == len(steps) - 1 else fresh_name(f"{out}/{step[0].lower()}",
                                                           taken)
        types[result] = types[out]
        operands = (current, node.inputs[step[1]]) if step[0] in _BINARY else (current,)
        nodes.append(Node(step[0], operands, (result,), {},
                          fresh_name(f"{node.name}/{step[0].lower()}", taken)))
        current = result
    return nodes


def _node_form(steps) -> bool:
    return all((s[0] in _BINARY and len(s) == 2) or (s[0] in _UNARY and len(s) == 1)
               for s in steps)


def split_layer_epilogues(graph: Graph, takes) -> Graph:
    """The graph with each dense layer's epilogue split after the longest prefix the int8
    layer takes (module doc). ``takes(graph, node)``: whether the quantizer makes ``node``
    an int8 layer (quantize.py's ``_layer_form``). ``graph`` itself when nothing splits."""
    taken = set(graph.types) | {n.name for n in graph.nodes}
    types = dict(graph.types)
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        steps = node.attrs.get("epilogue") or ()
        w = graph.initializers.get(node.inputs[1]) if len(node.inputs) > 1 else None
        if node.op not in ("MatMul", "Gemm") or not steps or w is None or w.ndim != 2 \
                or len(node.outputs) != 1 or takes(graph, node):
            nodes.append(node)
            continue
        keep = None
        for k in range(len(steps) - 1, -1, -1):
            if not _node_form(steps[k:]):
                break
            attrs = {**node.attrs, "epilogue": tuple(steps[:k])} if k else \
                {a: v for a, v in node.attrs.items() if a != "epilogue"}
            if takes(graph, Node(node.op, node.inputs, node.outputs, attrs, node.name)):
                keep = (k, attrs)
                break
        if keep is None:
            nodes.append(node)
            continue
        k, attrs = keep
        out = node.outputs[0]
        mid = fresh_name(f"{out}/layer", taken)
        types[mid] = types[out]
        # the layer's own inputs and the operands of the steps it keeps
        used = max([OWN_INPUTS[node.op]] + [s[1] + 1 for s in steps[:k] if s[0] in _BINARY])
        inputs = node.inputs[:used]
        while len(inputs) > 2 and not inputs[-1]:
            inputs = inputs[:-1]
        nodes.append(Node(node.op, inputs, (mid,), attrs, node.name))
        nodes += _nodes_for(node, steps[k:], mid, out, types, taken)
        changed = True
    return graph.with_nodes(nodes, types=types) if changed else graph


def split_matmul_epilogues(graph: Graph) -> Graph:
    """The graph with each activation MatMul's epilogue split after its constant positive
    scalar factor (module doc); ``graph`` itself when there is nothing to split."""
    taken = set(graph.types) | {n.name for n in graph.nodes}
    types = dict(graph.types)
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        keep = _splittable(graph, node)
        if keep is None:
            nodes.append(node)
            continue
        steps = node.attrs["epilogue"]
        out = node.outputs[0]
        inputs = list(node.inputs[:2])
        attrs = {k: v for k, v in node.attrs.items() if k != "epilogue"}
        if keep:
            inputs.append(node.inputs[steps[0][1]])
            attrs["epilogue"] = (("Mul", 2),)
        current = fresh_name(f"{out}/product", taken)
        types[current] = types[out]
        nodes.append(Node("MatMul", tuple(inputs), (current,), attrs, node.name))
        nodes.extend(_nodes_for(node, steps[keep:], current, out, types, taken))
        changed = True
    return graph.with_nodes(nodes, types=types) if changed else graph
