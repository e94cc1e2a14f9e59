"""A model's inputs as declared, the shapes a user gives them, and hints that work.

An ONNX input dim is fixed (``dim_value`` > 0) or dynamic: a ``dim_param`` (a name such as
``batch``), a ``dim_value`` of -1 or 0 (Paddle and other exporters write these for "any"),
or no value at all. Declared dims are kept as ints for fixed sizes and strings for dynamic
ones (the name, "-1", "0", or "?" when unnamed), so messages show them as the model says.

A dynamic dim takes the size given (``input_shapes``, ``--input-shape``); a given shape that
contradicts a fixed dim is refused, naming the dim and what the model declares. Every
message that tells the user what to pass proposes shapes that were tried: ``suggest``
imports the model with candidates until one works.
"""

from __future__ import annotations

__all__ = ["declared_dims", "dims_str", "is_dynamic", "shape_problem", "suggest",
           "shape_flags", "shape_kwargs", "FILL_SIZES"]

# Sizes tried for the dynamic dims after the first (a batch gets 1): one that fits most
# image models' strides and windows, then 1, then the sizes image models are built for.
FILL_SIZES = (32, 1, 64, 224, 640)


def declared_dims(value_info) -> list | None:
    """The dims of an input's ValueInfoProto (ints fixed, strings dynamic), or None when
    its rank is unknown."""
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value) if d.dim_value > 0 else str(d.dim_value))
        else:
            dims.append(d.dim_param or "?")
    return dims


def is_dynamic(dims) -> bool:
    return dims is None or any(isinstance(d, str) for d in dims)


def dims_str(dims) -> str:
    if dims is None:
        return "of unknown rank"
    return "[" + ",".join(str(d) for d in dims) + "]"


def shape_problem(name: str, dims, shape) -> str | None:
    """What is wrong with a given shape for an input declared ``dims``, or None."""
    if any(s < 0 for s in shape):
        return f"input {name!r}: the given shape {dims_str(shape)} has a negative size"
    if dims is None:
        return None
    if len(dims) != len(shape):
        return (f"input {name!r} has {len(dims)} dims in the model ({dims_str(dims)}); the "
                f"given shape {dims_str(shape)} has {len(shape)}")
    bad = [f"{s} at dim {i} where the model fixes {d}"
           for i, (d, s) in enumerate(zip(dims, shape)) if isinstance(d, int) and d != s]
    if bad:
        return (f"input {name!r} is {dims_str(dims)} in the model; the given shape "
                f"{dims_str(shape)} has {', '.join(bad)}")
    return None


def _filled(declared: dict, given: dict, size: int) -> dict | None:
    """Shapes for every input: a given shape where it fits the model's rank (its fixed
    dims set to the model's), else the declared dims with dim 0 = 1 and the other dynamic
    dims = ``size`` (one size per dim name); None if an input of unknown rank has none."""
    named: dict[str, int] = {}
    shapes = {}
    for name, dims in declared.items():
        g = given.get(name)
        if dims is None:
            if g is None:
                return None
            shapes[name] = tuple(g)
        elif g is not None and len(g) == len(dims):
            shapes[name] = tuple(d if isinstance(d, int) else max(int(s), 0)
                                 for d, s in zip(dims, g))
        else:
            shape = []
            for i, d in enumerate(dims):
                if isinstance(d, int):
                    shape.append(d)
                elif d.lstrip("-").isdigit() or d == "?":  # unnamed: each its own size
                    shape.append(1 if i == 0 else size)
                else:
                    shape.append(named.setdefault(d, 1 if i == 0 else size))
            shapes[name] = tuple(shape)
    return shapes


def suggest(declared: dict, given: dict, works) -> tuple[dict | None, str]:
    """Shapes to propose ({name: shape}) that ``works(shapes)`` (an import) accepts, and
    the first error otherwise (as text, for the message)."""
    tried, first_error = [], ""
    for size in FILL_SIZES:
        shapes = _filled(declared, given, size)
        if shapes is None or shapes in tried:
            continue
        tried.append(shapes)
        error = works(shapes)
        if error is None:
            return shapes, ""
        first_error = first_error or error
    return None, first_error


def shape_flags(shapes: dict) -> str:
    """The command-line form: ``--input-shape x=1,3,32,32 --input-shape ...``."""
    return " ".join(f"--input-shape {n}={','.join(map(str, s))}" for n, s in shapes.items())


def shape_kwargs(shapes: dict) -> str:
    """The Python form: ``input_shapes={'x': (1, 3, 32, 32)}``."""
    return "input_shapes={" + ", ".join(f"{n!r}: {tuple(s)!r}" for n, s in shapes.items()) \
        + "}"
