"""Text forms of expressions: what the IR printer and error messages show."""

from __future__ import annotations

from .expr import Bin, Call, Cast, Const, Expr, Load, Reduce, Select, Var

__all__ = ["expr_str", "display_names"]

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
