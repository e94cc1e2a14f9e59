"""Input projections hoisted out of a Loop body: ``MatMul(Gather(x, i), W)`` becomes
``Gather(x @ W, i)`` with ``x @ W`` computed once, before the loop, by the enclosing program.

An RNN written as a Loop (the zoo's ``control_flow``, exported cells) reads its time step
``x_t = Gather(x, iteration)`` from a sequence of the outer scope and multiplies it by a
constant weight. MatMul acts on the last axis only, so gathering along any other axis
commutes with it: the whole sequence's projection is one matrix product of ``T * B`` rows
(what LSTM and GRU kernels do with their input projection) instead of ``T`` products of
``B`` rows, one per iteration, and the body keeps only a Gather of the projected row.

A fused epilogue of adds and multiplies (the bias, the recurrent term) becomes nodes again
after the Gather, for the body's optimization to fuse them into the recurrent MatMul.

Taken when: the Gather's index is the body's iteration number, its data an outer run-time
float32 value of rank >= 2 gathered along an axis other than its last, its output read only
by that MatMul; the MatMul's other input a constant 2-D float32 matrix (an outer constant of
the enclosing program made a body constant). Every row of the sequence is projected, also
those a loop that stops early never reads.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..graph.ir import Graph, Node, TensorType

__all__ = ["hoist_projections"]


def hoist_projections(g: Graph, lowering, node: Node, outer_values: dict):
    """(body, [(body outer name, parent MatMul node)]): ``g`` (a Loop body whose outer
    constants are its initializers already) with the projections hoisted, and the parent
    nodes that compute them (not yet lowered). ``outer_values``: {body outer name: the
    enclosing program's value}."""
    readers: dict = {}
    for n in g.nodes:
        for v in n.inputs:
            readers.setdefault(v, []).append(n)
    producers = {o: n for n in g.nodes for o in n.outputs if o}
    nodes, hoisted = list(g.nodes), []
    types, outer = dict(g.types), list(g.outer)
    for mm in g.nodes:
        got = _projection(g, mm, producers, readers, outer_values, lowering)
        if got is None:
            continue
        gather, x, w = got
        k = len(hoisted)
        y_body = f"{node.name}@proj{k}"
        y_parent = f"{outer_values[x]}@{node.name}/proj{k}"
        xt = lowering.type(outer_values[x])
        y_type = TensorType("float32", (*xt.shape[:-1], w.shape[1]))
        w_name = f"{node.name}/proj{k}/weight"
        hoisted.append((y_body, y_type, w_name, w,
                        Node("MatMul", (outer_values[x], w_name), (y_parent,), {},
                             f"{node.name}/proj{k}")))
        out = mm.outputs[0]
        epilogue = mm.attrs.get("epilogue", ())
        rows = f"{out}@rows" if epilogue else out
        new = [Node("Gather", (y_body, gather.inputs[1]), (rows,), gather.attrs, gather.name)]
        for e, (op, arg) in enumerate(epilogue):  # the fused adds as nodes again
            made = out if e == len(epilogue) - 1 else f"{out}@{e}"
            new.append(Node(op, (new[-1].outputs[0], mm.inputs[arg]), (made,), {},
                            f"{mm.name}@{op}{e}"))
            types[made] = g.types[out]
        types[rows] = g.types[out]
        at = nodes.index(mm)
        nodes = [n for n in nodes[:at] if n is not gather] + new + nodes[at + 1:]
        types[y_body] = y_type
        outer.append(y_body)
    if not hoisted:
        return g, []
    return replace(g, nodes=tuple(nodes), types=types, outer=tuple(outer)), hoisted


def _projection(g: Graph, mm: Node, producers, readers, outer_values, lowering):
    """(the Gather, its outer data, the weight) of a hoistable MatMul, or None."""
    epilogue = mm.attrs.get("epilogue", ())
    if mm.op != "MatMul" or set(mm.attrs) - {"epilogue"} or len(mm.inputs) < 2 \
            or any(len(e) != 2 or e[0] not in ("Add", "Mul") for e in epilogue):
        return None
    a, w = mm.inputs[:2]
    gather = producers.get(a)
    if gather is None or gather.op != "Gather" or w not in g.initializers \
            or len(readers.get(a, ())) != 1 or a in g.outputs:
        return None
    x, index = gather.inputs
    weight = np.asarray(g.initializers[w])
    if x not in outer_values or index != g.inputs[0] or weight.ndim != 2 \
            or weight.dtype != np.float32:
        return None
    xt = lowering.type(outer_values[x])
    axis = gather.attrs.get("axis", 0)
    if xt.dtype != "float32" or len(xt.shape) < 2 or not xt.static \
            or not isinstance(axis, int) or not -len(xt.shape) <= axis < len(xt.shape) - 1 \
            or xt.shape[-1] != weight.shape[0] or axis % len(xt.shape) == len(xt.shape) - 1:
        return None
    return gather, x, weight


def lower_hoisted(lowering, hoisted: list) -> list[tuple[str, str]]:
    """Lower the hoisted products into the enclosing program (before the control step);
    [(body outer name, program value)]."""
    pairs = []
    if hoisted and not getattr(lowering, "_own_graph", False):  # never edit the caller's
        lowering.g = replace(lowering.g, initializers=dict(lowering.g.initializers),
                             types=dict(lowering.g.types))
        lowering._own_graph = True
    for y_body, y_type, w_name, w, mm in hoisted:
        lowering.g.initializers[w_name] = w
        lowering.g.types[w_name] = TensorType("float32", w.shape)
        lowering.g.types[mm.outputs[0]] = y_type
        if not lowering.dense(mm):
            lowering.fallback(mm)
        pairs.append((y_body, mm.outputs[0]))
    return pairs
