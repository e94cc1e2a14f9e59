"""Schedules: how a tensor expression is computed (loop order, tiling, placement, memory).

    s = create_schedule([C])
    io, ii = s[C].split(s[C].axes[0], 16)
    s[C].reorder(io, ...)
    AL = s.cache_read(A, "inp", [C]);  s[AL].compute_at(s[C], ko)
    s[C].tensorize(ii, gemm_intrinsic(cfg))

Every primitive checks its arguments (axis belongs to the stage, factor divides the extent,
scope exists) and raises CompilerError saying what to change. Stages refer to the tensor
they write; a consumer's reads are redirected when a cache stage is inserted, so ops stay
immutable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from celosia.errors import CompilerError

from .expr import Load, Var, substitute
from .te import ComputeOp, IterVar, PlaceholderOp, Tensor, inputs_of, topo_order

__all__ = ["Schedule", "Stage", "Split", "Fuse", "create_schedule", "SCOPES"]

# Memory scopes: DRAM, the accelerator's on-chip buffers, and "local" (a CPU temporary on
# the stack or in registers, for a stage computed at a loop of another).
SCOPES = ("global", "inp", "wgt", "acc", "local")


@dataclass(frozen=True)
class Split:
    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: int


@dataclass(frozen=True)
class Fuse:
    outer: IterVar
    inner: IterVar
    fused: IterVar


@dataclass(eq=False)
class Stage:
    """The schedule of one operation: its loops (leaves), their relations to the op's axes,
    where it is computed, and its memory scope."""

    tensor: Tensor
    op: object
    scope: str = "global"
    leaves: list = field(default_factory=list)
    relations: list = field(default_factory=list)
    attach: tuple | None = None  # (stage, itervar) when computed at another stage's loop
    inline: bool = False
    pragmas: dict = field(default_factory=dict)  # IterVar -> list of pragma names
    tensorize_at: tuple | None = None  # (IterVar, intrinsic)
    vthreads: set = field(default_factory=set)  # IterVars bound to virtual threads
    vthread_interleave: dict = field(default_factory=dict)  # IterVar -> "statement" | "thread"
    init_inside: bool = False  # the reduction's initialisation in its outermost reduce loop
    loop_kinds: dict = field(default_factory=dict)  # IterVar -> parallel | vectorize | unroll
    read_map: dict = field(default_factory=dict)  # Tensor read -> Tensor to read instead

    def __post_init__(self):
        if not self.leaves and isinstance(self.op, ComputeOp):
            self.leaves = list(self.op.axes) + list(self.op.reduce_axes)

    # ---- queries -------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.tensor.name

    @property
    def axes(self) -> tuple:
        """The op's data axes (before any split)."""
        return self.op.axes

    @property
    def reduce_axes(self) -> tuple:
        return self.op.reduce_axes

    @property
    def is_placeholder(self) -> bool:
        return isinstance(self.op, PlaceholderOp)

    def __repr__(self) -> str:
        return f"Stage({self.name}, scope={self.scope})"

    def _leaf(self, iv, what: str) -> int:
        if iv not in self.leaves:
            names = ", ".join(l.name for l in self.leaves)
            raise CompilerError(f"{what}: {getattr(iv, 'name', iv)!r} is not a loop of stage "
                                f"{self.name} (its loops are {names})")
        return self.leaves.index(iv)

    def _compute_only(self, what: str):
        if self.is_placeholder:
            raise CompilerError(f"{what}: {self.name} is an input; it has no loops to schedule")

    # ---- loop transformations ------------------------------------------------------

    def split(self, iv: IterVar, factor: int) -> tuple[IterVar, IterVar]:
        """Split a loop into an outer loop and an inner loop of ``factor`` iterations."""
        self._compute_only("split")
        pos = self._leaf(iv, "split")
        if isinstance(factor, bool) or not isinstance(factor, int) or factor <= 0:
            raise CompilerError(f"split {self.name}.{iv.name}: factor must be a positive integer, "
                                f"not {factor!r}")
        if iv.extent % factor:
            divisors = [d for d in range(1, iv.extent + 1) if iv.extent % d == 0]
            raise CompilerError(f"split {self.name}.{iv.name}: factor {factor} does not divide "
                                f"the extent {iv.extent}; use one of {divisors}")
        outer = IterVar(Var(f"{iv.name}.outer"), iv.extent // factor, iv.kind)
        inner = IterVar(Var(f"{iv.name}.inner"), factor, iv.kind)
        self.relations.append(Split(iv, outer, inner, factor))
        self.leaves[pos:pos + 1] = [outer, inner]
        return outer, inner

    def fuse(self, outer: IterVar, inner: IterVar) -> IterVar:
        """Fuse two adjacent loops (outer directly enclosing inner) into one."""
        self._compute_only("fuse")
        po, pi = self._leaf(outer, "fuse"), self._leaf(inner, "fuse")
        if pi != po + 1:
            raise CompilerError(f"fuse {self.name}: {outer.name} must directly enclose "
                                f"{inner.name}; reorder them first")
        if outer.kind != inner.kind:
            raise CompilerError(f"fuse {self.name}: cannot fuse a data loop with a reduce loop")
        fused = IterVar(Var(f"{outer.name}.{inner.name}.fused"), outer.extent * inner.extent,
                        outer.kind)
        self.relations.append(Fuse(outer, inner, fused))
        self.leaves[po:pi + 1] = [fused]
        return fused

    def reorder(self, *ivs: IterVar) -> None:
        """Put the given loops in this order, in the positions they occupy together."""
        self._compute_only("reorder")
        positions = sorted(self._leaf(iv, "reorder") for iv in ivs)
        if len(set(ivs)) != len(ivs):
            raise CompilerError(f"reorder {self.name}: a loop is named twice")
        for pos, iv in zip(positions, ivs):
            self.leaves[pos] = iv

    def tile(self, x: IterVar, y: IterVar, x_factor: int, y_factor: int):
        """Split x and y and order the loops (x.outer, y.outer, x.inner, y.inner)."""
        xo, xi = self.split(x, x_factor)
        yo, yi = self.split(y, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    # ---- placement and annotations -------------------------------------------------

    def compute_at(self, parent: "Stage", iv: IterVar) -> None:
        """Compute this stage inside ``parent``'s loop ``iv``, only the region it needs."""
        self._compute_only("compute_at")
        parent._leaf(iv, f"compute_at {self.name}")
        self.attach = (parent, iv)
        self.inline = False

    def compute_inline(self) -> None:
        self._compute_only("compute_inline")
        if self.op.reduce_axes:
            raise CompilerError(f"compute_inline: {self.name} is a reduction and cannot be inlined")
        self.inline = True
        self.attach = None

    def set_scope(self, scope: str) -> None:
        if scope not in SCOPES:
            raise CompilerError(f"set_scope {self.name}: unknown scope {scope!r}; scopes are "
                                f"{', '.join(SCOPES)}")
        self._compute_only("set_scope")
        self.scope = scope

    def pragma(self, iv: IterVar, name: str) -> None:
        """Annotate a loop: "dma_copy" (the nest is a DMA transfer), "alu" (the nest runs on
        the accelerator's ALU)."""
        self._leaf(iv, f"pragma {name}")
        if name not in ("dma_copy", "alu"):
            raise CompilerError(f"pragma {self.name}.{iv.name}: unknown pragma {name!r}; "
                                f"pragmas are dma_copy, alu")
        self.pragmas.setdefault(iv, []).append(name)

    def tensorize(self, iv: IterVar, intrinsic) -> None:
        """Replace the loop nest from ``iv`` inwards by a hardware intrinsic (checked when
        the schedule is lowered)."""
        self._leaf(iv, "tensorize")
        self.tensorize_at = (iv, intrinsic)

    def bind_vthread(self, iv: IterVar, interleave: str = "statement") -> None:
        """Run the iterations of ``iv`` as virtual threads: each gets its own copy of the
        on-chip buffers allocated inside it, and their instructions are interleaved so that one
        thread's transfers overlap another's compute. ``interleave``: "statement" (each
        statement followed by its copies for the other threads) or "thread" (consecutive
        statements of one module kept together per thread; compiler/vthread.py)."""
        self._leaf(iv, "bind_vthread")
        if iv.kind != "data":
            raise CompilerError(f"bind_vthread {self.name}.{iv.name}: only data loops can be "
                                f"virtual threads")
        if interleave not in ("statement", "thread"):
            raise CompilerError(f"bind_vthread {self.name}.{iv.name}: interleave must be "
                                f"'statement' or 'thread', not {interleave!r}")
        self.vthreads.add(iv)
        self.vthread_interleave[iv] = interleave

    def init_in_reduce_loop(self) -> None:
        """Put the reduction's initialisation inside its outermost reduce loop, run on that
        loop's first iteration (``if r == 0``) right before the update, instead of before the
        loop. With virtual threads this keeps each thread's reset next to its own first
        update (a thread's reset then waits only for its own previous store)."""
        self._compute_only("init_in_reduce_loop")
        if not self.op.reduce_axes:
            raise CompilerError(f"init_in_reduce_loop {self.name}: the stage is not a reduction")
        self.init_inside = True

    def parallel(self, iv: IterVar) -> None:
        """CPU: run the iterations of ``iv`` on all cores (the outermost such loop of a
        top-level nest is split among threads; one nested in another loop runs serially)."""
        self._loop_kind(iv, "parallel")

    def vectorize(self, iv: IterVar) -> None:
        """CPU: compute the iterations of ``iv`` (an innermost data loop) as vector lanes."""
        self._loop_kind(iv, "vectorize")

    def unroll(self, iv: IterVar) -> None:
        """CPU: repeat the body of ``iv`` once per iteration, with the index a constant."""
        self._loop_kind(iv, "unroll")

    def _loop_kind(self, iv: IterVar, kind: str) -> None:
        self._compute_only(kind)
        self._leaf(iv, kind)
        if kind in ("parallel", "vectorize") and iv.kind != "data":
            raise CompilerError(f"{kind} {self.name}.{iv.name}: {iv.name} is a reduction loop; "
                                f"only data loops can be run in parallel or vectorised")
        self.loop_kinds[iv] = kind


class Schedule:
    def __init__(self, outputs):
        self.outputs = list(outputs)
        self.stages: list[Stage] = []
        self._by_tensor: dict = {}
        tensors = {t.op: t for t in self._all_tensors()}
        for op in topo_order(self.outputs):
            self._add(Stage(tensors[op], op))

    def _all_tensors(self):
        seen = list(self.outputs)
        for op in topo_order(self.outputs):
            for t in inputs_of(op):
                if t not in seen:
                    seen.append(t)
        return seen

    def _add(self, stage: Stage, before: Stage | None = None) -> Stage:
        if before is None:
            self.stages.append(stage)
        else:
            self.stages.insert(self.stages.index(before), stage)
        self._by_tensor[stage.tensor] = stage
        return stage

    def __getitem__(self, tensor: Tensor) -> Stage:
        try:
            return self._by_tensor[tensor]
        except KeyError:
            raise CompilerError(f"{getattr(tensor, 'name', tensor)!r} is not a tensor of this "
                                f"schedule") from None

    def consumers(self, tensor: Tensor) -> list[Stage]:
        out = []
        for stage in self.stages:
            if not stage.is_placeholder and any(
                    stage.read_map.get(t, t) is tensor for t in inputs_of(stage.op)):
                out.append(stage)
        return out

    def cache_read(self, tensor: Tensor, scope: str, readers) -> Tensor:
        """A copy of ``tensor`` in ``scope`` that ``readers`` read instead of it."""
        if scope not in SCOPES:
            raise CompilerError(f"cache_read {tensor.name}: unknown scope {scope!r}")
        readers = [r if isinstance(r, Stage) else self[r] for r in readers]
        for r in readers:
            if r not in self.consumers(tensor):
                raise CompilerError(f"cache_read {tensor.name}: {r.name} does not read it")
        axes = tuple(IterVar(Var(f"ax{d}"), n) for d, n in enumerate(tensor.shape))
        op = ComputeOp(f"{tensor.name}.{scope}", axes, tensor[tuple(a.var for a in axes)],
                       tensor.dtype)
        cache = Tensor(op)
        stage = self._add(Stage(cache, op, scope=scope), before=min(readers, key=self.stages.index))
        for r in readers:
            for t in list(inputs_of(r.op)):
                if r.read_map.get(t, t) is tensor:
                    r.read_map[t] = cache
        return stage.tensor

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Compute ``tensor`` in ``scope``; the original stage becomes a copy out of it."""
        stage = self[tensor]
        stage._compute_only("cache_write")
        if scope not in SCOPES:
            raise CompilerError(f"cache_write {tensor.name}: unknown scope {scope!r}")
        old = stage.op
        axes = tuple(IterVar(Var(a.name), a.extent) for a in old.axes)
        body = substitute(old.body, {a.var: b.var for a, b in zip(old.axes, axes)})
        local_op = ComputeOp(f"{tensor.name}.{scope}", axes, body, old.dtype, old.tag)
        local = Tensor(local_op)
        new_stage = self._add(Stage(local, local_op, scope=scope, read_map=dict(stage.read_map)),
                              before=stage)
        copy_axes = tuple(IterVar(Var(a.name), a.extent) for a in old.axes)
        stage.op = ComputeOp(old.name, copy_axes, local[tuple(a.var for a in copy_axes)], old.dtype)
        stage.leaves = list(copy_axes)
        stage.relations, stage.read_map = [], {}
        return new_stage.tensor

    def read_target(self, stage: Stage, load: Load) -> Tensor:
        """The tensor a load in ``stage`` really reads (after cache_read redirections)."""
        return stage.read_map.get(load.source, load.source)


def create_schedule(outputs) -> Schedule:
    if isinstance(outputs, Tensor):
        outputs = [outputs]
    return Schedule(outputs)
