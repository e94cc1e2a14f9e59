"""Pass: place every on-chip buffer in its SRAM and check capacity.

Buffers are allocated like a stack following the IR's nesting: an allocation lives for its
body, and statements in sequence reuse the same rows (the dependency tokens the code
generator inserts keep the reuse safe). A buffer written in place by an ALU chain
(``inject_alu``'s aliases) shares the rows of the buffer it overwrites, which must not be
read afterwards. Result: ``func.attrs["sram_base"]`` = {buffer: first row}.
"""

from __future__ import annotations

import math

from celosia.config import HwConfig
from celosia.errors import CompilerError

from ..tensor.expr import Load, collect
from ..tensor.tir import Allocate, Evaluate, Kernel, PrimFunc, Stmt, Store, stmt_children, walk

__all__ = ["plan_storage", "buffer_rows"]

ELEM_DIMS = 2


def buffer_rows(buf) -> int:
    """Elements (SRAM rows) a buffer occupies."""
    return math.prod(buf.shape[:len(buf.shape) - ELEM_DIMS]) if len(buf.shape) > ELEM_DIMS else 1


def _uses(func: PrimFunc) -> dict:
    """For every buffer, the pre-order positions of the statements that use it."""
    uses: dict = {}
    for pos, s in enumerate(walk(func.body)):
        bufs = []
        if isinstance(s, Kernel):
            bufs = [b for b in (s.dst_buf, s.src_buf, s.wgt_buf) if b is not None]
        elif isinstance(s, Evaluate):
            bufs = [a for a in s.call.args if hasattr(a, "scope")]
        elif isinstance(s, Store):
            bufs = [s.buffer] + [ld.source for ld in collect(s.value, lambda n: isinstance(n, Load))]
        for b in bufs:
            uses.setdefault(b, []).append(pos)
    return uses


def plan_storage(func: PrimFunc, cfg: HwConfig) -> PrimFunc:
    aliases = func.attrs.get("aliases", {})
    uses = _uses(func)
    depth = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth}
    base: dict = {}
    live: dict = {scope: [] for scope in depth}

    def visit(s: Stmt, top: dict):
        if isinstance(s, Allocate) and s.buffer.scope in depth:
            buf = s.buffer
            target = aliases.get(buf)
            if target is not None:
                if target not in base or buffer_rows(target) != buffer_rows(buf):
                    raise CompilerError(
                        f"{func.name}: {buf.name} is computed in place over {target.name}, but "
                        f"{target.name} is not allocated around it with the same size")
                first_dst = min(uses.get(buf, [10**9]))
                late = [p for p in uses.get(target, []) if p > first_dst]
                if late:
                    raise CompilerError(
                        f"{func.name}: {buf.name} overwrites {target.name} in place (the ALU "
                        f"writes its first operand), but {target.name} is read again afterwards; "
                        f"compute the later reader from {buf.name} or copy {target.name} first")
                base[buf] = base[target]
                visit(s.body, top)
                return
            rows = buffer_rows(buf)
            start = top[buf.scope]
            end = start + rows
            if end > depth[buf.scope]:
                held = ", ".join(f"{b.name} {buffer_rows(b)}" for b in live[buf.scope])
                raise CompilerError(
                    f"{func.name}: the {buf.scope.upper()} buffer overflows: {buf.name} needs "
                    f"{rows} rows at row {start}, but the buffer has {depth[buf.scope]} rows "
                    f"(already held: {held or 'nothing'}); use smaller tiles")
            base[buf] = start
            live[buf.scope].append(buf)
            visit(s.body, {**top, buf.scope: end})
            live[buf.scope].pop()
            return
        for c in stmt_children(s):
            visit(c, top)

    visit(func.body, {scope: 0 for scope in depth})
    out = func.with_body(func.body)
    out.attrs["sram_base"] = base
    return out
