"""Pass: copy loop nests marked ``dma_copy`` become 2D DMA calls (``load_2d``/``store_2d``).

A copy nest moves whole elements (the two trailing dimensions of an accelerator buffer:
BATCH x BLOCK). Its element-level loops are folded into the DMA's x (contiguous in DRAM) and
y (strided) dimensions, merging loops that are contiguous on both sides; loops that do not
fold stay as host loops around the call. A ``select(in_bounds, src[...], 0)`` body (a padded
copy) becomes the DMA's zero padding on its x and y dimensions, computed from the bounds at
run time, so a tile at the image border gets padding and one inside does not.

    load_2d(src, src_elem, x_size, y_size, x_stride, x_pad_0, y_pad_0, x_pad_1, y_pad_1,
            dst, dst_elem, mem_type)
    store_2d(src, src_elem, dst, dst_elem, x_size, y_size, x_stride)
"""

from __future__ import annotations

from dataclasses import dataclass

from celosia.config import MEM_SIZE_BITS
from celosia.errors import CompilerError
from celosia.isa import MemType

from ..tensor.expr import (Bin, Call, Cast, Const, Expr, Load, Select, Var, as_expr, expr_str,
                           free_vars, linear_form, max_expr, min_expr, simplify, substitute)
from ..tensor.tir import Attr, Evaluate, For, PrimFunc, Store, transform
from .intrin import element_index

__all__ = ["inject_dma"]

ELEM_DIMS = 2
# x_size, y_size and x_stride are 16-bit fields of LOAD/STORE (ISA.md).
MAX_FIELD = (1 << MEM_SIZE_BITS) - 1


@dataclass
class _Loop:
    var: Var
    extent: int
    dst_stride: int  # elements
    src_stride: int
    pad: tuple | None = None  # (lower bound expr, upper bound expr) of valid iterations
    parts: tuple = ()  # the loops merged into this one (their variables start at 0)


def inject_dma(func: PrimFunc) -> PrimFunc:
    def post(s):
        if isinstance(s, Attr) and s.key == "pragma" and s.value == "dma_copy":
            return _copy_to_dma(s.body, func.name)
        return None
    return func.with_body(transform(func.body, post))


def _peel(stmt):
    loops = []
    while isinstance(stmt, For):
        loops.append((stmt.var, stmt.extent))
        stmt = stmt.body
    if not isinstance(stmt, Store):
        raise CompilerError(f"dma_copy: the marked nest must be loops around one copy, not\n{stmt}")
    return loops, stmt


def _copy_to_dma(nest, where: str):
    loops, store = _peel(nest)
    dst, value = store.buffer, store.value
    cond = None
    if isinstance(value, Select):
        if not (isinstance(value.f, Const) and value.f.value == 0):
            raise CompilerError(f"{where}: a padded copy must pad with 0, not {value.f}")
        cond, value = value.cond, value.t
    cast_to_acc8 = False
    if isinstance(value, Cast):
        if dst.scope == "global" and value.dtype == "int8":
            value = value.value  # storing OUT: the int8 view of the ACC rows
        elif dst.scope == "acc" and value.value.dtype == "int8":
            value, cast_to_acc8 = value.value, True
        else:
            raise CompilerError(f"{where}: dma_copy cannot convert {value.value.dtype} to "
                                f"{value.dtype} while copying into {dst.name}")
    if not isinstance(value, Load):
        raise CompilerError(f"{where}: dma_copy expects a plain copy {dst.name}[...] = src[...], "
                            f"not {expr_str(store.value)}")
    src = value.source
    if (src.scope == "global") == (dst.scope == "global"):
        raise CompilerError(f"{where}: dma_copy moves between DRAM and an on-chip buffer, not "
                            f"from {src.name} ({src.scope}) to {dst.name} ({dst.scope})")
    load = dst.scope != "global"
    if not load and cond is not None:
        raise CompilerError(f"{where}: a store to DRAM cannot pad")
    if not load and src.scope != "acc":
        raise CompilerError(f"{where}: only the accumulator's int8 view (OUT) can be stored, "
                            f"not {src.name} in {src.scope}")
    if len(value.indices) < ELEM_DIMS or len(store.indices) < ELEM_DIMS:
        raise CompilerError(f"{where}: dma_copy needs element-shaped buffers (trailing "
                            f"{ELEM_DIMS} dimensions)")
    # The innermost two loops must copy exactly one element.
    elem_loops = loops[-ELEM_DIMS:]
    for (v, ext), di, si, n in zip(elem_loops, store.indices[-ELEM_DIMS:], value.indices[-ELEM_DIMS:],
                                   dst.shape[-ELEM_DIMS:]):
        if not (di == v and si == v and ext == n):
            raise CompilerError(f"{where}: the innermost loops of a dma_copy must run over whole "
                                f"elements ({dst.shape[-ELEM_DIMS:]}) indexing both sides directly")
    if tuple(src.shape[-ELEM_DIMS:]) != tuple(dst.shape[-ELEM_DIMS:]):
        raise CompilerError(f"{where}: element shapes differ: {src.name} {src.shape[-ELEM_DIMS:]} "
                            f"and {dst.name} {dst.shape[-ELEM_DIMS:]}")
    outer = loops[:-ELEM_DIMS]
    # Loops of one iteration are their first iteration (unless padding depends on them).
    padded = free_vars(cond) if cond is not None else set()
    unit = {v: Const(0, "int32") for v, ext in outer if ext == 1 and v not in padded}
    dst_elem = simplify(substitute(element_index(dst, store.indices, ELEM_DIMS), unit))
    src_elem = simplify(substitute(element_index(src, value.indices, ELEM_DIMS), unit))
    if cond is not None:
        cond = simplify(substitute(cond, unit))
    bounds = _bounds(cond, [v for v, _ in outer], where) if cond is not None else {}
    info = []
    for v, ext in outer:
        info.append(_Loop(v, ext, _coef(dst_elem, v, where), _coef(src_elem, v, where), bounds.get(v)))
    host, x, y = _fold(info, "dst_stride" if load else "src_stride", where)
    # A host loop made of merged loops runs its innermost part's variable over all of their
    # iterations (contiguous on both sides): the outer parts' variables leave the addresses.
    merged_away = {p.var: Const(0, "int32") for loop in host for p in loop.parts
                   if p.var is not loop.var}
    if merged_away:
        src_elem = simplify(substitute(src_elem, merged_away))
        dst_elem = simplify(substitute(dst_elem, merged_away))
    if load:
        acc8 = cast_to_acc8 or dst.dtype == "int8"  # int8 data held sign-extended in ACC
        mem_type = {"inp": MemType.INP, "wgt": MemType.WGT,
                    "acc": MemType.ACC_8BIT if acc8 else MemType.ACC}[dst.scope]
        call = _load_call(src, src_elem, dst, dst_elem, x, y, mem_type)
    else:
        call = _store_call(src, src_elem, dst, dst_elem, x, y)
    # Every copy loop is now a host loop or folded into the DMA: none may be left in it.
    stray = {v for v, _ in outer} - {loop.var for loop in host}
    for arg in call.args:
        left = [v.name for v in free_vars(arg) if v in stray] if isinstance(arg, Expr) else []
        if left:
            raise CompilerError(f"{where}: folding the copy into {call.name} left loop "
                                f"variable(s) {left} in its argument {expr_str(arg)}")
    stmt = Evaluate(call)
    for loop in reversed(host):
        stmt = For(loop.var, loop.extent, stmt)
    return stmt


def _coef(e: Expr, v: Var, where: str) -> int:
    lf = linear_form(e)
    if lf is None:
        raise CompilerError(f"{where}: the DMA address {expr_str(e)} is not affine in the loops")
    return lf[0].get(v, 0)


def _bounds(cond: Expr, loop_vars, where: str) -> dict:
    """Per loop variable, (lowest valid iteration, first invalid iteration) as expressions."""
    terms = []
    stack = [cond]
    while stack:
        c = stack.pop()
        if isinstance(c, Bin) and c.op == "&&":
            stack += [c.a, c.b]
        else:
            terms.append(c)
    lower: dict = {}
    upper: dict = {}
    for t in terms:
        if not (isinstance(t, Bin) and t.op in ("<", "<=", ">", ">=")):
            raise CompilerError(f"{where}: padding condition {expr_str(t)} is not a bound check")
        diff = linear_form(simplify(t.a - t.b))
        if diff is None:
            raise CompilerError(f"{where}: padding condition {expr_str(t)} is not affine")
        coef, c = diff
        inner = [v for v in coef if v in loop_vars]
        if len(inner) != 1 or coef[inner[0]] != 1:
            raise CompilerError(f"{where}: padding condition {expr_str(t)} must bound one copy "
                                f"loop variable with coefficient 1")
        v = inner[0]
        rest = simplify(_from({u: a for u, a in coef.items() if u is not v}, c))
        # t: v + rest OP 0
        if t.op == ">=":
            lower[v] = _max(lower.get(v), simplify(-rest))
        elif t.op == ">":
            lower[v] = _max(lower.get(v), simplify(1 - rest))
        elif t.op == "<":
            upper[v] = _min(upper.get(v), simplify(-rest))
        else:
            upper[v] = _min(upper.get(v), simplify(1 - rest))
    return {v: (lower.get(v), upper.get(v)) for v in set(lower) | set(upper)}


def _from(coef, c):
    out = as_expr(c)
    for v, a in coef.items():
        out = out + v * a
    return out


def _max(a, b):
    return b if a is None else max_expr(a, b)


def _min(a, b):
    return b if a is None else min_expr(a, b)


def _fold(info: list[_Loop], sram_stride: str, where: str):
    """Split element loops into (host loops, x loop, y loop) for one 2D DMA per iteration.

    x is contiguous on both sides; y advances the on-chip side by one x row (the DMA's
    on-chip side is dense) and DRAM by any stride."""
    loops = [l for l in info if l.extent > 1 or l.pad is not None]
    # Merge an outer loop into the next inner one when both sides are contiguous across them.
    merged = []
    for loop in reversed(loops):  # innermost first
        if merged:
            inner = merged[-1]
            if (loop.pad is None and inner.pad is None
                    and loop.dst_stride == inner.dst_stride * inner.extent
                    and loop.src_stride == inner.src_stride * inner.extent):
                merged[-1] = _Loop(inner.var, inner.extent * loop.extent, inner.dst_stride,
                                   inner.src_stride, parts=(inner.parts or (inner,)) + (loop,))
                continue
        merged.append(loop)
    merged.reverse()  # outermost first again
    x = y = None
    if merged and merged[-1].src_stride == 1 and merged[-1].dst_stride == 1:
        x = merged.pop()
        if x.extent > MAX_FIELD:
            # More elements than x_size holds: x keeps the inner loops it merged that fit,
            # the outer ones become the next loop out (the y loop, or host loops).
            x, rest = _split_parts(x, where)
            merged.append(rest)
    if merged:
        width = x.extent if x else 1
        cand = merged[-1]
        dram_stride = cand.dst_stride if sram_stride == "src_stride" else cand.src_stride
        # y_size and x_stride are 16-bit fields: a loop past them stays a host loop (one DMA
        # per iteration) rather than a DMA that does not encode.
        if getattr(cand, sram_stride) == width and cand.extent <= MAX_FIELD and \
                dram_stride <= MAX_FIELD:
            y = merged.pop()
    for loop in merged:
        if loop.pad is not None:
            raise CompilerError(f"{where}: padding on loop {loop.var.name} cannot be expressed: "
                                f"only the DMA's two innermost dimensions can be padded")
    return merged, x, y


def _split_parts(x: _Loop, where: str) -> tuple[_Loop, _Loop]:
    """(inner, outer) of a merged x loop whose extent exceeds the x_size field: inner takes
    the innermost merged loops whose product fits, outer the others (both contiguous)."""
    parts = x.parts or (x,)
    extent, k = 1, 0
    while k < len(parts) and extent * parts[k].extent <= MAX_FIELD:
        extent *= parts[k].extent
        k += 1
    if k == 0 or x.pad is not None:
        raise CompilerError(f"{where}: a copy of {x.extent} contiguous elements along loop "
                            f"{parts[0].var.name} does not fit the DMA's x_size (at most "
                            f"{MAX_FIELD}): split that loop in the schedule")

    def group(ps):
        if len(ps) == 1:
            return _Loop(ps[0].var, ps[0].extent, ps[0].dst_stride, ps[0].src_stride)
        n = 1
        for p in ps:
            n *= p.extent
        return _Loop(ps[0].var, n, ps[0].dst_stride, ps[0].src_stride, parts=tuple(ps))
    return group(parts[:k]), group(parts[k:])


def _pad_amounts(loop):
    """(pad before, pad after) of a loop as expressions (0 when unpadded)."""
    if loop is None or loop.pad is None:
        return Const(0, "int32"), Const(0, "int32")
    lo, hi = loop.pad
    before = Const(0, "int32") if lo is None else simplify(max_expr(0, min_expr(loop.extent, lo)))
    after = Const(0, "int32") if hi is None else simplify(max_expr(0, min_expr(loop.extent, loop.extent - hi)))
    return before, after


def _start(e: Expr, loops, values) -> Expr:
    """An address with the folded loops at their first copied iteration."""
    mapping = {}
    for loop, value in zip(loops, values):
        for part in loop.parts:
            mapping[part.var] = Const(0, "int32")
        mapping[loop.var] = value
    return simplify(substitute(e, mapping))


def _load_call(src, src_elem, dst, dst_elem, x, y, mem_type):
    xb, xa = _pad_amounts(x)
    yb, ya = _pad_amounts(y)
    x_ext = x.extent if x else 1
    y_ext = y.extent if y else 1
    x_size = simplify(x_ext - xb - xa)
    y_size = simplify(y_ext - yb - ya)
    x_stride = y.src_stride if y else x_ext
    folded = [l for l in (x, y) if l is not None]
    src_start = _start(src_elem, folded, [xb if l is x else yb for l in folded])
    dst_start = _start(dst_elem, folded, [Const(0, "int32")] * len(folded))
    return Call("load_2d", (src, src_start, x_size, y_size, Const(x_stride, "int32"), xb, yb, xa, ya,
                            dst, dst_start, Const(int(mem_type), "int32")))


def _store_call(src, src_elem, dst, dst_elem, x, y):
    x_ext = x.extent if x else 1
    y_ext = y.extent if y else 1
    x_stride = y.dst_stride if y else x_ext
    # For a store, "src" is OUT (dense) and "dst" is DRAM (strided): swap the roles of strides.
    folded = [l for l in (x, y) if l is not None]
    zero = [Const(0, "int32")] * len(folded)
    return Call("store_2d", (src, _start(src_elem, folded, zero), dst, _start(dst_elem, folded, zero),
                             Const(x_ext, "int32"), Const(y_ext, "int32"), Const(x_stride, "int32")))
