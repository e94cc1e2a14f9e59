"""numpy definitions of the operators users' models bring beyond the first sets: the rest of
the element-wise math (inverse and hyperbolic trigonometry, Swish, the bitwise operators),
EyeLike, CumProd, ReverseSequence, RMSNormalization, onnxruntime's dynamic quantization
(DynamicQuantizeLinear, MatMulInteger, ConvInteger), the QOperator format's QLinearMatMul
and QLinearConv, and the signal operators of audio front ends (DFT, STFT, the Hann, Hamming
and Blackman windows, MelWeightMatrix). ops.py merges ``KERNELS`` and ``SHAPE_RULES`` into
its tables; this module imports nothing of ops.py, so there is no cycle (the integer
convolutions, ConvInteger and QLinearConv, are ops.py's, beside Conv, on this module's
integer operands and requantization).

Kernels take attributes in the importer's canonical form (frontend/canonical.py): the
compile-time inputs (CumProd's axis, DFT's length and axis, STFT's frame step and length)
are attributes, axes are non-negative. Integer results follow onnx's reference
implementation (and onnxruntime): a QLinear product is ``rint(acc * float32 multiplier)``
with the accumulator exact in int32 and the product in float64, halves to even.
"""

from __future__ import annotations

import numpy as np

from .ir import NodeError, TensorType
from .ops_math import scan

__all__ = ["KERNELS", "SHAPE_RULES", "window", "int_operand", "check_int8", "requantize"]


def _same_type(fn):
    """A unary float function whose result keeps the input's dtype."""
    return lambda attrs, x: fn(x).astype(x.dtype, copy=False)


def _bitwise(fn):
    def kernel(attrs, *xs):
        if any(x.dtype.kind not in "iu" for x in xs):
            raise ValueError(f"bitwise operators take integer tensors, not "
                             f"{', '.join(str(x.dtype) for x in xs)}")
        return fn(*xs)
    return kernel


def swish(attrs, x):
    """x * sigmoid(alpha x) in the input's type (opset 24)."""
    z = x * x.dtype.type(attrs.get("alpha", 1.0))
    with np.errstate(over="ignore"):
        s = np.where(z >= 0, 1 / (1 + np.exp(-np.abs(z))),
                     np.exp(-np.abs(z)) / (1 + np.exp(-np.abs(z))))
    return (x * s).astype(x.dtype, copy=False)


def eye_like(attrs, x):
    if x.ndim != 2:
        raise ValueError(f"EyeLike takes a 2-D tensor, not shape {list(x.shape)}")
    return np.eye(x.shape[0], x.shape[1], k=attrs.get("k", 0),
                  dtype=_np_type(attrs.get("dtype"), x.dtype))


def cum_prod(attrs, x):
    return scan(attrs, x, np.cumprod, 1)


def reverse_sequence(attrs, x, lens):
    """Reverses the first lens[b] steps along time_axis of each batch entry b."""
    b_axis, t_axis = attrs.get("batch_axis", 1), attrs.get("time_axis", 0)
    if x.ndim < 2 or {b_axis, t_axis} != {0, 1}:
        raise ValueError(f"batch_axis {b_axis} and time_axis {t_axis} must be 0 and 1 of "
                         f"a tensor of rank >= 2 (shape {list(x.shape)})")
    steps = x.shape[t_axis]
    lens = np.asarray(lens).reshape(-1)
    # (0 reverses nothing; onnxruntime asks for 1 at least)
    if lens.size != x.shape[b_axis] or lens.min(initial=0) < 0 or lens.max(initial=0) > steps:
        raise ValueError(f"sequence_lens {lens.tolist()} must have one value per batch entry "
                         f"({x.shape[b_axis]}), each in [1, {steps}]")
    y = np.array(x)
    xt = np.moveaxis(x, (b_axis, t_axis), (0, 1))
    yt = np.moveaxis(y, (b_axis, t_axis), (0, 1))  # a view of y
    for b, n in enumerate(lens.tolist()):
        yt[b, :n] = xt[b, :n][::-1]
    return y


def rms_normalization(attrs, x, scale):
    """x / sqrt(mean(x^2 over the axes from ``axis``) + epsilon) * scale (opset 23),
    computed in float32 unless stash_type says float64."""
    axis = attrs.get("axis", -1) % x.ndim
    stash = np.float64 if attrs.get("stash_type", 1) == 11 else np.float32
    xs = x.astype(stash)
    axes = tuple(range(axis, x.ndim))
    ms = np.mean(xs * xs, axis=axes, keepdims=True)
    y = xs / np.sqrt(ms + stash(attrs.get("epsilon", 1e-5)))
    return (y.astype(x.dtype) * scale).astype(x.dtype, copy=False)


# ---- integer products: onnxruntime's dynamic quantization, the QOperator format ------------


def int_operand(x, zero_point, axis_of_zp=None):
    """x - zero_point in int32; a 1-D zero point lies along ``axis_of_zp`` (per row of A,
    per column of B, per output channel of a weight)."""
    v = x.astype(np.int32)
    if zero_point is None:
        return v
    zp = np.asarray(zero_point).astype(np.int32)
    if zp.size == 1:
        return v - zp.reshape(())
    if axis_of_zp is None:
        raise ValueError(f"a zero point of shape {list(zp.shape)} where one value is expected")
    shape = [1] * v.ndim
    shape[axis_of_zp] = -1
    if zp.reshape(-1).size != v.shape[axis_of_zp]:
        raise ValueError(f"zero point of {zp.size} values for an axis of size "
                         f"{v.shape[axis_of_zp]}")
    return v - zp.reshape(shape)


def check_int8(*xs):
    for x in xs:
        if x.dtype not in (np.int8, np.uint8):
            raise ValueError(f"int8 or uint8 operands expected, not {x.dtype}")


def _matmul_int(a, b, a_zp, b_zp):
    check_int8(a, b)
    # a per-row zero point of A (its second-last axis), per-column of B (its last)
    av = int_operand(a, a_zp, a.ndim - 2 if a.ndim >= 2 else None)
    bv = int_operand(b, b_zp, b.ndim - 1 if b.ndim >= 2 else None)
    # int64 accumulation, then int32 (the sums of int8 products fit for K < 2**16)
    return np.matmul(av.astype(np.int64), bv.astype(np.int64)).astype(np.int32)


def matmul_integer(attrs, a, b, a_zero_point=None, b_zero_point=None):
    return _matmul_int(a, b, a_zero_point, b_zero_point)


def requantize(acc, multiplier, y_zero_point, default_dtype):
    """saturate(rint(acc * multiplier) + zero point), onnx's reference arithmetic."""
    d = acc * multiplier
    if y_zero_point is not None:
        d = d + np.asarray(y_zero_point)
        dtype = np.asarray(y_zero_point).dtype
    else:
        dtype = default_dtype
    info = np.iinfo(dtype)
    return np.clip(np.rint(d), info.min, info.max).astype(dtype)


def qlinear_matmul(attrs, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    acc = _matmul_int(a, b, a_zp, b_zp)
    a_scale, b_scale = np.asarray(a_scale, np.float32), np.asarray(b_scale, np.float32)
    y_scale = np.asarray(y_scale, np.float32)
    if a_scale.size != 1 or y_scale.size != 1:
        raise ValueError("a_scale and y_scale must be one value each")
    # b's scale: one value, or one per column
    mult = (a_scale.reshape(()) * b_scale.reshape(-1) / y_scale.reshape(()))
    return requantize(acc, mult if mult.size > 1 else mult.reshape(()), y_zp, a.dtype)


def dynamic_quantize_linear(attrs, x):
    """uint8 y, its scale and zero point from x's range (with 0 in it), as onnx defines it."""
    if x.dtype != np.float32:
        raise ValueError(f"DynamicQuantizeLinear takes float32, not {x.dtype}")
    qmin, qmax = 0, 255
    hi = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    lo = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    # a constant (all-zero) input: scale 1 as onnxruntime has it (onnx's reference divides
    # that 1 by 255 too; the codes are 0 either way)
    scale = np.float32(1.0) if hi == lo else np.float32(hi - lo) / np.float32(qmax - qmin)
    zp = np.rint(np.clip(np.float32(qmin) - lo / scale, qmin, qmax))
    y = np.clip(np.rint(x / scale) + zp, qmin, qmax)
    return y.astype(np.uint8), np.array(scale, np.float32), np.array(zp, np.uint8)


# ---- signals: DFT, STFT, windows, mel filters ----------------------------------------------


def window(kind: str, size: int, periodic: bool, dtype=np.float32) -> np.ndarray:
    """The Hann, Hamming or Blackman window of ``size`` samples in ``dtype``, as onnx defines
    them (periodic divides by size, symmetric by size - 1), computed as its reference does."""
    n = np.arange(size, dtype=dtype)
    d = size if periodic else size - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "HannWindow":
            y = np.sin(n * np.pi / d) ** 2
        elif kind == "HammingWindow":
            y = 25 / 46 - np.cos(n * np.pi * 2 / d) * (1 - 25 / 46)
        else:
            m = np.arange(size)
            y = (np.cos((m * (np.pi * 2)) / d) * -0.5 + np.cos((m * (np.pi * 4)) / d) * 0.08
                 + 0.42)
    return np.asarray(y).astype(dtype)


def _np_type(code, default=np.float32):
    from onnx.helper import tensor_dtype_to_np_dtype

    return default if code is None else tensor_dtype_to_np_dtype(code)


def _window_kernel(kind):
    def kernel(attrs, size):
        n = int(np.asarray(size).reshape(-1)[0])
        if n < 0:
            raise ValueError(f"a window of {n} samples")
        return window(kind, n, bool(attrs.get("periodic", 1)),
                      _np_type(attrs.get("output_datatype", 1)))
    return kernel


def _one(v, kind):
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"one value expected, not shape {list(a.shape)}")
    return kind(a.reshape(-1)[0])


def mel_weight_matrix(attrs, num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                      upper_edge_hertz):
    """[dft_length // 2 + 1, num_mel_bins] triangular filters on the mel scale with integer
    bin edges, computed as onnx's reference computes them."""
    bins, length, rate = (_one(v, int) for v in (num_mel_bins, dft_length, sample_rate))
    lo, hi = (_one(v, float) for v in (lower_edge_hertz, upper_edge_hertz))
    if bins < 1 or length < 1 or rate < 1 or not 0 <= lo < hi <= rate / 2:
        raise ValueError(f"num_mel_bins {bins}, dft_length {length} and sample_rate {rate} "
                         f"must be positive and 0 <= lower_edge_hertz {lo} < "
                         f"upper_edge_hertz {hi} <= sample_rate / 2")
    spectrogram = length // 2 + 1
    edges = np.arange(0, bins + 2)
    lo_mel = 2595 * np.log1p(lo / 700) / np.log(10)
    hi_mel = 2595 * np.log1p(hi / 700) / np.log(10)
    hz = 700 * np.expm1((edges * ((hi_mel - lo_mel) / edges.shape[0]) + lo_mel) / 2595
                        * np.log(10))
    points = (((length + 1) * hz) // rate).astype(int)
    out = np.zeros((spectrogram, bins))
    for i in range(bins):
        lower, center, higher = points[i], points[i + 1], points[i + 2]
        if center == lower:
            out[center, i] = 1
        else:
            for j in range(lower, center + 1):
                out[j, i] = (j - lower) / (center - lower)
        for j in range(center, higher):
            out[j, i] = (higher - j) / (higher - center)
    return out.astype(_np_type(attrs.get("output_datatype")))


def _complex(x, what="input"):
    """A [..., 1] real or [..., 2] complex signal as its complex values (the last axis gone)."""
    if x.shape[-1] == 1:
        return x[..., 0]
    if x.shape[-1] == 2:
        return x[..., 0] + 1j * x[..., 1]
    raise ValueError(f"the {what}'s last axis must be 1 (real) or 2 (complex), not "
                     f"{x.shape[-1]}")


def _as_pairs(y, dtype):
    return np.stack([y.real, y.imag], axis=-1).astype(dtype)


def _dft_length(attrs, size):
    if attrs.get("length"):
        return attrs["length"]
    # an inverse of a one-sided spectrum has an even length by default
    return 2 * (size - 1) if attrs.get("inverse", 0) and attrs.get("onesided", 0) else size


def dft(attrs, x):
    """The discrete Fourier transform along ``axis`` (canonical: an axis of the signal
    before its real/imaginary axis) of ``length`` samples (0: the axis' size; zero-padded or
    cut), as onnx defines it: inverse scaled by 1/length; one-sided keeps length // 2 + 1
    bins, and its inverse takes them and gives the real signal ([..., 1])."""
    axis = attrs["axis"]
    sig = _complex(x)
    n = _dft_length(attrs, x.shape[axis])
    if attrs.get("inverse", 0):
        if attrs.get("onesided", 0):
            return np.fft.irfft(sig, n=n, axis=axis)[..., None].astype(x.dtype)
        return _as_pairs(np.fft.ifft(sig, n=n, axis=axis), x.dtype)
    y = np.fft.fft(sig, n=n, axis=axis)
    if attrs.get("onesided", 0):
        y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return _as_pairs(y, x.dtype)


def stft(attrs, x, window_=None):
    """Frames of the window's length every ``frame_step`` samples, each multiplied by the
    window (ones without one) and transformed over ``frame_length`` samples (canonical: 0
    for the window's length, or the signal's without a window); [batch, frames, bins, 2]."""
    step, length = attrs["frame_step"], attrs.get("frame_length") or None
    if x.ndim == 2:  # [batch, samples]: real (torch's export writes it so; onnxruntime takes it)
        x = x[..., None]
    if x.ndim != 3:
        raise ValueError(f"the signal must be [batch, samples, 1 or 2], not {list(x.shape)}")
    if length is None:
        length = x.shape[1] if window_ is None else np.asarray(window_).size
    w = (np.ones(length, x.dtype) if window_ is None
         else np.asarray(window_).reshape(-1).astype(x.dtype))
    size = w.size
    if not 1 <= length <= x.shape[1] or not 1 <= size <= x.shape[1]:
        raise ValueError(f"frame_length {length} (window {size}) is longer than the signal "
                         f"({x.shape[1]} samples) or empty; give a shorter frame")
    frames = 1 + (x.shape[1] - length) // step
    idx = np.arange(frames)[:, None] * step + np.arange(size)[None, :]
    seg = x[:, np.minimum(idx, x.shape[1] - 1)]  # [batch, frames, size, 1 or 2]
    seg = np.where((idx < x.shape[1])[None, :, :, None], seg, 0) * w.reshape(1, 1, -1, 1)
    y = np.fft.fft(_complex(seg.astype(x.dtype), "signal"), n=length, axis=-1)
    if attrs.get("onesided", 1):
        y = y[..., : length // 2 + 1]
    return _as_pairs(y, x.dtype)


def _dft_types(node, types):
    x = types[0]
    a = node.attrs
    shape = list(x.shape)
    if len(shape) < 2 or shape[-1] not in (1, 2, None):
        raise NodeError(node, f"the signal {x} needs a last axis of 1 (real) or 2 (complex)")
    axis = a["axis"]
    n = _dft_length(a, shape[axis]) if shape[axis] is not None or a.get("length") else None
    inverse, onesided = a.get("inverse", 0), a.get("onesided", 0)
    shape[axis] = n // 2 + 1 if n is not None and onesided and not inverse else n
    shape[-1] = 1 if inverse and onesided else 2
    return [TensorType(x.dtype, tuple(shape))]


KERNELS = {
    # element-wise math
    "Tan": _same_type(np.tan),
    "Asin": _same_type(np.arcsin),
    "Acos": _same_type(np.arccos),
    "Atan": _same_type(np.arctan),
    "Sinh": _same_type(np.sinh),
    "Cosh": _same_type(np.cosh),
    "Asinh": _same_type(np.arcsinh),
    "Acosh": _same_type(np.arccosh),
    "Atanh": _same_type(np.arctanh),
    "Swish": swish,
    "BitwiseAnd": _bitwise(np.bitwise_and),
    "BitwiseOr": _bitwise(np.bitwise_or),
    "BitwiseXor": _bitwise(np.bitwise_xor),
    "BitwiseNot": _bitwise(np.invert),
    # tensors and scans
    "EyeLike": eye_like,
    "CumProd": cum_prod,
    "ReverseSequence": reverse_sequence,
    "RMSNormalization": rms_normalization,
    # integer products
    "MatMulInteger": matmul_integer,
    "QLinearMatMul": qlinear_matmul,
    "DynamicQuantizeLinear": dynamic_quantize_linear,
    # signals
    "DFT": dft,
    "STFT": stft,
    "HannWindow": _window_kernel("HannWindow"),
    "HammingWindow": _window_kernel("HammingWindow"),
    "BlackmanWindow": _window_kernel("BlackmanWindow"),
    "MelWeightMatrix": mel_weight_matrix,
}

SHAPE_RULES = {"DFT": _dft_types}
