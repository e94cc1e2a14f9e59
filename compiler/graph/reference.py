"""The reference executor of the graph IR: every node run by its numpy definition.

``run_graph`` executes a :class:`~celosia.compiler.graph.ir.Graph` on numpy arrays; it is the
correctness oracle of the compiled backends and the fallback for nodes they do not take.
Constant folding and shape inference evaluate nodes with the same kernels
(``evaluate_node``, ``infer_node``), so the three cannot disagree. Kernels come from ops.py
(ONNX operators), ops_recurrent.py (LSTM, GRU, RNN), ops_control.py (If, Loop, Scan: their
bodies run here, by ``run_body``), qops.py (celosia's quantized operators) and dynamic.py
(nodes whose shape inputs are only known at run time). A graph may have sizes only known at
run time (None in a type): the kernels take any shape, and ``run_graph`` checks each such
node's results against the sizes its type does promise.
"""

from __future__ import annotations

import warnings

import numpy as np

from .dynamic import RUNTIME_TYPES, UNKNOWN_DIM_TYPES, is_runtime_form, runtime_kernel
from .ir import (DynamicShapeError, Graph, InputShapeError, Node, NodeError, TensorType,
                 captured_inputs)
from .ops import KERNELS, OWN_INPUTS, SHAPE_RULES, Lazy, clip, hard_sigmoid, sigmoid
from .ops_control import BRANCH_KERNELS, BRANCH_SHAPE_RULES, CONTROL_KERNELS, CONTROL_TYPE_RULES
from .ops_nn import gelu
from .ops_random import NONDETERMINISTIC, stream
from .ops_recurrent import RECURRENT_KERNELS, RECURRENT_SHAPE_RULES
from .qops import QUANTIZED_KERNELS, QUANTIZED_SHAPE_RULES
from .qrecurrent import Q_RECURRENT_KERNELS, Q_RECURRENT_SHAPE_RULES
from .qwide import QWIDE_KERNELS, QWIDE_OWN_INPUTS, QWIDE_SHAPE_RULES

# celosia's quantized operators: qops.py's, the recurrent layers of qrecurrent.py and the
# 16-bit products of qwide.py
_QUANTIZED = {**QUANTIZED_KERNELS, **Q_RECURRENT_KERNELS, **QWIDE_KERNELS}
_QUANTIZED_RULES = {**QUANTIZED_SHAPE_RULES, **Q_RECURRENT_SHAPE_RULES, **QWIDE_SHAPE_RULES}
_OWN_INPUTS = {**OWN_INPUTS, **QWIDE_OWN_INPUTS}

__all__ = ["OPERATORS", "run_graph", "run_body", "evaluate_node", "infer_node", "apply_epilogue", "stand_in", "fits",
           "check_result", "KERNEL_ERRORS"]

# Every operator this executor runs: ONNX operators, recurrent layers, control flow and
# celosia's quantized operators, and the stand-in for an If branch that cannot run
# (what a saved model's steps may name).
OPERATORS = frozenset(KERNELS) | frozenset(RECURRENT_KERNELS) | frozenset(CONTROL_KERNELS) \
    | frozenset(_QUANTIZED) | frozenset(BRANCH_KERNELS)

# What a kernel raises on values it cannot take (an index out of range, a Range of step 0,
# a size too large for memory): reported as a NodeError naming the node.
KERNEL_ERRORS = (ValueError, IndexError, TypeError, ZeroDivisionError, MemoryError)


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
        elif op == "SiLU":
            y = y * sigmoid(y).astype(y.dtype)
        elif op == "Gelu":  # exact (Erf) GELU, found spelt out by fuse_epilogues
            y = gelu({}, y)
        else:
            raise ValueError(f"unknown epilogue step {op}")
    return y


def _kernel(node: Node):
    """The kernel of a node: its run-time form's (dynamic.py), an ONNX operator's, a
    recurrent layer's, or one of celosia's quantized operators (qops.py; they are not ONNX
    operators, so not in KERNELS)."""
    if is_runtime_form(node):
        return runtime_kernel(node.op)
    kernel = KERNELS.get(node.op) or RECURRENT_KERNELS.get(node.op) \
        or BRANCH_KERNELS.get(node.op)
    return kernel if kernel is not None else _QUANTIZED[node.op]


def evaluate_node(node: Node, inputs: list) -> tuple:
    """Run one node on numpy arrays (None for a missing optional input). A node with
    bodies (If, Loop, Scan) gets its captured values as its last inputs, like any other."""
    epilogue = node.attrs.get("epilogue")
    own = inputs[:_OWN_INPUTS[node.op]] if epilogue else inputs
    with np.errstate(all="ignore"):
        control = CONTROL_KERNELS.get(node.op)
        if control is not None:
            n = len(inputs) - len(captured_inputs(node))
            result = control(node.attrs, run_body, list(inputs[:n]), list(inputs[n:]))
        elif node.op in NONDETERMINISTIC:  # draws from this node's own Generator
            result = _kernel(node)(node.attrs, *own, rng=stream(node))
        else:
            result = _kernel(node)(node.attrs, *own)
        results = result if isinstance(result, tuple) else (result,)
        if epilogue:
            results = (apply_epilogue(results[0], epilogue, inputs),) + results[1:]
    return tuple(np.asarray(r.fn() if isinstance(r, Lazy) else r)
                 for r in results[:len(node.outputs)])


def fits(shape, t: TensorType) -> bool:
    """Whether an array's shape is one of a type's (None matches any size)."""
    return len(shape) == len(t.shape) and all(d is None or d == s
                                              for d, s in zip(t.shape, shape))


def run_graph(graph: Graph, feeds: dict) -> dict:
    """Execute the graph: ``feeds`` maps each input name to an array of its type; returns
    {output name: array}."""
    env = dict(graph.initializers)
    for name in graph.inputs:
        if name not in feeds:
            raise InputShapeError(f"input {name!r} ({graph.types[name]}) was not given")
        a = np.asarray(feeds[name])
        t = graph.types[name]
        if not fits(a.shape, t) or str(a.dtype) != t.dtype:
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
    types = graph.types
    for k, node in enumerate(graph.nodes):
        try:
            results = evaluate_node(node, [env[i] if i else None for i in node.inputs])
        except KERNEL_ERRORS as e:  # e.g. a Gather index out of range
            raise NodeError(node, f"failed at run time: {e}") from None
        run_time_shaped = not all(types[v].static for v in node.inputs + node.outputs if v)
        for name, value in zip(node.outputs, results):
            if name:
                if run_time_shaped:
                    check_result(node, name, value, types[name])
                env[name] = value
        for i in node.inputs:
            if i and last_use.get(i) == k and i not in keep:
                env.pop(i, None)


def check_result(node: Node, name: str, value: np.ndarray, t: TensorType) -> None:
    """A run-time-shaped node's result against the sizes its type promises."""
    if not fits(value.shape, t) or str(value.dtype) != t.dtype:
        raise NodeError(node, f"gives {name!r} as {value.dtype}"
                              f"[{','.join(map(str, value.shape))}] at run time, where the "
                              f"graph types it {t} (its inputs' sizes do not fit each other)")


def stand_in(t: TensorType) -> np.ndarray:
    """Zeros of a type, without memory (a zero-stride view)."""
    return np.broadcast_to(np.zeros((), t.dtype), t.shape)


def infer_node(node: Node, types: list, values: list) -> list[TensorType]:
    """Output types of a node from its input types; ``values`` holds the arrays of inputs
    known at compile time (None otherwise). Compute-heavy ops have a shape rule; the others
    run their kernel on zero-stride stand-ins, so shape and kernel always agree. A node in
    run-time form, or with inputs of sizes only known at run time, gets None for each size
    it cannot promise (dynamic.py)."""
    if node.op in CONTROL_TYPE_RULES:  # from the bodies' types
        return CONTROL_TYPE_RULES[node.op](node, types, values)
    if is_runtime_form(node):
        rule = RUNTIME_TYPES.get(node.op)
        if rule is None:
            raise DynamicShapeError(f"node {node.name!r} ({node.op}): its output shape "
                                    "depends on values only known at run time, which "
                                    f"celosia cannot type for {node.op} yet")
        return rule(node, types, values)
    if all(t is None or t.static for t in types):
        return _infer_static(node, types, values)
    rule = UNKNOWN_DIM_TYPES.get(node.op)
    if rule is not None:
        return rule(node, types, values)
    return _infer_by_substitution(node, types, values)


def _infer_static(node: Node, types: list, values: list) -> list[TensorType]:
    rule = SHAPE_RULES.get(node.op) or RECURRENT_SHAPE_RULES.get(node.op) \
        or BRANCH_SHAPE_RULES.get(node.op)
    if rule is None and node.op not in KERNELS:
        rule = _QUANTIZED_RULES.get(node.op)
    if rule is not None:  # an epilogue keeps the output's type
        return rule(node, types)
    inputs = [v if v is not None else (None if t is None else stand_in(t))
              for v, t in zip(values, types)]
    try:
        results = evaluate_node(node, inputs)
    except KERNEL_ERRORS as e:
        shown = ", ".join(str(t) if t else "_" for t in types)
        raise NodeError(node, f"invalid for inputs ({shown}): {e}") from None
    return [TensorType(str(r.dtype), tuple(int(d) for d in r.shape)) for r in results]


# Sizes standing in for unknown ones: 0 and 1 catch the sizes that only look fixed (a
# slice [:1] of an empty tensor has 0 rows; 1 broadcasts), 2 and 3 the ones that grow.
_SUBSTITUTES = (0, 1, 2, 3)


def _infer_by_substitution(node: Node, types: list, values: list) -> list[TensorType]:
    """Run the static inference with every unknown size replaced by each of _SUBSTITUTES:
    a size is promised when at least two substitutions succeed and all that succeed agree
    on it; otherwise it is unknown (None). Rank and dtype must agree."""
    runs, first_error = [], None
    for s in _SUBSTITUTES:
        concrete = [None if t is None else
                    TensorType(t.dtype, tuple(s if d is None else d for d in t.shape))
                    for t in types]
        try:
            with warnings.catch_warnings():  # a mean of 0 elements, ...: only sizes matter
                warnings.simplefilter("ignore")
                runs.append(_infer_static(node, concrete, values))
        except NodeError as e:
            first_error = first_error or e
    if not runs:
        raise first_error
    out = []
    for k, t in enumerate(runs[0]):
        seen = [run[k] for run in runs]
        if any(len(u.shape) != len(t.shape) for u in seen):
            raise DynamicShapeError(
                f"node {node.name!r} ({node.op}): the rank of its output depends on sizes "
                f"only known at run time (inputs "
                f"{', '.join(str(t) if t else '_' for t in types)}); celosia needs the rank")
        dims = tuple(d if len(runs) > 1 and all(u.shape[i] == d for u in seen) else None
                     for i, d in enumerate(t.shape))
        out.append(TensorType(t.dtype, dims))
    return out
