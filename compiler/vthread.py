"""Pass: virtual threads, for latency hiding (the TVM paper's section 4.4).

A loop bound to virtual threads is not run as a loop. Each of its iterations (a thread) gets
its own copy of every on-chip buffer allocated inside it, and the threads' statements are
interleaved: loops that do not depend on the thread are kept once, with the threads inside
them, and each accelerator statement is repeated once per thread. With two threads the
program becomes "load A0, load A1, compute 0, compute 1, ...": while thread 1's data
arrives, thread 0 computes, and the dependency tokens derived from the buffers' rows let
the hardware overlap them.
"""

from __future__ import annotations

from dataclasses import replace

from .expr import Call, Const, Expr, Load, collect, free_vars, simplify, substitute
from .tir import (Allocate, Attr, Buffer, Evaluate, For, If, Kernel, PrimFunc, Seq, Stmt, Store,
                  rewrite, seq, walk)

__all__ = ["inject_virtual_threads", "substitute_stmt"]


def inject_virtual_threads(func: PrimFunc) -> PrimFunc:
    copies: dict = {}  # buffer -> its per-thread copies

    def threads(s: Stmt):
        if isinstance(s, For) and s.kind == "vthread":
            return _inject(rewrite(s.body, threads), s.var, s.extent, {}, copies)
        return None

    out = func.with_body(rewrite(func.body, threads))
    # A buffer computed in place over another stays in place over the same thread's copy.
    aliases = {}
    for buf, target in func.attrs.get("aliases", {}).items():
        for t, copy in enumerate(copies.get(buf, (buf,))):
            aliases[copy] = copies[target][t] if target in copies else target
    out.attrs["aliases"] = aliases
    return out


def _uses(s: Stmt, var, buffers: set) -> bool:
    """Whether a statement depends on the thread: its variable or a per-thread buffer."""
    for node in walk(s):
        exprs, bufs = _parts(node)
        if any(var in free_vars(e) for e in exprs) or any(b in buffers for b in bufs):
            return True
    return False


def _parts(node: Stmt):
    if isinstance(node, Evaluate):
        return ([a for a in node.call.args if isinstance(a, Expr)],
                [a for a in node.call.args if isinstance(a, Buffer)])
    if isinstance(node, Kernel):
        return ([], [b for b in (node.dst_buf, node.src_buf, node.wgt_buf) if b is not None])
    if isinstance(node, Store):
        loads = [ld.source for e in node.indices + (node.value,)
                 for ld in _loads(e)]
        return (list(node.indices) + [node.value], [node.buffer] + loads)
    if isinstance(node, If):
        return ([node.cond], [])
    return ([], [])


def _loads(e: Expr):
    return collect(e, lambda n: isinstance(n, Load))


def _inject(s: Stmt, var, n: int, buffers: dict, made: dict) -> Stmt:
    """The statement with ``n`` threads of ``var`` interleaved; ``buffers`` maps each
    per-thread buffer to its copies (all copies made are recorded in ``made``)."""
    if isinstance(s, Allocate) and s.buffer.scope != "global":
        copies = tuple(Buffer(f"{s.buffer.name}.t{t}", s.buffer.shape, s.buffer.dtype, s.buffer.scope)
                       for t in range(n))
        made[s.buffer] = copies
        body = _inject(s.body, var, n, {**buffers, s.buffer: copies}, made)
        for copy in reversed(copies):
            body = Allocate(copy, body)
        return body
    if not _uses(s, var, set(buffers)):
        return s
    if isinstance(s, Seq):
        return seq(*(_inject(c, var, n, buffers, made) for c in s.stmts))
    if isinstance(s, For) and s.kind != "vthread":
        return replace(s, body=_inject(s.body, var, n, buffers, made))
    if isinstance(s, Attr):
        return replace(s, body=_inject(s.body, var, n, buffers, made))
    if isinstance(s, If) and var not in free_vars(s.cond):
        return replace(s, then=_inject(s.then, var, n, buffers, made),
                       orelse=_inject(s.orelse, var, n, buffers, made) if s.orelse is not None else None)
    return seq(*(substitute_stmt(s, {var: t}, {b: c[t] for b, c in buffers.items()})
                 for t in range(n)))


def substitute_stmt(s: Stmt, values: dict, buffers: dict) -> Stmt:
    """A statement with variables replaced by values and buffers by other buffers."""
    mapping = {v: (Const(x, "int32") if isinstance(x, int) else x) for v, x in values.items()}

    def ex(e):
        def load(node, indices):
            return Load(buffers.get(node.source, node.source), indices, node.dtype)
        return simplify(substitute(e, mapping, load))

    def arg(a):
        if isinstance(a, Buffer):
            return buffers.get(a, a)
        return ex(a) if isinstance(a, Expr) else a

    if isinstance(s, Evaluate):
        return Evaluate(Call(s.call.name, tuple(arg(a) for a in s.call.args), s.call.dtype))
    if isinstance(s, Kernel):
        return replace(s, body=substitute_stmt(s.body, values, buffers),
                       dst_buf=buffers.get(s.dst_buf, s.dst_buf),
                       src_buf=buffers.get(s.src_buf, s.src_buf) if s.src_buf is not None else None,
                       wgt_buf=buffers.get(s.wgt_buf, s.wgt_buf) if s.wgt_buf is not None else None)
    if isinstance(s, Store):
        return Store(buffers.get(s.buffer, s.buffer), tuple(ex(i) for i in s.indices), ex(s.value))
    if isinstance(s, Seq):
        return seq(*(substitute_stmt(c, values, buffers) for c in s.stmts))
    if isinstance(s, If):
        return replace(s, cond=ex(s.cond), then=substitute_stmt(s.then, values, buffers),
                       orelse=substitute_stmt(s.orelse, values, buffers) if s.orelse is not None else None)
    if isinstance(s, (For, Attr)):
        return replace(s, body=substitute_stmt(s.body, values, buffers))
    if isinstance(s, Allocate):
        return replace(s, buffer=buffers.get(s.buffer, s.buffer),
                       body=substitute_stmt(s.body, values, buffers))
    return s
