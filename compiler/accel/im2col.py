"""Few-channel convolutions as one GEMM over their whole window (im2col at the border).

conv2d pads the input channels to BLOCK and runs one GEMM micro-op per input block, tap and
output row: ResNet's stem (3 input channels, 7x7) spends 49 micro-ops per output row on 147
real multiply-adds per output channel, 16 of each 49 x 16 lanes real (``padding_overhead``
+433 %). When the input is made on the CPU (an image after its Quantize, or any CPU node),
the runtime, which packs it into DRAM anyway, can pack its *windows* instead: for every
output pixel, the kh x kw x C values its window reads (tap-major, channels inner, the
padding filled with the layer's ``pad_value``), as the channels of a 1x1 convolution with
no padding and stride 1. The stem becomes a 1x1 layer of ceil(147 / 16) = 10 input blocks:
10 micro-ops per output row, 147 of 160 lanes real. The weights are reordered the same way
(``weight``): ``w[o, c, dy, dx]`` goes to input channel ``(dy * kw + dx) * C + c``. Every
output sums the same int8 products as the original layer (int32 wrap-around is
associative), so the result is bit for bit the QConv's; the padding reads exactly the pad
value, so no bias table (border.py) is needed either.

The program takes the windows as a *staged* operand (like a QMatMul's second operand,
runtime/accel.py): its own DRAM buffer, packed by the runtime before each run from the
value on the host (``pack``), counted as layout time and as a crossing.

``plan`` decides per QConv: groups 1, an int8 input that the accelerator does not make
(a graph input or a CPU node's output: packing it is the runtime's work anyway) and that
no other accelerator node reads (else it would cross twice, in two layouts), and fewer
input blocks than conv2d's blocks x taps; then both layers are tuned on the cycle model
(compiler/accel/tune.py, cached) and the windowed one is taken only if the accelerator
time it saves (cycles at the configured clock) exceeds what packing the windows costs the
CPU beyond packing the plain input, timed at build time (``extra_pack_seconds``): its
input is kh x kw / (stride_h x stride_w) times larger, so a layer whose loads already bound
it may not gain cycles, and a small one may gain fewer microseconds than the packing costs.
With BATCH 1 the windows are packed by a compiled kernel (compiler/cpu/im2col_layout.py),
otherwise by one numpy gather.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.lib.stride_tricks import as_strided

from celosia.config import HwConfig
from celosia.errors import CompilerError

from ..graph.ir import Graph, Node
from .ops import _ConvOutput

__all__ = ["Windows", "windows_of", "fits", "candidate", "layer", "pack", "stager", "plan",
           "LAYOUT"]

LAYOUT = "im2col"  # the staged operand's layout name (program manifests)


@dataclass(frozen=True)
class Windows(_ConvOutput):
    """The geometry of a convolution's windows: input [n, c, h, w], kernel kh x kw, strides
    (rows, columns), pads (top, left, bottom, right), the padding's value ``z``."""

    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    strides: tuple
    pads: tuple
    z: int
    # int8 values the runtime writes into the lanes past kh x kw x C (the bias lanes,
    # ``bias_lanes``); zeros past them
    lanes: tuple = ()

    @property
    def channels(self) -> int:
        """The 1x1 layer's real input channels: one per tap and input channel."""
        return self.c * self.kh * self.kw

    def blocks(self, k: int) -> int:
        return -(-self.channels // k)

    def packed_shape(self, cfg: HwConfig) -> tuple:
        """The staged operand's shape: conv2d's data layout of the 1x1 layer's input."""
        return (self.n // cfg.batch, self.blocks(cfg.block), self.oh, self.ow, cfg.batch,
                cfg.block)


def windows_of(node: Node, graph: Graph, cfg: HwConfig | None = None) -> Windows:
    """The windows of a QConv (a 1-D one as 2-D with one row); with ``cfg``, the bias lanes
    too (``bias_lanes``)."""
    from ..graph.qops import pad_value
    from .partition import _conv_geometry

    _, strides, pads, (kh, kw) = _conv_geometry(node, graph)
    x = graph.types[node.inputs[0]].shape
    n, c = x[:2]
    h, w = (1, x[2]) if len(x) == 3 else x[2:]
    win = Windows(int(n), int(c), int(h), int(w), kh, kw, tuple(strides), tuple(pads),
                  pad_value(node.attrs))
    if cfg is None:
        return win
    spare = win.blocks(cfg.block) * cfg.block - win.channels
    lanes = bias_lanes(np.asarray(graph.initializers[node.inputs[2]]), spare)
    return replace(win, lanes=lanes[0] if lanes else ())


def bias_lanes(bias: np.ndarray, spare: int) -> tuple[tuple, np.ndarray] | None:
    """(lane values, weights [O, lanes]) that put an int32 ``bias`` into the GEMM through
    ``spare`` padding lanes of the last input block, if it fits: lane 0 reads 1, the others
    127, so ``bias[o] = w[o, 0] + 127 * sum(w[o, 1:])`` with int8 weights. The GEMM then
    starts every output from its bias and the epilogue's bias ADD (one ALU micro-op per
    accumulator row) goes; the lanes are computed anyway. None if there are no 2 lanes or a
    bias is out of reach (|bias| <= 63 + 127 * 128 * (lanes - 1), roughly)."""
    if spare < 2:
        return None
    b = bias.astype(np.int64)
    t = np.round(b / 127).astype(np.int64)  # the 127 lanes' share; lane 0 gets the rest
    w0 = b - 127 * t
    rest = spare - 1
    if np.abs(t).max(initial=0) > 127 * rest or np.abs(w0).max(initial=0) > 127:
        return None
    # t split over the 127 lanes, each in [-127, 127]: as many full ones as needed
    w = np.zeros((b.size, spare), np.int64)
    w[:, 0] = w0
    left = t.copy()
    for j in range(1, spare):
        step = np.clip(left, -127, 127)
        w[:, j] = step
        left -= step
    assert not left.any() and (w[:, 0] + 127 * w[:, 1:].sum(1) == b).all()
    return (1,) + (127,) * rest, w.astype(np.int8)


def fits(node: Node, graph: Graph, cfg: HwConfig) -> Windows | None:
    """The node's windows if a 1x1 layer over them can replace it with fewer GEMM micro-ops
    (a QConv of groups 1 on a run-time int8 value), else None."""
    from .partition import _conv_geometry

    if node.op != "QConv" or _conv_geometry(node, graph)[0] != 1:
        return None
    x = node.inputs[0]
    if graph.types[x].dtype != "int8" or x in graph.initializers:
        return None
    win = windows_of(node, graph, cfg)
    if (win.kh, win.kw) == (1, 1) or win.n % cfg.batch:
        return None
    k = cfg.block
    if win.blocks(k) >= -(-win.c // k) * win.kh * win.kw:
        return None
    return win


def candidate(node: Node, graph: Graph, placements: dict, cfg: HwConfig) -> Windows | None:
    """``fits``, and its input is not made by the accelerator (a graph input or a CPU
    node's output: the runtime packs it anyway; not a CPU node run in place on the packed
    layout, partition.packed_nodes) and no other accelerator node reads it (it would cross
    twice, in two layouts), else None."""
    from .partition import packed_nodes

    win = fits(node, graph, cfg)
    if win is None:
        return None
    x = node.inputs[0]
    made = next((n for n in graph.nodes if x in n.outputs), None)
    if made is not None and (placements[made.name].target != "cpu" or
                             made.name in packed_nodes(graph, placements)):
        return None  # in DRAM already (an accelerator node, or a CPU node run in place)
    if any(x in n.inputs and n is not node and placements[n.name].target == "accel"
           for n in graph.nodes):
        return None  # packed for another accelerator node anyway: one crossing, not two
    return win


def weight(w4: np.ndarray) -> np.ndarray:
    """QConv weights [O, C, kh, kw] as the 1x1 layer's [O, kh * kw * C, 1, 1]: input channel
    (dy * kw + dx) * C + c holds w[o, c, dy, dx]."""
    o = w4.shape[0]
    return np.ascontiguousarray(w4.transpose(0, 2, 3, 1).reshape(o, -1, 1, 1))


def layer(node: Node, graph: Graph, cfg: HwConfig, win: Windows):
    """The AccelLayer of the node as a 1x1 conv2d over its windows (same name, bias,
    multipliers and epilogue; no padding, so one bias per channel; the bias through the
    padding lanes when ``win.lanes``, bias_lanes)."""
    from .ops import ConvSpec, pack_bias, pack_oihw, pad_channels
    from .partition import AccelLayer, _ceil, _epilogue, conv_weight

    b, k = cfg.batch, cfg.block
    bias, mult = (np.asarray(graph.initializers[i]) for i in node.inputs[2:4])
    w = conv_weight(node, graph)
    o = w.shape[0]
    w4 = weight(w.reshape(o, win.c, win.kh, win.kw))
    epi = _epilogue(node)
    lanes = bias_lanes(bias, win.blocks(k) * k - win.channels) if win.lanes else None
    if lanes:  # the bias through the GEMM's padding lanes: no bias ADD
        w4 = np.concatenate([w4, lanes[1][:, :, None, None]], axis=1)
        epi = replace(epi, bias=False)
    spec = ConvSpec(n=win.n, c=win.blocks(k) * k, h=win.oh, w=win.ow, o=_ceil(o, k), kh=1,
                    kw=1, stride=1, pad=0, epilogue=epi)
    packed = pack_oihw(pad_channels(pad_channels(w4, 0, k), 1, k), k)
    return AccelLayer(node.name, "conv2d", spec, packed.astype(np.int8),
                      pack_bias(pad_channels(bias.astype(np.int32), 0, k), b, k),
                      pack_bias(pad_channels(mult.astype(np.int32), 0, k), b, k), epi.residual)


def plan(node: Node, graph: Graph, cfg: HwConfig, placements: dict, base, *, top: int = 4):
    """(layer, windows) of the node over its windows if that saves more accelerator time
    than the CPU spends packing them, or if no schedule of ``base`` (its conv2d AccelLayer)
    fits the buffers; else None. Both layers are tuned on the cycle model for one batch
    tile; the time saved is the cycles saved for the whole batch at the configured clock,
    the packing cost ``extra_pack_seconds`` (windows against the plain input the layer
    would read otherwise)."""
    from .tune import tune_conv

    win = candidate(node, graph, placements, cfg)
    if win is None or base.kind != "conv2d":
        return None
    alt = layer(node, graph, cfg, win)
    one = cfg.batch
    try:
        _, ours = tune_conv(cfg, replace(alt.spec, n=one), top=top)
    except CompilerError:
        return None
    try:
        _, theirs = tune_conv(cfg, replace(base.spec, n=one), top=top)
    except CompilerError:  # no schedule of the padded layer fits: the windows' does
        return alt, win
    saved = (theirs["cycles"] - ours["cycles"]) * (win.n // one) / (cfg.clock_mhz * 1e6)
    if saved <= 0 or saved <= extra_pack_seconds(win, cfg):
        return None
    return alt, win


def extra_pack_seconds(win: Windows, cfg: HwConfig, repeats: int = 5) -> float:
    """How much longer packing the windows takes on this CPU than packing the plain input
    (runtime/accel.py's border: the compiled layout kernel for a large image of BATCH 1,
    else partition.pack_value): each timed ``repeats`` times on zeros after a first call,
    the least of each (seconds; the border's other costs, the same for both, cancel)."""
    import time

    from .partition import pack_value, packed_shape

    compiled_layout, pack_fast = _COMPILED["compiled_layout"], _COMPILED["pack_fast"]

    x = np.zeros((win.n, win.c, win.h, win.w), np.int8)
    windows = np.empty(win.packed_shape(cfg), np.int8)
    shape = packed_shape(x.shape, cfg)
    plain = np.empty(shape, np.int8)
    if compiled_layout is not None and compiled_layout(x.shape, shape, cfg.batch, cfg.block):
        plain_pack = lambda: pack_fast(x, plain, cfg.block)  # noqa: E731
    else:
        plain_pack = lambda: pack_value(x, cfg, None, out=plain)  # noqa: E731
    stage = stager(win, cfg, windows)

    def least(fn) -> float:
        fn()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        return best
    return least(lambda: stage(x)) - least(plain_pack)


def gather_index(win: Windows, cfg: HwConfig) -> np.ndarray:
    """The staged operand as one gather (cached per geometry): byte j of the packed windows
    (``Windows.packed_shape``, flattened) is byte ``index[j]`` of the source ``x.ravel()``
    followed by ``win.z`` (the padding), 0 (channels past the lanes) and ``win.lanes``."""
    key = (win, cfg.batch, cfg.block)
    cached = _INDEX.get(key)
    if cached is not None:
        return cached
    b, k = cfg.batch, cfg.block
    n, c, h, w, oh, ow = win.n, win.c, win.h, win.w, win.oh, win.ow
    size = n * c * h * w
    pt, pl = win.pads[:2]
    sh, sw = win.strides
    ch = np.arange(win.blocks(k) * k)
    tap, ci = np.divmod(np.minimum(ch, win.channels - 1), c)
    dy, dx = np.divmod(tap, win.kw)
    ys = np.arange(oh)[:, None] * sh + dy[None, :] - pt  # [oh, channels]
    xs = np.arange(ow)[:, None] * sw + dx[None, :] - pl  # [ow, channels]
    inside = (((ys >= 0) & (ys < h))[:, None, :] & ((xs >= 0) & (xs < w))[None, :, :])
    pixel = np.clip(ys, 0, h - 1)[:, None, :] * w + np.clip(xs, 0, w - 1)[None, :, :]
    image = np.arange(n)[:, None, None, None] * (c * h * w)
    src = image + (ci * (h * w))[None, None, None, :] + pixel[None]  # [n, oh, ow, channels]
    src = np.where(inside[None], src, size)  # the padding: z
    lane = ch - win.channels
    extra = np.where(lane < len(win.lanes), size + 2 + lane, size + 1)  # a lane, or 0
    src = np.where((ch < win.channels)[None, None, None, :], src, extra[None, None, None, :])
    cb = win.blocks(k)
    # out[i, j, y, x, bb, kk] = src[i * b + bb, y, x, j * k + kk]
    index = src.reshape(n // b, b, oh, ow, cb, k).transpose(0, 4, 2, 3, 1, 5)
    index = np.ascontiguousarray(index, dtype=np.intp).reshape(-1)
    if len(_INDEX) >= 16:
        _INDEX.pop(next(iter(_INDEX)))
    _INDEX[key] = index
    return index


_INDEX: dict = {}  # gather_index's cache: (Windows, batch, block) -> index

# The compiled packing kernels come from the CPU backend (compiler/cpu/im2col_layout.py,
# packed_layout.py), which this stage does not import (celosia.compiler's stage order):
# the runtime, which imports both, installs them (runtime/accel.py). Without them packing
# is the gather above, with the same bytes.
_COMPILED: dict = {"pack_windows": None, "packer": None, "compiled_layout": None,
                   "pack_fast": None}


def use_compiled(**kernels) -> None:
    """Install the CPU backend's compiled packing kernels (names as in ``_COMPILED``)."""
    unknown = set(kernels) - set(_COMPILED)
    if unknown:
        raise CompilerError(f"im2col.use_compiled: unknown kernels {sorted(unknown)}")
    _COMPILED.update(kernels)


def pack(x: np.ndarray, win: Windows, cfg: HwConfig, out: np.ndarray | None = None) -> np.ndarray:
    """The windows of int8 ``x`` ([n, c, h, w], or [n, c, w] for a 1-D layer) in the staged
    operand's layout (``Windows.packed_shape``), into ``out`` if given: padding reads
    ``win.z``, channels past kh x kw x C are zeros. With BATCH 1 a compiled kernel
    (compiler/cpu/im2col_layout.py), else one gather with a precomputed index
    (``gather_index``); ``pack_reference`` is the definition both equal."""
    x = np.asarray(x)
    if x.dtype != np.int8 or x.size != win.n * win.c * win.h * win.w:
        raise CompilerError(f"im2col: expected int8 [{win.n}, {win.c}, {win.h}, {win.w}], got "
                            f"{x.dtype}{list(x.shape)}")
    shape = win.packed_shape(cfg)
    if out is None:
        out = np.empty(shape, np.int8)
    pack_windows = _COMPILED["pack_windows"]
    if pack_windows is not None and cfg.batch == 1 and out.flags.c_contiguous:  # compiled
        pack_windows(x, win, out, cfg.block)
        return out
    index = gather_index(win, cfg)
    source = np.empty(x.size + 2 + len(win.lanes), np.int8)
    source[:x.size] = x.reshape(-1)
    source[x.size:] = (win.z, 0) + tuple(win.lanes)
    flat = out.reshape(-1) if out.flags.c_contiguous else None
    if flat is not None:
        np.take(source, index, out=flat)
    else:
        out[...] = source[index].reshape(shape)
    return out


def stager(win: Windows, cfg: HwConfig, out: np.ndarray):
    """A function of int8 ``x`` packing its windows into ``out`` (a DRAM buffer of the
    staged operand's shape) as ``pack`` does, with everything that does not depend on
    ``x`` done once (the compiled kernel bound to ``out``, im2col_layout.packer): the
    runtime keeps one per node and executor."""
    packer = _COMPILED["packer"]
    if packer is not None and cfg.batch == 1 and out.flags.c_contiguous:
        return packer(win, cfg.block, out)
    return lambda x: pack(x, win, cfg, out=out)


def pack_reference(x: np.ndarray, win: Windows, cfg: HwConfig) -> np.ndarray:
    """``pack`` by strided numpy views (the definition the gather is tested against)."""
    b, k = cfg.batch, cfg.block
    x = np.asarray(x)
    n, c, oh, ow = win.n, win.c, win.oh, win.ow
    pt, pl, pb, pr = win.pads
    sh, sw = win.strides
    # NHWC, padded with z: a window's row of taps is kw x c contiguous bytes
    xp = np.full((n, win.h + pt + pb, win.w + pl + pr, c), win.z, np.int8)
    xp[:, pt:pt + win.h, pl:pl + win.w] = x.reshape(n, c, win.h, win.w).transpose(0, 2, 3, 1)
    cb = win.blocks(k)
    cols = np.empty((n, oh, ow, cb * k), np.int8)
    cols[..., win.channels:] = 0
    cols[..., win.channels:win.channels + len(win.lanes)] = win.lanes
    s, d = xp.strides, cols.strides
    windows = as_strided(xp, (n, oh, ow, win.kh, win.kw * c), (s[0], sh * s[1], sw * s[2], s[1], 1),
                         writeable=False)
    as_strided(cols, windows.shape, (*d[:3], win.kw * c, 1))[...] = windows
    out = np.empty(win.packed_shape(cfg), np.int8)
    # out[i, j, y, x, bb, kk] = cols[i * b + bb, y, x, j * k + kk]
    out.transpose(0, 4, 2, 3, 1, 5)[...] = cols.reshape(n // b, b, oh, ow, cb, k)
    return out
