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
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, Node
from .residual import fresh_name

__all__ = ["split_matmul_epilogues"]

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
    for step in steps[keep:]:
        if not (step[0] in _BINARY and len(step) == 2) and \
                not (step[0] in _UNARY and len(step) == 1):
            return None
    return keep


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
        rest = steps[keep:]
        for k, step in enumerate(rest):
            result = out if k == len(rest) - 1 else fresh_name(f"{out}/{step[0].lower()}",
                                                               taken)
            types[result] = types[out]
            operands = (current, node.inputs[step[1]]) if step[0] in _BINARY else (current,)
            nodes.append(Node(step[0], operands, (result,), {},
                              fresh_name(f"{node.name}/{step[0].lower()}", taken)))
            current = result
        changed = True
    return graph.with_nodes(nodes, types=types) if changed else graph
