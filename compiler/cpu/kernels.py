"""CPU kernels for graph nodes, described by JSON-able specs and compiled with LLVM.

A spec says everything a kernel depends on (operator, shapes, strides, the fused epilogue
and the kinds of its operands) and nothing about the values of weights, so nodes of the
same shape share one kernel:

    {"op": "conv", "data": [1, 4, 56, 56, 16], "weight": [4, 4, 3, 3, 16, 16],
     "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "groups": 1,
     "bias": True, "epilogue": [["Add", "full"], ["Relu"]]}

``build_function(spec)`` is the tensor expression and schedule (cpu_schedules.py) lowered to
the loop IR; ``compile_spec(spec)`` compiles it for the host CPU. Parameters come in the
order: data (and weights), bias, the epilogue's tensor operands in step order, output.

Quantized operators (graph_int.py), bit-exact with its numpy kernels:

    {"op": "qconv" | "qdwconv", ...the geometry of "conv" | "dwconv"..., "residual": True
     [, "pad_value": True]}
    {"op": "qdense", "data": [M, K], "weight": [N//n, K, n], "residual": False}
    {"op": "qgap", "data": [N, C//c, H, W, c], "multiplier": 16644, "shift": 23
     [, "offset": -8388608]}
    {"op": "qadd" | "qmul" | "qlut" | "qmatmul", ...}     kernels_q.py (QAdd, QMul, QLut,
                                                           QMatMul)

QConv and QGemm kernels take data, weight, bias, multiplier, ``requant`` (int32 [shift, lo,
hi], and QConv's ``pad_value`` fourth when the spec has ``"pad_value"``: the padding reads
it, not 0; run-time operands, so layers of one shape share a kernel) [, residual], output: int8
data and weights, int32 bias and multipliers (``[C//c, c]`` blocked, ``[N]`` dense), the
integer sums wrapping to int32 as graph_int's ``wrap``. Pooling, ``pack`` and ``unpack`` specs
carry the ``"dtype"`` of their data (``maxpool``: float32 or int8, the padding being the
type's minimum; ``avgpool``: float32; layouts: any), and ``eltwise`` that of its operands:
float32 for the float operators, int8 for Relu, and the conversions ``Quantize`` (float32
-> int8) and ``Dequantize`` (int8 or int32 -> float32) with their ``params`` [scale, zero_point].

Operand kinds (of an epilogue ``Add``/``Mul`` or an element-wise operand): ``"full"`` (the
output's shape and layout), ``"channel"`` (one value per channel: ``[C//c, c]`` blocked,
``[N]`` for a dense output's columns, ``[C]`` for a plain 4-D tensor), ``"image_channel"``
(one value per image and channel of a 4-D output, read at run time: ``[N, C//c, c]``
blocked, ``[N, C]`` plain; squeeze-excitation's scale), ``["scalar", v]`` (a constant
folded into the code) or ``["broadcast", shape]`` (plain layout: a tensor of ``shape``, the
output's rank, broadcast along its axes of size 1 as numpy does; attention's mask).

Compiled kernels are cached twice: LLVM's object code by the hash of the IR
(codegen_llvm), and here the whole kernel by the hash of its spec, the source of the
compiler modules that build it and the host CPU, so a warm build skips building and
emitting the IR too (``$CELOSIA_CACHE/kernels``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from celosia.errors import CompilerError

from ..tensor import te
from ..tensor.expr import all_of, as_expr, exp, max_expr, min_expr, select, sqrt
from ..tensor.lower import lower
from ..tensor.schedule import create_schedule
from .activations_nn import UNARY_NN
from .codegen import CpuKernel, compile_cpu
from .kernels_q import QUANTIZED_ELTWISE_OPS, build_quantized
from .lut import compile_lut, vbmi_available
from .int8_dot import DOT_OPS, compile_dot
from .int8_pool import compile_maxpool
from .kernels_recurrent import compile_recurrent
from .schedules_nn import batch_matmul, schedule_batch_matmul
from .rowwise import ROWWISE_OPS, compile_rowwise
from .copies import build_copy
from .operands import operand_placeholders as _operand_placeholders
from .operands import operand_read as _operand_read
from .host import cache_dir, host_target
from .schedules import (conv2d_nchwc, dense, depthwise_conv2d_nchwc, requantize,
                        schedule_conv2d_nchwc, schedule_dense, schedule_depthwise_conv2d_nchwc,
                        schedule_elementwise)

__all__ = ["UNARY", "BINARY", "CONVERT", "ELTWISE_DTYPES", "build_function", "compile_spec",
           "spec_key", "kernel_cache_dir"]

F32 = "float32"


# ---- element-wise functions (epilogue steps and element-wise nodes) --------------------------


def _clip(v, lo=None, hi=None):
    if lo is not None:
        v = max_expr(v, as_expr(float(lo)))
    if hi is not None:
        v = min_expr(v, as_expr(float(hi)))
    return v


def _hard_sigmoid(v, alpha, beta):
    return _clip(v * as_expr(float(alpha)) + as_expr(float(beta)), 0.0, 1.0)


# name -> fn(value, *params): the graph's float32 unary operators and epilogue steps (Relu
# on int8 too)
UNARY = {
    "Relu": lambda v: max_expr(v, as_expr(0, v)),
    "Clip": _clip,
    "LeakyRelu": lambda v, alpha=0.01: select(v < as_expr(0.0), v * as_expr(float(alpha)), v),
    "HardSigmoid": lambda v, alpha=0.2, beta=0.5: _hard_sigmoid(v, alpha, beta),
    "HardSwish": lambda v: v * _hard_sigmoid(v, 1 / 6, 0.5),
    "Sigmoid": lambda v: as_expr(1.0) / (as_expr(1.0) + exp(-v)),
    "SiLU": lambda v: v / (as_expr(1.0) + exp(-v)),
    "Neg": lambda v: -v,
    "Abs": lambda v: select(v < as_expr(0.0), -v, v),
    "Exp": lambda v: exp(v),
    "Sqrt": lambda v: sqrt(v),  # llvm.sqrt: correctly rounded, as np.sqrt
    "Identity": lambda v: v,
}
# The transformer models' functions (Erf, Gelu): activations_nn.py.
UNARY.update(UNARY_NN)
# name -> fn(a, b)
BINARY = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b,
    "Max": max_expr,
    "Min": min_expr,
    # x * slope where x < 0 (the slope broadcast as any operand: per channel [C, 1, 1])
    "PRelu": lambda a, b: select(a < as_expr(0.0), a * b, a),
}


def _quantize(v, scale, zero_point=0.0):
    """graph_int's Quantize: ``clip(rint(v / float32(scale)), -128, 127)`` in float32, NaN
    to 0 as numpy's cast gives. Clipping first is the same (rint is monotonic and keeps
    integers): the positive part clipped to 127 plus the negative part clipped to -128,
    each 0 for NaN (``max_expr(0, q)`` is ``q > 0 ? q : 0``; min and max, unlike a select
    reading memory in a branch, keep the loop vectorised). rint is adding and subtracting
    1.5 * 2**23, which rounds any |x| <= 2**22 to an integer, half to even (LLVM keeps the
    two operations: no fast-math)."""
    q = v / as_expr(float(np.float32(scale)))
    zero, z = as_expr(0.0), float(zero_point)
    q = (min_expr(max_expr(zero, q), as_expr(127.0 - z))
         + max_expr(min_expr(zero, q), as_expr(-128.0 - z)))
    magic = as_expr(1.5 * 2.0 ** 23)
    q = (q + magic) - magic
    if z:  # a zero point (qzero.py): added to the rounded value, exact
        q = q + as_expr(z)
    return q.astype("int8")


def _dequantize(v, scale, zero_point=0.0):
    """graph_int's Dequantize: ``(float32(v) - zero_point) * float32(scale)``."""
    x = v.astype(F32)
    if float(zero_point):
        x = x - as_expr(float(zero_point))
    return x * as_expr(float(np.float32(scale)))


# name -> fn(value, *params): element-wise type conversions (quantized graphs)
CONVERT = {
    "Quantize": _quantize,
    "Dequantize": _dequantize,
}
# The operand types of the element-wise kernels (float32 for the other operators).
ELTWISE_DTYPES = {"Relu": (F32, "int8"), "Quantize": (F32,), "Dequantize": ("int8", "int32")}


# ---- operands: operands.py (the kinds of the module docstring) ---------------------------


def _epilogue_fn(steps, tensors, layout):
    """fn(value, indices) applying the epilogue steps (see the module docstring)."""
    if not steps:
        return None

    def apply(v, idx):
        for step, t in zip(steps, tensors):
            op, *args = step
            if op in BINARY:
                v = BINARY[op](v, _operand_read(args[0], t, layout, idx))
            else:
                v = UNARY[op](v, *args)
        return v
    return apply


# ---- builders ------------------------------------------------------------------------------


def _conv(spec):
    """``conv`` and ``dwconv`` (float32, bias and epilogue), ``qconv`` and ``qdwconv`` (int8,
    requantized)."""
    depthwise = spec["op"] in ("dwconv", "qdwconv")
    quantized = spec["op"] in ("qconv", "qdwconv")
    dtype = "int8" if quantized else F32
    x = te.placeholder(tuple(spec["data"]), dtype, "data")
    w = te.placeholder(tuple(spec["weight"]), dtype, "weight")
    occ, ob = (w.shape[0], w.shape[3]) if depthwise else (w.shape[0], w.shape[5])
    # The output shape is needed for operand placeholders: build once without epilogue.
    kw = dict(stride=tuple(spec["strides"]), padding=tuple(spec["pads"]),
              dilation=tuple(spec["dilations"]))
    if not depthwise:
        kw["groups"] = spec["groups"]
    make = depthwise_conv2d_nchwc if depthwise else conv2d_nchwc
    shape = make(x, w, **kw).shape
    if quantized:
        b = te.placeholder((occ, ob), "int32", "bias")
        multiplier = te.placeholder((occ, ob), "int32", "multiplier")
        # [shift, lo, hi] (and the padding's value, QConv's pad_value, with "pad_value")
        rq = te.placeholder((4 if spec.get("pad_value") else 3,), "int32", "requant")
        if spec.get("pad_value"):
            kw["pad_value"] = rq[3]
        ops = [te.placeholder(shape, "int8", "residual")] if spec["residual"] else []

        def epilogue(v, idx):
            return requantize(v, multiplier[idx[1], idx[4]], rq[0], rq[1], rq[2],
                              ops[0][idx] if ops else None)
        params = [b, multiplier, rq] + ops
    else:
        b = te.placeholder((occ, ob), F32, "bias") if spec["bias"] else None
        steps = spec["epilogue"]
        ops = _operand_placeholders([s[1] if s[0] in BINARY else 0 for s in steps], "blocked",
                                    shape, "operand")
        epilogue = _epilogue_fn(steps, ops, "blocked")
        params = ([b] if b is not None else []) + [t for t in ops if t is not None]
    y = make(x, w, bias=b, epilogue=epilogue, name="out", **kw)
    s = (schedule_depthwise_conv2d_nchwc if depthwise else schedule_conv2d_nchwc)(y)
    return s, [x, w] + params + [y]


def _dense(spec):
    """``dense`` (float32, bias and epilogue) and ``qdense`` (int8, requantized)."""
    quantized = spec["op"] == "qdense"
    dtype = "int8" if quantized else F32
    x = te.placeholder(tuple(spec["data"]), dtype, "data")
    w = te.placeholder(tuple(spec["weight"]), dtype, "weight")
    n = w.shape[0] * w.shape[2]
    shape = (x.shape[0], n)
    if quantized:
        b = te.placeholder((n,), "int32", "bias")
        multiplier = te.placeholder((n,), "int32", "multiplier")
        rq = te.placeholder((3,), "int32", "requant")
        ops = [te.placeholder(shape, "int8", "residual")] if spec["residual"] else []

        def epilogue(v, idx):
            return requantize(v, multiplier[idx[1]], rq[0], rq[1], rq[2],
                              ops[0][idx] if ops else None)
        params = [b, multiplier, rq] + ops
    else:
        b = te.placeholder((n,), F32, "bias") if spec["bias"] else None
        steps = spec["epilogue"]
        ops = _operand_placeholders([s[1] if s[0] in BINARY else 0 for s in steps], "dense",
                                    shape, "operand")
        epilogue = _epilogue_fn(steps, ops, "dense")
        params = ([b] if b is not None else []) + [t for t in ops if t is not None]
    y = dense(x, w, bias=b, epilogue=epilogue, name="out")
    return schedule_dense(y), [x, w] + params + [y]


def _eltwise(spec):
    shape, layout, kinds = tuple(spec["shape"]), spec["layout"], spec["operands"]
    ops = _operand_placeholders(kinds, layout, shape, "x", spec["dtype"])
    fn, params = spec["fn"], spec["params"]

    def body(*idx):
        vals = [_operand_read(k, t, layout, idx) for k, t in zip(kinds, ops)]
        if fn in BINARY:
            v = vals[0]
            for other in vals[1:]:
                v = BINARY[fn](v, other)
            return v
        return {**UNARY, **CONVERT}[fn](vals[0], *params)

    y = te.compute(shape, body, "out")
    return schedule_elementwise(y), [t for t in ops if t is not None] + [y]


def _window_reads(spec, x, b, c, y, xx, ci, fill):
    """The values of the pooling window at output (y, xx), ``fill`` outside the input."""
    _, _, h, w, _ = x.shape
    (kh, kw), (sh, sw), (dh, dw) = spec["kernel"], spec["strides"], spec["dilations"]
    pt, pl = spec["pads"][0], spec["pads"][1]
    oh, ow = spec["out"][2], spec["out"][3]
    reads = []
    for dy in range(kh):
        for dx in range(kw):
            iy, ix = y * sh + dy * dh - pt, xx * sw + dx * dw - pl
            conds = []
            # Bounds checks only where some output's window can leave the input.
            if pt > dy * dh:
                conds.append(iy >= 0)
            if (oh - 1) * sh + dy * dh - pt >= h:
                conds.append(iy < h)
            if pl > dx * dw:
                conds.append(ix >= 0)
            if (ow - 1) * sw + dx * dw - pl >= w:
                conds.append(ix < w)
            v = x[b, c, iy, ix, ci]
            reads.append(select(all_of(*conds), v, as_expr(fill, v)) if conds else v)
    return reads


def _tree(combine, values: list):
    """``values`` combined pairwise as a balanced tree: an expression of depth log2(n)
    (a chain of n would be as deep as the window is large, and every pass over
    expressions recurses)."""
    while len(values) > 1:
        values = [combine(values[k], values[k + 1]) if k + 1 < len(values) else values[k]
                  for k in range(0, len(values), 2)]
    return values[0]


def _pool(spec):
    """``maxpool`` (float32 or int8; padding is -inf or -128) and ``avgpool`` (float32)."""
    x = te.placeholder(tuple(spec["data"]), spec["dtype"], "data")
    out = tuple(spec["out"])
    if spec["op"] == "maxpool":
        fill = float("-inf") if x.dtype == F32 else int(np.iinfo(x.dtype).min)

        def body(b, c, y, xx, ci):
            return _tree(max_expr, _window_reads(spec, x, b, c, y, xx, ci, fill))
        y = te.compute(out, body, "out")
        return schedule_elementwise(y), [x, y]
    recip = te.placeholder((out[2], out[3]), F32, "recip")

    def avg(b, c, y, xx, ci):
        return _tree(lambda p, q: p + q, _window_reads(spec, x, b, c, y, xx, ci, 0.0)) \
            * recip[y, xx]
    y = te.compute(out, avg, "out")
    return schedule_elementwise(y), [x, recip, y]


def _requantized_average(total, multiplier: int, shift: int, offset: int = 0):
    """graph_int's QGlobalAveragePool from the int32 sum: ``(total * multiplier +
    2**(shift-1) + offset) >> shift`` (wrapping), clipped to int8."""
    m = (multiplier + 2**31) % 2**32 - 2**31  # a product wraps alike with m mod 2**32
    add = ((1 << (shift - 1)) + offset + 2**31) % 2**32 - 2**31
    t = (total * m + add) >> shift
    return min_expr(max_expr(t, -128), 127).astype("int8")


def _global_avg_pool(spec):
    """``gap`` (float32: the mean) and ``qgap`` (int8: the requantized sum)."""
    quantized = spec["op"] == "qgap"
    x = te.placeholder(tuple(spec["data"]), "int8" if quantized else F32, "data")
    n, cc, h, w, cb = x.shape
    ry, rx = te.reduce_axis(h, "ry"), te.reduce_axis(w, "rx")
    rows = None
    if quantized:  # int32 sums are exact in any order
        total = te.compute((n, cc, cb), lambda b, c, ci: te.sum(
            x[b, c, ry, rx, ci].astype("int32"), axis=[ry, rx]), "sum")
    else:  # float32: each row summed, then the rows (one running sum over 112x112 pixels
        # rounds every pixel against an ever larger total: 2.7x onnxruntime's error)
        rows = te.compute((n, cc, h, cb), lambda b, c, yy, ci: te.sum(x[b, c, yy, rx, ci],
                                                                      axis=[rx]), "rows")
        total = te.compute((n, cc, cb), lambda b, c, ci: te.sum(rows[b, c, ry, ci], axis=[ry]),
                           "sum")
    if quantized:
        y = te.compute((n, cc, 1, 1, cb), lambda b, c, i, j, ci: _requantized_average(
            total[b, c, ci], spec["multiplier"], spec["shift"], spec.get("offset", 0)), "out")
    else:
        y = te.compute((n, cc, 1, 1, cb), lambda b, c, i, j, ci: total[b, c, ci]
                       * as_expr(1.0 / (h * w)), "out")
    s = create_schedule(y)
    st = s[total]
    if rows is None:
        sb, sc, sci, sry, srx = st.leaves
        st.reorder(sb, sc, sry, srx, sci)
    else:
        sr = s[rows]
        rb, rc, ryy, rci, rrx = sr.leaves
        sr.reorder(rb, rc, ryy, rrx, rci)
        sr.parallel(sr.fuse(rb, rc))
        sr.vectorize(rci)
        sb, sc, sci, sry = st.leaves
        st.reorder(sb, sc, sry, sci)
    st.parallel(st.fuse(sb, sc))
    st.vectorize(sci)
    o = s[y]
    ob, oc, oi, oj, oci = o.leaves
    o.vectorize(oci)
    return s, [x, y]


def _layout(spec):
    """NCHW <-> NCHW{c}c copies (``pack``: ``shape`` is the plain one; ``unpack``: the
    blocked one, and ``out`` the plain shape when it drops padded channels or columns) of
    values of any ``dtype``."""
    x = te.placeholder(tuple(spec["shape"]), spec["dtype"], "data")
    if spec["op"] == "pack":
        n, c, h, w = x.shape
        b = spec["block"]
        y = te.compute((n, c // b, h, w, b), lambda i, cc, yy, xx, ci: x[i, cc * b + ci, yy, xx],
                       "out")
    else:  # ``out`` (optional): a crop, the first channels and columns
        n, cc, h, w, b = x.shape
        y = te.compute(tuple(spec.get("out", (n, cc * b, h, w))),
                       lambda i, c, yy, xx: x[i, c // b, yy, xx, c % b], "out")
    return schedule_elementwise(y), [x, y]


def _batch_matmul(spec):
    """``batch_matmul``: ``a [B, M, K] @ b [B, K, N]`` (schedules_nn.py), then the
    ``epilogue`` steps if any (unary ones and scalar operands only)."""
    a = te.placeholder(tuple(spec["a"]), F32, "a")
    b = te.placeholder(tuple(spec["b"]), F32, "b")
    steps = spec.get("epilogue", [])
    y = batch_matmul(a, b, epilogue=_epilogue_fn(steps, [None] * len(steps), "plain"))
    return schedule_batch_matmul(y), [a, b, y]


# ---- CNN operators of schedules_conv.py ----------------------------------------------------


def _conv_transpose(spec):
    """``convT``: ConvTranspose (float32, optional bias), see schedules_conv.py."""
    from .schedules_conv import conv_transpose_nchwc, schedule_conv_transpose_nchwc

    x = te.placeholder(tuple(spec["data"]), F32, "data")
    w = te.placeholder(tuple(spec["weight"]), F32, "weight")
    b = te.placeholder((w.shape[0], w.shape[5]), F32, "bias") if spec["bias"] else None
    y = conv_transpose_nchwc(x, w, stride=tuple(spec["strides"]), pads=tuple(spec["pads"]),
                             dilation=tuple(spec["dilations"]), out_hw=tuple(spec["out"]),
                             groups=spec["groups"], bias=b, name="out")
    return schedule_conv_transpose_nchwc(y), [x, w] + ([b] if b is not None else []) + [y]


def _pixel_shuffle(spec):
    """``shuffle``: a direct ConvTranspose's taps to their output pixels, plus the bias (see
    schedules_conv.py)."""
    from .schedules_conv import fold_taps_nchwc, pixel_shuffle_nchwc

    x = te.placeholder(tuple(spec["data"]), F32, "data")
    channels, ob = spec["channels"], spec["block"]
    b = te.placeholder((channels // ob, ob), F32, "bias") if spec["bias"] else None
    if "stride" in spec:  # taps that overlap or miss output pixels: summed where they land
        y = fold_taps_nchwc(x, kernel=tuple(spec["kernel"]), channels=channels, out_block=ob,
                            stride=tuple(spec["stride"]), pads=tuple(spec["pads"]),
                            dilation=tuple(spec["dilations"]), out_hw=tuple(spec["out"]),
                            bias=b, name="out")
    else:
        y = pixel_shuffle_nchwc(x, kernel=tuple(spec["kernel"]), channels=channels,
                                out_block=ob, bias=b, name="out")
    return schedule_elementwise(y), [x] + ([b] if b is not None else []) + [y]


def _resize(spec):
    """``resize``: a Resize of H and W on ``[N, C//c, H, W, c]``, each output row and column
    reading ``taps`` input rows and columns (int32 ``[OH, taps]``, ``[OW, taps]``, from
    graph/ops_resize's own tables) with float32 weights (linear) or one each (nearest).
    Bit-exact with the reference: the sums follow its separable order (rows first, then
    columns), and the weights come negated so that each step is ``sum - x * (-w)``, which
    the code generator leaves as a multiply and a subtraction (``sum + x * w`` would
    become one fused multiply-add, rounded once instead of twice)."""
    x = te.placeholder(tuple(spec["data"]), F32, "data")
    (oh, ow), taps = spec["out"], spec["taps"]
    rows = te.placeholder((oh, taps), "int32", "rows")
    cols = te.placeholder((ow, taps), "int32", "cols")
    params = [x, rows, cols]
    if spec["mode"] == "linear":
        rw = te.placeholder((oh, taps), F32, "row_weights")
        cw = te.placeholder((ow, taps), F32, "col_weights")
        params += [rw, cw]

    def body(b, c, y, xx, ci):
        if spec["mode"] == "nearest":
            return x[b, c, rows[y, 0], cols[xx, 0], ci]
        zero = as_expr(0.0)
        total = zero
        for tx in range(taps):
            column = zero
            for ty in range(taps):
                column = column - x[b, c, rows[y, ty], cols[xx, tx], ci] * rw[y, ty]
            total = total - column * cw[xx, tx]
        return total
    n, cc, _, _, cb = x.shape
    y = te.compute((n, cc, oh, ow, cb), body, "out")
    return schedule_elementwise(y), params + [y]


_BUILDERS = {"batch_matmul": _batch_matmul, "pack": _layout, "unpack": _layout, "conv": _conv,
             "dwconv": _conv, "dense": _dense, "eltwise": _eltwise, "maxpool": _pool,
             "avgpool": _pool, "gap": _global_avg_pool, "qconv": _conv, "qdwconv": _conv, "qdense": _dense,
             "qgap": _global_avg_pool, "convT": _conv_transpose, "shuffle": _pixel_shuffle,
             "resize": _resize, "copy": build_copy}


_BUILDERS.update({op: build_quantized for op in QUANTIZED_ELTWISE_OPS})  # kernels_q.py


def build_function(spec: dict):
    """The loop-IR function of a spec (see the module docstring)."""
    builder = _BUILDERS.get(spec.get("op"))
    if builder is None:
        raise CompilerError(f"no CPU kernel for spec op {spec.get('op')!r}")
    s, args = builder(spec)
    return lower(s, args, name=spec["op"])


# ---- compile, with a cache of whole kernels --------------------------------------------------

# Relative to compiler/: the CPU backend and the tensor level below it.
_SOURCES = ("cpu/kernels.py", "cpu/schedules.py", "cpu/emit.py", "cpu/fastmath.py",
            "cpu/schedules_conv.py", "cpu/schedules_nn.py", "cpu/activations_nn.py",
            "cpu/kernels_recurrent.py", "cpu/kernels_q.py", "cpu/operands.py", "cpu/lut.py",
            "cpu/rowwise.py", "cpu/copies.py", "cpu/int8_dot.py", "cpu/int8_emit.py",
            "cpu/int8_forms.py",
            "cpu/codegen.py", "cpu/host.py", "tensor/te.py",
            "tensor/schedule.py", "tensor/lower.py", "tensor/tir.py", "tensor/expr.py")
_fingerprint: list = []


def _code_fingerprint() -> str:
    """The hash of the compiler modules that turn a spec into machine code."""
    if not _fingerprint:
        h = hashlib.sha256()
        here = Path(__file__).parent.parent
        for name in _SOURCES:
            h.update((here / name).read_bytes())
        _fingerprint.append(h.hexdigest())
    return _fingerprint[0]


def spec_key(spec: dict) -> str:
    """The hash of a spec, the compiler's source and the host CPU."""
    import llvmlite
    t = host_target()
    text = json.dumps([spec, _code_fingerprint(), t.triple, t.cpu, t.features,
                       llvmlite.__version__], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def kernel_cache_dir() -> Path:
    return cache_dir().parent / "kernels"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def compile_spec(spec: dict, *, use_cache: bool = True) -> CpuKernel:
    """The compiled kernel of a spec: from the kernel cache when there, else built,
    lowered and compiled (and stored)."""
    key = spec_key(spec)
    base = kernel_cache_dir() / key
    if use_cache:
        try:
            record = json.loads(base.with_suffix(".json").read_text())
            return CpuKernel.from_record(record, base.with_suffix(".o").read_bytes())
        except (OSError, ValueError, KeyError, CompilerError):
            pass  # missing or unreadable: build it
    if spec.get("op") == "recurrent":  # its own segments, the steps' ones repeated
        kernel = compile_recurrent(spec, use_cache=use_cache)
    elif spec.get("op") in ROWWISE_OPS:  # written in LLVM IR directly (rowwise.py)
        kernel = compile_rowwise(spec, use_cache=use_cache)
    elif spec.get("op") == "qlut" and vbmi_available():  # 64 lookups at a time (lut.py)
        kernel = compile_lut(spec, use_cache=use_cache)
    elif spec.get("op") in DOT_OPS:  # int8 dot-product instructions (int8_dot.py)
        kernel = compile_dot(spec, use_cache=use_cache)
    elif spec.get("op") == "maxpool" and spec.get("dtype") == "int8":  # int8_pool.py
        kernel = compile_maxpool(spec, use_cache=use_cache)
    else:
        kernel = compile_cpu(build_function(spec), use_cache=use_cache)
    if use_cache:
        try:  # object first, then the record that makes the entry visible
            base.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(base.with_suffix(".o"), kernel.obj)
            _write_atomic(base.with_suffix(".json"), json.dumps(kernel.record()).encode())
        except OSError:
            pass  # a read-only cache only costs time
    return kernel


def average_pool_reciprocals(in_hw, out_hw, kernel, strides, dilations, pads,
                             count_include_pad: bool) -> np.ndarray:
    """1 / (the number of elements each average-pool window divides by), ``[OH, OW]``:
    elements inside the input, plus the explicit pads with ``count_include_pad`` (never
    the extra padding of ceil mode), as graph_numpy.average_pool counts them."""
    counts = []
    for a in range(2):
        lo, hi = (-pads[a], in_hw[a] + pads[a + 2]) if count_include_pad else (0, in_hw[a])
        pos = np.arange(out_hw[a])[:, None] * strides[a] - pads[a] \
            + np.arange(kernel[a])[None, :] * dilations[a]
        counts.append(((pos >= lo) & (pos < hi)).sum(axis=1))
    return (1.0 / np.outer(counts[0], counts[1])).astype(np.float32)
