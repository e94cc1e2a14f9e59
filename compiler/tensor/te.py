"""Tensor expressions: what to compute, apart from how (the schedule, schedule.py).

    A = te.placeholder((m, k), "int8", "A")
    W = te.placeholder((n, k), "int8", "W")
    r = te.reduce_axis(k, "r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("int32") * W[j, r].astype("int32"),
                                               axis=[r]), "C")

Shapes are static integers. A compute's body is an expression of its axes; a reduction
(``te.sum``) may only be the whole body.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from celosia.errors import CompilerError

from .expr import DTYPES, Expr, Load, Reduce, Var, as_expr, collect

__all__ = ["IterVar", "Tensor", "PlaceholderOp", "ComputeOp", "placeholder", "compute", "check_dtype",
           "reduce_axis", "sum", "inputs_of", "topo_order"]


@dataclass(frozen=True, eq=False)
class IterVar:
    """An axis of a compute: a variable ranging over [0, extent)."""

    var: Var
    extent: int
    kind: str = "data"  # "data" (an output axis) or "reduce"

    @property
    def name(self) -> str:
        return self.var.name

    def __repr__(self) -> str:
        return f"IterVar({self.name}, {self.extent}, {self.kind})"


# An IterVar takes part in expressions as its variable: i + 1, k * 2, ...
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__lt__", "__le__",
              "__gt__", "__ge__", "__rshift__", "__lshift__", "__neg__", "astype", "equal"):
    setattr(IterVar, _name, lambda self, *args, _op=_name: getattr(self.var, _op)(*args))


@dataclass(frozen=True, eq=False)
class PlaceholderOp:
    name: str
    shape: tuple
    dtype: str


@dataclass(frozen=True, eq=False)
class ComputeOp:
    name: str
    axes: tuple  # IterVar (data)
    body: Expr  # value of element axes; a Reduce node for reductions
    dtype: str
    tag: str = ""

    @property
    def shape(self) -> tuple:
        return tuple(a.extent for a in self.axes)

    @property
    def reduce_axes(self) -> tuple:
        return self.body.axes if isinstance(self.body, Reduce) else ()


@dataclass(frozen=True, eq=False)
class Tensor:
    """The output of an operation; indexing it builds a read (``Load``)."""

    op: object
    name: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "name", self.op.name)

    @property
    def shape(self) -> tuple:
        return self.op.shape

    @property
    def dtype(self) -> str:
        return self.op.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices) -> Load:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != self.ndim:
            raise CompilerError(f"{self.name} has {self.ndim} dimensions, indexed with {len(indices)}")
        return Load(self, tuple(as_expr(i) for i in indices), self.dtype)

    def __repr__(self) -> str:
        return f"Tensor({self.name}, {self.shape}, {self.dtype})"


def _check_shape(name: str, shape) -> tuple:
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
            raise CompilerError(f"{name}: shape {shape} must be positive integers")
    return shape


def check_dtype(dtype, what: str) -> str:
    """``dtype`` (a name, a numpy dtype or type) as one of the tensor language's DTYPES; a
    CompilerError naming it and what is supported otherwise (float64, float16: no)."""
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    name = {"bool_": "bool"}.get(name, name)
    if name not in DTYPES:
        raise CompilerError(f"{what}: dtype {name} is not supported; celosia's tensor "
                            f"expressions and code generators take {', '.join(DTYPES)} "
                            f"(convert float64/float16 data to float32)")
    return name


def placeholder(shape, dtype: str = "int8", name: str = "placeholder") -> Tensor:
    return Tensor(PlaceholderOp(name, _check_shape(name, shape),
                                check_dtype(dtype, f"placeholder {name}")))


def reduce_axis(extent: int, name: str = "k") -> IterVar:
    if isinstance(extent, bool) or not isinstance(extent, int) or extent <= 0:
        raise CompilerError(f"reduce_axis {name}: extent must be a positive integer, not {extent!r}")
    return IterVar(Var(name), extent, "reduce")


def sum(expr, axis) -> Reduce:  # noqa: A001 - mirrors te.sum
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    for a in axes:
        if not isinstance(a, IterVar) or a.kind != "reduce":
            raise CompilerError(f"sum: {a!r} is not a reduce_axis")
    expr = as_expr(expr)
    return Reduce(expr, axes, expr.dtype)


def compute(shape, fcompute, name: str = "compute", tag: str = "") -> Tensor:
    """A tensor whose element at ``axes`` is ``fcompute(*axes)``."""
    shape = _check_shape(name, shape)
    sig = inspect.signature(fcompute).parameters.values()
    if any(p.kind == p.VAR_POSITIONAL for p in sig):  # lambda *i: ...
        params = [f"i{d}" for d in range(len(shape))]
    else:
        params = [p.name for p in sig]
    if len(params) != len(shape):
        raise CompilerError(f"{name}: the compute function takes {len(params)} indices for a "
                            f"{len(shape)}-dimensional shape")
    axes = tuple(IterVar(Var(p), d) for p, d in zip(params, shape))
    body = as_expr(fcompute(*(a.var for a in axes)))
    if any(isinstance(n, Reduce) for n in collect(body, lambda n: isinstance(n, Reduce)) if n is not body):
        raise CompilerError(f"{name}: te.sum may only be the whole body of a compute (cast its "
                            f"operands, not its result)")
    return Tensor(ComputeOp(name, axes, body, body.dtype, tag))


def inputs_of(op) -> list[Tensor]:
    """The tensors an operation reads, in order of first use."""
    if isinstance(op, PlaceholderOp):
        return []
    seen = []
    for load in collect(op.body, lambda n: isinstance(n, Load)):
        if load.source not in seen:
            seen.append(load.source)
    return seen


def topo_order(outputs) -> list:
    """Operations reachable from the outputs, producers before consumers."""
    order, visiting = [], set()

    def visit(op):
        if op in order:
            return
        if op in visiting:
            raise CompilerError(f"{op.name} depends on itself")
        visiting.add(op)
        for t in inputs_of(op):
            visit(t.op)
        visiting.discard(op)
        order.append(op)

    for t in outputs:
        visit(t.op)
    return order
