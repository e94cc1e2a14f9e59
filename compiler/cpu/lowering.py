"""Lowering an optimized graph to a CPU program: compiled LLVM kernels, layout changes and
numpy fallbacks, in the graph's order. Float graphs and quantized ones (compiler/quantize.py)
alike: the integer operators of graph_int.py have kernels that agree with it bit for bit.

    program = lower_graph(optimize(import_onnx("model.onnx")))   # or a quantized graph
    program.steps      # [{"kind": "kernel", "node": ..., "kernel": key, "args": [...]}, ...]
    program.kernels    # {spec key: CpuKernel}

Layouts. A 4-D activation that a convolution reads or writes lives channel-blocked,
NCHW{c}c (``[N, C//c, H, W, c]``, c = ``channel_block(C)``): convolutions, pooling and
element-wise nodes between them (residual adds, activations) stay blocked, so a chain of
convolutions never transposes. A value is converted only where a node needs the other
layout: a ``pack`` step (plain -> blocked) where a model input enters a convolution, an
``unpack`` where a blocked value meets a node without a blocked kernel or is a graph output
(a ``view`` when H = W = 1, where both layouts are the same memory).

Steps (each JSON-able; values by name, a blocked value named ``NAME@nchw16c``):

- ``kernel``: a compiled kernel (graph_cpu_kernels) on ``args`` (inputs..., output).
- ``numpy``: ``graph_numpy.evaluate_node`` on plain inputs (any operator without a kernel).
  Every node that reads or writes a value of a size only known at run time (None in its
  type, graph/dynamic.py) is a numpy step: such values have ``None`` in their program
  shape, live outside the arena and are made by each run (the run-time-shaped segments;
  runtime/executor.py).
- ``view``: the output is the input's memory with another shape (Reshape, Flatten, ...).
- ``concat``: channel concatenation of blocked values of one block.
- ``control``: an If, Loop or Scan whose bodies are programs of their own (control.py).

Layout conversions are kernel steps too (ops ``pack`` / ``unpack``, any dtype). int8
activations follow the float32 rules: QConv reads and writes NCHW{c}c with the blocks a
Conv would use, int8 max pooling and QGlobalAveragePool stay blocked, so a chain of
quantized layers never transposes either.

Weights are packed once here (``program.constants``); the hot operators (convolution,
dense, pooling, element-wise float32; QConv, QGemm, int8 MaxPool and Relu,
QGlobalAveragePool, Quantize, Dequantize; QLut, QAdd, QMul, QMatMul in lowering_q.py) are
compiled, anything else falls back to numpy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..graph.ir import Graph, Node
from ..graph.ops import OWN_INPUTS
from ..graph.qops import pad_value
from .control import CONTROL_OPS, control_fallback_reason, lower_control
from .lower_recurrent import lower_recurrent
from .kernels import (BINARY, CONVERT, ELTWISE_DTYPES, UNARY, average_pool_reciprocals,
                      compile_spec, spec_key)
from . import lowering_int8, lowering_nn, lowering_q
from .int8_forms import chosen_form
from .copies import copy_spec
from .schedules import (EXACT_TERMS, channel_block, conv_columns, output_block,
                        dense_block, dense_columns, padded_channels, padded_rows,
                        pack_conv_weight, pack_dense_weight, pack_depthwise_weight)

__all__ = ["CpuProgram", "lower_graph", "compile_program", "blocked_name"]

F32, I8 = "float32", "int8"
_VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")
_ELTWISE_UNARY = ("Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Neg", "Abs",
                  "Exp", "Sqrt", "Clip", "Erf", "Gelu", "Mish")
_ELTWISE_PARAMS = {"LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"),
                   "Quantize": ("scale", "zero_point"),
                   "Dequantize": ("scale", "zero_point")}
# A pooling kernel unrolls its window (a tree of max or +, one load per tap): larger
# windows (a 60x80 window in onnx's suite) run in numpy rather than make huge code.
POOL_TAPS = 256
_POOL_DTYPES = {"MaxPool": (F32, I8), "AveragePool": (F32,), "GlobalAveragePool": (F32,),
                "QGlobalAveragePool": (I8,)}


def _requantizes(attrs) -> bool:
    """Whether a QConv/QGemm's epilogue attributes are valid (else the numpy step reports
    them at run time, as graph_numpy would)."""
    try:
        pad_value(attrs)
    except ValueError:
        return False
    return 0 <= int(attrs["shift"]) <= 31 and -128 <= int(attrs["lo"]) <= int(attrs["hi"]) <= 127


def _wider_output(width: int, block: int) -> int | None:
    """A few more output columns for a convolution whose register tile would hold under 4
    of ``width`` columns (a width with no divisor from 4 to 24: 29, 31, 58, ...; 3x slower
    than a width with one), or None: the kernel computes that width (more right padding)
    and a Slice crops it."""
    if conv_columns(width, block) >= min(4, width):
        return None
    return next((w for w in range(width + 1, width + 8) if conv_columns(w, block) >= 7), None)


def blocked_name(value: str, block: int) -> str:
    return f"{value}@nchw{block}c"


@dataclass
class CpuProgram:
    """A graph lowered for the CPU: steps over named values (see the module docstring).

    ``values`` maps each run-time value to ``{"dtype", "shape"}`` (its physical shape);
    ``constants`` holds packed weights and the initializers numpy steps read; ``specs``
    maps a kernel key to its spec, ``kernels`` a key to the compiled kernel."""

    name: str
    inputs: list
    outputs: list
    values: dict
    constants: dict
    steps: list
    specs: dict
    kernels: dict = field(default_factory=dict)
    # per If/Loop/Scan node: {"node", "op", "path": "compiled" | "numpy", ...} (control.py)
    control: list = field(default_factory=list)

    def kernel_steps(self) -> int:
        return sum(s["kind"] == "kernel" for s in self.steps)


class _Lowering:
    def __init__(self, graph: Graph, int8_form: str | None = None):
        self.g = graph
        # the CPU's int8 dot-product instructions QConv/QGemm use (int8_forms.py), or None
        self.int8_form = chosen_form(int8_form)
        self.values: dict = {}
        self._views: dict = {}  # (source, shape) -> its view (view_of)
        self.constants: dict = {}
        self.steps: list = []
        self.specs: dict = {}
        self.versions: dict = {}  # graph value -> {block: program value}; 0 = plain
        self.control: list = []  # the path each control-flow node took (control.py)
        # A dense output cropped from its padded rows -> (the padded value, its shape): the
        # next dense kernel reads that instead of padding the crop again (ViT's FFN).
        self.padded: dict = {}
        self.absorbed: set = set()  # nodes another node's kernel computes (lowering_nn)
        self.extra_types: dict = {}
        self.consumers = graph.consumers()

    # ---- values and layouts ---------------------------------------------------------------

    def type(self, v):
        # (extra_types: values the lowering makes between a node's epilogue steps)
        return self.extra_types.get(v) or self.g.types[v]

    def is_const(self, v) -> bool:
        return v in self.g.initializers

    def const(self, v) -> np.ndarray:
        return self.g.initializers[v]

    def add_const(self, name: str, array) -> str:
        if name in self.g.outputs:  # the output itself is a run-time value (run(): a copy)
            name += "@const"
        if name not in self.constants:  # (ascontiguousarray would make a scalar 1-D)
            a = np.asarray(array)
            self.constants[name] = a if a.flags.c_contiguous else a.copy(order="C")
        return name

    def define(self, name: str, dtype: str, shape) -> str:
        """A program value; None in ``shape`` for a size only known at run time."""
        self.values[name] = {"dtype": dtype,
                             "shape": [None if d is None else int(d) for d in shape]}
        return name

    def produce(self, v: str, block: int) -> str:
        """The program value a node writes for graph value ``v`` in layout ``block``."""
        t = self.type(v)
        if block:
            n, c, h, w = t.shape
            name = self.define(blocked_name(v, block), t.dtype, (n, c // block, h, w, block))
        else:
            name = self.define(v, t.dtype, t.shape)
        self.versions.setdefault(v, {})[block] = name
        return name

    def current_block(self, v: str) -> int | None:
        """The block of the layout ``v`` was produced in (0: plain), None for constants."""
        if self.is_const(v):
            return None
        return next(iter(self.versions[v]))

    def step(self, kind, node: Node | None, inputs, outputs, **extra) -> None:
        self.steps.append({"kind": kind, "node": node.name if node else outputs[0],
                           "op": node.op if node else kind, "inputs": list(inputs),
                           "outputs": list(outputs), **extra})
        if kind == "view" and inputs[0] in self.padded:  # the same bytes: the same rows
            self.padded[outputs[0]] = self.padded[inputs[0]]

    def plain(self, v: str) -> str:
        if self.is_const(v):
            return self.add_const(v, self.const(v))
        have = self.versions[v]
        if 0 in have:
            return have[0]
        block, src = next(iter(have.items()))
        out = self.produce(v, 0)
        n, c, h, w = self.type(v).shape
        if h * w == 1:
            self.step("view", None, [src], [out])
        else:
            self.kernel(None, {"op": "unpack", "shape": self.values[src]["shape"],
                               "dtype": self.type(v).dtype}, [src, out], out)
        return out

    def blocked(self, v: str, block: int) -> str:
        """``v`` (a 4-D value) in NCHW{block}c, converted if needed."""
        if self.is_const(v):
            from .schedules import pack_nchwc
            return self.add_const(blocked_name(v, block), pack_nchwc(
                np.asarray(self.const(v), self.type(v).dtype), block))
        have = self.versions[v]
        if block in have:
            return have[block]
        src = self.plain(v)
        out = self.produce(v, block)
        n, c, h, w = self.type(v).shape
        if h * w == 1 or block == 1:
            self.step("view", None, [src], [out])
        else:
            self.kernel(None, {"op": "pack", "shape": [n, c, h, w], "block": block,
                               "dtype": self.type(v).dtype}, [src, out], out)
        return out

    # ---- kernels ------------------------------------------------------------------------

    def kernel(self, node: Node | None, spec: dict, args: list, out: str) -> None:
        key = spec_key(spec)
        self.specs[key] = spec
        if node is None:  # a layout change: named after the value it makes
            self.steps.append({"kind": "kernel", "node": out, "op": spec["op"],
                               "inputs": list(args), "outputs": [out], "kernel": key})
            return
        self.step("kernel", node, args, [out], kernel=key)

    def operand(self, v: str, out_type, layout: str, block: int = 0, dtype: str = F32):
        """(kind, program value or None) of an element-wise operand of ``dtype`` for an
        output of type ``out_type``, or None when its broadcast has no kernel form."""
        t = self.type(v)
        if t.dtype != dtype:
            return None
        if self.is_const(v):
            a = np.asarray(self.const(v))
            if a.size == 1:
                return ["scalar", float(a.reshape(-1)[0])], None
            rank = len(out_type.shape)
            shape = (1,) * (rank - a.ndim) + a.shape
            if a.ndim > rank:
                return None
            channel_axis = rank - 1 if layout == "dense" else 1
            if rank >= 2 and all(d == 1 for i, d in enumerate(shape) if i != channel_axis) \
                    and shape[channel_axis] == out_type.shape[channel_axis]:
                vec = a.reshape(-1).astype(dtype)
                name = f"{v}@channel{block or ''}"
                if layout == "blocked":
                    vec = vec.reshape(-1, block)
                return "channel", self.add_const(name, vec)
            if tuple(shape) != tuple(out_type.shape):
                return None
            full = a.reshape(out_type.shape)
            if layout == "blocked":
                return "full", self.blocked(v, block)
            return "full", self.add_const(v, np.asarray(full, dtype))
        if t.shape != out_type.shape:
            return self.image_channel_operand(v, out_type, layout, block)
        return "full", self.blocked(v, block) if layout == "blocked" else self.plain(v)

    def image_channel_operand(self, v: str, out_type, layout: str, block: int):
        """("image_channel", value) for a run-time ``[N, C, 1, 1]`` operand of a 4-D output
        (squeeze-excitation's scale): ``[N, C//c, c]`` blocked or ``[N, C]`` plain, a view
        of its memory; None for other broadcasts."""
        t = self.type(v)
        if layout == "dense" or len(out_type.shape) != 4 \
                or tuple(t.shape) != (*out_type.shape[:2], 1, 1):
            return None
        n, c = t.shape[:2]
        if layout == "blocked":
            return "image_channel", self.view_of(self.blocked(v, block), (n, c // block, block),
                                                 f"{v}@image_channel{block}")
        return "image_channel", self.view_of(self.plain(v), (n, c), f"{v}@image_channel")

    def epilogue(self, node: Node, out_type, layout: str, block: int = 0):
        """(spec steps, operand values) of a fused node's epilogue, or None."""
        steps, args = [], []
        for op, *rest in node.attrs.get("epilogue", ()):
            if op in BINARY:
                got = self.operand(node.inputs[rest[0]], out_type, layout, block)
                if got is None:
                    return None
                kind, value = got
                steps.append([op, kind])
                if value is not None:
                    args.append(value)
            elif op in UNARY:
                steps.append([op, *[None if a is None else float(a) for a in rest]])
            else:
                return None
        return steps, args

    # ---- operators ----------------------------------------------------------------------

    def conv_layout(self, node: Node, weight: np.ndarray, exact_terms: int | None = None,
                    pad_output: bool = False):
        """(depthwise, input block, output block, packed weight name, spec) of a Conv or
        QConv node with the OIHW ``weight`` (the spec holds its geometry); int8 windows
        (``exact_terms`` = EXACT_TERMS) sum at most that many products per input block in
        float32 (cpu_schedules), which bounds the block: None when not even one channel
        fits. ``pad_output``: a layer of one group whose output channels have no block of 8
        or more (YOLO's 255, 21 classes, 3 colours) computes ``padded_channels`` of them,
        the extra ones of zero weights (the spec's weight shape says how many)."""
        x, w, a = node.inputs[0], node.inputs[1], node.attrs
        out_t = self.type(node.outputs[0])
        c, m, g = self.type(x).shape[1], out_t.shape[1], a["group"]
        depthwise = g > 1 and g == c == m
        have = self.current_block(x)
        taps = weight.shape[2] * weight.shape[3]
        limit = None if exact_terms is None else exact_terms // taps
        if limit == 0:
            return None

        def fits(block):
            return bool(block) and (limit is None or block <= limit)
        tag = ""
        if depthwise:  # one channel per window: any block fits
            cb = ob = have if have and c % have == 0 else channel_block(c)
            packed = pack_depthwise_weight(weight, cb)
        else:
            cb = have if fits(have) and (c // g) % have == 0 \
                else channel_block(c // g, min(16, limit or 16))
            if have == 0 and g == 1 and c <= 4 and fits(c):
                cb = c  # a thin input (an image): all its channels in one block
            ob = output_block(m // g, out_t.shape[3])
            if pad_output and g == 1 and padded_channels(m) != m:
                mp = padded_channels(m)
                weight = np.concatenate([weight, np.zeros((mp - m, *weight.shape[1:]),
                                                          weight.dtype)])
                ob, tag = output_block(mp, out_t.shape[3]), f"p{mp}"
            packed = pack_conv_weight(weight, cb, ob)
        wname = self.add_const(f"{w}@{'dw' if depthwise else 'oihw'}{cb}i{ob}o{tag}", packed)
        pads = a["pads"]
        spec = {"weight": list(packed.shape), "strides": list(a["strides"]),
                "pads": [pads[0], pads[1], pads[2], pads[3]], "dilations": list(a["dilations"])}
        if not depthwise:
            spec["groups"] = g
        return depthwise, cb, ob, wname, spec

    def channel_const(self, v: str, block: int, dtype: str) -> str:
        """A per-channel constant as ``[C//block, block]``."""
        return self.add_const(f"{v}@channel{block}",
                              np.asarray(self.const(v), dtype).reshape(-1, block))

    def conv(self, node: Node) -> bool:
        x, w, b = (list(node.inputs) + ["", ""])[:3]
        tx = self.type(x)
        if len(tx.shape) != 4 or tx.dtype != F32 or not self.is_const(w) \
                or (b and not self.is_const(b)):
            return False
        out_t = self.type(node.outputs[0])
        # output channels with no block of 8 or more, an epilogue with scalars at most:
        # computed padded (padded_conv)
        pad = node.attrs["group"] == 1 and self.scalar_epilogue(node) \
            and padded_channels(out_t.shape[1]) != out_t.shape[1]
        depthwise, cb, ob, wname, geometry = self.conv_layout(
            node, np.asarray(self.const(w), np.float32), pad_output=pad)
        epi = self.epilogue(node, out_t, "blocked", ob)
        if epi is None:
            return False
        if pad:
            return self.padded_conv(node, cb, ob, wname, geometry, epi[0])
        data = self.blocked(x, cb)
        args = [data, wname] + ([self.channel_const(b, ob, F32)] if b else []) + epi[1]
        spec = {"op": "dwconv" if depthwise else "conv", "data": self.values[data]["shape"],
                **geometry, "bias": bool(b), "epilogue": epi[0]}
        out = self.produce(node.outputs[0], ob)
        ow = out_t.shape[3]
        wide = None if depthwise or any(st[0] in BINARY and st[1] == "full" for st in epi[0]) \
            else _wider_output(ow, ob)
        if wide is None:
            self.kernel(node, spec, args + [out], out)
            return True
        spec["pads"] = [*spec["pads"][:3], spec["pads"][3] + (wide - ow) * spec["strides"][1]]
        n, cc, oh, _, block = self.values[out]["shape"]
        tmp = self.define(f"{out}@wide{wide}", F32, (n, cc, oh, wide, block))
        self.kernel(node, spec, args + [tmp], tmp)
        crop = Node("Slice", (tmp,), (out,), {"starts": [0], "ends": [ow], "axes": [3],
                                              "steps": [1]}, node.name)
        self.step("numpy", crop, [tmp], [out], attrs=crop.attrs)
        return True

    def scalar_epilogue(self, node: Node) -> bool:
        """Whether every operand of the node's epilogue is a constant scalar (no operand
        value for the kernel: ``operand``'s "scalar" kind)."""
        operands = [node.inputs[step[1]] for step in node.attrs.get("epilogue", ())
                    if step[0] in BINARY]
        return all(self.is_const(v) and np.asarray(self.const(v)).size == 1 for v in operands)

    def padded_conv(self, node: Node, cb: int, ob: int, wname: str, geometry: dict,
                    epilogue: list) -> bool:
        """A Conv whose output channels have no block of 8 or more (``padded_channels``),
        laid out by ``conv_layout(pad_output=True)``, its epilogue without operands:
        computed for the padded channel count in blocks of 16 (a block of 1 or 2 leaves the
        kernel's vectors nearly empty: YOLO's 1x1 head of 255 channels ran 5x slower than
        the 256 it now computes), the extra channels' zero weights and bias dropped by the
        unpack to the plain layout, which takes the wider output's crop too."""
        x, b = node.inputs[0], (list(node.inputs) + ["", ""])[2]
        out_t = self.type(node.outputs[0])
        m, mp = out_t.shape[1], geometry["weight"][0] * ob
        args = [self.blocked(x, cb), wname]
        if b:
            bias = np.zeros(mp, np.float32)
            bias[:m] = np.asarray(self.const(b), np.float32)
            args.append(self.add_const(f"{b}@channel{ob}p{mp}", bias.reshape(-1, ob)))
        spec = {"op": "conv", "data": self.values[args[0]]["shape"], **geometry,
                "bias": bool(b), "epilogue": epilogue}
        n, _, oh, ow = out_t.shape
        wide = _wider_output(ow, ob) or ow
        spec["pads"] = [*spec["pads"][:3], spec["pads"][3] + (wide - ow) * spec["strides"][1]]
        tmp = self.define(f"{node.outputs[0]}@pad{mp}x{wide}", F32, (n, mp // ob, oh, wide, ob))
        self.kernel(node, spec, args + [tmp], tmp)
        out = self.produce(node.outputs[0], 0)
        self.kernel(None, {"op": "unpack", "shape": [n, mp // ob, oh, wide, ob], "dtype": F32,
                           "out": [n, m, oh, ow]}, [tmp, out], out)
        return True

    # ---- CNN operators of schedules_conv.py ------------------------------------------------

    def conv_transpose(self, node: Node) -> bool:
        """ConvTranspose 2-D, float32, constant weights (and bias), pads >= 0 (a negative
        pad, an output_shape larger than the operator makes, stays numpy); each group's
        channels whole blocks on both sides."""
        from .schedules_conv import direct_taps, pack_conv_transpose_weight

        x, w, b = (list(node.inputs) + ["", ""])[:3]
        tx, a = self.type(x), node.attrs
        if len(tx.shape) != 4 or tx.dtype != F32 or not self.is_const(w) \
                or (b and not self.is_const(b)) or min(a["pads"]) < 0:
            return False
        out_t = self.type(node.outputs[0])
        g, c, m = a["group"], tx.shape[1], out_t.shape[1]
        have = self.current_block(x)
        cb = have if have and (c // g) % have == 0 else channel_block(c // g)
        ob = channel_block(m // g)
        weight = np.asarray(self.const(w), np.float32)
        # One group: as a 1x1 convolution to every tap's channels and a fold, when one
        # kernel would be slow (schedules_conv.py): a direct one with output blocks under 8
        # (scalar code), or taps strided over the output (it visits them all, and only
        # 1 / (sh * sw) land: 3-14x slower than onnxruntime, the two kernels 1-2x).
        direct = direct_taps(a, weight.shape[2:], tx.shape[2:], out_t.shape[2:])
        if g == 1 and (ob < 8 if direct else math.prod(a["strides"]) > 1):
            return self.conv_transpose_as_conv(node, weight, cb, ob, direct)
        packed = pack_conv_transpose_weight(weight, g, cb, ob)
        wname = self.add_const(f"{w}@convT{cb}i{ob}o", packed)
        data = self.blocked(x, cb)
        spec = {"op": "convT", "data": self.values[data]["shape"], "weight": list(packed.shape),
                "strides": list(a["strides"]), "pads": list(a["pads"]),
                "dilations": list(a["dilations"]), "out": list(out_t.shape[2:]), "groups": g,
                "bias": bool(b)}
        args = [data, wname] + ([self.channel_const(b, ob, F32)] if b else [])
        out = self.produce(node.outputs[0], ob)
        self.kernel(node, spec, args + [out], out)
        return True

    def conv_transpose_as_conv(self, node: Node, weight: np.ndarray, cb: int, ob: int,
                               direct: bool) -> bool:
        """ConvTranspose (one group) as a 1x1 convolution to every tap's channels on the input
        grid, then a pixel shuffle (``direct``: one tap per output pixel) or a fold that sums
        the taps landing on each output pixel (schedules_conv.py)."""
        from .schedules_conv import taps_as_channels

        x, b = node.inputs[0], (list(node.inputs) + ["", ""])[2]
        oihw = taps_as_channels(weight)
        tb = channel_block(oihw.shape[0])
        wname = self.add_const(f"{node.inputs[1]}@taps{cb}i{tb}o",
                               pack_conv_weight(oihw, cb, tb))
        data = self.blocked(x, cb)
        n, _, h, w, _ = self.values[data]["shape"]
        taps = self.define(f"{node.outputs[0]}@taps{tb}c", F32,
                           (n, oihw.shape[0] // tb, h, w, tb))
        conv = {"op": "conv", "data": self.values[data]["shape"],
                "weight": list(self.constants[wname].shape), "strides": [1, 1],
                "pads": [0, 0, 0, 0], "dilations": [1, 1], "groups": 1, "bias": False,
                "epilogue": []}
        self.kernel(node, conv, [data, wname, taps], taps)
        shuffle = {"op": "shuffle", "data": self.values[taps]["shape"],
                   "kernel": list(weight.shape[2:]), "channels": int(weight.shape[1]),
                   "block": ob, "bias": bool(b)}
        if not direct:
            a = node.attrs
            shuffle.update(stride=list(a["strides"]), pads=list(a["pads"]),
                           dilations=list(a["dilations"]),
                           out=list(self.type(node.outputs[0]).shape[2:]))
        out = self.produce(node.outputs[0], ob)
        self.kernel(node, shuffle, [taps] + ([self.channel_const(b, ob, F32)] if b else [])
                    + [out], out)
        return True

    def resize(self, node: Node) -> bool:
        """Resize of H and W (N and C kept) of a float32 4-D value, nearest or linear (no
        antialiasing when shrinking, no tf_crop_and_resize): a ``resize`` kernel on the
        blocked layout, with graph/ops_resize's own index and weight tables as constants."""
        from ..graph.ops_resize import _axis_taps

        x, a = node.inputs[0], node.attrs
        tx, out_t = self.type(x), self.type(node.outputs[0])
        if len(tx.shape) != 4 or tx.dtype != F32 or a["mode"] not in ("nearest", "linear") \
                or tuple(out_t.shape[:2]) != tuple(tx.shape[:2]) \
                or a["coordinate_transformation_mode"] == "tf_crop_and_resize" \
                or (a.get("antialias", 0) and min(a["scales"][2:]) < 1) \
                or len([o for o in node.outputs if o]) != 1:
            return False
        tables = []
        for axis in (2, 3):
            idx, w, _ = _axis_taps(tx.shape[axis], out_t.shape[axis], a["scales"][axis],
                                   (0.0, 1.0), a, np.float32)
            tables.append((idx.astype(np.int32), None if w is None else -w.astype(np.float32)))
        if tables[0][0].shape[1] != tables[1][0].shape[1]:
            return False
        block = self.current_block(x) or channel_block(tx.shape[1])
        data = self.blocked(x, block)
        args = [data] + [self.add_const(f"{node.name}@{what}", t[0])
                         for what, t in zip(("rows", "cols"), tables)]
        if a["mode"] == "linear":
            args += [self.add_const(f"{node.name}@{what}_negated_weights", t[1])
                     for what, t in zip(("row", "col"), tables)]
        spec = {"op": "resize", "mode": a["mode"], "data": self.values[data]["shape"],
                "out": list(out_t.shape[2:]), "taps": int(tables[0][0].shape[1])}
        out = self.produce(node.outputs[0], block)
        self.kernel(node, spec, args + [out], out)
        return True

    def requant_const(self, node: Node, pad_value: int | None = None) -> str:
        """A QConv/QGemm's [shift, lo, hi] (and a QConv's pad_value), an operand of its
        kernel."""
        a = node.attrs
        extra = [] if pad_value is None else [pad_value]
        return self.add_const(f"{node.name}@requant",
                              np.array([a["shift"], a["lo"], a["hi"], *extra], np.int32))

    def qconv(self, node: Node) -> bool:
        if lowering_int8.qconv(self, node):  # the CPU's dot-product instructions
            return True
        x, w, bias, multiplier = node.inputs[:4]
        residual = node.inputs[4] if len(node.inputs) > 4 else ""
        if len(self.type(x).shape) != 4 or self.type(x).dtype != I8 \
                or not all(self.is_const(v) for v in (w, bias, multiplier)) \
                or not _requantizes(node.attrs):
            return False
        layout = self.conv_layout(node, np.asarray(self.const(w), np.int8), EXACT_TERMS)
        if layout is None:
            return False
        depthwise, cb, ob, wname, geometry = layout
        # the padding's value (qops.pad_value): a run-time operand, only where some window
        # reads padding (the other kernels keep their specs)
        fill = pad_value(node.attrs) if any(geometry["pads"]) else 0
        data = self.blocked(x, cb)
        args = [data, wname, self.channel_const(bias, ob, "int32"),
                self.channel_const(multiplier, ob, "int32"),
                self.requant_const(node, fill if fill else None)]
        if residual:
            args.append(self.blocked(residual, ob))
        spec = {"op": "qdwconv" if depthwise else "qconv", "data": self.values[data]["shape"],
                **geometry, "residual": bool(residual)}
        if fill:
            spec["pad_value"] = True
        out = self.produce(node.outputs[0], ob)
        self.kernel(node, spec, args + [out], out)
        return True

    def dense(self, node: Node) -> bool:
        a_in, b_in = node.inputs[0], node.inputs[1]
        if node.op == "MatMul" and not self.is_const(b_in):
            return self.batch_matmul(node)
        c_in = node.inputs[2] if node.op == "Gemm" and len(node.inputs) > 2 else ""
        ta, at = self.type(a_in), node.attrs
        if ta.dtype != F32 or not self.is_const(b_in) or self.type(b_in).dtype != F32 \
                or len(self.type(b_in).shape) != 2:
            return False
        out_t = self.type(node.outputs[0])
        if node.op == "Gemm":
            if at.get("transA", 0) or at.get("alpha", 1.0) != 1.0 \
                    or (c_in and at.get("beta", 1.0) != 1.0):
                return False
            wt = np.asarray(self.const(b_in), np.float32)
            wt = wt if at.get("transB", 0) else wt.T
        else:
            if len(ta.shape) < 2:
                return False
            wt = np.asarray(self.const(b_in), np.float32).T
        n, k = wt.shape
        m = math.prod(ta.shape[:-1])
        from ..graph.ir import TensorType
        flat_t = TensorType(F32, (m, n))
        steps, args = [], []
        bias = False
        if c_in:
            got = self.operand(c_in, flat_t, "dense")
            if got is None:
                return False
            kind, value = got
            if kind == "channel":
                bias, args = True, [value]
            else:
                steps.append(["Add", kind])
                args += [value] if value is not None else []
        epi = (self.epilogue(node, flat_t, "dense") if tuple(out_t.shape) == (m, n)
               else self.batched_epilogue(node, out_t, (m, n)))
        if epi is None:
            return False
        steps += epi[0]
        args += epi[1]
        data = self.plain(a_in)
        if ta.shape != (m, k):
            data = self.view_of(data, (m, k), f"{a_in}@2d")
        # Output columns with no block of 16 (1000 classes, 30 outputs): computed for
        # dense_columns of them (zero weights, zeros in the per-column constants: bias,
        # scale), the extra ones dropped by the crop below; not with an (m, n) operand.
        per_column = all(v in self.constants and self.constants[v].size == n
                         and self.constants[v].ndim <= 2 and self.constants[v].shape[-1] == n
                         for v in args)
        cols = dense_columns(n) if n > 8 and per_column else n
        if cols != n:
            wt = np.concatenate([wt, np.zeros((cols - n, k), np.float32)])
            padded = []
            for v in args:
                vec = np.zeros(cols, np.float32)
                vec[:n] = self.constants[v].reshape(-1)
                padded.append(self.add_const(f"{v}p{cols}", vec))
            args = padded
        nb = dense_block(cols)
        packed = self.add_const(f"{b_in}@dense{nb}" + (f"p{cols}" if cols != n else ""),
                                pack_dense_weight(wt, nb))
        return self.dense_product(node, data, packed, args, (m, k, n), cols, nb, bias, steps)

    def dense_product(self, node: Node, data: str, packed: str, args: list, mkn: tuple,
                      cols: int, nb: int, bias: bool, steps: list) -> bool:
        """The ``dense`` kernel of ``data`` [m, k] and the packed weights ``packed``
        [cols / nb, k, nb] (``cols`` >= n: padded columns), with the epilogue ``steps`` on
        ``args``; rows padded where the tile needs it, the result cropped to [m, n] and
        viewed as the node's output."""
        (m, k, n), out_t = mkn, self.type(node.outputs[0])
        rows = padded_rows(m)
        if rows != m:  # (m, n)-shaped operands padded too, the output cropped below
            data = self.pad_rows(node, data, rows)
            args = [self.pad_rows(node, v, rows, n) for v in args]
        spec = {"op": "dense", "data": [rows, k], "weight": [cols // nb, k, nb], "bias": bias,
                "epilogue": steps}
        if tuple(out_t.shape) == (m, n) and rows == m and cols == n:
            out = self.produce(node.outputs[0], 0)
            self.kernel(node, spec, [data, packed] + args + [out], out)
            return True
        flat = self.define(f"{node.outputs[0]}@{rows}x{cols}", F32, (rows, cols))
        self.kernel(node, spec, [data, packed] + args + [flat], flat)
        if rows != m or cols != n:  # the padded rows and columns dropped by a compiled copy
            whole = tuple(out_t.shape) == (m, n)
            crop = self.produce(node.outputs[0], 0) if whole \
                else self.define(f"{node.outputs[0]}@2d", F32, (m, n))
            self.kernel(node, copy_spec(F32, (rows, cols), (m, n)), [flat, crop], crop)
            if cols == n:
                self.padded[crop] = (flat, (rows, n))
            if not whole:
                self.step("view", node, [crop], [self.produce(node.outputs[0], 0)])
        else:
            self.step("view", node, [flat], [self.produce(node.outputs[0], 0)])
        return True

    def pad_rows(self, node: Node, v: str, rows: int, n: int | None = None) -> str:
        """``v``, an (m, k) data value or an (m, n) epilogue operand, padded to ``rows``
        (constants with zeros, run-time values with copies of the last row, by a compiled
        copy: the extra rows are computed and dropped); per-column vectors as they are."""
        if v in self.constants:
            a = self.constants[v]
            if a.ndim != 2 or a.shape[0] == rows:  # a per-column vector
                return v
            return self.add_const(f"{v}@pad{rows}", np.pad(a, ((0, rows - a.shape[0]), (0, 0))))
        m, width = self.values[v]["shape"]
        if v in self.padded and self.padded[v][1] == (rows, width):
            return self.padded[v][0]
        out = f"{v}@pad{rows}"
        if out in self.values:  # padded for another projection already (Q, K and V)
            return out
        self.define(out, F32, (rows, width))
        self.kernel(node, copy_spec(F32, (m, width), (rows, width)), [v, out], out)
        return out

    def batched_epilogue(self, node: Node, out_t, flat: tuple):
        """(spec steps, operand values) of the epilogue of a MatMul whose output (``out_t``,
        rank > 2) the dense kernel writes as ``flat`` = (m, n): the bias add, scaling and
        residual add of a transformer's projections. A run-time operand of the output's
        shape is viewed as (m, n), a constant broadcast to it; None otherwise."""
        m, n = flat
        steps, args = [], []
        for op, *rest in node.attrs.get("epilogue", ()):
            if op in UNARY:
                steps.append([op, *[None if a is None else float(a) for a in rest]])
                continue
            if op not in BINARY:
                return None
            v = node.inputs[rest[0]]
            t = self.type(v)
            if t.dtype != F32:
                return None
            if not self.is_const(v):
                if tuple(t.shape) != tuple(out_t.shape):
                    return None
                steps.append([op, "full"])
                args.append(self.view_of(self.plain(v), flat, f"{v}@2d"))
                continue
            a = np.asarray(self.const(v), np.float32)
            if a.size == 1:
                steps.append([op, ["scalar", float(a.reshape(-1)[0])]])
                continue
            try:
                full = np.broadcast_to(a, out_t.shape)
            except ValueError:
                return None
            if a.ndim <= len(out_t.shape) and a.shape[-1] == n \
                    and math.prod(a.shape) == n:  # one value per output column
                steps.append([op, "channel"])
                args.append(self.add_const(f"{v}@channel", a.reshape(-1)))
            else:
                steps.append([op, "full"])
                args.append(self.add_const(f"{v}@{m}x{n}", full.reshape(m, n)))
        return steps, args

    def batch_matmul(self, node: Node) -> bool:
        """Attention's Q @ K^T and P @ V: lowering_nn.batch_matmul."""
        return lowering_nn.batch_matmul(self, node)

    def qgemm(self, node: Node) -> bool:
        if lowering_int8.qgemm(self, node):
            return True
        x, w, bias, multiplier = node.inputs[:4]
        residual = node.inputs[4] if len(node.inputs) > 4 else ""
        tx = self.type(x)
        if len(tx.shape) != 2 or tx.dtype != I8 \
                or not all(self.is_const(v) for v in (w, bias, multiplier)) \
                or not _requantizes(node.attrs):
            return False
        (m, k), n = tx.shape, self.type(w).shape[0]
        nb = channel_block(n)
        args = [self.plain(x),
                self.add_const(f"{w}@dense{nb}",
                               pack_dense_weight(np.asarray(self.const(w), np.int8), nb)),
                self.add_const(bias, np.asarray(self.const(bias), np.int32)),
                self.add_const(multiplier, np.asarray(self.const(multiplier), np.int32)),
                self.requant_const(node)]
        if residual:
            args.append(self.plain(residual))
        spec = {"op": "qdense", "data": [m, k], "weight": [n // nb, k, nb],
                "residual": bool(residual)}
        out = self.produce(node.outputs[0], 0)
        self.kernel(node, spec, args + [out], out)
        return True

    def view_of(self, src: str, shape, name: str) -> str:
        """A view of ``src`` with ``shape``, named ``name`` (the same view again when a
        value is read so twice, e.g. one input of the Q, K and V projections)."""
        shape = list(shape)
        key = (src, tuple(shape))
        if key in self._views:
            return self._views[key]
        while name in self.values:
            name += "'"
        out = self.define(name, self.values[src]["dtype"], shape)
        self.step("view", None, [src], [out])
        self._views[key] = out
        return out

    def pool(self, node: Node) -> bool:
        x = node.inputs[0]
        tx, a = self.type(x), node.attrs
        if len(tx.shape) != 4 or tx.dtype not in _POOL_DTYPES[node.op] \
                or math.prod(a.get("kernel_shape", ())) > POOL_TAPS \
                or len([o for o in node.outputs if o]) != 1 or not node.outputs[0] \
                or (node.op == "QGlobalAveragePool" and not 1 <= int(a["shift"]) <= 31):
            return False
        block = self.current_block(x) or channel_block(tx.shape[1])
        data = self.blocked(x, block)
        out_t = self.type(node.outputs[0])
        out = self.produce(node.outputs[0], block)
        if node.op == "GlobalAveragePool":
            self.kernel(node, {"op": "gap", "data": self.values[data]["shape"]}, [data, out], out)
            return True
        if node.op == "QGlobalAveragePool":
            spec = {"op": "qgap", "data": self.values[data]["shape"],
                    "multiplier": int(a["multiplier"]), "shift": int(a["shift"])}
            if int(a.get("offset", 0)):
                spec["offset"] = int(a["offset"])
            self.kernel(node, spec, [data, out], out)
            return True
        spec = {"op": "maxpool" if node.op == "MaxPool" else "avgpool", "dtype": tx.dtype,
                "data": self.values[data]["shape"], "out": self.values[out]["shape"],
                "kernel": list(a["kernel_shape"]), "strides": list(a["strides"]),
                "pads": list(a["pads"]), "dilations": list(a["dilations"])}
        args = [data]
        if node.op == "AveragePool":
            recip = average_pool_reciprocals(tx.shape[2:], out_t.shape[2:], a["kernel_shape"],
                                             a["strides"], a["dilations"], a["pads"],
                                             bool(a["count_include_pad"]))
            args.append(self.add_const(f"{node.name}@recip", recip))
        self.kernel(node, spec, args + [out], out)
        return True

    def spatial_mean(self, node: Node) -> bool:
        """ReduceMean over H and W of a 4-D float32 value (timm's squeeze-excitation writes
        ``x.mean((2, 3), keepdim=True)``, classifiers without keepdim): the ``gap`` kernel
        on the blocked layout, a view for [N, C], instead of an unpack and a numpy step."""
        x, a = node.inputs[0], node.attrs
        tx = self.type(x)
        if len(tx.shape) != 4 or tx.dtype != F32 or len(node.inputs) != 1 \
                or sorted(int(v) % 4 for v in (a.get("axes") or ())) != [2, 3]:
            return False
        n, c = tx.shape[:2]
        block = self.current_block(x) or channel_block(c)
        data = self.blocked(x, block)
        spec = {"op": "gap", "data": self.values[data]["shape"]}
        if a.get("keepdims", 1):
            out = self.produce(node.outputs[0], block)
            self.kernel(node, spec, [data, out], out)
            return True
        pooled = self.define(f"{node.outputs[0]}@gap", F32, (n, c // block, 1, 1, block))
        self.kernel(node, spec, [data, pooled], pooled)
        self.step("view", node, [pooled], [self.produce(node.outputs[0], 0)])  # same bytes
        return True

    def eltwise(self, node: Node) -> bool:
        out_t = self.type(node.outputs[0])
        if len(node.outputs) != 1 or not out_t.shape:
            return False
        if node.op == "Clip":
            operands, params = node.inputs[:1], []
            for v in (list(node.inputs[1:]) + ["", ""])[:2]:
                if v and not self.is_const(v):
                    return False
                params.append(float(np.asarray(self.const(v)).reshape(-1)[0]) if v else None)
        elif node.op in _ELTWISE_UNARY or node.op in CONVERT:
            operands = node.inputs[:1]
            params = [float(node.attrs[k]) for k in _ELTWISE_PARAMS.get(node.op, ())
                      if k in node.attrs]
            if node.op == "Gelu":  # approximate = "none" / "tanh" -> 0 / 1
                params = [float(node.attrs.get("approximate", "none") == "tanh")]
        else:
            operands, params = node.inputs, []
        if not any(not self.is_const(v) for v in operands):
            return False
        dtype = self.type(operands[0]).dtype
        if dtype not in ELTWISE_DTYPES.get(node.op, (F32,)) \
                or (node.op not in CONVERT and out_t.dtype != dtype):
            return False
        # Blocked when a 4-D operand of the output's shape is blocked already.
        block = 0
        if len(out_t.shape) == 4:
            for v in operands:
                if not self.is_const(v) and self.type(v).shape == out_t.shape:
                    block = block or self.current_block(v)
        layout = "blocked" if block else "plain"
        kinds, args = [], []
        for v in operands:
            got = self.operand(v, out_t, layout, block, dtype)
            if layout == "plain" and (got is None or (got[0] == "channel"
                                                      and len(out_t.shape) != 4)):
                got = lowering_nn.broadcast_operand(self, v, out_t, dtype)
            if got is None:
                return False
            kinds.append(got[0])
            if got[1] is not None:
                args.append(got[1])
        out = self.produce(node.outputs[0], block)
        spec = {"op": "eltwise", "fn": node.op, "params": params, "layout": layout,
                "shape": self.values[out]["shape"], "operands": kinds, "dtype": dtype}
        self.kernel(node, spec, args + [out], out)
        return True

    def view(self, node: Node) -> bool:
        if len([o for o in node.outputs if o]) != 1 or not node.outputs[0] \
                or self.is_const(node.inputs[0]):
            return False
        src = self.plain(node.inputs[0])
        self.step("view", node, [src], [self.produce(node.outputs[0], 0)])
        return True

    def concat(self, node: Node) -> bool:
        out_t = self.type(node.outputs[0])
        if len(out_t.shape) != 4 or node.attrs["axis"] != 1 \
                or any(self.is_const(v) for v in node.inputs):
            return False
        # The block most inputs have already (others converted): blocked as soon as one
        # input is, so a C2f's concat of a slice, a convolution's output, ... stays blocked.
        have = [set(self.versions[v]) - {0} for v in node.inputs]
        fit = {b for bs in have for b in bs
               if all(self.type(v).shape[1] % b == 0 for v in node.inputs)}
        if not fit:
            return False
        block = max(fit, key=lambda b: (sum(b in bs for bs in have), b))
        args = [self.blocked(v, block) for v in node.inputs]
        self.step("concat", node, args, [self.produce(node.outputs[0], block)])
        return True

    def channel_ranges(self, node: Node):
        """[(first, end) channel] per output of a Slice or Split of a 4-D value along its
        channels only (step 1), or None."""
        c, a = self.type(node.inputs[0]).shape[1], node.attrs
        if node.op == "Slice":
            axes = [ax % 4 for ax in a["axes"]]
            if len(node.outputs) != 1 or axes != [1] or list(a["steps"]) != [1]:
                return None
            first, end, _ = slice(int(a["starts"][0]), int(a["ends"][0])).indices(c)
            return [(first, max(first, end))]
        if a["axis"] % 4 != 1 or len(a["split"]) != len(node.outputs):
            return None
        cuts = [0, *np.cumsum(a["split"]).tolist()]
        return list(zip(cuts[:-1], cuts[1:]))

    def channel_split(self, node: Node) -> bool:
        """A Slice or Split of a blocked 4-D value along whole channel blocks: a numpy Slice
        of the blocked array per output (a copy of contiguous runs of blocks), so a C2f's
        halves stay blocked instead of an unpack, a plain slice and a pack."""
        x = node.inputs[0]
        if len(self.type(x).shape) != 4 or self.is_const(x) or not all(node.outputs) \
                or len([v for v in node.inputs if v]) != 1:
            return False
        block, ranges = self.current_block(x), self.channel_ranges(node)
        if not block or ranges is None \
                or any(f % block or e % block or f == e for f, e in ranges):
            return False
        src = self.blocked(x, block)
        for (first, end), o in zip(ranges, node.outputs):
            part = Node("Slice", (src,), (blocked_name(o, block),),
                        {"starts": [first // block], "ends": [end // block], "axes": [1],
                         "steps": [1]}, node.name)
            self.step("numpy", part, [src], [self.produce(o, block)], attrs=part.attrs)
        return True

    def transpose(self, node: Node) -> bool:
        """NCHW <-> NHWC of a 4-D value next to blocked ones (ConvNeXt's block: a depthwise
        Conv, then LayerNorm and MatMuls on NHWC, then back for the residual Add): one numpy
        Transpose of the blocked array as [N, H, W, C//c, c] instead of an unpack and a
        transpose with a stride of C between neighbours, or a transpose and a pack."""
        x, perm = node.inputs[0], list(node.attrs["perm"])
        tx = self.type(x)
        if len(tx.shape) != 4 or self.is_const(x) or len(node.outputs) != 1:
            return False
        out_v = node.outputs[0]
        if perm == [0, 2, 3, 1]:  # NCHW{c}c -> NHWC
            block = self.current_block(x)
            if not block:
                return False
            n, c, h, w = tx.shape
            src = self.blocked(x, block)
            tmp = self.define(f"{out_v}@nhwc{block}c", tx.dtype, (n, h, w, c // block, block))
            part = Node("Transpose", (src,), (tmp,), {"perm": [0, 2, 3, 1, 4]}, node.name)
            self.step("numpy", part, [src], [tmp], attrs=part.attrs)
            self.step("view", node, [tmp], [self.produce(out_v, 0)])
            return True
        if perm != [0, 3, 1, 2]:
            return False
        n, h, w, c = tx.shape
        block = self.reader_block(out_v, c)
        if not block or block == 1:
            return False
        src = self.view_of(self.plain(x), (n, h, w, c // block, block), f"{x}@nhwc{block}c")
        out = self.produce(out_v, block)
        part = Node("Transpose", (src,), (out,), {"perm": [0, 3, 1, 2, 4]}, node.name)
        self.step("numpy", part, [src], [out], attrs=part.attrs)
        return True

    def reader_block(self, v: str, channels: int) -> int | None:
        """The block of a blocked 4-D value that a node reading ``v`` also reads (a
        residual Add's other operand), or None: the layout ``v`` is best made in."""
        for node in self.g.nodes:
            if v not in node.inputs:
                continue
            for u in node.inputs:
                if u and u != v and not self.is_const(u) and u in self.versions \
                        and len(self.type(u).shape) == 4:
                    block = self.current_block(u)
                    if block and channels % block == 0:
                        return block
        return None

    def empty(self, node: Node) -> bool:
        """Whether a value the node reads or writes has no elements."""
        return any(v and 0 in self.type(v).shape for v in (*node.inputs, *node.outputs))

    def fallback(self, node: Node) -> None:
        inputs = [self.plain(v) if v else "" for v in node.inputs]
        outputs = [self.produce(o, 0) if o else "" for o in node.outputs]
        self.step("numpy", node, inputs, outputs, attrs=node.attrs)

    def output(self, v: str) -> str:
        """A graph output in its plain layout; a constant one (an If's folded branch, a
        folded shape) is copied into a value, since outputs are read from the arena."""
        if not self.is_const(v):
            return self.plain(v)
        src = self.plain(v)
        copy = Node("Identity", (src,), (v,), {}, f"{v}@copy")
        self.step("numpy", copy, [src], [self.produce(v, 0)], attrs={})
        return v

    def run(self) -> CpuProgram:
        g = self.g
        for v in g.inputs:
            self.produce(v, 0)
        handlers = {"Conv": self.conv, "Gemm": self.dense, "MatMul": self.dense,
                    "MaxPool": self.pool, "AveragePool": self.pool,
                    "GlobalAveragePool": self.pool, "Concat": self.concat,
                    "QConv": self.qconv, "QGemm": self.qgemm, "QGlobalAveragePool": self.pool,
                    "ConvTranspose": self.conv_transpose, "Resize": self.resize,
                    "LayerNormalization": lambda n: lowering_nn.layer_norm(self, n),
                    "InstanceNormalization": lambda n: lowering_nn.instance_norm(self, n),
                    "Softmax": lambda n: lowering_nn.softmax(self, n),
                    "LogSoftmax": lambda n: lowering_nn.softmax(self, n),
                    # blocked channel splits and NCHW<->NHWC next to blocked values first
                    # (no unpack), then the compiled strided copies (lowering_nn)
                    "Split": self.channel_split,
                    "Slice": lambda n: self.channel_split(n) or lowering_nn.slice_(self, n),
                    "Transpose": lambda n: self.transpose(n) or lowering_nn.transpose(self, n),
                    "ReduceMean": self.spatial_mean,
                    "DepthToSpace": lambda n: lowering_nn.depth_space(self, n),
                    "SpaceToDepth": lambda n: lowering_nn.depth_space(self, n)}
        for op in CONTROL_OPS:  # bodies compiled as programs of their own (control.py)
            handlers[op] = lambda node: lower_control(self, node)
        for op in _VIEW_OPS:
            handlers[op] = self.view
        for op, fn in lowering_q.HANDLERS.items():  # QLut, QAdd, QMul, QMatMul
            handlers[op] = lambda node, fn=fn: fn(self, node)
        for op in ("LSTM", "GRU", "RNN"):  # lower_recurrent.py
            handlers[op] = lambda node: lower_recurrent(self, node, padded_rows)
        for op in tuple(BINARY) + _ELTWISE_UNARY + tuple(CONVERT):
            handlers[op] = self.eltwise
        for node in g.nodes:
            if node.name in self.absorbed:
                continue
            if not all(self.type(v).static for v in node.inputs + node.outputs if v):
                handler = None  # a size only known at run time: a run-time-shaped step
            elif node.op == "Dropout" and len([o for o in node.outputs if o]) > 1:
                handler = None
            elif self.empty(node):  # kernels take no zero-size tensors; nothing to compute
                handler = None
            elif node.attrs.get("epilogue") and node.op not in OWN_INPUTS:
                handler = None
            else:
                handler = handlers.get(node.op)
            if handler is None and node.op in CONTROL_OPS:
                self.control.append({"node": node.name, "op": node.op, "path": "numpy",
                                     "why": control_fallback_reason(self, node)})
            if handler is None or not handler(node):
                self.fallback(node)
        outputs = [self.output(o) for o in g.outputs]
        return CpuProgram(g.name, list(g.inputs), outputs, self.values, self.constants,
                          self.steps, self.specs, control=self.control)


def lower_graph(graph: Graph, *, int8_form: str | None = None) -> CpuProgram:
    """The CPU program of an optimized graph (kernels not compiled yet). ``int8_form``:
    the int8 dot-product instructions of QConv/QGemm kernels, "auto" (None: the host's
    best, or $CELOSIA_INT8_FORM), a form of int8_forms.py, or "none"."""
    from .rewrites import before_lowering

    return _Lowering(before_lowering(graph), int8_form).run()


def compile_program(program: CpuProgram, *, progress=None) -> dict:
    """Compile every kernel of ``program`` (each spec once) into ``program.kernels``;
    returns {"kernels": count, "cached": from cache, "seconds": total}."""
    start, cached = time.perf_counter(), 0
    for n, (key, spec) in enumerate(program.specs.items()):
        if key in program.kernels:
            continue
        t0 = time.perf_counter()
        kernel = compile_spec(spec)
        program.kernels[key] = kernel
        cached += kernel.from_cache
        if progress:
            progress(f"[{n + 1}/{len(program.specs)}] {spec['op']} "
                     f"{'cached' if kernel.from_cache else 'compiled'} in "
                     f"{time.perf_counter() - t0:.2f} s")
    return {"kernels": len(program.specs), "cached": cached,
            "seconds": time.perf_counter() - start}
