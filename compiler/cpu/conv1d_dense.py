"""A 1-D convolution with a long kernel and few output positions as one matrix product.

Silero VAD's STFT is a Conv of a [1, 1, 576] signal with 258 filters of 256 taps at stride
128: three output positions. As a 2-D convolution of height 1 (conv1d.py) its one input
channel and 258 (= 2 x 129) output channels leave the blocked kernel a 2-wide channel block:
50 us, half of the model's time. The same sums are a [3, 256] x [256, 258] product whose
rows are the three windows of the signal:

    Slice x[:, :, t*s : t*s + k] for each output position t     [N, C, k] each (copies)
    Concat along axis 1, Reshape [N, L_out, C*k]                the windows as rows
    MatMul with W reshaped [M, C*k] and transposed              [N, L_out, M] (dense kernel)
    Transpose [0, 2, 1]                                          [N, M, L_out]

``conv1d_as_dense`` rewrites a float32 Conv of a 3-D input with constant weights, one
group, no padding, no dilation, no bias nor fused epilogue, a kernel of at least
``MIN_TAPS`` taps and at most ``MAX_POSITIONS`` output positions (copying the windows
then costs less than the kernel's arithmetic; anything else stays for conv1d.py). The
sums are the same terms as the convolution's, in the dense kernel's order.
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import Graph, Node, TensorType

__all__ = ["conv1d_as_dense", "MIN_TAPS", "MAX_POSITIONS"]

MIN_TAPS = 32
MAX_POSITIONS = 16


def _fits(node: Node, graph: Graph) -> bool:
    if node.op != "Conv" or len(node.inputs) != 2 or node.attrs.get("epilogue"):
        return False
    x, w = node.inputs
    t, a = graph.types[x], node.attrs
    if len(t.shape) != 3 or t.dtype != "float32" or not t.static \
            or w not in graph.initializers:
        return False
    k = list(a.get("kernel_shape", ()))
    out = graph.types[node.outputs[0]].shape
    return (a.get("group", 1) == 1 and list(a.get("pads", [0, 0])) == [0, 0]
            and list(a.get("dilations", [1])) == [1] and len(k) == 1 and k[0] >= MIN_TAPS
            and np.asarray(graph.initializers[w]).shape[2:] == tuple(k)
            and len(out) == 3 and out[2] <= MAX_POSITIONS)


def conv1d_as_dense(graph: Graph) -> Graph:
    """The graph with each Conv that fits (see the module docstring) as a product."""
    if not any(_fits(n, graph) for n in graph.nodes):
        return graph
    inits, types = dict(graph.initializers), dict(graph.types)

    def fresh(base: str, t: TensorType) -> str:
        name = base
        while name in types or name in inits:
            name += "'"
        types[name] = t
        return name

    nodes: list[Node] = []
    for node in graph.nodes:
        if not _fits(node, graph):
            nodes.append(node)
            continue
        (x, w), y, where = node.inputs, node.outputs[0], node.name
        n, c, _ = graph.types[x].shape
        weight = np.asarray(graph.initializers[w], np.float32)
        m, k, s = weight.shape[0], weight.shape[2], node.attrs["strides"][0]
        positions = graph.types[y].shape[2]
        frames = []
        for p in range(positions):
            f = fresh(f"{y}@window{p}", TensorType("float32", (n, c, k)))
            nodes.append(Node("Slice", (x,), (f,), {"starts": [p * s], "ends": [p * s + k],
                                                    "axes": [2], "steps": [1]},
                              f"{where}/window{p}"))
            frames.append(f)
        rows = fresh(f"{y}@windows", TensorType("float32", (n, positions * c, k)))
        nodes.append(Node("Concat", tuple(frames), (rows,), {"axis": 1}, f"{where}/windows"))
        flat = fresh(f"{y}@rows", TensorType("float32", (n, positions, c * k)))
        nodes.append(Node("Reshape", (rows,), (flat,), {"shape": [n, positions, c * k]},
                          f"{where}/rows"))
        b = fresh(f"{w}@dense", TensorType("float32", (c * k, m)))
        inits[b] = np.ascontiguousarray(weight.reshape(m, c * k).T)
        prod = fresh(f"{y}@product", TensorType("float32", (n, positions, m)))
        nodes.append(Node("MatMul", (flat, b), (prod,), {}, f"{where}/product"))
        nodes.append(Node("Transpose", (prod,), (y,), {"perm": [0, 2, 1]}, where))
    return graph.with_nodes(nodes, initializers=inits, types=types)
