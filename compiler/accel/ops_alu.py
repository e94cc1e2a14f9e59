"""Accelerator operators that run on the ALU alone (no GEMM): int8 max pooling, int8
global average pooling, and the element-wise int8 Add (QAdd) and Relu.

Written directly against the driver's stream builder (``Device.load_2d``, ``alu``,
``store_2d`` and dependency tokens) rather than through te schedules: a pooling window is
a handful of MAX micro-ops over rows of one accumulator tile, and its padding is not the
DMA's zero padding (see below).

Layout: data and output are packed NCHW{b}n{k}c int8 (compiler/accel/ops.py); one ACC row
(or one ACC_8BIT / OUT element in DRAM) is one pixel of b images x k channels.

Max pooling, per tile of output rows x columns of one (batch block, channel block):

1. ``ACC_8BIT`` LOAD of the input window the tile reads into ACC rows ``T`` (sign-extended),
   with the DMA's zero padding where the window leaves the image;
2. ALU ``ADD -128`` on exactly the padding rows, which the DMA made 0: max pooling pads
   with -inf, and -128 is the smallest int8, so a padding pixel never wins unless the whole
   window is padding (the reference, compiler/graph/ops.py max_pool, fills with -128 too);
3. ALU ``MIN -128`` on the tile's output rows ``O`` (whatever they held, they are now
   <= -128, below every int8 value), then one ALU ``MAX`` with a micro-op per window tap:
   the instruction's two loops walk output rows and columns (strides in the source
   factors), the micro-ops the kernel taps. When it takes fewer micro-ops
   (``pool_passes``), the maximum is separable: first each input row's (or column's)
   window maxima, in place in the input tile (kw - 1 MAX per input row and output column),
   then the MIN and one MAX per kernel row (column) into ``O``: ResNet's 3x3 stride-2
   pool takes about 8 micro-ops per output instead of 10, a 5x5 stride-1 one about 11
   instead of 26;
4. STORE of the OUT view of ``O`` (the low byte of values in [-128, 127]: exact).

Two ``O`` buffers alternate so that a tile's store overlaps the next tile's ALU work; the
store -> compute tokens say when a buffer may be written again.

Global average pooling (compiler/graph/qops.py qglobal_average_pool: ``(sum * multiplier +
2^(shift-1) + offset) >> shift``, clipped, in int32 arithmetic), per group of channel blocks of one
batch block: ``ACC_8BIT`` LOAD of their pixels (contiguous in DRAM), one ALU ``ADD`` whose
inner loop has destination factor 0 (each channel block's pixels summed into one row, after
a ``MUL 0`` that clears it), then ``MUL`` by a row holding the multiplier and ``ADD`` of a
row holding the rounding constant and the offset (both int32 constants loaded once: they need not fit the
16-bit immediate), ``SHR``, ``MAX -128``, ``MIN 127`` and the store of those rows.

Element-wise nodes see their operands as flat runs of ACC rows (two values of one shape
have the same packed layout, element for element). QAdd (qops.qadd: ``((a - za) * ma + (b -
zb) * mb + 2^(shift-1)) >> shift`` + zo, clipped, int32 arithmetic), per chunk of rows:
``ACC_8BIT`` LOADs of both operands, ``MUL`` of each by a row holding its multiplier,
``ADD`` of the two and of the rounding row (which holds ``- za * ma - zb * mb`` too), ``SHR``,
``ADD zo`` (when not 0), ``MAX -128``, ``MIN 127``, store. An int8 Relu is one ``MAX 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from celosia.config import LOOP_ITER_BITS, MEM_PAD_BITS, MEM_SIZE_BITS, HwConfig
from celosia.errors import CompilerError
from celosia.isa import AluOp, MemType, Module

__all__ = ["PoolSpec", "PoolKnobs", "pool_knobs", "maxpool", "AluProgram",
           "maxpool_reference", "GapSpec", "global_average_pool", "gap_constants",
           "EltSpec", "elementwise", "elt_constants"]

_MAX_PAD = (1 << MEM_PAD_BITS) - 1  # the DMA's pad fields are 4 bits
_MAX_SIZE = (1 << MEM_SIZE_BITS) - 1  # its sizes and row stride, 16
_MAX_ITER = (1 << LOOP_ITER_BITS) - 1  # iterations of a GEMM/ALU loop


@dataclass(frozen=True)
class PoolSpec:
    """A 2-D max pooling on packed data: channels ``c`` padded to BLOCK, the output size
    given (it depends on ceil_mode), padding before each axis (the window of output row y
    starts at input row y * stride_h - pad_top; rows outside the image are -inf)."""

    n: int
    c: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    stride_h: int = 1
    stride_w: int = 1
    dil_h: int = 1
    dil_w: int = 1
    pad_top: int = 0
    pad_left: int = 0

    @property
    def macs(self) -> int:
        return 0

    @property
    def span_h(self) -> int:
        return (self.kh - 1) * self.dil_h + 1

    @property
    def span_w(self) -> int:
        return (self.kw - 1) * self.dil_w + 1


@dataclass(frozen=True)
class PoolKnobs:
    tile_h: int  # output rows per tile
    tile_w: int  # output columns per tile


def _window(lo_out: int, hi_out: int, stride: int, pad: int, span: int, size: int):
    """(first input index, input extent incl. padding, padding before, padding after) of
    output positions [lo_out, hi_out) along one axis."""
    r0 = lo_out * stride - pad
    r1 = (hi_out - 1) * stride - pad + span
    return r0, r1 - r0, max(0, -r0), max(0, r1 - size)


def _tiles(extent: int, tile: int):
    return [(a, min(a + tile, extent)) for a in range(0, extent, tile)]


def _check_axis(what: str, spec_size: int, out: int, tile: int, stride: int, pad: int,
                span: int) -> str | None:
    for a, b in _tiles(out, tile):
        r0, ext, p0, p1 = _window(a, b, stride, pad, span, spec_size)
        if max(p0, p1) > _MAX_PAD:
            return (f"a window reaches {max(p0, p1)} {what} past the image, more than the "
                    f"DMA's padding of {_MAX_PAD}")
        if p0 + p1 >= ext:
            return f"a tile of output {what} reads only padding"
    return None


def pool_knobs(cfg: HwConfig, spec: PoolSpec) -> PoolKnobs:
    """The largest tiles (whole rows first) whose input window and two output buffers fit
    the accumulator buffer; a CompilerError names what does not fit."""
    if spec.w > _MAX_SIZE:
        raise CompilerError(f"max pooling: rows of {spec.w} pixels are further apart than the "
                            f"DMA's row stride reaches ({_MAX_SIZE} elements)")
    best = None
    for tw in sorted({spec.ow, *range(1, spec.ow + 1)}, reverse=True):
        iw = (tw - 1) * spec.stride_w + spec.span_w
        if iw > cfg.uop_depth // 2:
            continue
        for th in range(spec.oh, 0, -1):
            ih = (th - 1) * spec.stride_h + spec.span_h
            if ih * iw + 2 * th * tw <= cfg.acc_depth:
                break
        else:
            continue
        if ih * iw + 2 * th * tw > cfg.acc_depth:
            continue
        key = (th * tw, tw)
        if best is None or key > best[0]:
            best = (key, PoolKnobs(th, tw))
        if tw == spec.ow:
            break  # whole rows fit: no reason to split them
    if best is None:
        raise CompilerError(f"max pooling {spec.kh}x{spec.kw}: not even one output pixel's "
                            f"window fits the {cfg.acc_depth}-row accumulator buffer")
    knobs = best[1]
    for what, args in (("rows", (spec.h, spec.oh, knobs.tile_h, spec.stride_h, spec.pad_top,
                                 spec.span_h)),
                       ("columns", (spec.w, spec.ow, knobs.tile_w, spec.stride_w,
                                    spec.pad_left, spec.span_w))):
        problem = _check_axis(what, *args)
        if problem:
            raise CompilerError(f"max pooling: {problem}")
    return knobs


class AluProgram:
    """An accelerator function emitted by a Python generator over the driver (the same
    interface as compiler/accel/build.py's AcceleratorFunction: ``arg_specs`` and
    ``bind``)."""

    def __init__(self, name: str, config: HwConfig, args, emit):
        self.name = name
        self.config = config
        self._args = args  # [(name, dtype, shape)]: packed, the last two axes one element
        self._emit = emit  # emit(dev, buffers)

    def arg_specs(self) -> list[tuple[str, str, tuple[int, ...], int]]:
        return [(n, dt, tuple(s), max(64, int(np.prod(s[-2:])) * np.dtype(dt).itemsize))
                for n, dt, s in self._args]

    def bind(self, dev, buffers) -> list:
        if dev.config != self.config:
            raise CompilerError(f"{self.name} was compiled for another configuration")
        if len(buffers) != len(self._args):
            raise CompilerError(f"{self.name} takes {len(self._args)} buffers, given "
                                f"{len(buffers)}")
        for (n, dt, shape, align), d in zip(self.arg_specs(), buffers):
            need = int(np.prod(shape)) * np.dtype(dt).itemsize
            if d.nbytes < need or d.addr % align:
                raise CompilerError(f"{self.name}: the DRAM buffer for {n} must hold {need} "
                                    f"bytes at a multiple of {align}")
        self._emit(dev, buffers)
        return []

    def __call__(self, dev, *arrays: np.ndarray) -> dict:
        """Run once on ``dev`` with numpy arrays (outputs updated in place), for tests."""
        specs = self.arg_specs()
        bufs = [dev.upload(np.ascontiguousarray(a), align=s[3]) for a, s in zip(arrays, specs)]
        try:
            self.bind(dev, bufs)
            stats = dev.synchronize()
            for d, a in zip(bufs, arrays):
                a[...] = d.read(a.dtype, a.shape)
        finally:
            for d in bufs:
                dev.free(d)
        return stats


def maxpool(cfg: HwConfig, spec: PoolSpec, knobs: PoolKnobs, name: str = "maxpool") -> AluProgram:
    """Max pooling on packed int8 data (module docstring); takes (data, out)."""
    b, k = cfg.batch, cfg.block
    if spec.n % b or spec.c % k:
        raise CompilerError(f"{name}: N={spec.n} must be a multiple of BATCH={b} and C="
                            f"{spec.c} of BLOCK={k}")
    nb, cb = spec.n // b, spec.c // k
    th, tw = knobs.tile_h, knobs.tile_w
    t_rows = ((th - 1) * spec.stride_h + spec.span_h) * ((tw - 1) * spec.stride_w + spec.span_w)
    if t_rows + 2 * th * tw > cfg.acc_depth:
        raise CompilerError(f"{name}: tiles of {th}x{tw} outputs need {t_rows + 2 * th * tw} "
                            f"accumulator rows, more than {cfg.acc_depth}")
    rows = _tiles(spec.oh, th)
    cols = _tiles(spec.ow, tw)
    C, S = Module.COMPUTE, Module.STORE

    def emit(dev, bufs):
        data, out = bufs
        t = 0
        for n in range(nb):
            for c in range(cb):
                plane_in = (n * cb + c) * spec.h * spec.w
                plane_out = (n * cb + c) * spec.oh * spec.ow
                for y0, y1 in rows:
                    r0, ih, pt, pb = _window(y0, y1, spec.stride_h, spec.pad_top, spec.span_h,
                                             spec.h)
                    for x0, x1 in cols:
                        q0, iw, pl, pr = _window(x0, x1, spec.stride_w, spec.pad_left,
                                                 spec.span_w, spec.w)
                        o_base = t_rows + (t % 2) * th * tw
                        if t >= 2:
                            dev.dep_pop(S, C)  # the store of tile t-2 has read this buffer
                        dev.load_2d(data, plane_in + (r0 + pt) * spec.w + q0 + pl,
                                    iw - pl - pr, ih - pt - pb, spec.w, y_pad_0=pt, y_pad_1=pb,
                                    x_pad_0=pl, x_pad_1=pr, sram_index=0,
                                    mem_type=MemType.ACC_8BIT)
                        _fill_padding(dev, ih, iw, pt, pb, pl, pr)
                        _pool_tile(dev, spec, y1 - y0, x1 - x0, ih, iw, o_base)
                        dev.dep_push(C, S)
                        dev.dep_pop(C, S)
                        dev.store_2d(o_base, out, plane_out + y0 * spec.ow + x0, x1 - x0,
                                     y1 - y0, spec.ow)
                        dev.dep_push(S, C)
                        t += 1
        for _ in range(min(t, 2)):  # take the last stores' tokens: none left for later programs
            dev.dep_pop(S, C)

    return AluProgram(name, cfg, [("data", "int8", (nb, cb, spec.h, spec.w, b, k)),
                                  ("out", "int8", (nb, cb, spec.oh, spec.ow, b, k))], emit)


def _fill_padding(dev, ih, iw, pt, pb, pl, pr):
    """ADD -128 to the tile's padding rows (0 after the DMA's zero padding)."""
    def rows(first, count):
        def record(kb):
            kb.loop(count, 1, 0)
            kb.push(first, first)
        return record

    if pt:
        dev.alu(("maxpool-pad", 0, pt * iw), rows(0, pt * iw), AluOp.ADD, imm=-128)
    if pb:
        dev.alu(("maxpool-pad", (ih - pb) * iw, pb * iw), rows((ih - pb) * iw, pb * iw),
                AluOp.ADD, imm=-128)
    if pl or pr:
        inner = ih - pt - pb

        def record(kb):
            if inner > 1:
                kb.loop(inner, iw, 0)
            for x in (*range(pl), *range(iw - pr, iw)):
                kb.push(pt * iw + x, pt * iw + x)
        dev.alu(("maxpool-pad-cols", pt, inner, iw, pl, pr), record, AluOp.ADD, imm=-128)


def pool_passes(spec: PoolSpec, oh: int, ow: int, ih: int, iw: int) -> tuple[str, int]:
    """How a tile of ``oh`` x ``ow`` outputs over an ``ih`` x ``iw`` input tile is reduced,
    and its ALU micro-ops: "direct" (every window tap into the output rows, kh x kw + 1 per
    output), "rows" (each input row's windows first, in place, kw - 1 per input row and
    output column, then kh + 1 per output) or "columns" (each input column's windows first,
    in place, kh - 1 per output row and input column, then kw + 1 per output); the fewest,
    counting an ALU instruction's pipeline fill (10 cycles) per extra pass."""
    direct = (spec.kh * spec.kw + 1) * oh * ow
    rows = (spec.kw - 1) * ih * ow + (spec.kh + 1) * oh * ow + 10
    cols = (spec.kh - 1) * oh * iw + (spec.kw + 1) * oh * ow + 10
    return min((direct, "direct"), (rows, "rows"), (cols, "columns"))[::-1]


def _pool_tile(dev, spec: PoolSpec, oh, ow, ih, iw, o_base):
    """O = the max over each window of the input tile (ACC rows from 0): separable in two
    passes when that takes fewer micro-ops (``pool_passes``). The first pass works in place
    in the input tile: output x's row (column) maxima replace its first tap, which only
    outputs before x (earlier micro-ops) read as one of their taps, and a later output never
    does (its taps lie further on)."""
    how, _ = pool_passes(spec, oh, ow, ih, iw)
    sh, sw, dh, dw = spec.stride_h, spec.stride_w, spec.dil_h, spec.dil_w
    if how == "direct":
        taps = [(dy * dh, dx * dw) for dy in range(spec.kh) for dx in range(spec.kw)]
    elif how == "rows":
        def record(kb):
            if ih > 1:
                kb.loop(ih, iw, iw)
            if ow > 1:
                kb.loop(ow, sw, sw)
            for dx in range(1, spec.kw):
                kb.push(0, dx * dw)
        dev.alu(("maxpool-rows", ih, ow, iw, sw, dw, spec.kw), record, AluOp.MAX)
        taps = [(dy * dh, 0) for dy in range(spec.kh)]
    else:
        def record(kb):
            if oh > 1:
                kb.loop(oh, sh * iw, sh * iw)
            if iw > 1:
                kb.loop(iw, 1, 1)
            for dy in range(1, spec.kh):
                kb.push(0, dy * dh * iw)
        dev.alu(("maxpool-cols", oh, iw, sh, dh, spec.kh), record, AluOp.MAX)
        taps = [(0, dx * dw) for dx in range(spec.kw)]
    _max_window(dev, spec, taps, oh, ow, iw, o_base)


def _max_window(dev, spec: PoolSpec, taps, oh, ow, iw, o_base):
    """O = max over the taps of the input tile (its rows start at ACC row 0)."""
    def init(kb):
        kb.loop(oh * ow, 1, 0)
        kb.push(o_base, o_base)

    dev.alu(("maxpool-init", o_base, oh * ow), init, AluOp.MIN, imm=-128)

    def record(kb):
        if oh > 1:
            kb.loop(oh, ow, spec.stride_h * iw)
        if ow > 1:
            kb.loop(ow, 1, spec.stride_w)
        for dy, dx in taps:
            kb.push(o_base, dy * iw + dx)

    dev.alu(("maxpool-max", o_base, oh, ow, iw, spec.stride_h, spec.stride_w, tuple(taps)),
            record, AluOp.MAX)


def maxpool_reference(x: np.ndarray, spec: PoolSpec) -> np.ndarray:
    """NCHW int8 max pooling with -128 padding (the definition, compiler/graph/ops.py)."""
    from ..graph.ops import max_pool

    pb = max(0, (spec.oh - 1) * spec.stride_h + spec.span_h - spec.h - spec.pad_top)
    pr = max(0, (spec.ow - 1) * spec.stride_w + spec.span_w - spec.w - spec.pad_left)
    attrs = {"kernel_shape": (spec.kh, spec.kw), "strides": (spec.stride_h, spec.stride_w),
             "dilations": (spec.dil_h, spec.dil_w),
             "pads": (spec.pad_top, spec.pad_left, pb, pr), "ceil_mode": 0}
    y = max_pool(attrs, x)
    y = y[0] if isinstance(y, tuple) else y
    return y[:, :, :spec.oh, :spec.ow]


# ---- global average pooling ------------------------------------------------------------


@dataclass(frozen=True)
class GapSpec:
    """int8 global average pooling of packed [n, c, h, w] (c padded to BLOCK) to [n, c, 1, 1]:
    ``(sum * multiplier + 2^(shift-1) + offset) >> shift``, clipped to int8."""

    n: int
    c: int
    h: int
    w: int
    multiplier: int
    shift: int
    offset: int = 0

    @property
    def macs(self) -> int:
        return 0


def gap_constants(cfg: HwConfig, spec: GapSpec) -> np.ndarray:
    """The int32 rows the program loads: the multiplier and the rounding constant (with
    the offset, wrapped to int32)."""
    rows = np.empty((2, cfg.batch, cfg.block), np.int32)
    rows[0] = np.int32(np.int64(spec.multiplier).astype(np.int32))
    rows[1] = np.int64((1 << (spec.shift - 1)) + spec.offset).astype(np.int32)
    return rows


def global_average_pool(cfg: HwConfig, spec: GapSpec, name: str = "gap") -> AluProgram:
    """Takes (data, constants (gap_constants), out); see the module docstring."""
    b, k = cfg.batch, cfg.block
    if spec.n % b or spec.c % k:
        raise CompilerError(f"{name}: N={spec.n} must be a multiple of BATCH={b} and C="
                            f"{spec.c} of BLOCK={k}")
    if not 1 <= spec.shift <= 31:
        raise CompilerError(f"{name}: shift {spec.shift} must be in [1, 31]")
    nb, cb, hw = spec.n // b, spec.c // k, spec.h * spec.w
    # ACC rows: 2 constants, then two result slots of g rows, then the pixels.
    free = cfg.acc_depth - 2
    g = min(cb, free // (hw + 2)) if hw + 2 <= free else 0
    chunk = hw if g else free - 2  # pixels per load when one plane does not fit
    if chunk < 1:
        raise CompilerError(f"{name}: the accumulator buffer ({cfg.acc_depth} rows) is too "
                            f"small")
    g = max(g, 1)
    C, S = Module.COMPUTE, Module.STORE

    def emit(dev, bufs):
        data, consts, out = bufs
        dev.load_2d(consts, 0, 2, 1, 2, sram_index=0, mem_type=MemType.ACC)
        t = 0
        for n in range(nb):
            for c0 in range(0, cb, g):
                gg = min(g, cb - c0)
                res = 2 + (t % 2) * g
                pix = 2 + 2 * g
                if t >= 2:
                    dev.dep_pop(S, C)

                def clear(kb, gg=gg, res=res):
                    kb.loop(gg, 1, 0)
                    kb.push(res, res)
                dev.alu(("gap-clear", res, gg), clear, AluOp.MUL, imm=0)
                if chunk == hw:  # gg whole planes in one load, one ADD
                    dev.load_2d(data, (n * cb + c0) * hw, gg * hw, 1, gg * hw, sram_index=pix,
                                mem_type=MemType.ACC_8BIT)

                    def add(kb, gg=gg, res=res):
                        if gg > 1:
                            kb.loop(gg, 1, hw)
                        if hw > 1:
                            kb.loop(hw, 0, 1)
                        kb.push(res, pix)
                    dev.alu(("gap-sum", res, gg, hw, pix), add, AluOp.ADD)
                else:  # one plane in chunks of pixels
                    for p0 in range(0, hw, chunk):
                        m = min(chunk, hw - p0)
                        dev.load_2d(data, (n * cb + c0) * hw + p0, m, 1, m, sram_index=pix,
                                    mem_type=MemType.ACC_8BIT)

                        def add(kb, m=m, res=res):
                            if m > 1:
                                kb.loop(m, 0, 1)
                            kb.push(res, pix)
                        dev.alu(("gap-sum", res, 1, m, pix), add, AluOp.ADD)

                def by_row(row, gg=gg, res=res):
                    def record(kb):
                        if gg > 1:
                            kb.loop(gg, 1, 0)
                        kb.push(res, row)
                    return record
                dev.alu(("gap-mul", res, gg), by_row(0), AluOp.MUL)
                dev.alu(("gap-round", res, gg), by_row(1), AluOp.ADD)
                dev.alu(("gap-shr", res, gg, spec.shift), by_row(res), AluOp.SHR, imm=spec.shift)
                dev.alu(("gap-max", res, gg), by_row(res), AluOp.MAX, imm=-128)
                dev.alu(("gap-min", res, gg), by_row(res), AluOp.MIN, imm=127)
                dev.dep_push(C, S)
                dev.dep_pop(C, S)
                dev.store_2d(res, out, n * cb + c0, gg, 1, gg)
                dev.dep_push(S, C)
                t += 1
        for _ in range(min(t, 2)):
            dev.dep_pop(S, C)

    return AluProgram(name, cfg, [("data", "int8", (nb, cb, spec.h, spec.w, b, k)),
                                  ("constants", "int32", (2, b, k)),
                                  ("out", "int8", (nb, cb, 1, 1, b, k))], emit)


# ---- element-wise ----------------------------------------------------------------------


@dataclass(frozen=True)
class EltSpec:
    """An element-wise int8 node over ``rows`` packed elements (ACC rows) of each operand
    (``shape``: the packed shape, for the arguments): ``op`` "add" (QAdd, with its
    multipliers and shift), "mul" (QMul, one multiplier) or "relu". A "mul" whose
    ``gate_rows`` is above 1 multiplies each run of ``gate_rows`` rows (one channel block's
    pixels) by one row of a per-channel gate [N, C, 1, 1] (packed: ``rows / gate_rows``
    rows), the first argument when ``gate_first``."""

    op: str
    shape: tuple
    multipliers: tuple = ()
    shift: int = 0
    gate_rows: int = 1
    gate_first: bool = False
    zero_points: tuple = (0, 0, 0)  # (za, zb, zo): qops.qadd's and qops.qmul's zero_points

    @property
    def macs(self) -> int:
        return 0

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-2]))


def elt_constants(cfg: HwConfig, spec: EltSpec) -> np.ndarray:
    """The int32 rows a QAdd or QMul loads: its multipliers (two, or one) and the rounding
    constant; a QAdd's holds its operands' zero points too, ``2^(shift-1) - za * ma - zb *
    mb`` modulo 2^32 (so ``a * ma + b * mb`` plus it is ``(a - za) * ma + (b - zb) * mb +
    2^(shift-1)`` in int32 arithmetic, wrap-around included)."""
    rows = np.empty((len(spec.multipliers) + 1, cfg.batch, cfg.block), np.int32)
    for i, m in enumerate(spec.multipliers):
        rows[i] = np.int32(np.int64(m).astype(np.int32))
    constant = 1 << (spec.shift - 1)
    if spec.op == "add":
        za, zb, _ = (int(z) for z in spec.zero_points)
        ma, mb = (int(m) for m in spec.multipliers)
        constant -= za * ma + zb * mb
    rows[-1] = np.int32((constant + 2**31) % 2**32 - 2**31)
    return rows


def _add_imm(dev, r0, n, imm, tag):
    """ADD of the immediate ``imm`` to ACC rows [r0, r0 + n) (nothing when it is 0)."""
    if not imm:
        return

    def rows(kb):
        if n > 1:
            kb.loop(n, 1, 1)
        kb.push(r0, r0)
    dev.alu((tag, r0, n, imm), rows, AluOp.ADD, imm=imm)


def _requantize_rows(dev, ra, n, shift, zero_point=0):
    """SHR by ``shift``, plus ``zero_point``, then clip to int8 (MAX -128, MIN 127), of ACC
    rows [ra, ra + n)."""
    def rows(kb):
        if n > 1:
            kb.loop(n, 1, 1)
        kb.push(ra, ra)
    dev.alu(("elt-shr", ra, n, shift), rows, AluOp.SHR, imm=shift)
    _add_imm(dev, ra, n, zero_point, "elt-zero-point")
    dev.alu(("elt-max", ra, n, -128), rows, AluOp.MAX, imm=-128)
    dev.alu(("elt-min", ra, n, 127), rows, AluOp.MIN, imm=127)


def elementwise(cfg: HwConfig, spec: EltSpec, name: str = "elementwise") -> AluProgram:
    """Takes (a, b, constants (elt_constants), out) for "add" and "mul", (a, out) for
    "relu"."""
    if spec.op == "mul":
        return _qmul(cfg, spec, name)
    add = spec.op == "add"
    if spec.op not in ("add", "relu"):
        raise CompilerError(f"{name}: no element-wise {spec.op!r} on the ALU")
    if add and (not 1 <= spec.shift <= 31 or len(spec.multipliers) != 2):
        raise CompilerError(f"{name}: QAdd needs two multipliers and a shift in [1, 31]")
    base = 3 if add else 0
    per = 2 if add else 1  # operand row blocks per slot
    m = min(spec.rows, (cfg.acc_depth - base) // (2 * per))
    if m < 1:
        raise CompilerError(f"{name}: the accumulator buffer ({cfg.acc_depth} rows) is too small")
    C, S = Module.COMPUTE, Module.STORE

    def emit(dev, bufs):
        if add:
            a, b, consts, out = bufs
            dev.load_2d(consts, 0, 3, 1, 3, sram_index=0, mem_type=MemType.ACC)
        else:
            a, out = bufs
        for t, r0 in enumerate(range(0, spec.rows, m)):
            n = min(m, spec.rows - r0)
            ra = base + (t % 2) * per * m
            rb = ra + m
            if t >= 2:
                dev.dep_pop(S, C)
            dev.load_2d(a, r0, n, 1, n, sram_index=ra, mem_type=MemType.ACC_8BIT)

            def rows(dst, src, src_step=0, n=n):
                def record(kb):
                    if n > 1:
                        kb.loop(n, 1, src_step)
                    kb.push(dst, src)
                return record
            if add:
                dev.load_2d(b, r0, n, 1, n, sram_index=rb, mem_type=MemType.ACC_8BIT)
                dev.alu(("qadd-mul", ra, n, 0), rows(ra, 0), AluOp.MUL)
                dev.alu(("qadd-mul", rb, n, 1), rows(rb, 1), AluOp.MUL)
                dev.alu(("qadd-add", ra, n, rb), rows(ra, rb, 1), AluOp.ADD)
                dev.alu(("qadd-round", ra, n), rows(ra, 2), AluOp.ADD)
                _requantize_rows(dev, ra, n, spec.shift, int(spec.zero_points[2]))
            else:
                dev.alu(("elt-max", ra, n, 0), rows(ra, ra), AluOp.MAX, imm=0)
            dev.dep_push(C, S)
            dev.dep_pop(C, S)
            dev.store_2d(ra, out, r0, n, 1, n)
            dev.dep_push(S, C)
        for _ in range(min(-(-spec.rows // m), 2)):
            dev.dep_pop(S, C)

    shape = tuple(spec.shape)
    args = [("a", "int8", shape)]
    if add:
        args += [("b", "int8", shape), ("constants", "int32", (3, cfg.batch, cfg.block))]
    return AluProgram(name, cfg, args + [("out", "int8", shape)], emit)


def _qmul(cfg: HwConfig, spec: EltSpec, name: str) -> AluProgram:
    """QMul (qops.qmul: ``((a - za) * (b - zb) * m + 2^(shift-1)) >> shift`` + zo, clipped,
    int32 arithmetic; the zero points are ADDs of immediates)
    of ``a`` by ``b``, a value of a's shape (``gate_rows`` 1) or a per-channel gate (one row
    per ``gate_rows`` rows of a). Per chunk of whole runs of ``gate_rows`` rows (or, when a
    run does not fit, of part of one run): ``ACC_8BIT`` LOADs of a's rows and of the gate
    rows they use, ``MUL`` of a by b (the gate's row repeated by a micro-op loop whose
    source factor is 0), ``MUL`` by the multiplier row, ``ADD`` of the rounding row, ``SHR``,
    ``MAX -128``, ``MIN 127``, store; with a gate, its rows are multiplied by m first
    (fewer rows than a's). The result is qmul's bit for bit: MUL keeps the low 32 bits, and
    those of a product do not depend on the order of its factors."""
    g = spec.gate_rows
    if not 1 <= spec.shift <= 31 or len(spec.multipliers) != 1:
        raise CompilerError(f"{name}: QMul needs one multiplier and a shift in [1, 31]")
    if g < 1 or spec.rows % g:
        raise CompilerError(f"{name}: {spec.rows} rows are not whole runs of {g} gate rows")
    base = 2  # the multiplier and the rounding rows
    free = (cfg.acc_depth - base) // 2  # rows of one of two slots
    if g + 1 <= free:  # whole runs: planes of g rows and their gate rows
        planes = min(spec.rows // g, free // (g + 1), _MAX_ITER)
        m = planes * g
    else:  # part of one run per chunk, with its one gate row
        planes, m = 1, min(free - 1, _MAX_ITER)
    if m < 1:
        raise CompilerError(f"{name}: the accumulator buffer ({cfg.acc_depth} rows) is too small")
    chunks = []  # (first row of a, rows, first gate row, gate rows)
    if m % g == 0:
        chunks = [(r0, min(m, spec.rows - r0), r0 // g, -(-min(m, spec.rows - r0) // g))
                  for r0 in range(0, spec.rows, m)]
    else:
        for p in range(spec.rows // g):
            chunks += [(p * g + q0, min(m, g - q0), p, 1) for q0 in range(0, g, m)]
    C, S = Module.COMPUTE, Module.STORE
    # a's and b's zero points as the program sees them (a: the operand of a's shape)
    za, zb, zo = (int(z) for z in spec.zero_points)
    if spec.gate_first:
        za, zb = zb, za

    def emit(dev, bufs):
        a, b, consts, out = bufs
        if spec.gate_first:
            a, b = b, a
        dev.load_2d(consts, 0, 2, 1, 2, sram_index=0, mem_type=MemType.ACC)
        for t, (r0, n, q0, nq) in enumerate(chunks):
            ra = base + (t % 2) * (m + planes)
            rb = ra + m
            if t >= 2:
                dev.dep_pop(S, C)
            dev.load_2d(a, r0, n, 1, n, sram_index=ra, mem_type=MemType.ACC_8BIT)
            dev.load_2d(b, q0, nq, 1, nq, sram_index=rb, mem_type=MemType.ACC_8BIT)
            # the operands' zero points off first: (a - za) and (b - zb), each exact in int32
            _add_imm(dev, ra, n, -za, "qmul-za")
            _add_imm(dev, rb, nq, -zb, "qmul-zb")

            def by_gate(kb, n=n, nq=nq):
                # row ra + p*g + i times gate row rb + p (g == 1: row for row)
                run = min(n, g)
                if nq > 1:
                    kb.loop(nq, run, 1)
                if run > 1:
                    kb.loop(run, 1, 0)
                kb.push(ra, rb)

            def by_row(row, n=n):
                def record(kb):
                    if n > 1:
                        kb.loop(n, 1, 0)
                    kb.push(ra, row)
                return record
            if g > 1:  # the multiplier on the gate's rows, fewer than a's
                def gate_m(kb, nq=nq):
                    if nq > 1:
                        kb.loop(nq, 1, 0)
                    kb.push(rb, 0)
                dev.alu(("qmul-gate-m", rb, nq), gate_m, AluOp.MUL)
            dev.alu(("qmul-gate", ra, rb, n, nq, min(n, g)), by_gate, AluOp.MUL)
            if g == 1:
                dev.alu(("qmul-m", ra, n), by_row(0), AluOp.MUL)
            dev.alu(("qmul-round", ra, n), by_row(1), AluOp.ADD)
            _requantize_rows(dev, ra, n, spec.shift, zo)
            dev.dep_push(C, S)
            dev.dep_pop(C, S)
            dev.store_2d(ra, out, r0, n, 1, n)
            dev.dep_push(S, C)
        for _ in range(min(len(chunks), 2)):
            dev.dep_pop(S, C)

    shape = tuple(spec.shape)
    gate = (*shape[:2], 1, 1, *shape[-2:]) if g > 1 else shape
    operands = [("gate", "int8", gate), ("a", "int8", shape)] if spec.gate_first else \
        [("a", "int8", shape), ("b", "int8", gate)]
    return AluProgram(name, cfg, operands + [("constants", "int32", (2, cfg.batch, cfg.block)),
                                             ("out", "int8", shape)], emit)
