"""int8 convolutions and matrix products on the CPU's dot-product instructions (the forms
of int8_forms.py: AVX-512 VNNI, AVX-VNNI, AVX2), written directly in LLVM IR. Bit-exact
with graph/qops.py's QConv, QGemm and QMatMul.

One kernel computes a grouped 2-D convolution with qops' requantizing epilogue; QGemm is
the 1x1 convolution of one image of one row whose pixels are the matrix's rows (a plain
``[M, K]`` is the blocked layout with one block of K channels, ``[1, 1, 1, M, K]``), and
QMatMul the same per matrix of a batch, its run-time right operand packed by the kernel.

Two segments (three for QMatMul), each a parallel loop (``fn(buffers, begin, end)``, the
native pool), emitted by int8_emit.py:

1. *stage*: the input rewritten, once, as the windows read it: ``[N, Hs, Ws, G * Cp]``
   (pixels, then every group's channels padded to ``Cp``, a multiple of the form's
   ``group``) in the form's operand type (``x ^ 0x80`` for VNNI's unsigned operand,
   int16 for AVX2), with the padding (``pad_value``) written out, and for a 1x1 kernel
   only the pixels its strides read. It reads any channel block (a plain NCHW input is
   blocks of 1).
2. *dot*: per (image, group, tile of output channels, output row, column chunk), blocks
   of ``R`` output columns x ``V`` vectors of ``lanes`` output channels held in registers
   over the whole reduction (kernel rows, columns, input channels ``group`` at a time):
   per step ``V`` weight vectors, and per column one activation group broadcast to all
   lanes and one dot-product instruction per vector. Then the epilogue on the registers:

       t = wrap(wrap(acc + bias) * multiplier + round) >> shift  [+ residual]; clip(lo, hi)

   (``round`` 0 for QConv/QGemm, ``2**(shift-1)`` for QMatMul; ``bias`` carries VNNI's
   ``-128 * sum(w)``), stored as int8 into the output's channel blocks.

QMatMul's *pack* segment (between the two, per matrix) writes its right operand in the
weights' layout and its column sums, as ``-128 * sum``, into the bias.

Spec (JSON-able; the kernel cache keys on it):

    {"op": "qdot", "form": "vnni512", "data": [N, Cb, H, W, cb], "channels": C,
     "groups": G, "out": [N, Mb, OH, OW, ob], "out_channels": M, "kernel": [KH, KW],
     "strides": [sh, sw], "pads": [top, left, bottom, right], "dilations": [dh, dw],
     "pad_value": p, "tile": [V, R], "residual": bool, "skip_padding": bool}

Parameters: data (int8), weight (``pack_dot_weight``), bias and multiplier (int32
``[G, tiles * V * lanes]``), requant (int32 ``[shift, lo, hi, round]``), [tapsum (int32
``tap_sums``, with ``skip_padding``)], [residual (int8, the output's shape)], out (int8).
One temporary: the staged input.

With ``skip_padding`` the output rows and column blocks whose windows reach the padding
multiply only their in-bounds taps (``Geometry``); each skipped tap adds what its padding
would have given, the staged padding value times the tap's weight sums (``tapsum``), so
the sums stay those of the padded window, bit for bit. The bound the benchmark counts
(every tap of every window) then no longer bounds the work: a 3x3 layer at 7x7 skips 18 %
of its taps, at 14x14 9 %.

    {"op": "qdot_matmul", "form": ..., "a": [Z, M, K], "b": [Z, K, N], "tile": [V, R]}

Parameters: a, b (int8), qparams (int32 ``[multiplier, shift]``, kernels_q.py's), out
(int8 ``[Z, M, N]``); temporaries: the staged a, the packed b, its bias.
"""

from __future__ import annotations

import time

from celosia.errors import CompilerError

from ..tensor.tir import Buffer
from .codegen import CpuKernel, SavedSegment, _load_or_compile
from .host import host_target
from .int8_emit import Emitter
from .int8_forms import DotForm, form as get_form

__all__ = ["DOT_OPS", "compile_dot", "compile_peak", "dot_tile", "Geometry"]

DOT_OPS = ("qdot", "qdot_matmul")
_PEAK_ACCUMULATORS = 16
# Dot-product instructions a core issues per cycle (Zen 5: two; dot_tile's cost model).
_DOTS_PER_CYCLE = 2
# Work items per kernel call at least (the pool cuts a loop into 4 x threads chunks).
_MIN_ITEMS = 32
# At most this many column blocks emitted apart for the padding they skip (geometry).
_BORDER_BLOCKS = 6


# ---- geometry ---------------------------------------------------------------------------------


class Geometry:
    """Everything the two segments need, derived from a spec (and checked)."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.form: DotForm = get_form(spec["form"])
        f = self.form
        self.matmul = spec["op"] == "qdot_matmul"
        if self.matmul:  # Z images of one row of M pixels of K channels, N outputs each
            (z, m, k), n = spec["a"], spec["b"][2]
            if tuple(spec["b"][:2]) != (z, k):
                raise CompilerError(f"qdot_matmul: a {spec['a']} and b {spec['b']} do not "
                                    f"multiply")
            spec = {"data": [z, 1, 1, m, k], "channels": k, "groups": 1,
                    "out": [z, 1, 1, m, n], "out_channels": n, "kernel": [1, 1],
                    "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
                    "tile": spec["tile"], "residual": False}
        self.n, self.cb_count, self.h, self.w, self.cb = spec["data"]
        self.c, self.g, self.m = spec["channels"], spec["groups"], spec["out_channels"]
        _, self.mb_count, self.oh, self.ow, self.ob = spec["out"]
        self.kh, self.kw = spec["kernel"]
        self.sh, self.sw = spec["strides"]
        self.pt, self.pl, self.pb, self.pr = spec["pads"]
        self.dh, self.dw = spec["dilations"]
        self.pad_value = int(spec.get("pad_value", 0))
        self.vectors, self.columns = spec["tile"]
        self.residual = bool(spec["residual"])
        if self.cb * self.cb_count != self.c or self.ob * self.mb_count != self.m \
                or self.c % self.g or self.m % self.g:
            raise CompilerError(f"qdot: data {spec['data']} / out {spec['out']} do not hold "
                                f"{self.c} -> {self.m} channels in {self.g} groups")
        oh = (self.h + self.pt + self.pb - (self.kh - 1) * self.dh - 1) // self.sh + 1
        ow = (self.w + self.pl + self.pr - (self.kw - 1) * self.dw - 1) // self.sw + 1
        if (oh, ow) != (self.oh, self.ow) or not -128 <= self.pad_value <= 127:
            raise CompilerError(f"qdot: output {self.oh}x{self.ow} is not what the geometry "
                                f"gives ({oh}x{ow}), or pad_value {self.pad_value} is not int8")
        self.cg, self.mg = self.c // self.g, self.m // self.g
        self.cp = -(-self.cg // f.group) * f.group      # a group's channels, padded
        # ``fold_columns``: a kernel row's KW x Cg products are one reduction over the
        # staged row's consecutive elements (pixels staged densely, Cg channels each), in
        # steps of ``group`` (the last step reads past the window into weights of zero),
        # instead of KW taps of Cp channels each: 3 channels x 7 columns take 6 steps
        # instead of 7. One group, no column dilation.
        self.fold = bool(spec.get("fold_columns"))
        if self.fold and (self.g != 1 or self.dw != 1):
            raise CompilerError(f"qdot: fold_columns needs one group and no column dilation "
                                f"(groups {self.g}, dilations {spec['dilations']})")
        self.cs = self.cg if self.fold else self.cp     # a group's staged channels
        self.ctot = self.g * self.cs                     # channels of a staged pixel
        self.taps_w = 1 if self.fold else self.kw        # kernel columns as taps
        self.q = -(-(self.kw * self.cg) // f.group) if self.fold else self.cp // f.group
        # elements a folded window's last step reads past the window (and the stage's end)
        self.slack = self.q * f.group - self.kw * self.cg if self.fold else 0
        self.tile = f.lanes * self.vectors
        self.tiles = -(-self.mg // self.tile)
        self.mgp = self.tiles * self.tile
        # The staged rows and columns: only what the windows read; a 1x1 kernel's strided
        # pixels gathered (then read with stride 1).
        if self.kh == 1:
            self.hs, self.step_h, self.rs_h = self.oh, self.sh, 1
        else:
            self.hs, self.step_h, self.rs_h = (self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1, 1, self.sh
        if self.kw == 1:
            self.ws, self.step_w, self.rs_w = self.ow, self.sw, 1
        else:
            self.ws, self.step_w, self.rs_w = (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1, 1, self.sw
        r = self.columns
        self.full_blocks, self.tail = divmod(self.ow, r)
        if self.full_blocks == 0:
            raise CompilerError(f"qdot: tile of {r} columns is wider than the output ({self.ow})")
        base = self.n * self.g * self.tiles * self.oh
        self.chunks = max(1, min(self.full_blocks, -(-_MIN_ITEMS // base)))
        self.blocks_per_chunk = -(-self.full_blocks // self.chunks)
        self.chunks = -(-self.full_blocks // self.blocks_per_chunk)
        self.items = base * self.chunks
        # Padded taps skipped (``skip_padding``): the output rows and column blocks whose
        # windows reach the padding. Rows: those below ``y_top`` or from ``y_bottom`` on
        # compute their in-bounds kernel rows at run time (the others run as if there were
        # no padding). Columns: the blocks holding a column below ``x_left`` or from ``x_right``
        # on are emitted apart, kernel columns unrolled, each column multiplying only its
        # in-bounds taps (when there are at most _BORDER_BLOCKS of them; else they read the
        # staged padding as the interior does).
        self.skip = bool(spec.get("skip_padding")) and not self.matmul
        y_top = min(self.oh, -(-self.pt // self.sh))
        y_bottom = max(y_top, min(self.oh, -(-(self.h + self.pt - (self.kh - 1) * self.dh)
                                             // self.sh)))
        self.border_rows = (y_top, y_bottom)   # rows below y_top or from y_bottom on
        self.row_border = self.skip and (y_top > 0 or y_bottom < self.oh)
        x_left = min(self.ow, -(-self.pl // self.sw))
        x_right = max(x_left, min(self.ow, -(-(self.w + self.pl - (self.kw - 1) * self.dw)
                                            // self.sw)))
        spans = [(k * r, k * r + r) for k in range(self.full_blocks)]
        if self.tail:
            spans.append((self.full_blocks * r, self.ow))
        border = [k for k, (a, z) in enumerate(spans) if a < x_left or z > x_right]
        # (Not for a one-step reduction per tap, the stem's 3 channels: there the unrolled
        # block measured 8 % slower than reading its few padded taps.)
        self.border_blocks = border if self.skip and self.q > 1 and not self.fold \
            and len(border) <= _BORDER_BLOCKS else []

    @property
    def staged_shape(self) -> tuple:
        return (self.n, self.hs, self.ws, self.ctot)

    def weight_shape(self) -> tuple:
        f = self.form
        return (self.g, self.tiles, self.kh, self.taps_w, self.q, self.vectors, f.lanes,
                f.group)

    def temps(self) -> list[Buffer]:
        """The staged input; for a matmul also its right operand packed as weights and the
        bias that carries VNNI's correction, per matrix."""
        staged = self.staged_shape
        if self.slack:
            staged = (self.n * self.hs * self.ws * self.ctot + self.slack,)
        ts = [Buffer("staged", staged, self.form.operand)]
        if self.matmul:
            ts += [Buffer("packed", (self.n,) + self.weight_shape(), self.form.operand),
                   Buffer("colbias", (self.n, self.mgp), "int32")]
        return ts

    def params(self) -> list[Buffer]:
        if self.matmul:
            z, m, k = self.spec["a"]
            return [Buffer("a", (z, m, k), "int8"), Buffer("b", tuple(self.spec["b"]), "int8"),
                    Buffer("qparams", (2,), "int32"),
                    Buffer("out", (z, m, self.m), "int8")]
        f = self.form
        wshape = self.weight_shape()
        ps = [Buffer("data", tuple(self.spec["data"]), "int8"),
              Buffer("weight", wshape, f.operand),
              Buffer("bias", (self.g, self.mgp), "int32"),
              Buffer("multiplier", (self.g, self.mgp), "int32"),
              Buffer("requant", (4,), "int32")]
        if self.skip:
            ps.append(Buffer("tapsum", (self.g, self.tiles, self.kh, self.taps_w, self.tile),
                             "int32"))
        if self.residual:
            ps.append(Buffer("residual", tuple(self.spec["out"]), "int8"))
        ps.append(Buffer("out", tuple(self.spec["out"]), "int8"))
        return ps


def dot_tile(f: DotForm, out_channels_per_group: int, width: int) -> tuple[int, int]:
    """(vectors V, columns R) of the register tile for an output of ``width`` columns and
    ``out_channels_per_group`` channels per group: the candidate with the least estimated
    time per output row, counting the padded channels and the tail block it computes. A
    reduction step issues ``R * V`` dot products (``_DOTS_PER_CYCLE`` a cycle) and ``V``
    weight loads and ``R`` broadcasts (two loads a cycle), plus about half a cycle of loop
    and address work. On Zen 5 (two dot products a cycle) this picks 2 x 14 for 56, 28 and
    14 columns, 2 x 7 for 7, measured 1-8 % faster than the 1 x 28 the one-a-cycle model
    chose (docs/runtime.md)."""
    best = None
    for v in (1, 2, 3, 4):
        most = (f.registers - v - (1 if f.unsigned else 2)) // v
        if most < 1:
            continue
        r_max = min(width, most)
        blocks = -(-width // r_max)
        r = -(-width // blocks)       # balanced blocks: 56 = 4 x 14, 7 = 7
        full, tail = divmod(width, r)
        tiles = -(-out_channels_per_group // (f.lanes * v))

        def step(cols):
            return max(cols * v / _DOTS_PER_CYCLE, (v + cols) / 2) + 0.5 if cols else 0
        cost = tiles * (full * step(r) + step(tail))
        if best is None or cost < best[0]:
            best = (cost, v, r)
    return best[1], best[2]


def _as_compiled_for(llvm_ir: str, f: DotForm) -> str:
    """The avx2 form's functions without AVX-512 and AVX-VNNI (a function attribute): on a
    host with either, LLVM would otherwise use 32 registers or fuse ``vpmaddwd`` +
    ``vpaddd`` into VNNI's ``vpdpwssd`` (EVEX, or VEX on an AVX-VNNI host such as Zen 5),
    so a test of the form on such a host would not run an AVX2 host's code. (The VNNI
    forms need the host's own features.)"""
    host = host_target().features.split(",")
    drop = [feature for feature in ("+avx512f", "+avxvnni") if feature in host]
    if f.name != "avx2" or not drop:
        return llvm_ir
    lines = [line + " #0" if line.startswith("define ") else line
             for line in llvm_ir.splitlines()]
    off = ",".join("-" + feature[1:] for feature in drop)
    return "\n".join(lines) + f'\nattributes #0 = {{ "target-features"="{off}" }}\n'


def compile_dot(spec: dict, *, use_cache: bool = True) -> CpuKernel:
    """The compiled ``qdot`` kernel of a spec (see the module docstring)."""
    start = time.perf_counter()
    geo = Geometry(spec)
    symbol = "qdot"
    e = Emitter(geo, symbol)
    segments = [SavedSegment(e.stage(), geo.n * geo.hs)]
    if geo.matmul:
        segments.append(SavedSegment(e.pack(), geo.n))
    segments.append(SavedSegment(e.dot(), geo.items))
    llvm_ir = _as_compiled_for(str(e.module), geo.form)
    obj, path, hit = _load_or_compile(llvm_ir, use_cache)
    params = geo.params()
    return CpuKernel(None, llvm_ir, obj, geo.temps(), segments, path, hit,
                     time.perf_counter() - start, name=spec["op"], params=params,
                     written=[len(params) - 1])


def compile_peak(form_name: str, items: int, steps: int) -> tuple[CpuKernel, int]:
    """(kernel, multiply-adds per call) of the form's peak: ``items`` parallel iterations
    of ``steps`` rounds of 16 independent dot-product instructions on registers, the sums
    stored (``out`` int32 ``[items, lanes]``). What the convolutions' inner loop could
    reach on this machine at best (benchmarks: the bound of a model's int8 layers)."""
    f = get_form(form_name)
    spec = {"op": "qdot_matmul", "form": form_name, "a": [1, 1, 4], "b": [1, 4, 1],
            "tile": [1, 1]}
    e = Emitter(Geometry(spec), "peak")
    symbol = e.peak(_PEAK_ACCUMULATORS, steps)
    llvm_ir = _as_compiled_for(str(e.module), f)
    obj, path, hit = _load_or_compile(llvm_ir, True)
    kernel = CpuKernel(None, llvm_ir, obj, [], [SavedSegment(symbol, items)], path, hit,
                       0.0, name="peak", params=[Buffer("out", (items, f.lanes), "int32")],
                       written=[0])
    return kernel, items * steps * _PEAK_ACCUMULATORS * f.lanes * f.group
