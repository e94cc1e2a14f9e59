"""ConvTranspose for the quantizer: the common upsampler (stride equal to kernel, so no two
input pixels write the same output pixel) is exactly a 1x1 convolution and a pixel shuffle.

For a ConvTranspose of x [N, C, H, W] by w [C, O, kh, kw] with strides (kh, kw), no pads,
dilations 1, no output_padding, one group:

    y[n, o, i*kh + a, j*kw + b] = sum_c x[n, c, i, j] * w[c, o, a, b] + bias[o]

which is, with z = Conv1x1(x, w') [N, O*kh*kw, H, W], ``w'[o*kh*kw + a*kw + b, c] =
w[c, o, a, b]`` and the bias repeated kh*kw times per channel, ``z`` reshaped to [N, O, kh,
kw, H, W], transposed to [N, O, H, kh, W, kw] and reshaped to [N, O, H*kh, W*kw]: the same
sums, in the same float32 products. ``quantize_graph`` rewrites such nodes before it plans,
so the Conv becomes a QConv (an accelerator layer) and the Reshape/Transpose nodes move its
int8 values. The MACs are the same as the ConvTranspose's (every input pixel meets C x O x
kh x kw weights). Any other ConvTranspose stays float with ``conv_transpose_reason`` (the
overlapping windows of a stride below the kernel have no int8 form here).
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, Node, TensorType, constant

__all__ = ["conv_transpose_reason", "expand_conv_transposes"]


def conv_transpose_reason(graph: Graph, node: Node) -> str:
    """Why the ConvTranspose ``node`` has no int8 form, or "" when it has one (module doc)."""
    a, inits = node.attrs, graph.initializers
    ins = list(node.inputs) + [""] * (3 - len(node.inputs))
    x, w = graph.types[ins[0]], inits.get(ins[1])
    out = graph.types[node.outputs[0]]
    kernel = list(a["kernel_shape"])
    if x.dtype != "float32" or out.dtype != "float32":
        return f"its input and output are {x.dtype} and {out.dtype}, not float32"
    if w is None or (ins[2] and ins[2] not in inits):
        return (f"its {'weight' if w is None else 'bias'} "
                f"{ins[1] if w is None else ins[2]!r} is computed at run time (an int8 layer "
                f"needs constants)")
    if len(x.shape) != 4 or not x.static or not out.static:
        return (f"a {len(x.shape) - 2}-D ConvTranspose (the int8 form is 2-D)"
                if len(x.shape) != 4 else f"its shapes {x} -> {out} are only known at run time")
    differs = [f"{k}={a[k]}" for k, ok in (
        ("group", a["group"] == 1), ("dilations", all(d == 1 for d in a["dilations"])),
        ("pads", not any(a["pads"])), ("output_padding", not any(a["output_padding"])))
        if not ok]
    if list(a["strides"]) != kernel or differs:
        return ("its windows overlap (strides " + str(list(a["strides"])) + " below kernel "
                + str(kernel) + ")" if list(a["strides"]) != kernel else
                "it has " + ", ".join(differs)) + (
            ": the quantizer's int8 ConvTranspose is a 1x1 QConv and a pixel shuffle, for "
            "strides equal to the kernel, one group, dilations 1, no pads or output_padding")
    return ""


def expand_conv_transposes(graph: Graph) -> tuple[Graph, frozenset]:
    """The graph with every ConvTranspose that has an int8 form (``conv_transpose_reason``
    "") written as Conv 1x1 -> Reshape -> Transpose -> Reshape (module doc); the Conv keeps
    the node's name, the output keeps its name. Other nodes are unchanged. Also the names
    of the new Transposes (the quantizer makes them int8)."""
    if not any(n.op == "ConvTranspose" and not conv_transpose_reason(graph, n)
               for n in graph.nodes):
        return graph, frozenset()
    inits, types = dict(graph.initializers), dict(graph.types)
    names = {n.name for n in graph.nodes}
    nodes, shuffles = [], set()

    def value(base, t):
        k, name = 0, base
        while name in types:
            k += 1
            name = f"{base}_{k}"
        types[name] = t
        return name

    def node_name(base):
        k, name = 0, base
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.add(name)
        return name

    for node in graph.nodes:
        if node.op != "ConvTranspose" or conv_transpose_reason(graph, node):
            nodes.append(node)
            continue
        x, wname = node.inputs[0], node.inputs[1]
        bname = node.inputs[2] if len(node.inputs) > 2 else ""
        w = graph.initializers[wname]
        c, o, kh, kw = w.shape
        n, _, h, wd = graph.types[x].shape
        out = node.outputs[0]
        weight = np.ascontiguousarray(w.transpose(1, 2, 3, 0).reshape(o * kh * kw, c, 1, 1))
        conv_in = [x, value(f"{wname}/as_conv", TensorType("float32", weight.shape))]
        inits[conv_in[1]] = constant(weight)
        if bname:
            bias = np.repeat(np.asarray(graph.initializers[bname], np.float32).reshape(-1),
                             kh * kw)
            conv_in.append(value(f"{bname}/as_conv", TensorType("float32", bias.shape)))
            inits[conv_in[2]] = constant(bias)
        taps = value(f"{out}/taps", TensorType("float32", (n, o * kh * kw, h, wd)))
        split = value(f"{out}/split", TensorType("float32", (n, o, kh, kw, h, wd)))
        moved = value(f"{out}/shuffled", TensorType("float32", (n, o, h, kh, wd, kw)))
        nodes += [
            Node("Conv", tuple(conv_in), (taps,), {
                "kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0],
                "dilations": [1, 1], "group": 1}, node.name),
            Node("Reshape", (taps,), (split,), {"shape": [n, o, kh, kw, h, wd]},
                 node_name(f"{node.name}/split")),
            Node("Transpose", (split,), (moved,), {"perm": [0, 1, 4, 2, 5, 3]},
                 node_name(f"{node.name}/shuffle")),
            Node("Reshape", (moved,), (out,), {"shape": [n, o, h * kh, wd * kw]},
                 node_name(f"{node.name}/merge"))]
        shuffles.add(nodes[-2].name)
    return graph.with_nodes(nodes, inits, types), frozenset(shuffles)
