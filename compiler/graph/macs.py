"""Multiply-adds: the model's own, and the two figures every report builds on them.

A node's *real* multiply-adds (``node_macs``) are the model's own, counted on the graph's
shapes with no padding of any kind:

- a convolution: N x Hout x Wout x Cout x (Cin / groups) x kh x kw (1-D and 3-D alike:
  the output's elements times the weight's elements per output channel);
- a Gemm / MatMul (and QGemm, QMatMul): M x N x K, batch dimensions included;
- ConvTranspose: every input element meets Cout / groups x kernel weights;
- LSTM / GRU / RNN (and their quantized forms): gates x hidden x (input + hidden) per step, batch and direction.

- a Loop/Scan/If: its bodies' multiply-adds per run of the node (``body_parts``: a Loop's
  body times its trip count, a Scan's times its sequence length, an If's larger branch).

Every other node has none (pooling, element-wise, data movement).

The accelerator's GEMM core does more: channels are padded to BLOCK, dense rows to whole
BATCH groups, group convolutions run block-diagonal tiles. The GEMM core's own count
(``gemm_macs``: GEMM micro-ops x BATCH x BLOCK x BLOCK, the executors' ``macs`` counter)
includes all of that. The figures:

- ``utilization`` = real multiply-adds / (cycles x MACs per cycle): the share of the
  accelerator's peak spent on the model's own work;
- ``padding_overhead`` = gemm_macs / real multiply-adds - 1: the work the GEMM core does on
  padding, relative to the real work (0: none; 4.33 for a 3-channel stem padded to 16).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["node_macs", "body_parts", "utilization", "padding_overhead"]


def _recurrent_macs(node, types) -> int:
    """MACs of an LSTM/GRU/RNN: gates x hidden x (input + hidden) per step and direction."""
    x = types[node.inputs[0]].shape
    hidden = int(node.attrs.get("hidden_size") or 0)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[node.op.removeprefix("Q")]
    directions = 2 if node.attrs.get("direction") == "bidirectional" else 1
    return int(x[0] * x[1] * directions * gates * hidden * (x[2] + hidden))


def body_parts(node, types, initializers=None) -> list[tuple[int, object, str]]:
    """(multiply-adds, body node, path) of every node with multiply-adds inside a control-flow
    node's bodies, per run of the node: a Loop's body times its trip count (its M, or the
    length of its scan outputs), a Scan's times its sequence length, an If's branch with the
    most multiply-adds (one branch runs)."""
    from .ir import Graph, captured_inputs

    bodies = [(k, v) for k, v in node.attrs.items() if isinstance(v, Graph)]
    if not bodies:
        return []
    inits = initializers or {}
    times = 1
    if node.op == "Loop":
        m = node.inputs[0] if node.inputs else ""
        body = bodies[0][1]
        n_state = len(node.inputs) - 2 - len(captured_inputs(node))
        scans = node.outputs[n_state:]
        if m and m in inits:
            times = int(np.asarray(inits[m]))
        elif scans and scans[0] in types and types[scans[0]].shape[0] is not None:
            times = int(types[scans[0]].shape[0])
    elif node.op == "Scan":
        n_scan = int(node.attrs.get("num_scan_inputs", 0))
        own = len(node.inputs) - len(captured_inputs(node))
        first = node.inputs[own - n_scan] if n_scan else ""
        axis = (node.attrs.get("scan_input_axes") or [0])[0]
        if first in types and types[first].shape[axis] is not None:
            times = int(types[first].shape[axis])
    per_body = []
    for attr, body in bodies:
        parts = []
        for n in body.nodes:
            m = node_macs(n, body.types, body.initializers)
            if not m:
                continue
            inner = body_parts(n, body.types, body.initializers)
            if inner:
                parts += [(c, b, f"{node.name}/{attr}/{p}") for c, b, p in inner]
            else:
                parts.append((m, n, f"{node.name}/{attr}/{n.name}"))
        per_body.append(parts)
    if node.op == "If":
        per_body = [max(per_body, key=lambda ps: sum(c for c, _, _ in ps))]
    return [(c * times, b, p) for parts in per_body for c, b, p in parts]


def node_macs(node, types, initializers=None) -> int:
    """Multiply-adds of one node of a float or quantized graph (0 for the others); a
    control-flow node's are its bodies' (``body_parts``)."""
    op = node.op
    if op in ("If", "Loop", "Scan"):
        return sum(c for c, _, _ in body_parts(node, types, initializers))
    if not node.outputs or node.outputs[0] not in types:
        return 0
    out = types[node.outputs[0]].shape
    if op in ("Conv", "QConv", "ConvTranspose", "QConvWide"):
        w = types[node.inputs[1]].shape
        if op == "ConvTranspose":  # every input element meets C_out/group x kernel weights
            return int(math.prod(types[node.inputs[0]].shape) * math.prod(w[1:]))
        return int(math.prod(out) * math.prod(w[1:]))
    if op in ("Gemm", "QGemm", "MatMul", "QMatMul", "QMatMulWide"):
        a = types[node.inputs[0]].shape
        k = a[0] if op == "Gemm" and node.attrs.get("transA") else a[-1]
        return int(math.prod(out) * k)
    if op in ("LSTM", "GRU", "RNN", "QLSTM", "QGRU", "QRNN"):
        return _recurrent_macs(node, types)
    return 0


def utilization(macs: int, cycles: int | None, macs_per_cycle: int) -> float | None:
    """Real multiply-adds over cycles x MACs per cycle (None when untimed: no cycles)."""
    if not cycles:
        return None
    return macs / (cycles * macs_per_cycle)


def padding_overhead(gemm_macs: int, macs: int) -> float | None:
    """The GEMM core's multiply-adds over the real ones, minus 1 (None with no real ones)."""
    if not macs:
        return None
    return gemm_macs / macs - 1.0
