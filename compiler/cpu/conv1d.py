"""1-D convolutions (and transposed ones) as 2-D ones of height 1, so they run on the
compiled 2-D kernels.

Audio and sequence models (Silero VAD's STFT-as-conv and encoder, temporal CNNs) convolve
[N, C, L] inputs, which the CPU lowering otherwise leaves to numpy. ``conv1d_as_2d``
rewrites each float32 Conv (and int8 QConv) of a 3-D input with constant weights into

    Reshape x [N, C, L] -> [N, C, 1, L];  Conv with kernel [1, k];  Reshape back

before lowering. Both reshapes are views of plain values; between two such convolutions
the 2-D value is read directly (no reshape back and forth), so a chain of 1-D
convolutions stays in the blocked layout as a 2-D chain does. The arithmetic is the 2-D
kernel's, term for term the same sums as the 1-D definition.
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import EPILOGUE_BINARY, Graph, Node, TensorType

__all__ = ["conv1d_as_2d"]


def _is_conv1d(node: Node, graph: Graph) -> bool:
    if node.op not in ("Conv", "QConv", "ConvTranspose") or len(node.inputs) < 2:
        return False
    x = node.inputs[0]
    consts = [c for c in node.inputs[1:3 if node.op != "QConv" else 4] if c]
    t = graph.types[x]
    dtype = "int8" if node.op == "QConv" else "float32"
    if node.op == "ConvTranspose" and (node.attrs.get("epilogue") or len(node.inputs) > 3
                                       or len(consts) != len(node.inputs) - 1):
        return False  # (the 2-D ConvTranspose kernel takes constant weights and bias only)
    return (len(t.shape) == 3 and t.dtype == dtype and t.static and len(consts) >= 1
            and all(c in graph.initializers for c in consts))


def _with_height(shape, rank: int = 3) -> tuple:
    """A shape that broadcasts against [N, C, L], as one against [N, C, 1, L]."""
    shape = (1,) * (rank - len(shape)) + tuple(shape)
    return shape[:-1] + (1,) + shape[-1:]


def conv1d_as_2d(graph: Graph) -> Graph:
    """The graph with every 1-D Conv it can take made 2-D (see the module docstring)."""
    convs = {id(n) for n in graph.nodes if _is_conv1d(n, graph)}
    if not convs:
        return graph
    inits, types = dict(graph.initializers), dict(graph.types)
    readers: dict[str, list] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
    twin: dict[str, str] = {}  # a 1-D convolution's 3-D output -> its 2-D form
    nodes: list[Node] = []

    def as_2d(v: str, where: str) -> str:
        if v in twin:
            return twin[v]
        t = types[v]
        name = f"{v}@2d"
        while name in types:
            name += "'"
        shape = _with_height(t.shape)
        types[name] = TensorType(t.dtype, shape)
        if v in inits:
            inits[name] = np.ascontiguousarray(np.asarray(inits[v]).reshape(shape))
        else:
            nodes.append(Node("Reshape", (v,), (name,), {"shape": list(shape)}, where))
        twin[v] = name
        return name

    for node in graph.nodes:
        if id(node) not in convs:
            nodes.append(node)
            continue
        a, (x, w, *rest) = node.attrs, node.inputs
        w2 = as_2d(w, f"{node.name}/weight")  # [M, C/g, k] -> [M, C/g, 1, k]
        inputs = [as_2d(x, f"{node.name}/2d"), w2]
        epilogue = [tuple(s) for s in a.get("epilogue", ())]
        for k, i in enumerate(rest):
            # the bias (and a QConv's multiplier) stays [M]; an epilogue operand (a QConv's
            # residual) gets the height too
            binary = any(s[0] in EPILOGUE_BINARY and s[1] == k + 2 for s in epilogue) or \
                (node.op == "QConv" and k + 2 == 4)
            inputs.append(as_2d(i, f"{node.name}/operand{k}") if binary and i else i)
        y = node.outputs[0]
        t = types[y]
        y2 = f"{y}@2d"
        while y2 in types:
            y2 += "'"
        types[y2] = TensorType(t.dtype, _with_height(t.shape))
        pads = list(a["pads"])
        attrs = {**a, "kernel_shape": [1, *a["kernel_shape"]], "strides": [1, *a["strides"]],
                 "dilations": [1, *a["dilations"]], "pads": [0, pads[0], 0, pads[1]]}
        if node.op == "ConvTranspose":  # vocoders' upsampling (HiFi-GAN, MelGAN)
            attrs["output_padding"] = [0, *a["output_padding"]]
        nodes.append(Node(node.op, tuple(inputs), (y2,), attrs, node.name))
        twin[y] = y2
        # Back to 3-D only for readers that are not 1-D convolutions reading it as data.
        if y in graph.outputs or any(id(r) not in convs or r.inputs[0] != y
                                     for r in readers.get(y, ())):
            nodes.append(Node("Reshape", (y2,), (y,), {"shape": list(t.shape)},
                              f"{node.name}/1d"))
    return graph.with_nodes(nodes, initializers=inits, types=types)
