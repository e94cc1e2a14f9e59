"""numpy definitions of ONNX's control flow: If, Loop and Scan, whose bodies are graphs.

A body is a :class:`~celosia.compiler.graph.ir.Graph` held by an attribute; the node's last
inputs pass the body's ``outer`` values (ir.py). The kernels here say what the operators
mean (which body runs, how often, what is carried and what is stacked) and leave running a
body to the executor: each kernel is ``fn(attrs, run, inputs, captured)`` where ``inputs``
are the node's own inputs (None where missing), ``captured`` the values of its ``outer``
inputs, and ``run(body, args, captured) -> list of arrays`` executes a body (reference.py
passes its ``run_body``; graph/ holds no cycle between the executor and these definitions).

``CONTROL_TYPE_RULES`` give the output types from the bodies' types; ``body_input_types``
the types a body's inputs have, which the importer needs before it can type the body.

Static shapes: every value keeps one shape from one iteration to the next. An If whose
condition is known only at run time needs branches of the same output types; a Loop's
scan outputs need a trip count known at compile time (``static_trip_count``).
"""

from __future__ import annotations

import numpy as np

from .ir import DynamicShapeError, Graph, InputShapeError, Node, NodeError, TensorType

__all__ = ["CONTROL_KERNELS", "CONTROL_TYPE_RULES", "CONTROL_OPS", "body_input_types",
           "static_trip_count", "UNBUILT_BRANCH", "BRANCH_KERNELS", "BRANCH_SHAPE_RULES",
           "unbuilt_branch"]

_INT64, _BOOL = TensorType("int64", ()), TensorType("bool", ())


def _scalar(a) -> np.generic:
    """The single element of a condition or trip count (a scalar or a one-element tensor)."""
    a = np.asarray(a)
    if a.size != 1:
        raise ValueError(f"expected a single element, got shape {list(a.shape)}")
    return a.reshape(-1)[0]


def _empty_stack(t: TensorType, axis: int) -> np.ndarray:
    """The stacked scan output of no iterations."""
    shape = list(t.shape)
    shape.insert(axis, 0)
    return np.zeros(shape, t.dtype)


# ---- kernels ---------------------------------------------------------------------------------


def if_(attrs, run, inputs, captured):
    branch = attrs["then_branch"] if bool(_scalar(inputs[0])) else attrs["else_branch"]
    return tuple(run(branch, [], captured))


def loop(attrs, run, inputs, captured):
    """ONNX Loop, as onnxruntime runs it: the body's condition output is honoured even when
    the node has no condition input."""
    body: Graph = attrs["body"]
    trip, cond, *state = inputs
    n_state = len(body.inputs) - 2
    trip = None if trip is None else int(_scalar(trip))
    go = True if cond is None else bool(_scalar(cond))
    stacks: list[list] = [[] for _ in body.outputs[1 + n_state:]]
    i = 0
    while go and (trip is None or i < trip):
        out = run(body, [np.array(i, np.int64), np.array(go), *state], captured)
        go = bool(_scalar(out[0]))
        state = out[1:1 + n_state]
        for stack, v in zip(stacks, out[1 + n_state:]):
            stack.append(v)
        i += 1
    scans = [np.stack(s) if s else _empty_stack(body.types[o], 0)
             for s, o in zip(stacks, body.outputs[1 + n_state:])]
    return (*state, *scans)


def scan(attrs, run, inputs, captured):
    """ONNX Scan (opset 9 on): states carried, scan inputs sliced along their axes (in
    reverse where their direction is 1), scan outputs stacked along theirs (last iteration
    first where their direction is 1)."""
    body: Graph = attrs["body"]
    m = attrs["num_scan_inputs"]
    n_state = len(inputs) - m
    state, xs = list(inputs[:n_state]), inputs[n_state:]
    axes, directions = attrs["scan_input_axes"], attrs["scan_input_directions"]
    length = xs[0].shape[axes[0]]
    stacks: list[list] = [[] for _ in body.outputs[n_state:]]
    for t in range(length):
        slices = [np.take(x, length - 1 - t if d else t, axis=a)
                  for x, a, d in zip(xs, axes, directions)]
        out = run(body, state + slices, captured)
        state = out[:n_state]
        for stack, v in zip(stacks, out[n_state:]):
            stack.append(v)
    scans = []
    for stack, o, axis, d in zip(stacks, body.outputs[n_state:], attrs["scan_output_axes"],
                                 attrs["scan_output_directions"]):
        if not stack:
            scans.append(_empty_stack(body.types[o], axis))
            continue
        scans.append(np.stack(stack[::-1] if d else stack, axis=axis))
    return (*state, *scans)


CONTROL_KERNELS = {
    "If": if_,       # then_branch or else_branch by a one-element bool condition
    "Loop": loop,    # (trip count, condition, carried...) -> (carried..., stacked scans...)
    "Scan": scan,    # (states..., sequences...) -> (states..., stacked scans...)
}
CONTROL_OPS = tuple(CONTROL_KERNELS)


# ---- a branch that cannot run for the shapes built for ---------------------------------------

# Exporters put code for other input sizes in branches chosen at run time (Silero VAD's
# 8 kHz branch on 16 kHz-sized audio gives an LSTM a 5-D input). onnxruntime fails only if
# such a branch runs, so the importer keeps the model and makes the branch this one node,
# not an ONNX operator: it reads the condition (so nothing folds it while the condition is
# unknown) and raises the importer's error when it runs.
UNBUILT_BRANCH = "UnbuiltBranch"


def _unbuilt_branch(attrs, cond):
    raise InputShapeError(attrs["message"])


def _unbuilt_types(node, types):
    return [TensorType(dtype, tuple(shape)) for dtype, shape in node.attrs["types"]]


BRANCH_KERNELS = {UNBUILT_BRANCH: _unbuilt_branch}
BRANCH_SHAPE_RULES = {UNBUILT_BRANCH: _unbuilt_types}


def unbuilt_branch(name: str, cond: str, cond_type: TensorType, types: list[TensorType],
                   message: str) -> Graph:
    """A body for an If branch that raises ``message`` (an InputShapeError) when taken,
    typed like the other branch (``types``) so the If keeps static types."""
    outputs = [f"{name}/output_{k}" for k in range(len(types))]
    attrs = {"message": message, "types": [[t.dtype, list(t.shape)] for t in types]}
    node = Node(UNBUILT_BRANCH, (cond,), tuple(outputs), attrs, f"{name}/unbuilt")
    return Graph(name, (), tuple(outputs), (node,), {},
                 {cond: cond_type, **dict(zip(outputs, types))}, (cond,))


# ---- types -----------------------------------------------------------------------------------


def body_input_types(op: str, attrs: dict, input_types: list) -> list[TensorType]:
    """The types of a body's inputs from the node's own input types (None where missing):
    Loop's body takes the iteration number, the condition and the carried values; Scan's
    the states and one slice of each scan input; If's branches take none."""
    if op == "If":
        return []
    if op == "Loop":
        return [_INT64, _BOOL, *input_types[2:]]
    m = attrs["num_scan_inputs"]
    n_state = len(input_types) - m
    slices = []
    for t, axis in zip(input_types[n_state:], attrs["scan_input_axes"]):
        slices.append(TensorType(t.dtype, t.shape[:axis] + t.shape[axis + 1:]))
    return [*input_types[:n_state], *slices]


def _out_types(body: Graph) -> list[TensorType]:
    return [body.types[o] for o in body.outputs]


def _if_types(node, types, values):
    then_t, else_t = _out_types(node.attrs["then_branch"]), _out_types(node.attrs["else_branch"])
    if not len(then_t) == len(else_t) == len(node.outputs):
        raise NodeError(node, f"its branches give {len(then_t)} and {len(else_t)} outputs, "
                              f"the node has {len(node.outputs)}")
    if values and values[0] is not None:  # the taken branch alone decides
        return then_t if bool(_scalar(values[0])) else else_t
    for k, (a, b) in enumerate(zip(then_t, else_t)):
        if a.dtype != b.dtype:
            raise NodeError(node, f"output {k} is {a} in then_branch but {b} in else_branch: "
                                  "both branches must give the same element types")
        if a.shape != b.shape:
            raise DynamicShapeError(
                f"node {node.name!r} (If): output {k} is {a} in then_branch but {b} in "
                "else_branch and the condition is only known at run time, so its shape is "
                "not static; celosia compiles If only when both branches give the same "
                "shapes (run-time shaped branches are not supported yet): make the "
                "condition a constant or bind the inputs it depends on")
    return then_t


def static_trip_count(body: Graph, trip, cond, has_cond: bool) -> int | None:
    """How many times a Loop runs, when that is known at compile time: the trip count
    ``trip`` is known (None if not) and the body cannot stop early (its condition output
    is a constant, or the condition input passed through, possibly via Identity nodes);
    ``cond`` is the known initial condition (None if unknown or ``has_cond`` is False)."""
    if trip is None:
        return None
    producers = {o: n for n in body.nodes for o in n.outputs if o}
    c = body.outputs[0]
    while c in producers and producers[c].op == "Identity":
        c = producers[c].inputs[0]
    if c in body.initializers:
        stays = bool(_scalar(body.initializers[c]))
    elif c == body.inputs[1]:
        stays = True  # passes the incoming condition on
    else:
        return None
    if not has_cond:
        first = True
    elif cond is None:
        return None
    else:
        first = bool(_scalar(cond))
    if not first:
        return 0
    return int(_scalar(trip)) if stays else min(1, int(_scalar(trip)))


def _loop_types(node, types, values):
    body: Graph = node.attrs["body"]
    own = len(body.inputs)
    n_state = own - 2
    outs = _out_types(body)
    if len(outs) < 1 + n_state:
        raise NodeError(node, f"its body gives {len(outs)} outputs, fewer than the condition "
                              f"and {n_state} carried values")
    for k in range(n_state):
        before, after = types[2 + k], outs[1 + k]
        if before != after:
            raise DynamicShapeError(
                f"node {node.name!r} (Loop): carried value {k} ({node.inputs[2 + k]!r}) is "
                f"{before} before the loop but the body makes it {after}; celosia compiles "
                "static shapes, so a carried value must keep its type in every iteration")
    scans = outs[1 + n_state:]
    if len(node.outputs) > len(outs) - 1:
        raise NodeError(node, f"the node has {len(node.outputs)} outputs, its body gives "
                              f"{n_state} carried values and {len(scans)} scan outputs")
    if scans:
        has_cond = len(node.inputs) > 1 and bool(node.inputs[1])
        n = static_trip_count(body, values[0], values[1] if has_cond else None, has_cond)
        if n is None:
            raise DynamicShapeError(
                f"node {node.name!r} (Loop): its scan outputs have one row per iteration, "
                "and the number of iterations is only known at run time; celosia compiles "
                "static shapes: give the loop a constant trip count and a condition that "
                "stays true, or bind the inputs they depend on")
        scans = [TensorType(t.dtype, (n, *t.shape)) for t in scans]
    return [*outs[1:1 + n_state], *scans][:len(node.outputs)]


def _scan_types(node, types, values):
    body: Graph = node.attrs["body"]
    a = node.attrs
    m = a["num_scan_inputs"]
    n_state = len(body.inputs) - m
    lengths = {types[n_state + k].shape[axis] for k, axis in enumerate(a["scan_input_axes"])}
    if len(lengths) > 1:
        raise NodeError(node, f"its scan inputs have different lengths {sorted(lengths)} "
                              "along their scan axes")
    length = lengths.pop() if lengths else 0
    outs = _out_types(body)
    result = list(outs[:n_state])
    for k, (before, after) in enumerate(zip(types[:n_state], result)):
        if before != after:
            raise DynamicShapeError(
                f"node {node.name!r} (Scan): state {k} is {before} before the scan but the "
                f"body makes it {after}; a state must keep its type in every iteration")
    for t, axis in zip(outs[n_state:], a["scan_output_axes"]):
        shape = list(t.shape)
        shape.insert(axis, length)
        result.append(TensorType(t.dtype, tuple(shape)))
    return result[:len(node.outputs)]


# rule(node, input types, known input values) -> output types
CONTROL_TYPE_RULES = {"If": _if_types, "Loop": _loop_types, "Scan": _scan_types}
