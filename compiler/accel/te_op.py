"""A ``celosia.op`` compute on the accelerator: matching it to the GEMM intrinsic and the ALU.

``@celosia.op(target="accel")`` (celosia/op.py, docs/op.md) hands the tensor expressions its
function returned for one set of shapes here. ``match_gemm`` finds what the accelerator
can do with them and says exactly what it cannot:

- one stage is a matrix product: a ``te.sum`` over one reduction axis ``k`` of
  ``x[...].astype("int32") * y[...].astype("int32")`` with ``x`` and ``y`` int8 input
  tensors indexed by ``k`` and output axes (each once; other indices constants): the
  last output axis only ``x`` reads is the rows, the last only ``y`` reads the columns,
  every other output axis is a batch axis (``a[i, k] * b[k, j]``, ``a[k, i] * b[j, k]``,
  ``q[b, h, i, d] * k[b, h, j, d]``, ``x[b, i, k] * w[k, j]``);
- the element-wise stages after it (inlined into one expression of the output's axes)
  are an *in-place chain* on the product's element: each operation combines the running
  int32 value with a constant or an element of an input tensor read at indices affine in
  the output's axes (``bias[j]``, ``scale[i]``, ``residual[i, j]``, ``t[0]``). The
  operations are the ALU's: ``+``, ``-``, ``*``, ``minimum``, ``maximum``, ``>>`` (by a
  constant in [0, 31] or a tensor), ``<<`` (by a constant in [0, 31]);
- the output is that chain cast to int8 (the store of the accumulator's int8 view: the
  low byte, as ``astype("int8")`` wraps) or the int32 value itself.

``x - t`` with a tensor ``t`` adds ``-t`` (negated on the host); ``c - x`` is ``x * -1 +
c``; a constant that does not fit the ALU's 16-bit immediate becomes a one-row tensor; an
operand that is an integer expression of input elements and constants (``zp * wsum[j] +
bias[j]``) is computed on the host when the operands are packed (``_host_eval``, numpy with
the CPU backend's wrapping and floor division) and loaded like a tensor.

``build_gemm_op`` then writes the same computation on the accelerator's packed layouts
(the dense layouts of ops.py with a batch dimension first: data (G, M/b, K/k, b, k), weight
(G, N/k, K/k, k, k), G = 1 for a factor without batch axes; M padded to BATCH, K and N to
BLOCK with zeros) and schedules it like ``ops.dense`` inside a loop over the batch: tiles of
``tile_n`` x ``tile_o`` blocks, ``tile_k`` input blocks per load, optionally two virtual
threads, the product tensorized with the registered intrinsic (``get_intrinsic``), the
chain on the ALU per tile, the tensors it reads loaded into the accumulator per tile (an
int8 one sign-extended, ACC_8BIT). The tiling is the one ``tune_dense.estimate_dense``
ranks first among those whose buffers fit. An int32 result leaves the accelerator as its
four byte planes: per tile, the accumulators' int8 view is stored, shifted right by 8 on
the ALU, stored again, ... (``_store_planes`` rewrites the lowered store nest), so the
product is computed once.

``pack_inputs`` / ``unpack_output`` convert between the caller's arrays and those layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from celosia.config import ALU_IMM_BITS, HwConfig
from celosia.errors import CompilerError

from ..tensor import te
from ..tensor.expr import (Bin, Call, Cast, Const, Load, Reduce, Select, Var, collect, expr_str,
                           linear_form, substitute)
from ..tensor.expr import max_expr, min_expr
from ..tensor.schedule import create_schedule
from ..tensor.lower import lower
from ..tensor.tir import Attr, For, Store, seq, transform, walk
from .build import AcceleratorFunction, accelerator_pipeline
from .vthread import substitute_stmt
from .wide import join_bytes
from .intrin import get_intrinsic
from .ops import DenseKnobs, DenseSpec, Epilogue

__all__ = ["GemmMatch", "Operand", "Factor", "Step", "match_gemm", "choose_knobs", "ranked_knobs",
           "build_gemm_op",
           "pack_inputs", "unpack_output", "NotMappable"]

_IMM_LO, _IMM_HI = -(1 << (ALU_IMM_BITS - 1)), (1 << (ALU_IMM_BITS - 1)) - 1
_ALU = {"+": "ADD", "*": "MUL", "min": "MIN", "max": "MAX", ">>": "SHR"}
_COMMUTATIVE = ("+", "*", "min", "max")


class NotMappable(CompilerError):
    """The compute does not map onto the accelerator (the message says what and why)."""


@dataclass(frozen=True)
class Operand:
    """An input tensor the epilogue reads: argument ``arg`` at indices affine in the
    product's axes in canonical order (the leading axes, row, column): ``index`` holds per
    dimension of the tensor (coefficients per canonical axis, constant). ``deps``: whether
    it depends on (the leading axes, the row, the column); it is packed with those
    dimensions only. ``int8``: held as int8 (loaded sign-extended), else converted to int32;
    ``negate``: its negation is added (``x - t``); ``value``: a constant too wide for the
    ALU's immediate (``arg`` -1); ``expr``: an expression of input tensor elements and
    constants computed on the host when the operands are packed (``arg`` -2; ``leaves``:
    (load, Operand) of each tensor element it reads)."""

    arg: int
    index: tuple
    deps: tuple = (False, False, False)
    int8: bool = False
    negate: bool = False
    value: int | None = None
    expr: object = None
    leaves: tuple = ()

    @property
    def kind(self) -> str:
        """What it varies along within one matrix: "full", "row", "col" or "scalar"."""
        return {(True, True): "full", (True, False): "row", (False, True): "col",
                (False, False): "scalar"}[tuple(self.deps[1:])]


@dataclass(frozen=True)
class Factor:
    """A matrix operand of the product: argument ``arg``, each of its dimensions indexed by
    a canonical axis ("lead", position), ("row",), ("col",), the reduction ("k",) or a
    constant ("const", value)."""

    arg: int
    dims: tuple

    @property
    def batched(self) -> bool:
        return any(d[0] == "lead" for d in self.dims)


@dataclass(frozen=True)
class Step:
    """One ALU operation of the chain: ``op`` (ADD, MUL, MIN, MAX, SHR) with an immediate
    ``imm`` or an operand."""

    op: str
    imm: int | None = None
    operand: Operand | None = None


@dataclass
class GemmMatch:
    """What ``match_gemm`` found (module docstring)."""

    lead: tuple           # extents of the leading (batch) axes
    m: int
    k: int
    n: int
    a: Factor             # rows x k
    b: Factor             # columns x k
    out_order: tuple      # per output axis, its canonical position
    steps: list = field(default_factory=list)
    out_dtype: str = "int8"
    names: tuple = ()     # the arguments' names (for messages)

    @property
    def groups(self) -> int:
        return math.prod(self.lead)

    @property
    def fold(self) -> bool:
        """Whether the batch axes fold into the rows: the weight is the same for every
        batch, so one product of (batch x M) rows loads it once per tile, not per batch."""
        return bool(self.lead) and not self.b.batched

    @property
    def rows(self) -> int:
        """The rows of one product the accelerator computes."""
        return self.groups * self.m if self.fold else self.m

    @property
    def products(self) -> int:
        """How many products the accelerator computes (the batch, or 1 when folded)."""
        return 1 if self.fold else self.groups

    def packed_deps(self, o: Operand) -> tuple:
        """What an operand varies along in the products computed (batch, row, column)."""
        if self.fold:
            return (False, o.deps[0] or o.deps[1], o.deps[2])
        return o.deps

    @property
    def operands(self) -> list[Operand]:
        seen = []
        for s in self.steps:
            if s.operand is not None and s.operand not in seen:
                seen.append(s.operand)
        return seen

    def describe(self) -> str:
        chain = "".join(f", {s.op} {s.imm if s.operand is None else self._op_text(s.operand)}"
                        for s in self.steps)
        lead = f"{' x '.join(map(str, self.lead))} x " if self.lead else ""
        return (f"GEMM {lead}[{self.m}, {self.k}] x [{self.k}, {self.n}]{chain} -> "
                f"{self.out_dtype}")

    def _op_text(self, o: Operand) -> str:
        if o.expr is not None:
            return f"{'-' if o.negate else ''}({expr_str(o.expr)}) (computed when packed)"
        if o.arg < 0:
            return f"{o.value} (a constant row)"
        name = self.names[o.arg] if o.arg < len(self.names) else f"argument {o.arg}"
        where = [w for w, d in zip(("batch", "row", "col"), o.deps) if d]
        return f"{'-' if o.negate else ''}{name}[{', '.join(where) or '0'}]"


def _fail(where: str, what: str) -> None:
    raise NotMappable(f"{where}: {what}; it does not map onto the accelerator (use "
                      f"target=\"cpu\")")


# ---- matching ------------------------------------------------------------------------------


def _inline(e, where: str):
    """``e`` with every element-wise compute stage it reads replaced by its body (the
    reduction stages stay as loads)."""
    def load(node, indices):
        op = node.source.op
        if isinstance(op, te.ComputeOp) and not isinstance(op.body, Reduce):
            body = substitute(op.body, {a.var: i for a, i in zip(op.axes, indices)})
            return _inline(body, where)
        return Load(node.source, indices, node.dtype)
    return substitute(e, {}, load)


def _loads(e, pred) -> list:
    return collect(e, lambda n: isinstance(n, Load) and pred(n))


def match_gemm(holders: list, outs: list, cfg: HwConfig, where: str) -> GemmMatch:
    """Match the tensor expressions of one build (module docstring); NotMappable says what
    does not map."""
    if len(outs) != 1:
        _fail(where, f"it has {len(outs)} outputs; the accelerator build takes one")
    out = outs[0]
    for h in holders:
        if h.dtype == "float32":
            _fail(where, f"input {h.name} is float32; the accelerator computes on int8 "
                         f"tensors with int32 accumulators")
    if out.dtype not in ("int8", "int32"):
        _fail(where, f"the output {out.name} is {out.dtype}; the accelerator produces int8 "
                     f"(the accumulator's int8 view) or int32")
    if not isinstance(out.op, te.ComputeOp) or out.ndim < 2:
        _fail(where, f"the output {out.name} has shape {list(out.shape)}; the accelerator "
                     f"build takes a matrix product (of at least two dimensions) with an "
                     f"element-wise epilogue")
    axes = [a.var for a in out.op.axes]
    body = out.op.body
    if isinstance(body, Reduce):
        gemm, value = out, Load(out, tuple(axes), out.dtype)
    else:
        value = _inline(body, where)
        reductions = {ld.source for ld in _loads(value, lambda n: isinstance(
            n.source.op, te.ComputeOp))}
        if len(reductions) != 1:
            _fail(where, f"{out.name} = {expr_str(value)} "
                         + ("reads no reduction (te.sum): there is no matrix product"
                            if not reductions else
                            f"reads {len(reductions)} reductions ({', '.join(sorted(t.name for t in reductions))}); "
                            f"the accelerator runs one matrix product per build"))
        gemm = next(iter(reductions))
    if gemm.ndim != out.ndim:
        _fail(where, f"the output {out.name} has {out.ndim} dimensions and the product "
                     f"{gemm.name} {gemm.ndim}; the epilogue must be element-wise")
    m, canon = _match_product(gemm, holders, where)   # canon: product axis var -> position
    # the product's element in the epilogue: read at the output's own axes
    for ld in _loads(value, lambda n: n.source is gemm):
        if len(set(ld.indices)) != out.ndim or any(i not in axes for i in ld.indices):
            _fail(where, f"{expr_str(ld)} reads the product {gemm.name} at other indices than "
                         f"the output's ({', '.join(v.name for v in axes)}); the epilogue must "
                         f"be element-wise")
    g_axes = [a.var for a in gemm.op.axes]
    ld0 = _loads(value, lambda n: n.source is gemm)[0]
    # output axis var -> canonical position (through the product's axis it reads)
    out_canon = {ld0.indices[p]: canon[g] for p, g in enumerate(g_axes)}
    m.out_order = tuple(out_canon[v] for v in axes)
    final = value
    if out.dtype == "int8":
        if not (isinstance(value, Cast) and value.dtype == "int8"
                and value.value.dtype == "int32"):
            _fail(where, f"the int8 output {out.name} = {expr_str(value)} must be an int32 "
                         f"value cast to int8 (the store of the accumulator's low byte)")
        final = value.value
    m.out_dtype = out.dtype
    m.names = tuple(h.name for h in holders)
    extents = (*m.lead, m.m, m.n)
    m.steps = _chain(final, gemm, holders, out_canon, extents, where)
    return m


def _match_product(gemm, holders, where):
    op = gemm.op
    body = op.body
    if not isinstance(body, Reduce):
        _fail(where, f"{gemm.name} is not a reduction")
    if len(body.axes) != 1:
        _fail(where, f"the reduction {gemm.name} has {len(body.axes)} reduction axes; the "
                     f"GEMM intrinsic is a matrix product over one (write a convolution as a "
                     f"product of an im2col'd input, or use target \"cpu\")")
    if body.dtype != "int32":
        _fail(where, f"the reduction {gemm.name} sums {body.dtype}; the accelerator "
                     f"accumulates int8 products in int32")
    kv = body.axes[0].var
    src = body.source
    shape = "x[..].astype(\"int32\") * y[..].astype(\"int32\") with int8 inputs x, y"
    if not (isinstance(src, Bin) and src.op == "*"):
        _fail(where, f"{gemm.name} sums {expr_str(src)}, not a product {shape}")
    g_axes = [a.var for a in op.axes]
    extent = {a.var: a.extent for a in (*op.axes, *body.axes)}
    factors = []
    for f in (src.a, src.b):
        if not (isinstance(f, Cast) and f.dtype == "int32" and isinstance(f.value, Load)):
            _fail(where, f"{gemm.name}: the factor {expr_str(f)} is not an int8 input "
                         f"tensor element cast to int32 ({shape})")
        ld = f.value
        if ld.source not in holders:
            _fail(where, f"{gemm.name}: the factor {expr_str(f)} reads the computed tensor "
                         f"{ld.source.name}; the GEMM's operands must be input tensors")
        if ld.dtype != "int8":
            _fail(where, f"{gemm.name}: input {ld.source.name} is {ld.dtype}; the GEMM core "
                         f"multiplies int8 x int8 (quantize it to int8 first)")
        used = [i for i in ld.indices if isinstance(i, Var)]
        if any(not isinstance(i, (Var, Const)) for i in ld.indices) or kv not in used \
                or len(set(used)) != len(used) or any(v not in extent for v in used):
            _fail(where, f"{gemm.name}: {expr_str(ld)} must read an input at the reduction "
                         f"axis {kv.name} and output axes of {gemm.name} (each once; other "
                         f"indices constants)")
        for i, n in zip(ld.indices, ld.source.shape):
            hi = extent[i] - 1 if isinstance(i, Var) else int(i.value)
            if hi >= n or (isinstance(i, Const) and int(i.value) < 0):
                _fail(where, f"{gemm.name}: {expr_str(ld)} reads "
                             f"{i.name + ' up to ' if isinstance(i, Var) else 'index '}{hi}, "
                             f"outside {ld.source.name}'s dimension of {n}")
        factors.append(ld)
    fa, fb = factors
    va, vb = set(fa.indices) - {kv}, set(fb.indices) - {kv}
    own_a = [v for v in g_axes if v in va and v not in vb]
    own_b = [v for v in g_axes if v in vb and v not in va]
    if not own_a or not own_b:
        _fail(where, f"{gemm.name}: the factors {expr_str(fa)} and {expr_str(fb)} must each "
                     f"be indexed by an output axis the other does not read (the rows and "
                     f"the columns; the other axes are batch axes)")
    # the last such axis of each is its rows (columns); any others are batch axes
    ra, cb = own_a[-1], own_b[-1]
    # rows come from the factor whose own axis comes first in the product
    if g_axes.index(ra) > g_axes.index(cb):
        fa, fb, ra, cb = fb, fa, cb, ra
    lead = [v for v in g_axes if v not in (ra, cb)]
    canon = {v: p for p, v in enumerate(lead)}
    canon[ra], canon[cb] = len(lead), len(lead) + 1

    def dims(ld):
        out = []
        for i in ld.indices:
            if isinstance(i, Const):
                out.append(("const", int(i.value)))
            elif i is kv:
                out.append(("k",))
            elif i is ra:
                out.append(("row",))
            elif i is cb:
                out.append(("col",))
            else:
                out.append(("lead", canon[i]))
        return tuple(out)

    match = GemmMatch(lead=tuple(extent[v] for v in lead), m=extent[ra], k=extent[kv],
                      n=extent[cb], a=Factor(holders.index(fa.source), dims(fa)),
                      b=Factor(holders.index(fb.source), dims(fb)), out_order=())
    return match, canon


def _chain(e, gemm, holders, out_canon, extents, where) -> list[Step]:
    """The in-place ALU chain of the epilogue ``e`` (its variables: the output's axes,
    ``out_canon`` maps them to canonical positions of ``extents``)."""
    nlead = len(extents) - 2

    def has_acc(x) -> bool:
        return bool(_loads(x, lambda n: n.source is gemm))

    def operand(x, negate=False):
        """An immediate (int) or an Operand."""
        x0 = x
        if isinstance(x, Const):
            v = int(x.value)
            v = _wrap32(-v) if negate else v
            if _IMM_LO <= v <= _IMM_HI:
                return v
            return Operand(-1, (), value=v)
        int8 = False
        if isinstance(x, Cast) and x.dtype == "int32" and isinstance(x.value, Load) \
                and x.value.dtype in ("int8", "int16", "uint8", "bool"):
            int8 = x.value.dtype == "int8"
            x = x.value
        if not isinstance(x, Load) or x.dtype != "int32" and x is x0:
            return host_operand(x0, negate)
        return element(x, x0, int8, negate)

    def host_operand(x, negate):
        """An expression of input tensor elements and constants, computed on the host."""
        for n in collect(x, lambda n: True):
            if isinstance(n, (Reduce, Call)) or getattr(n, "dtype", "int32") == "float32":
                _fail(where, f"the epilogue operand {expr_str(x)} computes "
                             f"{expr_str(n)}; an operand computed on the host takes integer "
                             f"arithmetic of input tensor elements and constants")
        leaves = {}
        for ld in _loads(x, lambda n: True):
            if ld not in leaves:
                leaves[ld] = element(ld, x, False, False)
        if not leaves:  # constants only
            v = int(_host_eval(x, {}, [], None))
            return operand(Const(_wrap32(v), "int32"), negate)
        deps = tuple(any(o.deps[d] for o in leaves.values()) for d in range(3))
        return Operand(-2, (), deps, negate=negate, expr=x, leaves=tuple(leaves.items()))

    def element(x, x0, int8, negate):
        """The Operand of the input element ``x`` (a Load) in the operand ``x0``."""
        if x.source not in holders:
            _fail(where, f"the epilogue operand {expr_str(x0)} reads the computed tensor "
                         f"{x.source.name}")
        index = []
        dep = [False] * len(extents)
        for d, i in enumerate(x.indices):
            lf = linear_form(i)
            if lf is None or set(lf[0]) - set(out_canon):
                _fail(where, f"{expr_str(x0)}: index {expr_str(i)} is not affine in the "
                             f"output's axes")
            coef = [0] * len(extents)
            for v, c in lf[0].items():
                coef[out_canon[v]] += c
            lo = lf[1] + sum(min(0, c * (n - 1)) for c, n in zip(coef, extents))
            hi = lf[1] + sum(max(0, c * (n - 1)) for c, n in zip(coef, extents))
            if lo < 0 or hi >= x.source.shape[d]:
                _fail(where, f"{expr_str(x0)}: index {expr_str(i)} runs over [{lo}, {hi}], "
                             f"outside dimension {d} of {x.source.name} ({x.source.shape[d]})")
            dep = [a or bool(c) for a, c in zip(dep, coef)]
            index.append((tuple(coef), lf[1]))
        deps = (any(dep[:nlead]), dep[nlead], dep[nlead + 1])
        return Operand(holders.index(x.source), tuple(index), deps,
                       int8=int8 and all(deps[1:]) and not negate, negate=negate)

    def walk(x) -> list[Step]:
        if isinstance(x, Load) and x.source is gemm:
            return []
        if isinstance(x, Cast):
            _fail(where, f"the epilogue casts {expr_str(x.value)} to {x.dtype} in the middle of "
                         f"the computation; the ALU computes in int32 and only the final cast "
                         f"to int8 (the store) maps")
        if not isinstance(x, Bin):
            _fail(where, f"the epilogue computes {expr_str(x)}, which is no ALU operation (it "
                         f"has +, -, *, minimum, maximum, >>, <<; write a clip with "
                         f"minimum/maximum, not select)")
        if x.dtype != "int32":
            _fail(where, f"the epilogue computes {expr_str(x)} in {x.dtype}; the ALU "
                         f"computes in int32")
        if x.op not in ("+", "-", "*", "min", "max", ">>", "<<"):
            _fail(where, f"the epilogue computes {expr_str(x)}: the ALU has no {x.op} (it "
                         f"has +, -, *, minimum, maximum, >>, <<)")
        a_acc, b_acc = has_acc(x.a), has_acc(x.b)
        if a_acc and b_acc:
            _fail(where, f"both operands of {expr_str(x)} depend on the product; the ALU "
                         f"works in place, combining the running value with a constant or an "
                         f"input tensor element per operation")
        if not a_acc and not b_acc:  # cannot happen at the top: the product is read
            _fail(where, f"{expr_str(x)} does not involve the product")
        chain, other = (x.a, x.b) if a_acc else (x.b, x.a)
        steps = walk(chain)
        if x.op in _COMMUTATIVE:
            v = operand(other)
            return steps + [_step(_ALU[x.op], v)]
        if x.op == "-":
            if a_acc:                         # x - t: add -t
                return steps + [_step("ADD", operand(other, negate=True))]
            # t - x: x * -1 + t
            return steps + [Step("MUL", imm=-1), _step("ADD", operand(other))]
        # shifts
        if not a_acc:
            _fail(where, f"{expr_str(x)} shifts by the product; the ALU shifts the running "
                         f"value")
        if isinstance(other, Const):
            s = int(other.value)
            if not 0 <= s <= 31:
                _fail(where, f"{expr_str(x)}: a shift by {s} is outside [0, 31]")
            return steps + [Step("SHR", imm=s if x.op == ">>" else -s)]
        if x.op == "<<":
            _fail(where, f"{expr_str(x)}: the ALU shifts left by constants only")
        return steps + [_step("SHR", operand(other))]

    return walk(e)


def _step(op: str, v) -> Step:
    return Step(op, imm=v) if isinstance(v, int) else Step(op, operand=v)


def _wrap32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


# ---- building ------------------------------------------------------------------------------


def _ceil(n: int, k: int) -> int:
    return -(-n // k) * k


def padded(m: GemmMatch, cfg: HwConfig, kn: DenseKnobs | None = None) -> tuple[int, int, int]:
    """(rows, K, N) padded to BATCH, BLOCK, BLOCK and, with a tiling, to whole tiles (the
    tiles need not divide the product: the padding is computed and dropped)."""
    b, blk = cfg.batch, cfg.block
    nb, kb, ob = -(-m.rows // b), -(-m.k // blk), -(-m.n // blk)
    if kn is not None:
        nb, kb, ob = _ceil(nb, kn.tile_n), _ceil(kb, kn.tile_k), _ceil(ob, kn.tile_o * kn.vthreads)
    return nb * b, kb * blk, ob * blk


def _tile_sizes(n: int) -> list[int]:
    """Tile sizes tried for ``n`` blocks: its divisors, and the sizes splitting it into 1 to
    16 near-equal tiles (a prime number of rows, ViT's 197, still gets good tiles)."""
    from .tune import _divisors

    return sorted(set(_divisors(n)) | {-(-n // t) for t in range(1, min(n, 16) + 1)})


def _rows(m: GemmMatch, kn: DenseKnobs) -> dict:
    deps = [m.packed_deps(o) for o in m.operands]
    acc = kn.tile_n * kn.tile_o + sum((kn.tile_n if d[1] else 1) * (kn.tile_o if d[2] else 1)
                                      for d in deps)
    return {"inp": kn.vthreads * kn.tile_n * kn.tile_k, "wgt": kn.vthreads * kn.tile_o * kn.tile_k,
            "acc": kn.vthreads * acc, "uop": kn.tile_n * kn.tile_o * kn.tile_k + 2 * len(m.steps) + 2}


def choose_knobs(m: GemmMatch, cfg: HwConfig) -> DenseKnobs:
    """The tiling ``estimate_dense`` ranks first among those whose buffers fit."""
    return ranked_knobs(m, cfg)[0]


def ranked_knobs(m: GemmMatch, cfg: HwConfig) -> list[DenseKnobs]:
    """Every tiling whose buffers fit, best ``estimate_dense`` first."""
    from .tune import _buffer_limits
    from .tune_dense import estimate_dense

    mp, kp, np_ = padded(m, cfg)
    nb, kb, ob = mp // cfg.batch, kp // cfg.block, np_ // cfg.block
    limit = _buffer_limits(cfg)
    kinds = {m.packed_deps(o)[1:] for o in m.operands}
    epilogue = Epilogue(bias=bool(kinds - {(True, True)}), residual=(True, True) in kinds)
    ranked = []
    for tn in _tile_sizes(nb):
        for to in _tile_sizes(ob):
            for tk in _tile_sizes(kb):
                for vt in ((1, 2) if -(-ob // to) >= 2 else (1,)):
                    kn = DenseKnobs(tile_n=tn, tile_o=to, tile_k=tk, vthreads=vt)
                    r = _rows(m, kn)
                    if any(r[x] > limit[x] for x in r):
                        continue
                    spec = DenseSpec(*padded(m, cfg, kn), epilogue)
                    ranked.append((estimate_dense(cfg, spec, kn) * m.products, len(ranked),
                                   kn))
    if not ranked:
        raise NotMappable(f"{m.describe()}: not even one block of each operand and the "
                          f"epilogue's {len(m.operands)} tensors fit the buffers of this "
                          f"configuration (BATCH={cfg.batch}, BLOCK={cfg.block}); use a larger "
                          f"configuration or target=\"cpu\"")
    return [kn for _, _, kn in sorted(ranked)]


def _operand_shape(deps: tuple, g: int, nb: int, ob: int, cfg: HwConfig) -> tuple:
    """(groups if it depends on the batch axes) (row blocks) (column blocks) b, k; one
    row (1, b, k) when it depends on none."""
    lead = tuple(n for n, d in zip((g, nb, ob), deps) if d) or (1,)
    return (*lead, cfg.batch, cfg.block)


def build_gemm_op(m: GemmMatch, cfg: HwConfig, knobs: DenseKnobs | None = None,
                  name: str = "op", intrinsic: str = "gemm") -> AcceleratorFunction:
    """The accelerator function of a match; it takes (data, weight, *operands, out) in the
    packed layouts (``pack_inputs``, ``unpack_output``): data (Ga, nb, kb, b, k), weight
    (Gb, ob, kb, k, k) (Ga, Gb: the groups, or 1 for a factor without batch axes), out
    (G, nb, ob, b, k) int8, or (4, G, nb, ob, b, k), the int32 result's byte planes, least
    significant first."""
    knobs = knobs or choose_knobs(m, cfg)
    b, k = cfg.batch, cfg.block
    mp, kp, np_ = padded(m, cfg, knobs)
    nb, kb, ob = mp // b, kp // k, np_ // k
    kn = knobs
    g = m.products
    ga, gb_ = (g if m.a.batched and g > 1 else 1), (g if m.b.batched else 1)
    data = te.placeholder((ga, nb, kb, b, k), "int8", "data")
    weight = te.placeholder((gb_, ob, kb, k, k), "int8", "weight")
    ko, ki = te.reduce_axis(kb, "ko"), te.reduce_axis(k, "ki")
    gemm = te.compute((g, nb, ob, b, k), lambda q, i, j, bb, oo: te.sum(
        data[q if ga > 1 else 0, i, ko, bb, ki].astype("int32")
        * weight[q if gb_ > 1 else 0, j, ko, oo, ki].astype("int32"), axis=[ko, ki]), "gemm")
    extras = [te.placeholder(_operand_shape(m.packed_deps(o), g, nb, ob, cfg),
                             "int8" if o.int8 else "int32", f"operand{n}")
              for n, o in enumerate(m.operands)]
    slot = {o: t for o, t in zip(m.operands, extras)}
    steps = m.steps

    def at(q, i, j, bb, oo):
        x = gemm[q, i, j, bb, oo]
        for s in steps:
            if s.operand is None:
                v = s.imm
            else:
                t = slot[s.operand]
                idx = tuple(v for v, d in zip((q, i, j), m.packed_deps(s.operand)) if d) or (0,)
                v = t[(*idx, bb, oo)]
                if t.dtype == "int8":
                    v = v.astype("int32")
            if s.op == "ADD":
                x = x + v
            elif s.op == "MUL":
                x = x * v
            elif s.op == "MIN":
                x = min_expr(x, v)
            elif s.op == "MAX":
                x = max_expr(x, v)
            elif isinstance(v, int) and v < 0:
                x = x << -v
            else:
                x = x >> v
        return x

    epi = te.compute((g, nb, ob, b, k), at, "epilogue")
    wide = m.out_dtype == "int32"
    if wide:  # the byte planes: the store of plane p reads the value shifted by 8p
        out = te.compute((4, g, nb, ob, b, k), lambda p, q, i, j, bb, oo: epi[
            q, i, j, bb, oo].astype("int8"), "out")
    else:
        out = te.compute((g, nb, ob, b, k), lambda *i: epi[i].astype("int8"), "out")
    s = create_schedule(out)
    s[gemm].set_scope("acc")
    s[epi].set_scope("acc")
    p_, q_, i_, j_, b_, o_ = s[out].axes if wide else (None, *s[out].axes)
    io, ii = s[out].split(i_, kn.tile_n)
    jo, ji = s[out].split(j_, kn.tile_o)
    order = [q_, io, jo, ii, ji, b_, o_]
    if kn.vthreads > 1:
        t, rest = s[out].split(jo, jo.extent // kn.vthreads)
        s[out].bind_vthread(t, interleave="thread")
        order[2:3] = [t, rest]
    tile = order[-5]
    store_at = ii
    if wide:
        order.insert(order.index(ii), p_)
        store_at = p_
    s[out].reorder(*order)
    for stage in (gemm, epi):
        s[stage].compute_at(s[out], tile)
    s[out].pragma(store_at, "dma_copy")
    s[epi].pragma(s[epi].axes[0], "alu")
    gq, gi, gj, gb, go = s[gemm].axes
    gko, gki = s[gemm].reduce_axes
    k_o, k_i = s[gemm].split(gko, kn.tile_k)
    s[gemm].reorder(k_o, gq, gi, gj, k_i, gb, go, gki)
    s[gemm].tensorize(gb, get_intrinsic(intrinsic, cfg))
    s[gemm].init_in_reduce_loop()
    for t, scope in ((data, "inp"), (weight, "wgt")):
        cached = s.cache_read(t, scope, [gemm])
        s[cached].compute_at(s[gemm], k_o)
        s[cached].pragma(s[cached].axes[0], "dma_copy")
    for t in extras:
        cached = s.cache_read(t, "acc", [epi])
        s[cached].compute_at(s[out], tile)
        s[cached].pragma(s[cached].axes[0], "dma_copy")
    func = lower(s, [data, weight, *extras, out], name)
    if wide:
        func = func.with_body(transform(func.body, _store_planes))
    return AcceleratorFunction(accelerator_pipeline(func, cfg), cfg)


def _store_planes(st):
    """The int32 result's store nest ``for p in 4: out[p, ...] = int8(epilogue[...])``
    becomes four stores of the accumulator's int8 view, each but the last followed by an
    ALU nest shifting the accumulators right by 8 (in place): plane p is byte p."""
    if not (isinstance(st, Attr) and st.key == "pragma" and st.value == "dma_copy"
            and isinstance(st.body, For) and st.body.extent == 4):
        return None
    store = next((n for n in walk(st.body) if isinstance(n, Store)), None)
    if store is None or store.buffer.scope != "global" or len(store.buffer.shape) != 6:
        return None
    acc = store.value.value.source  # int8(epilogue[...])
    loop = st.body
    parts = []
    for p in range(4):
        if p:
            idx = tuple(Var(f"s{d}") for d in range(len(acc.shape)))
            nest = Store(acc, idx, Bin(">>", Load(acc, idx, "int32"), Const(8, "int32"),
                                       "int32"))
            for v, n in reversed(list(zip(idx, acc.shape))):
                nest = For(v, n, nest)
            parts.append(Attr("pragma", "alu", nest))
        parts.append(Attr("pragma", "dma_copy", substitute_stmt(loop.body, {loop.var: p}, {})))
    return seq(*parts)


# ---- packing -------------------------------------------------------------------------------


def _grid(extents: tuple, deps: tuple) -> list[np.ndarray]:
    """Per canonical axis, its index broadcast over the axes in ``deps`` (others: 0)."""
    shape = tuple(n if d else 1 for n, d in zip(extents, deps))
    out = []
    for a, (n, d) in enumerate(zip(extents, deps)):
        view = [1] * len(extents)
        view[a] = shape[a]
        out.append(np.arange(n if d else 1).reshape(view))
    return out


def _gather_factor(f: Factor, arr: np.ndarray, m: GemmMatch, own: str, size: int):
    """A factor as (groups or 1, size (its own axis), K) int8."""
    lead = len(m.lead)
    extents = (*m.lead, size, m.k)
    deps = tuple(f.batched for _ in m.lead) + (True, True)
    grid = _grid(extents, deps)
    idx = []
    for d in f.dims:
        if d[0] == "const":
            idx.append(np.array(d[1]).reshape((1,) * len(extents)))
        elif d[0] == "lead":
            idx.append(grid[d[1]])
        else:
            idx.append(grid[lead] if d[0] == own else grid[lead + 1])
    v = np.broadcast_to(arr[tuple(idx)], tuple(n if dd else 1 for n, dd in zip(extents, deps)))
    return np.asarray(v, np.int8).reshape(-1, size, m.k)


def _gather_raw(o: Operand, arr: np.ndarray, m: GemmMatch) -> np.ndarray:
    """An input element's values as (groups or 1, M or 1, N or 1), in its own dtype."""
    extents = (*m.lead, m.m, m.n)
    lead = len(m.lead)
    deps = tuple(o.deps[0] for _ in m.lead) + o.deps[1:]
    grid = _grid(extents, deps)
    idx = tuple(sum(c * grid[a] for a, c in enumerate(coef)) + c0 for coef, c0 in o.index)
    shape = tuple(n if d else 1 for n, d in zip(extents, deps))
    v = np.broadcast_to(arr[idx] if idx else arr.reshape(()), shape)
    return v.reshape(math.prod(shape[:lead]), shape[lead], shape[lead + 1])


def _gather_operand(o: Operand, arrays: list, m: GemmMatch) -> np.ndarray:
    """An operand's values as (groups or 1, M or 1, N or 1), int8 or int32."""
    if o.expr is not None:
        v = _host_eval(o.expr, dict(o.leaves), arrays, m)
    else:
        v = _gather_raw(o, np.asarray(arrays[o.arg]), m)
    v = v.astype(np.int8 if o.int8 else np.int32)
    if o.negate:
        v = np.negative(v)  # int32: wraps like the int32 subtraction it replaces
    return v


_NP = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
       "uint8": np.uint8, "bool": np.bool_}


def _host_eval(e, leaves: dict, arrays: list, m: GemmMatch | None) -> np.ndarray:
    """An integer expression of input elements (``leaves``: load -> Operand) and constants
    in numpy, with the CPU backend's semantics: results wrap to their dtype, ``//`` and
    ``%`` floor."""
    def ev(x):
        if isinstance(x, Const):
            return np.array(x.value, _NP[x.dtype])
        if isinstance(x, Load):
            o = leaves[x]
            return _gather_raw(o, np.asarray(arrays[o.arg]), m).astype(_NP[x.dtype])
        if isinstance(x, Cast):
            v = ev(x.value)
            return v != 0 if x.dtype == "bool" else v.astype(np.int64).astype(_NP[x.dtype])
        if isinstance(x, Select):
            return np.where(ev(x.cond), ev(x.t), ev(x.f)).astype(_NP[x.dtype])
        if isinstance(x, Bin):
            a, b = ev(x.a), ev(x.b)
            if x.op in ("&&", "||"):
                return np.logical_and(a, b) if x.op == "&&" else np.logical_or(a, b)
            a, b = a.astype(np.int64), b.astype(np.int64)
            with np.errstate(divide="ignore"):
                r = {"+": np.add, "-": np.subtract, "*": np.multiply, "min": np.minimum,
                     "max": np.maximum, ">>": np.right_shift, "<<": np.left_shift,
                     "//": np.floor_divide, "%": np.mod, "<": np.less, "<=": np.less_equal,
                     ">": np.greater, ">=": np.greater_equal, "==": np.equal,
                     "!=": np.not_equal}[x.op](a, b)
            return r if x.dtype == "bool" else r.astype(_NP[x.dtype])
        raise CompilerError(f"cannot compute {expr_str(x)} on the host")
    return np.asarray(ev(e))


def _pad_to(x: np.ndarray, shape: tuple) -> np.ndarray:
    if x.shape == shape:
        return x
    out = np.zeros(shape, x.dtype)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out


def pack_inputs(m: GemmMatch, arrays: list, cfg: HwConfig,
                kn: DenseKnobs) -> list[np.ndarray]:
    """The caller's arrays -> (data, weight, *operands) in the packed layouts of the build
    with tiling ``kn``."""
    b, k = cfg.batch, cfg.block
    mp, kp, np_ = padded(m, cfg, kn)
    a = _gather_factor(m.a, np.asarray(arrays[m.a.arg]), m, "row", m.m)     # (Ga, M, K)
    w = _gather_factor(m.b, np.asarray(arrays[m.b.arg]), m, "col", m.n)     # (Gb, N, K)
    if m.fold:  # every batch's rows in one product
        a = np.broadcast_to(a, (m.groups, m.m, m.k)).reshape(1, m.rows, m.k)
    a = _pad_to(a, (a.shape[0], mp, kp))
    w = _pad_to(w, (w.shape[0], np_, kp))
    data = a.reshape(-1, mp // b, b, kp // k, k).transpose(0, 1, 3, 2, 4)
    weight = w.reshape(-1, np_ // k, k, kp // k, k).transpose(0, 1, 3, 2, 4)
    out = [np.ascontiguousarray(data), np.ascontiguousarray(weight)]
    for o in m.operands:
        if o.arg == -1:
            out.append(np.full((1, b, k), o.value, np.int32))
            continue
        v = _gather_operand(o, arrays, m)                                 # (G|1, M|1, N|1)
        deps = m.packed_deps(o)
        if m.fold:
            v = np.broadcast_to(v, (m.groups, m.m, v.shape[2]) if deps[1] else v.shape)
            v = v.reshape(1, -1, v.shape[2])
        gq = v.shape[0]
        rows_p, cols_p = (mp if deps[1] else 1), (np_ if deps[2] else 1)
        v = _pad_to(v, (gq, rows_p, cols_p))
        # rows run over the b lanes of row blocks, columns over the k lanes of column blocks
        v = v.reshape(gq, -1, b if deps[1] else 1, cols_p // k if deps[2] else 1,
                      k if deps[2] else 1).transpose(0, 1, 3, 2, 4)
        v = np.broadcast_to(v, (*v.shape[:3], b, k))
        lead = tuple(n for n, d in zip(v.shape[:3], deps) if d) or (1,)
        out.append(v.reshape(*lead, b, k))
    return [np.require(x, requirements="CW") for x in out]  # C-contiguous, writable


def unpack_output(m: GemmMatch, packed: np.ndarray, cfg: HwConfig,
                  kn: DenseKnobs) -> np.ndarray:
    """The packed output (G, nb, ob, b, k) int8, or the four byte planes of an int32 one,
    least significant first -> the op's output in its own axis order."""
    mp, _, np_ = padded(m, cfg, kn)

    def plain(p):  # (G, nb, ob, b, k) -> (lead..., M, N)
        x = p.transpose(0, 1, 3, 2, 4).reshape(-1, mp, np_)[:, :m.rows, :m.n]
        return x.reshape(*m.lead, m.m, m.n)
    if m.out_dtype == "int8":
        res = plain(packed)
    else:
        res = join_bytes([plain(p) for p in packed])
    # canonical (lead..., row, col) -> the output's axis order
    return np.ascontiguousarray(res.transpose(m.out_order))
