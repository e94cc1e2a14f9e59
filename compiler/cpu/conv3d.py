"""3-D convolutions as sums of 2-D ones, so they run on the compiled 2-D kernels.

Video and volumetric models (C3D, R(2+1)D, 3-D U-Nets) convolve [N, C, D, H, W] inputs,
which the CPU lowering otherwise leaves to numpy (about 10x onnxruntime's time). A
float32 Conv of a 5-D input with constant weights, kernel depth kd, is the sum over the
kernel's depth taps dz of a 2-D convolution of the input's depth slices:

    y[n, :, z] = sum over dz of conv2d(x[n, :, z * sd + dz * dd - pd], W[:, :, dz])

so ``conv3d_as_2d`` rewrites it, before lowering, into

    Transpose x -> [N, D, C, H, W]; Pad the depth (pd before, after) if any
    for each dz: Slice of the depth axis (start dz * dd, step sd) -> Reshape
                 [N * Do, C, H, W] -> Conv 2-D with W[:, :, dz] (the bias in the first),
                 the previous partial sum added in its epilogue (a residual operand)
    Reshape [N, Do, M, Ho, Wo] -> Transpose back

At batch 1 the Slices of a unit depth stride are views of the padded input; the sums are
the 2-D kernels' epilogue additions; unary epilogue steps (an activation the graph fused
into the 3-D Conv) go to the last partial convolution, which sees the whole sum. A Conv
whose epilogue has an operand (a residual) stays as it was. The arithmetic adds the depth
taps' partial sums in another order than the numpy definition: float32 rounding.
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import EPILOGUE_BINARY, Graph, Node, TensorType
from ..graph.residual import fresh_name, rewrite_nodes

__all__ = ["conv3d_as_2d"]


def _is_conv3d(node: Node, graph: Graph) -> bool:
    if node.op != "Conv" or len(node.inputs) < 2:
        return False
    x, w = node.inputs[:2]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    t, out = graph.types[x], graph.types[node.outputs[0]]
    steps = node.attrs.get("epilogue", ())
    return (len(t.shape) == 5 and t.dtype == "float32" and t.static and out.static
            and w in graph.initializers and (not b or b in graph.initializers)
            and len(node.inputs) <= 3 and not any(s[0] in EPILOGUE_BINARY for s in steps))


def conv3d_as_2d(graph: Graph) -> Graph:
    """The graph with every 3-D Conv it can take made a sum of 2-D ones (module docstring)."""
    inits = dict(graph.initializers)

    def rewrite(node, types, taken):
        if not _is_conv3d(node, graph):
            return None
        nodes: list[Node] = []

        def fresh(name: str, dtype: str, shape) -> str:
            name = fresh_name(name, taken)
            types[name] = TensorType(dtype, tuple(int(d) for d in shape))
            return name

        a, x, w = node.attrs, node.inputs[0], node.inputs[1]
        b = node.inputs[2] if len(node.inputs) > 2 else ""
        n, c, d, h, wd = graph.types[x].shape
        y = node.outputs[0]
        _, m, do, ho, wo = types[y].shape
        weight = np.asarray(inits[w], np.float32)
        kd = weight.shape[2]
        sd, sh, sw = a["strides"]
        dd, dh, dw = a["dilations"]
        pd0, ph0, pw0, pd1, ph1, pw1 = a["pads"]
        where = node.name
        xt = fresh(f"{x}@ndchw", "float32", (n, d, c, h, wd))
        nodes.append(Node("Transpose", (x,), (xt,), {"perm": [0, 2, 1, 3, 4]},
                          f"{where}/depth_major"))
        if pd0 or pd1:
            xp = fresh(f"{xt}@pad", "float32", (n, d + pd0 + pd1, c, h, wd))
            nodes.append(Node("Pad", (xt,), (xp,), {
                "mode": "constant", "value": 0.0,
                "pads": [0, pd0, 0, 0, 0, 0, pd1, 0, 0, 0]}, f"{where}/depth_pad"))
            xt = xp
        steps = [tuple(s) for s in a.get("epilogue", ())]
        attrs2 = {k: v for k, v in a.items() if k != "epilogue"}
        attrs2.update(kernel_shape=[int(weight.shape[3]), int(weight.shape[4])],
                      strides=[sh, sw], dilations=[dh, dw], pads=[ph0, pw0, ph1, pw1])
        previous = ""
        for dz in range(kd):
            start = dz * dd
            sl = fresh(f"{y}@depth{dz}", "float32", (n, do, c, h, wd))
            nodes.append(Node("Slice", (xt,), (sl,), {
                "starts": [start], "ends": [start + sd * (do - 1) + 1], "axes": [1],
                "steps": [sd]}, f"{where}/slice{dz}"))
            batch = fresh(f"{sl}@2d", "float32", (n * do, c, h, wd))
            nodes.append(Node("Reshape", (sl,), (batch,), {"shape": [n * do, c, h, wd]},
                              f"{where}/batch{dz}"))
            wz = fresh(f"{w}@depth{dz}", "float32", weight.shape[:2] + weight.shape[3:])
            inits[wz] = np.ascontiguousarray(weight[:, :, dz])
            part = fresh(f"{y}@partial{dz}", "float32", (n * do, m, ho, wo))
            inputs = [batch, wz, b if dz == 0 else ""]
            epilogue: list = []
            if previous:
                inputs.append(previous)
                epilogue.append(("Add", 3))
            if dz == kd - 1:
                epilogue += steps
            while inputs and not inputs[-1]:
                inputs.pop()
            attrs = dict(attrs2)
            if epilogue:
                attrs["epilogue"] = tuple(epilogue)
            nodes.append(Node("Conv", tuple(inputs), (part,), attrs, f"{where}/dz{dz}"))
            previous = part
        back = fresh(f"{y}@ndchw", "float32", (n, do, m, ho, wo))
        nodes.append(Node("Reshape", (previous,), (back,), {"shape": [n, do, m, ho, wo]},
                          f"{where}/unbatch"))
        nodes.append(Node("Transpose", (back,), (y,), {"perm": [0, 2, 1, 3, 4]},
                          f"{where}/channel_major"))
        return nodes
    return rewrite_nodes(graph, rewrite, inits)
