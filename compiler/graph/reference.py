"""The reference executor of the graph IR: every node run by its numpy definition.

``run_graph`` executes a :class:`~celosia.compiler.graph.ir.Graph` on numpy arrays; it is the
correctness oracle of the compiled backends and the fallback for nodes they do not take.
Constant folding and shape inference evaluate nodes with the same kernels
(``evaluate_node``, ``infer_node``), so the three cannot disagree. Kernels come from ops.py
(ONNX operators), ops_recurrent.py (LSTM, GRU, RNN), ops_control.py (If, Loop, Scan: their
bodies run here, by ``run_body``) and qops.py (celosia's quantized operators).
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, InputShapeError, Node, NodeError, TensorType, captured_inputs
from .ops import KERNELS, OWN_INPUTS, SHAPE_RULES, Lazy, clip, hard_sigmoid, sigmoid
from .ops_control import CONTROL_KERNELS, CONTROL_TYPE_RULES
from .ops_recurrent import RECURRENT_KERNELS, RECURRENT_SHAPE_RULES
from .qops import QUANTIZED_KERNELS, QUANTIZED_SHAPE_RULES

__all__ = ["run_graph", "run_body", "evaluate_node", "infer_node", "apply_epilogue",
           "stand_in"]


def apply_epilogue(y: np.ndarray, steps, inputs) -> np.ndarray:
    """Apply a fused node's epilogue (ir.py) to its output."""
    for op, *args in steps:
        if op == "Add":
            y = y + inputs[args[0]]
        elif op == "Mul":
            y = y * inputs[args[0]]
        elif op == "Relu":
            y = np.maximum(y, y.dtype.type(0))
        elif op == "Clip":
            y = clip({}, y, *(None if v is None else y.dtype.type(v) for v in args))
        elif op == "LeakyRelu":
            y = np.where(y < 0, y * y.dtype.type(args[0]), y)
        elif op == "HardSigmoid":
            y = hard_sigmoid(y, *args)
        elif op == "HardSwish":
            y = y * hard_sigmoid(y, 1 / 6, 0.5)
        elif op == "Sigmoid":
            y = sigmoid(y).astype(y.dtype)
        else:
            raise ValueError(f"unknown epilogue step {op}")
    return y


def _kernel(op: str):
    """The kernel of an ONNX operator, or of one of celosia's quantized operators
    (qops.py; they are not ONNX operators, so not in KERNELS)."""
    kernel = KERNELS.get(op) or RECURRENT_KERNELS.get(op)
    return kernel if kernel is not None else QUANTIZED_KERNELS[op]


def evaluate_node(node: Node, inputs: list) -> tuple:
    """Run one node on numpy arrays (None for a missing optional input). A node with
    bodies (If, Loop, Scan) gets its captured values as its last inputs, like any other."""
    epilogue = node.attrs.get("epilogue")
    own = inputs[:OWN_INPUTS[node.op]] if epilogue else inputs
    with np.errstate(all="ignore"):
        control = CONTROL_KERNELS.get(node.op)
        if control is not None:
            n = len(inputs) - len(captured_inputs(node))
            result = control(node.attrs, run_body, list(inputs[:n]), list(inputs[n:]))
        else:
            result = _kernel(node.op)(node.attrs, *own)
        results = result if isinstance(result, tuple) else (result,)
        if epilogue:
            results = (apply_epilogue(results[0], epilogue, inputs),) + results[1:]
    return tuple(np.asarray(r.fn() if isinstance(r, Lazy) else r)
                 for r in results[:len(node.outputs)])


def run_graph(graph: Graph, feeds: dict) -> dict:
    """Execute the graph: ``feeds`` maps each input name to an array of its type; returns
    {output name: array}."""
    env = dict(graph.initializers)
    for name in graph.inputs:
        if name not in feeds:
            raise InputShapeError(f"input {name!r} ({graph.types[name]}) was not given")
        a = np.asarray(feeds[name])
        t = graph.types[name]
        if tuple(a.shape) != t.shape or str(a.dtype) != t.dtype:
            raise InputShapeError(
                f"input {name!r} is {a.dtype}[{','.join(map(str, a.shape))}] but the graph was "
                f"built for {t}: pass an array of that shape and type, or import the model "
                "again with input_shapes (--input-shape) for the new shape")
        env[name] = a
    unknown = set(feeds) - set(graph.inputs)
    if unknown:
        raise InputShapeError(f"unknown inputs {sorted(unknown)}: the graph's inputs are "
                              f"{list(graph.inputs)}")
    _execute(graph, env)
    return {o: env[o] for o in graph.outputs}


def run_body(body: Graph, args: list, captured: list) -> list:
    """Run a body (ir.py) on its inputs ``args`` and the values of its ``outer`` names
    ``captured``; its outputs in order. Its node kernels type-check nothing: the importer
    typed the body from the values it is called with."""
    env = dict(body.initializers)
    env.update(zip(body.outer, captured))
    env.update(zip(body.inputs, args))
    _execute(body, env)
    return [env[o] for o in body.outputs]


def _execute(graph: Graph, env: dict) -> None:
    """Run the nodes in order on ``env`` (the inputs, outer values and initializers)."""
    # Free each value after its last reader so whole models stay within memory.
    last_use = {}
    for k, node in enumerate(graph.nodes):
        for i in node.inputs:
            last_use[i] = k
    keep = set(graph.outputs) | set(graph.initializers)
    for k, node in enumerate(graph.nodes):
        try:
            results = evaluate_node(node, [env[i] if i else None for i in node.inputs])
        except (ValueError, IndexError, TypeError) as e:  # e.g. a Gather index out of range
            raise NodeError(node, f"failed at run time: {e}") from None
        for name, value in zip(node.outputs, results):
            if name:
                env[name] = value
        for i in node.inputs:
            if i and last_use.get(i) == k and i not in keep:
                env.pop(i, None)


def stand_in(t: TensorType) -> np.ndarray:
    """Zeros of a type, without memory (a zero-stride view)."""
    return np.broadcast_to(np.zeros((), t.dtype), t.shape)


def infer_node(node: Node, types: list, values: list) -> list[TensorType]:
    """Output types of a node from its input types; ``values`` holds the arrays of inputs
    known at compile time (None otherwise). Compute-heavy ops have a shape rule; the others
    run their kernel on zero-stride stand-ins, so shape and kernel always agree."""
    if node.op in CONTROL_TYPE_RULES:  # from the bodies' types
        return CONTROL_TYPE_RULES[node.op](node, types, values)
    rule = SHAPE_RULES.get(node.op) or RECURRENT_SHAPE_RULES.get(node.op)
    if rule is None and node.op not in KERNELS:
        rule = QUANTIZED_SHAPE_RULES.get(node.op)
    if rule is not None:  # an epilogue keeps the output's type
        return rule(node, types)
    inputs = [v if v is not None else (None if t is None else stand_in(t))
              for v, t in zip(values, types)]
    try:
        results = evaluate_node(node, inputs)
    except (ValueError, IndexError, TypeError) as e:
        shown = ", ".join(str(t) if t else "_" for t in types)
        raise NodeError(node, f"invalid for inputs ({shown}): {e}") from None
    return [TensorType(str(r.dtype), tuple(int(d) for d in r.shape)) for r in results]
