"""Partitioning a quantized graph between the accelerator and the CPU.

``annotate`` decides, node by node, what the configured accelerator can run: a 2-D or 1-D
``QConv`` without dilation (conv2d for groups = 1, group_conv2d, compiler/accel/ops_group.py,
for grouped and depthwise ones; both with per-side padding, a stride per axis and 1-D ones
as 2-D with one row), and a ``QGemm``, each with
its fused bias, per-channel requantization, residual add and clip (the ALU
epilogue of compiler/ops.py executes exactly the integer arithmetic that
compiler/graph/qops.py defines), and a ``QMatMul`` of two run-time values (one dense
product per matrix, its second operand packed into the weight layout at run time:
compiler/accel/matmul.py). Everything else stays on the CPU, with the reason named by
what is missing (``cpu_reason``): an integer operator with no accelerator kernel yet, a
conversion between float and int8, or a node the quantizer left in float, with the
quantizer's own reason (its ``float_reason`` attribute).

``regions`` merges accelerator nodes connected by values into regions: inside a region
values stay in DRAM in the packed layout NCHW{BATCH}n{BLOCK}c (channels padded to BLOCK)
and are never transposed; a value is packed once where it enters a region and unpacked
once where the CPU reads it (layout conversions are placed only at region borders).

``layer_for`` gives the accelerator operator (spec, packed constants) for a node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CompilerError

from ..graph.ir import Graph, Node
from . import matmul
from .ops import (ConvSpec, DenseSpec, Epilogue, pack_bias, pack_oihw, pad_channels)
from .ops_group import GroupConvSpec, crop_taps, group_layout_problem, pack_group_kernel

__all__ = ["Placement", "annotate", "cpu_reason", "regions", "AccelLayer", "layer_for", "ACCEL_OPS",
           "dense_rows", "compile_layer",
           "packed_shape", "pack_value", "unpack_value", "value_layouts"]

ACCEL_OPS = ("QConv", "QGemm", "QMatMul")


@dataclass(frozen=True)
class Placement:
    """Where a node runs (``"accel"`` or ``"cpu"``) and why."""

    target: str
    reason: str


def _conv_problem(node: Node, graph: Graph, cfg: HwConfig) -> str | None:
    a = node.attrs
    x = graph.types[node.inputs[0]]
    y = graph.types[node.outputs[0]]
    if len(x.shape) not in (3, 4):
        return (f"{len(x.shape) - 2}-D convolution (the accelerator runs 2-D ones, and 1-D "
                f"ones as 2-D with one row)")
    dims = len(x.shape) - 2
    if any(d != 1 for d in a.get("dilations", (1,) * dims)):
        return f"dilations {list(a['dilations'])}: the accelerator has no dilated convolution"
    group = int(a.get("group", 1))
    if group != 1:
        problem = group_layout_problem(x.shape[1], y.shape[1], group, cfg.block)
        if problem:
            kind = "depthwise" if group == x.shape[1] else "grouped"
            return f"{kind} convolution: {problem}"
    if x.shape[0] % cfg.batch:
        return f"batch {x.shape[0]} is not a multiple of BATCH={cfg.batch}"
    return None


def _conv_geometry(node: Node, graph: Graph) -> tuple:
    """(groups, strides, pads (top, left, bottom, right), kernel (kh, kw)) of a QConv, a 1-D
    one as 2-D with one row."""
    a = node.attrs
    x = graph.types[node.inputs[0]]
    w = graph.initializers[node.inputs[1]]
    dims = len(x.shape) - 2
    strides = [int(s) for s in a.get("strides", (1,) * dims)]
    pads = [int(p) for p in a.get("pads", (0,) * 2 * dims)]
    kernel = tuple(int(d) for d in w.shape[2:])
    if dims == 1:
        strides, pads, kernel = [1] + strides, [0, pads[0], 0, pads[1]], (1,) + kernel
    return int(a.get("group", 1)), tuple(strides), tuple(pads), kernel


def _is_plain_conv2d(node: Node, graph: Graph) -> bool:
    """Whether conv2d (searched schedules) takes the node: groups 1, any strides and pads,
    a 1-D one as 2-D with one row; otherwise group_conv2d runs it."""
    return _conv_geometry(node, graph)[0] == 1


# Integer operators of a quantized graph with no accelerator kernel yet: what they compute.
_INT8_WORK = {
    "QLut": "int8 lookup table",
    "QAdd": "int8 element-wise Add of two values",
    "QMul": "int8 element-wise Mul of two values",
    "QGlobalAveragePool": "int8 global average pool",
    "MaxPool": "int8 max pooling",
    "Relu": "int8 clamp at 0",
}
# Operators that only move int8 values: data movement the accelerator does not do yet.
_INT8_MOVES = ("Reshape", "Flatten", "Concat", "Identity", "Slice", "Transpose", "Squeeze",
               "Unsqueeze", "Split", "Pad", "Resize")


def cpu_reason(node: Node, graph: Graph) -> str:
    """Why a node that is not a QConv/QGemm/QMatMul runs on the CPU, named by what is
    missing."""
    op = node.op
    out = graph.types.get(node.outputs[0]) if node.outputs else None
    if op in ("QuantizeLinear", "DequantizeLinear"):
        return f"{op} of the QDQ model: a conversion between float and int8, on the CPU"
    if op == "Quantize":
        return "Quantize: a float value enters the int8 graph (the accelerator takes int8 values)"
    if op == "Dequantize":
        return "Dequantize: an int8 value leaves for a float reader or output"
    if op in _INT8_WORK:
        return f"{op} ({_INT8_WORK[op]}) has no accelerator kernel yet"
    if op.startswith("Q") or (out is not None and out.dtype == "int8"):
        what = "int8 data movement" if op in _INT8_MOVES else f"{op} on int8 values"
        return f"{op} ({what}) has no accelerator mapping yet"
    why = node.attrs.get("float_reason")
    if why:
        return f"{op} left in float: {why}"
    return f"{op} is a float operator (the accelerator runs int8 ones)"


def _problem(node: Node, graph: Graph, cfg: HwConfig) -> str | None:
    if node.op not in ACCEL_OPS:
        return cpu_reason(node, graph)
    if node.op == "QMatMul":
        return matmul.matmul_problem(node, graph, cfg)
    for i in node.inputs[1:4]:
        if not graph.is_constant(i):
            return f"{node.op} with a weight, bias or multiplier computed at run time"
    unknown = [v for v in node.inputs + node.outputs if v and not graph.types[v].static]
    if unknown:  # programs are compiled for sizes known before run time
        return f"the size of {unknown[0]!r} ({graph.types[unknown[0]]}) is only known at run time"
    if node.op == "QConv":
        return _conv_problem(node, graph, cfg)
    n = graph.types[node.inputs[0]].shape[0]
    if n % cfg.batch:
        return f"batch {n} is not a multiple of BATCH={cfg.batch}"
    return None


def annotate(graph: Graph, cfg: HwConfig, *, accelerate: bool = True) -> dict[str, Placement]:
    """A Placement per node name. With ``accelerate=False`` every node is on the CPU (the
    all-CPU build of the same quantized graph)."""
    out = {}
    for node in graph.nodes:
        problem = "all-CPU build" if not accelerate else _problem(node, graph, cfg)
        if problem is None:
            what = {"QGemm": "dense", "QMatMul": None}.get(node.op, "conv2d")
            if what == "conv2d" and not _is_plain_conv2d(node, graph):
                what = "group_conv2d"
            out[node.name] = Placement("accel", f"{what} with its fused epilogue" if what else
                                       "matmul: a dense product per matrix, its second "
                                       "operand packed into the weight layout at run time")
        else:
            out[node.name] = Placement("cpu", problem)
    # A value lives in DRAM in one layout: a QMatMul that would read or write a value in
    # another layout than an accelerator QConv/QGemm stays on the CPU.
    uses = _layout_uses(graph, out)
    for node in graph.nodes:
        if node.op == "QMatMul" and out[node.name].target == "accel":
            for v in (node.inputs[0], node.outputs[0]):
                other = [(n, lay) for n, lay in uses.get(v, ()) if lay != _matmul_layout(graph, v)]
                if other:
                    out[node.name] = Placement(
                        "cpu", f"QMatMul operand {v!r} is also used by accelerator node "
                               f"{other[0][0]!r} in the {other[0][1]} layout (a value has one "
                               f"layout in DRAM)")
                    break
    return out


def _matmul_layout(graph: Graph, v: str) -> str:
    return matmul.value_layout(graph.types[v].shape)


def _layout_uses(graph: Graph, placements: dict[str, Placement]) -> dict[str, list]:
    """Per value: (accelerator QConv/QGemm node, layout) for each use as data, residual or
    output."""
    uses: dict[str, list] = {}
    for n in graph.nodes:
        if n.op != "QMatMul" and placements[n.name].target == "accel":
            for v in (n.inputs[0], *n.inputs[4:], n.outputs[0]):
                if v:
                    lay = "nchw" if len(graph.types[v].shape) in (3, 4) else "rows"
                    uses.setdefault(v, []).append((n.name, lay))
    return uses


def value_layouts(graph: Graph, placements: dict[str, Placement]) -> dict[str, str]:
    """The DRAM layout ("nchw", "rows" or "matrices") of each value an accelerator node
    reads as data or residual or writes (``annotate`` keeps them consistent)."""
    out = {v: uses[0][1] for v, uses in _layout_uses(graph, placements).items()}
    for n in graph.nodes:
        if n.op == "QMatMul" and placements[n.name].target == "accel":
            for v in (n.inputs[0], n.outputs[0]):
                out[v] = _matmul_layout(graph, v)
    return out


def regions(graph: Graph, placements: dict[str, Placement]) -> dict[str, int]:
    """Region number (0, 1, ...) of each accelerator node: nodes joined by a value that
    one produces and the other reads (as data or residual) share a region."""
    parent: dict[str, str] = {}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    accel = [n for n in graph.nodes if placements[n.name].target == "accel"]
    for n in accel:
        parent[n.name] = n.name
    producer = {o: n for n in accel for o in n.outputs}
    for n in accel:
        for i in (n.inputs[0],) + tuple(n.inputs[4:]):
            if i in producer:
                parent[find(n.name)] = find(producer[i].name)
    numbers: dict[str, int] = {}
    out = {}
    for n in accel:
        root = find(n.name)
        out[n.name] = numbers.setdefault(root, len(numbers))
    return out


# ---- layouts ---------------------------------------------------------------------------------


def _ceil(n: int, k: int) -> int:
    return -(-n // k) * k


# Rows of a [N, C] value (dense layers' data: tokens, batch) past DENSE_ROWS_UNPADDED
# BATCH groups are padded to a multiple of DENSE_ROW_MULTIPLE groups: a dense schedule
# tiles the rows by divisors of their count, and a prime count (ViT's 197 tokens) leaves
# tiles of 1 row or of all of them, which do not fit or reload the weights per row: several
# times slower than tiles of 40 or 50 (compiler/accel/tune_dense.py). Up to
# DENSE_ROWS_UNPADDED groups, a tile of all rows fits and padding would only add work.
DENSE_ROWS_UNPADDED = 64
DENSE_ROW_MULTIPLE = 8


def dense_rows(n: int, cfg: HwConfig) -> int:
    """BATCH groups of rows a [N, C] value holds in DRAM (padding rows are zeros when the
    runtime packs the value; what a layer computes in them is never read)."""
    groups = n // cfg.batch
    return groups if groups <= DENSE_ROWS_UNPADDED else _ceil(groups, DENSE_ROW_MULTIPLE)


def packed_shape(shape: tuple[int, ...], cfg: HwConfig, layout: str | None = None
                 ) -> tuple[int, ...]:
    """The accelerator layout of an int8 NCHW (or [N, C]) value, channels padded (and a
    [N, C] value's rows: ``dense_rows``); with ``layout="matrices"`` that of a QMatMul
    operand [..., M, K] (compiler/accel/matmul.py)."""
    b, k = cfg.batch, cfg.block
    if layout == "matrices":
        return matmul.matrices_shape(shape, cfg)
    if len(shape) == 3:  # [N, C, L]: a 1-D convolution's value, as NCHW with one row
        shape = (shape[0], shape[1], 1, shape[2])
    if len(shape) == 4:
        n, c, h, w = shape
        return (n // b, _ceil(c, k) // k, h, w, b, k)
    n, c = shape
    return (dense_rows(n, cfg), _ceil(c, k) // k, b, k)


def pack_value(x: np.ndarray, cfg: HwConfig, layout: str | None = None) -> np.ndarray:
    """NCHW (or [N, C], or [N, C, L] as NCHW with one row) int8 -> the packed layout,
    channels zero-padded to BLOCK (or the "matrices" layout of a QMatMul operand).

    One strided copy into a fresh array: this runs at every region border of every
    inference, so it avoids np.pad and intermediate copies (their fixed costs are most of
    the time for a small value)."""
    b, k = cfg.batch, cfg.block
    if layout == "matrices":
        return matmul.pack_matrices(x, cfg)
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[:, :, None, :]
    n, c = x.shape[:2]
    cb = -(-c // k)
    full = c // k
    shape = packed_shape(x.shape, cfg)
    # Channel (and row) padding is zeros: a zeroed array (calloc) costs less than zeroing
    # a strided view of the last block.
    out = (np.zeros if cb > full or shape[0] * b > n else np.empty)(shape, x.dtype)
    spatial = x.shape[2:]
    # out[i, j, *s, bb, kk] = x[i*b + bb, j*k + kk, *s]: out's axes put in x's order.
    axes = (0, len(spatial) + 2, 1, len(spatial) + 3, *range(2, 2 + len(spatial)))
    view = out.transpose(axes)[:n // b]  # (N/b, b, C/k, k, *spatial)
    if full:
        view[:, :, :full] = x[:, :full * k].reshape(n // b, b, full, k, *spatial)
    if cb > full:
        view[:, :, full:, :c - full * k] = x[:, full * k:].reshape(n // b, b, 1, c - full * k,
                                                                   *spatial)
    return out


def unpack_value(p: np.ndarray, shape: tuple[int, ...], layout: str | None = None,
                 cfg: HwConfig | None = None) -> np.ndarray:
    """The packed layout -> NCHW (or [N, C], or [N, C, L]) of ``shape`` (padding channels
    and rows dropped); the "matrices" layout needs ``cfg``."""
    if layout == "matrices":
        return matmul.unpack_matrices(p, shape, cfg)
    if len(shape) == 3:
        return unpack_value(p, (shape[0], shape[1], 1, shape[2])).reshape(shape)
    n, c = shape[:2]
    spatial = tuple(shape[2:])
    axes = (0, len(spatial) + 2, 1, len(spatial) + 3, *range(2, 2 + len(spatial)))
    view = p.transpose(axes)  # (N/b, b, C/k, k, *spatial)
    out = np.empty(shape, p.dtype)
    view = view[:n // view.shape[1]]  # rows beyond N: padding
    nb, b, cb, k = view.shape[:4]
    full = c // k
    if full:
        out[:, :full * k].reshape(nb, b, full, k, *spatial)[...] = view[:, :, :full]
    if c > full * k:
        out[:, full * k:].reshape(nb, b, 1, c - full * k, *spatial)[...] = \
            view[:, :, full:full + 1, :c - full * k]
    return out


# ---- accelerator layers ----------------------------------------------------------------------


@dataclass
class AccelLayer:
    """One accelerator node: its operator spec and its constant operands, packed."""

    node: str
    kind: str  # "conv2d", "group_conv2d", "dense" or "matmul" (a dense product per matrix)
    spec: ConvSpec | GroupConvSpec | DenseSpec
    weight: np.ndarray | None  # None for a matmul: its weights are packed at run time
    bias: np.ndarray
    scale: np.ndarray
    residual: bool
    shape: "matmul.MatMulShape | None" = None  # a matmul's operands and matrices

    @property
    def macs(self) -> int:
        return self.spec.macs * (self.shape.count if self.shape is not None else 1)


def _epilogue(node: Node) -> Epilogue:
    a = node.attrs
    shift = int(a["shift"])
    if not 0 <= shift <= 31:
        raise CompilerError(f"node {node.name!r}: shift {shift} is outside [0, 31]")
    return Epilogue(bias=True, scale=True, shift=shift, residual=len(node.inputs) > 4 and
                    bool(node.inputs[4]), lo=int(a["lo"]), hi=int(a["hi"]))


def layer_for(node: Node, graph: Graph, cfg: HwConfig) -> AccelLayer:
    """The accelerator operator of a QConv, QGemm or QMatMul node (see ``annotate``)."""
    b, k = cfg.batch, cfg.block
    if node.op == "QMatMul":
        shape = matmul.matmul_shape(node, graph, cfg)
        bias_p, scale_p = matmul.matmul_constants(node, shape, cfg)
        return AccelLayer(node.name, "matmul", shape.spec(matmul.matmul_epilogue(node)), None,
                          bias_p, scale_p, False, shape)
    x_t = graph.types[node.inputs[0]]
    w, bias, mult = (np.asarray(graph.initializers[i]) for i in node.inputs[1:4])
    epi = _epilogue(node)
    o = w.shape[0]
    op = _ceil(o, k)
    bias_p = pack_bias(pad_channels(bias.astype(np.int32), 0, k), b, k)
    scale_p = pack_bias(pad_channels(mult.astype(np.int32), 0, k), b, k)
    if node.op == "QConv" and not _is_plain_conv2d(node, graph):
        group, strides, pads, (kh, kw) = _conv_geometry(node, graph)
        n, c = x_t.shape[:2]
        h, wd = (1, x_t.shape[2]) if len(x_t.shape) == 3 else x_t.shape[2:]
        spec, w4 = crop_taps(GroupConvSpec(n=n, c=c, h=h, w=wd, o=o, kh=kh, kw=kw,
                                           groups=group, strides=strides, pads=pads,
                                           block=k, epilogue=epi),
                             w.reshape(o, c // group, kh, kw))
        weight = pack_group_kernel(w4, spec)
        kind = "group_conv2d"
    elif node.op == "QConv":
        _, strides, pads, (kh, kw) = _conv_geometry(node, graph)
        n, c = x_t.shape[:2]
        h, wd = (1, x_t.shape[2]) if len(x_t.shape) == 3 else x_t.shape[2:]
        # without the kernel rows and columns that only ever meet padding (crop_taps)
        g, w4 = crop_taps(GroupConvSpec(n=n, c=c, h=h, w=wd, o=o, kh=kh, kw=kw,
                                        strides=strides, pads=pads, block=k, epilogue=epi),
                          w.reshape(o, c, kh, kw))
        spec = ConvSpec(n=n, c=_ceil(c, k), h=h, w=wd, o=op, kh=g.kh, kw=g.kw,
                        stride=g.strides, pad=g.pads, epilogue=epi)
        weight = pack_oihw(pad_channels(pad_channels(w4, 0, k), 1, k), k)
        kind = "conv2d"
    else:
        n, kdim = x_t.shape
        spec = DenseSpec(n=dense_rows(n, cfg) * b, k=_ceil(kdim, k), o=op, epilogue=epi)
        wp = pad_channels(pad_channels(w, 0, k), 1, k)
        weight = np.ascontiguousarray(wp.reshape(op // k, k, spec.k // k, k).transpose(0, 2, 1, 3))
        kind = "dense"
    return AccelLayer(node.name, kind, spec, weight.astype(np.int8), bias_p, scale_p,
                      epi.residual)


# ---- schedules -------------------------------------------------------------------------------


def compile_layer(layer: AccelLayer, cfg: HwConfig, *, top: int = 4):
    """(AcceleratorFunction, knobs) for a layer: conv2d knobs searched on the cycle model
    (compiler/tune.py, cached on disk), dense knobs likewise (compiler/tune_dense.py),
    group_conv2d knobs by ``group_conv_knobs`` (compiler/accel/ops_group.py)."""
    from .ops import conv2d, dense
    from .ops_group import group_conv2d, group_conv_knobs
    from .tune import tune_conv
    from .tune_dense import tune_dense

    if layer.kind == "group_conv2d":
        knobs = group_conv_knobs(cfg, layer.spec)
        return group_conv2d(cfg, layer.spec, knobs, name=layer.node), knobs
    if layer.kind == "conv2d":
        # The batch is the outermost host loop of the schedule: knobs found for one batch
        # tile serve any batch (and the search stays cheap and its cache shared).
        knobs, _ = tune_conv(cfg, replace(layer.spec, n=cfg.batch), top=top)
        return conv2d(cfg, layer.spec, knobs, name=layer.node), knobs
    # a QGemm, or a QMatMul: the dense product of one matrix
    knobs, _ = tune_dense(cfg, layer.spec, top=min(top, 3))
    return dense(cfg, layer.spec, knobs, name=layer.node), knobs
