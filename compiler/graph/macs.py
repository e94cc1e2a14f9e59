"""Multiply-adds: the model's own, and the two figures every report builds on them.

A node's *real* multiply-adds (``node_macs``) are the model's own, counted on the graph's
shapes with no padding of any kind:

- a convolution: N x Hout x Wout x Cout x (Cin / groups) x kh x kw (1-D and 3-D alike:
  the output's elements times the weight's elements per output channel);
- a Gemm / MatMul (and QGemm, QMatMul): M x N x K, batch dimensions included;
- ConvTranspose: every input element meets Cout / groups x kernel weights;
- LSTM / GRU / RNN: gates x hidden x (input + hidden) per step, batch and direction.

Every other node has none (pooling, element-wise, data movement). Bodies of Loop/If are not
counted.

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

__all__ = ["node_macs", "utilization", "padding_overhead"]


def _recurrent_macs(node, types) -> int:
    """MACs of an LSTM/GRU/RNN: gates x hidden x (input + hidden) per step and direction."""
    x = types[node.inputs[0]].shape
    hidden = int(node.attrs.get("hidden_size") or 0)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[node.op]
    directions = 2 if node.attrs.get("direction") == "bidirectional" else 1
    return int(x[0] * x[1] * directions * gates * hidden * (x[2] + hidden))


def node_macs(node, types) -> int:
    """Real multiply-adds of one node of a float or quantized graph (0 for the others);
    ``types``: value name -> TensorType (``graph.types``)."""
    op = node.op
    if not node.outputs or node.outputs[0] not in types:
        return 0
    out = types[node.outputs[0]].shape
    if op in ("Conv", "QConv", "ConvTranspose"):
        w = types[node.inputs[1]].shape
        if op == "ConvTranspose":  # every input element meets C_out/group x kernel weights
            return int(math.prod(types[node.inputs[0]].shape) * math.prod(w[1:]))
        return int(math.prod(out) * math.prod(w[1:]))
    if op in ("Gemm", "QGemm", "MatMul", "QMatMul"):
        a = types[node.inputs[0]].shape
        k = a[0] if op == "Gemm" and node.attrs.get("transA") else a[-1]
        return int(math.prod(out) * k)
    if op in ("LSTM", "GRU", "RNN"):
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
