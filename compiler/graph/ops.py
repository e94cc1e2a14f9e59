"""numpy definitions of the ONNX operators the graph IR takes: the executable meaning of each.

``KERNELS`` maps an operator to its kernel, ``SHAPE_RULES`` the compute-heavy ones to a rule
for their output type (the others' types come from running the kernel on zero-stride
stand-ins: reference.py). reference.py runs them; qops.py holds celosia's own quantized
operators. The operators added later live in modules by kind (ops_math.py: element-wise
math, reductions, TopK, Einsum; ops_nn.py: normalizations, activations, ConvTranspose;
ops_tensor.py: gathers, scatters, data movement; ops_resize.py: Resize; ops_signal.py:
element-wise math, integer products, signals; ops_vision.py: GridSample, detection, LRN
and the other vision operators; ops_data.py: Compress, Unique, TensorScatter, Det, BitCast;
ops_random.py: the random operators), which import nothing of this module (windows.py holds
the window geometry ops_vision.py shares); their tables are merged into these two at the
end.

A kernel is ``fn(attrs, *inputs) -> array or tuple of arrays``; a missing optional input is
None. Attributes are in the importer's canonical form (see graph.py): explicit pads and
strides, non-negative axes, shape-like inputs (Reshape's shape, Slice's starts, ...) turned
into attributes.

celosia's own quantized operators (QConv, QGemm, ...: qops.py) are not ONNX operators, so
they are not in ``KERNELS``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from . import (ops_data, ops_math, ops_nn, ops_random, ops_resize, ops_signal, ops_tensor,
               ops_vision)
from .ir import NodeError, TensorType
from .windows import pool_output_shape
from .windows import windows as _windows

__all__ = ["KERNELS", "SHAPE_RULES", "OWN_INPUTS", "pool_output_shape", "conv", "conv_types",
           "sigmoid", "hard_sigmoid", "clip", "Lazy"]

# Inputs a fusable op reads itself; epilogue operands follow them (ir.py).
OWN_INPUTS = {"Conv": 3, "Gemm": 3, "MatMul": 2}


# ---- windows: convolution and pooling --------------------------------------------------------


# pool_output_shape and the windows live in windows.py, which ops_vision.py shares.


def conv(attrs, x, w, b=None, *, fill=0):
    """ONNX Conv; the padding reads ``fill`` (0; QConv's ``pad_value``, qops.py)."""
    kernel, nd, g = attrs["kernel_shape"], len(attrs["kernel_shape"]), attrs["group"]
    out_sizes = pool_output_shape(x.shape[2:], kernel, attrs["strides"], attrs["dilations"],
                                  attrs["pads"])
    win = _windows(x, kernel, attrs["strides"], attrs["dilations"], attrs["pads"], out_sizes,
                   fill)
    n, c = x.shape[:2]
    m = w.shape[0]
    spatial = tuple(range(2 + nd, 2 + 2 * nd))
    if g == 1:  # one GEMM (im2col by tensordot): BLAS does the work
        y = np.tensordot(win, w, axes=((1,) + spatial, (1,) + tuple(range(2, 2 + nd))))
        y = np.moveaxis(y, -1, 1)
    else:
        win = win.reshape(n, g, c // g, *win.shape[2:])
        wg = w.reshape(g, m // g, c // g, *w.shape[2:])
        o_sub, k_sub = "opqr"[:nd], "hijk"[:nd]
        y = np.einsum(f"ngc{o_sub}{k_sub},gmc{k_sub}->ngm{o_sub}", win, wg)
        y = y.reshape(n, m, *y.shape[3:])
    if b is not None:
        y = y + b.reshape(1, -1, *[1] * nd)
    return np.ascontiguousarray(y, dtype=x.dtype)


def _conv_int(attrs, x, w, x_zp, w_zp):
    """A convolution of int8/uint8 operands less their zero points (the weight's: one, or
    one per output channel), exact in int32."""
    ops_signal.check_int8(x, w)
    xv = ops_signal.int_operand(x, x_zp).astype(np.float64)
    wv = ops_signal.int_operand(w, w_zp, 0).astype(np.float64)
    # float64 holds every sum of int8 products exactly (|sum| < 2**53): BLAS does the work
    return np.rint(conv(attrs, xv, wv)).astype(np.int32)


def conv_integer(attrs, x, w, x_zero_point=None, w_zero_point=None):
    return _conv_int(attrs, x, w, x_zero_point, w_zero_point)


def qlinear_conv(attrs, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None):
    """The QOperator format's convolution: the int32 sum (plus the int32 bias) times
    x_scale * w_scale / y_scale (float32; w_scale one or per output channel), rounded half
    to even, plus y's zero point, saturated (onnx's reference, onnxruntime)."""
    acc = _conv_int(attrs, x, w, x_zp, w_zp)
    if bias is not None:
        acc = acc + np.asarray(bias, np.int32).reshape(1, -1, *[1] * (acc.ndim - 2))
    x_scale, y_scale = np.asarray(x_scale, np.float32), np.asarray(y_scale, np.float32)
    w_scale = np.asarray(w_scale, np.float32).reshape(-1)
    if x_scale.size != 1 or y_scale.size != 1:
        raise ValueError("x_scale and y_scale must be one value each")
    mult = x_scale.reshape(()) * w_scale / y_scale.reshape(())
    mult = mult.reshape(1, -1, *[1] * (acc.ndim - 2)) if mult.size > 1 else mult.reshape(())
    return ops_signal.requantize(acc, mult, y_zp, x.dtype)


class Lazy:
    """An optional output computed only if the node has it (evaluate_node)."""

    def __init__(self, fn):
        self.fn = fn


def _fill_min(dtype):
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def max_pool(attrs, x):
    kernel, nd = attrs["kernel_shape"], len(attrs["kernel_shape"])
    out_sizes = pool_output_shape(x.shape[2:], kernel, attrs["strides"], attrs["dilations"],
                                  attrs["pads"], attrs["ceil_mode"])
    args = (kernel, attrs["strides"], attrs["dilations"], attrs["pads"], out_sizes)
    win = _windows(x, *args, _fill_min(x.dtype))
    # The maximum over the window as one np.maximum per kernel position (strided views):
    # much faster than reducing the window view.
    y = None
    for offset in np.ndindex(*kernel):
        view = win[(Ellipsis,) + offset]
        y = view.copy() if y is None else np.maximum(y, view, out=y)

    def indices():
        # Flat positions in the input, row-major, or column-major over the spatial axes
        # when storage_order is 1.
        if attrs.get("storage_order", 0):
            spatial = x.shape[2:][::-1]
            flat = np.arange(x.size, dtype=np.int64).reshape(*x.shape[:2], *spatial)
            flat = flat.transpose(0, 1, *range(1 + nd, 1, -1))
        else:
            flat = np.arange(x.size, dtype=np.int64).reshape(x.shape)
        fw = _windows(flat, *args, -1)
        shape = win.shape[:2 + nd] + (-1,)
        arg = win.reshape(shape).argmax(axis=-1)[..., None]
        return np.take_along_axis(fw.reshape(shape), arg, axis=-1)[..., 0]

    return y, Lazy(indices)  # the indices only when the node has that output


def average_pool(attrs, x):
    kernel, nd = attrs["kernel_shape"], len(attrs["kernel_shape"])
    pads = attrs["pads"]
    out_sizes = pool_output_shape(x.shape[2:], kernel, attrs["strides"], attrs["dilations"],
                                  pads, attrs["ceil_mode"])
    args = (kernel, attrs["strides"], attrs["dilations"], pads, out_sizes)
    axes = tuple(range(-nd, 0))
    sums = _windows(x, *args, 0).sum(axis=axes)
    # Divisor: the window's elements inside the input, plus the explicit pads when
    # count_include_pad; never the extra padding ceil mode adds.
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    if attrs["count_include_pad"]:
        ones = np.pad(ones, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)],
                      constant_values=1)
        args = (kernel, attrs["strides"], attrs["dilations"], [0] * (2 * nd), out_sizes)
    counts = _windows(ones, *args, 0).sum(axis=axes)
    return (sums / counts).astype(x.dtype)


# ---- other kernels ---------------------------------------------------------------------------


def gemm(attrs, a, b, c=None):
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = a @ b
    if attrs.get("alpha", 1.0) != 1.0:
        y = y * y.dtype.type(attrs["alpha"])
    if c is not None:
        beta = attrs.get("beta", 1.0)
        y = y + (c if beta == 1.0 else c * c.dtype.type(beta))
    return y.astype(a.dtype, copy=False)


def batch_norm(attrs, x, scale, bias, mean, var):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    eps = attrs.get("epsilon", 1e-5)
    if attrs.get("training_mode", 0):
        axes = (0,) + tuple(range(2, x.ndim))
        batch_mean, batch_var = x.mean(axis=axes), x.var(axis=axes)
        m = attrs.get("momentum", 0.9)
        y = (x - batch_mean.reshape(shape)) / np.sqrt(batch_var.reshape(shape) + eps)
        y = y * scale.reshape(shape) + bias.reshape(shape)
        return (y.astype(x.dtype), (mean * m + batch_mean * (1 - m)).astype(mean.dtype),
                (var * m + batch_var * (1 - m)).astype(var.dtype))
    k = scale / np.sqrt(var + x.dtype.type(eps))
    return (x * k.reshape(shape) + (bias - mean * k).reshape(shape)).astype(x.dtype)


def softmax(attrs, x, log=False):
    axis = attrs["axis"]
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=axis, keepdims=True)
    return (z - np.log(s)) if log else e / s


def div(attrs, a, b):
    if np.issubdtype(a.dtype, np.integer):  # ONNX integer division truncates toward zero
        q = np.floor_divide(a, b)
        return (q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)))).astype(a.dtype)
    return a / b


def pad(attrs, x, value=None):
    pads, nd = attrs["pads"], x.ndim
    widths = [(max(pads[i], 0), max(pads[i + nd], 0)) for i in range(nd)]
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        fill = attrs.get("value", 0) if value is None else np.asarray(value).item()
        y = np.full([d + b + a for d, (b, a) in zip(x.shape, widths)], fill, x.dtype)
        y[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, widths))] = x
    else:
        y = _pad_bands(x, widths, mode)
    crop = tuple(slice(-min(pads[i], 0), y.shape[i] + min(pads[i + nd], 0)) for i in range(nd))
    return y[crop]


def _pad_bands(x, widths, mode):
    """Reflect, edge or wrap padding by slice copies, one axis after another (np.pad's
    result: the modes are separable), where each band fits in the input once; np.pad
    itself otherwise (its fixed cost is tens of microseconds, a model's pad a few)."""
    fits = {"reflect": lambda d, b, a: max(b, a) <= d - 1, "edge": lambda d, b, a: d >= 1,
            "wrap": lambda d, b, a: max(b, a) <= d}[mode]
    if not all(fits(d, b, a) for d, (b, a) in zip(x.shape, widths)):
        return np.pad(x, widths, mode=mode)
    y = np.empty([d + b + a for d, (b, a) in zip(x.shape, widths)], x.dtype)
    y[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, widths))] = x
    for axis, (d, (b, a)) in enumerate(zip(x.shape, widths)):
        if not b and not a:
            continue
        v = y.swapaxes(0, axis)  # a view: writes land in y
        end = b + d
        if mode == "reflect":
            v[:b] = v[2 * b:b:-1]
            v[end:end + a] = v[end - 2:end - 2 - a:-1] if end - 2 - a >= 0 else \
                v[end - 2::-1][:a]
        elif mode == "edge":
            v[:b] = v[b:b + 1]
            v[end:] = v[end - 1:end]
        else:
            v[:b] = v[d:end]
            v[end:end + a] = v[b:b + a]
    return y


def clip(attrs, x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


def slice_(attrs, x):
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(attrs["starts"], attrs["ends"], attrs["axes"],
                                      attrs["steps"]):
        index[axis] = slice(start, end, step)
    return x[tuple(index)]


def split(attrs, x):
    cuts = np.cumsum(attrs["split"])[:-1]
    return tuple(np.split(x, cuts, axis=attrs["axis"]))


def flatten(attrs, x):
    axis = attrs["axis"]
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def _reduce(fn, initial=None):
    def kernel(attrs, x):
        axes = attrs.get("axes")
        extra = {}
        if initial is not None and x.size == 0:  # an empty max is -inf (ONNX), not an error
            extra["initial"] = initial(x.dtype)
        return fn(x, axis=None if axes is None else tuple(axes),
                  keepdims=bool(attrs.get("keepdims", 1)), **extra).astype(x.dtype, copy=False)
    return kernel


def _lowest(dtype):
    return False if dtype == bool else _fill_min(dtype)


def _highest(dtype):
    if dtype == bool:
        return True
    return np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max


def _float(fn):
    return lambda attrs, x: fn(x).astype(x.dtype, copy=False)


def _variadic(fn):
    return lambda attrs, *xs: functools.reduce(fn, xs)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def hard_sigmoid(x, alpha, beta):
    return np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1).astype(x.dtype)


def _per_axis(value, shape, attrs):
    """A QuantizeLinear/DequantizeLinear scale or zero point broadcast to the input: one
    value (per tensor), a 1-D tensor along ``axis`` (per axis), or blocks of ``block_size``
    along ``axis`` (blocked: the input's shape with that axis divided, rounded up)."""
    if value.size == 1 and (value.ndim <= 1 or not attrs["block_size"]):
        return value.reshape(())
    axis, block = attrs["axis"], attrs["block_size"]
    if not block:
        if value.ndim != 1 or value.shape[0] != shape[axis]:
            raise ValueError(f"a per-axis scale or zero point must be 1-D of size "
                             f"{shape[axis]} (axis {axis}), got shape {list(value.shape)}")
        return value.reshape([-1 if d == axis else 1 for d in range(len(shape))])
    want = list(shape)
    want[axis] = -(-shape[axis] // block)
    if list(value.shape) != want:
        raise ValueError(f"a blocked scale or zero point must have shape {want} (block size "
                         f"{block} on axis {axis}), got {list(value.shape)}")
    return np.repeat(value, block, axis=axis).take(range(shape[axis]), axis=axis)


def quantize_linear(attrs, x, scale, zero_point=None):
    """ONNX QuantizeLinear to an integer type: saturate(rint(x / scale) + zero_point), the
    division in ``precision`` (the scale's type unless the attribute says otherwise)."""
    out = np.dtype(attrs["output_dtype"])
    if zero_point is not None and zero_point.dtype != out:
        raise ValueError(f"zero point is {zero_point.dtype} but the output is {out}")
    precision = np.dtype(attrs["precision"])
    q = np.rint(x.astype(precision) / _per_axis(scale, x.shape, attrs).astype(precision))
    if zero_point is not None:
        q = q + _per_axis(zero_point, x.shape, attrs).astype(np.float64)
    info = np.iinfo(out)
    return np.clip(q, info.min, info.max).astype(out)


def dequantize_linear(attrs, x, scale, zero_point=None):
    """ONNX DequantizeLinear: (x - zero_point) * scale, in float32 (or wider when the scale
    is), cast to ``output_dtype``."""
    if zero_point is not None and zero_point.dtype != x.dtype:
        raise ValueError(f"zero point is {zero_point.dtype} but the input is {x.dtype}")
    d = x.astype(np.int64)
    if zero_point is not None:
        d = d - _per_axis(zero_point, x.shape, attrs).astype(np.int64)
    y = d.astype(np.result_type(np.float32, scale.dtype)) * _per_axis(scale, x.shape, attrs)
    return y.astype(attrs["output_dtype"])


def _selu(attrs, x):
    a = attrs.get("alpha", 1.67326319217681884765625)
    g = attrs.get("gamma", 1.05070102214813232421875)
    return np.where(x > 0, g * x, g * (a * np.exp(x) - a)).astype(x.dtype)


KERNELS = {
    # compute
    "Conv": conv,                                            # N-d convolution, groups
    "ConvInteger": conv_integer,                             # int8 Conv less zero points
    "QLinearConv": qlinear_conv,                             # QOperator int8 Conv
    "Gemm": gemm,                                            # alpha*A'B' + beta*C
    "MatMul": lambda a, x, y: np.matmul(x, y),               # numpy matmul semantics
    "MaxPool": max_pool,                                     # (values, flat indices)
    "AveragePool": average_pool,
    "GlobalAveragePool": lambda a, x: x.mean(axis=tuple(range(2, x.ndim)), keepdims=True),
    "GlobalMaxPool": lambda a, x: x.max(axis=tuple(range(2, x.ndim)), keepdims=True),
    "BatchNormalization": batch_norm,
    "Softmax": softmax,
    "LogSoftmax": lambda a, x: softmax(a, x, log=True),
    # element-wise, two or more operands (numpy broadcasting = ONNX multidirectional)
    "Add": lambda a, x, y: x + y,
    "Sub": lambda a, x, y: x - y,
    "Mul": lambda a, x, y: x * y,
    "Div": div,
    "Pow": lambda a, x, y: np.power(x, y).astype(x.dtype),
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
    "Sum": _variadic(np.add),
    "Mean": lambda a, *xs: (functools.reduce(np.add, xs) / len(xs)).astype(xs[0].dtype),
    "Equal": lambda a, x, y: x == y,
    "Less": lambda a, x, y: x < y,
    "Greater": lambda a, x, y: x > y,
    "And": lambda a, x, y: x & y,
    "Or": lambda a, x, y: x | y,
    "Not": lambda a, x: ~x,
    "Where": lambda a, c, x, y: np.where(c, x, y),
    "PRelu": lambda a, x, s: np.where(x < 0, x * s, x).astype(x.dtype),
    # element-wise, one operand
    "Relu": lambda a, x: np.maximum(x, x.dtype.type(0)),
    "Clip": clip,
    "LeakyRelu": lambda a, x: np.where(x < 0, x * x.dtype.type(a.get("alpha", 0.01)), x),
    "Sigmoid": _float(sigmoid),
    "HardSigmoid": lambda a, x: hard_sigmoid(x, a.get("alpha", 0.2), a.get("beta", 0.5)),
    "HardSwish": lambda a, x: x * hard_sigmoid(x, 1 / 6, 0.5),
    "Tanh": _float(np.tanh),
    "Exp": _float(np.exp),
    "Log": _float(np.log),
    "Sqrt": _float(np.sqrt),
    "Abs": lambda a, x: np.abs(x),
    "Neg": lambda a, x: np.negative(x),
    "Reciprocal": _float(np.reciprocal),
    "Floor": _float(np.floor),
    "Ceil": _float(np.ceil),
    "Softplus": _float(lambda x: np.logaddexp(0, x)),
    "Softsign": _float(lambda x: x / (1 + np.abs(x))),
    "Elu": lambda a, x: np.where(x < 0, x.dtype.type(a.get("alpha", 1.0)) * np.expm1(x), x),
    "Selu": _selu,
    "Identity": lambda a, x: x,
    "Dropout": lambda a, x, *_: (x, np.ones(x.shape, bool)),  # inference: a copy
    "Cast": lambda a, x: x.astype(a["to"]),
    "QuantizeLinear": quantize_linear,                       # integer types; per axis, blocked
    "DequantizeLinear": dequantize_linear,
    # reductions
    "ReduceMean": _reduce(np.mean),
    "ReduceSum": _reduce(np.sum),
    "ReduceMax": _reduce(np.max, _lowest),
    "ReduceMin": _reduce(np.min, _highest),
    "ReduceProd": _reduce(np.prod),
    # data movement (shapes from attributes)
    "Reshape": lambda a, x: x.reshape(a["shape"]),
    "Flatten": flatten,
    "Transpose": lambda a, x: np.transpose(x, a["perm"]),
    "Squeeze": lambda a, x: np.squeeze(x, axis=tuple(a["axes"])),
    "Unsqueeze": lambda a, x: np.expand_dims(x, tuple(a["axes"])),
    "Concat": lambda a, *xs: np.concatenate(xs, axis=a["axis"]),
    "Split": split,
    "Slice": slice_,
    "Pad": pad,
    "Gather": lambda a, x, i: np.take(x, i, axis=a["axis"]),
    "Expand": lambda a, x: np.broadcast_to(x, np.broadcast_shapes(x.shape, a["shape"])).copy(),
    "Tile": lambda a, x: np.tile(x, a["repeats"]),
    # shape arithmetic (always folded into constants for a static-shape graph)
    "Shape": lambda a, x: np.array(x.shape[a.get("start", 0):a.get("end")], dtype=np.int64),
    "Size": lambda a, x: np.array(x.size, dtype=np.int64),
    "ConstantOfShape": lambda a: np.full(a["shape"], a["value"]),
    "Range": lambda a, s, l, d: _range(s, l, d),
}


def _range(start, limit, delta):
    """One-element tensors count as scalars (onnxruntime takes them; AffineGrid's function
    body passes a 1-D limit)."""
    for v in (start, limit, delta):
        if np.size(v) != 1:
            raise ValueError(f"Range takes scalars, not a tensor of shape {list(np.shape(v))}")
    s, lim, d = (np.reshape(v, ()) for v in (start, limit, delta))
    return np.arange(s, lim, d).astype(s.dtype)


# ---- epilogues, nodes, graphs ----------------------------------------------------------------


# ---- shape and type inference ----------------------------------------------------------------


def conv_types(node, types):
    x, w = types[0], types[1]
    a = node.attrs
    if len(x.shape) != len(w.shape) or len(x.shape) < 3:
        raise NodeError(node, f"input {x} and weight {w} must have the same rank (>= 3)")
    if x.shape[1] != w.shape[1] * a["group"]:
        raise NodeError(node, f"input has {x.shape[1]} channels but weight {w} with "
                              f"group={a['group']} expects {w.shape[1] * a['group']}")
    if w.shape[0] % a["group"]:
        raise NodeError(node, f"weight {w} has {w.shape[0]} output channels, which "
                              f"group={a['group']} does not divide")
    out = pool_output_shape(x.shape[2:], a["kernel_shape"], a["strides"], a["dilations"],
                            a["pads"])
    if min(out) < 1:
        raise NodeError(node, f"kernel {a['kernel_shape']} does not fit the input {x}")
    return [TensorType(x.dtype, (x.shape[0], w.shape[0], *out))]


def _pool_types(node, types):
    x, a = types[0], node.attrs
    out = pool_output_shape(x.shape[2:], a["kernel_shape"], a["strides"], a["dilations"],
                            a["pads"], a.get("ceil_mode", 0))
    if min(out) < 1:
        raise NodeError(node, f"kernel {a['kernel_shape']} does not fit the input {x}")
    shape = (*x.shape[:2], *out)
    return [TensorType(x.dtype, shape), TensorType("int64", shape)][:len(node.outputs)]


def _gemm_types(node, types):
    a, b = types[0].shape, types[1].shape
    # (onnx's inference says so first, unless an input's shape was unknown to it)
    if len(a) != 2 or len(b) != 2:
        raise NodeError(node, f"A {types[0]} and B {types[1]} must be matrices (rank 2)")
    m, k = (a[1], a[0]) if node.attrs.get("transA", 0) else a
    k2, n = (b[1], b[0]) if node.attrs.get("transB", 0) else b
    if k != k2:
        raise NodeError(node, f"inner sizes differ: A {types[0]}, B {types[1]}")
    return [TensorType(types[0].dtype, (m, n))]


def _matmul_types(node, types):
    a, b = types[0].shape, types[1].shape
    if not a or not b:
        raise NodeError(node, f"{types[0]} @ {types[1]}: a scalar is not a matrix operand")
    a2, b2 = (1,) + a if len(a) == 1 else a, b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise NodeError(node, f"inner sizes differ: {types[0]} @ {types[1]}")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise NodeError(node, f"batch shapes do not broadcast: {types[0]} @ {types[1]}") from None
    shape = batch + (a2[-2],) * (len(a) > 1) + (b2[-1],) * (len(b) > 1)
    return [TensorType(types[0].dtype, tuple(shape))]


SHAPE_RULES = {"Conv": conv_types, "MaxPool": _pool_types, "AveragePool": _pool_types,
                "Gemm": _gemm_types, "MatMul": _matmul_types}


def _merge(table: dict, *groups: dict) -> None:
    for group in groups:
        both = set(table) & set(group)
        if both:
            raise RuntimeError(f"operators defined twice: {sorted(both)}")
        table.update(group)


_GROUPS = (ops_math, ops_nn, ops_tensor, ops_resize, ops_signal, ops_vision, ops_data,
           ops_random)
_merge(KERNELS, *(g.KERNELS for g in _GROUPS))
_merge(SHAPE_RULES, *(g.SHAPE_RULES for g in _GROUPS))
