"""CPU nodes computed in place on the accelerator's packed layout.

An element-wise int8 node (``QLut``, and ``QAdd``/``QMul`` of two operands of the output's
shape) that the accelerator cannot run (a table lookup: the ALU has no gather, ISA.md's ALU
ops are MIN, MAX, ADD, SHR, MUL) but whose operands the accelerator made does not need
them in the CPU's NCHW layout: it computes the same function of every element in any
order. Such a node runs on the CPU *in place*: the runtime reads its operands' packed bytes
from DRAM as they are, the CPU kernel computes on them as flat int8 arrays (a CPU segment
built for those flat types), and the result goes back to DRAM in the same packed layout.
Nothing is unpacked or packed; its output is a DRAM value like an accelerator node's, so
the accelerator nodes after it read it where it is and the ALU nodes and views after it
stay on the accelerator (``partition.annotate``).

Padding: the packed layout pads channels to BLOCK (and a [N, C] value's rows, ``dense_rows``).
An element-wise node computes garbage there (a table maps the 0 of a padding channel to
``table[128]``, Sigmoid's 0.5). Nothing reads it into a real output: a convolution's or
dense layer's weights for padding input channels are zero, a depthwise convolution, pooling
and element-wise nodes keep padding channels to themselves, a Concat's inputs other than
the last have no padding, and unpacking drops it (tests/runtime/test_accel_inplace.py runs
such tables between accelerator nodes against the all-CPU build).

Conditions (``in_place_problem``): an int8 node of ``IN_PLACE_OPS`` on the CPU, of static
shape, every operand of the output's shape (so one packed layout for all) and made in DRAM
by an accelerator node or another in-place node, not a view's output (a view's packed bytes
are its root's, of another shape), and no operand or output in a QMatMul's "matrices"
layout.
"""

from __future__ import annotations

from ..graph.ir import Graph, Node
from .partition import dram_reads, value_layouts

__all__ = ["IN_PLACE_OPS", "in_place_problem", "packed_nodes", "in_dram"]

IN_PLACE_OPS = ("QLut", "QAdd", "QMul")


def in_dram(value: str, producer: dict, placements: dict, packed) -> bool:
    """Whether ``value`` is made in DRAM: by an accelerator node or an in-place node."""
    p = producer.get(value)
    return p is not None and (placements[p.name].target == "accel" or p.name in packed)


def in_place_problem(node: Node, graph: Graph, producer: dict, placements: dict,
                     packed, layouts: dict | None = None) -> str | None:
    """Why a CPU node does not run in place on the packed layout (None: it does). ``packed``:
    the in-place nodes before it; ``layouts``: partition.value_layouts, when known."""
    from .partition import ALIAS_OPS

    if node.op not in IN_PLACE_OPS or placements[node.name].target != "cpu":
        return f"{node.op} is not an element-wise int8 node"
    if len(node.outputs) != 1 or not node.outputs[0]:
        return "it has not one output"
    y = graph.types.get(node.outputs[0])
    reads = dram_reads(node)
    if y is None or y.dtype != "int8" or not y.static or len(y.shape) not in (2, 3, 4):
        return f"its output is {y}, not a static 2-D, 3-D or 4-D int8 value"
    if node.op == "QLut" and (len(node.inputs) < 2 or node.inputs[1] not in graph.initializers):
        return "its table is computed at run time"
    for v in reads:
        if graph.types[v].shape != y.shape or graph.types[v].dtype != "int8":
            return f"its operand {v!r} ({graph.types[v]}) is not of the output's type {y}"
        if not in_dram(v, producer, placements, packed):
            return f"its operand {v!r} is not made in DRAM"
        if producer[v].op in ALIAS_OPS:
            return f"its operand {v!r} is a view (its packed bytes are another value's)"
    if layouts is not None and any(layouts.get(v) == "matrices"
                                   for v in (*reads, node.outputs[0])):
        return "a value of it is in a QMatMul's matrices layout"
    return None


def packed_nodes(graph: Graph, placements: dict) -> set[str]:
    """The CPU nodes that run in place on the packed layout (module doc), in one pass in
    graph order."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    layouts = value_layouts(graph, placements)
    packed: set[str] = set()
    for node in graph.nodes:
        if node.op in IN_PLACE_OPS and placements[node.name].target == "cpu" and \
                in_place_problem(node, graph, producer, placements, packed, layouts) is None:
            packed.add(node.name)
    return packed
