"""A ``celosia.op`` compute on the accelerator: matching it to the GEMM intrinsic and the ALU.

``@celosia.op(target="accel")`` (celosia/op.py, docs/op.md) hands the tensor expressions its
function returned for one set of shapes here. ``match_gemm`` finds what the accelerator
can do with them and says exactly what it cannot:

- one stage is a matrix product: a ``te.sum`` over one reduction axis ``k`` of
  ``x[., .].astype("int32") * y[., .].astype("int32")`` with ``x`` and ``y`` int8 input
  tensors of two dimensions, one indexed by ``k`` and an output axis (``a[i, k]`` or
  ``a[k, i]``), the other by ``k`` and the other output axis (``b[k, j]`` or ``b[j, k]``);
- the element-wise stages after it (inlined into one expression of the output's axes)
  are an *in-place chain* on the product's element: each operation combines the running
  int32 value with a constant or an element of an input tensor read at indices affine in
  the output's axes (``bias[j]``, ``scale[i]``, ``residual[i, j]``, ``t[0]``). The
  operations are the ALU's: ``+``, ``-``, ``*``, ``minimum``, ``maximum``, ``>>`` (by a
  constant in [0, 31] or a tensor), ``<<`` (by a constant in [0, 31]);
- the output is that chain cast to int8 (the store of the accumulator's int8 view: the
  low byte, as ``astype("int8")`` wraps) or the int32 value itself.

``x - t`` with a tensor ``t`` adds ``-t`` (negated on the host); ``c - x`` is ``x * -1 +
c``; a constant that does not fit the ALU's 16-bit immediate becomes a one-row tensor.

``build_gemm_op`` then writes the same computation on the accelerator's packed layouts
(the dense layouts of ops.py: data (M/b, K/k, b, k), weight (N/k, K/k, k, k); M padded to
BATCH, K and N to BLOCK with zeros) and schedules it like ``ops.dense``: output tiles of
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

from dataclasses import dataclass, field

import numpy as np

from celosia.config import ALU_IMM_BITS, HwConfig
from celosia.errors import CompilerError

from ..tensor import te
from ..tensor.expr import Bin, Cast, Const, Load, Reduce, Var, expr_str, linear_form, substitute
from ..tensor.expr import max_expr, min_expr
from ..tensor.schedule import create_schedule
from ..tensor.lower import lower
from ..tensor.tir import Attr, For, Store, seq, transform, walk
from .build import AcceleratorFunction, accelerator_pipeline
from .vthread import substitute_stmt
from .intrin import get_intrinsic
from .ops import DenseKnobs, DenseSpec, Epilogue

__all__ = ["GemmMatch", "Operand", "Step", "match_gemm", "choose_knobs", "build_gemm_op",
           "pack_inputs", "unpack_output", "NotMappable"]

_IMM_LO, _IMM_HI = -(1 << (ALU_IMM_BITS - 1)), (1 << (ALU_IMM_BITS - 1)) - 1
_ALU = {"+": "ADD", "*": "MUL", "min": "MIN", "max": "MAX", ">>": "SHR"}
_COMMUTATIVE = ("+", "*", "min", "max")


class NotMappable(CompilerError):
    """The compute does not map onto the accelerator (the message says what and why)."""


@dataclass(frozen=True)
class Operand:
    """An input tensor the epilogue reads: argument ``arg`` at indices affine in the
    output's (row, column) (``index``: per dimension, (row coefficient, column coefficient,
    constant)); ``kind``: which of row/column it depends on ("full", "row", "col",
    "scalar"); ``int8``: held as int8 (loaded sign-extended), else converted to int32;
    ``negate``: its negation is added (``x - t``)."""

    arg: int
    index: tuple
    kind: str
    int8: bool = False
    negate: bool = False
    value: int | None = None  # a constant too wide for the immediate (arg = -1)


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

    m: int
    k: int
    n: int
    a_arg: int            # the argument giving rows (indexed by i and k)
    a_rows_first: bool    # a[i, k] (else a[k, i])
    b_arg: int            # the argument giving columns
    b_k_first: bool       # b[k, j] (else b[j, k])
    out_rows_first: bool  # output[i, j] (else output[j, i])
    steps: list = field(default_factory=list)
    out_dtype: str = "int8"
    names: tuple = ()     # the arguments' names (for messages)

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
        return (f"GEMM [{self.m}, {self.k}] x [{self.k}, {self.n}]{chain} -> {self.out_dtype}")

    def _op_text(self, o: Operand) -> str:
        if o.arg < 0:
            return f"{o.value} (a constant row)"
        name = self.names[o.arg] if o.arg < len(self.names) else f"argument {o.arg}"
        where = {"full": "[row, col]", "row": "[row]", "col": "[col]", "scalar": "[0]"}[o.kind]
        return f"{'-' if o.negate else ''}{name}{where}"


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
    from ..tensor.expr import collect
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
    if not isinstance(out.op, te.ComputeOp) or out.ndim != 2:
        _fail(where, f"the output {out.name} has shape {list(out.shape)}; the accelerator "
                     f"build takes a 2-D matrix product (with an element-wise epilogue)")
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
    rows_var, cols_var, m = _match_product(gemm, holders, where)
    # the product's element in the epilogue: read at the output's own axes
    for ld in _loads(value, lambda n: n.source is gemm):
        if len(set(ld.indices)) != 2 or any(i not in axes for i in ld.indices):
            _fail(where, f"{expr_str(ld)} reads the product {gemm.name} at other indices than "
                         f"the output's ({', '.join(v.name for v in axes)}); the epilogue must "
                         f"be element-wise")
    g_axes = [a.var for a in gemm.op.axes]
    ld0 = _loads(value, lambda n: n.source is gemm)[0]
    # output axis -> role: the output axis that reads the product's row axis is the row
    out_row = ld0.indices[g_axes.index(rows_var)]
    m.out_rows_first = out_row is axes[0]
    row_v, col_v = (axes[0], axes[1]) if m.out_rows_first else (axes[1], axes[0])
    final = value
    if out.dtype == "int8":
        if not (isinstance(value, Cast) and value.dtype == "int8"
                and value.value.dtype == "int32"):
            _fail(where, f"the int8 output {out.name} = {expr_str(value)} must be an int32 "
                         f"value cast to int8 (the store of the accumulator's low byte)")
        final = value.value
    m.out_dtype = out.dtype
    m.names = tuple(h.name for h in holders)
    m.steps = _chain(final, gemm, holders, row_v, col_v, (m.m, m.n), where)
    return m


def _match_product(gemm, holders, where):
    op = gemm.op
    body = op.body
    if not isinstance(body, Reduce):
        _fail(where, f"{gemm.name} is not a reduction")
    if len(op.axes) != 2 or len(body.axes) != 1:
        _fail(where, f"the reduction {gemm.name} has {len(op.axes)} output axes and "
                     f"{len(body.axes)} reduction axes; the GEMM intrinsic is a matrix "
                     f"product: two output axes, one reduction axis")
    if body.dtype != "int32":
        _fail(where, f"the reduction {gemm.name} sums {body.dtype}; the accelerator "
                     f"accumulates int8 products in int32")
    kv = body.axes[0].var
    src = body.source
    shape = "x[., .].astype(\"int32\") * y[., .].astype(\"int32\") with int8 inputs x, y"
    if not (isinstance(src, Bin) and src.op == "*"):
        _fail(where, f"{gemm.name} sums {expr_str(src)}, not a product {shape}")
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
        if ld.source.ndim != 2 or not all(isinstance(i, Var) for i in ld.indices) \
                or kv not in ld.indices or len(set(ld.indices)) != 2:
            _fail(where, f"{gemm.name}: {expr_str(ld)} must read a 2-D input at the reduction "
                         f"axis {kv.name} and one output axis (a[i, {kv.name}] or "
                         f"a[{kv.name}, i])")
        factors.append(ld)
    extent = {a.var: a.extent for a in (*op.axes, *body.axes)}
    for ld in factors:
        for i, n in zip(ld.indices, ld.source.shape):
            ext = extent.get(i)
            if ext is not None and ext > n:
                _fail(where, f"{gemm.name}: {expr_str(ld)} reads {i.name} up to {ext - 1}, "
                             f"outside {ld.source.name}'s dimension of {n}")
    g_axes = [a.var for a in op.axes]
    (fa, fb) = factors
    ia = next(i for i in fa.indices if i is not kv)
    ib = next(i for i in fb.indices if i is not kv)
    if ia is ib or ia not in g_axes or ib not in g_axes:
        _fail(where, f"{gemm.name}: the factors {expr_str(fa)} and {expr_str(fb)} must each "
                     f"be indexed by a different output axis of {gemm.name}")
    # rows come from the factor indexed by the product's first axis
    if ia is not g_axes[0]:
        fa, fb, ia, ib = fb, fa, ib, ia
    k_extent = body.axes[0].extent
    m_rows, n_cols = op.axes[0].extent, op.axes[1].extent
    match = GemmMatch(m=m_rows, k=k_extent, n=n_cols,
                      a_arg=holders.index(fa.source), a_rows_first=fa.indices[0] is ia,
                      b_arg=holders.index(fb.source), b_k_first=fb.indices[0] is kv,
                      out_rows_first=True)
    return ia, ib, match


def _chain(e, gemm, holders, row_v, col_v, shape, where) -> list[Step]:
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
            return Operand(-1, (), "scalar", value=v)
        int8 = False
        if isinstance(x, Cast) and x.dtype == "int32" and isinstance(x.value, Load) \
                and x.value.dtype in ("int8", "int16", "uint8", "bool"):
            int8 = x.value.dtype == "int8"
            x = x.value
        if not isinstance(x, Load) or x.dtype not in ("int32", "int8", "int16", "uint8",
                                                      "bool"):
            _fail(where, f"the epilogue operand {expr_str(x0)} is neither a constant nor an "
                         f"input tensor element (cast to int32); the ALU combines the running "
                         f"value with one of those per operation")
        if x.source not in holders:
            _fail(where, f"the epilogue operand {expr_str(x0)} reads the computed tensor "
                         f"{x.source.name}")
        index = []
        deps = set()
        for d, i in enumerate(x.indices):
            lf = linear_form(i)
            if lf is None or set(lf[0]) - {row_v, col_v}:
                _fail(where, f"{expr_str(x0)}: index {expr_str(i)} is not affine in the "
                             f"output's axes")
            cr, cc = lf[0].get(row_v, 0), lf[0].get(col_v, 0)
            lo = lf[1] + min(0, cr * (shape[0] - 1)) + min(0, cc * (shape[1] - 1))
            hi = lf[1] + max(0, cr * (shape[0] - 1)) + max(0, cc * (shape[1] - 1))
            if lo < 0 or hi >= x.source.shape[d]:
                _fail(where, f"{expr_str(x0)}: index {expr_str(i)} runs over [{lo}, {hi}], "
                             f"outside dimension {d} of {x.source.name} ({x.source.shape[d]})")
            deps |= {v for v, c in ((row_v, cr), (col_v, cc)) if c}
            index.append((cr, cc, lf[1]))
        kind = {frozenset(): "scalar", frozenset([row_v]): "row", frozenset([col_v]): "col",
                frozenset([row_v, col_v]): "full"}[frozenset(deps)]
        return Operand(holders.index(x.source), tuple(index), kind,
                       int8=int8 and kind == "full" and not negate, negate=negate)

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


def padded(m: GemmMatch, cfg: HwConfig) -> tuple[int, int, int]:
    return _ceil(m.m, cfg.batch), _ceil(m.k, cfg.block), _ceil(m.n, cfg.block)


def _rows(m: GemmMatch, kn: DenseKnobs) -> dict:
    per = {"full": kn.tile_n * kn.tile_o, "col": kn.tile_o, "row": kn.tile_n, "scalar": 1}
    acc = kn.tile_n * kn.tile_o + sum(per[o.kind] for o in m.operands)
    return {"inp": kn.vthreads * kn.tile_n * kn.tile_k, "wgt": kn.vthreads * kn.tile_o * kn.tile_k,
            "acc": kn.vthreads * acc, "uop": kn.tile_n * kn.tile_o * kn.tile_k + 2 * len(m.steps) + 2}


def choose_knobs(m: GemmMatch, cfg: HwConfig) -> DenseKnobs:
    """The tiling ``estimate_dense`` ranks first among those whose buffers fit."""
    from .tune import _buffer_limits, _divisors
    from .tune_dense import estimate_dense

    mp, kp, np_ = padded(m, cfg)
    nb, kb, ob = mp // cfg.batch, kp // cfg.block, np_ // cfg.block
    limit = _buffer_limits(cfg)
    kinds = {o.kind for o in m.operands}
    proxy = DenseSpec(mp, kp, np_, Epilogue(bias="col" in kinds or "row" in kinds,
                                            residual="full" in kinds))
    best = None
    for tn in _divisors(nb):
        for to in _divisors(ob):
            for tk in _divisors(kb):
                for vt in ((1, 2) if (ob // to) % 2 == 0 else (1,)):
                    kn = DenseKnobs(tile_n=tn, tile_o=to, tile_k=tk, vthreads=vt)
                    r = _rows(m, kn)
                    if any(r[x] > limit[x] for x in r):
                        continue
                    cost = estimate_dense(cfg, proxy, kn)
                    if best is None or cost < best[0]:
                        best = (cost, kn)
    if best is None:
        raise NotMappable(f"{m.describe()}: not even one block of each operand and the "
                          f"epilogue's {len(m.operands)} tensors fit the buffers of this "
                          f"configuration (BATCH={cfg.batch}, BLOCK={cfg.block}); use a larger "
                          f"configuration or target=\"cpu\"")
    return best[1]


def _operand_shape(o: Operand, nb: int, ob: int, cfg: HwConfig) -> tuple:
    b, k = cfg.batch, cfg.block
    return {"full": (nb, ob, b, k), "col": (ob, b, k), "row": (nb, b, k),
            "scalar": (1, b, k)}[o.kind]


def build_gemm_op(m: GemmMatch, cfg: HwConfig, knobs: DenseKnobs | None = None,
                  name: str = "op", intrinsic: str = "gemm") -> AcceleratorFunction:
    """The accelerator function of a match; it takes (data, weight, *operands, out) in the
    packed layouts (``pack_inputs``, ``unpack_output``): out is (nb, ob, b, k) int8, or
    (4, nb, ob, b, k), the int32 result's byte planes, least significant first."""
    knobs = knobs or choose_knobs(m, cfg)
    b, k = cfg.batch, cfg.block
    mp, kp, np_ = padded(m, cfg)
    nb, kb, ob = mp // b, kp // k, np_ // k
    kn = knobs
    data = te.placeholder((nb, kb, b, k), "int8", "data")
    weight = te.placeholder((ob, kb, k, k), "int8", "weight")
    ko, ki = te.reduce_axis(kb, "ko"), te.reduce_axis(k, "ki")
    gemm = te.compute((nb, ob, b, k), lambda i, j, bb, oo: te.sum(
        data[i, ko, bb, ki].astype("int32") * weight[j, ko, oo, ki].astype("int32"),
        axis=[ko, ki]), "gemm")
    extras = [te.placeholder(_operand_shape(o, nb, ob, cfg), "int8" if o.int8 else "int32",
                             f"operand{n}") for n, o in enumerate(m.operands)]
    slot = {o: t for o, t in zip(m.operands, extras)}
    steps = m.steps

    def at(i, j, bb, oo):
        x = gemm[i, j, bb, oo]
        for s in steps:
            if s.operand is None:
                v = s.imm
            else:
                t = slot[s.operand]
                idx = {"full": (i, j), "col": (j,), "row": (i,), "scalar": (0,)}[s.operand.kind]
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

    epi = te.compute((nb, ob, b, k), at, "epilogue")
    wide = m.out_dtype == "int32"
    if wide:  # the byte planes: the store of plane p reads the value shifted by 8p
        out = te.compute((4, nb, ob, b, k), lambda p, i, j, bb, oo: epi[i, j, bb, oo].astype(
            "int8"), "out")
    else:
        out = te.compute((nb, ob, b, k), lambda *i: epi[i].astype("int8"), "out")
    s = create_schedule(out)
    s[gemm].set_scope("acc")
    s[epi].set_scope("acc")
    p_, i_, j_, b_, o_ = s[out].axes if wide else (None, *s[out].axes)
    io, ii = s[out].split(i_, kn.tile_n)
    jo, ji = s[out].split(j_, kn.tile_o)
    order = [io, jo, ii, ji, b_, o_]
    if kn.vthreads > 1:
        t, rest = s[out].split(jo, jo.extent // kn.vthreads)
        s[out].bind_vthread(t, interleave="thread")
        order[1:2] = [t, rest]
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
    gi, gj, gb, go = s[gemm].axes
    gko, gki = s[gemm].reduce_axes
    k_o, k_i = s[gemm].split(gko, kn.tile_k)
    s[gemm].reorder(k_o, gi, gj, k_i, gb, go, gki)
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
    if store is None or store.buffer.scope != "global" or len(store.buffer.shape) != 5:
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


def _pad2(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    if x.shape == (rows, cols):
        return x
    out = np.zeros((rows, cols), x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _gather(o: Operand, arr: np.ndarray, m: int, n: int) -> np.ndarray:
    """The operand's values: [m, n], [m], [n] or [] by its kind."""
    r = np.arange(m)[:, None] if o.kind in ("full", "row") else np.zeros((1, 1), np.int64)
    c = np.arange(n)[None, :] if o.kind in ("full", "col") else np.zeros((1, 1), np.int64)
    idx = tuple(cr * r + cc * c + c0 for cr, cc, c0 in o.index)
    v = arr[idx] if idx else arr.reshape(())[None, None]
    v = np.broadcast_to(v, (r.shape[0], c.shape[1]))
    v = v.astype(np.int8 if o.int8 else np.int32)
    if o.negate:
        v = np.negative(v)  # int32: wraps like the int32 subtraction it replaces
    return {"full": v, "row": v[:, 0], "col": v[0], "scalar": v[0, 0]}[o.kind]


def pack_inputs(m: GemmMatch, arrays: list, cfg: HwConfig) -> list[np.ndarray]:
    """The caller's arrays -> (data, weight, *operands) in the packed layouts."""
    b, k = cfg.batch, cfg.block
    mp, kp, np_ = padded(m, cfg)
    a = arrays[m.a_arg] if m.a_rows_first else arrays[m.a_arg].T
    w = arrays[m.b_arg].T if m.b_k_first else arrays[m.b_arg]      # [N, K]
    a, w = a[:m.m, :m.k], w[:m.n, :m.k]   # the ranges the product reads
    a = _pad2(np.asarray(a, np.int8), mp, kp)
    w = _pad2(np.asarray(w, np.int8), np_, kp)
    data = a.reshape(mp // b, b, kp // k, k).transpose(0, 2, 1, 3)
    weight = w.reshape(np_ // k, k, kp // k, k).transpose(0, 2, 1, 3)
    out = [np.ascontiguousarray(data), np.ascontiguousarray(weight)]
    for o in m.operands:
        if o.arg < 0:
            v = np.int32(o.value)
            out.append(np.full((1, b, k), v, np.int32))
            continue
        v = _gather(o, arrays[o.arg], m.m, m.n)
        if o.kind == "full":
            v = _pad2(v, mp, np_).reshape(mp // b, b, np_ // k, k).transpose(0, 2, 1, 3)
        elif o.kind == "col":
            v = np.broadcast_to(np.pad(v, (0, np_ - m.n)).reshape(np_ // k, 1, k),
                                (np_ // k, b, k))
        elif o.kind == "row":
            v = np.broadcast_to(np.pad(v, (0, mp - m.m)).reshape(mp // b, b, 1), (mp // b, b, k))
        else:
            v = np.broadcast_to(v, (1, b, k))
        out.append(np.ascontiguousarray(v))
    return out


def unpack_output(m: GemmMatch, planes: np.ndarray, cfg: HwConfig) -> np.ndarray:
    """The packed output (int8, or the four byte planes of int32, least significant
    first) -> the op's output in its own axis order."""
    mp, _, np_ = padded(m, cfg)

    def plain(p):
        return p.transpose(0, 2, 1, 3).reshape(mp, np_)[:m.m, :m.n]
    if m.out_dtype == "int8":
        res = plain(planes)
    else:
        u = [plain(p).view(np.uint8).astype(np.uint32) for p in planes]
        res = (u[0] | (u[1] << 8) | (u[2] << 16) | (u[3] << 24)).view(np.int32)
    return np.ascontiguousarray(res if m.out_rows_first else res.T)


def macs(m: GemmMatch) -> int:
    return m.m * m.k * m.n * (1 if m.out_dtype == "int8" else 4)

