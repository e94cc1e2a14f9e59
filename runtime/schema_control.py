"""The manifest's ``control`` steps (compiler/cpu/control.py): an If, Loop or Scan whose
bodies are programs of their own, checked as runtime/control.py relies on.

Each body's values, inputs, outer values and steps are checked like the main program's
(runtime/schema.py's ``_step``, recursively for nested bodies); besides, the types the
runner copies between must agree: a Loop's carried values keep their type, its scan outputs
have the body's row type, a Scan's slices are its sequences' rows, an If's branches give
the node's output types, and each outer value has the type of the value it is bound to.
"""

from __future__ import annotations

from ..limits import check_bytes
from .artifact import Field, check_array, nbytes

__all__ = ["check_control_step"]

_BODIES = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
_MAX_NESTING = 16
_BOOL_SCALAR, _INT64_SCALAR = ("bool", ()), ("int64", ())


def check_control_step(f: Field, step: dict, known: dict, values: dict, kernels: dict,
                       depth: int, check_step, decode):
    """Fill ``step`` (kind, node, op, inputs, outputs already checked) with its checked
    attrs and bodies, or raise Invalid naming the field. ``known``: {name: (dtype, shape)}
    of the enclosing program's values and constants, ``values`` its values; ``check_step``
    and ``decode`` are schema.py's (which imports this module)."""
    op = f["op"].string(tuple(_BODIES))
    if depth > _MAX_NESTING:
        raise f.fail(f"control steps nest deeper than {_MAX_NESTING} levels")
    attrs = decode(f["attrs"])
    if not isinstance(attrs, dict):
        raise f["attrs"].fail("is not an object")
    step["attrs"] = attrs
    fb = f["bodies"]
    if sorted(k for k, _ in fb.items()) != sorted(_BODIES[op]):
        raise fb.fail(f"holds {sorted(fb.obj())}, a {op} has {list(_BODIES[op])}")
    constants = {k: t for k, t in known.items() if k not in values}
    bodies = {key: _body(fb[key], step, known, constants, kernels, depth, check_step)
              for key in _BODIES[op]}
    if len({len(b["outer"]) for b in bodies.values()}) != 1:
        raise fb.fail("has bodies with different numbers of outer values")
    step["bodies"] = bodies
    types = {**known, **{"": None}}
    n_outer = len(next(iter(bodies.values()))["outer"])
    own = [types[v] for v in step["inputs"][:len(step["inputs"]) - n_outer]]
    outs = [types[o] for o in step["outputs"]]
    optional = 2 if op == "Loop" else 0  # (a Loop's trip count and condition)
    if any(t is None for t in own[optional:]) or not all(step["inputs"][len(own):]):
        raise f["inputs"].fail(f"leaves out an input a {op} needs")
    {"If": _if, "Loop": _loop, "Scan": _scan}[op](f, attrs, bodies, own, outs)


def _body(f: Field, step: dict, known: dict, constants: dict, kernels: dict,
          depth: int, check_step) -> dict:
    values = {}
    arena = 0
    for name, v in f["values"].items():
        dtype, shape = check_array(v, "value")
        values[name] = {"dtype": dtype, "shape": list(shape)}
        arena += nbytes(dtype, shape) + 64
    check_bytes(arena, f"{f.path}.values (the body's arena)")
    inputs, outer, outputs = f["inputs"].names(), f["outer"].names(), f["outputs"].names()
    if len(outer) > len(step["inputs"]):
        raise f["outer"].fail(f"has {len(outer)} values, the step passes "
                              f"{len(step['inputs'])} inputs")
    captured = step["inputs"][len(step["inputs"]) - len(outer):] if outer else []
    for k, (name, value) in enumerate(zip(inputs + outer, [None] * len(inputs) + captured)):
        where = f["inputs"].list()[k] if k < len(inputs) else f["outer"].list()[k - len(inputs)]
        if name not in values:
            raise where.fail(f"{name!r} is not among the body's values")
        mine = (values[name]["dtype"], tuple(values[name]["shape"]))
        if value is not None and known.get(value) != mine:
            raise where.fail(f"{name!r} is {mine[0]}{list(mine[1])}, bound to {value!r}, "
                             f"which is not")
    if len(set(inputs + outer)) != len(inputs) + len(outer):
        raise f.fail("names an input or outer value twice")
    # The body reads the program's constants and its own values (its own namespace): not
    # the enclosing program's values but through ``outer``.
    body_known = {**constants, **{k: (v["dtype"], tuple(v["shape"])) for k, v in values.items()}}
    defined = set(inputs) | set(outer)
    steps = []
    for s in f["steps"].list():
        steps.append(check_step(s, body_known, values, kernels, defined, depth + 1))
    for k, name in enumerate(outputs):
        if name not in defined:
            raise f["outputs"].list()[k].fail(f"{name!r} is made by no step of the body")
    return {"inputs": inputs, "outer": outer, "outputs": outputs, "values": values,
            "steps": steps, "types": [body_known[o] for o in outputs],
            "input_types": [body_known[i] for i in inputs]}


def _one(f: Field, t, what: str, want=None) -> None:
    """``t`` (dtype, shape) has one element (and dtype ``want``)."""
    if t is not None and (nbytes("bool", t[1]) != 1 or (want and t[0] != want)):
        raise f.fail(f"{what} is {t[0]}{list(t[1])}, expected one {want or ''} element")


def _same(f: Field, a, b, what: str) -> None:
    if a is not None and b is not None and (a[0], tuple(a[1])) != (b[0], tuple(b[1])):
        raise f.fail(f"{what}: {a[0]}{list(a[1])} and {b[0]}{list(b[1])} differ")


def _if(f, attrs, bodies, own, outs) -> None:
    if len(own) != 1:
        raise f["inputs"].fail("an If reads one condition")
    _one(f, own[0], "the condition")
    for key, b in bodies.items():
        if len(b["types"]) < len(outs):
            raise f.fail(f"{key} gives {len(b['types'])} outputs, the step has {len(outs)}")
        for k, (y, t) in enumerate(zip(outs, b["types"])):
            _same(f, y, t, f"output {k} and {key}'s")


def _loop(f, attrs, bodies, own, outs) -> None:
    b = bodies["body"]
    ins, res = b["input_types"], b["types"]
    n_state = len(ins) - 2
    if n_state < 0 or len(own) != len(ins):
        raise f.fail(f"a Loop body takes the iteration, the condition and one value per "
                     f"carried input: {len(ins)} inputs for {len(own)}")
    if len(res) < 1 + n_state or len(outs) > len(res) - 1:
        raise f.fail(f"the body gives {len(res)} outputs for {n_state} carried values and "
                     f"{len(outs)} step outputs")
    if tuple(ins[0]) != _INT64_SCALAR or tuple(ins[1]) != _BOOL_SCALAR:
        raise f.fail("a Loop body's first inputs are an int64 and a bool scalar")
    _one(f, own[0], "the trip count")
    _one(f, own[1], "the condition")
    _one(f, res[0], "the body's condition", "bool")
    for k in range(n_state):
        _same(f, own[2 + k], ins[2 + k], f"carried value {k} and the body's input")
        _same(f, res[1 + k], ins[2 + k], f"carried value {k}'s body input and output")
        if k < len(outs):
            _same(f, outs[k], ins[2 + k], f"output {k} and carried value {k}")
    rows = {y[1][0] for y in outs[n_state:] if y is not None and y[1]}
    for k, y in enumerate(outs[n_state:]):
        row = res[1 + n_state + k]
        if y is not None and (not y[1] or (y[0], tuple(y[1][1:])) != (row[0], tuple(row[1]))):
            raise f.fail(f"scan output {k} is {y[0]}{list(y[1])}, rows of the body's "
                         f"{row[0]}{list(row[1])}")
    if len(rows) > 1:
        raise f.fail(f"the scan outputs have different row counts {sorted(rows)}")


def _scan(f, attrs, bodies, own, outs) -> None:
    b = bodies["body"]
    ins, res = b["input_types"], b["types"]
    m = attrs.get("num_scan_inputs")
    if not isinstance(m, int) or not 0 < m <= len(ins) or len(own) != len(ins):
        raise f.fail(f"num_scan_inputs {m!r} does not fit a body of {len(ins)} inputs "
                     f"and a step of {len(own)}")
    n_state = len(ins) - m
    if len(res) < n_state or len(outs) > len(res):
        raise f.fail(f"the body gives {len(res)} outputs, the step has {len(outs)}")
    lists = {k: attrs.get(k) for k in ("scan_input_axes", "scan_input_directions",
                                       "scan_output_axes", "scan_output_directions")}
    want = {"scan_input_axes": m, "scan_input_directions": m,
            "scan_output_axes": len(res) - n_state, "scan_output_directions": len(res) - n_state}
    for k, v in lists.items():
        if not isinstance(v, list) or len(v) != want[k] or \
                not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise f["attrs"].fail(f"{k} is not a list of {want[k]} integers")
    for k in range(n_state):
        _same(f, own[k], ins[k], f"state {k} and the body's input")
        _same(f, res[k], ins[k], f"state {k}'s body input and output")
        if k < len(outs):
            _same(f, outs[k], ins[k], f"output {k} and state {k}")
    lengths = set()
    for k in range(m):
        x, axis, row = own[n_state + k], lists["scan_input_axes"][k], ins[n_state + k]
        _axis_rows(f, x, axis, row, f"scan input {k}", lengths)
    for k, y in enumerate(outs[n_state:]):
        if y is not None:
            _axis_rows(f, y, lists["scan_output_axes"][k], res[n_state + k],
                       f"scan output {k}", lengths)
    if len(lengths) > 1 or (m and not lengths):
        raise f.fail(f"the scan lengths {sorted(lengths)} differ")


def _axis_rows(f, t, axis, row, what, lengths) -> None:
    """``t`` along ``axis`` is rows of type ``row``; its length into ``lengths``."""
    rank = len(t[1])
    if not -rank <= axis < rank:
        raise f.fail(f"{what}'s axis {axis} is outside its rank {rank}")
    axis %= rank
    rest = t[1][:axis] + t[1][axis + 1:]
    if (t[0], tuple(rest)) != (row[0], tuple(row[1])):
        raise f.fail(f"{what} is {t[0]}{list(t[1])}, its slices along axis {axis} are not "
                     f"the body's {row[0]}{list(row[1])}")
    lengths.add(t[1][axis])
