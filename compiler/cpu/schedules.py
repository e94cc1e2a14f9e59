"""Operators for the CPU and the schedules that make them fast (after TVM's x86 ones):
float32, and int8 with exact integer results.

Convolutions work on channel-blocked tensors: data NCHW{c}c (``[N, C // c, H, W, c]``),
kernels OIHW{i}i{o}o (``[O // o, I // i, KH, KW, i, o]``), outputs NCHW{o}o. The hot loop
of a convolution keeps ``reg_n`` output columns times ``o`` output channels in vector
registers (``o`` = 16 floats is one AVX-512 register): for each input channel, kernel row
and column it loads one vector of weights and broadcasts one input value per column. Dense
layers pack their weights ``[N // n, K, n]`` the same way. Each operator takes an optional
fused epilogue: a bias per output channel, a residual tensor added, then ReLU or a clip.

float32 sums. A convolution's reduction (input channels x kernel rows x columns: 4608
products in ResNet-50's last 3x3 layers) is cut into chunks of whole input channel blocks
of at most ``FLOAT_TERMS`` = 128 products, each summed in registers (``.part``) and added to
the total (``.acc``); a dense layer's K into chunks of about sqrt(K). One running sum over
all of K rounds every product against an ever larger total: its error grows with K, a
chunked sum's with the chunk, as in a blocked GEMM (onnxruntime's MLAS). ResNet-50's
output error against a float64 evaluation was 2.4x onnxruntime's with one running sum, and
is about onnxruntime's in chunks, at the same speed.

int8. Convolutions and dense layers also take int8 data and weights; the result is the
exact integer sum wrapped to int32 (``requantize`` then gives the int8 output of graph_int's
QConv/QGemm). A dense layer accumulates in int32. A convolution, the hot loop, runs on
the float32 FMA units instead: a product of two int8 values is an integer of magnitude at
most 2**14, so a float32 sum of up to ``EXACT_TERMS`` = 1024 of them never leaves the
integers float32 represents exactly (2**24), in any order. The input channel blocks are
cut into chunks of at most 1024 products per output (``.part``, float32 in registers), each
chunk converted to int32 and added, wrapping (``.acc``); with a single chunk (3x3 kernels
up to 64 input channels in blocks of 16, 1x1 kernels up to 1024, depthwise kernels always)
the float sum is converted directly. The int8 data is widened to float32 in the padding stage
(always a stage for int8: a 1x1 kernel's holds only the pixels its strides read), so the
hot loop is the float convolution's -- one ``vfmadd231ps`` with a broadcast from memory per
column -- with int8 weights converted once per vector (``vpmovsxbd``, ``vcvtdq2ps``). An
int32 multiply-add would take two instructions (``vpmulld``, ``vpaddd``) per column.

    x = te.placeholder((1, 4, 56, 56, 16), "float32", "x")
    w = te.placeholder((4, 4, 3, 3, 16, 16), "float32", "w")
    y = conv2d_nchwc(x, w, stride=1, padding=1, activation="relu")
    kernel = compile_cpu(lower(schedule_conv2d_nchwc(y), [x, w, y]))

``pack_conv_weight``, ``pack_dense_weight``, ``pack_nchwc`` and ``unpack_nchwc`` convert
numpy arrays between the plain and the blocked layouts.
"""

from __future__ import annotations

import math

import numpy as np

from celosia.errors import CompilerError

from ..tensor import te
from ..tensor.expr import all_of, as_expr, max_expr, min_expr, select
from ..tensor.schedule import Schedule, create_schedule

__all__ = ["conv2d_nchwc", "schedule_conv2d_nchwc", "depthwise_conv2d_nchwc", "requantize",
           "schedule_depthwise_conv2d_nchwc", "pack_depthwise_weight", "dense", "schedule_dense", "relu",
           "add", "max_pool2d_nchwc", "global_avg_pool_nchwc", "schedule_elementwise",
           "pack_conv_weight", "pack_dense_weight", "pack_nchwc", "unpack_nchwc",
           "channel_block", "padded_channels", "dense_columns", "dense_block", "padded_rows",
           "conv_columns", "ACTIVATIONS", "EXACT_TERMS", "FLOAT_TERMS"]

ACTIVATIONS = (None, "relu", "relu6")
# int8 x int8 products summed in float32 stay exact integers up to this many (2**24 / 2**14).
EXACT_TERMS = 1024
# float32 sums: a convolution adds at most this many products in one register before adding
# the chunk to its total (a dense layer about sqrt(K)). A single running sum over all of
# K = C*KH*KW (4608 in ResNet-50's last 3x3 layers) rounds each term against an ever larger
# total; in chunks the error grows with the chunk, not with K, as in a blocked GEMM.
FLOAT_TERMS = 128
_CONV_TAG, _DENSE_TAG, _DW_TAG = "conv2d_nchwc", "dense_packed", "depthwise_nchwc"


def channel_block(channels: int, widest: int = 16) -> int:
    """The channel block for a layer: the largest of 16, 8, 4, 2, 1 (at most ``widest``)
    that divides ``channels``."""
    return next(b for b in (16, 8, 4, 2, 1) if b <= widest and channels % b == 0)


def padded_channels(channels: int) -> int:
    """The output channels a convolution computes: ``channels`` when they have a block of 8
    or more, else the next multiple of 16 (of 8 for 8 or fewer: 3 colours, 1 depth map),
    the extra ones cropped after it."""
    if channel_block(channels) >= 8:
        return channels
    step = 8 if channels <= 8 else 16
    return -(-channels // step) * step


def dense_columns(n: int) -> int:
    """The output columns a dense kernel computes for ``n``: ``padded_channels`` of them, and
    from 64 on the next multiple of 16 (1000 classes: 1008, in blocks of 16 instead of 8,
    1.7x faster on AVX-512), the extra ones cropped after it."""
    if n >= 64 and n % 16:
        return -(-n // 16) * 16
    return padded_channels(n)


def padded_rows(m: int) -> int:
    """The rows a dense kernel computes for ``m``: the dense schedule tiles rows by a
    divisor of m (at most 8), so an m with no divisor of 4 to 8 (ViT's 197 tokens: 1 row
    per tile, 4x slower) is padded with zero rows to a multiple of 8, the extra rows
    computed and dropped."""
    if m <= 8 or any(m % d == 0 for d in (4, 5, 6, 7, 8)):
        return m
    return -(-m // 8) * 8


def dense_block(n: int) -> int:
    """The column block of a float dense kernel of ``n`` output columns: 32 (two vectors of
    16 per row: a tile of 8 rows then holds 16 accumulators, enough independent FMAs for
    both of a core's FMA units) when n is a multiple of 32 from 64 on, else
    ``channel_block``. On transformer-sized products (128-197 rows, 256-3072 columns) 32
    took 0.79-0.85x the time of 16 (alternating in one process, quiet machine;
    docs/runtime.md)."""
    return 32 if n >= 64 and n % 32 == 0 else channel_block(n)


def output_block(channels: int, width: int) -> int:
    """A convolution's output channel block: 16 (one AVX-512 register of floats), or 32
    for a narrow output (width < 14), whose register tile of ``width`` columns would
    otherwise hold too few independent accumulators to hide the FMA latency."""
    if width < 14 and channels % 32 == 0:
        return 32
    return channel_block(channels)


# ---- operators ------------------------------------------------------------------------------


def _epilogue(value, activation):
    if activation not in ACTIVATIONS:
        raise CompilerError(f"activation must be one of {ACTIVATIONS}, not {activation!r}")
    if activation == "relu":
        return max_expr(value, 0.0)
    if activation == "relu6":
        return min_expr(max_expr(value, 0.0), 6.0)
    return value


def _pair(value, what: str, name: str, minimum: int) -> tuple[int, int]:
    v = (value, value) if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(v) != 2 or any(isinstance(x, bool) or not isinstance(x, int) or x < minimum for x in v):
        kind = "positive" if minimum == 1 else "non-negative"
        raise CompilerError(f"{name}: {what} must be a {kind} integer, not {value!r} (or a "
                            f"pair of them)")
    return v


def _pads(padding, name: str) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, a pair (rows, columns) or a 4-tuple."""
    if isinstance(padding, int) and not isinstance(padding, bool):
        padding = (padding,) * 4
    p = tuple(padding)
    if len(p) == 2:
        p = p + p
    if len(p) != 4 or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in p):
        raise CompilerError(f"{name}: padding must be a non-negative integer, a pair or "
                            f"(top, left, bottom, right), not {padding!r}")
    return p


def _padded_source(data: te.Tensor, pads, out_hw, strides, spans, fill, name):
    """``data`` [N, C, H, W, c] with zero borders as a stage of its own (or ``data`` itself
    when there is no padding): only the rows and columns the windows read."""
    n, cc, h, w, cb = data.shape
    pt, pl, pb, pr = pads
    if not any(pads):
        return data
    need_h = (out_hw[0] - 1) * strides[0] + spans[0]
    need_w = (out_hw[1] - 1) * strides[1] + spans[1]
    return te.compute(
        (n, cc, need_h, need_w, cb),
        lambda b, c, y, x, ci: select(all_of(y >= pt, y < h + pt, x >= pl, x < w + pl),
                                      data[b, c, y - pt, x - pl, ci], fill),
        f"{name}.pad")


def _quantized(data: te.Tensor, weight: te.Tensor, name: str) -> bool:
    """Whether the operands are int8 (else float32; anything else is an error)."""
    if data.dtype == weight.dtype and data.dtype in ("float32", "int8"):
        return data.dtype == "int8"
    raise CompilerError(f"{name}: data and kernel must be both float32 or both int8, not "
                        f"{data.dtype} and {weight.dtype}")


def _exact_chunk(name: str, blocks: int, terms_per_block: int) -> int:
    """How many of ``blocks`` input channel blocks an int8 convolution sums per float32
    chunk (a divisor of ``blocks``): at most EXACT_TERMS products."""
    if terms_per_block > EXACT_TERMS:
        raise CompilerError(f"{name}: an int8 window of {terms_per_block} products per "
                            f"channel block is more than float32 sums exactly "
                            f"({EXACT_TERMS}); use a smaller channel block")
    return _largest_divisor(blocks, EXACT_TERMS // terms_per_block)


def _float_chunk(blocks: int, terms_per_block: int) -> int:
    """How many of ``blocks`` input channel blocks a float32 convolution sums per chunk:
    the largest divisor of ``blocks`` with at most FLOAT_TERMS products (at least one
    block)."""
    return _largest_divisor(blocks, max(1, FLOAT_TERMS // terms_per_block))


def _dense_chunk(k: int) -> int:
    """The chunk of K a float32 dense layer sums before adding it to the total: about
    sqrt(K) (which minimises the rounding error of a two-level sum), a divisor of K, at
    most FLOAT_TERMS; K itself when K has no divisor from 8 to there (no split)."""
    target = min(FLOAT_TERMS, max(8, int(round(k ** 0.5))))
    chunk = _largest_divisor(k, target)
    return chunk if chunk >= 8 and chunk < k else k


def _conv_source(data: te.Tensor, pads, out_hw, strides, spans, name, pad_value=None):
    """(what the windows read, the strides to read it with). float32: the data, padded
    when there is padding (``_padded_source``). int8: always a stage widened to float32 (see
    the module docstring), its padding ``pad_value`` (an int32 expression, QConv's
    ``pad_value``; None: 0); for a 1x1 kernel it holds only the pixels the strided windows
    read, so a strided 1x1 convolution (a downsampling shortcut) reads it with strides 1."""
    if data.dtype == "float32":
        return _padded_source(data, pads, out_hw, strides, spans, 0.0, name), strides
    n, cc, h, w, cb = data.shape
    pt, pl = pads[0], pads[1]
    if spans == (1, 1):
        step, shape, read_strides = strides, (n, cc, *out_hw), (1, 1)
    else:
        step = (1, 1)
        shape = (n, cc, (out_hw[0] - 1) * strides[0] + spans[0],
                 (out_hw[1] - 1) * strides[1] + spans[1])
        read_strides = strides

    def widened(b, c, y, x, ci):
        iy, ix = y * step[0] - pt, x * step[1] - pl
        conds = []  # bounds checks only where some window leaves the input
        if pt:
            conds.append(iy >= 0)
        if (shape[2] - 1) * step[0] - pt >= h:
            conds.append(iy < h)
        if pl:
            conds.append(ix >= 0)
        if (shape[3] - 1) * step[1] - pl >= w:
            conds.append(ix < w)
        v = data[b, c, iy, ix, ci].astype("float32")
        fill = as_expr(0.0) if pad_value is None else pad_value.astype("float32")
        return select(all_of(*conds), v, fill) if conds else v

    return te.compute((*shape, cb), widened, f"{name}.pad"), read_strides


def requantize(value, multiplier, shift, lo, hi, residual=None):
    """The int8 output of graph_int's QConv/QGemm from ``value`` = accumulator + bias
    (int32): ``(value * multiplier) >> shift`` (wrapping multiply, arithmetic shift), plus
    the int8 ``residual`` (wrapping), clipped to [lo, hi] and narrowed to int8. ``shift``,
    ``lo`` and ``hi`` are ints or int32 expressions (read from a tensor at run time)."""
    t = (value * multiplier) >> shift
    if residual is not None:
        t = t + residual.astype("int32")
    return min_expr(max_expr(t, lo), hi).astype("int8")


def _conv_geometry(name, h, w, kh, kw, stride, padding, dilation):
    strides = _pair(stride, "stride", name, 1)
    dil = _pair(dilation, "dilation", name, 1)
    pads = _pads(padding, name)
    spans = ((kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1)
    oh = (h + pads[0] + pads[2] - spans[0]) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - spans[1]) // strides[1] + 1
    if oh <= 0 or ow <= 0:
        raise CompilerError(f"{name}: a {kh}x{kw} kernel does not fit the {h}x{w} input with "
                            f"padding {pads}")
    return strides, dil, pads, spans, (oh, ow)


def _output_stage(acc, out_shape, bias, residual, activation, epilogue, name, tag,
                  value_type="float32"):
    """The output stage: the accumulator (as ``value_type``: int32 for int8 operators),
    bias, residual, activation, then the epilogue."""
    for what, t, shape in (("bias", bias, (out_shape[1], out_shape[4])),
                           ("residual", residual, out_shape)):
        if t is not None and tuple(t.shape) != shape:
            raise CompilerError(f"{name}: {what} must have shape {shape}, not {t.shape}")

    def out(b, c, y, x, co):
        v = acc[b, c, y, x, co].astype(value_type)
        if bias is not None:
            v = v + bias[c, co]
        if residual is not None:
            v = v + residual[b, c, y, x, co]
        v = _epilogue(v, activation)
        return epilogue(v, (b, c, y, x, co)) if epilogue is not None else v

    return te.compute(out_shape, out, name, tag=tag)


def conv2d_nchwc(data: te.Tensor, weight: te.Tensor, *, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: te.Tensor | None = None,
                 residual: te.Tensor | None = None, activation: str | None = None,
                 epilogue=None, name: str = "conv", pad_value=None) -> te.Tensor:
    """Convolution of data ``[N, IC//cb, H, W, cb]`` with a kernel ``[OC//ob, IC//groups//cb,
    KH, KW, cb, ob]``: ``[N, OC//ob, OH, OW, ob]``. ``stride`` and ``dilation`` are an int or
    (rows, columns); ``padding`` an int, a pair or (top, left, bottom, right). With
    ``groups`` > 1 each group's channels must be whole blocks on both sides. ``bias`` is
    ``[OC//ob, ob]``, ``residual`` has the output's shape; ``activation`` is None, "relu" or
    "relu6"; ``epilogue(value, (b, c, y, x, co))`` returns the final value (applied last).
    With int8 data and kernel the value is the int32 sum (bias int32; see the module
    docstring: at most EXACT_TERMS products per window and channel block), the padding
    ``pad_value`` (an int32 expression; None: 0)."""
    if data.ndim != 5 or weight.ndim != 6:
        raise CompilerError(f"{name}: data must be [N, C//c, H, W, c] and the kernel "
                            f"[O//o, I//i, KH, KW, i, o], not {data.shape} and {weight.shape}")
    n, icc, h, w, cb = data.shape
    occ, icc_g, kh, kw, cb_w, ob = weight.shape
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 \
            or occ % groups or icc_g * groups != icc or cb_w != cb:
        raise CompilerError(f"{name}: the kernel {weight.shape} with groups={groups} expects "
                            f"{icc_g * groups * cb_w} input channels in blocks of {cb_w}; the "
                            f"data {data.shape} has {icc * cb} in blocks of {cb}")
    quantized = _quantized(data, weight, name)
    strides, dil, pads, spans, (oh, ow) = _conv_geometry(name, h, w, kh, kw, stride, padding,
                                                         dilation)
    src, strides = _conv_source(data, pads, (oh, ow), strides, spans, name, pad_value)
    chunk = (_exact_chunk(name, icc_g, kh * kw * cb) if quantized
             else _float_chunk(icc_g, kh * kw * cb))
    rc, ry, rx, ri = (te.reduce_axis(chunk, "rc"), te.reduce_axis(kh, "ry"),
                      te.reduce_axis(kw, "rx"), te.reduce_axis(cb, "ri"))
    occ_g = occ // groups
    out_shape = (n, occ, oh, ow, ob)

    def window(b, c, y, x, co, q):
        """The products of one chunk (``q``) of input channel blocks, float32."""
        k = rc if chunk == icc_g else q * chunk + rc
        channel = k if groups == 1 else (c // occ_g) * icc_g + k
        return te.sum(src[b, channel, y * strides[0] + ry * dil[0], x * strides[1] + rx * dil[1],
                          ri] * weight[c, k, ry, rx, ri, co].astype("float32"),
                      axis=[rc, ry, rx, ri])

    if chunk == icc_g:
        conv = te.compute(out_shape, lambda b, c, y, x, co: window(b, c, y, x, co, 0),
                          f"{name}.acc", tag=_CONV_TAG)
    else:  # float32 chunks, summed as float32 (accuracy) or, int8, as int32 (exact)
        part = te.compute(out_shape + (icc_g // chunk,), window, f"{name}.part", tag=_CONV_TAG)
        rq = te.reduce_axis(icc_g // chunk, "rq")
        total = "int32" if quantized else "float32"
        conv = te.compute(out_shape, lambda b, c, y, x, co: te.sum(
            part[b, c, y, x, co, rq].astype(total), axis=[rq]), f"{name}.acc", tag=_CONV_TAG)
    return _output_stage(conv, out_shape, bias, residual, activation, epilogue, name, _CONV_TAG,
                         "int32" if quantized else "float32")


def depthwise_conv2d_nchwc(data: te.Tensor, weight: te.Tensor, *, stride=1, padding=0,
                           dilation=1, bias: te.Tensor | None = None,
                           residual: te.Tensor | None = None, activation: str | None = None,
                           epilogue=None, name: str = "dwconv", pad_value=None) -> te.Tensor:
    """Depthwise convolution (one filter per channel) of ``[N, C//c, H, W, c]`` with a kernel
    ``[C//c, KH, KW, c]`` (``pack_depthwise_weight``): ``[N, C//c, OH, OW, c]``. The other
    arguments (and int8 operands) are those of ``conv2d_nchwc``."""
    if data.ndim != 5 or weight.ndim != 4:
        raise CompilerError(f"{name}: data must be [N, C//c, H, W, c] and the kernel "
                            f"[C//c, KH, KW, c], not {data.shape} and {weight.shape}")
    n, cc, h, w, cb = data.shape
    cc_w, kh, kw, cb_w = weight.shape
    if (cc_w, cb_w) != (cc, cb):
        raise CompilerError(f"{name}: the kernel {weight.shape} does not match the data "
                            f"{data.shape}")
    quantized = _quantized(data, weight, name)
    if quantized:  # each output sums one window: it must fit in one chunk
        _exact_chunk(name, 1, kh * kw)
    strides, dil, pads, spans, (oh, ow) = _conv_geometry(name, h, w, kh, kw, stride, padding,
                                                         dilation)
    src, strides = _conv_source(data, pads, (oh, ow), strides, spans, name, pad_value)
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    out_shape = (n, cc, oh, ow, cb)
    conv = te.compute(out_shape, lambda b, c, y, x, ci: te.sum(
        src[b, c, y * strides[0] + ry * dil[0], x * strides[1] + rx * dil[1], ci]
        * weight[c, ry, rx, ci].astype("float32"), axis=[ry, rx]), f"{name}.acc", tag=_DW_TAG)
    return _output_stage(conv, out_shape, bias, residual, activation, epilogue, name, _DW_TAG,
                         "int32" if quantized else "float32")


def dense(data: te.Tensor, weight: te.Tensor, *, bias: te.Tensor | None = None,
          activation: str | None = None, epilogue=None, name: str = "dense") -> te.Tensor:
    """``data [M, K]`` times packed weights ``[N//nb, K, nb]`` (row j of the plain ``[N, K]``
    weights is ``weight[j // nb, :, j % nb]``), plus ``bias [N]``: ``[M, N]``;
    ``epilogue(value, (i, j))`` returns the final value (applied last). int8 data and
    weights accumulate in int32 (bias int32)."""
    m, k = data.shape
    nbk, k_w, nb = weight.shape
    if k_w != k:
        raise CompilerError(f"{name}: the weights {weight.shape} take {k_w} inputs, the data "
                            f"{data.shape} has {k}")
    acc_type = "int32" if _quantized(data, weight, name) else "float32"
    n = nbk * nb
    if bias is not None and tuple(bias.shape) != (n,):
        raise CompilerError(f"{name}: bias must have shape ({n},), not {bias.shape}")
    chunk = k if acc_type == "int32" else _dense_chunk(k)
    r = te.reduce_axis(chunk, "k")

    def products(i, j, q):
        kk = r if chunk == k else q * chunk + r
        return te.sum(data[i, kk].astype(acc_type) * weight[j // nb, kk, j % nb].astype(acc_type),
                      axis=[r])

    if chunk == k:
        acc = te.compute((m, n), lambda i, j: products(i, j, 0), f"{name}.acc", tag=_DENSE_TAG)
    else:  # float32 in chunks of K (accuracy: see FLOAT_TERMS), the chunks then added
        part = te.compute((m, n, k // chunk), products, f"{name}.part", tag=_DENSE_TAG)
        rq = te.reduce_axis(k // chunk, "rq")
        acc = te.compute((m, n), lambda i, j: te.sum(part[i, j, rq], axis=[rq]), f"{name}.acc",
                         tag=_DENSE_TAG)

    def out(i, j):
        v = _epilogue(acc[i, j] + bias[j] if bias is not None else acc[i, j], activation)
        return epilogue(v, (i, j)) if epilogue is not None else v

    return te.compute((m, n), out, name, tag=_DENSE_TAG)


def relu(x: te.Tensor, name: str = "relu") -> te.Tensor:
    return te.compute(x.shape, lambda *i: max_expr(x[i], 0.0), name)


def add(a: te.Tensor, b: te.Tensor, *, activation: str | None = None, name: str = "add") -> te.Tensor:
    if tuple(a.shape) != tuple(b.shape):
        raise CompilerError(f"{name}: shapes {a.shape} and {b.shape} differ")
    return te.compute(a.shape, lambda *i: _epilogue(a[i] + b[i], activation), name)


def max_pool2d_nchwc(data: te.Tensor, *, kernel: int, stride: int, padding: int = 0,
                     name: str = "maxpool") -> te.Tensor:
    """Max pooling of ``[N, C//c, H, W, c]``; padding never wins (it is -inf)."""
    n, cc, h, w, cb = data.shape
    oh, ow = (h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1

    def out(b, c, y, x, ci):
        best = None
        for dy in range(kernel):
            for dx in range(kernel):
                iy, ix = y * stride + dy - padding, x * stride + dx - padding
                v = data[b, c, iy, ix, ci]
                if padding:
                    v = select(all_of(iy >= 0, iy < h, ix >= 0, ix < w), v, float("-inf"))
                best = v if best is None else max_expr(best, v)
        return best

    return te.compute((n, cc, oh, ow, cb), out, name)


def global_avg_pool_nchwc(data: te.Tensor, name: str = "avgpool") -> te.Tensor:
    """The mean over H and W of ``[N, C//c, H, W, c]``: ``[N, C//c, c]``."""
    n, cc, h, w, cb = data.shape
    ry, rx = te.reduce_axis(h, "ry"), te.reduce_axis(w, "rx")
    total = te.compute((n, cc, cb), lambda b, c, ci: te.sum(data[b, c, ry, rx, ci], axis=[ry, rx]),
                       f"{name}.sum")
    return te.compute((n, cc, cb), lambda b, c, ci: total[b, c, ci] * as_expr(1.0 / (h * w)), name)


# ---- schedules ------------------------------------------------------------------------------


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def _register_columns(width: int, preferred: int, most: int) -> int:
    """Output columns per register tile: the largest divisor of ``width`` up to
    ``preferred``, or up to ``most`` (the registers' limit) when that is a poor tile
    (fewer than half of ``preferred``: a width of 19 or 38 would get 1 or 2 columns,
    too few independent accumulators to hide the FMA latency)."""
    n = _largest_divisor(width, preferred)
    return n if 2 * n >= preferred else max(n, _largest_divisor(width, most))


def conv_columns(width: int, ob: int) -> int:
    """The output columns ``schedule_conv2d_nchwc`` keeps in registers for an output of
    ``width`` columns and ``ob`` channels per block."""
    if ob <= 8:
        return _largest_divisor(width, 28)
    return _register_columns(width, 14, 24 if ob == 16 else 14)


def _rows_outer(stage) -> bool:
    """Whether output rows go outside output channel blocks: when the (padded) input is
    larger than the weights, re-reading the weights per row costs less than streaming the
    whole input once per output channel block. Alone on an idle core both orders run
    alike; alternated with the other order under this machine's load, rows outside had a
    median time 0.69-1.02x (a 1x1 192 -> 64 on 80x80: 0.69-0.86; 3x3 stride-2 convolutions
    on 80-320 columns: 0.81-0.97)."""
    reads = te.inputs_of(stage.op)
    return len(reads) >= 2 and math.prod(reads[0].shape) > math.prod(reads[1].shape)


def _stage_named(s: Schedule, out: te.Tensor, suffix: str):
    for stage in s.stages:
        if stage.name == out.name + suffix:
            return stage
    return None


def schedule_rows(s: Schedule, pad, out: te.Tensor, acc, reg_n: int,
                  rows_outer: bool = False) -> None:
    """The common part of the convolution schedules: the padded input first, rows in
    parallel; then per (image, channel block, output row) -- in parallel -- and chunk of
    ``reg_n`` columns, the accumulator ``acc`` computed in registers. ``rows_outer``: per
    (image, output row, channel block) instead, so the input rows a window reads are
    reused by every output channel block while they are in cache."""
    if pad is not None:
        b, c, y, x, ci = pad.leaves
        pad.parallel(pad.fuse(pad.fuse(b, c), y))
        pad.vectorize(ci)
    o = s[out]
    b, c, y, x, co = o.leaves
    xo, xi = o.split(x, reg_n)
    if rows_outer:
        o.reorder(b, y, c, xo, xi, co)
        o.parallel(o.fuse(o.fuse(b, y), c))
    else:
        o.reorder(b, c, y, xo, xi, co)
        o.parallel(o.fuse(o.fuse(b, c), y))
    o.unroll(xi)
    o.vectorize(co)
    acc.set_scope("local")
    acc.compute_at(o, xo)


def schedule_conv2d_nchwc(out: te.Tensor, *, reg_n: int | None = None,
                          unroll_kw: bool = False, rows_outer: bool | None = None) -> Schedule:
    """The schedule of ``conv2d_nchwc``: the padded input computed first (rows in parallel),
    then per (image, output channel block, output row) -- in parallel -- and per chunk of
    ``reg_n`` output columns, the accumulator ``reg_n x ob`` in registers over the input
    channel blocks, kernel rows and columns and channels of a block (int8 in chunks: the
    float32 ``reg_n x ob`` of a chunk of channel blocks, added to the int32 one)."""
    if out.op.tag != _CONV_TAG:
        raise CompilerError(f"schedule_conv2d_nchwc: {out.name} was not made by conv2d_nchwc")
    s = create_schedule(out)
    acc = s[_stage_named(s, out, ".acc").tensor]
    part = _stage_named(s, out, ".part")
    pad = _stage_named(s, out, ".pad")
    _, _, _, ow, ob = out.shape
    reg_n = reg_n or conv_columns(ow, ob)
    if ow % reg_n:
        raise CompilerError(f"schedule_conv2d_nchwc: reg_n {reg_n} must divide the output "
                            f"width {ow}")
    if rows_outer is None:
        rows_outer = _rows_outer(part or acc)
    schedule_rows(s, pad, out, acc, reg_n, rows_outer)
    hot = acc  # the stage of the multiply-add loop
    if part is not None:  # int8 in chunks: each chunk's float32 sums, then added as int32
        ab, ac, ay, ax, aco, rq = acc.leaves
        acc.reorder(ab, ac, ay, rq, ax, aco)
        acc.unroll(ax)
        acc.vectorize(aco)
        part.set_scope("local")
        part.compute_at(acc, rq)
        hot = part
        pb, pc, py, px, pco, pq, rc, ry, rx, ri = part.leaves
        part.reorder(pb, pc, py, pq, rc, ry, rx, ri, px, pco)
    else:
        ab, ac, ay, px, pco, rc, ry, rx, ri = acc.leaves
        acc.reorder(ab, ac, ay, rc, ry, rx, ri, px, pco)
    if unroll_kw:
        hot.unroll(rx)
    hot.unroll(px)
    hot.vectorize(pco)
    return s


def schedule_depthwise_conv2d_nchwc(out: te.Tensor, *, reg_n: int | None = None) -> Schedule:
    """The schedule of ``depthwise_conv2d_nchwc``: the padded input first (rows in
    parallel), then per (image, channel block, output row) -- in parallel -- and chunk of
    ``reg_n`` columns, ``reg_n`` vectors of a channel block accumulated over the window."""
    if out.op.tag != _DW_TAG:
        raise CompilerError(f"schedule_depthwise_conv2d_nchwc: {out.name} was not made by "
                            f"depthwise_conv2d_nchwc")
    s = create_schedule(out)
    acc = s[_stage_named(s, out, ".acc").tensor]
    pad = _stage_named(s, out, ".pad")
    _, _, _, ow, cb = out.shape
    reg_n = reg_n or _largest_divisor(ow, 16 if cb <= 8 else 8)
    schedule_rows(s, pad, out, acc, reg_n)
    ab, ac, ay, ax, aco, ry, rx = acc.leaves
    acc.reorder(ab, ac, ay, ry, rx, ax, aco)
    acc.unroll(ax)
    acc.vectorize(aco)
    return s


def schedule_dense(out: te.Tensor, *, rows: int | None = None) -> Schedule:
    """The schedule of ``dense``: output tiles of ``rows x nb`` accumulated in registers over
    K, the column blocks in parallel."""
    if out.op.tag != _DENSE_TAG:
        raise CompilerError(f"schedule_dense: {out.name} was not made by dense")
    s = create_schedule(out)
    acc = s[_stage_named(s, out, ".acc").tensor]
    m, n = out.shape
    part = _stage_named(s, out, ".part")
    nb = te.inputs_of((part or acc).op)[1].shape[2]  # the packed weights' block
    rows = rows or _largest_divisor(m, 8 if nb <= 32 else 4)
    o = s[out]
    i, j = o.leaves
    io, ii = o.split(i, rows)
    jo, ji = o.split(j, nb)
    o.reorder(jo, io, ii, ji)
    o.parallel(jo)
    o.vectorize(ji)
    acc.set_scope("local")
    acc.compute_at(o, io)
    ai, aj, ak = acc.leaves
    acc.reorder(ak, ai, aj)
    acc.unroll(ai)
    acc.vectorize(aj)
    if part is not None:  # each chunk's sums in registers, added to the accumulator
        part.set_scope("local")
        part.compute_at(acc, ak)
        pi, pj, pq, pk = part.leaves
        part.reorder(pq, pk, pi, pj)
        part.unroll(pi)
        part.vectorize(pj)
    return s


def schedule_elementwise(out: te.Tensor, *, inline: tuple = ()) -> Schedule:
    """Elementwise operators and pooling: the outer loops fused and run in parallel, the
    innermost (channels of a block) vectorised; stages in ``inline`` are inlined."""
    s = create_schedule(out)
    for t in inline:
        s[t].compute_inline()
    for stage in s.stages:
        if stage.is_placeholder or stage.inline:
            continue
        data = [iv for iv in stage.leaves if iv.kind == "data"]
        if len(data) >= 2:
            outer = data[0]
            for iv in data[1:-1]:
                if stage.leaves.index(iv) == stage.leaves.index(outer) + 1:
                    outer = stage.fuse(outer, iv)
            stage.parallel(outer)
        if data and stage.leaves[-1] is data[-1] and data[-1].extent <= 64:
            stage.vectorize(data[-1])
    return s


# ---- layouts (numpy) ------------------------------------------------------------------------


def pack_nchwc(x: np.ndarray, block: int) -> np.ndarray:
    """``[N, C, H, W]`` -> ``[N, C // block, H, W, block]``."""
    n, c, h, w = x.shape
    if c % block:
        raise CompilerError(f"pack_nchwc: {c} channels are not a multiple of the block {block}")
    return np.ascontiguousarray(x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def unpack_nchwc(x: np.ndarray) -> np.ndarray:
    """``[N, C // c, H, W, c]`` -> ``[N, C, H, W]``."""
    n, cc, h, w, cb = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cc * cb, h, w))


def pack_conv_weight(w: np.ndarray, in_block: int, out_block: int) -> np.ndarray:
    """OIHW ``[O, I, KH, KW]`` -> ``[O // out_block, I // in_block, KH, KW, in_block, out_block]``."""
    o, i, kh, kw = w.shape
    if o % out_block or i % in_block:
        raise CompilerError(f"pack_conv_weight: {o} output and {i} input channels are not "
                            f"multiples of the blocks {out_block} and {in_block}")
    return np.ascontiguousarray(w.reshape(o // out_block, out_block, i // in_block, in_block, kh, kw)
                                .transpose(0, 2, 4, 5, 3, 1))


def pack_depthwise_weight(w: np.ndarray, block: int) -> np.ndarray:
    """Depthwise OIHW ``[C, 1, KH, KW]`` -> ``[C // block, KH, KW, block]``."""
    c, one, kh, kw = w.shape
    if one != 1 or c % block:
        raise CompilerError(f"pack_depthwise_weight: {w.shape} is not a depthwise kernel of "
                            f"channels in blocks of {block}")
    return np.ascontiguousarray(w.reshape(c // block, block, kh, kw).transpose(0, 2, 3, 1))


def pack_dense_weight(w: np.ndarray, block: int) -> np.ndarray:
    """``[N, K]`` -> ``[N // block, K, block]``."""
    n, k = w.shape
    if n % block:
        raise CompilerError(f"pack_dense_weight: {n} outputs are not a multiple of the block {block}")
    return np.ascontiguousarray(w.reshape(n // block, block, k).transpose(0, 2, 1))
