"""The loop IR: immutable statements over buffers, a printer, a verifier and an interpreter.

Lowering a schedule gives a :class:`PrimFunc`; passes rewrite it (IR -> IR) until only
accelerator operations (``Call`` of the names in ``ACCEL_CALLS``) and host loops remain.
Loops start at 0. Buffers in an on-chip scope hold one tile; global buffers are DRAM.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from celosia.errors import CompilerError

from .expr import (MATH_CALLS, Bin, Call, Cast, Const, Expr, Load, Select, Var, collect,
                   display_names, expr_str)

__all__ = ["Buffer", "Stmt", "For", "Seq", "Store", "Allocate", "Attr", "If", "Evaluate", "Kernel",
           "PrimFunc", "seq", "print_func", "print_stmt", "verify", "interpret", "walk",
           "transform", "rewrite", "ACCEL_CALLS"]

# Calls the accelerator code generator understands (arguments documented in codegen_vta.py).
ACCEL_CALLS = ("load_2d", "store_2d", "gemm_kernel", "alu_kernel", "dep_push", "dep_pop",
               "uop_gemm", "uop_alu")

_NP_DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
              "uint8": np.uint8, "float32": np.float32, "bool": np.bool_}


@dataclass(frozen=True, eq=False)
class Buffer:
    """A named array: ``scope`` is "global" (DRAM) or an on-chip buffer (inp, wgt, acc)."""

    name: str
    shape: tuple
    dtype: str
    scope: str = "global"

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.shape}, {self.dtype}, {self.scope})"

    def __getitem__(self, indices) -> Load:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return Load(self, tuple(indices), self.dtype)


class Stmt:
    def __str__(self) -> str:
        return print_stmt(self)


@dataclass(frozen=True, repr=False)
class For(Stmt):
    var: Var
    extent: int
    body: Stmt
    kind: str = "serial"  # serial | vthread | parallel | vectorize | unroll (CPU backend)


@dataclass(frozen=True, repr=False)
class Seq(Stmt):
    stmts: tuple


@dataclass(frozen=True, repr=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple
    value: Expr


@dataclass(frozen=True, repr=False)
class Allocate(Stmt):
    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, repr=False)
class Attr(Stmt):
    """An annotation of the statement below: key "pragma" (value: name), "stage" (value:
    the stage name), "coproc" (value: the module that runs it), "uop_kernel"."""

    key: str
    value: object
    body: Stmt


@dataclass(frozen=True, repr=False)
class If(Stmt):
    cond: Expr
    then: Stmt
    orelse: Stmt | None = None


@dataclass(frozen=True, repr=False)
class Evaluate(Stmt):
    call: Call


@dataclass(frozen=True, repr=False)
class Kernel(Stmt):
    """A micro-op kernel: what one GEMM or ALU instruction runs.

    ``loops`` (at most two, outermost first, as (var, extent)) become the instruction's
    loops; ``body`` holds ``uop(dst, src, wgt)`` calls (element rows of ``dst_buf``,
    ``src_buf``, ``wgt_buf``), possibly inside further loops the code generator unrolls into
    separate micro-ops. ``op`` is "gemm", "gemm_reset" or an ALU operation name, ``imm`` the
    ALU immediate (None for a tensor operand)."""

    op: str
    loops: tuple
    body: Stmt
    dst_buf: Buffer
    src_buf: Buffer | None = None
    wgt_buf: Buffer | None = None
    imm: int | None = None


@dataclass(frozen=True)
class PrimFunc:
    name: str
    params: tuple  # Buffers, in argument order
    body: Stmt
    attrs: dict = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return print_func(self)

    def with_body(self, body: Stmt) -> "PrimFunc":
        return replace(self, body=body, attrs=dict(self.attrs))


def seq(*stmts) -> Stmt:
    """A sequence, flattened, with empty parts removed."""
    flat = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        else:
            flat.append(s)
    if len(flat) == 1:
        return flat[0]
    return Seq(tuple(flat))


# ---- traversal ---------------------------------------------------------------------------


def stmt_children(s: Stmt) -> tuple:
    if isinstance(s, (For, Allocate, Attr, Kernel)):
        return (s.body,)
    if isinstance(s, Seq):
        return s.stmts
    if isinstance(s, If):
        return (s.then,) + ((s.orelse,) if s.orelse is not None else ())
    return ()


def walk(s: Stmt):
    """Every statement, pre-order."""
    stack = [s]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(stmt_children(node)))


def rewrite(s: Stmt, fn) -> Stmt:
    """Rebuild top-down: ``fn(node)`` returns a replacement (not visited further) or None to
    keep the node and rewrite inside it."""
    out = fn(s)
    if out is not None:
        return out
    if isinstance(s, Seq):
        return seq(*(rewrite(c, fn) for c in s.stmts))
    if isinstance(s, If):
        return replace(s, then=rewrite(s.then, fn),
                       orelse=rewrite(s.orelse, fn) if s.orelse is not None else None)
    if isinstance(s, (For, Allocate, Attr)):
        return replace(s, body=rewrite(s.body, fn))
    return s


def transform(s: Stmt, post) -> Stmt:
    """Rebuild bottom-up: ``post(node)`` returns a replacement or None to keep the node."""
    if isinstance(s, For):
        new = replace(s, body=transform(s.body, post))
    elif isinstance(s, (Allocate, Attr, Kernel)):
        new = replace(s, body=transform(s.body, post))
    elif isinstance(s, Seq):
        new = seq(*(transform(c, post) for c in s.stmts))
    elif isinstance(s, If):
        new = replace(s, then=transform(s.then, post),
                      orelse=transform(s.orelse, post) if s.orelse is not None else None)
    else:
        new = s
    out = post(new)
    return new if out is None else out


# ---- printer -----------------------------------------------------------------------------


def print_stmt(s: Stmt, indent: int = 0) -> str:
    pad = "  " * indent
    if isinstance(s, For):
        kind = "" if s.kind == "serial" else f"  # {s.kind}"
        return f"{pad}for {expr_str(s.var)} in range({s.extent}):{kind}\n" + print_stmt(s.body, indent + 1)
    if isinstance(s, Seq):
        return "".join(print_stmt(c, indent) for c in s.stmts)
    if isinstance(s, Store):
        idx = ", ".join(expr_str(i) for i in s.indices)
        return f"{pad}{s.buffer.name}[{idx}] = {expr_str(s.value)}\n"
    if isinstance(s, Allocate):
        b = s.buffer
        return (f"{pad}{b.name} = alloc({', '.join(map(str, b.shape))}; {b.dtype}, {b.scope})\n"
                + print_stmt(s.body, indent))
    if isinstance(s, Attr):
        value = s.value.name if hasattr(s.value, "name") else s.value
        return f"{pad}# {s.key} {value}\n" + print_stmt(s.body, indent)
    if isinstance(s, If):
        text = f"{pad}if {expr_str(s.cond)}:\n" + print_stmt(s.then, indent + 1)
        if s.orelse is not None:
            text += f"{pad}else:\n" + print_stmt(s.orelse, indent + 1)
        return text
    if isinstance(s, Evaluate):
        return f"{pad}{expr_str(s.call)}\n"
    if isinstance(s, Kernel):
        bufs = ", ".join(b.name for b in (s.dst_buf, s.src_buf, s.wgt_buf) if b is not None)
        imm = f" imm={s.imm}" if s.imm is not None else ""
        loops = "".join(f" {expr_str(v)}<{n}" for v, n in s.loops)
        return f"{pad}kernel {s.op}{imm} on {bufs} loops[{loops.strip()}]:\n" + print_stmt(s.body, indent + 1)
    raise CompilerError(f"cannot print {type(s).__name__}")


def print_func(f: PrimFunc) -> str:
    params = ", ".join(f"{b.name}: {b.dtype}[{', '.join(map(str, b.shape))}]" for b in f.params)
    variables = set()
    for node in walk(f.body):
        if isinstance(node, For):
            variables.add(node.var)
        elif isinstance(node, Kernel):
            variables.update(v for v, _ in node.loops)
    with display_names(variables):
        return f"def {f.name}({params}):\n" + print_stmt(f.body, 1)


# ---- verifier ----------------------------------------------------------------------------


def verify(f: PrimFunc) -> None:
    """Check that every variable is bound by an enclosing loop, every buffer is a parameter
    or allocated around its use, and every access has the buffer's rank."""
    def check(s: Stmt, bound: set, buffers: set):
        def check_expr(e: Expr, where: str):
            for v in collect(e, lambda n: isinstance(n, Var)):
                if v not in bound:
                    raise CompilerError(f"{f.name}: variable {v.name} used outside its loop in {where}")
            for ld in collect(e, lambda n: isinstance(n, Load)):
                _check_access(ld.source, ld.indices, buffers, where)

        if isinstance(s, For):
            if s.var in bound:
                raise CompilerError(f"{f.name}: loop variable {s.var.name} is bound twice")
            if s.extent <= 0:
                raise CompilerError(f"{f.name}: loop {s.var.name} has extent {s.extent}")
            check(s.body, bound | {s.var}, buffers)
        elif isinstance(s, Allocate):
            check(s.body, bound, buffers | {s.buffer})
        elif isinstance(s, Kernel):
            for b in (s.dst_buf, s.src_buf, s.wgt_buf):
                if b is not None and b not in buffers:
                    raise CompilerError(f"{f.name}: kernel uses {b.name} outside its allocation")
            check(s.body, bound | {v for v, _ in s.loops}, buffers)
        elif isinstance(s, Store):
            where = print_stmt(s).strip()
            _check_access(s.buffer, s.indices, buffers, where)
            for e in s.indices + (s.value,):
                check_expr(e, where)
        elif isinstance(s, If):
            check_expr(s.cond, "if " + expr_str(s.cond))
            for c in stmt_children(s):
                check(c, bound, buffers)
        elif isinstance(s, Evaluate):
            check_expr(s.call, expr_str(s.call))
        else:
            for c in stmt_children(s):
                check(c, bound, buffers)

    def _check_access(buf, indices, buffers, where):
        if not isinstance(buf, Buffer):
            raise CompilerError(f"{f.name}: {where} reads tensor {getattr(buf, 'name', buf)} "
                                f"that was never lowered to a buffer")
        if buf not in buffers:
            raise CompilerError(f"{f.name}: buffer {buf.name} used outside its allocation in {where}")
        if len(indices) != len(buf.shape):
            raise CompilerError(f"{f.name}: {buf.name} has rank {len(buf.shape)}, accessed with "
                                f"{len(indices)} indices in {where}")

    check(f.body, set(), set(f.params))


# ---- interpreter (the reference semantics of the IR, for tests) ---------------------------


def interpret(f: PrimFunc, *arrays: np.ndarray) -> None:
    """Run a lowered function on numpy arrays (updated in place). Slow: for tests."""
    if len(arrays) != len(f.params):
        raise CompilerError(f"{f.name} takes {len(f.params)} buffers, given {len(arrays)}")
    mem = {b: a for b, a in zip(f.params, arrays)}

    def ev(e: Expr, env: dict):
        if isinstance(e, Var):
            return env[e]
        if isinstance(e, Const):
            return _NP_DTYPES.get(e.dtype, np.int32)(e.value) if e.dtype != "bool" else bool(e.value)
        if isinstance(e, Load):
            return mem[e.source][tuple(int(ev(i, env)) for i in e.indices)]
        if isinstance(e, Cast):
            v = ev(e.value, env)
            return np.array(v).astype(_NP_DTYPES[e.dtype])[()]
        if isinstance(e, Select):
            return ev(e.t, env) if ev(e.cond, env) else ev(e.f, env)
        if isinstance(e, Bin):
            a, b = ev(e.a, env), ev(e.b, env)
            with np.errstate(over="ignore"):
                return _apply(e.op, a, b, e.dtype)
        if isinstance(e, Call) and e.name in MATH_CALLS:
            with np.errstate(over="ignore", invalid="ignore"):
                return getattr(np, e.name)(np.float32(ev(e.args[0], env)))
        raise CompilerError(f"interpret: cannot evaluate {type(e).__name__}")

    def run(s: Stmt, env: dict):
        if isinstance(s, For):
            for i in range(s.extent):
                env[s.var] = i
                run(s.body, env)
            env.pop(s.var, None)
        elif isinstance(s, Seq):
            for c in s.stmts:
                run(c, env)
        elif isinstance(s, Store):
            idx = tuple(int(ev(i, env)) for i in s.indices)
            mem[s.buffer][idx] = ev(s.value, env)
        elif isinstance(s, Allocate):
            mem[s.buffer] = np.zeros(s.buffer.shape, _NP_DTYPES[s.buffer.dtype])
            run(s.body, env)
        elif isinstance(s, Attr):
            run(s.body, env)
        elif isinstance(s, If):
            if ev(s.cond, env):
                run(s.then, env)
            elif s.orelse is not None:
                run(s.orelse, env)
        else:
            raise CompilerError(f"interpret: {type(s).__name__} {print_stmt(s).strip()} is an "
                                f"accelerator operation; run it through the code generator")

    run(f.body, {})


def _apply(op, a, b, dtype):
    if op in ("//", "%") and dtype != "float32":
        a, b = int(a), int(b)
        return _NP_DTYPES[dtype](a // b if op == "//" else a % b)
    if op == ">>":
        return a >> b
    if op == "<<":
        return a << b
    return {
        "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
        "min": lambda: min(a, b), "max": lambda: max(a, b),
        "<": lambda: a < b, "<=": lambda: a <= b, ">": lambda: a > b, ">=": lambda: a >= b,
        "==": lambda: a == b, "!=": lambda: a != b, "&&": lambda: a and b, "||": lambda: a or b,
    }[op]()

