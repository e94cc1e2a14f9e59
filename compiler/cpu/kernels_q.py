"""CPU kernels of the int8 element-wise and attention operators of graph/qops.py: QLut,
QAdd, QMul and QMatMul, bit-exact with its numpy kernels.

The arithmetic of each operator is written once, below (``requantize_rounded``,
``qadd_value``, ``qmul_value``, ``qmatmul_value``, ``qlut_value``), as tensor expressions
that mirror qops.py line for line, and ``QPARAMS`` packs a node's attributes into the
small int32 operand those expressions read at run time (``NODE@qparams``), so that nodes
of one shape share a kernel whatever their multipliers and shifts. A change of qops.py's
formulas (zero points, say) is a change of these few functions, of ``QPARAMS`` and of
``KNOWN`` (until then such nodes stay numpy steps). The one other form is lut.py's QLut
for hosts with AVX-512 VBMI (``table[x + 128]`` by byte permutes; tested against this one).

Integer arithmetic is int32 with two's-complement wrap-around, as qops' ``wrap``: a product
or sum wrapped to int32 after each step is the int32 product or sum, and an int64 product of
int8 values (at most 2**14) by an attribute equals, modulo 2**32, the int32 product by the
attribute modulo 2**32. Right shifts are arithmetic.

Specs (operand kinds of operands.py: "full", ["broadcast", shape], "image_channel"):

    {"op": "qadd" | "qaddz" | "qmul" | "qmulz", "shape": [...],
     "layout": "plain" | "blocked", "operands": [kind_a, kind_b]}
                                         a, b (int8), qparams (int32[3] / [6] / [2] / [5]:
                                         qaddz and qmulz are QAdd and QMul with
                                         zero_points), out (int8)
    {"op": "qlut", "shape": [...]}       x (int8), table (int8[256]), out (int8)
    {"op": "qmatmul", "a": [Z, M, K], "b": [Z, K, N]}
                                         a, b (int8), qparams (int32[2]), out int8[Z, M, N]
"""

from __future__ import annotations

import numpy as np

from ..tensor import te
from ..tensor.expr import as_expr, max_expr, min_expr
from ..tensor.schedule import create_schedule
from .operands import operand_placeholders, operand_read
from .schedules import schedule_elementwise

__all__ = ["QPARAMS", "KNOWN", "QUANTIZED_ELTWISE_OPS", "build_quantized", "qparams",
           "understood"]

I8, I32 = "int8", "int32"


def _int32(v: int) -> int:
    """An attribute as the int32 with the same value modulo 2**32 (see the docstring)."""
    return (int(v) + 2**31) % 2**32 - 2**31


# ---- the arithmetic of qops.py ----------------------------------------------------------


def requantize_rounded(t, shift, zero_point=None):
    """qops' ``clip(wrap(t + 2**(shift-1)) >> shift, -128, 127)`` of an int32 ``t``, as
    int8 (``shift`` an int32 expression, 1..31); ``zero_point`` (an expression) is added
    after the shift, before the clip."""
    half = as_expr(1, t) << (shift - as_expr(1, shift))
    t = (t + half) >> shift
    if zero_point is not None:
        t = t + zero_point
    return min_expr(max_expr(t, as_expr(-128, t)), as_expr(127, t)).astype(I8)


def qadd_value(a, b, p):
    """qops.qadd: ``wrap(a * ma + b * mb)``, requantized; p = [ma, mb, shift]."""
    return requantize_rounded(a.astype(I32) * p[0] + b.astype(I32) * p[1], p[2])


def qaddz_value(a, b, p):
    """qops.qadd with zero points: ``wrap((a - za) * ma + (b - zb) * mb)``, requantized,
    zo added before the clip; p = [ma, mb, shift, za, zb, zo]."""
    t = (a.astype(I32) - p[3]) * p[0] + (b.astype(I32) - p[4]) * p[1]
    return requantize_rounded(t, p[2], p[5])


def qmul_value(a, b, p):
    """qops.qmul: ``wrap(a * b * m)``, requantized; p = [m, shift]."""
    return requantize_rounded(a.astype(I32) * b.astype(I32) * p[0], p[1])


def qmulz_value(a, b, p):
    """qops.qmul with zero points: ``wrap((a - za) * (b - zb) * m)``, requantized, zo added
    before the clip; p = [m, shift, za, zb, zo]."""
    t = (a.astype(I32) - p[2]) * (b.astype(I32) - p[3]) * p[0]
    return requantize_rounded(t, p[1], p[4])


def qmatmul_value(acc, p):
    """qops.qmatmul's epilogue on the int32 sum: ``wrap(acc * m)``, requantized;
    p = [m, shift]."""
    return requantize_rounded(acc * p[0], p[1])


def qlut_value(x, table):
    """qops.qlut: ``table[x + 128]``."""
    return table[x.astype(I32) + 128]


def _qadd_params(attrs):
    ma, mb = attrs["multipliers"]
    if "zero_points" in attrs:  # the "qaddz" kernel
        za, zb, zo = (int(v) for v in attrs["zero_points"])
        if not all(-128 <= v <= 127 for v in (za, zb, zo)):
            raise ValueError("zero point out of int8")
        return [_int32(ma), _int32(mb), int(attrs["shift"]), za, zb, zo]
    return [_int32(ma), _int32(mb), int(attrs["shift"])]


def _qmul_params(attrs):
    (m,) = attrs["multipliers"]
    if "zero_points" in attrs:  # the "qmulz" kernel
        za, zb, zo = (int(v) for v in attrs["zero_points"])
        if not all(-128 <= v <= 127 for v in (za, zb, zo)):
            raise ValueError("zero point out of int8")
        return [_int32(m), int(attrs["shift"]), za, zb, zo]
    return [_int32(m), int(attrs["shift"])]


def _qmatmul_params(attrs):
    return [_int32(attrs["multiplier"]), int(attrs["shift"])]


# op -> fn(attrs) -> the run-time int32 operand of its kernel
QPARAMS = {"QAdd": _qadd_params, "QMul": _qmul_params, "QMatMul": _qmatmul_params}


# The attributes and input counts the functions above read, per op. A node with any
# other (a zero point that qops.py learns after this file was written, say) has no kernel:
# it stays a numpy step, which computes qops' meaning, until these functions learn it too.
KNOWN = {"QAdd": ({"multipliers", "shift", "scale", "zero_points"}, 2),
         "QMul": ({"multipliers", "shift", "scale", "zero_points"}, 2),
         "QMatMul": ({"multiplier", "shift", "scale"}, 2),
         "QLut": ({"scale"}, 2)}


def understood(node) -> bool:
    """Whether the kernels compute everything the node's attributes and inputs say."""
    attrs, inputs = KNOWN[node.op]
    return set(node.attrs) <= attrs and len(node.inputs) == inputs and all(node.inputs)


def qparams(node) -> np.ndarray | None:
    """A QAdd/QMul/QMatMul node's int32 operand, or None when its attributes are ones
    qops.py refuses (the node then stays a numpy step, which reports them at run time) or
    ones the kernels do not know (``KNOWN``)."""
    a = node.attrs
    if not understood(node):
        return None
    try:
        shift = int(a["shift"])
        if not 1 <= shift <= 31:
            return None
        if node.op in ("QAdd", "QMul") \
                and len(a["multipliers"]) != (2 if node.op == "QAdd" else 1):
            return None
        return np.array(QPARAMS[node.op](a), np.int32)
    except (KeyError, TypeError, ValueError):
        return None


# ---- builders -------------------------------------------------------------------------------


def _binary(spec):
    shape, layout, kinds = tuple(spec["shape"]), spec["layout"], spec["operands"]
    a, b = operand_placeholders(kinds, layout, shape, "x", I8)
    sizes = {"qadd": 3, "qaddz": 6, "qmul": 2, "qmulz": 5}
    p = te.placeholder((sizes[spec["op"]],), I32, "qparams")
    value = {"qadd": qadd_value, "qaddz": qaddz_value, "qmul": qmul_value,
             "qmulz": qmulz_value}[spec["op"]]

    def body(*idx):
        return value(operand_read(kinds[0], a, layout, idx),
                     operand_read(kinds[1], b, layout, idx), p)
    y = te.compute(shape, body, "out")
    return schedule_elementwise(y), [a, b, p, y]


def _lut(spec):
    shape = tuple(spec["shape"])
    x = te.placeholder(shape, I8, "data")
    table = te.placeholder((256,), I8, "table")
    y = te.compute(shape, lambda *idx: qlut_value(x[idx], table), "out")
    return schedule_elementwise(y), [x, table, y]


def _matmul(spec):
    """``a [Z, M, K] @ b [Z, K, N]`` summed in int32 (wrapping as qops' ``wrap`` of the
    exact sum), then the requantization: one output element per (z, i, j), the sum over K
    vectorised along the output row."""
    a = te.placeholder(tuple(spec["a"]), I8, "a")
    b = te.placeholder(tuple(spec["b"]), I8, "b")
    p = te.placeholder((2,), I32, "qparams")
    (z, m, k), n = a.shape, b.shape[2]
    r = te.reduce_axis(k, "k")
    acc = te.compute((z, m, n), lambda q, i, j: te.sum(
        a[q, i, r].astype(I32) * b[q, r, j].astype(I32), axis=[r]), "out.acc")
    y = te.compute((z, m, n), lambda q, i, j: qmatmul_value(acc[q, i, j], p), "out")
    s = create_schedule(y)
    o = s[y]
    oz, oi, oj = o.leaves
    o.parallel(o.fuse(oz, oi))
    st = s[acc]
    st.set_scope("local")
    st.compute_at(o, o.leaves[0])
    az, ai, aj, ak = st.leaves
    st.reorder(az, ai, ak, aj)
    if n % 4 == 0 or n <= 64:
        st.vectorize(aj)
    return s, [a, b, p, y]


_Q_BUILDERS = {"qadd": _binary, "qaddz": _binary, "qmul": _binary, "qmulz": _binary,
               "qlut": _lut,
               "qmatmul": _matmul}
QUANTIZED_ELTWISE_OPS = tuple(_Q_BUILDERS)


def build_quantized(spec):
    """(schedule, tensors) of a qadd/qmul/qlut/qmatmul spec."""
    return _Q_BUILDERS[spec["op"]](spec)
