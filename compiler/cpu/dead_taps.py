"""Kernel taps that only ever read padding, cut off before lowering.

A float convolution's padding is zeros, so a kernel row or column that lies in the padding
for every output position adds nothing. On small images such taps are most of the work:
ResNet-18 at 32x32 ends with 3x3 convolutions of 512 channels on a 1x1 image, where 8 of
the 9 taps read padding, yet the kernel multiplied all of them and read all 9.4 MB of
their weights per layer (0.1 ms each, a third of the network). ``prune_dead_taps``
crops such a Conv's kernel to its live rows and columns and its padding by as much:

    a tap t of an axis is dead when, for every output o, o * s + t * d - pad_begin falls
    outside [0, size); the dead taps are a run at each end of the axis; cutting a at the
    start and b at the end leaves pad_begin - a * d and pad_end - b * d, and the same
    output size.

Float32 Conv nodes of the CPU build only (2-D after ``conv1d_as_2d``, constant weights):
an int8 QConv's padding reads its zero point, not zero, and the int8 kernels skip padded
taps on their own.
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import Graph, Node, TensorType
from ..graph.residual import fresh_name, rewrite_nodes

__all__ = ["prune_dead_taps"]


def _live(size: int, out: int, k: int, s: int, d: int, pad: int) -> tuple[int, int]:
    """(first, last) live taps of one axis: taps that read the input for some output."""
    live = [t for t in range(k)
            if any(0 <= o * s + t * d - pad < size for o in range(out))]
    return (live[0], live[-1]) if live else (0, k - 1)


def _cut(node: Node, graph: Graph):
    """(first and last live taps per axis) of a float Conv whose kernel has dead taps at
    an end, or None."""
    if node.op != "Conv" or len(node.inputs) < 2 or node.inputs[1] not in graph.initializers:
        return None
    t, out = graph.types[node.inputs[0]], graph.types[node.outputs[0]]
    if t.dtype != "float32" or len(t.shape) != 4 or not t.static or not out.static:
        return None
    a = node.attrs
    kh, kw = a["kernel_shape"]
    spans = [_live(t.shape[2 + i], out.shape[2 + i], (kh, kw)[i], a["strides"][i],
                   a["dilations"][i], a["pads"][i]) for i in range(2)]
    if spans == [(0, kh - 1), (0, kw - 1)]:
        return None
    for i, (first, last) in enumerate(spans):
        k, d = (kh, kw)[i], a["dilations"][i]
        if a["pads"][i] - first * d < 0 or a["pads"][i + 2] - (k - 1 - last) * d < 0:
            return None
    return spans


def prune_dead_taps(graph: Graph) -> Graph:
    """The graph with each float Conv's always-padding kernel rows and columns cut off."""
    inits = dict(graph.initializers)

    def rewrite(node, types, taken):
        spans = _cut(node, graph)
        if spans is None:
            return None
        a, w = node.attrs, node.inputs[1]
        (h0, h1), (w0, w1) = spans
        name = f"{w}@taps{h0}{h1}{w0}{w1}"
        if name not in inits:  # (else cut so for another Conv of the same weights)
            weight = np.ascontiguousarray(np.asarray(inits[w])[:, :, h0:h1 + 1, w0:w1 + 1])
            name = fresh_name(name, taken)
            inits[name] = weight
            types[name] = TensorType(str(weight.dtype), weight.shape)
        (kh, kw), (dh, dw) = a["kernel_shape"], a["dilations"]
        p = list(a["pads"])
        pads = [p[0] - h0 * dh, p[1] - w0 * dw, p[2] - (kh - 1 - h1) * dh,
                p[3] - (kw - 1 - w1) * dw]
        attrs = {**a, "kernel_shape": [h1 - h0 + 1, w1 - w0 + 1], "pads": pads}
        return [Node("Conv", (node.inputs[0], name, *node.inputs[2:]), node.outputs, attrs,
                     node.name)]
    return rewrite_nodes(graph, rewrite, inits)
