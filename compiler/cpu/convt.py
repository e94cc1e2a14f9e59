"""Transposed convolutions of stride 1 as ordinary convolutions, before lowering.

With every stride 1 (a vocoder's or a decoder's last layer, a "deconvolution" that only
mixes), ConvTranspose is a Conv of the same input with the kernel flipped along every
spatial axis, its two channel axes swapped, and padding ``d * (k - 1) - p`` on each side:

    y[o, i] = sum over c, t of x[c, i + p - t d] w[c, o, t]
            = sum over c, t' of x[c, i - (d (k - 1) - p) + t' d] w[c, o, k - 1 - t']

so the CPU build runs it on the convolution kernels, with their padded output channels and
fused epilogues, instead of the transposed kernel's scalar code for a few output channels
(a 64 -> 1 layer of 7 taps over 8,000 samples took 8x onnxruntime's time). One group,
constant weights (and bias), no pad larger than the kernel's extent; others as they were.
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import Graph, Node, TensorType
from ..graph.residual import fresh_name, rewrite_nodes

__all__ = ["unit_stride_transposed_as_conv"]


def _unit_stride(node: Node, graph: Graph) -> bool:
    if node.op != "ConvTranspose" or len(node.inputs) < 2 or node.attrs.get("epilogue"):
        return False
    a = node.attrs
    w, b = node.inputs[1], (node.inputs[2] if len(node.inputs) > 2 else "")
    t = graph.types[node.inputs[0]]
    if t.dtype != "float32" or not t.static or w not in graph.initializers \
            or (b and b not in graph.initializers) or len(node.inputs) > 3:
        return False
    nd = len(t.shape) - 2
    extent = [(int(k) - 1) * int(d) for k, d in zip(a["kernel_shape"], a["dilations"])]
    return (a.get("group", 1) == 1 and all(int(s) == 1 for s in a["strides"])
            and not any(a.get("output_padding", [0] * nd))
            and all(0 <= int(a["pads"][i]) <= extent[i % nd] for i in range(2 * nd)))


def unit_stride_transposed_as_conv(graph: Graph) -> Graph:
    """The graph with every stride-1 ConvTranspose it can take made a Conv (docstring)."""
    inits = dict(graph.initializers)

    def rewrite(node, types, taken):
        if not _unit_stride(node, graph):
            return None
        a, w = node.attrs, node.inputs[1]
        weight = np.asarray(inits[w])
        nd = weight.ndim - 2
        flipped = np.ascontiguousarray(
            np.flip(weight, axis=tuple(range(2, 2 + nd))).swapaxes(0, 1))
        name = fresh_name(f"{w}@as_conv", taken)
        inits[name] = flipped
        types[name] = TensorType(str(flipped.dtype), flipped.shape)
        extent = [(int(k) - 1) * int(d) for k, d in zip(a["kernel_shape"], a["dilations"])]
        pads = [extent[i % nd] - int(p) for i, p in enumerate(a["pads"])]
        attrs = {"kernel_shape": list(a["kernel_shape"]), "strides": [1] * nd, "pads": pads,
                 "dilations": list(a["dilations"]), "group": 1}
        return [Node("Conv", (node.inputs[0], name, *node.inputs[2:]), node.outputs, attrs,
                     node.name)]
    return rewrite_nodes(graph, rewrite, inits)
