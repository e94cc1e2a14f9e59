"""Which quantized recurrent layers (QLSTM, QGRU, QRNN: compiler/graph/qrecurrent.py) the
accelerator takes, and the integer products each one runs there (compiler/accel/wide.py
programs; runtime/accel_recurrent.py builds and drives them)."""

from __future__ import annotations

import numpy as np

from ..graph.qrecurrent import Q_RECURRENT_OPS, float_op, product_weights
from .wide import wide_weight_problem

__all__ = ["RECURRENT_OPS", "recurrent_problem", "layer_products", "time_steps"]

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
