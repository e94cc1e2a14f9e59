"""Passes that turn compute loop nests into micro-op kernels (tir.Kernel).

``form_gemm_kernels``: a loop nest containing only tensorized GEMM micro-ops becomes one
kernel; its two outermost loops whose micro-op addresses are affine with the same factors
for every micro-op become the instruction's loops (VTA's FoldUopLoop), the rest are unrolled
into micro-ops.

``inject_alu``: an element-wise nest marked ``alu`` on the accumulator becomes a chain of
in-place ALU kernels, one per operation of its expression (``min(max(x >> 8, -128), 127)``
is SHR, MAX, MIN). The result is written where its first operand lives: the stage's buffer
is recorded as an alias of that operand's, which storage planning honours.
"""

from __future__ import annotations

from celosia.errors import CompilerError
from celosia.isa import AluOp

from ..tensor.expr import Bin, Call, Cast, Const, Expr, Load, coefficient, expr_str, simplify
from ..tensor.tir import (Attr, Evaluate, For, Kernel, PrimFunc, Seq, Stmt, Store, rewrite, seq,
                          transform, walk)
from .intrin import element_index

__all__ = ["form_gemm_kernels", "inject_alu", "MAX_KERNEL_LOOPS"]

MAX_KERNEL_LOOPS = 2
_ELEM_DIMS = 2


def form_gemm_kernels(func: PrimFunc) -> PrimFunc:
    def kernel(s: Stmt):
        """The outermost nests holding only GEMM micro-ops of one signature."""
        call = _first_call(s) if isinstance(s, (For, Evaluate)) else None
        if call is not None and call.name == "uop_gemm" and _is_pure(s, _signature(call)):
            return _make_gemm_kernel(s, call, func.name)
        return None

    return func.with_body(rewrite(func.body, kernel))


def _first_call(s: Stmt):
    return next((n.call for n in walk(s) if isinstance(n, Evaluate)), None)


def _is_pure(s: Stmt, sig) -> bool:
    """Whether a nest holds only GEMM micro-ops of one signature (one kernel's worth)."""
    if isinstance(s, Evaluate):
        return s.call.name == "uop_gemm" and _signature(s.call) == sig
    if isinstance(s, For):
        return _is_pure(s.body, sig)
    if isinstance(s, Seq):
        return all(_is_pure(c, sig) for c in s.stmts)
    return False


def _signature(call: Call) -> tuple:
    """Micro-ops may share a kernel when they use the same buffers and reset flag."""
    args = call.args
    reset = int(args[2].value)
    if reset:
        return (args[0], reset)
    return (args[0], reset, args[3], args[5])


def _make_gemm_kernel(nest: Stmt, call: Call, where: str) -> Kernel:
    reset = bool(call.args[2].value)
    dst_buf = call.args[0]
    src_buf = None if reset else call.args[3]
    wgt_buf = None if reset else call.args[5]
    loops, body = _fold_loops(nest, lambda c: _gemm_uop_exprs(c), where)
    body = transform(body, lambda s: Evaluate(Call("uop", _gemm_uop_exprs(s.call)))
                     if isinstance(s, Evaluate) else None)
    return Kernel("gemm_reset" if reset else "gemm", loops, body, dst_buf, src_buf, wgt_buf)


def _gemm_uop_exprs(call: Call) -> tuple:
    args = call.args
    if int(args[2].value):
        return (args[1], Const(0, "int32"), Const(0, "int32"))
    return (args[1], args[4], args[6])


def _drop_unit_loops(s: Stmt) -> Stmt:
    """Loops of one iteration are their first iteration."""
    from .vthread import substitute_stmt

    def post(node):
        if isinstance(node, For) and node.extent == 1:
            return substitute_stmt(node.body, {node.var: 0}, {})
        return None
    return transform(s, post)


def _fold_loops(nest: Stmt, uop_exprs, where: str):
    """Peel up to two outer loops whose factors are the same for every micro-op."""
    loops = []
    body = _drop_unit_loops(nest)
    while isinstance(body, For) and len(loops) < MAX_KERNEL_LOOPS:
        factors = None
        ok = True
        for ev in (n for n in walk(body.body) if isinstance(n, Evaluate)):
            coefs = []
            for e in uop_exprs(ev.call):
                # affine in this loop's variable (other terms may not be: a bias row chosen
                # by min/max of the inner loops, border.py)
                c = coefficient(e, body.var)
                if c is None:
                    ok = False
                    break
                coefs.append(c)
            if not ok:
                break
            if factors is None:
                factors = tuple(coefs)
            elif tuple(coefs) != factors:
                ok = False
                break
        if not ok:
            break
        loops.append((body.var, body.extent))
        body = body.body
    return tuple(loops), body


# ---- ALU --------------------------------------------------------------------------------

_ALU_OPS = {"+": AluOp.ADD, "*": AluOp.MUL, "min": AluOp.MIN, "max": AluOp.MAX,
            ">>": AluOp.SHR, "<<": AluOp.SHR, "-": AluOp.ADD}


def inject_alu(func: PrimFunc) -> PrimFunc:
    aliases = dict(func.attrs.get("aliases", {}))

    def post(s: Stmt):
        if isinstance(s, Attr) and s.key == "pragma" and s.value == "alu":
            stmt, alias = _alu_nest(s.body, func.name)
            if alias is not None:
                aliases[alias[0]] = alias[1]
            return stmt
        return None

    out = func.with_body(transform(func.body, post))
    out.attrs["aliases"] = aliases
    return out


def _alu_nest(nest: Stmt, where: str):
    loops = []
    s = nest
    while isinstance(s, For):
        loops.append((s.var, s.extent))
        s = s.body
    if not isinstance(s, Store):
        raise CompilerError(f"{where}: an alu nest must be loops around one element-wise store")
    dst = s.buffer
    if dst.scope != "acc":
        raise CompilerError(f"{where}: the ALU writes the accumulator; {dst.name} is in {dst.scope}")
    elem_loops = loops[-_ELEM_DIMS:]
    if len(loops) < _ELEM_DIMS or any(
            not (di == v and ext == n) for (v, ext), di, n in
            zip(elem_loops, s.indices[-_ELEM_DIMS:], dst.shape[-_ELEM_DIMS:])):
        raise CompilerError(f"{where}: the innermost loops of an alu nest must run over whole "
                            f"accumulator elements {dst.shape[-_ELEM_DIMS:]}")
    elem_vars = {v for v, _ in elem_loops}
    ops, base = _alu_chain(s.value, s.indices, elem_vars, where)
    dst_row = element_index(dst, s.indices, _ELEM_DIMS)
    alias = None
    if base.source is not dst:
        alias = (dst, base.source)
    outer = loops[:-_ELEM_DIMS]
    kernels = []
    for op, imm, operand in ops:
        src_buf, src_row = (None, Const(0, "int32"))
        if operand is not None:
            src_buf = operand.source
            src_row = element_index(src_buf, operand.indices, _ELEM_DIMS)
        uop = Evaluate(Call("uop", (dst_row, src_row, Const(0, "int32"))))
        nest_stmt: Stmt = uop
        for v, ext in reversed(outer):
            nest_stmt = For(v, ext, nest_stmt)
        folded, body = _fold_loops(nest_stmt, lambda c: c.args[:2], where)
        kernels.append(Kernel(op, folded, body, dst, src_buf, None, imm))
    return seq(*kernels), alias


def _alu_chain(value: Expr, dst_idx, elem_vars, where: str):
    """(list of (op name, imm, tensor operand), the base load) for an in-place chain."""
    def same_element(ld: Load) -> bool:
        return tuple(ld.indices[-_ELEM_DIMS:]) == tuple(dst_idx[-_ELEM_DIMS:])

    def operand(e: Expr):
        e = simplify(e)
        if isinstance(e, Cast) and e.dtype == "int32" and isinstance(e.value, Load):
            e = e.value  # an int8 tensor held sign-extended in the accumulator (ACC_8BIT)
        if isinstance(e, Const):
            return int(e.value), None
        if isinstance(e, Load) and e.source.scope == "acc" and same_element(e):
            return None, e
        raise CompilerError(f"{where}: ALU operand {expr_str(e)} must be a constant or an "
                            f"accumulator element at the same lanes")

    if isinstance(value, Load):
        if value.source.scope != "acc" or not same_element(value):
            raise CompilerError(f"{where}: {expr_str(value)} is not an accumulator element")
        return [("SHR", 0, None)], value  # a copy (refreshes the int8 OUT view)
    if isinstance(value, Cast) and value.dtype == "int32":
        return _alu_chain(value.value, dst_idx, elem_vars, where)
    if not isinstance(value, Bin) or value.op not in _ALU_OPS:
        raise CompilerError(f"{where}: the ALU cannot compute {expr_str(value)} (it has "
                            f"+, -, *, min, max, >>, <<)")
    a, b = value.a, value.b
    if _depth(a) < _depth(b) and value.op in ("+", "*", "min", "max"):
        a, b = b, a
    ops, base = _alu_chain(a, dst_idx, elem_vars, where) if not isinstance(a, Load) else ([], a)
    if isinstance(a, Load) and (a.source.scope != "acc" or not same_element(a)):
        raise CompilerError(f"{where}: {expr_str(a)} is not an accumulator element")
    imm, tensor = operand(b)
    name = _ALU_OPS[value.op].name
    if value.op == "-":
        if tensor is not None:
            raise CompilerError(f"{where}: the ALU has no subtraction of tensors ({expr_str(value)})")
        imm = -imm
    if value.op == "<<":
        if tensor is not None:
            raise CompilerError(f"{where}: shift left by a tensor is not supported")
        imm = -imm
    return ops + [(name, imm, tensor)], base


def _depth(e: Expr) -> int:
    if isinstance(e, Bin):
        return 1 + max(_depth(e.a), _depth(e.b))
    if isinstance(e, Cast):
        return _depth(e.value)
    return 0

