"""Lowering: a schedule becomes a loop-IR function (tir.PrimFunc).

For every stage, in producer-to-consumer order, the lowering builds the loop nest of its
leaf loops and the store of its body. A stage computed at another stage's loop is placed at
the start of that loop's body and computes only the region its consumers read there (bound
inference over affine index expressions); its buffer, when on-chip, holds just that region
and every access to it is shifted by the region's start. A reduction gets its initialisation
before its outermost reduce loop (or, with ``init_in_reduce_loop``, inside it on its first
iteration). A tensorized loop nest is matched against the intrinsic and replaced by the
intrinsic's micro-op call.
"""

from __future__ import annotations

from dataclasses import dataclass

from celosia.errors import CompilerError

from .expr import (Const, Expr, Load, Reduce, Var, collect, from_linear, linear_form, simplify,
                   substitute)
from .schedule import Fuse, Schedule, Split, Stage
from .te import Tensor
from .tir import Allocate, Attr, Buffer, For, If, PrimFunc, Store, seq, verify

__all__ = ["lower", "Region"]


@dataclass(frozen=True)
class Region:
    """Per dimension, the first index (an expression of enclosing loop variables) and the
    number of indices."""

    mins: tuple
    extents: tuple


class _Lowering:
    def __init__(self, sch: Schedule, args: list[Tensor], name: str):
        self.sch = sch
        self.name = name
        self.stages = [s for s in sch.stages if not s.inline]
        self.buffers: dict[Stage, Buffer] = {}
        self.regions: dict[Stage, Region] = {}
        self.extent_of: dict[Var, int] = {}
        for stage in sch.stages:
            for iv in stage.leaves:
                self.extent_of[iv.var] = iv.extent
        for t in args:
            stage = sch[t]
            if stage.scope != "global":
                raise CompilerError(f"{name}: argument {t.name} must be in global memory, not "
                                    f"{stage.scope}")
        self.args = [sch[t] for t in args]
        for stage in sch.stages:
            if stage.is_placeholder and stage not in self.args and sch.consumers(stage.tensor):
                raise CompilerError(f"{name}: input {stage.name} is read but not an argument")
        self._check_attached()

    def _check_attached(self):
        for stage in self.stages:
            if stage.attach and any(getattr(r, "parent", getattr(r, "fused", None)).kind == "data"
                                    for r in stage.relations):
                raise CompilerError(
                    f"{stage.name} is computed at {stage.attach[0].name}.{stage.attach[1].name}, so "
                    f"its data loops follow the region it computes there; do not split or fuse "
                    f"them (schedule the consumer's loops, or the reduction loops, instead)")
            if stage.attach and stage.attach[0].inline:
                raise CompilerError(f"{stage.name} is computed at {stage.attach[0].name}, which "
                                    f"is inlined")

    # ---- reads, with cache redirections and inlined stages expanded --------------------

    def body_of(self, stage: Stage) -> Expr:
        """The stage's body reading only non-inlined stages' tensors."""
        def load(node: Load, indices):
            target = self.sch.read_target(stage, node)
            src = self.sch[target]
            if src.inline:
                inner = self.body_of(src)
                return substitute(inner, {a.var: i for a, i in zip(src.op.axes, indices)})
            return Load(target, indices, node.dtype)
        return substitute(stage.op.body, {}, load)

    def reads_of(self, consumer: Stage, producer: Stage) -> list[tuple]:
        body = self.body_of(consumer)
        return [ld.indices for ld in collect(body, lambda n: isinstance(n, Load))
                if ld.source is producer.tensor]

    # ---- loop variables -----------------------------------------------------------------

    def root_values(self, stage: Stage) -> dict[Var, Expr]:
        """Each root axis variable as an expression of the stage's leaf loop variables."""
        value = {iv.var: iv.var for iv in stage.leaves}
        for rel in reversed(stage.relations):
            if isinstance(rel, Split):
                value[rel.parent.var] = value[rel.outer.var] * rel.factor + value[rel.inner.var]
            elif isinstance(rel, Fuse):
                fused = value[rel.fused.var]
                value[rel.outer.var] = fused // rel.inner.extent
                value[rel.inner.var] = fused % rel.inner.extent
        roots = list(stage.op.axes) + list(stage.op.reduce_axes)
        region = self.regions.get(stage)
        out = {}
        for d, iv in enumerate(roots):
            v = value[iv.var]
            if region is not None and d < len(stage.op.axes):
                v = region.mins[d] + v
            out[iv.var] = simplify(v)
        return out

    def enclosing_vars(self, stage: Stage, iv) -> set:
        """Loop variables of every loop enclosing ``stage``'s loop ``iv`` (inclusive)."""
        out = {leaf.var for leaf in stage.leaves[:stage.leaves.index(iv) + 1]}
        if stage.attach:
            out |= self.enclosing_vars(*stage.attach)
        return out

    # ---- bound inference ------------------------------------------------------------------

    def infer_region(self, producer: Stage) -> Region:
        parent, iv = producer.attach
        fixed = self.enclosing_vars(parent, iv)
        shape = producer.tensor.shape
        per_dim = [[] for _ in shape]
        for consumer in self.sch.consumers(producer.tensor):
            if consumer.inline:
                raise CompilerError(f"{producer.name} is read through inlined {consumer.name}; "
                                    f"compute_at with inlined consumers is not supported")
            values = self.root_values(consumer)
            for indices in self.reads_of(consumer, producer):
                for d, idx in enumerate(indices):
                    per_dim[d].append(self._range(simplify(substitute(idx, values)), fixed))
        mins, extents = [], []
        for d, ranges in enumerate(per_dim):
            if not ranges or any(r is None for r in ranges) or \
                    any(r[0] != ranges[0][0] for r in ranges):
                mins.append(Const(0, "int32"))  # not affine: the whole dimension
                extents.append(shape[d])
                continue
            lo = min(r[1] for r in ranges)
            hi = max(r[2] for r in ranges)
            mins.append(simplify(ranges[0][0] + lo))
            extents.append(hi - lo + 1)
        return Region(tuple(mins), tuple(extents))

    def _range(self, idx: Expr, fixed: set):
        """(fixed part, lowest and highest constant offset) of an index, or None."""
        lf = linear_form(idx)
        if lf is None:
            if not (set(collect(idx, lambda n: isinstance(n, Var))) - fixed):
                return (idx, 0, 0)
            return None
        coef, const = lf
        fixed_part = from_linear({v: a for v, a in coef.items() if v in fixed}, 0)
        lo = hi = const
        for v, a in coef.items():
            if v in fixed:
                continue
            span = a * (self.extent_of[v] - 1)
            lo += min(0, span)
            hi += max(0, span)
        return (fixed_part, lo, hi)

    # ---- buffers ----------------------------------------------------------------------

    def buffer_of(self, stage: Stage) -> Buffer:
        if stage not in self.buffers:
            region = self.regions.get(stage)
            shape = region.extents if region else stage.tensor.shape
            self.buffers[stage] = Buffer(stage.name, tuple(shape), stage.tensor.dtype, stage.scope)
        return self.buffers[stage]

    def access(self, stage_or_tensor, indices) -> tuple[Buffer, tuple]:
        stage = stage_or_tensor if isinstance(stage_or_tensor, Stage) else self.sch[stage_or_tensor]
        region = self.regions.get(stage)
        if region is not None:
            indices = tuple(simplify(i - m) for i, m in zip(indices, region.mins))
        return self.buffer_of(stage), tuple(simplify(i) for i in indices)

    def rewrite_loads(self, e: Expr, values: dict) -> Expr:
        def load(node: Load, indices):
            buf, idx = self.access(node.source, indices)
            return Load(buf, idx, node.dtype)
        return simplify(substitute(e, values, load))

    # ---- nests ----------------------------------------------------------------------------

    def stage_nest(self, stage: Stage):
        """The loop nest of one stage, with the stages computed at its loops inside it."""
        values = self.root_values(stage)
        body = self.body_of(stage)
        out_buf, out_idx = self.access(stage, tuple(values[a.var] for a in stage.op.axes))
        leaves = stage.leaves
        extents = {iv: iv.extent for iv in leaves}
        region = self.regions.get(stage)
        if region is not None:
            for d, iv in enumerate(stage.op.axes):
                extents[iv] = region.extents[d]
        tens_pos = len(leaves)
        if stage.tensorize_at is not None:
            tens_pos = leaves.index(stage.tensorize_at[0])
        if isinstance(body, Reduce):
            reduce_pos = next(i for i, iv in enumerate(leaves) if iv.kind == "reduce")
            source = self.rewrite_loads(body.source, values)
            update = Store(out_buf, out_idx, Load(out_buf, out_idx, out_buf.dtype) + source)
            init = Store(out_buf, out_idx, Const(0, out_buf.dtype))
        else:
            reduce_pos = None
            update = Store(out_buf, out_idx, self.rewrite_loads(body, values))
            init = None

        def build(pos: int):
            """Statements for loops leaves[pos:], innermost first."""
            if pos == tens_pos and stage.tensorize_at is not None:
                intrinsic = stage.tensorize_at[1]
                inner = leaves[pos:]
                call = intrinsic.emit(self, stage, inner, values, out_buf, out_idx,
                                      reset=False)
                if reduce_pos is not None and reduce_pos >= pos:
                    reset = intrinsic.emit(self, stage, inner, values, out_buf, out_idx, reset=True)
                    return seq(reset, call)
                return call
            if pos == len(leaves):
                if reduce_pos is not None and reduce_pos >= pos:
                    return seq(init, update)
                return update
            iv = leaves[pos]
            inner = build(pos + 1)
            if pos == reduce_pos and stage.init_inside:
                first = If(iv.var.equal(0), self.init_nest(stage, pos + 1, tens_pos, init, values,
                                                           out_buf, out_idx, extents))
                inner = seq(first, inner)
            kind = "vthread" if iv in stage.vthreads else stage.loop_kinds.get(iv, "serial")
            nest = self.attached_at(stage, iv, For(iv.var, extents[iv], inner, kind))
            if kind == "vthread" and stage.vthread_interleave.get(iv) == "thread":
                nest = Attr("vthread_interleave", "thread", nest)
            for p in stage.pragmas.get(iv, []):
                nest = Attr("pragma", p, nest)
            if pos == reduce_pos and not stage.init_inside:
                nest = seq(self.init_nest(stage, pos, tens_pos, init, values, out_buf, out_idx,
                                          extents), nest)
            return nest

        return Attr("stage", stage.name, build(0))

    def attached_at(self, stage: Stage, iv, loop: For) -> For:
        """Put the stages computed at ``stage``'s loop ``iv`` at the start of its body."""
        inner = [s for s in self.stages if s.attach == (stage, iv)]
        if not inner:
            return loop
        body = loop.body
        for producer in reversed(inner):
            nest = self.stage_nest(producer)
            body = seq(nest, body)
            if producer.scope != "global":
                body = Allocate(self.buffer_of(producer), body)
            else:
                raise CompilerError(f"{producer.name} is computed at {stage.name}.{iv.name} but "
                                    f"lives in global memory; give it an on-chip scope")
        return For(loop.var, loop.extent, body, loop.kind)

    def init_nest(self, stage, pos, tens_pos, init, values, out_buf, out_idx, extents):
        """The reduction's initialisation: the data loops inside position ``pos``."""
        data = [iv for iv in stage.leaves[pos:] if iv.kind == "data"]
        if tens_pos < len(stage.leaves):
            intrinsic = stage.tensorize_at[1]
            inner = stage.leaves[tens_pos:]
            outer_data = [iv for iv in data if stage.leaves.index(iv) < tens_pos]
            body = intrinsic.emit(self, stage, inner, values, out_buf, out_idx, reset=True)
        else:
            outer_data, body = data, init
        for iv in reversed(outer_data):
            body = For(iv.var, extents[iv], body, stage.loop_kinds.get(iv, "serial"))
        return body

    def run(self) -> PrimFunc:
        # Consumers first: a region depends on the regions of the stages that read it.
        for stage in reversed(self.stages):
            if stage.attach:
                region = self.regions[stage] = self.infer_region(stage)
                for iv, extent in zip(stage.op.axes, region.extents):
                    self.extent_of[iv.var] = extent
        body = []
        for stage in self.stages:
            if stage.is_placeholder or stage.attach:
                continue
            nest = self.stage_nest(stage)
            body.append((stage, nest))
        stmt = seq(*(n for _, n in body))
        for stage, _ in reversed(body):
            if stage not in self.args:
                stmt = Allocate(self.buffer_of(stage), stmt)
        params = tuple(self.buffer_of(s) for s in self.args)
        func = PrimFunc(self.name, params, stmt)
        verify(func)
        return func


def lower(sch: Schedule, args, name: str = "main") -> PrimFunc:
    """The loop-IR function computing the schedule, taking ``args`` (tensors) as buffers."""
    return _Lowering(sch, list(args), name).run()

