"""Accelerator operators: conv2d and dense on packed layouts with fused ALU epilogues, their
default schedules, and numpy references.

Layouts (BATCH = b, BLOCK = k):
    conv data    (N/b, C/k, H, W, b, k)        int8   (NCHW{b}n{k}c)
    conv kernel  (O/k, C/k, KH, KW, k, k)      int8   (OIHW{k}o{k}i)
    dense data   (N/b, K/k, b, k), weight (O/k, K/k, k, k)
    bias         (O/k, b, k) int32, the same for every batch lane
    scale        (O/k, b, k) int32, a per-channel multiplier, laid out like the bias
The epilogue runs on the ALU, in this order: + bias (or after the multipliers, bias_last),
* multiplier (an immediate) or * scale
(per channel), >> shift, + residual (an int8 tensor loaded with ACC_8BIT), clip to
[lo, hi] (by default [0 or -128, 127]), then the int8 OUT view is stored. This is the
requantization of int8 models (compiler/quantize.py): QConv and QGemm map onto it exactly.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CompilerError

from ..tensor import te
from ..tensor.expr import max_expr, min_expr, select
from ..tensor.schedule import create_schedule
from .build import AcceleratorFunction, build
from .intrin import get_intrinsic

__all__ = ["Epilogue", "ConvSpec", "ConvKnobs", "conv2d", "DenseSpec", "DenseKnobs", "dense",
           "conv2d_reference", "dense_reference", "pack_nchw", "unpack_nchw", "pack_oihw",
           "pack_bias", "pad_channels"]


@dataclass(frozen=True)
class Epilogue:
    bias: bool = False
    multiplier: int | None = None  # 16-bit signed immediate
    shift: int = 0
    residual: bool = False
    relu: bool = False
    scale: bool = False  # a per-channel int32 multiplier tensor (after any immediate one)
    lo: int | None = None  # clip bounds; lo defaults to 0 with relu, else -128
    hi: int = 127
    # The bias is added after the multipliers: (x * m + bias) >> shift, a rounding term
    # (QMatMul's requantization, compiler/accel/matmul.py).
    bias_last: bool = False

    def __post_init__(self):
        if not -128 <= self.low <= self.hi <= 127:
            raise CompilerError(f"epilogue clip bounds [{self.low}, {self.hi}] must lie in "
                                f"[-128, 127] with lo <= hi")
        if not 0 <= self.shift <= 31:
            raise CompilerError(f"epilogue shift {self.shift} must be in [0, 31]")

    @property
    def low(self) -> int:
        return self.lo if self.lo is not None else (0 if self.relu else -128)

    def apply(self, acc: np.ndarray, bias=None, residual=None, scale=None) -> np.ndarray:
        """The numpy reference of the epilogue on int32 accumulators (32-bit wrap)."""
        x = acc.astype(np.int64)
        if self.bias and not self.bias_last:
            x = _wrap(x + bias)
        if self.multiplier is not None:
            x = _wrap(x * self.multiplier)
        if self.scale:
            x = _wrap(x * scale.astype(np.int64))
        if self.bias and self.bias_last:
            x = _wrap(x + bias)
        x = x >> self.shift
        if self.residual:
            x = _wrap(x + residual.astype(np.int64))
        return np.clip(x, self.low, self.hi).astype(np.int8)

    def expr(self, acc, bias, residual, scale=None):
        x = acc
        if self.bias and not self.bias_last:
            x = x + bias
        if self.multiplier is not None:
            x = x * self.multiplier
        if self.scale:
            x = x * scale
        if self.bias and self.bias_last:
            x = x + bias
        if self.shift:
            x = x >> self.shift
        if self.residual:
            x = x + residual.astype("int32")
        return min_expr(max_expr(x, self.low), self.hi)


def _wrap(x):
    return (x + 2**31) % 2**32 - 2**31


# ---- conv2d ------------------------------------------------------------------------------


class _ConvOutput:
    """Output rows and columns of a convolution from h, w, kh, kw and its ``strides``
    (rows, columns) and ``pads`` (top, left, bottom, right): conv2d's and group_conv2d's
    specs."""

    @property
    def oh(self) -> int:
        return (self.h + self.pads[0] + self.pads[2] - self.kh) // self.strides[0] + 1

    @property
    def ow(self) -> int:
        return (self.w + self.pads[1] + self.pads[3] - self.kw) // self.strides[1] + 1


@dataclass(frozen=True)
class ConvSpec(_ConvOutput):
    """A conv2d layer in NCHW terms (channels are multiples of BLOCK after pad_channels).

    ``stride`` is one stride for both axes or (rows, columns); ``pad`` one padding for every
    side or (top, left, bottom, right), ONNX order. Both are kept as one number when the
    axes (sides) agree, so equal layers have equal specs (and share tuned choices);
    ``strides`` and ``pads`` give them per axis (side)."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    stride: int | tuple = 1
    pad: int | tuple = 0
    epilogue: Epilogue = field(default_factory=Epilogue)
    # (row classes, column classes) of a bias table (border.py: a nonzero pad value), or ()
    # for one bias per channel
    bias_classes: tuple = ()

    def __post_init__(self):
        for name, size in (("stride", 2), ("pad", 4)):
            v = getattr(self, name)
            v = (int(v),) * size if np.ndim(v) == 0 else tuple(int(x) for x in v)
            if len(v) != size:
                raise CompilerError(f"ConvSpec {name}={getattr(self, name)!r}: give one number "
                                    f"or {size} ({'rows, columns' if size == 2 else 'top, left, bottom, right'})")
            if min(v) < (1 if name == "stride" else 0):
                raise CompilerError(f"ConvSpec {name}={getattr(self, name)!r} must be "
                                    f"{'positive' if name == 'stride' else 'non-negative'}")
            object.__setattr__(self, name, v[0] if len(set(v)) == 1 else v)
        if self.oh <= 0 or self.ow <= 0:
            raise CompilerError(f"{self}: the output would be empty")

    @property
    def strides(self) -> tuple[int, int]:
        return self.stride if isinstance(self.stride, tuple) else (self.stride,) * 2

    @property
    def pads(self) -> tuple[int, int, int, int]:
        return self.pad if isinstance(self.pad, tuple) else (self.pad,) * 4

    @property
    def macs(self) -> int:
        return self.n * self.o * self.oh * self.ow * self.c * self.kh * self.kw


@dataclass(frozen=True)
class ConvKnobs:
    """Tile sizes (output rows, output columns, output channel blocks, input channel blocks
    per load) and virtual threads (on output channel blocks or rows)."""

    tile_h: int
    tile_w: int
    tile_co: int
    tile_ci: int
    vthreads: int = 1
    vthread_axis: str = "co"  # "co" or "h"


def _check_divides(what: str, extent: int, factor: int):
    if factor <= 0 or extent % factor:
        raise CompilerError(f"{what}={factor} must divide {extent}")


def _named(fn, names):
    """``fn(*indices)`` with its indices named ``names`` (te.compute names a stage's axes
    after its function's parameters; they show in the printed program)."""
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])
    return fn


def _pad_input(data, pads: tuple, names: tuple):
    """The zero-padded input stage (axes ``names``) of a packed (..., H, W, b, k) tensor,
    padded by (top, left, bottom, right)."""
    *lead, h, w, b, k = data.shape
    pt, pl, pb, pr = pads

    def at(*i):
        y, x = i[-4], i[-3]
        return select((y >= pt) & (y < h + pt) & (x >= pl) & (x < w + pl),
                      data[(*i[:-4], y - pt, x - pl, *i[-2:])], 0)

    return te.compute((*lead, h + pt + pb, w + pl + pr, b, k), _named(at, names), "data_pad")


def _epilogue_stages(e: Epilogue, acc, channel_axes: tuple, classes: tuple = ()):
    """The fused epilogue of accumulators ``acc`` (..., b, k): its bias, scale and residual
    placeholders (bias and scale indexed by ``channel_axes`` of acc, then b, k; the residual
    shaped like acc), the epilogue stage and the int8 output. Returns (epi, out, the
    placeholders present in argument order). ``classes`` (row axis, column axis, row
    classes, column classes): the bias is a table (border.py), indexed by the channel axes,
    the row's class and the column's class."""
    chans = tuple(acc.shape[a] for a in channel_axes) + acc.shape[-2:]
    if classes:
        ya, xa, rows, cols = classes
        bias_shape = chans[:-2] + (rows.count, cols.count) + chans[-2:]
    else:
        bias_shape = chans
    bias = te.placeholder(bias_shape, "int32", "bias") if e.bias else None
    scale = te.placeholder(chans, "int32", "scale") if e.scale else None
    resid = te.placeholder(acc.shape, "int8", "residual") if e.residual else None

    def at(*i):
        c = tuple(i[a] for a in channel_axes) + i[-2:]
        bc = c[:-2] + (rows.expr(i[ya]), cols.expr(i[xa])) + c[-2:] if classes else c
        return e.expr(acc[i], bias[bc] if bias is not None else None,
                      resid[i] if resid is not None else None,
                      scale[c] if scale is not None else None)

    epi = te.compute(acc.shape, _named(at, [a.name for a in acc.op.axes]), "epilogue")
    out = te.compute(acc.shape, lambda *i: epi[i].astype("int8"), "out")
    return epi, out, [t for t in (bias, scale, resid) if t is not None]


def _load_epilogue_inputs(s, extras, epi, out, at) -> None:
    """Load the epilogue's bias, scale and residual into the accumulator buffer per output
    tile (inside loop ``at`` of ``out``)."""
    for extra in extras:
        cached = s.cache_read(extra, "acc", [epi])
        s[cached].compute_at(s[out], at)
        s[cached].pragma(s[cached].axes[0], "dma_copy")


def _accumulator_schedule(acc, epi, out):
    """The schedule of ``out``, its GEMM (``acc``) and epilogue stages in the accumulator."""
    s = create_schedule(out)
    s[acc].set_scope("acc")
    s[epi].set_scope("acc")
    return s


def _split_vthreads(s, out, order: list, axis, n: int, what: str):
    """Split loop ``axis`` of ``out`` into ``n`` virtual threads (replacing it in the loop
    ``order`` by the thread loop and the rest); the rest."""
    _check_divides(what, axis.extent, n)
    t, rest = s[out].split(axis, axis.extent // n)
    s[out].bind_vthread(t, interleave="thread")
    i = order.index(axis)
    order[i:i + 1] = [t, rest]
    return rest


def _per_tile(s, acc, epi, out, at, store_at) -> None:
    """Compute the GEMM and the epilogue (on the ALU) per output tile, inside loop ``at`` of
    ``out``, and store the tile from loop ``store_at`` on."""
    for stage in (acc, epi):
        s[stage].compute_at(s[out], at)
    s[out].pragma(store_at, "dma_copy")
    s[epi].pragma(s[epi].axes[0], "alu")


def _load_input(s, data, padded, conv, at) -> None:
    """Load the convolution's input (the padded or row-selected stage if there is one) into
    the input buffer per input step, inside loop ``at`` of ``conv``."""
    if padded is not data:
        s[padded].set_scope("inp")
        inp = padded
    else:
        inp = s.cache_read(data, "inp", [conv])
    s[inp].compute_at(s[conv], at)
    s[inp].pragma(s[inp].axes[0], "dma_copy")


def _row_strided(spec: ConvSpec) -> bool:
    """Whether conv2d's input tiles hold only the rows the kernel reads (one kernel row, a
    row stride above 1, no padding)."""
    return spec.kh == 1 and spec.strides[0] > 1 and not any(spec.pads)


def conv2d(cfg: HwConfig, spec: ConvSpec, knobs: ConvKnobs, name: str = "conv2d") -> AcceleratorFunction:
    """Compile one conv2d layer with its epilogue for the accelerator.

    The function takes (data, kernel[, bias][, scale][, residual], out) in the packed
    layouts."""
    b, k = cfg.batch, cfg.block
    if spec.n % b or spec.c % k or spec.o % k:
        raise CompilerError(f"{name}: N={spec.n} must be a multiple of BATCH={b} and C={spec.c}, "
                            f"O={spec.o} of BLOCK={k}; pad the channels (pad_channels) first")
    nb, cb, ob = spec.n // b, spec.c // k, spec.o // k
    oh, ow = spec.oh, spec.ow
    sh, sw = spec.strides
    h, w = spec.h, spec.w
    data = te.placeholder((nb, cb, h, w, b, k), "int8", "data")
    kernel = te.placeholder((ob, cb, spec.kh, spec.kw, k, k), "int8", "kernel")
    # A row-strided 1xN convolution reads every sh-th input row only: the input tile holds
    # just those rows (a DMA with a row stride of sh rows) instead of every row between them.
    row_strided = _row_strided(spec)
    ys = 1 if row_strided else sh
    if any(spec.pads):
        padded = _pad_input(data, spec.pads, ("n", "c", "y", "x", "bb", "kk"))
    elif row_strided:
        padded = te.compute((nb, cb, oh, w, b, k),
                            lambda n, c, y, x, bb, kk: data[n, c, y * sh, x, bb, kk], "data_rows")
    else:
        padded = data
    ci = te.reduce_axis(cb, "ci")
    dy, dx = te.reduce_axis(spec.kh, "dy"), te.reduce_axis(spec.kw, "dx")
    ki = te.reduce_axis(k, "ki")
    conv = te.compute(
        (nb, ob, oh, ow, b, k),
        lambda n, o, y, x, bb, oo: te.sum(
            padded[n, ci, y * ys + dy, x * sw + dx, bb, ki].astype("int32")
            * kernel[o, ci, dy, dx, oo, ki].astype("int32"), axis=[ci, dy, dx, ki]), "conv")
    epi, out, extras = _epilogue_stages(spec.epilogue, conv, (1,),
                                        (2, 3, *spec.bias_classes) if spec.bias_classes else ())

    _check_divides("tile_h", oh, knobs.tile_h)
    _check_divides("tile_w", ow, knobs.tile_w)
    _check_divides("tile_co", ob, knobs.tile_co)
    _check_divides("tile_ci", cb, knobs.tile_ci)
    s = _accumulator_schedule(conv, epi, out)
    n_, c_, y_, x_, b_, o_ = s[out].axes
    co_o, co_i = s[out].split(c_, knobs.tile_co)
    y_o, y_i = s[out].split(y_, knobs.tile_h)
    x_o, x_i = s[out].split(x_, knobs.tile_w)
    order = [n_, co_o, y_o, x_o, co_i, y_i, x_i, b_, o_]
    if knobs.vthreads > 1:
        axis = co_o if knobs.vthread_axis == "co" else y_o
        _split_vthreads(s, out, order, axis, knobs.vthreads, f"vthreads on {knobs.vthread_axis}")
    s[out].reorder(*order)
    _per_tile(s, conv, epi, out, x_o, co_i)
    cn, cc, cy, cx, cb_, co_ = s[conv].axes
    cci, cdy, cdx, cki = s[conv].reduce_axes
    ci_o, ci_i = s[conv].split(cci, knobs.tile_ci)
    # Output rows and channel blocks become the kernel's two loops; input channels, taps and
    # output columns become its micro-ops, columns innermost so that consecutive micro-ops
    # write different accumulator rows (no read-after-write stalls in the GEMM pipeline).
    s[conv].reorder(ci_o, cn, cy, cc, ci_i, cdy, cdx, cx, cb_, co_, cki)
    s[conv].tensorize(cb_, get_intrinsic("gemm", cfg))
    s[conv].init_in_reduce_loop()
    _load_input(s, data, padded, conv, ci_o)
    wgt = s.cache_read(kernel, "wgt", [conv])
    s[wgt].compute_at(s[conv], ci_o)
    s[wgt].pragma(s[wgt].axes[0], "dma_copy")
    _load_epilogue_inputs(s, extras, epi, out, x_o)
    return build(s, [data, kernel, *extras, out], cfg, name)


def conv2d_reference(x: np.ndarray, w: np.ndarray, spec: ConvSpec, bias=None, residual=None,
                     scale=None) -> np.ndarray:
    """NCHW int8 conv2d with the epilogue, in numpy (int64 products, int32 wrap)."""
    n, c, h, wd = x.shape
    o = w.shape[0]
    pt, pl, pb, pr = spec.pads
    sh, sw = spec.strides
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    acc = np.zeros((n, o, spec.oh, spec.ow), np.int64)
    for dy in range(spec.kh):
        for dx in range(spec.kw):
            patch = xp[:, :, dy:dy + sh * (spec.oh - 1) + 1:sh, dx:dx + sw * (spec.ow - 1) + 1:sw]
            acc += np.einsum("nchw,oc->nohw", patch, w[:, :, dy, dx].astype(np.int64))
    acc = _wrap(acc)
    b = bias.astype(np.int64)[None, :, None, None] if bias is not None else None
    m = scale.astype(np.int64)[None, :, None, None] if scale is not None else None
    return spec.epilogue.apply(acc, b, residual, m)


# ---- dense -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DenseSpec:
    n: int
    k: int
    o: int
    epilogue: Epilogue = field(default_factory=Epilogue)

    @property
    def macs(self) -> int:
        return self.n * self.k * self.o


@dataclass(frozen=True)
class DenseKnobs:
    tile_n: int  # batch blocks per tile
    tile_o: int  # output blocks per tile
    tile_k: int  # input blocks per load
    vthreads: int = 1  # on output blocks


def dense(cfg: HwConfig, spec: DenseSpec, knobs: DenseKnobs, name: str = "dense") -> AcceleratorFunction:
    """Compile a dense layer (data x weight^T) with its epilogue; takes (data, weight[, bias]
    [, scale][, residual], out) in the packed layouts."""
    b, k = cfg.batch, cfg.block
    if spec.n % b or spec.k % k or spec.o % k:
        raise CompilerError(f"{name}: N={spec.n} must be a multiple of BATCH={b} and K={spec.k}, "
                            f"O={spec.o} of BLOCK={k}")
    nb, kb, ob = spec.n // b, spec.k // k, spec.o // k
    data = te.placeholder((nb, kb, b, k), "int8", "data")
    weight = te.placeholder((ob, kb, k, k), "int8", "weight")
    ko, ki = te.reduce_axis(kb, "ko"), te.reduce_axis(k, "ki")
    gemm = te.compute((nb, ob, b, k), lambda i, j, bb, oo: te.sum(
        data[i, ko, bb, ki].astype("int32") * weight[j, ko, oo, ki].astype("int32"),
        axis=[ko, ki]), "gemm")
    epi, out, extras = _epilogue_stages(spec.epilogue, gemm, (1,))
    _check_divides("tile_n", nb, knobs.tile_n)
    _check_divides("tile_o", ob, knobs.tile_o)
    _check_divides("tile_k", kb, knobs.tile_k)
    s = _accumulator_schedule(gemm, epi, out)
    i_, j_, b_, o_ = s[out].axes
    io, ii = s[out].split(i_, knobs.tile_n)
    jo, ji = s[out].split(j_, knobs.tile_o)
    order = [io, jo, ii, ji, b_, o_]
    if knobs.vthreads > 1:
        _split_vthreads(s, out, order, jo, knobs.vthreads, "vthreads")
    s[out].reorder(*order)
    _per_tile(s, gemm, epi, out, order[-5], ii)
    gi, gj, gb, go = s[gemm].axes
    gko, gki = s[gemm].reduce_axes
    k_o, k_i = s[gemm].split(gko, knobs.tile_k)
    s[gemm].reorder(k_o, gi, gj, k_i, gb, go, gki)
    s[gemm].tensorize(gb, get_intrinsic("gemm", cfg))
    s[gemm].init_in_reduce_loop()
    for t, scope in ((data, "inp"), (weight, "wgt")):
        cached = s.cache_read(t, scope, [gemm])
        s[cached].compute_at(s[gemm], k_o)
        s[cached].pragma(s[cached].axes[0], "dma_copy")
    _load_epilogue_inputs(s, extras, epi, out, order[-5])
    return build(s, [data, weight, *extras, out], cfg, name)


def dense_reference(x: np.ndarray, w: np.ndarray, spec: DenseSpec, bias=None, residual=None,
                    scale=None):
    acc = _wrap(x.astype(np.int64) @ w.astype(np.int64).T)
    b = bias.astype(np.int64)[None, :] if bias is not None else None
    m = scale.astype(np.int64)[None, :] if scale is not None else None
    return spec.epilogue.apply(acc, b, residual, m)


# ---- packing -----------------------------------------------------------------------------


def pad_channels(x: np.ndarray, axis: int, multiple: int) -> np.ndarray:
    """Zero-pad one axis up to a multiple (channel counts that are not multiples of BLOCK)."""
    extra = (-x.shape[axis]) % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return np.pad(x, widths)


def pack_nchw(x: np.ndarray, b: int, k: int) -> np.ndarray:
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n // b, b, c // k, k, h, w).transpose(0, 2, 4, 5, 1, 3))


def unpack_nchw(x: np.ndarray) -> np.ndarray:
    nb, cb, h, w, b, k = x.shape
    return x.transpose(0, 4, 1, 5, 2, 3).reshape(nb * b, cb * k, h, w)


def pack_oihw(w: np.ndarray, k: int) -> np.ndarray:
    o, i, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(o // k, k, i // k, k, kh, kw).transpose(0, 2, 4, 5, 1, 3))


def pack_bias(bias: np.ndarray, b: int, k: int) -> np.ndarray:
    o = bias.shape[0]
    return np.ascontiguousarray(np.broadcast_to(bias.reshape(o // k, 1, k), (o // k, b, k))).astype(np.int32)
