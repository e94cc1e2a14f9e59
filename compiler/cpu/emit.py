"""Loop IR -> LLVM IR text (llvmlite.ir), the first half of the CPU backend (codegen_llvm.py).

A PrimFunc is cut at its top level into segments: each top-level loop of kind "parallel" is
one segment whose function runs the iterations [begin, end) of that loop, and the
statements between parallel loops are serial segments. Buffers allocated at the top level
(stages' intermediate tensors) are shared by the segments, so the runtime allocates them
and passes them like parameters. Every segment is exported as

    void <name>(i8** buffers, i64 begin, i64 end)

calling an internal function that takes each buffer as a ``noalias`` pointer (the runtime
checks that arguments do not overlap), so LLVM may keep values in registers and vectorise.

Loop kinds: "serial" and "parallel" loops (a parallel loop below the top level runs
serially) become counted loops; "unroll" repeats the body with the index a constant;
"vectorize" evaluates the body once on vectors of the loop's lanes (a contiguous access is a
vector load or store, an index that does not depend on the loop a broadcast scalar, any
other a per-lane gather or scatter) and falls back to a counted loop, which LLVM's loop
vectoriser then handles, when the body is not a list of stores that can be vectorised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import llvmlite.ir as ir

from celosia.errors import CompilerError

from ..tensor.expr import (MATH_CALLS, Bin, Call, Cast, Const, Expr, Load, Select, Var, collect,
                           free_vars, from_linear, linear_form, simplify, substitute)
from ..tensor.tir import Allocate, Attr, Buffer, Evaluate, For, If, PrimFunc, Seq, Stmt, Store, seq
from .fastmath import emit_exp

__all__ = ["Segment", "split_segments", "emit_module", "LOOP_KINDS", "MAX_VECTOR_LANES"]

LOOP_KINDS = ("serial", "parallel", "vectorize", "unroll")
MAX_VECTOR_LANES = 64  # a longer "vectorize" loop is left to LLVM's loop vectoriser
STACK_BYTES = 256 * 1024  # larger allocations inside a segment are malloc'd

I1, I8, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(64)
_VALUE_TYPES = {"bool": I1, "int8": I8, "uint8": I8, "int16": ir.IntType(16),
                "int32": ir.IntType(32), "int64": I64, "float32": ir.FloatType()}
_MEMORY_TYPES = dict(_VALUE_TYPES, bool=I8)  # numpy stores a bool in a byte
_UNSIGNED = ("bool", "uint8")
_ITEM_BYTES = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "float32": 4}
_ICMP = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}


@dataclass(frozen=True)
class Segment:
    """One exported function: ``body`` runs once (serial), or ``loop`` is a parallel loop
    whose iterations [begin, end) the function runs."""

    symbol: str
    body: Stmt
    loop: For | None = None


def split_segments(func: PrimFunc) -> tuple[list[Buffer], list[Segment]]:
    """The top-level temporaries and the segments of ``func``, in execution order."""
    temps, stmt = [], func.body
    while isinstance(stmt, (Allocate, Attr)):
        if isinstance(stmt, Allocate):
            temps.append(stmt.buffer)
        stmt = stmt.body
    parts = stmt.stmts if isinstance(stmt, Seq) else (stmt,)
    segments, serial = [], []

    def flush():
        if serial:
            segments.append(Segment(f"{func.name}_seg{len(segments)}", seq(*serial)))
            serial.clear()

    for part in parts:
        inner = part
        while isinstance(inner, Attr):
            inner = inner.body
        if isinstance(inner, For) and inner.kind == "parallel":
            flush()
            segments.append(Segment(f"{func.name}_seg{len(segments)}", inner.body, inner))
        else:
            serial.append(part)
    flush()
    return temps, segments


def emit_module(func: PrimFunc, temps: list[Buffer], segments: list[Segment]) -> str:
    """The LLVM IR text of every segment of ``func``."""
    module = ir.Module(name=func.name)
    buffers = list(func.params) + list(temps)
    for segment in segments:
        _FunctionEmitter(module, func, buffers, segment).emit()
    return str(module)


class _NotVectorizable(Exception):
    """Raised while planning a "vectorize" loop: emit it as a counted loop instead."""


class _FunctionEmitter:
    def __init__(self, module: ir.Module, func: PrimFunc, buffers: list[Buffer], segment: Segment):
        self.module, self.func, self.buffers, self.segment = module, func, buffers, segment
        self.env: dict[Var, ir.Value] = {}  # loop variable -> i64 value
        self.extents: dict[Var, int] = {}  # loop variable -> its number of iterations
        self.ptrs: dict[Buffer, ir.Value] = {}
        self.vec: tuple | None = None  # (var, first index (i64), lanes) inside a vectorised loop

    # ---- functions -------------------------------------------------------------------

    def emit(self):
        ptr_types = [_MEMORY_TYPES[b.dtype].as_pointer() for b in self.buffers]
        body_ty = ir.FunctionType(ir.VoidType(), ptr_types + [I64, I64])
        inner = ir.Function(self.module, body_ty, self.segment.symbol + "_body")
        inner.linkage = "internal"
        for arg, buf in zip(inner.args, self.buffers):
            arg.add_attribute("noalias")
            self.ptrs[buf] = arg
        self.fn = inner
        self.alloca_block = inner.append_basic_block("allocas")
        start = inner.append_basic_block("start")
        self.b = ir.IRBuilder(start)
        begin, end = inner.args[-2], inner.args[-1]
        if self.segment.loop is None:
            self.stmt(self.segment.body)
        else:
            loop = self.segment.loop
            self.counted_loop(loop.var, begin, end, lambda: self.stmt(loop.body), loop.extent)
        self.b.ret_void()
        ir.IRBuilder(self.alloca_block).branch(start)

        outer_ty = ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer(), I64, I64])
        outer = ir.Function(self.module, outer_ty, self.segment.symbol)
        b = ir.IRBuilder(outer.append_basic_block("entry"))
        args = []
        for i, ty in enumerate(ptr_types):
            raw = b.load(b.gep(outer.args[0], [ir.Constant(I64, i)]))
            args.append(b.bitcast(raw, ty))
        b.call(inner, args + [outer.args[1], outer.args[2]])
        b.ret_void()

    # ---- statements ----------------------------------------------------------------------

    def stmt(self, s: Stmt):
        if isinstance(s, Seq):
            for c in s.stmts:
                self.stmt(c)
        elif isinstance(s, Attr):
            self.stmt(s.body)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, Allocate):
            self.allocate(s)
        elif isinstance(s, If):
            self.branch(self.value(s.cond), lambda: self.stmt(s.then),
                        (lambda: self.stmt(s.orelse)) if s.orelse is not None else None)
        elif isinstance(s, Evaluate):
            raise CompilerError(f"{self.func.name}: the CPU backend cannot run the call "
                                f"{s.call}; it is an accelerator operation (lower the schedule "
                                f"without tensorize/pragmas for the CPU)")
        else:
            raise CompilerError(f"{self.func.name}: the CPU backend cannot run a "
                                f"{type(s).__name__} statement ({str(s).strip()[:80]})")

    def loop(self, s: For):
        if s.kind not in LOOP_KINDS:
            raise CompilerError(f"{self.func.name}: loop {s.var.name} is of kind {s.kind!r}; the "
                                f"CPU backend runs loops of kind {', '.join(LOOP_KINDS)}")
        self.extents[s.var] = s.extent
        if s.kind == "unroll":
            for i in range(s.extent):
                self.env[s.var] = ir.Constant(I64, i)
                self.stmt(s.body)
            del self.env[s.var]
            return
        if s.kind == "vectorize" and self.vec is None:
            try:
                plan = _plan_vector(s, self.extents)
            except _NotVectorizable:
                plan = None
            if plan is not None:
                self.vector_loop(s, plan)
                return
        self.counted_loop(s.var, ir.Constant(I64, 0), ir.Constant(I64, s.extent),
                          lambda: self.stmt(s.body), s.extent)

    def counted_loop(self, var: Var, begin, end, body, extent: int):
        self.extents[var] = extent
        b = self.b
        pre = b.block
        header = self.fn.append_basic_block(f"{var.name}.head")
        block = self.fn.append_basic_block(f"{var.name}.body")
        done = self.fn.append_basic_block(f"{var.name}.done")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=var.name)
        i.add_incoming(begin, pre)
        b.cbranch(b.icmp_signed("<", i, end), block, done)
        b.position_at_end(block)
        self.env[var] = i
        body()
        nxt = b.add(i, ir.Constant(I64, 1))
        nxt.flags.append("nsw")
        i.add_incoming(nxt, b.block)
        b.branch(header)
        b.position_at_end(done)
        del self.env[var]

    def vector_loop(self, s: For, lanes: int):
        def body():
            self.vec = (s.var, b.mul(self.env[s.var], ir.Constant(I64, lanes)), lanes)
            self.stmt(s.body)
            self.vec = None

        b = self.b
        chunks = s.extent // lanes
        if chunks == 1:
            self.env[s.var] = ir.Constant(I64, 0)
            body()
            del self.env[s.var]
        else:
            self.counted_loop(s.var, ir.Constant(I64, 0), ir.Constant(I64, chunks), body, s.extent)

    def branch(self, cond, then, orelse=None):
        b = self.b
        if orelse is None:
            with b.if_then(cond):
                then()
        else:
            with b.if_else(cond) as (t, f):
                with t:
                    then()
                with f:
                    orelse()

    def allocate(self, s: Allocate):
        buf = s.buffer
        elem = _MEMORY_TYPES[buf.dtype]
        count = math.prod(buf.shape)
        if count * _ITEM_BYTES[buf.dtype] <= STACK_BYTES:
            # In the function's first block, so a loop around the allocation reuses it.
            ab = ir.IRBuilder(self.alloca_block)
            self.ptrs[buf] = ab.alloca(elem, size=ir.Constant(I64, count), name=buf.name)
            self.ptrs[buf].align = 64
            self.stmt(s.body)
            return
        malloc = self.module.globals.get("malloc") or ir.Function(
            self.module, ir.FunctionType(I8.as_pointer(), [I64]), "malloc")
        free = self.module.globals.get("free") or ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer()]), "free")
        raw = self.b.call(malloc, [ir.Constant(I64, count * _ITEM_BYTES[buf.dtype])])
        self.ptrs[buf] = self.b.bitcast(raw, elem.as_pointer())
        self.stmt(s.body)
        self.b.call(free, [raw])

    def store(self, s: Store):
        buf = s.buffer
        if buf not in self.ptrs:
            raise CompilerError(f"{self.func.name}: {buf.name} is stored to outside its "
                                f"allocation")
        value = self.value(s.value)
        flat = _flat_index(buf, s.indices, self.extents)
        if self.vec is None:
            self.b.store(self.to_memory(value, buf.dtype), self.address(buf, self.index(flat)))
            return
        var, _, lanes = self.vec
        access = _access_kind(flat, var)
        if access == "contiguous":
            ptr = self.address(buf, self.first_lane_index(flat))
            vty = ir.VectorType(_MEMORY_TYPES[buf.dtype], lanes)
            self.b.store(self.to_memory(self.splat(value), buf.dtype),
                         self.b.bitcast(ptr, vty.as_pointer()), align=_ITEM_BYTES[buf.dtype])
        else:  # a scatter, lane by lane (in order: the last lane wins, as serially)
            value = self.splat(value)
            for lane in range(lanes):
                ptr = self.address(buf, self.lane_index(flat, lane))
                self.b.store(self.to_memory(self.b.extract_element(value, ir.Constant(I64, lane)),
                                            buf.dtype), ptr)

    # ---- addresses and loads ------------------------------------------------------------

    def address(self, buf: Buffer, offset):
        if buf not in self.ptrs:
            raise CompilerError(f"{self.func.name}: {buf.name} is used outside its allocation")
        return self.b.gep(self.ptrs[buf], [offset], inbounds=True)

    def first_lane_index(self, flat: Expr):
        """The offset of lane 0 of a contiguous access (the variable has coefficient 1)."""
        var, first, _ = self.vec
        rest = self.index(substitute(flat, {var: Const(0, "int32")}))
        out = self.b.add(rest, first)
        out.flags.append("nsw")
        return out

    def lane_index(self, flat: Expr, lane: int):
        """The scalar offset of one lane of a vectorised access."""
        var, first, lanes = self.vec
        saved = self.env.get(var)
        self.vec = None
        self.env[var] = self.b.add(first, ir.Constant(I64, lane))
        try:
            return self.index(flat)
        finally:
            self.vec = (var, first, lanes)
            if saved is None:
                del self.env[var]
            else:
                self.env[var] = saved

    def load(self, e: Load):
        buf = e.source
        flat = _flat_index(buf, e.indices, self.extents)
        if self.vec is None or _access_kind(flat, self.vec[0]) == "uniform":
            return self.from_memory(self.b.load(self.address(buf, self.index(flat))), buf.dtype)
        var, _, lanes = self.vec
        vty = ir.VectorType(_MEMORY_TYPES[buf.dtype], lanes)
        if _access_kind(flat, var) == "contiguous":
            ptr = self.address(buf, self.first_lane_index(flat))
            raw = self.b.load(self.b.bitcast(ptr, vty.as_pointer()), align=_ITEM_BYTES[buf.dtype])
            return self.from_memory(raw, buf.dtype)
        out = ir.Constant(vty, ir.Undefined)
        for lane in range(lanes):
            scalar = self.b.load(self.address(buf, self.lane_index(flat, lane)))
            out = self.b.insert_element(out, scalar, ir.Constant(I64, lane))
        return self.from_memory(out, buf.dtype)

    def to_memory(self, v, dtype):
        return self.b.zext(v, _with_lanes(I8, v.type)) if dtype == "bool" else v

    def from_memory(self, v, dtype):
        if dtype == "bool":
            return self.b.icmp_unsigned("!=", v, ir.Constant(v.type, None))
        return v

    # ---- index expressions: int64 arithmetic that cannot overflow ---------------------------

    def index(self, e: Expr):
        """An integer index expression as i64 (a vector inside a vectorised loop when it
        depends on the vectorised variable)."""
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Const):
            return ir.Constant(I64, int(e.value))
        if isinstance(e, Bin) and e.op in ("+", "-", "*", "min", "max", "//", "%") \
                and e.dtype in ("int32", "int64"):
            a, b = self.index(e.a), self.index(e.b)
            a, b = self.match(a, b)
            if e.op in ("//", "%"):
                return self.divide(e.op, a, b, _nonnegative(e.a) and _nonnegative(e.b))
            if e.op in ("min", "max"):
                return self.b.select(self.b.icmp_signed("<" if e.op == "min" else ">", b, a), b, a)
            out = {"+": self.b.add, "-": self.b.sub, "*": self.b.mul}[e.op](a, b)
            out.flags.append("nsw")
            return out
        v = self.value(e)
        if not isinstance(v.type.element if isinstance(v.type, ir.VectorType) else v.type, ir.IntType):
            raise CompilerError(f"{self.func.name}: index {e} is {e.dtype}, not an integer")
        ty = _with_lanes(I64, v.type)
        if v.type == ty:
            return v
        return self.b.zext(v, ty) if e.dtype in _UNSIGNED else self.b.sext(v, ty)

    def var(self, v: Var):
        if self.vec is not None and v is self.vec[0]:
            _, first, lanes = self.vec
            iota = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
            return self.b.add(self.splat(first, lanes), iota)
        if v not in self.env:
            raise CompilerError(f"{self.func.name}: variable {v.name} is used outside its loop")
        return self.env[v]

    def divide(self, op, a, b, nonnegative: bool):
        """Floor division and modulo (numpy's // and %); unsigned when both are known >= 0."""
        if nonnegative:
            return self.b.udiv(a, b) if op == "//" else self.b.urem(a, b)
        q, r = self.b.sdiv(a, b), self.b.srem(a, b)
        zero = ir.Constant(a.type, None)
        fix = self.b.and_(self.b.icmp_signed("!=", r, zero),
                          self.b.icmp_signed("!=", self.b.icmp_signed("<", r, zero),
                                             self.b.icmp_signed("<", b, zero)))
        if op == "//":
            return self.b.sub(q, self.b.zext(fix, a.type))
        return self.b.add(r, self.b.select(fix, b, zero))

    # ---- value expressions ------------------------------------------------------------------

    def value(self, e: Expr):
        if isinstance(e, Const):
            ty = _VALUE_TYPES[e.dtype]
            if e.dtype == "float32":
                return ir.Constant(ty, float(e.value))
            return ir.Constant(ty, int(e.value))  # LLVM reads i8 255 and i8 -1 alike
        if isinstance(e, Var):
            v = self.var(e)
            return self.b.trunc(v, _with_lanes(_VALUE_TYPES[e.dtype], v.type)) \
                if e.dtype != "int64" else v
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Cast):
            return self.cast(self.value(e.value), e.value.dtype, e.dtype)
        if isinstance(e, Select):
            return self.select(e)
        if isinstance(e, Bin):
            return self.binary(e)
        if isinstance(e, Call) and e.name in MATH_CALLS:
            x = self.value(e.args[0])
            if e.name == "exp":  # llvm.exp on vectors would be scalarised libm calls
                return emit_exp(self.b, x)
            suffix = f"v{x.type.count}f32" if isinstance(x.type, ir.VectorType) else "f32"
            name = f"llvm.{e.name}.{suffix}"
            fn = self.module.globals.get(name) or ir.Function(
                self.module, ir.FunctionType(x.type, [x.type]), name)
            return self.b.call(fn, [x])
        raise CompilerError(f"{self.func.name}: the CPU backend cannot evaluate {e}")

    def cast(self, v, src: str, dst: str):
        b = self.b
        ty = _with_lanes(_VALUE_TYPES[dst], v.type)
        if src == dst:
            return v
        if dst == "bool":
            zero = ir.Constant(v.type, None)
            return b.fcmp_unordered("!=", v, zero) if src == "float32" else b.icmp_unsigned("!=", v, zero)
        if dst == "float32":
            return b.uitofp(v, ty) if src in _UNSIGNED else b.sitofp(v, ty)
        if src == "float32":
            return b.fptoui(v, ty) if dst in _UNSIGNED else b.fptosi(v, ty)
        sw, dw = _VALUE_TYPES[src].width, _VALUE_TYPES[dst].width
        if dw < sw:
            return b.trunc(v, ty)
        if dw > sw:
            return b.zext(v, ty) if src in _UNSIGNED else b.sext(v, ty)
        return v  # int8 <-> uint8: the same bits

    def select(self, e: Select):
        guarded = any(collect(x, lambda n: isinstance(n, Load) or
                              (isinstance(n, Bin) and n.op in ("//", "%")))
                      for x in (e.t, e.f))
        cond = self.value(e.cond)
        if not guarded:
            t, f = self.value(e.t), self.value(e.f)
            if isinstance(cond.type, ir.VectorType) or isinstance(t.type, ir.VectorType) \
                    or isinstance(f.type, ir.VectorType):
                lanes = self.vec[2]
                cond, t, f = self.splat(cond, lanes), self.splat(t, lanes), self.splat(f, lanes)
            return self.b.select(cond, t, f)
        # A branch may read out of bounds where the condition is false (padding): evaluate
        # only the chosen one. Inside a vectorised loop the condition is uniform (_plan_vector).
        def arm(x: Expr):
            v = self.value(x)
            return (self.splat(v) if self.vec is not None else v), self.b.block

        results = []
        with self.b.if_else(cond) as (then, orelse):
            with then:
                results.append(arm(e.t))
            with orelse:
                results.append(arm(e.f))
        (t, tb), (f, fb) = results
        phi = self.b.phi(t.type)
        phi.add_incoming(t, tb)
        phi.add_incoming(f, fb)
        return phi

    def binary(self, e: Bin):
        b = self.b
        op, dtype = e.op, e.a.dtype
        if op in ("&&", "||"):
            x, y = self.match(self.value(e.a), self.value(e.b))
            return b.and_(x, y) if op == "&&" else b.or_(x, y)
        if dtype == "float32" and op == "+" and isinstance(e.b, Bin) and e.b.op == "*":
            # a + x * y: one fused multiply-add where the CPU has it (llvm.fmuladd).
            x, y, z = self.value(e.b.a), self.value(e.b.b), self.value(e.a)
            x, y = self.match(x, y)
            x, z = self.match(x, z)
            y, z = self.match(y, z)
            suffix = f"v{x.type.count}f32" if isinstance(x.type, ir.VectorType) else "f32"
            name = f"llvm.fmuladd.{suffix}"
            fn = self.module.globals.get(name) or ir.Function(
                self.module, ir.FunctionType(x.type, [x.type] * 3), name)
            return b.call(fn, [x, y, z])
        if dtype in ("int32", "int64") and op in ("//", "%"):
            x, y = self.match(self.value(e.a), self.value(e.b))
            return self.divide(op, x, y, _nonnegative(e.a) and _nonnegative(e.b))
        x, y = self.match(self.value(e.a), self.value(e.b))
        if dtype == "float32":
            if op in _ICMP:
                return (b.fcmp_unordered if op == "!=" else b.fcmp_ordered)(op, x, y)
            if op == "min":
                return b.select(b.fcmp_ordered("<", y, x), y, x)  # Python's min(a, b)
            if op == "max":
                return b.select(b.fcmp_ordered(">", y, x), y, x)
            fn = {"+": b.fadd, "-": b.fsub, "*": b.fmul, "/": b.fdiv}.get(op)
            if fn is None:
                raise CompilerError(f"{self.func.name}: {op} of float32 is not supported ({e})")
            return fn(x, y)
        unsigned = dtype in _UNSIGNED
        if op in _ICMP:
            return (b.icmp_unsigned if unsigned else b.icmp_signed)(op, x, y)
        if op in ("min", "max"):
            cmp = b.icmp_unsigned if unsigned else b.icmp_signed
            return b.select(cmp("<" if op == "min" else ">", y, x), y, x)
        if op in ("//", "%"):
            if unsigned:
                return b.udiv(x, y) if op == "//" else b.urem(x, y)
            return self.divide(op, x, y, False)
        if op == ">>":
            return b.lshr(x, y) if unsigned else b.ashr(x, y)
        fn = {"+": b.add, "-": b.sub, "*": b.mul, "<<": b.shl}.get(op)
        if fn is None:
            raise CompilerError(f"{self.func.name}: {op} of {dtype} is not supported ({e}); "
                                f"use // for integer division")
        return fn(x, y)

    # ---- vectors ------------------------------------------------------------------------------

    def splat(self, v, lanes: int | None = None):
        lanes = lanes if lanes is not None else self.vec[2]
        if isinstance(v.type, ir.VectorType):
            return v
        vty = ir.VectorType(v.type, lanes)
        one = self.b.insert_element(ir.Constant(vty, ir.Undefined), v, ir.Constant(I64, 0))
        return self.b.shuffle_vector(one, ir.Constant(vty, ir.Undefined),
                                     ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))

    def match(self, x, y):
        """Broadcast a scalar operand when the other is a vector."""
        xv, yv = isinstance(x.type, ir.VectorType), isinstance(y.type, ir.VectorType)
        if xv and not yv:
            return x, self.splat(y, x.type.count)
        if yv and not xv:
            return self.splat(x, y.type.count), y
        return x, y


# ---- analyses -------------------------------------------------------------------------------


def _with_lanes(ty, like):
    return ir.VectorType(ty, like.count) if isinstance(like, ir.VectorType) else ty


def _flat_index(buf: Buffer, indices, extents: dict) -> Expr:
    """The element offset of ``buf[indices]`` (row-major), in a canonical affine form."""
    flat, stride = None, 1
    for idx, n in reversed(list(zip(indices, buf.shape))):
        idx = _simplify_divmod(idx, extents)
        term = idx if stride == 1 else idx * stride
        flat = term if flat is None else term + flat
        stride *= n
    return _from_affine(*_affine(flat)) if flat is not None else Const(0, "int32")


def _affine(e: Expr) -> tuple[dict, int]:
    """``e`` as (coefficient per atom, constant): atoms are variables and the non-affine
    parts (``f // 56``), compared structurally, so ``a // 4 + b - a // 4`` is ``b``."""
    if isinstance(e, Const) and e.dtype != "float32":
        return {}, int(e.value)
    if isinstance(e, Cast) and e.dtype in ("int32", "int64") and e.value.dtype in ("int32", "int64"):
        return _affine(e.value)
    if isinstance(e, Bin) and e.op in ("+", "-"):
        (ca, ka), (cb, kb) = _affine(e.a), _affine(e.b)
        sign = 1 if e.op == "+" else -1
        coef = dict(ca)
        for atom, k in cb.items():
            coef[atom] = coef.get(atom, 0) + sign * k
            if not coef[atom]:
                del coef[atom]
        return coef, ka + sign * kb
    if isinstance(e, Bin) and e.op == "*":
        (ca, ka), (cb, kb) = _affine(e.a), _affine(e.b)
        if not ca or not cb:
            (coef, c), k = ((cb, kb), ka) if not ca else ((ca, ka), kb)
            return {atom: a * k for atom, a in coef.items() if a * k}, c * k
    return {e: 1}, 0


def _from_affine(coef: dict, c: int) -> Expr:
    out = None
    for atom, k in coef.items():
        term = atom if k == 1 else Bin("*", atom, Const(k, "int32"), "int32")
        out = term if out is None else Bin("+", out, term, "int32")
    if out is None:
        return Const(c, "int32")
    return Bin("+", out, Const(c, "int32"), "int32") if c else out


def _simplify_divmod(e: Expr, extents: dict) -> Expr:
    """Fold ``x // d`` and ``x % d`` where x is affine and its part not divisible by d stays
    in [0, d) over the loops' ranges: ``(jo * 16 + ji) // 16`` is jo when ji < 16. Splits and
    fusions of loops leave such indices (a packed layout read as ``W[j // 16, k, j % 16]``)."""
    if isinstance(e, Bin):
        a, b = _simplify_divmod(e.a, extents), _simplify_divmod(e.b, extents)
        if e.op in ("//", "%") and isinstance(b, Const) and b.value > 0:
            folded = _fold_divmod(e.op, a, int(b.value), extents)
            if folded is not None:
                return folded
        return Bin(e.op, a, b, e.dtype)
    if isinstance(e, Cast):
        return Cast(e.dtype, _simplify_divmod(e.value, extents))
    return e


def _fold_divmod(op: str, a: Expr, d: int, extents: dict):
    lf = linear_form(a)
    if lf is None or any(v not in extents for v in lf[0]):
        return None
    coef, c = lf
    quotient = {v: k // d for v, k in coef.items() if k % d == 0}
    rest = {v: k for v, k in coef.items() if k % d}
    cq, cr = divmod(c, d)
    lo = cr + sum(min(0, k * (extents[v] - 1)) for v, k in rest.items())
    hi = cr + sum(max(0, k * (extents[v] - 1)) for v, k in rest.items())
    if lo < 0 or hi >= d:
        return None
    return simplify(from_linear(quotient, cq) if op == "//" else from_linear(rest, cr))


def _access_kind(flat: Expr, var: Var) -> str:
    """How an access varies with the vectorised variable: uniform, contiguous or gather."""
    if var not in free_vars(flat):
        return "uniform"
    coef, _ = _affine(flat)
    if coef.get(var) == 1 and all(a is var or var not in free_vars(a) for a in coef):
        return "contiguous"
    return "gather"


def _nonnegative(e: Expr) -> bool:
    """Whether an integer expression is known >= 0 (loop variables start at 0)."""
    if isinstance(e, Const):
        return e.value >= 0
    if isinstance(e, Var):
        return True
    if isinstance(e, Bin) and e.op in ("+", "*", "//", "%", "min", "max"):
        return _nonnegative(e.a) and _nonnegative(e.b)
    return False


def _plan_vector(s: For, extents: dict) -> int:
    """The lanes per vector of a "vectorize" loop, or _NotVectorizable."""
    lanes = next((w for w in (s.extent, 16, 8, 4)
                  if w <= MAX_VECTOR_LANES and s.extent % w == 0), None)
    if lanes is None or lanes < 2:
        raise _NotVectorizable
    body, stores = s.body, []
    pending = [body]
    while pending:
        node = pending.pop()
        if isinstance(node, Seq):
            pending.extend(node.stmts)
        elif isinstance(node, Attr):
            pending.append(node.body)
        elif isinstance(node, Store):
            stores.append(node)
        else:
            raise _NotVectorizable  # loops, branches, allocations: leave them to LLVM
    for st in stores:
        flat = _flat_index(st.buffer, st.indices, extents)
        varies = s.var in free_vars(st.value)
        if _access_kind(flat, s.var) == "uniform" and varies:
            raise _NotVectorizable  # a reduction over the lanes
        for sel in collect(st.value, lambda n: isinstance(n, Select)):
            if s.var in free_vars(sel.cond) and any(
                    collect(x, lambda n: isinstance(n, Load) or
                            (isinstance(n, Bin) and n.op in ("//", "%")))
                    for x in (sel.t, sel.f)):
                raise _NotVectorizable  # per-lane guarded reads (padding)
    return lanes
