"""Float residual sums for the dense layers of transformers: a MatMul/Gemm layer whose fused
epilogue ends with the Add of a run-time residual becomes the layer without that step and a
separate Add, so the quantizer keeps the residual stream float (the Add reads the layer's
int8 output dequantized and the residual as it is).

Why: int8 residual streams lose what each block adds. A transformer's stream runs through
every block; quantized per tensor at each block's sum, it accumulates a rounding error at
each of them, and a channel with a large offset (post-norm BERT models: a LayerNorm output
as the residual, channels 20-100x the median) sets a step that rounds the other channels
away. Measured (docs/graph.md): ViT small 0.9933 -> 0.9987, all-MiniLM-L6 small
0.592 -> 0.852. Convolutions (ResNet's, MobileNet's residuals) keep their int8 sums: they
measure well already and those sums run on the accelerator.

The layer stays int8 (all of its multiply-adds); only the element-wise sum is float, on the
CPU beside the LayerNormalization that reads it in a transformer anyway.
"""

from __future__ import annotations

from .ir import Graph, Node

__all__ = ["float_residuals", "split_residuals", "rewrite_nodes", "fresh_name"]

_DENSE = ("MatMul", "Gemm")


def fresh_name(base: str, taken: set) -> str:
    """``base``, or ``base_K`` with the first K that is not ``taken``; added to ``taken``."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def rewrite_nodes(graph: Graph, rewrite, initializers: dict | None = None) -> Graph:
    """The graph with each node for which ``rewrite(node, types, taken)`` returns nodes
    replaced by them (None: the node stays); ``types`` (the graph's, a copy) takes the new
    values' types and ``taken`` (every value and node name) the new names (fresh_name).
    ``initializers``: a copy of the graph's the rewrite adds constants to (it holds it),
    the new graph's. ``graph`` itself when no node is replaced."""
    taken = set(graph.types) | {n.name for n in graph.nodes}
    types = dict(graph.types)
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        new = rewrite(node, types, taken)
        if new is None:
            nodes.append(node)
        else:
            nodes += new
            changed = True
    if not changed:
        return graph
    if initializers is None:
        return graph.with_nodes(nodes, types=types)
    return graph.with_nodes(nodes, initializers=initializers, types=types)


def with_epilogue(attrs: dict, steps) -> dict:
    """``attrs`` with the epilogue ``steps``, or without the attribute when there are none."""
    if steps:
        return {**attrs, "epilogue": tuple(steps)}
    return {k: v for k, v in attrs.items() if k != "epilogue"}


def float_residuals(graph: Graph) -> Graph:
    """The graph with each dense layer's residual epilogue Add split off (module doc);
    ``graph`` itself when there is none."""
    return split_residuals(graph, _DENSE)


def split_residuals(graph: Graph, ops=_DENSE) -> Graph:
    """The graph with the residual Add that ends the epilogue of each ``ops`` node with a
    constant weight split off as an Add node of its own; ``graph`` itself when there is
    none. (quantize.py splits convolutions' so: the Add becomes a requantizing QAdd, each
    operand in its own scale.)"""
    def rewrite(node, types, taken):
        steps = node.attrs.get("epilogue") or ()
        if node.op not in ops or not steps or steps[-1][0] != "Add" \
                or node.inputs[1] not in graph.initializers:
            return None
        k = steps[-1][1]
        residual = node.inputs[k]
        uses = [s for s in steps[:-1] if s[0] in ("Add", "Mul") and s[1] == k]
        # A residual has the output's type (a broadcast operand is the quantizer's case).
        if residual in graph.initializers or uses or k != len(node.inputs) - 1 \
                or graph.types[residual] != graph.types[node.outputs[0]]:
            return None
        out = node.outputs[0]
        mid = fresh_name(f"{out}/before_residual", taken)
        types[mid] = types[out]
        return [Node(node.op, node.inputs[:-1], (mid,), with_epilogue(node.attrs, steps[:-1]),
                     node.name),
                Node("Add", (mid, residual), (out,), {},
                     fresh_name(f"{node.name}/residual", taken))]
    return rewrite_nodes(graph, rewrite)
