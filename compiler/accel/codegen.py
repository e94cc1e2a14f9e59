"""Code generation for the accelerator: a lowered function becomes driver calls.

The host part of the IR (loops, conditions) is run here, in Python, the way VTA's host code
runs on the CPU; every accelerator statement it reaches becomes one operation with the SRAM
rows it reads and writes. The operations then get dependency tokens (``insert_dependencies``)
and are emitted through the driver's stream builder, the only way this module talks to the
hardware.

Dependencies are exact: an operation that reads rows another module wrote (RAW), or writes
rows another module still reads or wrote (WAR, WAW), waits for a token pushed right after
that operation. Because the operations are those of the unrolled program, loop-carried
dependencies and the interleaved threads of ``inject_virtual_threads`` need no special case:
a thread's tile in other rows simply does not wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CompilerError
from celosia.isa import AluOp, MemType, Module

from ..tensor.expr import Bin, Call, Cast, Const, Select, Var, coefficient, expr_str, free_vars
from ..tensor.tir import Allocate, Attr, Evaluate, For, If, Kernel, PrimFunc, Seq, Stmt, Store, walk

__all__ = ["AccelOp", "build_ops", "insert_dependencies", "emit", "QUEUES"]

L, C, S = Module.LOAD, Module.COMPUTE, Module.STORE
# Which module writes and which reads each kind of on-chip storage across modules.
QUEUES = ((L, C), (C, L), (C, S), (S, C))


@dataclass
class AccelOp:
    """One accelerator operation of the unrolled program."""

    module: Module
    text: str
    emit: Callable
    # (storage, first row, end row, writes): storage is "inp", "wgt" or "out"
    access: list = field(default_factory=list)
    pops: dict = field(default_factory=dict)  # source module -> tokens to pop before
    pushes: set = field(default_factory=set)  # modules to push a token to after


# ---- expression evaluation on the host ----------------------------------------------------


def evaluate(e, env: dict) -> int:
    if isinstance(e, int):
        return e
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        try:
            return env[e]
        except KeyError:
            raise CompilerError(f"host variable {e.name} is not bound here") from None
    if isinstance(e, Bin):
        a, b = evaluate(e.a, env), evaluate(e.b, env)
        op = e.op
        if op == "+": return a + b
        if op == "-": return a - b
        if op == "*": return a * b
        if op == "//": return a // b
        if op == "%": return a % b
        if op == "min": return min(a, b)
        if op == "max": return max(a, b)
        if op == "<": return int(a < b)
        if op == "<=": return int(a <= b)
        if op == ">": return int(a > b)
        if op == ">=": return int(a >= b)
        if op == "==": return int(a == b)
        if op == "!=": return int(a != b)
        if op == "&&": return int(bool(a) and bool(b))
        if op == "||": return int(bool(a) or bool(b))
        if op == ">>": return a >> b
        if op == "<<": return a << b
    if isinstance(e, Cast):
        return evaluate(e.value, env)
    if isinstance(e, Select):
        return evaluate(e.t, env) if evaluate(e.cond, env) else evaluate(e.f, env)
    raise CompilerError(f"the host cannot evaluate {expr_str(e)}")


# ---- building the operation list ---------------------------------------------------------


class _Builder:
    def __init__(self, func: PrimFunc, cfg: HwConfig, dram: dict):
        self.func = func
        self.cfg = cfg
        self.dram = dram  # global Buffer -> DramBuffer
        self.base = func.attrs.get("sram_base", {})
        self.ops: list[AccelOp] = []
        self.kernel_info: dict = {}

    def sram(self, buf) -> int:
        try:
            return self.base[buf]
        except KeyError:
            raise CompilerError(f"{self.func.name}: {buf.name} has no SRAM place; run "
                                f"plan_storage before code generation") from None

    def run(self, s: Stmt, env: dict):
        if isinstance(s, For):
            for i in range(s.extent):
                env[s.var] = i
                self.run(s.body, env)
            env.pop(s.var, None)
        elif isinstance(s, Seq):
            for c in s.stmts:
                self.run(c, env)
        elif isinstance(s, (Allocate, Attr)):
            self.run(s.body, env)
        elif isinstance(s, If):
            if evaluate(s.cond, env):
                self.run(s.then, env)
            elif s.orelse is not None:
                self.run(s.orelse, env)
        elif isinstance(s, Evaluate):
            self.call(s.call, env)
        elif isinstance(s, Kernel):
            self.kernel(s, env)
        elif isinstance(s, Store):
            raise CompilerError(
                f"{self.func.name}: `{str(s).strip()}` is left for the CPU; every stage of an "
                f"accelerator function must be a dma_copy, an alu nest or a tensorized GEMM")
        else:
            raise CompilerError(f"{self.func.name}: cannot generate code for {type(s).__name__}")

    def call(self, call: Call, env: dict):
        if call.name == "load_2d":
            src, src_elem, xs, ys, xstride, xp0, yp0, xp1, yp1, dst, dst_elem, mt = call.args
            v = [evaluate(a, env) for a in (src_elem, xs, ys, xstride, xp0, yp0, xp1, yp1, dst_elem, mt)]
            src_elem, xs, ys, xstride, xp0, yp0, xp1, yp1, dst_elem, mt = v
            mem_type = MemType(mt)
            if xs <= 0 or ys <= 0:
                raise CompilerError(f"{self.func.name}: a {dst.name} tile lies entirely in the "
                                    f"padding ({xs} x {ys} elements copied); use larger tiles")
            sram = self.sram(dst) + dst_elem
            rows = (yp0 + ys + yp1) * (xp0 + xs + xp1)
            module = L if mem_type in (MemType.INP, MemType.WGT) else C
            storage = {MemType.INP: "inp", MemType.WGT: "wgt"}.get(mem_type)
            dram = self.dram[src]

            def emit(dev):
                dev.load_2d(dram, src_elem, xs, ys, xstride, x_pad_0=xp0, y_pad_0=yp0,
                            x_pad_1=xp1, y_pad_1=yp1, sram_index=sram, mem_type=mem_type)
            access = [(storage, sram, sram + rows, True)] if storage else []
            self.ops.append(AccelOp(module, f"load {dst.name}", emit, access))
        elif call.name == "store_2d":
            src, src_elem, dst, dst_elem, xs, ys, xstride = call.args
            src_elem, dst_elem, xs, ys, xstride = (evaluate(a, env) for a in
                                                   (src_elem, dst_elem, xs, ys, xstride))
            sram = self.sram(src) + src_elem
            dram = self.dram[dst]

            def emit(dev):
                dev.store_2d(sram, dram, dst_elem, xs, ys, xstride)
            self.ops.append(AccelOp(S, f"store {dst.name}", emit, [("out", sram, sram + xs * ys, False)]))
        else:
            raise CompilerError(f"{self.func.name}: {call.name} is not an accelerator operation "
                                f"(was a pass skipped?)")

    def _static(self, k: Kernel):
        """Per kernel statement: the loop factors of (dst, src, wgt) and the host variables
        its micro-ops read, computed once."""
        info = self.kernel_info.get(id(k))
        if info is None:
            uops = [n.call for n in walk(k.body) if isinstance(n, Evaluate)]
            factors = []
            for var, extent in k.loops:
                coefs = []
                for e in uops[0].args:
                    coefs.append(coefficient(e, var) or 0)
                factors.append((extent, *coefs))
            local = {v for v, _ in k.loops} | {n.var for n in walk(k.body) if isinstance(n, For)}
            free = {v for u in uops for a in u.args for v in free_vars(a)} - local
            info = self.kernel_info[id(k)] = (tuple(factors), {v: 0 for v, _ in k.loops},
                                              tuple(sorted(free, key=lambda v: v.name)), {})
        return info

    def kernel(self, k: Kernel, env: dict):
        factors, zero, free, made = self._static(k)
        bases = [self.sram(b) if b is not None else 0 for b in (k.dst_buf, k.src_buf, k.wgt_buf)]
        # A kernel statement run again with the same host values is the same operation.
        memo = (tuple(bases), tuple(evaluate(v, env) for v in free))
        if memo in made:
            text, emit, access = made[memo]
            self.ops.append(AccelOp(C, text, emit, list(access)))
            return
        uops = []

        def collect_uops(s: Stmt, local: dict):
            if isinstance(s, For):
                for i in range(s.extent):
                    local[s.var] = i
                    collect_uops(s.body, local)
                local.pop(s.var, None)
            elif isinstance(s, Seq):
                for c in s.stmts:
                    collect_uops(c, local)
            elif isinstance(s, Evaluate) and s.call.name == "uop":
                uops.append(tuple(evaluate(a, local) + b for a, b in zip(s.call.args, bases)))
            else:
                raise CompilerError(f"{self.func.name}: unexpected {type(s).__name__} in a kernel")

        collect_uops(k.body, {**env, **zero})
        uops = tuple(uops)
        arr = np.array(uops, dtype=np.int64)
        span = np.zeros(3, np.int64)
        for extent, *f in factors:
            span += np.array(f) * (extent - 1)
        lo, hi = arr.min(axis=0), arr.max(axis=0) + span + 1
        # What the kernel is (operation, immediate, micro-ops, loops), not which statement
        # made it: a key with id(k) could be reused by another function's statement once
        # the first is garbage-collected, and the device's kernel cache would then refuse
        # (or share) a different kernel under it.
        key = ("k", k.op, k.imm, uops, factors)

        def record(kb):
            for extent, fd, fs, fw in factors:
                kb.loop(extent, fd, fs, fw)
            for d, s_, w in uops:
                kb.push(d, s_, w)

        if k.op in ("gemm", "gemm_reset"):
            reset = k.op == "gemm_reset"

            def emit(dev):
                dev.gemm(key, record, reset=reset)
            access = [("out", int(lo[0]), int(hi[0]), True)]
            if not reset:
                access += [("inp", int(lo[1]), int(hi[1]), False), ("wgt", int(lo[2]), int(hi[2]), False)]
        else:
            op = AluOp[k.op]
            imm = k.imm

            def emit(dev):
                dev.alu(key, record, op, imm=imm)
            access = [("out", int(lo[0]), int(hi[0]), True)]
        made[memo] = (f"{k.op} {k.dst_buf.name}", emit, access)
        self.ops.append(AccelOp(C, f"{k.op} {k.dst_buf.name}", emit, list(access)))


def build_ops(func: PrimFunc, cfg: HwConfig, dram: dict) -> list[AccelOp]:
    builder = _Builder(func, cfg, dram)
    builder.run(func.body, {})
    return builder.ops


# ---- dependency tokens -------------------------------------------------------------------


def insert_dependencies(ops: list[AccelOp], cfg: HwConfig) -> list[AccelOp]:
    """Give every operation the token pops and pushes its hazards need (in place)."""
    depth = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "out": cfg.acc_depth}
    last_write = {k: np.full(n, -1, np.int64) for k, n in depth.items()}
    write_mod = {k: np.full(n, -1, np.int64) for k, n in depth.items()}
    last_read = {k: {m: np.full(n, -1, np.int64) for m in Module} for k, n in depth.items()}
    need = []  # per op: {source module: last op index of that module it depends on}
    for i, op in enumerate(ops):
        deps: dict = {}
        for storage, lo, hi, writes in op.access:
            lw, wm = last_write[storage][lo:hi], write_mod[storage][lo:hi]
            for m in Module:
                if m == op.module:
                    continue
                mask = wm == int(m)
                if mask.any():
                    deps[m] = max(deps.get(m, -1), int(lw[mask].max()))
                if writes:
                    r = last_read[storage][m][lo:hi]
                    if r.size and r.max() >= 0:
                        deps[m] = max(deps.get(m, -1), int(r.max()))
        for storage, lo, hi, writes in op.access:
            if writes:
                last_write[storage][lo:hi] = i
                write_mod[storage][lo:hi] = int(op.module)
                for m in Module:
                    last_read[storage][m][lo:hi] = -1
            else:
                last_read[storage][op.module][lo:hi] = i
        for m in deps:
            if (m, op.module) not in QUEUES:
                raise CompilerError(f"{op.text} depends on a {m.name.lower()} operation, but the "
                                    f"two modules share no token queue")
        need.append(deps)
    # A token pushed after op p releases everything its module did up to p.
    covered = {q: -1 for q in QUEUES}
    for i, op in enumerate(ops):
        for m, p in need[i].items():
            q = (m, op.module)
            if p > covered[q]:
                ops[p].pushes.add(op.module)
                covered[q] = p
    # Pops, in the consumer's order, one per push whose op it must wait for.
    pushed_at = {q: sorted(j for j, o in enumerate(ops) if o.module == q[0] and q[1] in o.pushes)
                 for q in QUEUES}
    taken = {q: 0 for q in QUEUES}
    for i, op in enumerate(ops):
        for m, p in need[i].items():
            q = (m, op.module)
            points = pushed_at[q]
            n = taken[q]
            while n < len(points) and points[n] <= p:
                n += 1
            if n > taken[q]:
                op.pops[m] = n - taken[q]
                taken[q] = n
    return ops


def emit(ops: list[AccelOp], dev) -> None:
    for op in ops:
        for m, n in op.pops.items():
            for _ in range(n):
                dev.dep_pop(m, op.module)
        op.emit(dev)
        for m in sorted(op.pushes):
            dev.dep_push(op.module, m)
