"""numpy kernels of the quantized operators: the integer meaning of a quantized graph.

compiler/quantize.py rewrites a float graph into one whose Conv/Gemm layers are ``QConv``
and ``QGemm`` on int8 values. These operators are celosia's own (not ONNX operators: they
are deliberately absent from ``graph_numpy.KERNELS`` and so from
``onnx_import.SUPPORTED_OPS``); ``graph_numpy.evaluate_node`` and ``infer_node`` dispatch to
the tables here, so ``run_graph`` executes a quantized graph like any other. The
accelerator executes QConv/QGemm with the same integer arithmetic, bit for bit, so these
kernels are the oracle of the accelerator build as well as its CPU fallback.

Integer arithmetic is int32 with two's-complement wrap-around (computed in int64 and wrapped
by ``wrap``); right shifts are arithmetic (floor).

- ``Quantize(x float32) -> int8``, attrs ``scale`` and ``zero_point`` (int8, default 0):
  ``clip(rint(x / float32(scale)) + zero_point, -128, 127)`` computed in float32 (rint
  rounds half to even; NaN gives ``zero_point``).
- ``Dequantize(x int8 or int32) -> float32``, attrs ``scale`` and ``zero_point`` (default
  0): ``(float32(x) - zero_point) * float32(scale)``.
- ``QConv(x int8 NCHW (or NCL), w int8 OIHW (or OIL), bias int32[O], multiplier int32[O]
  [, residual int8])``,
  attrs ``kernel_shape, strides, pads, dilations, group`` (as Conv), ``shift`` (0..31),
  ``lo, hi`` (int8 bounds), ``scale`` (the output's scale, informational) and
  ``pad_value`` (int8, default 0: what the padding reads, the input's zero point, so that
  with ``bias`` holding ``- pad_value * sum(w[o])`` every window sums ``w (x - z)``)::

      acc = wrap(conv(x, w))                 exact integer convolution, the padding
                                             filled with pad_value
      t = wrap(acc + bias[o]); t = wrap(t * multiplier[o]); t = t >> shift
      t = wrap(t + residual)                 when the residual input is given
      y = int8(clip(t, lo, hi))

- ``QGemm(x int8[N,K], w int8[O,K], bias, multiplier [, residual int8[N,O]])``: the same
  epilogue on ``acc = x @ w.T``.
- ``QGlobalAveragePool(x int8 NCHW) -> int8[N,C,1,1]``, attrs ``multiplier``, ``shift``,
  ``scale`` (the output's scale, informational) and ``offset`` (int, default 0)::

      y = clip(((sum over H,W of x) * multiplier + 2**(shift-1) + offset) >> shift, -128, 127)

  with ``multiplier / 2**shift ~ s_in / (s_out * H*W)`` and ``offset / 2**shift ~ z_out -
  z_in * s_in / s_out`` (the zero points): the added half makes the floor shift round to
  nearest (half up). quantize.py picks the shift so that no step can overflow int32.

- ``QMatMul(a int8[..., M, K], b int8[..., K, N]) -> int8[..., M, N]`` (batch axes
  broadcast as MatMul's), attrs ``multiplier``, ``shift`` (1..31), ``scale`` (the
  output's)::

      acc = wrap(a @ b)
      y = clip(wrap(wrap(acc * multiplier) + 2**(shift-1)) >> shift, -128, 127)

  (attention's Q x K^T and P x V; quantize.py picks the shift for the calibrated range).
- ``QAdd(a int8, b int8) -> int8`` and ``QMul(a int8, b int8) -> int8`` (operands that
  broadcast to the output as numpy's do: squeeze-excitation's gate [N, C, 1, 1] times [N,
  C, H, W], a QDQ model's bias constant [O] added to a dense layer's output), attrs ``multipliers`` (QAdd: [ma, mb]; QMul: [m]), ``shift`` (1..31),
  ``scale`` (the output's)::

      QAdd: y = clip(wrap(wrap(a * ma + b * mb) + 2**(shift-1)) >> shift, -128, 127)
      QMul: y = clip(wrap(wrap(a * b * m) + 2**(shift-1)) >> shift, -128, 127)

  Their optional ``zero_points`` [za, zb, zo] (int8, default 0): ``a - za`` and ``b - zb``
  for a and b, and zo added after the shift (before the clip)::

      QAdd: t = wrap((a - za) * ma + (b - zb) * mb)
            y = clip((wrap(t + 2**(shift-1)) >> shift) + zo, -128, 127)

  (residual Adds after a QLut, squeeze-excitation's gate multiply; quantize.py picks the
  shift so that no step can leave int32 for any int8 inputs).
- ``wide_matmul(a, w) -> int32`` (no operator of its own: QLSTM, QGRU and QRNN,
  qrecurrent.py, use it): ``wrap(a @ w.T)`` for ``a`` int8 or int16 [M, K] and ``w`` int8
  or int16 [O, K], the exact integer product wrapped to int32 (the accelerator computes it
  as int8 GEMM passes, compiler/accel/wide.py).
- ``QLut(x int8, table int8[256]) -> int8`` (same shape), attr ``scale`` (the output's,
  informational): ``y = table[x + 128]``. quantize.py fills the table with an element-wise
  function (SiLU, HardSwish, GELU, Sigmoid, Tanh, ...) between the input's and the output's
  scales, so the function is exact on int8 values: no other rounding happens.

Integer convolutions and products run as float64 BLAS calls on the int8 values: every
product and partial sum is an integer below 2**53 in magnitude (|x*w| <= 2**14, and a
sum of fewer than 2**39 of them; int16 operands: |a*w| <= 2**30, fewer than 2**23 terms),
so float64 computes them exactly in any order; the result is converted to int64 and
wrapped.
"""

from __future__ import annotations

import numpy as np

from .ir import Node, NodeError, TensorType
from .ops import conv, conv_types

__all__ = ["QUANTIZED_KERNELS", "QUANTIZED_SHAPE_RULES", "pad_value", "wrap", "wide_matmul",
           "wide_matmul_exact"]


def wrap(x: np.ndarray) -> np.ndarray:
    """int64 values wrapped to int32's range (two's complement), still as int64."""
    return (np.asarray(x, dtype=np.int64) + 2**31) % 2**32 - 2**31


def _requantize(acc: np.ndarray, bias: np.ndarray, multiplier: np.ndarray, shift: int,
               lo: int, hi: int, residual: np.ndarray | None = None) -> np.ndarray:
    """The QConv/QGemm epilogue on int64 accumulators whose axis 1 is the output channel."""
    shape = (1, -1) + (1,) * (acc.ndim - 2)
    t = wrap(acc + bias.astype(np.int64).reshape(shape))
    t = wrap(t * multiplier.astype(np.int64).reshape(shape))
    t = t >> shift
    if residual is not None:
        t = wrap(t + residual.astype(np.int64))
    return np.clip(t, lo, hi).astype(np.int8)


def _epilogue_args(attrs):
    shift, lo, hi = int(attrs["shift"]), int(attrs["lo"]), int(attrs["hi"])
    if not 0 <= shift <= 31 or not -128 <= lo <= hi <= 127:
        raise ValueError(f"shift {shift} must be in [0, 31] and lo {lo} <= hi {hi} within "
                         "[-128, 127]")
    return shift, lo, hi


def _int8(*arrays):
    for a in arrays:
        if a is not None and a.dtype != np.int8:
            raise ValueError(f"expects int8 operands, got {a.dtype}")


def pad_value(attrs) -> int:
    """A QConv's ``pad_value`` (0 when absent), checked to be an int8."""
    v = attrs.get("pad_value", 0)
    if isinstance(v, bool) or int(v) != v or not -128 <= int(v) <= 127:
        raise ValueError(f"pad_value {v!r} must be an integer in [-128, 127]")
    return int(v)


def qconv(attrs, x, w, bias, multiplier, residual=None):
    _int8(x, w, residual)
    shift, lo, hi = _epilogue_args(attrs)
    acc = conv(attrs, x.astype(np.float64), w.astype(np.float64), fill=pad_value(attrs))
    return _requantize(wrap(acc.astype(np.int64)), bias, multiplier, shift, lo, hi, residual)


def qgemm(attrs, x, w, bias, multiplier, residual=None):
    _int8(x, w, residual)
    shift, lo, hi = _epilogue_args(attrs)
    acc = x.astype(np.float64) @ w.astype(np.float64).T
    return _requantize(wrap(acc.astype(np.int64)), bias, multiplier, shift, lo, hi, residual)


def wide_matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``wrap(a @ w.T)`` as int32: ``a`` int8 or int16 [M, K], ``w`` int8 or int16 [O, K]."""
    for what, v in (("a", a), ("w", w)):
        if v.dtype not in (np.int8, np.int16) or v.ndim != 2:
            raise ValueError(f"wide_matmul: {what} must be int8 or int16 with 2 axes, got "
                             f"{v.dtype}{list(v.shape)}")
    if a.shape[1] >= 1 << 23:
        raise ValueError(f"wide_matmul: K={a.shape[1]} is too long for an exact float64 sum")
    acc = a.astype(np.float64) @ w.astype(np.float64).T
    return wrap(acc.astype(np.int64)).astype(np.int32)


def wide_matmul_exact(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w.T`` exactly, as int64 (no wrap): ``a``, ``w`` int8 or int16 [M, K], [O, K]."""
    for what, v in (("a", a), ("w", w)):
        if v.dtype not in (np.int8, np.int16) or v.ndim != 2:
            raise ValueError(f"wide_matmul_exact: {what} must be int8 or int16 with 2 axes, "
                             f"got {v.dtype}{list(v.shape)}")
    if a.shape[1] >= 1 << 22:
        raise ValueError(f"wide_matmul_exact: K={a.shape[1]} is too long for an exact sum")
    return (a.astype(np.float64) @ w.astype(np.float64).T).astype(np.int64)


def qglobal_average_pool(attrs, x):
    _int8(x)
    shift, multiplier = int(attrs["shift"]), int(attrs["multiplier"])
    if not 1 <= shift <= 31:
        raise ValueError(f"shift {shift} must be in [1, 31]")
    total = x.astype(np.int64).sum(axis=tuple(range(2, x.ndim)), keepdims=True)
    offset = int(attrs.get("offset", 0))
    t = wrap(wrap(total * multiplier) + (1 << (shift - 1)) + offset) >> shift
    return np.clip(t, -128, 127).astype(np.int8)


def qmatmul(attrs, a, b):
    _int8(a, b)
    shift, multiplier = int(attrs["shift"]), int(attrs["multiplier"])
    if not 1 <= shift <= 31:
        raise ValueError(f"shift {shift} must be in [1, 31]")
    acc = wrap(np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64))
    t = wrap(wrap(acc * multiplier) + (1 << (shift - 1))) >> shift
    return np.clip(t, -128, 127).astype(np.int8)


def _binary_args(attrs, count):
    shift, ms = int(attrs["shift"]), [int(m) for m in attrs["multipliers"]]
    if not 1 <= shift <= 31 or len(ms) != count:
        raise ValueError(f"shift {shift} must be in [1, 31] and multipliers {ms} {count} "
                         "integers")
    return shift, ms


def qadd(attrs, a, b):
    _int8(a, b)
    shift, (ma, mb) = _binary_args(attrs, 2)
    za, zb, zo = _zero_points(attrs)
    t = wrap((a.astype(np.int64) - za) * ma + (b.astype(np.int64) - zb) * mb)
    return np.clip((wrap(t + (1 << (shift - 1))) >> shift) + zo, -128, 127).astype(np.int8)


def qmul(attrs, a, b):
    _int8(a, b)
    shift, (m,) = _binary_args(attrs, 1)
    za, zb, zo = _zero_points(attrs)
    t = wrap((a.astype(np.int64) - za) * (b.astype(np.int64) - zb) * m)
    return np.clip((wrap(t + (1 << (shift - 1))) >> shift) + zo, -128, 127).astype(np.int8)


def _zero_points(attrs):
    z = [int(v) for v in attrs.get("zero_points", (0, 0, 0))]
    if len(z) != 3 or not all(-128 <= v <= 127 for v in z):
        raise ValueError(f"zero_points {z} must be 3 integers in [-128, 127]")
    return z


def qlut(attrs, x, table):
    _int8(x, table)
    if table.shape != (256,):
        raise ValueError(f"table must be int8[256], got {table.dtype}[{','.join(map(str, table.shape))}]")
    return table[x.astype(np.int64) + 128]


def quantize(attrs, x):
    q = np.rint(x.astype(np.float32) / np.float32(attrs["scale"]))
    z = int(attrs.get("zero_point", 0))
    if not z:
        return np.clip(q, -128, 127).astype(np.int8)
    with np.errstate(invalid="ignore"):
        q = np.clip(np.where(np.isnan(q), np.float32(0), q), -128 - z, 127 - z)
    return (q + np.float32(z)).astype(np.int8)


def dequantize(attrs, x):
    z = int(attrs.get("zero_point", 0))
    x = x.astype(np.float32)
    if z:
        x = x - np.float32(z)
    return x * np.float32(attrs["scale"])


QUANTIZED_KERNELS = {
    "Quantize": quantize,
    "Dequantize": dequantize,
    "QConv": qconv,
    "QGemm": qgemm,
    "QGlobalAveragePool": qglobal_average_pool,
    "QLut": qlut,
    "QMatMul": qmatmul,
    "QAdd": qadd,
    "QMul": qmul,
}


# ---- shape rules (infer_node): the kernels above are too costly to run on stand-ins ------


def _check_epilogue_operands(node: Node, types, channels: int, out_shape):
    for k, what in ((2, "bias"), (3, "multiplier")):
        t = types[k] if k < len(types) else None
        if t is None or t.dtype != "int32" or t.shape != (channels,):
            raise NodeError(node, f"{what} must be int32[{channels}], got {t}")
    if len(types) > 4 and types[4] is not None and types[4] != TensorType("int8", out_shape):
        raise NodeError(node, f"residual must be int8[{','.join(map(str, out_shape))}], got "
                              f"{types[4]}")


def _qconv_types(node: Node, types):
    x, w, a = types[0], types[1], node.attrs
    if x.dtype != "int8" or w.dtype != "int8" or len(x.shape) not in (3, 4) or \
            len(w.shape) != len(x.shape):
        raise NodeError(node, f"input {x} and weight {w} must be int8, both 4-D (or both 3-D: "
                              f"a 1-D convolution)")
    if w.shape[0] % a["group"]:
        raise NodeError(node, f"input has {x.shape[1]} channels but weight {w} with "
                              f"group={a['group']} expects {w.shape[1] * a['group']}")
    try:
        pad_value(a)
    except ValueError as e:
        raise NodeError(node, str(e)) from None
    (t,) = conv_types(node, types)  # channels, window and output shape as for Conv
    shape = t.shape
    _check_epilogue_operands(node, types, w.shape[0], shape)
    return [TensorType("int8", shape)]


def _qgemm_types(node: Node, types):
    x, w = types[0], types[1]
    if x.dtype != "int8" or w.dtype != "int8" or len(x.shape) != 2 or len(w.shape) != 2 \
            or x.shape[1] != w.shape[1]:
        raise NodeError(node, f"input {x} and weight {w} must be int8 [N,K] and [O,K]")
    shape = (x.shape[0], w.shape[0])
    _check_epilogue_operands(node, types, w.shape[0], shape)
    return [TensorType("int8", shape)]


def _qlut_types(node: Node, types):
    x, table = types[0], types[1] if len(types) > 1 else None
    if x.dtype != "int8" or table is None or table != TensorType("int8", (256,)):
        raise NodeError(node, f"input {x} and table {table} must be int8 and int8[256]")
    return [TensorType("int8", x.shape)]


def _qmatmul_types(node: Node, types):
    a, b = types[0], types[1]
    if a.dtype != "int8" or b.dtype != "int8" or len(a.shape) < 2 or len(b.shape) < 2 \
            or a.shape[-1] != b.shape[-2]:
        raise NodeError(node, f"inputs {a} and {b} must be int8 [..., M, K] and [..., K, N]")
    try:
        batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    except ValueError:
        raise NodeError(node, f"batch axes of {a} and {b} do not broadcast") from None
    return [TensorType("int8", (*batch, a.shape[-2], b.shape[-1]))]


def _qbinary_types(node: Node, types):
    a, b = types[0], types[1]
    if a.dtype == "int8" == b.dtype and a.static and b.static:
        try:
            return [TensorType("int8", np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))]
        except ValueError:
            raise NodeError(node, f"inputs {a} and {b} do not broadcast") from None
    if a.dtype != "int8" or b.dtype != "int8" or a.shape != b.shape:
        raise NodeError(node, f"inputs {a} and {b} must be int8 of one shape")
    return [TensorType("int8", a.shape)]


QUANTIZED_SHAPE_RULES = {"QConv": _qconv_types, "QGemm": _qgemm_types, "QLut": _qlut_types,
                         "QMatMul": _qmatmul_types, "QAdd": _qbinary_types,
                         "QMul": _qbinary_types}

