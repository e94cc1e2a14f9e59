"""Partitioning a quantized graph between the accelerator and the CPU.

``annotate`` decides, node by node, what the configured accelerator can run: a 2-D or 1-D
``QConv`` without dilation (conv2d for groups = 1 with one stride and one padding for both
axes; group_conv2d, compiler/accel/ops_group.py, for grouped and depthwise ones, per-side
padding, a stride per axis and 1-D ones as 2-D with one row), and a ``QGemm``, each with
its fused bias, per-channel requantization, residual add and clip (the ALU
epilogue of compiler/ops.py executes exactly the integer arithmetic that
compiler/graph/qops.py defines). Everything else stays on the CPU, with the reason named by
what is missing (``cpu_reason``): an integer operator with no accelerator kernel yet, a
MatMul with two run-time operands, a conversion between float and int8, or a node the
quantizer left in float, with the quantizer's own reason (its ``float_reason`` attribute).

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
from .ops import (ConvSpec, DenseSpec, Epilogue, pack_bias, pack_nchw, pack_oihw, pad_channels,
                  unpack_nchw)
from .ops_group import GroupConvSpec, crop_taps, group_layout_problem, pack_group_kernel

__all__ = ["Placement", "annotate", "cpu_reason", "regions", "AccelLayer", "layer_for", "ACCEL_OPS",
           "dense_knobs", "compile_layer",
           "packed_shape", "pack_value", "unpack_value"]

ACCEL_OPS = ("QConv", "QGemm")


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
    """Whether conv2d (searched schedules) takes the node: 2-D, groups 1, one stride and
    one padding for both axes; otherwise group_conv2d runs it."""
    group, strides, pads, _ = _conv_geometry(node, graph)
    return (len(graph.types[node.inputs[0]].shape) == 4 and group == 1
            and strides[0] == strides[1] and len(set(pads)) == 1)


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
    """Why a node that is not a QConv/QGemm runs on the CPU, named by what is missing."""
    op = node.op
    out = graph.types.get(node.outputs[0]) if node.outputs else None
    if op == "QMatMul":
        return ("MatMul with two run-time operands (QMatMul): the GEMM core's second operand "
                "is a weight packed at build time; packing a run-time value into the weight "
                "layout is not done yet")
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
            what = "dense" if node.op != "QConv" else "conv2d" if _is_plain_conv2d(node, graph) \
                else "group_conv2d"
            out[node.name] = Placement("accel", f"{what} with its fused epilogue")
        else:
            out[node.name] = Placement("cpu", problem)
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


def packed_shape(shape: tuple[int, ...], cfg: HwConfig) -> tuple[int, ...]:
    """The accelerator layout of an int8 NCHW (or [N, C]) value, channels padded."""
    b, k = cfg.batch, cfg.block
    if len(shape) == 3:  # [N, C, L]: a 1-D convolution's value, as NCHW with one row
        shape = (shape[0], shape[1], 1, shape[2])
    if len(shape) == 4:
        n, c, h, w = shape
        return (n // b, _ceil(c, k) // k, h, w, b, k)
    n, c = shape
    return (n // b, _ceil(c, k) // k, b, k)


def pack_value(x: np.ndarray, cfg: HwConfig) -> np.ndarray:
    """NCHW (or [N, C], or [N, C, L] as NCHW with one row) int8 -> the packed layout,
    channels zero-padded to BLOCK."""
    b, k = cfg.batch, cfg.block
    x = pad_channels(x, 1, k)
    if x.ndim == 3:
        x = x[:, :, None, :]
    if x.ndim == 4:
        return pack_nchw(x, b, k)
    n, c = x.shape
    return np.ascontiguousarray(x.reshape(n // b, b, c // k, k).transpose(0, 2, 1, 3))


def unpack_value(p: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The packed layout -> NCHW (or [N, C], or [N, C, L]) of ``shape`` (padding channels
    dropped)."""
    if p.ndim == 6:
        x = unpack_nchw(p)
        if len(shape) == 3:
            x = x.reshape(x.shape[0], x.shape[1], x.shape[3])
    else:
        nb, cb, b, k = p.shape
        x = p.transpose(0, 2, 1, 3).reshape(nb * b, cb * k)
    return np.ascontiguousarray(x[:, :shape[1]])


# ---- accelerator layers ----------------------------------------------------------------------


@dataclass
class AccelLayer:
    """One accelerator node: its operator spec and its constant operands, packed."""

    node: str
    kind: str  # "conv2d", "group_conv2d" or "dense"
    spec: ConvSpec | GroupConvSpec | DenseSpec
    weight: np.ndarray
    bias: np.ndarray
    scale: np.ndarray
    residual: bool

    @property
    def macs(self) -> int:
        return self.spec.macs


def _epilogue(node: Node) -> Epilogue:
    a = node.attrs
    shift = int(a["shift"])
    if not 0 <= shift <= 31:
        raise CompilerError(f"node {node.name!r}: shift {shift} is outside [0, 31]")
    return Epilogue(bias=True, scale=True, shift=shift, residual=len(node.inputs) > 4 and
                    bool(node.inputs[4]), lo=int(a["lo"]), hi=int(a["hi"]))


def layer_for(node: Node, graph: Graph, cfg: HwConfig) -> AccelLayer:
    """The accelerator operator of a QConv or QGemm node (see ``annotate``)."""
    b, k = cfg.batch, cfg.block
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
        n, c, h, wd = x_t.shape
        kh, kw = w.shape[2:]
        spec = ConvSpec(n=n, c=_ceil(c, k), h=h, w=wd, o=op, kh=kh, kw=kw,
                        stride=int(node.attrs.get("strides", (1, 1))[0]),
                        pad=int(node.attrs.get("pads", (0, 0, 0, 0))[0]), epilogue=epi)
        weight = pack_oihw(pad_channels(pad_channels(w, 0, k), 1, k), k)
        kind = "conv2d"
    else:
        n, kdim = x_t.shape
        spec = DenseSpec(n=n, k=_ceil(kdim, k), o=op, epilogue=epi)
        wp = pad_channels(pad_channels(w, 0, k), 1, k)
        weight = np.ascontiguousarray(wp.reshape(op // k, k, spec.k // k, k).transpose(0, 2, 1, 3))
        kind = "dense"
    return AccelLayer(node.name, kind, spec, weight.astype(np.int8), bias_p, scale_p,
                      epi.residual)


# ---- schedules -------------------------------------------------------------------------------


def dense_knobs(cfg: HwConfig, spec: DenseSpec):
    """Knobs for a dense layer: among the tiles whose buffers fit, the least DRAM traffic
    (weights are reloaded once per batch tile, inputs once per output tile), then the
    largest tiles; two virtual threads where the output tiles pair up."""
    from .ops import DenseKnobs
    from .tune import _divisors

    b, k = cfg.batch, cfg.block
    nb, kb, ob = spec.n // b, spec.k // k, spec.o // k
    extra = 1 + spec.epilogue.bias + spec.epilogue.scale + spec.epilogue.residual
    best = None
    for tn in _divisors(nb):
        for to in _divisors(ob):
            for tk in _divisors(kb):
                vt = 2 if (ob // to) % 2 == 0 else 1
                rows = {"inp": vt * tn * tk, "wgt": vt * to * tk, "acc": vt * tn * to * extra}
                if rows["inp"] > cfg.inp_depth or rows["wgt"] > cfg.wgt_depth or \
                        rows["acc"] > cfg.acc_depth or tn * to * tk > cfg.uop_depth // 2:
                    continue
                traffic = (nb // tn) * ob * kb * k * k + (ob // to) * nb * kb * b * k
                key = (traffic, -(tn * to * tk))
                if best is None or key < best[0]:
                    best = (key, DenseKnobs(tile_n=tn, tile_o=to, tile_k=tk, vthreads=vt))
    if best is None:
        raise CompilerError(f"no schedule of {spec} fits this configuration's buffers")
    return best[1]


def compile_layer(layer: AccelLayer, cfg: HwConfig, *, top: int = 4):
    """(AcceleratorFunction, knobs) for a layer: conv2d knobs searched on the cycle model
    (compiler/tune.py, cached on disk), group_conv2d knobs by ``group_conv_knobs``, dense
    knobs by ``dense_knobs``."""
    from .ops import conv2d, dense
    from .ops_group import group_conv2d, group_conv_knobs
    from .tune import tune_conv

    if layer.kind == "group_conv2d":
        knobs = group_conv_knobs(cfg, layer.spec)
        return group_conv2d(cfg, layer.spec, knobs, name=layer.node), knobs

    if layer.kind == "conv2d":
        # The batch is the outermost host loop of the schedule: knobs found for one batch
        # tile serve any batch (and the search stays cheap and its cache shared).
        knobs, _ = tune_conv(cfg, replace(layer.spec, n=cfg.batch), top=top)
        return conv2d(cfg, layer.spec, knobs, name=layer.node), knobs
    knobs = dense_knobs(cfg, layer.spec)
    return dense(cfg, layer.spec, knobs, name=layer.node), knobs
