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
[1, S, D] (position embeddings, not per channel): 13% more. A convolution is split the same
way: a diffusion U-Net's ResNet block adds its timestep embedding [N, C, 1, 1] to the
convolution's output (a broadcast run-time value, not a residual: 26% of a small such
model's multiply-adds stayed float), and EfficientDet's BiFPN fuses three weighted inputs,
two run-time Adds in one epilogue (an int8 layer takes one residual).
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, Node, TensorType, constant
from .ops import OWN_INPUTS
from .residual import fresh_name, rewrite_nodes, with_epilogue

__all__ = ["split_matmul_epilogues", "split_layer_epilogues", "swap_constant_lhs"]

# Epilogue steps that have an ONNX node of the same name and semantics (reference.py's
# apply_epilogue): binary steps read one more operand, unary ones only the running value.
_BINARY = ("Add", "Mul")
_UNARY = ("Relu", "Sigmoid", "Gelu", "HardSwish")
# Steps that are two nodes: SiLU is x * Sigmoid(x) (fuse_epilogues found it so).
_GATED = ("SiLU",)


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
        if step[0] in _GATED:  # x * Sigmoid(x), as reference.apply_epilogue computes it
            gate = fresh_name(f"{out}/sigmoid", taken)
            types[gate] = types[out]
            nodes.append(Node("Sigmoid", (current,), (gate,), {},
                              fresh_name(f"{node.name}/sigmoid", taken)))
            nodes.append(Node("Mul", (current, gate), (result,), {},
                              fresh_name(f"{node.name}/silu", taken)))
            current = result
            continue
        operands = (current, node.inputs[step[1]]) if step[0] in _BINARY else (current,)
        nodes.append(Node(step[0], operands, (result,), {},
                          fresh_name(f"{node.name}/{step[0].lower()}", taken)))
        current = result
    return nodes


def _node_form(steps) -> bool:
    return all((s[0] in _BINARY and len(s) == 2) or (s[0] in _UNARY + _GATED and len(s) == 1)
               for s in steps)


def _presummed(graph: Graph, node: Node, types: dict, taken: set, takes):
    """[the Add nodes, the layer] when the layer's epilogue adds two or more run-time values
    of its output's type one after the other and takes them as one residual, their sum
    computed first (``y + a + b`` as ``y + (a + b)``: EfficientDet's BiFPN fuses three
    weighted inputs, then SiLU, and the SiLU stays the layer's table rather than a
    Sigmoid and a Mul after two more Adds); else None. Float rounding differs from the
    fused order by the reassociation only."""
    steps = node.attrs["epilogue"]
    out = graph.types[node.outputs[0]]

    def residual(step):
        v = node.inputs[step[1]] if step[0] == "Add" and len(step) == 2 else None
        return v is not None and v not in graph.initializers and graph.types[v] == out

    for first in range(len(steps) - 1):
        last = first
        while last + 1 < len(steps) and residual(steps[last + 1]):
            last += 1
        if not residual(steps[first]) or last == first:
            continue
        adds, current = [], node.inputs[steps[first][1]]
        for step in steps[first + 1:last + 1]:
            result = fresh_name(f"{node.outputs[0]}/residuals", taken)
            types[result] = out
            adds.append(Node("Add", (current, node.inputs[step[1]]), (result,), {},
                             fresh_name(f"{node.name}/residual_sum", taken)))
            current = result
        inputs = (*node.inputs, current)
        merged = (*steps[:first], ("Add", len(inputs) - 1), *steps[last + 1:])
        layer = Node(node.op, inputs, node.outputs, {**node.attrs, "epilogue": merged},
                     node.name)
        if takes(graph.with_nodes(graph.nodes, types=types), layer):
            return [*adds, layer]
        return None
    return None


def split_layer_epilogues(graph: Graph, takes) -> Graph:
    """The graph with each dense layer's or convolution's epilogue split after the longest
    prefix the int8 layer takes (module doc), or, when a run of residual Adds is what it
    does not take, those residuals summed first (``_presummed``). ``takes(graph, node)``:
    whether the quantizer makes ``node`` an int8 layer (quantize.py's ``_layer_form``).
    ``graph`` itself when nothing splits."""
    def rewrite(node, types, taken):
        steps = node.attrs.get("epilogue") or ()
        w = graph.initializers.get(node.inputs[1]) if len(node.inputs) > 1 else None
        if node.op not in ("MatMul", "Gemm", "Conv") or not steps or w is None \
                or (w.ndim != 2 and node.op != "Conv") or len(node.outputs) != 1 \
                or takes(graph, node):
            return None
        presummed = _presummed(graph, node, types, taken, takes)
        if presummed is not None:
            return presummed
        keep = None
        for k in range(len(steps) - 1, -1, -1):
            if not _node_form(steps[k:]):
                break
            attrs = with_epilogue(node.attrs, steps[:k])
            if takes(graph, Node(node.op, node.inputs, node.outputs, attrs, node.name)):
                keep = (k, attrs)
                break
        if keep is None:
            return None
        k, attrs = keep
        out = node.outputs[0]
        mid = fresh_name(f"{out}/layer", taken)
        types[mid] = types[out]
        # the layer's own inputs and the operands of the steps it keeps
        used = max([OWN_INPUTS[node.op]] + [s[1] + 1 for s in steps[:k] if s[0] in _BINARY])
        inputs = node.inputs[:used]
        while len(inputs) > 2 and not inputs[-1]:
            inputs = inputs[:-1]
        return [Node(node.op, inputs, (mid,), attrs, node.name),
                *_nodes_for(node, steps[k:], mid, out, types, taken)]
    return rewrite_nodes(graph, rewrite)


def split_matmul_epilogues(graph: Graph) -> Graph:
    """The graph with each activation MatMul's epilogue split after its constant positive
    scalar factor (module doc); ``graph`` itself when there is nothing to split."""
    def rewrite(node, types, taken):
        keep = _splittable(graph, node)
        if keep is None:
            return None
        steps = node.attrs["epilogue"]
        out = node.outputs[0]
        inputs = list(node.inputs[:2])
        attrs = {k: v for k, v in node.attrs.items() if k != "epilogue"}
        if keep:
            inputs.append(node.inputs[steps[0][1]])
            attrs["epilogue"] = (("Mul", 2),)
        current = fresh_name(f"{out}/product", taken)
        types[current] = types[out]
        return [Node("MatMul", tuple(inputs), (current,), attrs, node.name),
                *_nodes_for(node, steps[keep:], current, out, types, taken)]
    return rewrite_nodes(graph, rewrite)


def _swap_last(rank: int) -> list[int]:
    return list(range(rank - 2)) + [rank - 1, rank - 2]


def _commutes_with_transpose(graph: Graph, node: Node) -> bool:
    """Whether every epilogue step of ``node`` is element-wise by a scalar constant or
    unary, so it gives the same result before or after transposing the product."""
    for step in node.attrs.get("epilogue") or ():
        if step[0] in _BINARY:
            k = graph.initializers.get(node.inputs[step[1]])
            if len(step) != 2 or k is None or np.size(k) != 1:
                return False
        elif len(step) != 1:
            return False
    return True


def swap_constant_lhs(graph: Graph) -> Graph:
    """The graph with each MatMul of a constant by a run-time value, ``C x X``, written as
    ``(X^T x C^T)^T`` (^T: the last two axes swapped): a product whose second operand is
    the constant, which the quantizer makes a QGemm (C 2-D) or a QMatMul with a constant
    operand (rank >= 3). DETR's decoder multiplies its learned queries (constant once the
    query projection is folded) by the image's keys: that product stayed float on the CPU
    ("its weight ... is computed at run time"). X's transpose is folded into the Transpose
    that makes X when there is one (a Transpose of a Transpose is one Transpose); the
    result's is a Transpose node. Same float values: the products are the same sums of the
    same terms in the same order. ``graph`` itself when there is nothing to swap."""
    inits = graph.initializers
    users = graph.consumers()
    producer = {o: n for n in graph.nodes for o in n.outputs}
    taken = set(graph.types) | {n.name for n in graph.nodes}
    types, new_inits = dict(graph.types), dict(inits)
    replace: dict[str, list[Node]] = {}
    drop: set[str] = set()
    for node in graph.nodes:
        if node.op != "MatMul" or len(node.outputs) != 1 or node.inputs[0] not in inits \
                or node.inputs[1] in inits or not _commutes_with_transpose(graph, node):
            continue
        ts = [graph.types.get(v) for v in (*node.inputs[:2], node.outputs[0])]
        if not all(t is not None and t.dtype == "float32" and t.static and len(t.shape) >= 2
                   for t in ts):
            continue
        c, x, out = node.inputs[0], node.inputs[1], node.outputs[0]
        xt, ot = ts[1], ts[2]
        swap = _swap_last(len(xt.shape))
        source, perm = x, swap
        made = producer.get(x)
        if made is not None and made.op == "Transpose" and x not in graph.outputs \
                and len(users.get(x, ())) == 1 and made.attrs.get("perm") is not None:
            first = list(made.attrs["perm"])
            source, perm = made.inputs[0], [first[i] for i in swap]
            drop.add(made.name)
        nodes = []
        if perm == list(range(len(perm))):
            moved = source
        else:
            moved = fresh_name(f"{x}/transposed", taken)
            types[moved] = TensorType("float32", tuple(xt.shape[i] for i in swap))
            nodes.append(Node("Transpose", (source,), (moved,), {"perm": perm},
                              fresh_name(f"{node.name}/transpose_data", taken)))
        weight = fresh_name(f"{c}/transposed", taken)
        cv = constant(np.swapaxes(inits[c], -1, -2))
        new_inits[weight] = cv
        types[weight] = TensorType(str(cv.dtype), cv.shape)
        product = fresh_name(f"{out}/transposed", taken)
        types[product] = TensorType("float32", tuple(ot.shape[i] for i in
                                                     _swap_last(len(ot.shape))))
        nodes.append(Node("MatMul", (moved, weight, *node.inputs[2:]), (product,),
                          dict(node.attrs), node.name))
        nodes.append(Node("Transpose", (product,), (out,), {"perm": _swap_last(len(ot.shape))},
                          fresh_name(f"{node.name}/transpose", taken)))
        replace[node.name] = nodes
    if not replace:
        return graph
    nodes = []
    for node in graph.nodes:
        if node.name in drop:
            continue
        nodes.extend(replace.get(node.name, [node]))
    return graph.with_nodes(nodes, initializers=new_inits, types=types)
