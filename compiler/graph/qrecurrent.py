"""Quantized recurrent layers: QLSTM, QGRU and QRNN, the integer-product form of ONNX's
LSTM, GRU and RNN (ops_recurrent.py) that quantize.py writes.

The layer's two products, the input projection ``X W^T`` (every step at once) and the
recurrence ``h R^T`` (per step), are exact integer products of 16-bit activations and
int8 (or int16) per-row weights (qops.py ``wide_matmul``, which the accelerator runs as
int8 GEMM passes: compiler/accel/wide.py); everything else, the biases, gates,
nonlinearities, cell update, sequence lengths and clip, is ops_recurrent.py's float
computation on the dequantized products. This is TFLite's "16x8" recipe for integer
LSTMs: 8-bit activations lose too much over a recurrence (a gate's input quantized to
1/127 of its range, 100 steps in a row), 16 bits do not, and the products, where all the
multiply-adds are, still run on the int8 MAC array.

Inputs: ``(X float32, W_q int8|int16 [D, G*H, I], R_q int8|int16 [D, G*H, H], W_scale
float32 [D, G*H], R_scale float32 [D, G*H], B, sequence_lens, initial_h, initial_c, P)``
(the float layer's B.. P, float32; "" where missing). Attributes: the float layer's, and
``x_scale``, ``h_scale`` (float): the 16-bit steps of X and of the recurrent operand (h,
and GRU's ``r * h``). Per direction d:

    xq  = clip(rint(X / x_scale), -32768, 32767)                  int16 (float32 division)
    XW  = float32(wide_matmul(xq, W_q[d])) * float32(x_scale * W_scale[d])
    per step: hq = clip(rint(h / h_scale), ...); hR = float32(wide_matmul(hq, R_q[d][rows]))
              * float32(h_scale * R_scale[d][rows])

(int16 weights: ``wide_matmul_exact``, the product in int64, which 32 bits would wrap).
    then ops_recurrent.py's step on XW + biases and hR.

GRU runs R in two products (the z/r rows on h, the h rows on h or ``r * h``); LSTM and
RNN in one. ``products``: the function computing ``wide_matmul(a, weight)`` for a key
(``("W", d)``, ``("R", d, part)``, see ``product_weights``); the accelerator build passes
one that runs the accelerator programs, so both builds compute the same bits.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .ir import NodeError, TensorType
from .ops_recurrent import GATES, RECURRENT_SHAPE_RULES, _Direction, _run
from .qops import wide_matmul, wide_matmul_exact

__all__ = ["Q_RECURRENT_KERNELS", "Q_RECURRENT_SHAPE_RULES", "Q_RECURRENT_OPS",
           "quantize16", "product_weights", "float_op"]

# quantized op -> float op
Q_RECURRENT_OPS = {"QLSTM": "LSTM", "QGRU": "GRU", "QRNN": "RNN"}


def float_op(op: str) -> str:
    return Q_RECURRENT_OPS[op]


def quantize16(x: np.ndarray, scale) -> np.ndarray:
    """float -> int16 in steps of ``scale`` (float32 arithmetic, half to even)."""
    q = np.rint(np.asarray(x, np.float32) / np.float32(scale))
    return np.clip(q, -32768, 32767).astype(np.int16)


def _parts(op: str, hidden: int) -> dict[str, slice]:
    """The row blocks of R each recurrent product uses."""
    if op == "GRU":
        return {"zr": slice(0, 2 * hidden), "h": slice(2 * hidden, 3 * hidden)}
    return {"all": slice(0, GATES[op] * hidden)}


def product_weights(op: str, attrs: dict, w_q: np.ndarray, r_q: np.ndarray) -> dict:
    """{key: integer weight [O, K]} of every product of the layer: ``("W", d)`` the input
    projection of direction d, ``("R", d, part)`` its recurrence (``part``: "all", or
    GRU's "zr" and "h")."""
    base = Q_RECURRENT_OPS.get(op, op)
    out = {}
    for d in range(w_q.shape[0]):
        out[("W", d)] = np.ascontiguousarray(w_q[d])
        for part, rows in _parts(base, int(attrs["hidden_size"])).items():
            out[("R", d, part)] = np.ascontiguousarray(r_q[d][rows])
    return out


class _QDirection(_Direction):
    """One direction with integer products (module docstring)."""

    def __init__(self, op, attrs, d, w, r, b, dtype, *, w_scale, r_scale, products):
        super().__init__(op, attrs, d, w, r, b, dtype)
        self.d, self.products = d, products
        self.sx, self.sh = np.float32(attrs["x_scale"]), np.float32(attrs["h_scale"])
        self.w_deq = (self.sx * np.asarray(w_scale[d], np.float32)).astype(np.float32)
        self.r_deq = (self.sh * np.asarray(r_scale[d], np.float32)).astype(np.float32)
        self.rows = _parts(op, int(attrs["hidden_size"]))

    def project(self, x2d):
        acc = self.products(("W", self.d), quantize16(x2d, self.sx))
        return acc.astype(np.float32) * self.w_deq

    def recur(self, v, part: str = "all"):
        acc = self.products(("R", self.d, part), quantize16(v, self.sh))
        return acc.astype(np.float32) * self.r_deq[self.rows[part]]


def q_recurrent(op: str, attrs, x, w_q, r_q, w_scale, r_scale, b=None, seq_lens=None,
                h0=None, c0=None, p=None, *, products=None):
    """The quantized layer (module docstring); ``products(key, a)``: the integer products,
    ``wide_matmul`` by default."""
    base = float_op(op)
    for what, v in (("W", w_q), ("R", r_q)):
        if v.dtype not in (np.int8, np.int16):
            raise ValueError(f"{op}: {what} must be int8 or int16, got {v.dtype}")
    if products is None:
        weights = product_weights(base, attrs, w_q, r_q)

        def products(key, a):
            w = weights[key]
            return (wide_matmul_exact if w.dtype == np.int16 else wide_matmul)(a, w)

    def direction(op_, attrs_, d, w, r, b_, dtype):
        return _QDirection(op_, attrs_, d, w, r, b_, dtype, w_scale=w_scale, r_scale=r_scale,
                           products=products)

    return _run(base, attrs, x, w_q, r_q, b, seq_lens, h0, c0, p, direction=direction)


def _kernel(op):
    def run(attrs, *inputs):
        return q_recurrent(op, attrs, *inputs)
    return run


Q_RECURRENT_KERNELS = {op: _kernel(op) for op in Q_RECURRENT_OPS}


def _types(node, types):
    """The float layer's rule on the float view of the inputs, and the weights' and
    scales' own checks."""
    x = types[0]
    if len(types) < 5 or any(t is None for t in types[:5]):
        raise NodeError(node, "takes X, W, R, W_scale and R_scale")
    w, r, ws, rs = types[1:5]
    for what, t in (("W", w), ("R", r)):
        if t.dtype not in ("int8", "int16"):
            raise NodeError(node, f"{what} is {t}, must be int8 or int16")
    for what, t, of in (("W_scale", ws, w), ("R_scale", rs, r)):
        if t.dtype != "float32" or t.shape != tuple(of.shape[:2]):
            raise NodeError(node, f"{what} is {t}, must be float32[{of.shape[0]},{of.shape[1]}]")
    as_float = [x, TensorType(x.dtype, w.shape), TensorType(x.dtype, r.shape), *types[5:]]
    base = dataclasses.replace(node, op=float_op(node.op))
    return RECURRENT_SHAPE_RULES[base.op](base, as_float)


Q_RECURRENT_SHAPE_RULES = {op: _types for op in Q_RECURRENT_OPS}


# ---- quantizing a float layer (quantize.py) ------------------------------------------------

# Weight bits of the quantized layers: int8 per row (one GEMM pass per activation digit) or
# int16 (twice the passes). docs/graph.md, "Recurrent layers in int8", has the measurements.
WEIGHT_BITS = 8
_WEIGHT_MAX = {8: 127, 16: 32639}  # 32639: compiler/accel/wide.py's signed int16 digits
# Room above the calibrated |X| maximum: values up to twice it keep their 16-bit steps
# (a 16-bit step is 1/16384 of that range, finer than the weights' 1/127 anyway).
X_HEADROOM = 2.0
# Activations whose outputs lie in [-1, 1]: the recurrent operand (h, GRU's r * h) needs
# no calibration when the layer uses only these.
_BOUNDED = ("Sigmoid", "Tanh", "HardSigmoid", "Softsign")


def recurrent_problem(graph, node) -> str | None:
    """Why an LSTM/GRU/RNN stays float (None: it becomes QLSTM/QGRU/QRNN)."""
    inits = graph.initializers
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    if graph.types[ins[0]].dtype != "float32":
        return f"its input is {graph.types[ins[0]].dtype}, not float32"
    for k, what in ((1, "W"), (2, "R"), (3, "B"), (7, "P")):
        if ins[k] and ins[k] not in inits:
            return f"its {what} {ins[k]!r} is computed at run time (the integer form needs constants)"
    return None


def _per_row(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output row (axis 1 of [D, G*H, K]): int weights and float32 scales."""
    top = np.abs(w).max(axis=2)
    s = np.where(top > 0, top / _WEIGHT_MAX[bits], 1.0).astype(np.float32)
    q = np.clip(np.rint(w / s[:, :, None]), -_WEIGHT_MAX[bits], _WEIGHT_MAX[bits])
    return q.astype(np.int8 if bits == 8 else np.int16), s


def h_bound(node) -> float | None:
    """The bound of |h| (past the initial state) that a layer's activations guarantee (1),
    or None: calibrate it."""
    return 1.0 if all(a in _BOUNDED for a in node.attrs["activations"]) else None


def calibrated_values(node) -> list[str]:
    """The values whose calibrated max |x| ``quantized_layer`` needs: X, the initial state,
    and the outputs when the activations do not bound h."""
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    out = [ins[0], ins[5]]
    if h_bound(node) is None:
        out += list(node.outputs[:2])
    return [v for v in out if v]


def h_range(node, maxabs: dict) -> float:
    """The range of the recurrent operand: the activations' bound or the calibrated outputs,
    and the calibrated initial state (both with X_HEADROOM: a state beyond the calibration
    would be clipped)."""
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    bound = h_bound(node)
    if bound is None:
        bound = X_HEADROOM * max([maxabs.get(v, 0.0) for v in node.outputs[:2] if v] + [0.0])
    initial = X_HEADROOM * maxabs.get(ins[5], 0.0) if ins[5] else 0.0
    return max(bound, initial, 1e-6)


def quantized_layer(node, graph, x_max: float, h_max: float, bits: int = WEIGHT_BITS):
    """(op, inputs as arrays or value names, attrs) of the quantized form of ``node``:
    constants as arrays (the caller names them), values by name."""
    inits = graph.initializers
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    w = np.asarray(inits[ins[1]], np.float64)
    r = np.asarray(inits[ins[2]], np.float64)
    w_q, w_s = _per_row(w, bits)
    r_q, r_s = _per_row(r, bits)
    x_scale = float(np.float32(max(x_max * X_HEADROOM, 1e-30) / 32767))
    h_scale = float(np.float32(max(h_max, 1e-30) / 32767))
    attrs = {k: v for k, v in node.attrs.items() if k != "float_reason"}
    attrs.update(x_scale=x_scale, h_scale=h_scale)
    inputs = [ins[0], w_q, r_q, w_s, r_s, *ins[3:]]
    while inputs and isinstance(inputs[-1], str) and not inputs[-1]:
        inputs.pop()
    return "Q" + node.op, inputs, attrs
