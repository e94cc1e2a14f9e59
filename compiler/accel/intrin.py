"""Tensor intrinsics: hardware operations declared in the tensor language, and tensorize's
check that a loop nest really computes one.

The GEMM intrinsic is declared from the HwConfig as what one micro-op does:

    out[b, o] = sum over k of int32(inp[b, k]) * int32(wgt[o, k])      (BATCH x BLOCK x BLOCK)

Tensorizing a loop nest matches its body against that declaration structurally: the same
operations and dtypes, every intrinsic axis bound to one innermost loop of the same extent,
and each operand's trailing indices exactly those axes (its leading indices, which do not
use them, select the element). A mismatch is a CompilerError saying what differs.

Intrinsics are registered by name (``register_intrinsic``; Python entry points in the group
``celosia.intrinsics`` for a package, read at the first lookup), the built-in ``gemm`` among
them, and schedules ask for them by name (``get_intrinsic``). A declared intrinsic reaches
the code generator only through a micro-op it can emit (``HARDWARE``: the call, and what
that micro-op computes on the configuration): ``get_intrinsic`` checks that the declaration
names such a call and computes exactly what it does (operand shapes, dtypes and scopes,
the reduction, the arithmetic), and otherwise says what is missing or what differs.
"""

from __future__ import annotations

from celosia.config import HwConfig
from celosia.errors import CompilerError

from ..tensor import te
from ..tensor.expr import (Bin, Call, Cast, Const, Expr, Load, Reduce, Var, collect, expr_str,
                           simplify)
from ..tensor.tir import Buffer, Evaluate

__all__ = ["TensorIntrinsic", "gemm_intrinsic", "element_index", "register_intrinsic",
           "get_intrinsic", "intrinsic_names", "HARDWARE", "INTRINSIC_GROUP"]


_SCOPE_ORDER = ("inp", "wgt", "acc")


def element_index(buf: Buffer, indices: tuple, elem_dims: int) -> Expr:
    """The row of an element-shaped buffer: its leading indices flattened (the trailing
    ``elem_dims`` dimensions are one element)."""
    lead = indices[:len(indices) - elem_dims]
    shape = buf.shape[:len(buf.shape) - elem_dims]
    out: Expr = Const(0, "int32")
    stride = 1
    for idx, n in zip(reversed(lead), reversed(shape)):
        out = out + idx * stride if stride != 1 else out + idx
        stride *= n
    return simplify(out)


class TensorIntrinsic:
    """A hardware operation declared as a compute over placeholders, with the memory scope of
    each operand and the call that implements it."""

    def __init__(self, name: str, output: te.Tensor, scopes: dict, call: str):
        self.name = name
        self.output = output
        self.op = output.op
        self.scopes = scopes  # placeholder or output tensor -> scope
        self.call = call

    def __repr__(self) -> str:
        return f"TensorIntrinsic({self.name})"

    # ---- matching ---------------------------------------------------------------------

    def match(self, stage, inner, body: Expr, out_buf: Buffer, out_idx: tuple, where: str):
        """Bind the intrinsic to a loop nest; returns {intrinsic placeholder: (buffer,
        indices)} or raises CompilerError saying what differs."""
        op = self.op
        axes = list(op.axes) + list(op.reduce_axes)
        if len(inner) != len(axes):
            raise CompilerError(
                f"{where}: the intrinsic {self.name} covers {len(axes)} loops "
                f"({', '.join(f'{a.name} < {a.extent}' for a in axes)}), but "
                f"{len(inner)} loops are inside: {', '.join(f'{l.name} < {l.extent}' for l in inner)}")
        var_map: dict = {}  # intrinsic Var -> loop Var
        operands: dict = {}
        intr_body = op.body.source if isinstance(op.body, Reduce) else op.body
        stage_body = body.source if isinstance(body, Reduce) else body
        if isinstance(op.body, Reduce) != isinstance(body, Reduce):
            raise CompilerError(f"{where}: {self.name} is "
                                f"{'a reduction' if isinstance(op.body, Reduce) else 'elementwise'}"
                                f" but the loop nest is not")
        inner_vars = {iv.var: iv for iv in inner}
        self._match(intr_body, stage_body, var_map, operands, inner_vars, where)
        # The output's trailing indices are the intrinsic's data axes.
        self._bind_operand(self.output, [a.var for a in op.axes], out_buf, out_idx, var_map,
                           inner_vars, where, operands)
        for a in axes:
            loop = var_map.get(a.var)
            if loop is None:
                raise CompilerError(f"{where}: no loop plays the role of {self.name}'s axis {a.name}")
            iv = inner_vars[loop]
            if iv.extent != a.extent or iv.kind != a.kind:
                raise CompilerError(f"{where}: loop {iv.name} ({iv.kind}, {iv.extent} iterations) "
                                    f"plays {self.name}'s axis {a.name} ({a.kind}, {a.extent})")
        for tensor, (buf, _) in operands.items():
            scope = self.scopes[tensor]
            if buf.scope != scope:
                raise CompilerError(f"{where}: operand {buf.name} of {self.name} must be in the "
                                    f"{scope} buffer, not {buf.scope}; use cache_read/set_scope")
        return operands

    def _match(self, pat: Expr, e: Expr, var_map, operands, inner_vars, where):
        def fail(why):
            raise CompilerError(f"{where}: the loop nest computes {expr_str(e)} where "
                                f"{self.name} computes {expr_str(pat)}: {why}")
        if isinstance(pat, Cast):
            if not isinstance(e, Cast) or e.dtype != pat.dtype:
                fail(f"expected a cast to {pat.dtype}")
            return self._match(pat.value, e.value, var_map, operands, inner_vars, where)
        if isinstance(pat, Bin):
            if not isinstance(e, Bin) or e.op != pat.op or e.dtype != pat.dtype:
                fail(f"expected the {pat.dtype} operation {pat.op}")
            attempts = [(e.a, e.b)] + ([(e.b, e.a)] if pat.op in ("+", "*", "min", "max") else [])
            last = None
            for a, b in attempts:
                trial_vars, trial_ops = dict(var_map), dict(operands)
                try:
                    self._match(pat.a, a, trial_vars, trial_ops, inner_vars, where)
                    self._match(pat.b, b, trial_vars, trial_ops, inner_vars, where)
                except CompilerError as exc:
                    last = exc
                    continue
                var_map.update(trial_vars)
                operands.update(trial_ops)
                return
            raise last
        if isinstance(pat, Load):
            if not isinstance(e, Load) or e.dtype != pat.dtype:
                fail(f"expected a {pat.dtype} read of {pat.source.name}")
            self._bind_operand(pat.source, [i for i in pat.indices], e.source, e.indices, var_map,
                               inner_vars, where, operands)
            return
        if isinstance(pat, Const):
            if pat != e:
                fail(f"expected the constant {pat.value}")
            return
        fail("unsupported pattern")

    def _bind_operand(self, tensor, pat_indices, buf, indices, var_map, inner_vars, where, operands):
        k = len(pat_indices)
        if not isinstance(buf, Buffer) or len(buf.shape) < k or tuple(buf.shape[-k:]) != tensor.shape:
            shape = getattr(buf, "shape", "?")
            raise CompilerError(f"{where}: operand {getattr(buf, 'name', buf)} has shape {shape}; "
                                f"its last {k} dimensions must be {tensor.shape} to be "
                                f"{self.name}'s {tensor.name}")
        trailing, leading = indices[-k:], indices[:-k]
        for p, i in zip(pat_indices, trailing):
            if not isinstance(i, Var) or i not in inner_vars:
                raise CompilerError(
                    f"{where}: {buf.name} is indexed with {expr_str(i)} where {self.name}'s "
                    f"{tensor.name} has axis {p.name}; the innermost loops must index the "
                    f"element directly")
            if var_map.setdefault(p, i) is not i:
                raise CompilerError(f"{where}: axis {p.name} of {self.name} is played by both "
                                    f"{var_map[p].name} and {i.name}")
        for i in leading:
            used = [v.name for v in collect(i, lambda n: isinstance(n, Var)) if v in inner_vars]
            if used:
                raise CompilerError(f"{where}: {buf.name}'s element index {expr_str(i)} uses the "
                                    f"intrinsic's loops {', '.join(used)}")
        if tensor in operands and operands[tensor][0] is not buf:
            raise CompilerError(f"{where}: {tensor.name} is bound to two buffers")
        operands[tensor] = (buf, tuple(indices))

    # ---- emission ----------------------------------------------------------------------

    def emit(self, lowering, stage, inner, values, out_buf, out_idx, *, reset: bool):
        where = f"tensorize {stage.name} at {inner[0].name}"
        body = lowering.body_of(stage)
        if isinstance(body, Reduce):
            body = Reduce(lowering.rewrite_loads(body.source, values), body.axes, body.dtype)
        else:
            body = lowering.rewrite_loads(body, values)
        operands = self.match(stage, inner, body, out_buf, out_idx, where)
        elem = {t: element_index(buf, idx, len(t.shape)) for t, (buf, idx) in operands.items()}
        # the micro-op's operands in its own order (INP, then WGT), whatever order the
        # declaration reads them in
        inputs = sorted((t for t in operands if t is not self.output),
                        key=lambda t: _SCOPE_ORDER.index(self.scopes[t]))
        if reset:
            return Evaluate(Call(self.call, (out_buf, elem[self.output], Const(1, "int32"))))
        args = [out_buf, elem[self.output], Const(0, "int32")]
        for t in inputs:
            args += [operands[t][0], elem[t]]
        return Evaluate(Call(self.call, tuple(args)))


def gemm_intrinsic(cfg: HwConfig) -> TensorIntrinsic:
    """One GEMM micro-op: (BATCH x BLOCK) int8 times (BLOCK x BLOCK) int8 into int32."""
    inp = te.placeholder((cfg.batch, cfg.block), "int8", "inp")
    wgt = te.placeholder((cfg.block, cfg.block), "int8", "wgt")
    k = te.reduce_axis(cfg.block, "k")
    out = te.compute((cfg.batch, cfg.block),
                     lambda b, o: te.sum(inp[b, k].astype("int32") * wgt[o, k].astype("int32"), axis=[k]),
                     "gemm")
    return TensorIntrinsic("gemm", out, {inp: "inp", wgt: "wgt", out: "acc"}, "uop_gemm")


# ---- the registry --------------------------------------------------------------------------

INTRINSIC_GROUP = "celosia.intrinsics"
# The micro-ops the code generator emits, by call name: what each computes on a
# configuration (the definition a declared intrinsic must equal). ALU micro-ops come from
# element-wise stages marked ``alu`` (tensorize.inject_alu), not from intrinsics.
HARDWARE = {"uop_gemm": gemm_intrinsic}

_factories: dict = {}
_origin: dict = {}
_entry_points_read = False


def _read_entry_points() -> None:
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    import importlib.metadata

    for ep in importlib.metadata.entry_points(group=INTRINSIC_GROUP):
        if ep.name in _factories:
            continue
        where = f"entry point {ep.name!r} = {ep.value!r}"
        try:
            _factories[ep.name] = ep.load()
        except Exception as e:  # a broken plug-in says so when its intrinsic is asked for
            _factories[ep.name] = _broken(f"{where} failed to import: {type(e).__name__}: {e}")
        _origin[ep.name] = where
    _factories.setdefault("gemm", gemm_intrinsic)
    _origin.setdefault("gemm", "built in")


def _broken(why: str):
    def factory(cfg):
        raise CompilerError(why)
    return factory


def register_intrinsic(name: str, factory, *, replace: bool = False) -> None:
    """Register ``factory(cfg) -> TensorIntrinsic`` as the intrinsic ``name``."""
    _read_entry_points()
    if not callable(factory):
        raise CompilerError(f"intrinsic {name!r}: give a function of the HwConfig returning a "
                            f"TensorIntrinsic, not {factory!r}")
    if name in _factories and not replace:
        raise CompilerError(f"an intrinsic named {name!r} is registered already "
                            f"({_origin[name]}): pass replace=True to replace it")
    _factories[name] = factory
    _origin[name] = "register_intrinsic"


def intrinsic_names() -> list[str]:
    _read_entry_points()
    return sorted(_factories)


def get_intrinsic(name: str, cfg: HwConfig) -> TensorIntrinsic:
    """The registered intrinsic ``name`` for ``cfg``, checked against the micro-op it calls
    (module doc)."""
    _read_entry_points()
    if name not in _factories:
        raise CompilerError(f"no tensor intrinsic named {name!r}: registered are "
                            f"{', '.join(sorted(_factories))} (register_intrinsic, or an entry "
                            f"point in the group {INTRINSIC_GROUP!r})")
    intr = _factories[name](cfg)
    if not isinstance(intr, TensorIntrinsic):
        raise CompilerError(f"intrinsic {name!r}: its factory returned {intr!r}, not a "
                            f"TensorIntrinsic")
    hw = HARDWARE.get(intr.call)
    if hw is None:
        raise CompilerError(
            f"intrinsic {name!r} calls {intr.call!r}, which the accelerator's code generator "
            f"does not emit: its micro-ops are {', '.join(sorted(HARDWARE))} (ALU micro-ops "
            f"come from element-wise stages marked alu); declare the intrinsic with one of "
            f"those calls")
    why = _differs(intr, hw(cfg))
    if why:
        raise CompilerError(f"intrinsic {name!r} does not compute what {intr.call} does on "
                            f"this configuration (BATCH={cfg.batch}, BLOCK={cfg.block}): {why}")
    return intr


def _operands(intr: TensorIntrinsic) -> dict:
    """scope -> (shape, dtype) of each operand, the output's included."""
    out = {}
    for t, scope in intr.scopes.items():
        out[scope] = (tuple(t.shape), t.op.dtype)
    return out


def _canonical(intr: TensorIntrinsic) -> str:
    """The arithmetic with names replaced by roles: data axes by position, reduction axes
    by position, operands by scope (so two declarations of one computation print alike)."""
    op = intr.op
    names = {a.var: f"i{k}" for k, a in enumerate(op.axes)}
    names.update({a.var: f"r{k}" for k, a in enumerate(op.reduce_axes)})
    scope = {t.op: sc for t, sc in intr.scopes.items()}

    def show(e) -> str:
        if isinstance(e, Reduce):
            return f"sum[{','.join(names.get(a.var, '?') for a in e.axes)}]({show(e.source)})"
        if isinstance(e, Cast):
            return f"{e.dtype}({show(e.value)})"
        if isinstance(e, Bin):
            a, b = show(e.a), show(e.b)
            if e.op in ("+", "*", "min", "max"):
                a, b = sorted((a, b))
            return f"({a} {e.op}:{e.dtype} {b})"
        if isinstance(e, Load):
            src = getattr(e.source, "op", e.source)
            return f"{scope.get(src, '?')}[{','.join(show(i) for i in e.indices)}]"
        if isinstance(e, Var):
            return names.get(e, "?")
        if isinstance(e, Const):
            return f"{e.value}:{e.dtype}"
        return expr_str(e)

    return show(op.body)


def _differs(intr: TensorIntrinsic, hw: TensorIntrinsic) -> str | None:
    ours, theirs = _operands(intr), _operands(hw)
    if set(ours) != set(theirs):
        return (f"its operands are in {', '.join(sorted(ours))}, the micro-op's in "
                f"{', '.join(sorted(theirs))}")
    for sc in sorted(theirs):
        if ours[sc] != theirs[sc]:
            return (f"its {sc} operand is {ours[sc][1]}{list(ours[sc][0])}, the micro-op's "
                    f"{theirs[sc][1]}{list(theirs[sc][0])}")
    a, b = intr.op.reduce_axes, hw.op.reduce_axes
    if [x.extent for x in a] != [x.extent for x in b]:
        return (f"it reduces over {[x.extent for x in a]}, the micro-op over "
                f"{[x.extent for x in b]}")
    if _canonical(intr) != _canonical(hw):
        return f"it computes {_canonical(intr)}, the micro-op {_canonical(hw)}"
    return None
