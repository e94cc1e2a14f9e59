"""Pass: virtual threads, for latency hiding (the TVM paper's section 4.4).

A loop bound to virtual threads is not run as a loop. Each of its iterations (a thread) gets
its own copy of every on-chip buffer allocated inside it, and the threads' statements are
interleaved: loops that do not depend on the thread are kept once, with the threads inside
them, and each accelerator statement is repeated once per thread. With two threads the
program becomes "load A0, load A1, compute 0, compute 1, ...": while thread 1's data
arrives, thread 0 computes, and the dependency tokens derived from the buffers' rows let
the hardware overlap them.

Two orders of interleaving. "statement" (the default): every statement is followed by its
copies for the other threads ("load A0, load A1, load B0, load B1, compute 0, compute 1").
"thread" (``bind_vthread(iv, interleave="thread")``, marked on the loop by an
``Attr("vthread_interleave", "thread")``): consecutive statements of one module are kept
together per thread ("load A0, load B0, load A1, load B1, compute 0, compute 1", and an ALU
chain "SHR 0, MAX 0, MIN 0, SHR 1, MAX 1, MIN 1"), so that each thread's group is complete
as early as possible: thread 0's compute waits only for thread 0's loads, and thread 0's
store runs while thread 1's ALU chain does. A host loop over one module's statements (a
copy row by row) counts as one statement. To form the groups, the allocations nested in a
sequence are hoisted to its start, unless an earlier statement of the sequence used and
released rows of the same scope (so no buffer needs more rows than before).
"""

from __future__ import annotations

from dataclasses import replace

from celosia.isa import MemType

from ..tensor.expr import Call, Const, Expr, Load, collect, free_vars, simplify, substitute
from ..tensor.tir import (Allocate, Attr, Buffer, Evaluate, For, If, Kernel, PrimFunc, Seq, Stmt,
                          Store, rewrite, seq, walk)

__all__ = ["inject_virtual_threads", "substitute_stmt"]


def inject_virtual_threads(func: PrimFunc) -> PrimFunc:
    copies: dict = {}  # buffer -> its per-thread copies

    def threads(s: Stmt):
        if isinstance(s, Attr) and s.key == "vthread_interleave" and isinstance(s.body, For) \
                and s.body.kind == "vthread":
            loop = s.body
            return _inject(rewrite(loop.body, threads), loop.var, loop.extent, {}, copies,
                           major=s.value == "thread")
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


def _inject(s: Stmt, var, n: int, buffers: dict, made: dict, major: bool = False) -> Stmt:
    """The statement with ``n`` threads of ``var`` interleaved; ``buffers`` maps each
    per-thread buffer to its copies (all copies made are recorded in ``made``); ``major``:
    thread-major groups (the module docstring)."""
    if isinstance(s, Allocate) and s.buffer.scope != "global":
        copies = _copies(s.buffer, n, made)
        body = _inject(s.body, var, n, {**buffers, s.buffer: copies}, made, major)
        for copy in reversed(copies):
            body = Allocate(copy, body)
        return body
    if not _uses(s, var, set(buffers)):
        return s
    if isinstance(s, Seq):
        if major:
            return _inject_groups(s, var, n, buffers, made)
        return seq(*(_inject(c, var, n, buffers, made, major) for c in s.stmts))
    if isinstance(s, For) and s.kind != "vthread":
        return replace(s, body=_inject(s.body, var, n, buffers, made, major))
    if isinstance(s, Attr):
        return replace(s, body=_inject(s.body, var, n, buffers, made, major))
    if isinstance(s, If) and var not in free_vars(s.cond):
        return replace(s, then=_inject(s.then, var, n, buffers, made, major),
                       orelse=_inject(s.orelse, var, n, buffers, made, major)
                       if s.orelse is not None else None)
    return _per_thread(s, var, n, buffers)


def _copies(buf: Buffer, n: int, made: dict) -> tuple:
    copies = tuple(Buffer(f"{buf.name}.t{t}", buf.shape, buf.dtype, buf.scope) for t in range(n))
    made[buf] = copies
    return copies


def _per_thread(s: Stmt, var, n: int, buffers: dict) -> Stmt:
    return seq(*(substitute_stmt(s, {var: t}, {b: c[t] for b, c in buffers.items()})
                 for t in range(n)))


def _inject_groups(s: Seq, var, n: int, buffers: dict, made: dict) -> Stmt:
    """A sequence, thread-major: its nested allocations hoisted (where that costs no rows),
    then each run of consecutive thread-dependent statements of one module emitted thread by
    thread, and every other statement (loops) interleaved inside."""
    hoisted, items = [], []
    # Scopes whose rows an earlier statement of the sequence used and released: a later
    # allocation in one of them reused those rows and is not hoisted above it.
    released: set = set()

    def flatten(c: Stmt):
        if isinstance(c, Seq):
            for x in c.stmts:
                flatten(x)
        elif isinstance(c, Attr) and c.key == "stage" and isinstance(c.body, (Seq, Allocate)):
            flatten(c.body)  # the stage comment is dropped with its grouping
        elif isinstance(c, Allocate) and c.buffer.scope != "global" \
                and c.buffer.scope not in released:
            hoisted.append(c.buffer)
            flatten(c.body)
            released.add(c.buffer.scope)
        else:
            items.append(c)
            released.update(a.buffer.scope for a in walk(c) if isinstance(a, Allocate))

    flatten(s)
    buffers = dict(buffers)
    for buf in hoisted:
        buffers[buf] = _copies(buf, n, made)
    out, run, run_module = [], [], None

    def flush():
        nonlocal run, run_module
        for t in range(n):
            sub = {b: c[t] for b, c in buffers.items()}
            out.extend(substitute_stmt(c, {var: t}, sub) for c in run)
        run, run_module = [], None

    for c in items:
        module = _module(c) if _uses(c, var, set(buffers)) else None
        if module is None:
            flush()
            out.append(_inject(c, var, n, buffers, made, True))
            continue
        if module != run_module:
            flush()
        run.append(c)
        run_module = module
    flush()
    body = seq(*out)
    for buf in reversed(hoisted):
        for copy in reversed(buffers[buf]):
            body = Allocate(copy, body)
    return body


def _module(s: Stmt):
    """The module that runs a statement ("load", "compute", "store") when all of its
    accelerator statements run on that one module, else None (a loop over several)."""
    if isinstance(s, Kernel):
        return "compute"
    if isinstance(s, Evaluate):
        if s.call.name == "store_2d":
            return "store"
        if s.call.name == "load_2d":
            mem_type = s.call.args[11]
            if isinstance(mem_type, Const) and int(mem_type.value) in (MemType.INP, MemType.WGT):
                return "load"
            return "compute"  # ACC and ACC_8BIT loads run on compute
        return None
    if isinstance(s, (Attr, For)) and not (isinstance(s, For) and s.kind == "vthread"):
        return _module(s.body)  # a host loop of one module's statements (a copy per row)
    if isinstance(s, If) and s.orelse is None:
        return _module(s.then)
    if isinstance(s, Seq):
        modules = {_module(c) for c in s.stmts}
        return modules.pop() if len(modules) == 1 else None
    return None


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
