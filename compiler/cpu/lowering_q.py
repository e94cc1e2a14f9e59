"""Lowering of the int8 element-wise and attention operators of graph/qops.py (QLut, QAdd,
QMul, QMatMul) to the kernels of kernels_q.py.

Each handler takes the lowering (lowering._Lowering) and a node and returns False to leave
the node to the numpy fallback: attributes qops.py refuses (reported there at run time), an
operand that is not int8, a constant operand where a run-time one is expected, batch axes
of a QMatMul that broadcast, and attributes or inputs kernels_q.py does not know
(``kernels_q.KNOWN``: a zero point added to qops.py later stays numpy until the kernels
learn it, rather than be silently ignored).

Layouts: QLut, QAdd and QMul are element-wise, so they keep the layout they find (a QConv's
blocked output stays blocked; a QLut between two QConvs costs no transposes). A QAdd/QMul
operand that numpy broadcasts (squeeze-excitation's gate [N, C, 1, 1]) is read with
kernels.py's operand kinds ("image_channel" blocked, ["broadcast", shape] plain).
"""

from __future__ import annotations

import math

import numpy as np

from ..graph.ir import Node, TensorType
from . import lowering_int8, lowering_nn
from .kernels_q import qparams, understood

__all__ = ["qlut", "qbinary", "qmatmul", "HANDLERS"]

I8 = "int8"


def _params(lw, node: Node, p: np.ndarray) -> str:
    return lw.add_const(f"{node.name}@qparams", p)


def qlut(lw, node: Node) -> bool:
    if not understood(node):
        return False
    x, table = node.inputs
    tx = lw.type(x)
    if lw.is_const(x) or tx.dtype != I8 or not tx.shape or len(node.outputs) != 1 \
            or lw.type(table) != TensorType(I8, (256,)):
        return False
    block = lw.current_block(x) if len(tx.shape) == 4 else 0
    data = lw.blocked(x, block) if block else lw.plain(x)
    tab = lw.add_const(table, np.asarray(lw.const(table), np.int8)) if lw.is_const(table) \
        else lw.plain(table)
    out = lw.produce(node.outputs[0], block)
    lw.kernel(node, {"op": "qlut", "shape": lw.values[out]["shape"]}, [data, tab, out], out)
    return True


def qbinary(lw, node: Node) -> bool:
    """QAdd and QMul of two int8 values, either broadcast to the output as numpy does."""
    p = qparams(node)
    out_t = lw.type(node.outputs[0]) if len(node.outputs) == 1 else None
    if p is None or out_t is None or not out_t.shape or len(node.inputs) != 2 \
            or any(lw.type(v).dtype != I8 for v in node.inputs) \
            or all(lw.is_const(v) for v in node.inputs):
        return False
    block = 0  # blocked when a 4-D operand of the output's shape is blocked already
    if len(out_t.shape) == 4:
        for v in node.inputs:
            if not lw.is_const(v) and lw.type(v).shape == out_t.shape:
                block = block or lw.current_block(v)
    layout = "blocked" if block else "plain"
    kinds, args = [], []
    for v in node.inputs:
        got = lw.operand(v, out_t, layout, block, I8)
        if layout == "plain" and (got is None or (got[0] == "channel"
                                                  and len(out_t.shape) != 4)):
            got = lowering_nn.broadcast_operand(lw, v, out_t, I8)
        if got is None or got[1] is None:  # (a folded scalar: the kernels read tensors)
            return False
        kinds.append(got[0])
        args.append(got[1])
    out = lw.produce(node.outputs[0], block)
    op = "qmulz" if node.op == "QMul" and "zero_points" in node.attrs else node.op.lower()
    spec = {"op": op, "shape": lw.values[out]["shape"], "layout": layout,
            "operands": kinds}
    lw.kernel(node, spec, args + [_params(lw, node, p), out], out)
    return True


def qmatmul(lw, node: Node) -> bool:
    """``a [..., M, K] @ b [..., K, N]`` of two run-time int8 values with the same batch
    axes: one kernel over the batches, viewed as 3-D."""
    p = qparams(node)
    a_in, b_in = node.inputs[:2]
    ta, tb = lw.type(a_in), lw.type(b_in)
    if p is None or len(node.outputs) != 1 or ta.dtype != I8 or tb.dtype != I8 \
            or lw.is_const(a_in) or lw.is_const(b_in) or len(ta.shape) < 2 \
            or tuple(ta.shape[:-2]) != tuple(tb.shape[:-2]):
        return False
    (m, k), n = ta.shape[-2:], tb.shape[-1]
    z = math.prod(ta.shape[:-2])
    a = lw.view_of(lw.plain(a_in), (z, m, k), f"{a_in}@3d")
    b = lw.view_of(lw.plain(b_in), (z, k, n), f"{b_in}@3d")
    out_v = node.outputs[0]
    flat = lw.define(f"{out_v}@3d", I8, (z, m, n))
    # the CPU's int8 dot-product instructions when the build has them (lowering_int8.py)
    spec = lowering_int8.matmul_spec(lw, z, m, k, n) \
        or {"op": "qmatmul", "a": [z, m, k], "b": [z, k, n]}
    lw.kernel(node, spec, [a, b, _params(lw, node, p), flat], flat)
    lw.step("view", node, [flat], [lw.produce(out_v, 0)])
    return True


HANDLERS = {"QLut": qlut, "QAdd": qbinary, "QMul": qbinary, "QMatMul": qmatmul}
