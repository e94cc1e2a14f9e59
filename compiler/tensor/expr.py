"""Scalar expressions shared by the tensor language (te) and the loop IR (tir).

Nodes are immutable; structural equality (``==``) compares trees, while ``<``, ``<=``, ``>``,
``>=`` and the arithmetic operators build new nodes. Variables compare by identity, so two
loops may share a name without being confused. Integer arithmetic is that of the target
(two's complement, wrapping to the dtype); ``//`` and ``%`` are floor division and modulo.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from celosia.errors import CompilerError

__all__ = [
    "Expr", "Var", "Const", "Bin", "Cast", "Select", "Load", "Reduce", "Call", "CompilerError",
    "const", "as_expr", "cast", "select", "min_expr", "max_expr", "all_of", "linear_form",
    "simplify", "substitute", "free_vars", "collect", "DTYPES", "MATH_CALLS", "exp", "sqrt",
    "expr_str", "display_names",
]

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float32")
# Elementwise float32 functions, as Call nodes (the CPU backend emits LLVM's intrinsics).
MATH_CALLS = ("exp", "sqrt")
_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "bool": 1}


class Expr:
    """Base of all expression nodes; operators build new nodes."""

    dtype: str

    def __add__(self, other): return _binary("+", self, other)
    def __radd__(self, other): return _binary("+", other, self)
    def __sub__(self, other): return _binary("-", self, other)
    def __rsub__(self, other): return _binary("-", other, self)
    def __mul__(self, other): return _binary("*", self, other)
    def __rmul__(self, other): return _binary("*", other, self)
    def __floordiv__(self, other): return _binary("//", self, other)
    def __rfloordiv__(self, other): return _binary("//", other, self)
    def __mod__(self, other): return _binary("%", self, other)
    def __rmod__(self, other): return _binary("%", other, self)
    def __truediv__(self, other): return _binary("/", self, other)
    def __rtruediv__(self, other): return _binary("/", other, self)
    def __rshift__(self, other): return _binary(">>", self, other)
    def __lshift__(self, other): return _binary("<<", self, other)
    def __and__(self, other): return _binary("&&", self, other)
    def __or__(self, other): return _binary("||", self, other)
    def __lt__(self, other): return _binary("<", self, other)
    def __le__(self, other): return _binary("<=", self, other)
    def __gt__(self, other): return _binary(">", self, other)
    def __ge__(self, other): return _binary(">=", self, other)
    def __neg__(self): return _binary("-", Const(0, self.dtype), self)

    def equal(self, other) -> "Expr":
        """The comparison node ``self == other`` (``==`` itself is structural equality)."""
        return _binary("==", self, other)

    def astype(self, dtype: str) -> "Expr":
        return cast(dtype, self)

    def __bool__(self):
        raise CompilerError(f"the expression {self} has no truth value while a program is built; "
                            f"use select()/all_of() for conditions, not `if`/`and`")

    def __str__(self) -> str:
        return expr_str(self)


_ids = itertools.count()


@dataclass(frozen=True, eq=False, repr=False)
class Var(Expr):
    """A scalar variable (a loop index, a shape parameter). Equality is identity."""

    name: str
    dtype: str = "int32"
    uid: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        return f"Var({self.name})"

    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other


@dataclass(frozen=True, repr=False)
class Const(Expr):
    value: int | float
    dtype: str = "int32"

    def __repr__(self) -> str:
        return f"Const({self.value}, {self.dtype})"


@dataclass(frozen=True, repr=False)
class Bin(Expr):
    """A binary operation: + - * / // % min max >> << && || < <= > >= == !=."""

    op: str
    a: Expr
    b: Expr
    dtype: str

    def __repr__(self) -> str:
        return f"Bin({self.op!r}, {self.a!r}, {self.b!r})"


@dataclass(frozen=True, repr=False)
class Cast(Expr):
    dtype: str
    value: Expr


@dataclass(frozen=True, repr=False)
class Select(Expr):
    """``t if cond else f``; both branches may be evaluated."""

    cond: Expr
    t: Expr
    f: Expr
    dtype: str


@dataclass(frozen=True, repr=False)
class Load(Expr):
    """A read of a tensor (te) or a buffer (tir) at integer indices."""

    source: object  # te.Tensor or tir.Buffer
    indices: tuple
    dtype: str


@dataclass(frozen=True, repr=False)
class Reduce(Expr):
    """A sum of ``source`` over reduction axes (te.IterVar of kind "reduce"); only as the
    whole body of a compute."""

    source: Expr
    axes: tuple
    dtype: str


@dataclass(frozen=True, repr=False)
class Call(Expr):
    """A call of a named intrinsic (in the IR, an accelerator or runtime operation)."""

    name: str
    args: tuple
    dtype: str = "void"


_COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
_LOGICAL = ("&&", "||")


def const(value, dtype: str | None = None) -> Const:
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "int32" if isinstance(value, int) else "float32"
    return Const(value, dtype)


def as_expr(value, like: Expr | None = None) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value, "bool")
    if isinstance(value, int) and like is not None and like.dtype == "float32":
        return Const(float(value), "float32")  # x * 2 with x float32
    if isinstance(value, int):
        dtype = like.dtype if like is not None and like.dtype in _INT_BITS and like.dtype != "bool" else "int32"
        return Const(value, dtype)
    if isinstance(value, float):
        return Const(value, like.dtype if like is not None and like.dtype == "float32" else "float32")
    if isinstance(getattr(value, "var", None), Var):  # a te.IterVar stands for its variable
        return value.var
    if hasattr(value, "__index__"):
        return as_expr(int(value), like)
    raise CompilerError(f"cannot use {value!r} of type {type(value).__name__} in an expression")


def _binary(op: str, a, b) -> Expr:
    a = as_expr(a, b if isinstance(b, Expr) else None)
    b = as_expr(b, a)
    if op in _LOGICAL:
        if a.dtype != "bool" or b.dtype != "bool":
            raise CompilerError(f"{op} needs two conditions, not {a.dtype} and {b.dtype}")
        return Bin(op, a, b, "bool")
    if a.dtype != b.dtype:
        raise CompilerError(
            f"operands of {op} have different types: {a} is {a.dtype} and {b} is {b.dtype}; "
            f"cast one with .astype()")
    if op in (">>", "<<", "%", "//") and a.dtype == "float32":
        raise CompilerError(f"{op} needs integer operands, not float32 ({a} {op} {b})")
    return Bin(op, a, b, "bool" if op in _COMPARISONS else a.dtype)


def cast(dtype: str, value) -> Expr:
    if dtype not in DTYPES:
        raise CompilerError(f"unknown dtype {dtype!r}; dtypes are {', '.join(DTYPES)}")
    value = as_expr(value)
    return value if value.dtype == dtype else Cast(dtype, value)


def select(cond, t, f) -> Expr:
    cond = as_expr(cond)
    t = as_expr(t, f if isinstance(f, Expr) else None)
    f = as_expr(f, t)
    if cond.dtype != "bool":
        raise CompilerError(f"select needs a condition, not {cond.dtype} ({cond})")
    if t.dtype != f.dtype:
        raise CompilerError(f"select branches have different types: {t.dtype} and {f.dtype}")
    return Select(cond, t, f, t.dtype)


def exp(x) -> Expr:
    """``e ** x`` of a float32 expression."""
    return _math_call("exp", x)


def sqrt(x) -> Expr:
    return _math_call("sqrt", x)


def _math_call(name: str, x) -> Expr:
    x = as_expr(x)
    if x.dtype != "float32":
        raise CompilerError(f"{name} needs a float32 operand, not {x.dtype} ({x}); cast it")
    return Call(name, (x,), "float32")


def min_expr(a, b) -> Expr:
    return _binary("min", a, b)


def max_expr(a, b) -> Expr:
    return _binary("max", a, b)


def all_of(*conds) -> Expr:
    out = None
    for c in conds:
        out = as_expr(c) if out is None else _binary("&&", out, c)
    return out if out is not None else Const(True, "bool")


# ---- traversal ---------------------------------------------------------------------------


def children(e: Expr) -> tuple:
    if isinstance(e, Bin):
        return (e.a, e.b)
    if isinstance(e, Cast):
        return (e.value,)
    if isinstance(e, Select):
        return (e.cond, e.t, e.f)
    if isinstance(e, Load):
        return tuple(e.indices)
    if isinstance(e, Reduce):
        return (e.source,)
    if isinstance(e, Call):
        return tuple(a for a in e.args if isinstance(a, Expr))
    return ()


def collect(e: Expr, predicate) -> list:
    """Every sub-expression (pre-order) for which ``predicate`` holds."""
    out, stack = [], [e]
    while stack:
        node = stack.pop()
        if predicate(node):
            out.append(node)
        stack.extend(reversed(children(node)))
    return out


def free_vars(e: Expr) -> set:
    return set(collect(e, lambda n: isinstance(n, Var)))


def substitute(e: Expr, mapping: dict, load=None) -> Expr:
    """Replace variables by expressions; ``load(node, new_indices)`` may rewrite loads."""
    if isinstance(e, Var):
        return mapping.get(e, e)
    if isinstance(e, Const):
        return e
    if isinstance(e, Bin):
        return Bin(e.op, substitute(e.a, mapping, load), substitute(e.b, mapping, load), e.dtype)
    if isinstance(e, Cast):
        return Cast(e.dtype, substitute(e.value, mapping, load))
    if isinstance(e, Select):
        return Select(substitute(e.cond, mapping, load), substitute(e.t, mapping, load),
                      substitute(e.f, mapping, load), e.dtype)
    if isinstance(e, Load):
        indices = tuple(substitute(i, mapping, load) for i in e.indices)
        return load(e, indices) if load else Load(e.source, indices, e.dtype)
    if isinstance(e, Reduce):
        return Reduce(substitute(e.source, mapping, load), e.axes, e.dtype)
    if isinstance(e, Call):
        return Call(e.name, tuple(substitute(a, mapping, load) if isinstance(a, Expr) else a
                                  for a in e.args), e.dtype)
    raise CompilerError(f"cannot substitute into {type(e).__name__}")


# ---- affine analysis and simplification --------------------------------------------------


def linear_form(e: Expr) -> tuple[dict, int] | None:
    """``e`` as (coefficient per variable, constant) if it is an integer affine expression."""
    if isinstance(e, Const):
        return ({}, int(e.value)) if isinstance(e.value, (int, bool)) else None
    if isinstance(e, Var):
        return {e: 1}, 0
    if isinstance(e, Cast) and e.dtype in _INT_BITS and e.value.dtype in _INT_BITS:
        return linear_form(e.value)
    if isinstance(e, Bin) and e.op in ("+", "-", "*"):
        la, lb = linear_form(e.a), linear_form(e.b)
        if la is None or lb is None:
            return None
        if e.op == "*":
            if la[0] and lb[0]:
                return None
            (coef, c), k = (la, lb[1]) if not lb[0] else (lb, la[1])
            return {v: a * k for v, a in coef.items() if a * k}, c * k
        sign = 1 if e.op == "+" else -1
        coef = dict(la[0])
        for v, a in lb[0].items():
            coef[v] = coef.get(v, 0) + sign * a
            if not coef[v]:
                del coef[v]
        return coef, la[1] + sign * lb[1]
    return None


def coefficient(e: Expr, var: Var) -> int | None:
    """The coefficient of ``var`` in ``e`` when ``e`` is affine in ``var`` (a sum whose terms
    that hold ``var`` are affine; the others may be anything: ``min(y, 1) + x`` is affine in
    x), else None."""
    def terms(e, sign):
        if isinstance(e, Bin) and e.op in ("+", "-"):
            yield from terms(e.a, sign)
            yield from terms(e.b, sign if e.op == "+" else -sign)
        elif isinstance(e, Cast) and e.dtype in _INT_BITS and e.value.dtype in _INT_BITS:
            yield from terms(e.value, sign)
        else:
            yield e, sign

    total = 0
    for t, sign in terms(e, 1):
        if var not in free_vars(t):
            continue
        lf = linear_form(t)
        if lf is None:
            return None
        total += sign * lf[0].get(var, 0)
    return total


def from_linear(coef: dict, c: int) -> Expr:
    """The canonical expression of an affine form."""
    terms = []
    # Variables in creation order (outer loops are made before inner ones): a stable text.
    keys = sorted(coef, key=lambda v: v.uid)
    for v in keys:
        a = coef[v]
        terms.append(v if a == 1 else Bin("*", v, Const(a, "int32"), "int32"))
    out = None
    for t in terms:
        out = t if out is None else Bin("+", out, t, "int32")
    if out is None:
        return Const(c, "int32")
    if c > 0:
        out = Bin("+", out, Const(c, "int32"), "int32")
    elif c < 0:
        out = Bin("-", out, Const(-c, "int32"), "int32")
    return out


def simplify(e: Expr) -> Expr:
    """Fold constants and put int32 affine index expressions into canonical form."""
    if e.dtype == "int32" and not isinstance(e, (Var, Const)):
        lf = linear_form(e)
        if lf is not None:
            return from_linear(*lf)
    if isinstance(e, Bin):
        a, b = simplify(e.a), simplify(e.b)
        if isinstance(a, Const) and isinstance(b, Const):
            folded = _fold(e.op, a.value, b.value, e.dtype)
            if folded is not None:
                return Const(folded, e.dtype)
        if e.op == "&&":
            if a == Const(True, "bool"):
                return b
            if b == Const(True, "bool"):
                return a
        return Bin(e.op, a, b, e.dtype)
    if isinstance(e, Cast):
        v = simplify(e.value)
        if isinstance(v, Const) and e.dtype in _INT_BITS and e.dtype != "bool":
            return Const(_wrap(int(v.value), e.dtype), e.dtype)
        return Cast(e.dtype, v)
    if isinstance(e, Select):
        c = simplify(e.cond)
        if isinstance(c, Const):
            return simplify(e.t if c.value else e.f)
        return Select(c, simplify(e.t), simplify(e.f), e.dtype)
    if isinstance(e, Load):
        return Load(e.source, tuple(simplify(i) for i in e.indices), e.dtype)
    return e


def _wrap(value: int, dtype: str) -> int:
    bits = _INT_BITS[dtype]
    if dtype.startswith("uint"):
        return value % (1 << bits)
    return (value + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


def _fold(op, a, b, dtype):
    if dtype == "float32" or isinstance(a, float) or isinstance(b, float):
        return None
    ops = {
        "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
        "//": lambda: a // b if b else None, "%": lambda: a % b if b else None,
        "min": lambda: min(a, b), "max": lambda: max(a, b),
        ">>": lambda: a >> b, "<<": lambda: a << b,
        "<": lambda: a < b, "<=": lambda: a <= b, ">": lambda: a > b, ">=": lambda: a >= b,
        "==": lambda: a == b, "!=": lambda: a != b, "&&": lambda: a and b, "||": lambda: a or b,
    }
    value = ops[op]()
    if value is None or isinstance(value, bool):
        return value
    return _wrap(value, dtype)


# Text forms of expressions: what the IR printer and error messages show.

# Display names of variables while a function is printed: distinct variables that share a
# name (a producer's axis "y" inside a consumer's loop "y") get suffixes.
_display: dict = {}


class display_names:
    """Context manager: print the given variables with unique names."""

    def __init__(self, variables):
        self.names = {}
        seen: dict = {}
        for v in sorted(variables, key=lambda v: v.uid):
            n = seen.get(v.name, 0)
            seen[v.name] = n + 1
            self.names[v] = v.name if n == 0 else f"{v.name}_{n}"

    def __enter__(self):
        self.saved = dict(_display)
        _display.update(self.names)
        return self

    def __exit__(self, *exc):
        _display.clear()
        _display.update(self.saved)

_PRECEDENCE = {"||": 1, "&&": 2, "<": 3, "<=": 3, ">": 3, ">=": 3, "==": 3, "!=": 3,
               ">>": 4, "<<": 4, "+": 5, "-": 5, "*": 6, "/": 6, "//": 6, "%": 6}


def _name(source) -> str:
    return getattr(source, "name", repr(source))


def expr_str(e: Expr, parent: int = 0) -> str:
    if isinstance(e, Var):
        return _display.get(e, e.name)
    if isinstance(e, Const):
        if e.dtype in ("int32", "bool", "float32"):
            return str(e.value)
        return f"{e.dtype}({e.value})"
    if isinstance(e, Bin):
        if e.op in ("min", "max"):
            return f"{e.op}({expr_str(e.a)}, {expr_str(e.b)})"
        p = _PRECEDENCE[e.op]
        text = f"{expr_str(e.a, p)} {e.op} {expr_str(e.b, p + 1)}"
        return f"({text})" if p < parent else text
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_str(e.value)})"
    if isinstance(e, Select):
        return f"select({expr_str(e.cond)}, {expr_str(e.t)}, {expr_str(e.f)})"
    if isinstance(e, Load):
        return f"{_name(e.source)}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        axes = ", ".join(f"{a.var.name} < {a.extent}" for a in e.axes)
        return f"sum({expr_str(e.source)}, axis=[{axes}])"
    if isinstance(e, Call):
        args = ", ".join(expr_str(a) if isinstance(a, Expr) else getattr(a, "name", repr(a))
                         for a in e.args)
        return f"{e.name}({args})"
    return repr(e)
