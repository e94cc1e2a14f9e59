"""The graph IR: a model as a list of operator nodes over named tensors of known rank.

Import (``import_onnx``, in onnx_import.py) gives a :class:`Graph`; passes (graph_passes.py,
``optimize``) rewrite it Graph -> Graph; ``celosia.compiler.graph.ops.run_graph`` executes it
on numpy arrays and is the definition of each operator's meaning.

- Operators keep their ONNX names and attributes (plain Python values: int, float, str,
  lists of them, numpy arrays for tensor attributes). The importer makes the attributes
  explicit where a backend would otherwise have to repeat ONNX's rules: Conv and pooling get
  ``kernel_shape``, ``strides``, ``dilations`` and explicit ``pads`` (no ``auto_pad``), axes
  are non-negative, opset-11 Softmax is rewritten to the opset-13 form.
- Every value has a :class:`TensorType` (numpy dtype name + shape); a dim is an int, or
  None where the size is only known at run time (downstream of a node whose output shape
  depends on values: dynamic.py). Inputs and initializers are static; initializers are
  read-only numpy arrays. A missing optional input is the empty name "".
- A node may hold graphs in its attributes (If's ``then_branch``/``else_branch``, Loop's and
  Scan's ``body``): a *body* reads its own inputs and, by name, values of the enclosing
  graph, listed in its ``outer``. The node passes those values explicitly: its inputs are
  its own (ONNX) inputs followed by one input per ``outer`` name, bound by position (every
  body of a node has the same ``outer``). So readers, liveness and renaming need no special
  case: a value read only inside a body is an input of the node that holds the body.
- A fused node carries ``epilogue``: a tuple of steps applied in order to its (single)
  output, each ``(op, *args)``: ("Relu",), ("Clip", lo, hi), ("LeakyRelu", alpha),
  ("HardSigmoid", alpha, beta), ("HardSwish",), ("Sigmoid",), and ("Add", i) / ("Mul", i)
  with the node's input number i (a bias or a residual, broadcast to the output).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from celosia.errors import CompilerError

__all__ = ["TensorType", "Node", "Graph", "print_graph", "print_node", "verify_graph", "GraphError",
           "subgraphs", "captured_inputs", "own_inputs", "map_subgraphs",
           "ModelLoadError", "UnsupportedOpsetError", "UnsupportedOperatorError",
           "DynamicShapeError", "InputShapeError", "NodeError", "EPILOGUE_UNARY",
           "EPILOGUE_BINARY"]

# Epilogue steps: element-wise ops a Conv/Gemm/MatMul may apply to its output in place.
# SiLU (x * sigmoid(x)) has no ONNX operator of its own: fuse_epilogues finds it as a
# Sigmoid and a Mul that both read the output.
EPILOGUE_UNARY = ("Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid", "SiLU",
                  "Gelu")
EPILOGUE_BINARY = ("Add", "Mul")


# ---- errors a user can cause ---------------------------------------------------------------


class GraphError(CompilerError):
    """A model the graph compiler cannot take: says what, where and what to do."""


class ModelLoadError(GraphError):
    """The file is missing, truncated or not an ONNX model."""


class UnsupportedOpsetError(GraphError):
    """The model's default-domain opset is outside what the importer handles."""


class UnsupportedOperatorError(GraphError):
    """Every node the importer has no implementation for, in one message grouped by
    operator (how many, the first few node names), with what to do."""

    SHOWN = 3  # node names shown per operator

    def __init__(self, nodes: list[tuple[str, str, str]]):
        self.nodes = nodes  # (node name, op type, detail)
        groups: dict[tuple[str, str], list[str]] = {}
        for name, op, detail in nodes:
            groups.setdefault((op, detail), []).append(name)
        parts = []
        for (op, detail), names in groups.items():
            shown = ", ".join(map(repr, names[:self.SHOWN]))
            more = f" and {len(names) - self.SHOWN} more" if len(names) > self.SHOWN else ""
            what = f"{op} ({detail})" if detail else op
            parts.append(f"{what}: {len(names)} node{'s' if len(names) > 1 else ''} "
                         f"({shown}{more})")
        super().__init__(
            f"{len(nodes)} unsupported node{'s' if len(nodes) > 1 else ''}: "
            f"{'; '.join(parts)}. celosia takes the operators listed in "
            f"celosia.compiler.frontend.onnx.SUPPORTED_OPS (docs/graph.md): re-export the "
            f"model without these operators (e.g. another opset or exporter option), or "
            f"file an issue naming them")


class DynamicShapeError(GraphError):
    """A shape the importer needs and cannot know: a dynamic input not given (names the
    input and a shape that imports), or a rank only known at run time (names the node)."""


class InputShapeError(GraphError):
    """An input given at run time does not match the graph's input type."""


class NodeError(GraphError):
    """A node whose attributes or input shapes are invalid."""

    def __init__(self, node: "Node", message: str):
        self.node = node
        super().__init__(f"node {node.name!r} ({node.op}): {message}")


# ---- the IR --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorType:
    """A numpy dtype name and a shape: a tuple of sizes, None for a size only known at run
    time (the rank is always known)."""

    dtype: str
    shape: tuple[int | None, ...]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join('?' if d is None else str(d) for d in self.shape)}]"

    @property
    def static(self) -> bool:
        """Whether every size is known before run time."""
        return None not in self.shape

    @property
    def size(self) -> int | None:
        """Elements, None when a size is only known at run time."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.static else None


@dataclass(frozen=True)
class Node:
    """One operator: ``op`` (ONNX op type), input and output value names, attributes."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict = field(default_factory=dict, hash=False, compare=False)
    name: str = ""

    def attr(self, key: str, default=None):
        return self.attrs.get(key, default)

    def with_attrs(self, **changes) -> "Node":
        return replace(self, attrs={**self.attrs, **changes})


@dataclass(frozen=True)
class Graph:
    """Nodes in a topological order, typed values, and constant tensors (initializers).

    ``types`` holds a type for every value: inputs, initializers and node outputs. A body
    (a graph held by a node's attribute) also reads the enclosing graph's values named in
    ``outer``, typed in ``types`` too; a model's top graph has none.
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    initializers: dict = field(hash=False, compare=False)
    types: dict = field(hash=False, compare=False)
    outer: tuple[str, ...] = ()

    def __str__(self) -> str:
        return print_graph(self)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    users.setdefault(i, []).append(n)
        return users

    def is_constant(self, value: str) -> bool:
        return value in self.initializers

    def with_nodes(self, nodes, initializers=None, types=None) -> "Graph":
        """A graph with other nodes (and initializers/types); values no one uses are kept
        until ``remove_dead_code``."""
        return replace(self, nodes=tuple(nodes),
                       initializers=self.initializers if initializers is None else initializers,
                       types=self.types if types is None else types)


def subgraphs(node: Node) -> list[tuple[str, Graph]]:
    """The (attribute name, graph) pairs of a node's bodies, in attribute order."""
    return [(k, v) for k, v in node.attrs.items() if isinstance(v, Graph)]


def captured_inputs(node: Node) -> tuple[str, ...]:
    """The inputs that pass a node's bodies their ``outer`` values (its last ones)."""
    bodies = subgraphs(node)
    n = len(bodies[0][1].outer) if bodies else 0
    return node.inputs[len(node.inputs) - n:] if n else ()


def own_inputs(node: Node) -> tuple[str, ...]:
    """A node's ONNX inputs, without the values passed to its bodies."""
    return node.inputs[:len(node.inputs) - len(captured_inputs(node))]


def map_subgraphs(node: Node, fn) -> Node:
    """The node with each body ``g`` replaced by ``fn(g)`` (the node itself without bodies)."""
    bodies = subgraphs(node)
    if not bodies:
        return node
    return node.with_attrs(**{k: fn(g) for k, g in bodies})


def constant(array) -> np.ndarray:
    """A read-only copy of an array, as initializers are stored."""
    a = np.array(array, copy=True)
    a.setflags(write=False)
    return a


# ---- printer ---------------------------------------------------------------------------------


def _attr_str(value) -> str:
    if isinstance(value, np.ndarray):
        return _array_str(value)
    if isinstance(value, float):
        return str(np.float32(value))  # shortest text that reads back as the same float32
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_attr_str(v) for v in value) + "]"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _array_str(a: np.ndarray) -> str:
    t = f"{a.dtype}[{','.join(map(str, a.shape))}]"
    if a.size <= 8:
        text = np.array2string(a.reshape(-1), separator=",", precision=6,
                               max_line_width=1 << 20)
        return f"{t} {text.replace(' ', '')}"
    return t


def _epilogue_str(steps, inputs) -> str:
    parts = []
    for op, *args in steps:
        if op in EPILOGUE_BINARY:
            parts.append(f"{op}(%{inputs[args[0]]})")
        elif args:
            parts.append(f"{op}({','.join(_attr_str(a) for a in args)})")
        else:
            parts.append(op)
    return "[" + ", ".join(parts) + "]"


def print_node(node: Node, types: dict) -> str:
    """One line; a node with bodies is followed by each body, indented, as
    ``attribute = graph ...``."""
    outs = ", ".join(f"%{o}" if o else "_" for o in node.outputs)
    args = ", ".join(f"%{i}" if i else "_" for i in node.inputs)
    attrs = ", ".join(
        f"{k}={_epilogue_str(v, node.inputs) if k == 'epilogue' else _attr_str(v)}"
        for k, v in node.attrs.items() if not isinstance(v, Graph))
    result = ", ".join(str(types[o]) if o in types else "?" for o in node.outputs if o)
    line = f"{outs} = {node.op}({args})" + (f" {{{attrs}}}" if attrs else "") + f" : {result}"
    for key, body in subgraphs(node):
        line += "\n" + _indent(f"{key} = {print_graph(body)}")
    return line


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.split("\n"))


def print_graph(graph: Graph) -> str:
    """One line per value or node; used in tests and error reports. A body's header lists
    its ``outer`` values after its inputs."""
    params = ", ".join(f"%{i}: {graph.types[i]}" for i in graph.inputs)
    if graph.outer:
        outer = "outer " + ", ".join(f"%{o}: {graph.types[o]}" for o in graph.outer)
        params = f"{params}; {outer}" if params else outer
    lines = [f"graph {graph.name}({params}) {{"]
    for name, a in graph.initializers.items():
        lines.append(f"  %{name} = const {_array_str(a)}")
    lines += [_indent(print_node(n, graph.types)) for n in graph.nodes]
    lines.append("  return " + ", ".join(f"%{o}" for o in graph.outputs))
    lines.append("}")
    return "\n".join(lines)


# ---- verifier --------------------------------------------------------------------------------


def verify_graph(graph: Graph) -> None:
    """Check single assignment, definition before use, a well-formed type for every value
    (sizes non-negative or None), and that initializers agree with their types; the same in
    every body, whose ``outer`` values its node passes with types that agree. Raises
    GraphError naming the first problem."""

    defined = set(graph.inputs) | set(graph.outer)
    if len(defined) != len(graph.inputs) + len(graph.outer):
        raise GraphError(f"graph {graph.name!r}: an input or outer value is named twice")
    for o in graph.outer:
        if o not in graph.types:
            raise GraphError(f"graph {graph.name!r}: outer value {o!r} has no type")
    for name, a in graph.initializers.items():
        if name in defined:
            raise GraphError(f"value {name!r} is both an input and an initializer")
        t = graph.types.get(name)
        if t is None or t.shape != a.shape or t.dtype != str(a.dtype):
            raise GraphError(f"initializer {name!r} is {a.dtype}{list(a.shape)} but typed {t}")
        defined.add(name)
    for i in graph.inputs:
        if i not in graph.types:
            raise GraphError(f"input {i!r} has no type")
    for name, t in graph.types.items():
        if not all(d is None or (isinstance(d, (int, np.integer)) and d >= 0)
                   for d in t.shape):
            raise GraphError(f"value {name!r} has the type {t}: sizes are non-negative "
                             "integers, or None when only known at run time")
    for node in graph.nodes:
        for i in node.inputs:
            if i and i not in defined:
                raise GraphError(f"node {node.name!r} ({node.op}) reads {i!r} before it is "
                                 "defined")
        for o in node.outputs:
            if not o:
                continue
            if o in defined:
                raise GraphError(f"node {node.name!r} ({node.op}) redefines {o!r}")
            if o not in graph.types:
                raise GraphError(f"node {node.name!r} ({node.op}) output {o!r} has no type")
            defined.add(o)
        for step in node.attrs.get("epilogue", ()):
            if step[0] in EPILOGUE_BINARY and not 0 <= step[1] < len(node.inputs):
                raise GraphError(f"node {node.name!r} epilogue {step} names no input")
        _verify_bodies(node, graph.types)
    for o in graph.outputs:
        if o not in defined:
            raise GraphError(f"graph output {o!r} is never defined")


def _verify_bodies(node: Node, types: dict) -> None:
    bodies = subgraphs(node)
    if not bodies:
        return
    captured = captured_inputs(node)
    for key, body in bodies:
        if len(body.outer) != len(captured) or len(body.outer) > len(node.inputs):
            raise GraphError(f"node {node.name!r} ({node.op}): its {key} reads "
                             f"{len(body.outer)} outer values, the node passes "
                             f"{len(captured)}; every body of a node has the same outer list")
        for name, value in zip(body.outer, captured):
            if value in types and body.types[name] != types[value]:
                raise GraphError(f"node {node.name!r} ({node.op}): its {key} reads {name!r} "
                                 f"as {body.types[name]}, the node passes {value!r} of type "
                                 f"{types[value]}")
        verify_graph(body)
