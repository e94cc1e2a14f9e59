"""Grouped convolution (depthwise included) on the GEMM core, with conv2d's fused epilogue,
per-side padding and a stride per axis.

The mapping: block-diagonal GEMM tiles. Channels are grouped into *super-groups*: the fewest
consecutive groups whose input channels and whose output channels both fill whole BLOCK-channel
blocks (``gs`` groups: ``gs * C/groups`` and ``gs * O/groups`` multiples of BLOCK). An
output channel block then reads only the input channel blocks of its own super-group, so the
layer is ``S`` independent convolutions of ``cpb`` input blocks into ``opb`` output blocks
each, and the kernel is packed per super-group as (S, opb, cpb, KH, KW, k, k) with the
weights of other groups inside a super-group zero. For a depthwise layer (and any grouping
whose channels per group divide BLOCK) ``cpb = opb = 1``: each k x k weight block is
block-diagonal, and the GEMM reduces over the taps only (one micro-op per tap per output
pixel, 1/BLOCK of the core's MACs doing useful work). With ``groups = 1`` it is a plain
convolution (one super-group): the partitioner uses it for the asymmetric padding and
per-axis strides conv2d does not take.

The packed data, output, bias and scale are the same DRAM bytes as conv2d's
(NCHW{b}n{k}c with channels padded to BLOCK); only the tensors' shapes split the channel
block axis into (super-group, block within it). Where the groups fill less than one
super-group, or the super-groups do not end where the channel padding starts (3 channels
per group, say), the layer is one super-group of all the channel blocks (a block-sparse
kernel), as long as the GEMM core then does at most BLOCK times the layer's multiply-adds
(``group_layout_problem`` says when not).

Why not the ALU (a per-channel multiply-add on accumulator rows): see docs/compiler.md,
"Grouped and depthwise convolutions".
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CompilerError

from ..tensor import te
from .border import bias_rows, bias_uops
from .build import AcceleratorFunction, build
from .intrin import get_intrinsic
from .ops import (Epilogue, _accumulator_schedule, _check_divides, _ConvOutput,
                  _epilogue_stages, _load_epilogue_inputs, _load_input, _pad_input,
                  _per_tile, _split_vthreads, _wrap)

__all__ = ["GroupConvSpec", "GroupConvKnobs", "group_conv2d", "group_conv2d_reference",
           "group_layout_problem", "pack_group_kernel", "group_conv_knobs",
           "group_conv_candidates", "estimate_group_conv", "measure_group_conv",
           "crop_taps"]


def _super_group(cpg: int, opg: int, k: int) -> int:
    """Groups per super-group: the fewest whose input and output channels fill whole blocks."""
    a, b = k // math.gcd(k, cpg), k // math.gcd(k, opg)
    return a * b // math.gcd(a, b)


def _layout(c: int, o: int, groups: int, k: int) -> tuple[int, int, int] | str:
    """(super-groups, input blocks and output blocks per super-group), or why none."""
    if groups <= 0 or c % groups or o % groups:
        return f"groups={groups} must divide the {c} input and {o} output channels"
    cpg, opg = c // groups, o // groups
    gs = _super_group(cpg, opg, k)
    s = -(-groups // gs)
    cb, ob = -(-c // k), -(-o // k)
    if s > 1 and s * gs * cpg == cb * k and s * gs * opg == ob * k:
        return s, gs * cpg // k, gs * opg // k
    # Fewer groups than a super-group, or super-groups that do not end where the channel
    # padding starts: one super-group of every block (a block-sparse kernel), while the
    # GEMM core does at most BLOCK times the multiply-adds of the layer with its input
    # channels padded to BLOCK (what a depthwise layer costs).
    if ob > opg:
        return (f"groups of {cpg} input / {opg} output channels do not tile BLOCK={k} "
                f"channel blocks ({groups} groups, {c} -> {o} channels), and as one block-"
                f"sparse layer the GEMM core would do {ob * k / opg:.0f}x its multiply-adds "
                f"(more than BLOCK={k}x)")
    return 1, cb, ob


def group_layout_problem(c: int, o: int, groups: int, k: int) -> str | None:
    """Why a grouping does not map onto BLOCK-channel blocks (None if it does)."""
    layout = _layout(c, o, groups, k)
    return layout if isinstance(layout, str) else None


@dataclass(frozen=True)
class GroupConvSpec(_ConvOutput):
    """A grouped conv layer in NCHW terms (channel counts as in the model, before padding)."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    groups: int = 1
    strides: tuple = (1, 1)  # (rows, columns)
    pads: tuple = (0, 0, 0, 0)  # (top, left, bottom, right), ONNX order
    block: int = 16
    epilogue: Epilogue = field(default_factory=Epilogue)
    bias_classes: tuple = ()  # as ConvSpec's (border.py)

    def __post_init__(self):
        problem = group_layout_problem(self.c, self.o, self.groups, self.block)
        if problem:
            raise CompilerError(problem)
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        object.__setattr__(self, "pads", tuple(int(p) for p in self.pads))
        if self.oh <= 0 or self.ow <= 0:
            raise CompilerError(f"{self}: the output would be empty")

    @property
    def supers(self) -> int:
        return _layout(self.c, self.o, self.groups, self.block)[0]

    @property
    def cpb(self) -> int:  # input channel blocks per super-group
        return _layout(self.c, self.o, self.groups, self.block)[1]

    @property
    def opb(self) -> int:  # output channel blocks per super-group
        return _layout(self.c, self.o, self.groups, self.block)[2]

    @property
    def cp(self) -> int:  # padded channel counts
        return self.supers * self.cpb * self.block

    @property
    def op(self) -> int:
        return self.supers * self.opb * self.block

    @property
    def macs(self) -> int:
        """The layer's own multiply-adds (not the zeros of the block-diagonal tiles)."""
        return self.n * self.o * self.oh * self.ow * (self.c // self.groups) * self.kh * self.kw

    @property
    def gemm_macs(self) -> int:
        """The multiply-adds the GEMM core performs (zeros included)."""
        return (self.n * self.supers * self.opb * self.cpb * self.block ** 2 * self.oh
                * self.ow * self.kh * self.kw)


@dataclass(frozen=True)
class GroupConvKnobs:
    """Output rows, columns, super-groups and output blocks (within a super-group) per tile,
    input blocks per load, and virtual threads (on super-groups or on output blocks)."""

    tile_h: int
    tile_w: int
    tile_g: int
    tile_co: int
    tile_ci: int
    vthreads: int = 1
    vthread_axis: str = "g"  # "g" or "co"


def group_conv2d(cfg: HwConfig, spec: GroupConvSpec, knobs: GroupConvKnobs,
                 name: str = "group_conv2d") -> AcceleratorFunction:
    """Compile one grouped conv layer with its epilogue. Arguments (data, kernel[, bias]
    [, scale][, residual], out): data (N/b, S, cpb, H, W, b, k), kernel
    (S, opb, cpb, KH, KW, k, k) (``pack_group_kernel``), bias and scale (S, opb, b, k), residual
    and out (N/b, S, opb, OH, OW, b, k): conv2d's packed layouts with the channel block axis
    split."""
    b, k = cfg.batch, cfg.block
    if spec.block != k:
        raise CompilerError(f"{name}: the spec is for BLOCK={spec.block}, the configuration "
                            f"has BLOCK={k}")
    if spec.n % b:
        raise CompilerError(f"{name}: N={spec.n} must be a multiple of BATCH={b}")
    nb, S, cpb, opb = spec.n // b, spec.supers, spec.cpb, spec.opb
    oh, ow = spec.oh, spec.ow
    sh, sw = spec.strides
    h, w = spec.h, spec.w
    data = te.placeholder((nb, S, cpb, h, w, b, k), "int8", "data")
    kernel = te.placeholder((S, opb, cpb, spec.kh, spec.kw, k, k), "int8", "kernel")
    if any(spec.pads):
        padded = _pad_input(data, spec.pads, ("n", "s", "c", "y", "x", "bb", "kk"))
    else:
        padded = data
    ci = te.reduce_axis(cpb, "ci")
    dy, dx = te.reduce_axis(spec.kh, "dy"), te.reduce_axis(spec.kw, "dx")
    ki = te.reduce_axis(k, "ki")
    conv = te.compute(
        (nb, S, opb, oh, ow, b, k),
        lambda n, s, o, y, x, bb, oo: te.sum(
            padded[n, s, ci, y * sh + dy, x * sw + dx, bb, ki].astype("int32")
            * kernel[s, o, ci, dy, dx, oo, ki].astype("int32"), axis=[ci, dy, dx, ki]), "conv")
    epi, out, extras = _epilogue_stages(spec.epilogue, conv, (1, 2),
                                        (3, 4, *spec.bias_classes) if spec.bias_classes else ())

    _check_divides("tile_h", oh, knobs.tile_h)
    _check_divides("tile_w", ow, knobs.tile_w)
    _check_divides("tile_g", S, knobs.tile_g)
    _check_divides("tile_co", opb, knobs.tile_co)
    _check_divides("tile_ci", cpb, knobs.tile_ci)
    s = _accumulator_schedule(conv, epi, out)
    n_, g_, c_, y_, x_, b_, o_ = s[out].axes
    g_o, g_i = s[out].split(g_, knobs.tile_g)
    co_o, co_i = s[out].split(c_, knobs.tile_co)
    y_o, y_i = s[out].split(y_, knobs.tile_h)
    x_o, x_i = s[out].split(x_, knobs.tile_w)
    # With one input step per tile (every input block of the tile's super-groups loaded at
    # once: always so for depthwise), the weights of a tile of super-groups are loaded once
    # and kept while the batch and spatial tiles run: the batch goes inside the super-group
    # tiles. (Block-diagonal weights are BLOCK times the layer's own: reloading them per
    # spatial tile made small depthwise layers load-bound.)
    hoist = knobs.tile_ci == cpb
    order = ([g_o, co_o, n_] if hoist else [n_, g_o, co_o]) + \
        [y_o, x_o, g_i, co_i, y_i, x_i, b_, o_]
    wgt_at = co_o  # the loop inside which a hoisted weight load sits
    if knobs.vthreads > 1:
        axis = g_o if knobs.vthread_axis == "g" else co_o
        rest = _split_vthreads(s, out, order, axis, knobs.vthreads,
                               f"vthreads on {knobs.vthread_axis}")
        wgt_at = rest if axis is co_o else co_o
    s[out].reorder(*order)
    _per_tile(s, conv, epi, out, x_o, g_i)
    cn, cg, cc, cy, cx, cb_, co_ = s[conv].axes
    cci, cdy, cdx, cki = s[conv].reduce_axes
    ci_o, ci_i = s[conv].split(cci, knobs.tile_ci)
    # As conv2d: rows and super-groups (or output blocks) become the GEMM instruction's
    # loops; input blocks, taps and columns its micro-ops, columns innermost.
    s[conv].reorder(ci_o, cn, cy, cg, cc, ci_i, cdy, cdx, cx, cb_, co_, cki)
    s[conv].tensorize(cb_, get_intrinsic("gemm", cfg))
    s[conv].init_in_reduce_loop()
    _load_input(s, data, padded, conv, ci_o)
    wgt = s.cache_read(kernel, "wgt", [conv])
    if hoist:
        s[wgt].compute_at(s[out], wgt_at)
    else:
        s[wgt].compute_at(s[conv], ci_o)
    s[wgt].pragma(s[wgt].axes[0], "dma_copy")
    _load_epilogue_inputs(s, extras, epi, out, x_o)
    return build(s, [data, kernel, *extras, out], cfg, name)


def pack_group_kernel(w: np.ndarray, spec: GroupConvSpec) -> np.ndarray:
    """ONNX grouped weights [O, C/groups, KH, KW] -> (S, opb, cpb, KH, KW, k, k), the
    weights between different groups (and of padding channels) zero."""
    k, S, opb, cpb = spec.block, spec.supers, spec.opb, spec.cpb
    cpg, opg = spec.c // spec.groups, spec.o // spec.groups
    if w.shape != (spec.o, cpg, spec.kh, spec.kw):
        raise CompilerError(f"grouped weights of shape {w.shape}, expected "
                            f"{(spec.o, cpg, spec.kh, spec.kw)}")
    oc = np.broadcast_to(np.arange(spec.op).reshape(S, opb, 1, k, 1), (S, opb, cpb, k, k))
    ic = np.broadcast_to(np.arange(spec.cp).reshape(S, 1, cpb, 1, k), (S, opb, cpb, k, k))
    local = ic - (oc // opg) * cpg
    valid = (oc < spec.o) & (local >= 0) & (local < cpg)
    blocks = np.zeros((S, opb, cpb, k, k, spec.kh, spec.kw), w.dtype)
    blocks[valid] = w[oc[valid], local[valid]]
    return np.ascontiguousarray(blocks.transpose(0, 1, 2, 5, 6, 3, 4))


def _useful_taps(size: int, taps: int, stride: int, pad: int, out: int) -> tuple[int, int]:
    """The first and last tap along one axis that reads an input element for some output."""
    used = [d for d in range(taps) if any(0 <= y * stride + d - pad < size for y in range(out))]
    return used[0], used[-1]


def crop_taps(spec: GroupConvSpec, w: np.ndarray) -> tuple[GroupConvSpec, np.ndarray]:
    """The same layer without the kernel rows and columns that only ever meet padding (a
    3x3 kernel with padding 1 on a 1x1 input uses its centre only): the padding shrinks by
    the taps dropped, so every output reads the same input elements. Block-diagonal
    weights are BLOCK times the layer's own, so on small inputs those taps' weight loads
    would dominate the layer."""
    from dataclasses import replace

    if not any(spec.pads):
        return spec, w
    sh, sw = spec.strides
    pt, pl, pb, pr = spec.pads
    y0, y1 = _useful_taps(spec.h, spec.kh, sh, pt, spec.oh)
    x0, x1 = _useful_taps(spec.w, spec.kw, sw, pl, spec.ow)
    kh, kw = y1 - y0 + 1, x1 - x0 + 1
    if (kh, kw) == (spec.kh, spec.kw) or y0 > pt or x0 > pl:
        return spec, w
    top, left = pt - y0, pl - x0
    bottom = max(0, (spec.oh - 1) * sh + kh - spec.h - top)
    right = max(0, (spec.ow - 1) * sw + kw - spec.w - left)
    cropped = replace(spec, kh=kh, kw=kw, pads=(top, left, bottom, right))
    if (cropped.oh, cropped.ow) != (spec.oh, spec.ow):
        return spec, w
    return cropped, np.ascontiguousarray(w[:, :, y0:y1 + 1, x0:x1 + 1])


def group_conv2d_reference(x: np.ndarray, w: np.ndarray, spec: GroupConvSpec, bias=None,
                           residual=None, scale=None) -> np.ndarray:
    """NCHW int8 grouped conv with the epilogue, in numpy (int64 products, int32 wrap)."""
    pt, pl, pb, pr = spec.pads
    sh, sw = spec.strides
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    g, cpg, opg = spec.groups, spec.c // spec.groups, spec.o // spec.groups
    n = x.shape[0]
    acc = np.zeros((n, g, opg, spec.oh, spec.ow), np.int64)
    wg = w.astype(np.int64).reshape(g, opg, cpg, spec.kh, spec.kw)
    for dy in range(spec.kh):
        for dx in range(spec.kw):
            patch = xp[:, :, dy:dy + sh * (spec.oh - 1) + 1:sh, dx:dx + sw * (spec.ow - 1) + 1:sw]
            patch = patch.reshape(n, g, cpg, spec.oh, spec.ow)
            acc += np.einsum("ngchw,goc->ngohw", patch, wg[:, :, :, dy, dx])
    acc = _wrap(acc.reshape(n, spec.o, spec.oh, spec.ow))
    b = bias.astype(np.int64)[None, :, None, None] if bias is not None else None
    m = scale.astype(np.int64)[None, :, None, None] if scale is not None else None
    return spec.epilogue.apply(acc, b, residual, m)


# ---- knobs -------------------------------------------------------------------------------


def _uops(spec: GroupConvSpec, kb: GroupConvKnobs) -> int:
    """Micro-ops of the GEMM kernel: input blocks x taps x columns, times the outer loops
    that are not among the instruction's two (form_gemm_kernels unrolls them)."""
    outer = [e for e in (kb.tile_h, kb.tile_g, kb.tile_co) if e > 1]
    return kb.tile_ci * spec.kh * spec.kw * kb.tile_w * math.prod(outer[2:])


def _rows(spec: GroupConvSpec, kb: GroupConvKnobs) -> dict:
    in_h = (kb.tile_h - 1) * spec.strides[0] + spec.kh
    in_w = (kb.tile_w - 1) * spec.strides[1] + spec.kw
    e = spec.epilogue
    blocks = kb.tile_g * kb.tile_co
    bias = e.bias * bias_rows(spec.bias_classes, kb.tile_h, kb.tile_w)
    extra = blocks * (bias + e.scale) + (blocks * kb.tile_h * kb.tile_w if e.residual else 0)
    return {"inp": kb.vthreads * kb.tile_g * kb.tile_ci * in_h * in_w,
            "wgt": kb.vthreads * blocks * kb.tile_ci * spec.kh * spec.kw,
            "acc": kb.vthreads * (blocks * kb.tile_h * kb.tile_w + extra),
            "uop": _uops(spec, kb) + bias_uops(spec.bias_classes, kb.tile_h, kb.tile_w)}


def group_conv_candidates(cfg: HwConfig, spec: GroupConvSpec) -> list[GroupConvKnobs]:
    """Every knob combination whose buffers fit (widths of at least 7 columns or the row)."""
    from .tune import _buffer_limits, _divisors, _tile_widths

    limit = _buffer_limits(cfg)
    out = []
    widths = _tile_widths(spec.ow)
    for th in _divisors(spec.oh):
        for tw in widths:
            for tg in _divisors(spec.supers):
                for tco in _divisors(spec.opb):
                    for tci in _divisors(spec.cpb):
                        threads = [(1, "g")]
                        if (spec.supers // tg) % 2 == 0:
                            threads.append((2, "g"))
                        if (spec.opb // tco) % 2 == 0:
                            threads.append((2, "co"))
                        for vt, axis in threads:
                            kb = GroupConvKnobs(th, tw, tg, tco, tci, vt, axis)
                            rows = _rows(spec, kb)
                            if all(rows[x] <= limit[x] for x in rows):
                                out.append(kb)
    return out


def estimate_group_conv(cfg: HwConfig, spec: GroupConvSpec, kb: GroupConvKnobs) -> float:
    """Rough cycles: per tile and input step, the loads (one DMA per input block and one
    for the weights, each row paying the DRAM latency) and the GEMM micro-ops; with two
    threads one thread's loads hide behind the other's compute. Plus the ALU epilogue and
    the store per tile."""
    from .tune import _alu_ops, _load_cycles, _loop_cycles, _store_cycles

    in_h = (kb.tile_h - 1) * spec.strides[0] + spec.kh
    in_w = (kb.tile_w - 1) * spec.strides[1] + spec.kw
    taps = spec.kh * spec.kw
    steps = spec.cpb // kb.tile_ci
    tiles = ((spec.n // cfg.batch) * (spec.supers // kb.tile_g) * (spec.opb // kb.tile_co)
             * (spec.oh // kb.tile_h) * (spec.ow // kb.tile_w))
    blocks = kb.tile_g * kb.tile_co
    load = kb.tile_g * kb.tile_ci * _load_cycles(cfg, in_h, min(in_w, spec.w),
                                                  cfg.inp_elem_bytes, 0)
    wgt = _load_cycles(cfg, blocks, kb.tile_ci * taps, cfg.wgt_elem_bytes, 0)
    if kb.tile_ci == spec.cpb:  # loaded once per tile of super-groups (group_conv2d)
        wgt_total = wgt * (spec.supers // kb.tile_g) * (spec.opb // kb.tile_co)
    else:
        load += wgt
        wgt_total = 0.0
    rows = blocks * kb.tile_h * kb.tile_w
    gemm = _loop_cycles(cfg, rows * kb.tile_ci * taps)
    epi = (_alu_ops(spec) + 1) * _loop_cycles(cfg, rows)
    store = _store_cycles(cfg, blocks * kb.tile_h, kb.tile_w, cfg.out_elem_bytes)
    step = max(load, gemm) if kb.vthreads > 1 else load + gemm
    return wgt_total + tiles * (steps * step + epi + (0 if kb.vthreads > 1 else store))


def measure_group_conv(cfg: HwConfig, spec: GroupConvSpec, knobs: GroupConvKnobs, *,
                       seed: int = 0) -> dict:
    """Run the layer with random operands on the cycle model; its counters."""
    from celosia.driver import Device

    rng = np.random.default_rng(seed)
    fn = group_conv2d(cfg, spec, knobs)
    args = []
    for p in fn.func.params:
        lo, hi = (-128, 128) if p.dtype == "int8" else (1, 999)
        args.append(rng.integers(lo, hi, p.shape).astype(p.dtype))
    size = sum(a.nbytes for a in args) * 2 + (8 << 20)
    return fn(Device(cfg, target="cycle", dram_size=size), *args)


def group_conv_knobs(cfg: HwConfig, spec: GroupConvSpec, *, top: int = 4,
                     use_cache: bool = True) -> GroupConvKnobs:
    """The knobs of a layer: every candidate estimated (``estimate_group_conv``), the best
    ``top`` measured on the cycle model for one batch tile (the batch is a loop around the
    same program), the fastest kept; cached on disk like conv2d's search (tune.py)."""
    from dataclasses import replace

    from .tune import _sources_hash, cache_dir, search_cached

    one = replace(spec, n=cfg.batch)
    key = hashlib.sha256(json.dumps(
        {"src": _sources_hash(), "ops_group": hashlib.sha256(
            Path(__file__).read_bytes()).hexdigest()[:16], "cfg": cfg.to_dict(),
         "spec": asdict(one), "top": top}, sort_keys=True, default=str).encode()).hexdigest()[:24]

    def ranked():
        cands = group_conv_candidates(cfg, spec)
        if not cands:
            raise CompilerError(f"no schedule of {spec} fits this configuration's buffers")
        ranked = sorted(cands, key=lambda kb: (estimate_group_conv(cfg, spec, kb),
                                               -(kb.tile_h * kb.tile_w * kb.tile_g * kb.tile_co)))
        return ranked, top

    return search_cached(cache_dir() / f"group-conv-{key}.json", use_cache, GroupConvKnobs,
                         ranked, lambda kb: measure_group_conv(cfg, one, kb), spec)[0]
