"""Compiled control flow: If, Loop and Scan whose bodies are CPU programs of their own.

A body (an If branch, a Loop or Scan body) is lowered with the same CPU lowering as a main
graph: its own steps (compiled kernels, views, numpy steps for what has no kernel) over its
own values, which the executor places in an arena of the body's own, bound once. One
iteration is then the body's bound calls and a few copies (the carried values into the
body's inputs, the scan outputs into their row of the node's output): no numpy evaluation
of the body's graph and no allocation per iteration (runtime/control.py runs it).

The outer values a body reads come in two kinds. A constant of the enclosing program (the
weights of an RNN cell) becomes a constant of the body before it is optimized, so the
body's MatMul packs its weights and fuses its bias like any other; a run-time value is an
``outer`` name of the body program, bound at run time to the enclosing program's array
(no copy). The step::

    {"kind": "control", "op": "Loop" | "Scan" | "If", "node": ...,
     "inputs": [own inputs..., captured run-time values...], "outputs": [...],
     "attrs": {the node's attributes but its bodies},
     "bodies": {attribute: {"inputs": [...], "outer": [...], "outputs": [...],
                            "values": {...}, "steps": [...]}}}

``outer`` is the same list for every body of a node and pairs, in order, with the step's
last inputs. A body's constants live in the program's ``constants`` under names prefixed
with the node's and the attribute's (``loop/body/W@dense16``).

Before a Loop body is lowered, its input projections are hoisted out of the loop
(control_hoist.py: ``MatMul(Gather(x, iteration), W)`` becomes a Gather of ``x @ W``,
computed once by the enclosing program).

A node stays a numpy step (graph/ops_control.py, run node by node) when its bodies cannot
be compiled: a value whose size is only known at run time or changes between iterations
(the importer types those with None), a value with no elements, or a Loop's scan output
with no row count known at build time. ``CpuProgram.control`` records the path each
control-flow node took and why.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph.ir import Graph, Node, captured_inputs, subgraphs
from .control_hoist import hoist_projections, lower_hoisted
from .rewrites import before_lowering

__all__ = ["CONTROL_OPS", "lower_control", "control_fallback_reason"]

CONTROL_OPS = ("If", "Loop", "Scan")
# Bodies nest (a Loop in an If in a Loop): deeper than this stays numpy.
MAX_NESTING = 16


def control_fallback_reason(lowering, node: Node) -> str | None:
    """Why a control-flow node cannot be compiled by the checks the lowering makes before
    its handler (None when it can be tried)."""
    types = [lowering.type(v) for v in node.inputs + node.outputs if v]
    if not all(t.static for t in types):
        return "a value it reads or writes has a size only known at run time"
    if any(0 in t.shape for t in types):
        return "a value it reads or writes has no elements"
    return None


def lower_control(lowering, node: Node) -> bool:
    """Lower If/Loop/Scan ``node`` into a ``control`` step of ``lowering`` (a
    lowering._Lowering); False (and the reason recorded) when a body cannot be compiled."""
    depth = getattr(lowering, "depth", 0)
    captured = captured_inputs(node)
    runtime_outer = [(name, value) for name, value in
                     zip(subgraphs(node)[0][1].outer, captured) if not lowering.is_const(value)]
    bodies, reason = {}, None
    if depth >= MAX_NESTING:
        reason = f"bodies nest deeper than {MAX_NESTING} levels"
    wide = _integer_products(node)
    if wide:
        reason = (f"its bodies hold integer products ({wide}: graph/qbody.py), run node by "
                  f"node as the accelerator build runs them, so the two builds agree bit "
                  f"for bit")
    for key, body in subgraphs(node):
        if reason:
            break
        got = _lower_body(lowering, node, key, body, captured, depth)
        if isinstance(got, str):
            reason = f"{key}: {got}"
        else:
            got["prefix"] = f"{node.name}/{key}/"
            bodies[key] = got
    if reason is None and node.op == "Loop":
        reason = _loop_shapes(lowering, node, bodies["body"])
    if reason is not None:
        lowering.control.append({"node": node.name, "op": node.op, "path": "numpy",
                                 "why": reason})
        return False
    n_own = len(node.inputs) - len(captured)
    inputs = [lowering.plain(v) if v else "" for v in node.inputs[:n_own]]
    inputs += [lowering.plain(value) for _, value in runtime_outer]
    for body in bodies.values():  # (a Loop's one body: its outer list grows by these)
        inputs += [value for _, value in lower_hoisted(lowering, body.pop("hoisted"))]
    outputs = [lowering.produce(o, 0) if o else "" for o in node.outputs]
    attrs = {k: v for k, v in node.attrs.items() if not isinstance(v, Graph)}
    for body in bodies.values():
        _merge(lowering, body.pop("program"), body)
    lowering.step("control", node, inputs, outputs, attrs=attrs, bodies=bodies)
    steps = sum(len(b["steps"]) for b in bodies.values())
    kernels = sum(s["kind"] == "kernel" for b in bodies.values() for s in b["steps"])
    lowering.control.append({"node": node.name, "op": node.op, "path": "compiled",
                             "body_steps": steps, "body_kernel_steps": kernels})
    return True


def _integer_products(node: Node) -> str | None:
    """The first integer-product node (QMatMulWide, QLSTM, QGRU, QRNN) in ``node``'s bodies,
    or None."""
    for _, body in subgraphs(node):
        for n in body.nodes:
            if n.op in ("QMatMulWide", "QConvWide", "QLSTM", "QGRU", "QRNN"):
                return f"{n.op} {n.name!r}"
            inner = _integer_products(n) if subgraphs(n) else None
            if inner:
                return inner
    return None


def _lower_body(lowering, node: Node, key: str, body: Graph, captured, depth: int):
    """{"program": CpuProgram, "inputs", "outer", "outputs"} of one body, or a reason."""
    from ..graph.passes import optimize

    consts = {name: lowering.const(value) for name, value in zip(body.outer, captured)
              if lowering.is_const(value)}
    outer = tuple(name for name, value in zip(body.outer, captured)
                  if not lowering.is_const(value))
    g = replace(body, initializers={**body.initializers, **consts}, outer=outer)
    hoisted = []
    if node.op == "Loop":  # x_t @ W of every iteration as one product before the loop
        g, hoisted = hoist_projections(g, lowering, node, {
            name: value for name, value in zip(body.outer, captured) if name in outer})
    try:  # with its weights constant now, a body's MatMul fuses its bias like any other
        g = optimize(g)
    except Exception as e:  # noqa: BLE001 - a pass that cannot take this body: keep it
        return f"optimizing the body failed ({type(e).__name__}: {e})"
    if not all(t.static for t in g.types.values()):
        return "a body value has a size only known at run time or one that changes"
    if any(0 in g.types[v].shape for v in g.types):
        return "a body value has no elements"
    # lowering.py's _Lowering (which imports this module), after the main graph's
    # pre-lowering rewrite (lower_graph): Silero's If branch is 1-D convolutions.
    sub = type(lowering)(before_lowering(g), lowering.int8_form or "none")
    sub.depth = depth + 1
    for v in g.outer:
        sub.produce(v, 0)
    program = sub.run()
    lowering.control.extend(sub.control)
    return {"program": program, "inputs": list(g.inputs), "outer": list(g.outer),
            "outputs": list(program.outputs), "hoisted": hoisted}


def _loop_shapes(lowering, node: Node, body: dict) -> str | None:
    """Why a Loop's compiled body does not fit its node (None if it does): every carried
    value keeps its type (the importer checked) and each scan output has a row per
    iteration."""
    values = body["program"].values
    n_state = len(body["inputs"]) - 2
    outs = body["outputs"]
    for k, o in enumerate(node.outputs[n_state:]):
        if o:
            row = values[outs[1 + n_state + k]]
            t = lowering.type(o)
            if tuple(t.shape[1:]) != tuple(row["shape"]) or t.dtype != row["dtype"]:
                return f"scan output {k} is {t}, its body gives {row}"
    return None


def _merge(lowering, program, body: dict) -> None:
    """The body program's kernels and constants into the enclosing lowering's (constants
    renamed under the body's prefix); its values and steps into ``body``."""
    prefix = body.pop("prefix")
    rename = {}
    for name, array in program.constants.items():
        new = f"{prefix}{name}"
        while new in lowering.constants and lowering.constants[new] is not array:
            new += "'"
        rename[name] = new
        lowering.constants[new] = array
    lowering.specs.update(program.specs)
    body["values"] = program.values
    body["steps"] = _renamed(program.steps, rename)
    body["outputs"] = [rename.get(o, o) for o in body["outputs"]]


def _renamed(steps: list, rename: dict) -> list:
    """Steps reading constants by their new names (nested bodies too)."""
    out = []
    for s in steps:
        s = dict(s, inputs=[rename.get(v, v) for v in s["inputs"]])
        if s["kind"] == "control":
            s["bodies"] = {k: dict(b, steps=_renamed(b["steps"], rename),
                                   outputs=[rename.get(o, o) for o in b["outputs"]])
                           for k, b in s["bodies"].items()}
        out.append(s)
    return out
