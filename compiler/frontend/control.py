"""Canonical forms of ONNX's control flow (If, Loop, Scan) and recurrent layers (LSTM, GRU,
RNN); canonical.py lists them in its table.

Control flow: each subgraph is imported as a body (``ctx.import_body``: the outer scope
visible, its inputs typed from the node's inputs); the enclosing values the bodies read
become the node's last inputs, the same ``outer`` list in every body of the node (ir.py).

- If: inputs ``(cond, *captured)``, attributes ``then_branch``, ``else_branch``. An If
  whose condition is known while importing (shape tests, constants) becomes the nodes of
  its taken branch; the other branch is not imported (it may not even be valid for these
  shapes, as exporters' shape-dependent branches often are not).
- Loop: inputs ``(M or "", cond or "", *initial carried values, *captured)``, ``body``.
  Scan outputs need a compile-time trip count and a body that cannot stop early.
- Scan: explicit ``num_scan_inputs``, ``scan_input_directions``, ``scan_output_directions``
  and non-negative ``scan_input_axes``, ``scan_output_axes`` (one per scan input/output).
- LSTM, GRU, RNN: explicit ``direction``, ``hidden_size``, ``layout``, ``clip`` (None for
  none), ``activations`` for every direction with one ``activation_alpha`` and
  ``activation_beta`` each (onnxruntime's defaults filled in: graph/ops_recurrent.py),
  LSTM's ``input_forget``, GRU's ``linear_before_reset``.
"""

from __future__ import annotations

from collections import ChainMap
from dataclasses import replace

import numpy as np

from ..graph.ir import Graph, Node, NodeError
from ..graph.ops_control import body_input_types, static_trip_count, unbuilt_branch
from ..graph.passes import inline_branch
from ..graph.ops_recurrent import ACTIVATIONS, DEFAULT_ACTIVATIONS, GATES

__all__ = ["CONTROL_CANONICALIZE"]


def _axis(node, axis, rank, what):
    if not -rank <= axis < max(rank, 1):
        raise NodeError(node, f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _graph_attr(node, key):
    """A subgraph attribute (an onnx GraphProto), required."""
    g = node.attrs.get(key)
    if g is None or not hasattr(g, "node"):
        raise NodeError(node, f"attribute {key} (a graph) is required")
    return g


def _share_outer(ctx, bodies: list[Graph]) -> tuple[list[Graph], tuple[str, ...]]:
    """The bodies with one ``outer`` list (the union, in order of first reading) and the
    enclosing names it passes. A body that does not read an outer value but defines a value
    of that name itself gets a fresh parameter name (binding is by position)."""
    union = tuple(dict.fromkeys(o for b in bodies for o in b.outer))
    shared = []
    for b in bodies:
        params, types = [], dict(b.types)
        for o in union:
            name = o
            if o not in b.outer:
                while name in types:
                    name += "/outer"
                types[name] = ctx.types[o]
            params.append(name)
        shared.append(replace(b, outer=tuple(params), types=types))
    return shared, union


def _input_types(ctx, inputs):
    return [ctx.types[i] if i else None for i in inputs]


def _if(ctx, node):
    protos = {key: _graph_attr(node, key) for key in ("then_branch", "else_branch")}
    cond = ctx.values.get(node.inputs[0])
    if cond is not None:
        key = "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"
        (branch,), captured = _share_outer(
            ctx, [ctx.import_body(protos[key], [], f"{node.name}/{key}")])
        holder = Node("If", (node.inputs[0], *captured), node.outputs, {key: branch},
                      node.name)
        # Names in scope, and the If's outputs (typed only after this), are taken.
        taken = ChainMap({o: None for o in node.outputs if o}, ctx.types)
        constants: dict = {}
        nodes = inline_branch(holder, branch, constants, taken)
        for name, a in constants.items():
            ctx.add_constant(name, a)
        return nodes
    then_b, else_b = _run_time_branches(ctx, node, protos)
    (then_b, else_b), captured = _share_outer(ctx, [then_b, else_b])
    return [Node("If", (node.inputs[0], *captured), node.outputs,
                 {"then_branch": then_b, "else_branch": else_b}, node.name)]


def _run_time_branches(ctx, node, protos) -> list[Graph]:
    """Both branches of an If whose condition is only known at run time. A branch that does
    not fit the shapes being built for (a NodeError while typing it: exporters keep code
    for other input sizes behind such conditions) becomes a body that raises that error
    when taken, as onnxruntime fails only then; if neither fits, the model does not."""
    branches, errors = [], {}
    for key in ("then_branch", "else_branch"):
        try:
            branches.append(ctx.import_body(protos[key], [], f"{node.name}/{key}"))
        except NodeError as e:
            branches.append(None)
            errors[key] = e
    if len(errors) == 2:
        raise errors["then_branch"]
    for k, key in enumerate(("then_branch", "else_branch")):
        if key in errors:
            other = branches[1 - k]
            cond = node.inputs[0]
            message = (f"node {node.name!r} (If): its {key}, taken when the condition "
                       f"{cond!r} is {key == 'then_branch'}, does not fit the input shapes "
                       f"this model was built for ({errors[key]}); feed inputs that select "
                       f"the other branch, or build for input shapes that fit this one")
            branches[k] = unbuilt_branch(f"{node.name}/{key}", cond, ctx.types[cond],
                                         [other.types[o] for o in other.outputs], message)
    return branches


def _loop(ctx, node):
    proto = _graph_attr(node, "body")
    inputs = (tuple(node.inputs) + ("", ""))[:max(2, len(node.inputs))]
    if len(inputs) != len(proto.input):
        raise NodeError(node, f"its body takes {len(proto.input)} inputs (iteration, "
                              f"condition, carried values), the node passes {len(inputs)}")
    if not all(inputs[2:]):
        raise NodeError(node, "every initial carried value is required (an input is empty)")
    types = body_input_types("Loop", {}, _input_types(ctx, inputs))
    (body,), captured = _share_outer(ctx, [ctx.import_body(proto, types, f"{node.name}/body")])
    n_state = len(body.inputs) - 2
    if len(body.outputs) > 1 + n_state:  # scan outputs: their length must be static
        has_cond = bool(inputs[1])
        if static_trip_count(body, ctx.values.get(inputs[0]) if inputs[0] else None,
                             ctx.values.get(inputs[1]) if has_cond else None,
                             has_cond) is None:
            # Name the run-time inputs that decide it (the backend binds them), else the body.
            ctx.value(Node("Loop", inputs, node.outputs, {}, node.name), 0, "trip count")
            if has_cond:
                ctx.value(Node("Loop", inputs, node.outputs, {}, node.name), 1, "condition")
    return [Node("Loop", (*inputs, *captured), node.outputs, {"body": body}, node.name)]


def _scan(ctx, node):
    a = node.attrs
    if "num_scan_inputs" not in a:
        raise NodeError(node, "num_scan_inputs is required")
    m = a["num_scan_inputs"]
    n_state = len(node.inputs) - m
    if not 0 < m <= len(node.inputs):
        raise NodeError(node, f"num_scan_inputs {m} does not fit its {len(node.inputs)} "
                              "inputs")
    if not all(node.inputs):
        raise NodeError(node, "every state and scan input is required (an input is empty)")
    in_types = _input_types(ctx, node.inputs)
    in_axes = [_axis(node, x, len(t.shape), "scan input axis") for x, t in
               zip(a.get("scan_input_axes", [0] * m), in_types[n_state:])]
    in_dirs = list(a.get("scan_input_directions", [0] * m))
    if len(in_axes) != m or len(in_dirs) != m:
        raise NodeError(node, f"scan_input_axes and scan_input_directions need {m} entries")
    attrs = {"num_scan_inputs": m, "scan_input_directions": in_dirs,
             "scan_input_axes": in_axes}
    types = body_input_types("Scan", attrs, in_types)
    (body,), captured = _share_outer(ctx, [ctx.import_body(_graph_attr(node, "body"), types,
                                                           f"{node.name}/body")])
    k = len(body.outputs) - n_state
    out_types = [body.types[o] for o in body.outputs[n_state:]]
    out_axes = [_axis(node, x, len(t.shape) + 1, "scan output axis") for x, t in
                zip(a.get("scan_output_axes", [0] * k), out_types)]
    out_dirs = list(a.get("scan_output_directions", [0] * k))
    if len(out_axes) != k or len(out_dirs) != k:
        raise NodeError(node, f"scan_output_axes and scan_output_directions need {k} entries")
    attrs.update(scan_output_directions=out_dirs, scan_output_axes=out_axes, body=body)
    return [Node("Scan", (*node.inputs, *captured), node.outputs, attrs, node.name)]


def _activations(node, dirs):
    """Activation names (canonical spelling) with one alpha and beta each, consumed from
    the attribute lists in order by the functions that take them (onnxruntime's rule)."""
    per = len(DEFAULT_ACTIVATIONS[node.op])
    names = list(node.attrs.get("activations") or DEFAULT_ACTIVATIONS[node.op] * dirs)
    if len(names) == per and dirs == 2:
        names = names * 2
    if len(names) != per * dirs:
        raise NodeError(node, f"{len(names)} activations; {node.op} takes {per} per direction")
    spelled = {k.lower(): k for k in ACTIVATIONS}
    alphas = list(node.attrs.get("activation_alpha", []))
    betas = list(node.attrs.get("activation_beta", []))
    out, out_a, out_b = [], [], []
    for name in names:
        canon = spelled.get(str(name).lower())
        if canon is None:
            raise NodeError(node, f"activation {name!r} is not one of {sorted(ACTIVATIONS)}")
        _, takes_a, takes_b, alpha, beta = ACTIVATIONS[canon]
        if takes_a and alphas:
            alpha = alphas.pop(0)
        if takes_b and betas:
            beta = betas.pop(0)
        out.append(canon)
        out_a.append(float(alpha))
        out_b.append(float(beta))
    return {"activations": out, "activation_alpha": out_a, "activation_beta": out_b}


def _recurrent(ctx, node):
    a = node.attrs
    direction = a.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise NodeError(node, f"direction {direction!r} is not forward, reverse or "
                              "bidirectional")
    dirs = 2 if direction == "bidirectional" else 1
    if len(node.inputs) < 3 or not all(node.inputs[:3]):
        raise NodeError(node, "X, W and R are required")
    r = ctx.types[node.inputs[2]]
    hidden = a.get("hidden_size") or (r.shape[-1] if r.shape else 0)
    layout = a.get("layout", 0)
    if layout not in (0, 1):
        raise NodeError(node, f"layout {layout} is not 0 or 1")
    attrs = {"direction": direction, "hidden_size": int(hidden), "layout": layout,
             "clip": None if a.get("clip") is None else float(a["clip"]),
             **_activations(node, dirs)}
    if node.op == "LSTM":
        attrs["input_forget"] = int(a.get("input_forget", 0))
    if node.op == "GRU":
        attrs["linear_before_reset"] = int(a.get("linear_before_reset", 0))
    inputs = list(node.inputs)
    while inputs and not inputs[-1]:
        inputs.pop()
    return [Node(node.op, tuple(inputs), node.outputs, attrs, node.name)]


CONTROL_CANONICALIZE = {"If": _if, "Loop": _loop, "Scan": _scan,
                        **{op: _recurrent for op in GATES}}
