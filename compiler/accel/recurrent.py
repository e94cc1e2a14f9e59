"""Which quantized recurrent layers (QLSTM, QGRU, QRNN: compiler/graph/qrecurrent.py) the
accelerator takes, and the integer products each one runs there (compiler/accel/wide.py
programs; runtime/accel_recurrent.py builds and drives them)."""

from __future__ import annotations

import numpy as np

from ..graph.qrecurrent import Q_RECURRENT_OPS, float_op, product_weights
from .wide import wide_weight_problem

__all__ = ["RECURRENT_OPS", "recurrent_problem", "layer_products", "time_steps", "CONTROL_OPS",
           "WIDE_BODY_OPS", "body_nodes", "body_keys", "wide_products", "control_problem",
           "is_host_node", "wide_problem"]

RECURRENT_OPS = tuple(Q_RECURRENT_OPS)


def time_steps(node, graph) -> tuple[int, int]:
    """(time steps, batch) of a layer."""
    x = graph.types[node.inputs[0]].shape
    return (x[1], x[0]) if node.attrs["layout"] else (x[0], x[1])


def layer_products(node, graph) -> dict:
    """{key: (integer weight [O, K], rows M)} of the layer's products (qrecurrent.py's
    keys): the input projection has T*B rows, a recurrence B."""
    t_len, batch = time_steps(node, graph)
    weights = product_weights(float_op(node.op), node.attrs,
                              np.asarray(graph.initializers[node.inputs[1]]),
                              np.asarray(graph.initializers[node.inputs[2]]))
    return {key: (w, t_len * batch if key[0] == "W" else batch) for key, w in weights.items()}


def recurrent_problem(node, graph) -> str | None:
    """Why a quantized recurrent layer stays on the CPU (None: it goes to the
    accelerator)."""
    unknown = [v for v in (*node.inputs, *node.outputs) if v and not graph.types[v].static]
    if unknown:
        return f"the size of {unknown[0]!r} ({graph.types[unknown[0]]}) is only known at run time"
    for k, what in ((1, "W"), (2, "R")):
        if node.inputs[k] not in graph.initializers:
            return f"{node.op} with its {what} computed at run time"
        w = np.asarray(graph.initializers[node.inputs[k]])
        if w.dtype == np.int16 and wide_weight_problem(w):
            return f"{node.op}'s {what}: {wide_weight_problem(w)}"
    if 0 in time_steps(node, graph):
        return f"{node.op} of an empty sequence or batch"
    return None


# ---- control flow whose bodies hold integer products (compiler/graph/qbody.py) -----------

CONTROL_OPS = ("If", "Loop", "Scan")
WIDE_BODY_OPS = ("QMatMulWide", "QConvWide", *RECURRENT_OPS)


def body_nodes(node, path: str = "") -> list[tuple[str, object, object]]:
    """(key, body, node) of every integer-product node inside ``node``'s bodies (bodies of
    bodies too); a key is ``node/attribute/.../node``, the body's key the key's head."""
    from ..graph.ir import subgraphs

    out = []
    for attr, body in subgraphs(node):
        key = f"{path}{node.name}/{attr}"
        for n in body.nodes:
            if n.op in WIDE_BODY_OPS:
                out.append((f"{key}/{n.name}", body, n))
            elif subgraphs(n):
                out += body_nodes(n, key + "/")
    return out


def body_keys(node, path: str = "") -> dict:
    """{id(body): key} of every body inside ``node``."""
    from ..graph.ir import subgraphs

    out = {}
    for attr, body in subgraphs(node):
        key = f"{path}{node.name}/{attr}"
        out[id(body)] = key
        for n in body.nodes:
            if subgraphs(n):
                out.update(body_keys(n, key + "/"))
    return out


def wide_products(node, graph) -> dict:
    """{key: (integer weight [O, K], rows M)} of a QMatMulWide or QConvWide (key ("M",);
    a convolution's rows are its output pixels, K its window), as ``layer_products`` gives
    a recurrent layer's."""
    w = np.asarray(graph.initializers[node.inputs[1]])
    if node.op == "QConvWide":
        y = graph.types[node.outputs[0]].shape
        return {("M",): (w.reshape(w.shape[0], -1), y[0] * int(np.prod(y[2:])))}
    x = graph.types[node.inputs[0]].shape
    return {("M",): (w, int(np.prod(x[:-1])))}


def control_problem(node) -> str | None:
    """Why a control-flow node stays on the CPU (None: its bodies' integer products go to
    the accelerator)."""
    found = body_nodes(node)
    if not found:
        why = node.attrs.get("float_reason")
        return (f"{node.op}: its bodies hold no integer product (MatMul, Gemm, LSTM, GRU or "
                f"RNN with constant weights, quantized)" + (f"; {why}" if why else ""))
    for key, body, n in found:
        problem = (recurrent_problem(n, body) if n.op in RECURRENT_OPS else
                   wide_problem(n, body))
        if problem:
            return f"{key} ({n.op}) inside its body: {problem}"
    return None


def wide_problem(node, graph) -> str | None:
    """Why a QMatMulWide or QConvWide stays on the CPU (None: it goes to the accelerator)."""
    unknown = [v for v in (*node.inputs, *node.outputs) if v and not graph.types[v].static]
    if unknown:
        return f"the size of {unknown[0]!r} ({graph.types[unknown[0]]}) is only known at run time"
    w = np.asarray(graph.initializers[node.inputs[1]])
    if w.dtype == np.int16 and wide_weight_problem(w):
        return wide_weight_problem(w)
    if 0 in graph.types[node.inputs[0]].shape:
        return "an empty input"
    return None


def is_host_node(node) -> bool:
    """Whether ``node`` is placed as an accelerator node whose values stay on the host: a
    recurrent layer, a QMatMulWide or QConvWide, or control flow with integer products in
    its bodies."""
    return node.op in WIDE_BODY_OPS or (node.op in CONTROL_OPS and bool(body_nodes(node)))
