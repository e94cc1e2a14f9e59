"""QMatMulWide (and QConvWide, a Conv of group 1 the same way): a MatMul/Gemm with a
constant weight as an exact integer product of a
16-bit activation and a per-row int8 or int16 weight, float in and float out; the form
quantize's body pass (qbody.py) gives the products inside Loop, Scan and If bodies, where
a value is carried from one iteration to the next and an 8-bit step at every iteration
would add up.

Inputs ``(x float32 [..., K], w_q int8|int16 [O, K], w_scale float32 [O], bias float32 [O]
or "", *epilogue operands)``, attributes ``x_scale`` and, like a fused MatMul, an optional
``epilogue`` (float steps after the product; operand indices count this node's inputs)::

    q   = clip(rint(x / x_scale), -32768, 32767)                  int16 (float32 division)
    acc = q @ w_q.T                                              exactly, int64 (no wrap)
    y   = float32(acc) * float32(x_scale * w_scale) [+ bias], then the epilogue

``product(a, w)``, ``qops.wide_matmul_exact`` by default, is where the accelerator build
runs its program (compiler/accel/wide.py, exact mode): the rest is the same code in both
builds.
"""

from __future__ import annotations

import numpy as np

from .ir import NodeError, TensorType
from .ops import _windows, conv, conv_types, pool_output_shape
from .qops import wide_matmul_exact
from .qrecurrent import quantize16

__all__ = ["QWIDE_KERNELS", "QWIDE_SHAPE_RULES", "QWIDE_OWN_INPUTS", "qmatmul_wide",
           "qconv_wide", "conv_columns"]

QWIDE_OWN_INPUTS = {"QMatMulWide": 4, "QConvWide": 4}


def qmatmul_wide(attrs, x, w_q, w_scale, bias=None, *, product=None):
    if w_q.dtype not in (np.int8, np.int16) or w_q.ndim != 2:
        raise ValueError(f"QMatMulWide: the weight must be int8 or int16 [O, K], got "
                         f"{w_q.dtype}{list(w_q.shape)}")
    sx = np.float32(attrs["x_scale"])
    lead, k = x.shape[:-1], x.shape[-1]
    q = quantize16(x.reshape(-1, k), sx)
    acc = (product or wide_matmul_exact)(q, w_q)
    y = acc.astype(np.float32) * (sx * np.asarray(w_scale, np.float32)).astype(np.float32)
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    return y.reshape(*lead, w_q.shape[0])


def conv_columns(q: np.ndarray, attrs) -> np.ndarray:
    """im2col of an NCHW value (zero padding): [N * OH * OW, C * KH * KW], the columns in
    the order of an OIHW weight's rows."""
    kernel = attrs["kernel_shape"]
    out = pool_output_shape(q.shape[2:], kernel, attrs["strides"], attrs["dilations"],
                            attrs["pads"])
    win = _windows(q, kernel, attrs["strides"], attrs["dilations"], attrs["pads"], out, 0)
    nd = len(kernel)
    order = (0, *range(2, 2 + nd), 1, *range(2 + nd, 2 + 2 * nd))
    return np.ascontiguousarray(win.transpose(order)).reshape(
        q.shape[0] * int(np.prod(out)), -1)


def qconv_wide(attrs, x, w_q, w_scale, bias=None, *, product=None):
    """QConvWide: a Conv (group 1) as QMatMulWide's exact product of a 16-bit activation
    and per-output-channel weights; ``product(q) -> int64 [N, O, *out]`` replaces the
    exact convolution (the accelerator: im2col and a product)."""
    if w_q.dtype not in (np.int8, np.int16) or w_q.ndim != x.ndim:
        raise ValueError(f"QConvWide: the weight must be int8 or int16 OIHW, got "
                         f"{w_q.dtype}{list(w_q.shape)}")
    sx = np.float32(attrs["x_scale"])
    q = quantize16(x, sx)
    if product is None:  # exact in float64: |products| <= 2**30, fewer than 2**22 of them
        acc = conv(attrs, q.astype(np.float64), w_q.astype(np.float64)).astype(np.int64)
    else:
        acc = product(q)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = acc.astype(np.float32) * (sx * np.asarray(w_scale, np.float32)).reshape(shape)
    if bias is not None:
        y = y + np.asarray(bias, np.float32).reshape(shape)
    return y


def _conv_types(node, types):
    x, w = types[:2]
    if x.dtype != "float32" or w.dtype not in ("int8", "int16") or len(w.shape) != len(x.shape):
        raise NodeError(node, f"input {x} and weight {w} must be float32 and int8 or int16 "
                              f"with as many axes")
    (t,) = conv_types(node, [TensorType("float32", x.shape), TensorType("float32", w.shape)])
    return [t]


def _types(node, types):
    x, w, s = types[:3]
    b = types[3] if len(types) > 3 else None
    if x.dtype != "float32" or w.dtype not in ("int8", "int16") or len(w.shape) != 2 \
            or x.shape[-1] != w.shape[1]:
        raise NodeError(node, f"input {x} and weight {w} must be float32 [..., K] and int8 or "
                              f"int16 [O, K]")
    o = w.shape[0]
    for what, t in (("w_scale", s), ("bias", b)):
        if t is not None and t != TensorType("float32", (o,)):
            raise NodeError(node, f"{what} must be float32[{o}], got {t}")
    return [TensorType("float32", (*x.shape[:-1], o))]


QWIDE_KERNELS = {"QMatMulWide": qmatmul_wide, "QConvWide": qconv_wide}
QWIDE_SHAPE_RULES = {"QMatMulWide": _types, "QConvWide": _conv_types}
