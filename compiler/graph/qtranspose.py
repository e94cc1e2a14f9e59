"""ConvTranspose for the quantizer: a convolution of the input and a pixel shuffle.

For a ConvTranspose of x [N, C, H, W] by w [C, O, kh, kw] with strides (sh, sw) and
dilations 1, along one axis (the other is alike): the full output u = i*s + a (before
the pads crop it) splits into s phases u = q*s + r, and phase r sums the taps a = r + m*s
of the inputs i = q - m. With K = ceil(k / s) taps per phase,

    z[n, (o, r), q] = sum_c sum_{j < K} x[n, c, q - (K-1) + j] * w[c, o, r + (K-1-j)*s]

(a weight past the kernel is zero) is an ordinary convolution of x with a K-tap kernel,
padded by K-1 before and enough after, whose O*sh*sw output channels are the phases; the
bias is repeated per phase. ``z`` [N, O*sh*sw, Lh, Lw] reshaped to [N, O, sh, sw, Lh, Lw],
transposed to [N, O, Lh, sh, Lw, sw] and reshaped to [N, O, Lh*sh, Lw*sw] is the full
output, which a Slice crops to the ConvTranspose's (its leading pads off, its length with
the trailing pads and output_padding). The sums are the same products (the zero taps add
nothing; the padding reads zero, in int8 the zero point as every padded QConv does).
``quantize_graph`` rewrites such nodes before it plans, so the Conv becomes a QConv (an
accelerator layer) and the Reshape/Transpose/Slice nodes move its int8 values. With
strides equal to the kernel and no pads (the common upsampler) the convolution is 1x1 and
there is no Slice; with overlapping windows (stride 2, kernel 3 or 4) it is 2x2, doing
(s*K/k)^2 times the ConvTranspose's multiply-adds (16/9 for kernel 3, 1 for kernel 4). A
grouped one is a grouped convolution (group g's phases are its contiguous outputs); a
dilated one stays float with ``conv_transpose_reason``.
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
        ("dilations", all(d == 1 for d in a["dilations"])),) if not ok]
    if differs:
        return ("it has " + ", ".join(differs) + ": the quantizer's int8 ConvTranspose is a "
                "convolution and a pixel shuffle, for dilations 1")
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
        w = np.asarray(graph.initializers[wname], np.float32)
        c, og, kh, kw = w.shape
        groups = int(node.attrs["group"])
        o, cg = og * groups, c // groups
        n, _, h, wd = graph.types[x].shape
        out = node.outputs[0]
        oh, ow = graph.types[out].shape[2:]
        a = node.attrs
        (sh, sw), pads = list(a["strides"]), list(a["pads"])
        taps = [-(-kh // sh), -(-kw // sw)]  # K per axis
        # phases needed to cover the output after its leading pads; the conv's trailing pad
        lens = [-(-(pads[0] + oh) // sh), -(-(pads[1] + ow) // sw)]
        after = [max(lens[0] - h, 0), max(lens[1] - wd, 0)]
        full = [h + after[0], wd + after[1]]  # phases the conv computes per axis
        # weight [O, sh, sw, C/groups, Kh, Kw]: phase (rh, rw), tap (jh, jw) reads
        # w[c, o, rh + (Kh-1-jh)*sh, rw + (Kw-1-jw)*sw]; group g's outputs o (and so
        # (o, rh, rw)) are contiguous, as a grouped Conv makes them
        weight = np.zeros((o, sh, sw, cg, taps[0], taps[1]), np.float32)
        blocks = [(slice(g * og, (g + 1) * og), slice(g * cg, (g + 1) * cg))
                  for g in range(groups)]
        for rh in range(sh):
            for jh in range(taps[0]):
                ah = rh + (taps[0] - 1 - jh) * sh
                if ah >= kh:
                    continue
                for rw in range(sw):
                    for jw in range(taps[1]):
                        aw = rw + (taps[1] - 1 - jw) * sw
                        for outs, ins in (blocks if aw < kw else ()):
                            weight[outs, rh, rw, :, jh, jw] = w[ins, :, ah, aw].T
        weight = weight.reshape(o * sh * sw, cg, taps[0], taps[1])
        conv_in = [x, value(f"{wname}/as_conv", TensorType("float32", weight.shape))]
        inits[conv_in[1]] = constant(weight)
        if bname:
            bias = np.repeat(np.asarray(graph.initializers[bname], np.float32).reshape(-1),
                             sh * sw)
            conv_in.append(value(f"{bname}/as_conv", TensorType("float32", bias.shape)))
            inits[conv_in[2]] = constant(bias)
        cropped = (pads[0], pads[1]) != (0, 0) or (full[0] * sh, full[1] * sw) != (oh, ow)
        phases = value(f"{out}/taps", TensorType("float32", (n, o * sh * sw, *full)))
        split = value(f"{out}/split", TensorType("float32", (n, o, sh, sw, *full)))
        moved = value(f"{out}/shuffled", TensorType("float32", (n, o, full[0], sh, full[1], sw)))
        merged = value(f"{out}/full", TensorType("float32", (n, o, full[0] * sh,
                                                              full[1] * sw))) if cropped else out
        nodes += [
            Node("Conv", tuple(conv_in), (phases,), {
                "kernel_shape": taps, "strides": [1, 1],
                "pads": [taps[0] - 1, taps[1] - 1, after[0], after[1]],
                "dilations": [1, 1], "group": groups}, node.name),
            Node("Reshape", (phases,), (split,), {"shape": [n, o, sh, sw, *full]},
                 node_name(f"{node.name}/split")),
            Node("Transpose", (split,), (moved,), {"perm": [0, 1, 4, 2, 5, 3]},
                 node_name(f"{node.name}/shuffle")),
            Node("Reshape", (moved,), (merged,), {"shape": [n, o, full[0] * sh, full[1] * sw]},
                 node_name(f"{node.name}/merge"))]
        shuffles.add(nodes[-2].name)
        if cropped:
            nodes.append(Node("Slice", (merged,), (out,), {
                "starts": [pads[0], pads[1]], "ends": [pads[0] + oh, pads[1] + ow],
                "axes": [2, 3], "steps": [1, 1]}, node_name(f"{node.name}/crop")))
    return graph.with_nodes(nodes, inits, types), frozenset(shuffles)
