"""numpy definitions of ONNX's recurrent layers: LSTM, GRU and RNN (one layer each, forward,
reverse or bidirectional), as onnxruntime computes them.

Attributes are in the importer's canonical form (frontend/control.py): ``direction``,
``hidden_size``, ``layout`` (0: time first, 1: batch first), ``activations`` with one
``activation_alpha`` and ``activation_beta`` per activation (onnxruntime's defaults filled
in; the lists hold every direction's functions), ``clip`` (None: no clip), LSTM's
``input_forget`` and GRU's ``linear_before_reset``.

Each direction projects the whole input sequence with one matrix product
(``[T*B, I] @ W^T``); only the recurrence ``h @ R^T`` runs per time step, on the whole batch.
Sequence lengths mask the batch: a sequence stops updating its state after its length
(reverse: starts at its last element), its ``Y`` rows past the length are 0, and its final
state is that of its last element (0 for a sequence of length 0, as in onnxruntime).
"""

from __future__ import annotations

import numpy as np

from .ir import NodeError, TensorType

__all__ = ["RECURRENT_KERNELS", "RECURRENT_SHAPE_RULES", "ACTIVATIONS", "GATES",
           "DEFAULT_ACTIVATIONS"]

# Gates per layer: the row blocks of W and R (LSTM: i, o, f, c; GRU: z, r, h).
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"),
                       "RNN": ("Tanh",)}


def _sigmoid(x, a, b):
    return 1 / (1 + np.exp(-x))


# name -> (fn(x, alpha, beta), takes alpha, takes beta, default alpha, default beta):
# onnxruntime's table (rnn_helpers.cc); a parameter it does not default is 0.
ACTIVATIONS = {
    "Relu": (lambda x, a, b: np.maximum(x, 0), False, False, 0.0, 0.0),
    "Tanh": (lambda x, a, b: np.tanh(x), False, False, 0.0, 0.0),
    "Sigmoid": (_sigmoid, False, False, 0.0, 0.0),
    "Affine": (lambda x, a, b: a * x + b, True, True, 0.0, 0.0),
    "LeakyRelu": (lambda x, a, b: np.where(x >= 0, x, a * x), True, False, 0.01, 0.0),
    "ThresholdedRelu": (lambda x, a, b: np.where(x > a, x, 0), True, False, 0.0, 0.0),
    "ScaledTanh": (lambda x, a, b: a * np.tanh(b * x), True, True, 0.0, 0.0),
    "HardSigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), True, True, 0.2, 0.5),
    "Elu": (lambda x, a, b: np.where(x >= 0, x, a * np.expm1(x)), True, False, 1.0, 0.0),
    "Softsign": (lambda x, a, b: x / (1 + np.abs(x)), False, False, 0.0, 0.0),
    "Softplus": (lambda x, a, b: np.logaddexp(0, x), False, False, 0.0, 0.0),
}


class _Direction:
    """One direction's weights and activations, cast to the input's dtype."""

    def __init__(self, op, attrs, d, w, r, b, dtype):
        h, g = attrs["hidden_size"], GATES[op]
        per = len(DEFAULT_ACTIVATIONS[op])
        self.acts = []
        for k in range(d * per, (d + 1) * per):
            fn = ACTIVATIONS[attrs["activations"][k]][0]
            alpha = dtype.type(attrs["activation_alpha"][k])
            beta = dtype.type(attrs["activation_beta"][k])
            self.acts.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b).astype(dtype,
                                                                                 copy=False))
        clip = attrs["clip"]
        self.clip = (lambda v: v) if clip is None else (
            lambda v, c=dtype.type(clip): np.clip(v, -c, c))
        self.w = w[d]
        self.r_t = np.ascontiguousarray(r[d].T)  # [H, G*H]: h @ r_t, row-major
        # GRU multiplies by its z/r and its h columns apart: each block contiguous
        self.r_zr, self.r_h = (np.ascontiguousarray(self.r_t[:, :2 * h]),
                               np.ascontiguousarray(self.r_t[:, 2 * h:]))
        bias = np.zeros(2 * g * h, dtype) if b is None else b[d]
        self.wb, self.rb = bias[:g * h], bias[g * h:]
        self.reverse = attrs["direction"] == "reverse" or d == 1

    def project(self, x2d):
        """The input projection of every step, [T*B, I] -> [T*B, G*H]."""
        return x2d @ self.w.T

    def recur(self, v, part: str = "all"):
        """``v @ R^T`` over the gate columns ``part``: "all", GRU's "zr" or "h"."""
        return v @ {"all": self.r_t, "zr": self.r_zr, "h": self.r_h}[part]


def _lstm_step(attrs, dr: _Direction, p, xw, h, c):
    hs = attrs["hidden_size"]
    f_act, g_act, h_act = dr.acts
    z = xw + dr.recur(h)  # gate inputs [B, 4H] (i, o, f, c), biases already in xw
    if p is None:  # i, o and f through f in one call
        z = dr.clip(z)
        ifo = f_act(z[:, :3 * hs])
        i, o, f = ifo[:, :hs], ifo[:, hs:2 * hs], ifo[:, 2 * hs:]
        f = 1 - i if attrs["input_forget"] else f
        c_new = f * c + i * g_act(z[:, 3 * hs:])
        return o * h_act(c_new), c_new
    # Peepholes: i and f see the previous cell, o the new one (before their clip).
    zi, zo, zf, zc = (z[:, k * hs:(k + 1) * hs] for k in range(4))
    i = f_act(dr.clip(zi + p[:hs] * c))
    f = 1 - i if attrs["input_forget"] else f_act(dr.clip(zf + p[2 * hs:] * c))
    c_new = f * c + i * g_act(dr.clip(zc))
    o = f_act(dr.clip(zo + p[hs:2 * hs] * c_new))
    return o * h_act(c_new), c_new


def _gru_step(attrs, dr: _Direction, p, xw, h, c):
    hs = attrs["hidden_size"]
    f_act, g_act = dr.acts
    zr = f_act(dr.clip(xw[:, :2 * hs] + dr.recur(h, "zr") + dr.rb[:2 * hs]))
    z, r = zr[:, :hs], zr[:, hs:]
    if attrs["linear_before_reset"]:
        pre = xw[:, 2 * hs:] + r * (dr.recur(h, "h") + dr.rb[2 * hs:])
    else:
        pre = xw[:, 2 * hs:] + dr.recur(r * h, "h") + dr.rb[2 * hs:]
    hh = g_act(dr.clip(pre))
    return (1 - z) * hh + z * h, None


def _rnn_step(attrs, dr: _Direction, p, xw, h, c):
    return dr.acts[0](dr.clip(xw + dr.recur(h))), None


_STEPS = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN": _rnn_step}


def _run(op, attrs, x, w, r, b=None, seq_lens=None, h0=None, c0=None, p=None, *,
         direction=_Direction):
    """One layer; ``direction(op, attrs, d, w, r, b, dtype)`` makes each direction's
    products (``project``, ``recur``): the float ones here, integer ones in
    qrecurrent.py."""
    layout = attrs["layout"]
    if layout:  # batch first: the same computation on swapped axes
        x = x.swapaxes(0, 1)
        h0 = None if h0 is None else h0.swapaxes(0, 1)
        c0 = None if c0 is None else c0.swapaxes(0, 1)
    t_len, batch, _ = x.shape
    hs, dtype, dirs = attrs["hidden_size"], x.dtype, w.shape[0]
    active = None
    if seq_lens is not None:
        lens = np.asarray(seq_lens).astype(np.int64)
        if lens.min(initial=0) < 0 or lens.max(initial=0) > t_len:
            raise ValueError(f"sequence_lens {lens.tolist()} must be within [0, {t_len}]")
        active = np.arange(t_len)[:, None, None] < lens[None, :, None]  # [T, B, 1]
    ys, hs_last, cs_last = [], [], []
    for d in range(dirs):
        dr = direction(op, attrs, d, w, r, b, dtype)
        # The input projection of every time step in one matrix product.
        xw = dr.project(x.reshape(t_len * batch, -1)).reshape(t_len, batch, -1)
        xw = xw + (dr.wb if op == "GRU" else dr.wb + dr.rb)
        h = np.zeros((batch, hs), dtype) if h0 is None else h0[d]
        c = np.zeros((batch, hs), dtype) if c0 is None else c0[d]
        peep = None if p is None else p[d]
        y = np.zeros((t_len, batch, hs), dtype)
        for t in (range(t_len - 1, -1, -1) if dr.reverse else range(t_len)):
            h_new, c_new = _STEPS[op](attrs, dr, peep, xw[t], h, c)
            if active is None:
                h, c = h_new, (c if c_new is None else c_new)
            else:
                h = np.where(active[t], h_new, h)
                c = c if c_new is None else np.where(active[t], c_new, c)
            y[t] = h if active is None else np.where(active[t], h, 0)
        if active is not None:  # a sequence of length 0 ends in zeros (onnxruntime)
            empty = (lens == 0)[:, None]
            h, c = np.where(empty, 0, h), np.where(empty, 0, c)
        ys.append(y)
        hs_last.append(h.astype(dtype))
        cs_last.append(c.astype(dtype))
    y, y_h, y_c = np.stack(ys, axis=1), np.stack(hs_last), np.stack(cs_last)
    if layout:
        y, y_h, y_c = y.transpose(2, 0, 1, 3), y_h.swapaxes(0, 1), y_c.swapaxes(0, 1)
    return (np.ascontiguousarray(y), np.ascontiguousarray(y_h),
            np.ascontiguousarray(y_c))[:3 if op == "LSTM" else 2]


RECURRENT_KERNELS = {
    "LSTM": lambda a, *xs: _run("LSTM", a, *xs),   # (Y, Y_h, Y_c)
    "GRU": lambda a, *xs: _run("GRU", a, *xs),     # (Y, Y_h)
    "RNN": lambda a, *xs: _run("RNN", a, *xs),     # (Y, Y_h)
}


# ---- shapes ----------------------------------------------------------------------------------


def _recurrent_types(node, types):
    """Output types of LSTM/GRU/RNN, checking every input's shape against X, W and R."""
    a = node.attrs
    x, w, r = types[:3]
    if len(x.shape) != 3 or len(w.shape) != 3:
        raise NodeError(node, f"X {x} and W {w} must be 3-D")
    dirs = 2 if a["direction"] == "bidirectional" else 1
    hs, g = a["hidden_size"], GATES[node.op]
    t_len, batch, size = (x.shape[1], x.shape[0], x.shape[2]) if a["layout"] else x.shape
    state = (batch, dirs, hs) if a["layout"] else (dirs, batch, hs)
    want = {0: (x.dtype, x.shape), 1: (x.dtype, (dirs, g * hs, size)),
            2: (x.dtype, (dirs, g * hs, hs)), 3: (x.dtype, (dirs, 2 * g * hs)),
            4: ("int32", (batch,)), 5: (x.dtype, state)}
    if node.op == "LSTM":
        want.update({6: (x.dtype, state), 7: (x.dtype, (dirs, 3 * hs))})
    names = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
    for k, t in enumerate(types):
        if t is None:
            continue
        if k not in want:
            raise NodeError(node, f"has {len(types)} inputs, {node.op} takes {len(want)}")
        dtype, shape = want[k]
        if (t.dtype, t.shape) != (dtype, shape):
            raise NodeError(node, f"input {names[k]} is {t} but must be "
                                  f"{TensorType(dtype, shape)} ({a['direction']}, hidden_size "
                                  f"{hs}, layout {a['layout']}, X {x})")
    y = (batch, t_len, dirs, hs) if a["layout"] else (t_len, dirs, batch, hs)
    outs = [TensorType(x.dtype, y), TensorType(x.dtype, state), TensorType(x.dtype, state)]
    return outs[:len(node.outputs)]


RECURRENT_SHAPE_RULES = {op: _recurrent_types for op in GATES}
