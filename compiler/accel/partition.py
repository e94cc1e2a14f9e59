"""Partitioning a quantized graph between the accelerator and the CPU.

``annotate`` decides, node by node, what the configured accelerator can run: a 2-D or 1-D
``QConv`` (a dilated one as its kernel with zeros between the taps, ``conv_weight``;
conv2d for groups = 1, group_conv2d, compiler/accel/ops_group.py, for grouped and
depthwise ones; both with per-side padding, a stride per axis, 1-D ones
as 2-D with one row, and a nonzero ``pad_value`` through a bias table, border.py), and a
``QGemm`` (and the ALU-only nodes and views below), each with
its fused bias, per-channel requantization, residual add and clip (the ALU epilogue of
compiler/ops.py executes exactly the integer arithmetic that
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

Regions grow across nodes that need no GEMM, so that values leave the accelerator only
where the model really does: an int8 ``MaxPool`` runs on the ALU (compiler/accel/ops_alu.py),
and so do ``QGlobalAveragePool``, ``QAdd``, ``QMul`` (also by a per-channel gate) and an int8
``Relu`` (``ALU_OPS``), and ``Reshape``/``Flatten``/``Squeeze``/
``Unsqueeze``/``Identity`` (``ALIAS_OPS``) are views
with no program: their output is the packed bytes of their input (its *root*, see
``root_of``). A view whose packed bytes coincide with its own packed layout (same batch
and channels, same number of pixels: [N, C, 1, 1] <-> [N, C], [N, C, H, W] <-> [N, C, HW,
1]) may be read by any accelerator node; a flatten of [N, C, H, W] to [N, CHW] only by a
QGemm as its data, whose weight columns are permuted at build time to read the packed
order (``layer_for``); the CPU reads any view by unpacking its root. A channel ``Concat``
(``PLACED_OPS``) at BLOCK boundaries, for one batch block, is a placement: its inputs are
allocated inside its output (``concat_slices``), so their producers write their slices
and nothing is copied. These nodes go to the accelerator only when their inputs are made
there, or by a CPU node computed in place on the packed layout (a ``QLut`` between
accelerator nodes, ``packed_nodes`` below; otherwise they would add a crossing, not save
one). ``dram_reads`` names the values an accelerator node reads from DRAM.

A quantized recurrent layer (``RECURRENT_OPS``: QLSTM, QGRU, QRNN; compiler/accel/
recurrent.py), and an If, Loop or Scan whose bodies hold integer products (QMatMulWide or
a recurrent layer, compiler/graph/qbody.py), are accelerator nodes whose values stay on the
host (``is_host_node``): they run their products' programs on operands they pack
themselves, step by step or iteration by iteration (runtime/accel_recurrent.py), and read
or write no value in DRAM.

``layer_for`` gives the accelerator operator (spec, packed constants) for a node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CompilerError

from ..graph.ir import Graph, Node
from ..graph.qops import pad_value
from . import matmul
from .border import bias_table, pack_bias_table
from .ops import (ConvSpec, DenseSpec, Epilogue, pack_bias, pack_oihw, pad_channels)
from .ops_alu import EltSpec, GapSpec, PoolSpec, elt_constants, gap_constants
from .ops_group import GroupConvSpec, crop_taps, group_layout_problem, pack_group_kernel
from .recurrent import (CONTROL_OPS, RECURRENT_OPS, control_problem, is_host_node,
                        recurrent_problem, wide_problem)

__all__ = ["Placement", "annotate", "cpu_reason", "regions", "AccelLayer", "layer_for", "ACCEL_OPS",
           "dense_rows", "compile_layer", "ALIAS_OPS", "ALU_OPS", "PLACED_OPS", "dram_reads",
           "root_of", "concat_slices",
           "packed_shape", "pack_value", "unpack_value", "value_layouts", "IN_PLACE_OPS",
           "in_dram", "in_place_problem", "packed_nodes"]

# Nodes with an ALU-only program (compiler/accel/ops_alu.py).
ALU_OPS = ("MaxPool", "QGlobalAveragePool", "QAdd", "QMul", "Relu")
ACCEL_OPS = ("QConv", "QGemm", "QMatMul", *ALU_OPS)
# Views: the output is the input's packed bytes (no program runs).
ALIAS_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
# Placement, no program: a channel Concat whose inputs are written into their slices of its
# output by their producers (``concat_slices``).
PLACED_OPS = ("Concat",)


def dram_reads(node: Node) -> tuple[str, ...]:
    """The values an accelerator node reads from DRAM (packed there first if the CPU made
    them): a QConv's or QGemm's data and residual, another node's data input."""
    if node.op in ("QConv", "QGemm"):
        return tuple(v for v in (node.inputs[0], *node.inputs[4:]) if v)
    if is_host_node(node):  # its operands are packed by the runtime, per product
        return ()
    if node.op in ("QAdd", "QMul"):
        return tuple(node.inputs[:2])
    if node.op == "Concat":
        return tuple(node.inputs)
    return (node.inputs[0],)


def concat_slices(graph: Graph, placements: dict, cfg: HwConfig) -> dict[str, tuple[str, int]]:
    """{input value: (output value, byte offset)} of the accelerator's Concat nodes: each
    input lies in DRAM inside its Concat's output, at its channel offset (one batch block,
    so a run of channel blocks is contiguous)."""
    out = {}
    for node in graph.nodes:
        if node.op in PLACED_OPS and placements[node.name].target == "accel":
            y = graph.types[node.outputs[0]].shape
            pixels = int(np.prod(y[2:]))
            c0 = 0
            for v in node.inputs:
                out[v] = (node.outputs[0], c0 // cfg.block * pixels * cfg.batch * cfg.block)
                c0 += graph.types[v].shape[1]
    return out


def root_of(value: str, producer: dict, placements: dict) -> str:
    """The value whose packed bytes ``value`` is: itself, or for the output of a view on the
    accelerator, its input's root. ``producer``: value -> node."""
    while True:
        p = producer.get(value)
        if p is None or p.op not in ALIAS_OPS or placements[p.name].target != "accel":
            return value
        value = p.inputs[0]


def _same_bytes(a: tuple, b: tuple) -> bool:
    """Whether the packed layouts of shapes ``a`` and ``b`` are the same bytes."""
    return (len(a) in (2, 4) and len(b) in (2, 4) and a[:2] == b[:2] and
            int(np.prod(a[2:])) == int(np.prod(b[2:])))


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
    dil = [int(d) for d in a.get("dilations", (1,) * dims)]
    if any(d != 1 for d in dil):
        kernel = graph.types[node.inputs[1]].shape[2:]
        real = int(np.prod(kernel))
        spread = int(np.prod([(k - 1) * d + 1 for k, d in zip(kernel, dil)]))
        if spread > DILATION_SPREAD_MAX * real:
            return (f"dilations {dil}: run as a kernel with zeros between its taps it would "
                    f"do {spread / real:.1f}x the multiply-adds (the accelerator has no "
                    f"dilated convolution; at most {DILATION_SPREAD_MAX}x)")
    group = int(a.get("group", 1))
    if group != 1:
        problem = group_layout_problem(x.shape[1], y.shape[1], group, cfg.block)
        if problem:
            kind = "depthwise" if group == x.shape[1] else "grouped"
            return f"{kind} convolution: {problem}"
    if x.shape[0] % cfg.batch:
        return f"batch {x.shape[0]} is not a multiple of BATCH={cfg.batch}"
    return None


# A dilated QConv runs as the convolution with zeros between its kernel's taps (the same
# integer sums: a zero weight adds nothing, at the border too), when that kernel has at most
# this many times its taps (a 3x3 one of dilation 2 has 25 for 9; of dilation 3, 49).
DILATION_SPREAD_MAX = 6


def conv_weight(node: Node, graph: Graph) -> np.ndarray:
    """A QConv's weight [O, C/groups, kh, kw] as the accelerator runs it: a dilated one with
    zeros between its taps (``DILATION_SPREAD_MAX``), a 1-D one as 2-D with one row."""
    w = np.asarray(graph.initializers[node.inputs[1]])
    dims = w.ndim - 2
    dil = [int(d) for d in node.attrs.get("dilations", (1,) * dims)]
    if any(d != 1 for d in dil):
        spread = np.zeros(w.shape[:2] + tuple((k - 1) * d + 1 for k, d in
                                              zip(w.shape[2:], dil)), w.dtype)
        spread[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in dil)] = w
        w = spread
    return w.reshape(w.shape[:2] + (1,) + w.shape[2:]) if dims == 1 else w


def _conv_geometry(node: Node, graph: Graph) -> tuple:
    """(groups, strides, pads (top, left, bottom, right), kernel (kh, kw)) of a QConv, a 1-D
    one as 2-D with one row, a dilated one with zeros between its taps (``conv_weight``)."""
    a = node.attrs
    x = graph.types[node.inputs[0]]
    w = graph.initializers[node.inputs[1]]
    dims = len(x.shape) - 2
    strides = [int(s) for s in a.get("strides", (1,) * dims)]
    pads = [int(p) for p in a.get("pads", (0,) * 2 * dims)]
    dil = [int(d) for d in a.get("dilations", (1,) * dims)]
    kernel = tuple((int(k) - 1) * d + 1 for k, d in zip(w.shape[2:], dil))
    if dims == 1:
        strides, pads, kernel = [1] + strides, [0, pads[0], 0, pads[1]], (1,) + kernel
    return int(a.get("group", 1)), tuple(strides), tuple(pads), kernel


def _is_plain_conv2d(node: Node, graph: Graph) -> bool:
    """Whether conv2d (searched schedules) takes the node: groups 1, any strides and pads,
    a 1-D one as 2-D with one row; otherwise group_conv2d runs it."""
    return _conv_geometry(node, graph)[0] == 1


# Integer operators of a quantized graph with no accelerator kernel: what they compute
# (int8 MaxPool, QGlobalAveragePool, QAdd, QMul and Relu are ALU_OPS, placed by
# ``_movement_problem``).
_INT8_WORK = {
    "QLut": "int8 lookup table",
}
_WHY_NOT = {
    "QLut": "the ALU has no table lookup (its operations are MIN, MAX, ADD, SHR and MUL)",
}
# Operators that only move int8 values: data movement the accelerator does not do yet
# (views and Concat are ALIAS_OPS and PLACED_OPS).
_INT8_MOVES = ("Slice", "Transpose", "Split", "Pad", "Resize")


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
    if op in _INT8_WORK and out is not None and out.dtype == "int8":
        return f"{op} ({_INT8_WORK[op]}): {_WHY_NOT[op]}"
    if op.startswith("Q") or (out is not None and out.dtype == "int8"):
        what = "int8 data movement" if op in _INT8_MOVES else f"{op} on int8 values"
        return f"{op} ({what}) has no accelerator mapping yet"
    why = node.attrs.get("float_reason")
    if why:
        return f"{op} left in float: {why}"
    return f"{op} is a float operator (the accelerator runs int8 ones)"


def _movement_problem(node: Node, graph: Graph, cfg: HwConfig, producer: dict,
                      out: dict, packed=()) -> str | None:
    """Why a node of ALU_OPS or a view stays on the CPU (None: it goes to the
    accelerator)."""
    x = node.inputs[0] if node.inputs else None
    y = node.outputs[0] if node.outputs else None
    reads = dram_reads(node) if x else ()
    if x is None or y is None or any(graph.types[v].dtype != "int8" for v in (*reads, y)):
        return cpu_reason(node, graph)
    unknown = [v for v in (*reads, y) if not graph.types[v].static]
    if unknown:
        return f"the size of {unknown[0]!r} ({graph.types[unknown[0]]}) is only known at run time"
    if _made_on_cpu(node, producer, out, packed):
        return (f"{node.op} of a value the CPU makes: on the accelerator it would add a "
                f"crossing between CPU and accelerator, not save one")
    xs, ys = graph.types[x].shape, graph.types[y].shape
    if xs[0] % cfg.batch:
        return f"batch {xs[0]} is not a multiple of BATCH={cfg.batch}"
    if node.op in ALU_OPS and len(xs) != 4:
        return f"{node.op} of a {len(xs) - 2}-D image (the accelerator pools 2-D ones)"
    if node.op == "MaxPool":
        if len(node.outputs) > 1 and node.outputs[1]:
            return "MaxPool with its Indices output: the accelerator computes the maximum only"
        return None
    if node.op == "QGlobalAveragePool":
        shift = int(node.attrs["shift"])
        return None if 1 <= shift <= 31 else f"shift {shift} is outside [1, 31]"
    if node.op == "Concat":
        return _concat_problem(node, graph, cfg, producer, out)
    if node.op in ("QAdd", "QMul", "Relu"):
        if len(ys) not in (2, 4):
            return f"{node.op} of a {len(ys)}-D value (the packed layout holds 2-D and 4-D ones)"
        gates = [v for v in reads if graph.types[v].shape != ys]
        if node.op == "QMul" and len(gates) == 1 and len(ys) == 4 and \
                graph.types[gates[0]].shape == (*ys[:2], 1, 1):
            gates = []  # squeeze-excitation's gate: one row per channel block's pixels
        if gates:
            what = ("values of one shape, or a per-channel gate [N, C, 1, 1]"
                    if node.op == "QMul" else "values of one shape")
            return (f"{node.op} with a broadcast operand ({', '.join(str(graph.types[v]) for v in reads)}"
                    f" -> {graph.types[y]}): the ALU program takes {what}")
        if node.op in ("QAdd", "QMul") and not 1 <= int(node.attrs["shift"]) <= 31:
            return f"shift {node.attrs['shift']} is outside [1, 31]"
        return None
    root = root_of(x, producer, out)
    rs = graph.types[root].shape
    if len(ys) not in (2, 4) or ys[0] != rs[0]:
        return (f"{node.op} to {list(ys)}: the packed layout keeps 2-D and 4-D values with "
                f"the batch first ({root!r} is {list(rs)})")
    if not _same_bytes(ys, rs) and not (len(ys) == 2 and len(rs) == 4):
        return (f"{node.op} {list(rs)} -> {list(ys)} reorders the packed bytes (not a view)")
    return None


def _concat_problem(node: Node, graph: Graph, cfg: HwConfig, producer: dict,
                    out: dict) -> str | None:
    """Why a Concat cannot be placed: its inputs written into slices of its output."""
    ys = graph.types[node.outputs[0]].shape
    axis = int(node.attrs.get("axis", 1)) % len(ys)
    if len(ys) not in (2, 4) or axis != 1:
        return (f"Concat on axis {axis} of a {len(ys)}-D value: the accelerator places "
                f"channel slices (axis 1 of 2-D or 4-D values)")
    if ys[0] != cfg.batch:
        return (f"Concat of a batch of {ys[0]}: a channel slice is contiguous in the packed "
                f"layout for one batch block (N = BATCH = {cfg.batch}) only")
    if len(set(node.inputs)) != len(node.inputs):
        return "Concat of one value twice: a value lies in one place"
    pixels = int(np.prod(ys[2:]))
    align = max(64, cfg.batch * cfg.block)
    c0 = 0
    for v in node.inputs:
        p = producer[v]
        if p.op in ALIAS_OPS + PLACED_OPS:
            return (f"Concat of {v!r}, made by a {p.op} that places no bytes of its own: "
                    f"only a computed value is written into its slice")
        others = [n.name for n in graph.nodes if n is not node and n.op in PLACED_OPS and
                  v in n.inputs]
        if others:
            return f"Concat of {v!r}, which {others[0]!r} concatenates too"
        if c0 % cfg.block:
            return (f"Concat: {v!r} starts at channel {c0}, not at a BLOCK ({cfg.block}) "
                    f"boundary")
        offset = c0 // cfg.block * pixels * cfg.batch * cfg.block
        if offset % align:
            return (f"Concat: {v!r} starts at byte {offset} of the packed output, not a "
                    f"multiple of the {align}-byte alignment of accelerator buffers")
        c0 += graph.types[v].shape[1]
    return None


def _made_on_cpu(node: Node, producer: dict, out: dict, packed=()) -> bool:
    """Whether a value the node reads from DRAM is made on the CPU (or is an input): not by
    an accelerator node nor by a node the CPU computes in place on the packed layout
    (``packed``, ``packed_nodes``)."""
    return not all(in_dram(v, producer, out, packed) for v in dram_reads(node))


def _check_views(graph: Graph, out: dict, cfg: HwConfig) -> None:
    """Views on the accelerator whose accelerator readers cannot read their bytes (or, for
    a flattening read by a QGemm, would read more than twice the channels: padding to
    BLOCK), and ALU nodes/views whose input is no longer made on the accelerator, go back
    to the CPU (until nothing changes)."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    changed = True
    while changed:
        changed = False
        packed = packed_nodes(graph, out)  # (a change below is seen by the next round)
        for n in graph.nodes:
            if out[n.name].target != "accel":
                continue
            if n.op in ALIAS_OPS + ALU_OPS + PLACED_OPS:
                if _made_on_cpu(n, producer, out, packed):
                    out[n.name] = Placement("cpu", f"{n.op} of a value the CPU makes: on the "
                                            f"accelerator it would add a crossing, not save one")
                    changed = True
                continue
            for v in dram_reads(n):
                p = producer.get(v)
                if p is None or p.op not in ALIAS_OPS or out[p.name].target != "accel":
                    continue
                root = root_of(v, producer, out)
                vs, rs = graph.types[v].shape, graph.types[root].shape
                if _same_bytes(vs, rs):
                    continue
                if n.op == "QGemm" and v == n.inputs[0]:
                    c, block = rs[1], cfg.block
                    if _ceil(c, block) <= 2 * c:
                        continue
                    why = (f"{p.op} {list(rs)} -> {list(vs)}: its reader {n.name!r} (QGemm) "
                           f"reading the packed bytes would pad {c} channels to "
                           f"{_ceil(c, block)} ({_ceil(c, block) / c:.1f}x its work and "
                           f"weights); the CPU flattens it instead")
                    out[p.name] = Placement("cpu", why)
                    changed = True
                    continue
                out[p.name] = Placement(
                    "cpu", f"{p.op} {list(rs)} -> {list(vs)}: its reader {n.name!r} ({n.op}) "
                    f"would read the packed bytes in another order (only a QGemm's data "
                    f"reads a flattened value)")
                changed = True


def _problem(node: Node, graph: Graph, cfg: HwConfig) -> str | None:
    if node.op in RECURRENT_OPS:
        return recurrent_problem(node, graph)
    if node.op in CONTROL_OPS:
        return control_problem(node)
    if node.op in ("QMatMulWide", "QConvWide"):
        return wide_problem(node, graph)
    if node.op not in ("QConv", "QGemm", "QMatMul"):
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


def annotate(graph: Graph, cfg: HwConfig, *, accelerate: bool = True,
             claimed: dict | None = None) -> dict[str, Placement]:
    """A Placement per node name. With ``accelerate=False`` every node is on the CPU (the
    all-CPU build of the same quantized graph). ``claimed``: nodes another target has taken
    already (node name -> its Placement, runtime/targets.py): the accelerator places the
    others around them, reading what they make as values made off the accelerator."""
    out = {}
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    packed: set[str] = set()  # CPU nodes computed in place on the packed layout so far
    claimed = claimed or {}
    for node in graph.nodes:
        if node.name in claimed:
            out[node.name] = claimed[node.name]
            continue
        if not accelerate:
            problem = "all-CPU build"
        elif node.op in ALIAS_OPS + ALU_OPS + PLACED_OPS:
            problem = _movement_problem(node, graph, cfg, producer, out, packed)
        else:
            problem = _problem(node, graph, cfg)
        if problem is None:
            what = {"QGemm": "dense with its fused epilogue",
                    "QMatMul": "matmul: a dense product per matrix, its second operand packed "
                               "into the weight layout at run time",
                    "MaxPool": "max pooling on the ALU",
                    "QGlobalAveragePool": "global average pooling on the ALU",
                    "QAdd": "element-wise int8 Add on the ALU",
                    "QMul": "element-wise int8 Mul on the ALU",
                    "Relu": "int8 Relu on the ALU",
                    "Concat": "its inputs written into their channel slices (no program)",
                    **dict.fromkeys(RECURRENT_OPS, "recurrent layer: the input projection "
                                    "and h x R per step on the accelerator (16-bit activations "
                                    "as two int8 GEMM passes), the gates on the CPU"),
                    **dict.fromkeys(CONTROL_OPS, "control flow: its bodies' integer products "
                                    "on the accelerator at every iteration (16-bit "
                                    "activations as int8 GEMM passes), the rest of the bodies "
                                    "on the CPU"),
                    **dict.fromkeys(("QMatMulWide", "QConvWide"), "16-bit integer product "
                                    "(int8 GEMM passes), float epilogue on the CPU")}.get(
                        node.op, "a view of its input's packed bytes (no program)")
            if node.op == "QConv":
                what = ("conv2d" if _is_plain_conv2d(node, graph) else "group_conv2d") + \
                    " with its fused epilogue"
            out[node.name] = Placement("accel", what)
        else:
            out[node.name] = Placement("cpu", problem)
            if accelerate and in_place_problem(node, graph, producer, out, packed) is None:
                packed.add(node.name)
    # A value lives in DRAM in one layout: a QMatMul that would read or write a value in
    # another layout than another accelerator node stays on the CPU.
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
    if accelerate:
        _check_views(graph, out, cfg)
    return out


def _matmul_layout(graph: Graph, v: str) -> str:
    return matmul.value_layout(graph.types[v].shape)


def _layout_uses(graph: Graph, placements: dict[str, Placement]) -> dict[str, list]:
    """Per value: (accelerator node other than a QMatMul, layout) for each value it reads
    from DRAM or writes."""
    uses: dict[str, list] = {}
    for n in graph.nodes:
        if n.op != "QMatMul" and not is_host_node(n) and placements[n.name].target == "accel":
            for v in (*dram_reads(n), n.outputs[0]):
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
        for i in dram_reads(n):
            if i in producer:
                parent[find(n.name)] = find(producer[i].name)
    numbers: dict[str, int] = {}
    out = {}
    for n in accel:
        root = find(n.name)
        out[n.name] = numbers.setdefault(root, len(numbers))
    return out


# ---- CPU nodes in place on the packed layout -------------------------------------------------

# CPU nodes computed in place on the accelerator's packed layout.
#
# An element-wise int8 node (``QLut``, and ``QAdd``/``QMul`` of two operands of the output's
# shape) that the accelerator cannot run (a table lookup: the ALU has no gather, ISA.md's ALU
# ops are MIN, MAX, ADD, SHR, MUL) but whose operands the accelerator made does not need
# them in the CPU's NCHW layout: it computes the same function of every element in any
# order. Such a node runs on the CPU *in place*: the runtime reads its operands' packed bytes
# from DRAM as they are, the CPU kernel computes on them as flat int8 arrays (a CPU segment
# built for those flat types), and the result goes back to DRAM in the same packed layout.
# Nothing is unpacked or packed; its output is a DRAM value like an accelerator node's, so
# the accelerator nodes after it read it where it is and the ALU nodes and views after it
# stay on the accelerator (``annotate``).
#
# Padding: the packed layout pads channels to BLOCK (and a [N, C] value's rows, ``dense_rows``).
# An element-wise node computes garbage there (a table maps the 0 of a padding channel to
# ``table[128]``, Sigmoid's 0.5). Nothing reads it into a real output: a convolution's or
# dense layer's weights for padding input channels are zero, a depthwise convolution, pooling
# and element-wise nodes keep padding channels to themselves, a Concat's inputs other than
# the last have no padding, and unpacking drops it (tests/runtime/test_accel_inplace.py runs
# such tables between accelerator nodes against the all-CPU build).
#
# Conditions (``in_place_problem``): an int8 node of ``IN_PLACE_OPS`` on the CPU, of static
# shape, every operand of the output's shape (so one packed layout for all) and made in DRAM
# by an accelerator node or another in-place node, not a view's output (a view's packed bytes
# are its root's, of another shape), and no operand or output in a QMatMul's "matrices"
# layout.

IN_PLACE_OPS = ("QLut", "QAdd", "QMul")


def in_dram(value: str, producer: dict, placements: dict, packed) -> bool:
    """Whether ``value`` is made in DRAM: by an accelerator node or an in-place node."""
    p = producer.get(value)
    return p is not None and (placements[p.name].target == "accel" or p.name in packed)


def in_place_problem(node: Node, graph: Graph, producer: dict, placements: dict,
                     packed, layouts: dict | None = None) -> str | None:
    """Why a CPU node does not run in place on the packed layout (None: it does). ``packed``:
    the in-place nodes before it; ``layouts``: ``value_layouts``, when known."""
    if node.op not in IN_PLACE_OPS or placements[node.name].target != "cpu":
        return f"{node.op} is not an element-wise int8 node"
    if len(node.outputs) != 1 or not node.outputs[0]:
        return "it has not one output"
    y = graph.types.get(node.outputs[0])
    reads = dram_reads(node)
    if y is None or y.dtype != "int8" or not y.static or len(y.shape) not in (2, 3, 4):
        return f"its output is {y}, not a static 2-D, 3-D or 4-D int8 value"
    if node.op == "QLut" and (len(node.inputs) < 2 or node.inputs[1] not in graph.initializers):
        return "its table is computed at run time"
    for v in reads:
        if graph.types[v].shape != y.shape or graph.types[v].dtype != "int8":
            return f"its operand {v!r} ({graph.types[v]}) is not of the output's type {y}"
        if not in_dram(v, producer, placements, packed):
            return f"its operand {v!r} is not made in DRAM"
        if producer[v].op in ALIAS_OPS:
            return f"its operand {v!r} is a view (its packed bytes are another value's)"
    if layouts is not None and any(layouts.get(v) == "matrices"
                                   for v in (*reads, node.outputs[0])):
        return "a value of it is in a QMatMul's matrices layout"
    return None


def packed_nodes(graph: Graph, placements: dict) -> set[str]:
    """The CPU nodes that run in place on the packed layout (module doc), in one pass in
    graph order."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    layouts = value_layouts(graph, placements)
    packed: set[str] = set()
    for node in graph.nodes:
        if node.op in IN_PLACE_OPS and placements[node.name].target == "cpu" and \
                in_place_problem(node, graph, producer, placements, packed, layouts) is None:
            packed.add(node.name)
    return packed


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


def _row_major(shape: tuple, packed: tuple, b: int, k: int) -> bool:
    """Whether the packed layout of a value of ``shape`` holds its elements in row-major
    order (BATCH 1, whole channel blocks, no padding rows, one pixel or none): then
    packing and unpacking are a reshape. ``packed``: its packed shape."""
    return b == 1 and shape[1] % k == 0 and math.prod(shape[2:]) == 1 and \
        packed[0] == shape[0]


def pack_value(x: np.ndarray, cfg: HwConfig, layout: str | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
    """NCHW (or [N, C], or [N, C, L] as NCHW with one row) int8 -> the packed layout,
    channels zero-padded to BLOCK (or the "matrices" layout of a QMatMul operand). ``out``:
    int8 memory of the packed shape to write it into (a view of the executor's DRAM: no
    array of its own, no second copy), else a fresh array.

    One strided copy: this runs at every region border of every inference, so it avoids
    np.pad and intermediate copies (their fixed costs are most of the time for a small
    value)."""
    b, k = cfg.batch, cfg.block
    if layout == "matrices":
        return matmul.pack_matrices(x, cfg, out=out)
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[:, :, None, :]
    n, c = x.shape[:2]
    cb = -(-c // k)
    full = c // k
    shape = packed_shape(x.shape, cfg)
    spatial = x.shape[2:]
    # out[i, j, *s, bb, kk] = x[i*b + bb, j*k + kk, *s]: out's axes put in x's order.
    axes = (0, len(spatial) + 2, 1, len(spatial) + 3, *range(2, 2 + len(spatial)))
    if _row_major(x.shape, shape, b, k):
        if out is None:
            return np.ascontiguousarray(x).reshape(shape)
        out.reshape(x.shape)[...] = x
        return out
    if out is None:
        # Channel (and row) padding is zeros: a zeroed array (calloc) costs less than
        # zeroing a strided view of the last block.
        out = (np.zeros if cb > full or shape[0] * b > n else np.empty)(shape, x.dtype)
    elif cb > full or shape[0] * b > n:  # memory that held anything: padding is zeros
        out[...] = 0  # (a memset; zeroing only the padding lanes is a slower strided write)
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
    if _row_major(shape, p.shape, p.shape[-2], p.shape[-1]):
        return np.ascontiguousarray(p).reshape(shape)
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
    kind: str  # conv2d, group_conv2d, dense, matmul, maxpool, gap or elt
    spec: ConvSpec | GroupConvSpec | DenseSpec | PoolSpec
    weight: np.ndarray | None  # None for a matmul: its weights are packed at run time
    bias: np.ndarray
    scale: np.ndarray
    residual: bool
    shape: "matmul.MatMulShape | None" = None  # a matmul's operands and matrices

    @property
    def macs(self) -> int:
        return self.spec.macs * (self.shape.count if self.shape is not None else 1)

    def operands(self, node: Node) -> list[tuple[str, object]]:
        """The arguments of the layer's function, in order: ("value", name) for a value
        in DRAM, ("const", array) for a constant packed at build time."""
        if self.kind in ("conv2d", "group_conv2d", "dense"):
            # (no bias operand when the GEMM adds it: compiler/accel/im2col.py)
            args = [("value", node.inputs[0]), ("const", self.weight),
                    *([("const", self.bias)] if self.spec.epilogue.bias else []),
                    ("const", self.scale)]
            if self.residual:
                args.append(("value", node.inputs[4]))
        elif self.kind == "gap" or (self.kind == "elt" and self.weight.size):
            args = [*(("value", v) for v in dram_reads(node)), ("const", self.weight)]
        else:
            args = [("value", v) for v in dram_reads(node)]
        return args + [("value", node.outputs[0])]


def _epilogue(node: Node) -> Epilogue:
    a = node.attrs
    shift = int(a["shift"])
    if not 0 <= shift <= 31:
        raise CompilerError(f"node {node.name!r}: shift {shift} is outside [0, 31]")
    return Epilogue(bias=True, scale=True, shift=shift, residual=len(node.inputs) > 4 and
                    bool(node.inputs[4]), lo=int(a["lo"]), hi=int(a["hi"]))


def _pool_layer(node: Node, graph: Graph, cfg: HwConfig) -> AccelLayer:
    a = node.attrs
    n, c, h, w = graph.types[node.inputs[0]].shape
    oh, ow = graph.types[node.outputs[0]].shape[2:]
    (kh, kw), (sh, sw) = a["kernel_shape"], a.get("strides", (1, 1))
    dh, dw = a.get("dilations", (1, 1))
    pads = a.get("pads", (0, 0, 0, 0))
    spec = PoolSpec(n=n, c=_ceil(c, cfg.block), h=h, w=w, oh=oh, ow=ow, kh=kh, kw=kw,
                    stride_h=sh, stride_w=sw, dil_h=dh, dil_w=dw, pad_top=pads[0],
                    pad_left=pads[1])
    empty = np.zeros(0, np.int8)
    return AccelLayer(node.name, "maxpool", spec, empty, empty.astype(np.int32),
                      empty.astype(np.int32), False)


def _flatten_columns(w: np.ndarray, shape: tuple, k: int) -> np.ndarray:
    """A dense weight [O, C*H*W] over a flattened NCHW value, its columns permuted to read
    the packed bytes of that value instead: column ((cb*H + y)*W + x)*k + kk holds the
    flattened feature (cb*k + kk)*H*W + y*W + x (zero for padding channels)."""
    _, c, h, wd = shape
    o = w.shape[0]
    wc = pad_channels(w.reshape(o, c, h * wd), 1, k)
    cp = wc.shape[1]
    return wc.reshape(o, cp // k, k, h * wd).transpose(0, 1, 3, 2).reshape(o, cp * h * wd)


def layer_for(node: Node, graph: Graph, cfg: HwConfig, roots: dict | None = None) -> AccelLayer:
    """The accelerator operator of a QConv, QGemm, QMatMul or ALU node (see ``annotate``).
    ``roots``: value -> the value whose packed bytes it is (``root_of``), for a QGemm that
    reads a flattened value."""
    b, k = cfg.batch, cfg.block
    if node.op == "QMatMul":
        shape = matmul.matmul_shape(node, graph, cfg)
        bias_p, scale_p = matmul.matmul_constants(node, shape, cfg)
        return AccelLayer(node.name, "matmul", shape.spec(matmul.matmul_epilogue(node)), None,
                          bias_p, scale_p, False, shape)
    if node.op == "MaxPool":
        return _pool_layer(node, graph, cfg)
    if node.op in ("QAdd", "QMul", "Relu"):
        arith = node.op != "Relu"
        ys = graph.types[node.outputs[0]].shape
        gated = [graph.types[v].shape != ys for v in node.inputs[:2]] if node.op == "QMul" \
            else [False]
        spec = EltSpec({"QAdd": "add", "QMul": "mul", "Relu": "relu"}[node.op],
                       packed_shape(ys, cfg),
                       tuple(int(m) for m in node.attrs["multipliers"]) if arith else (),
                       int(node.attrs["shift"]) if arith else 0,
                       gate_rows=int(np.prod(ys[2:])) if any(gated) else 1,
                       gate_first=gated[0],
                       zero_points=tuple(int(z) for z in node.attrs.get("zero_points",
                                                                        (0, 0, 0))))
        empty = np.zeros(0, np.int32)
        return AccelLayer(node.name, "elt", spec,
                          elt_constants(cfg, spec) if arith else empty, empty, empty, False)
    if node.op == "QGlobalAveragePool":
        n, c, h, w = graph.types[node.inputs[0]].shape
        spec = GapSpec(n=n, c=_ceil(c, k), h=h, w=w, multiplier=int(node.attrs["multiplier"]),
                       shift=int(node.attrs["shift"]), offset=int(node.attrs.get("offset", 0)))
        empty = np.zeros(0, np.int32)
        return AccelLayer(node.name, "gap", spec, gap_constants(cfg, spec), empty, empty, False)
    x_t = graph.types[node.inputs[0]]
    w, bias, mult = (np.asarray(graph.initializers[i]) for i in node.inputs[1:4])
    if node.op == "QConv":
        w = conv_weight(node, graph)
    epi = _epilogue(node)
    o = w.shape[0]
    op = _ceil(o, k)
    bias_p = pack_bias(pad_channels(bias.astype(np.int32), 0, k), b, k)
    scale_p = pack_bias(pad_channels(mult.astype(np.int32), 0, k), b, k)
    if node.op == "QConv":
        group, strides, pads, (kh, kw) = _conv_geometry(node, graph)
        n, c = x_t.shape[:2]
        h, wd = (1, x_t.shape[2]) if len(x_t.shape) == 3 else x_t.shape[2:]
        full = GroupConvSpec(n=n, c=c, h=h, w=wd, o=o, kh=kh, kw=kw, groups=group,
                             strides=strides, pads=pads, block=k, epilogue=epi)
        w4 = w.reshape(o, c // group, kh, kw)
        classes = ()
        z = pad_value(node.attrs)
        if z and any(pads):  # the padding reads z, the DMA's is 0: a bias table (border.py)
            table, rows, cols = bias_table(bias, w4, z, (h, wd), strides, pads,
                                           (full.oh, full.ow))
            if rows.count * cols.count > 1:
                classes = (rows, cols)
                bias_p = pack_bias_table(pad_channels(table, 0, k), b, k)
            else:  # only taps crop_taps drops read padding: one bias per channel still
                bias_p = pack_bias(pad_channels(table[:, 0, 0], 0, k), b, k)
        # without the kernel rows and columns that only ever meet padding (crop_taps)
        g, w4 = crop_taps(replace(full, bias_classes=classes), w4)
        if group != 1:  # not _is_plain_conv2d
            spec, weight, kind = g, pack_group_kernel(w4, g), "group_conv2d"
        else:
            spec = ConvSpec(n=n, c=_ceil(c, k), h=h, w=wd, o=op, kh=g.kh, kw=g.kw,
                            stride=g.strides, pad=g.pads, epilogue=epi, bias_classes=classes)
            weight = pack_oihw(pad_channels(pad_channels(w4, 0, k), 1, k), k)
            kind = "conv2d"
    else:
        n, kdim = x_t.shape
        root = graph.types[(roots or {}).get(node.inputs[0], node.inputs[0])].shape
        rows = dense_rows(n, cfg) * b
        if len(root) == 4:  # reads the packed bytes of the NCHW value it flattens (rows
            w = _flatten_columns(w, root, k)  # not padded: the root's buffer has N)
            kdim = w.shape[1]
            rows = n
        spec = DenseSpec(n=rows, k=_ceil(kdim, k), o=op, epilogue=epi)
        wp = pad_channels(pad_channels(w, 0, k), 1, k)
        weight = np.ascontiguousarray(wp.reshape(op // k, k, spec.k // k, k).transpose(0, 2, 1, 3))
        kind = "dense"
    return AccelLayer(node.name, kind, spec, weight.astype(np.int8), bias_p, scale_p,
                      epi.residual)


# ---- schedules -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _NoKnobs:
    """The knobs of a program with no choices."""


def compile_layer(layer: AccelLayer, cfg: HwConfig, *, top: int = 4):
    """(AcceleratorFunction, knobs) for a layer: conv2d knobs searched on the cycle model
    (compiler/tune.py, cached on disk), dense knobs likewise (compiler/tune_dense.py),
    group_conv2d knobs by ``group_conv_knobs`` (compiler/accel/ops_group.py), max pooling
    tiles by ops_alu.pool_knobs."""
    from .ops import conv2d, dense
    from .ops_alu import elementwise, global_average_pool, maxpool, pool_knobs
    from .ops_group import group_conv2d, group_conv_knobs
    from .tune import tune_conv
    from .tune_dense import tune_dense

    if layer.kind == "group_conv2d":
        knobs = group_conv_knobs(cfg, layer.spec)
        return group_conv2d(cfg, layer.spec, knobs, name=layer.node), knobs
    if layer.kind == "gap":
        return global_average_pool(cfg, layer.spec, name=layer.node), _NoKnobs()
    if layer.kind == "elt":
        return elementwise(cfg, layer.spec, name=layer.node), _NoKnobs()
    if layer.kind == "maxpool":
        knobs = pool_knobs(cfg, layer.spec)
        return maxpool(cfg, layer.spec, knobs, name=layer.node), knobs

    if layer.kind == "conv2d":
        # The batch is the outermost host loop of the schedule: knobs found for one batch
        # tile serve any batch (and the search stays cheap and its cache shared).
        knobs, _ = tune_conv(cfg, replace(layer.spec, n=cfg.batch), top=top)
        return conv2d(cfg, layer.spec, knobs, name=layer.node), knobs
    # a QGemm, or a QMatMul: the dense product of one matrix
    knobs, _ = tune_dense(cfg, layer.spec, top=min(top, 3))
    return dense(cfg, layer.spec, knobs, name=layer.node), knobs
