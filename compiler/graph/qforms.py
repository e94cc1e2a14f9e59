"""Float operators rewritten, on the quantizer's path, into forms that have an int8 layer.

Users' CNNs spell some layers in ways the int8 graph had no form for, so they stayed float
between a Dequantize and a Quantize (two crossings each on the accelerator build):

- ``ReduceMean`` over the two spatial axes of an image (``x.mean([2, 3])``, RegNet,
  ShuffleNet, GhostNet heads in PyTorch) is a ``GlobalAveragePool`` (then a ``Flatten`` to
  [N, C] when ``keepdims=0``): QGlobalAveragePool, on the accelerator's ALU.
- ``AveragePool`` (DenseNet's transitions, Inception's pooled branch) whose every window
  divides by its full kernel size (``count_include_pad=1`` or no padding, and no ceil-mode
  window past the padded input) is a depthwise convolution with the weight 1/(kh*kw) on
  every tap: a QConv, which the accelerator runs as group_conv2d.
- A per-channel (or scalar) constant ``Mul``/``Add`` on an image that no convolution absorbed
  (an unfused BatchNormalization: DenseNet's and pre-activation ResNets' BN -> ReLU before
  each convolution; the normalisation of the input image) is a 1x1 depthwise convolution
  with that scale as weight and that shift as bias; the ReLU after it fuses as usual.
- A ``PRelu`` with one slope (PyTorch's ``nn.PReLU()`` default) is a ``LeakyRelu``: fused
  into the layer before it as a table, not a float node between two crossings.
- A convolution whose epilogue scales by constants *after* its residual Add (a BN after the
  sum) is cut there: the convolution up to its residual, then a 1x1 depthwise convolution
  with the rest of the epilogue (an int8 layer scales before it adds its residual).

Each rewrite keeps the float meaning up to float rounding (a weight of 1/9 rounds once).
Not part of ``optimize``: the float CPU build keeps its own pooling and element-wise
kernels; ``quantize_model`` runs ``quant_forms`` before ``quantize_graph``.
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, Node, TensorType, constant
from .ops import pool_output_shape
from .passes import _fresh, fuse_epilogues, remove_dead_code
from .residual import rewrite_nodes

__all__ = ["quant_forms"]

# Producers of the values whose constant Mul/Add becomes a depthwise layer: nodes with int8
# forms whose outputs are images (and the model's inputs). Others stay as they are: a
# channels-first LayerNorm spelt out (ConvNeXt: Sub, Div, then Mul and Add per channel) is
# float on both sides, and a depthwise layer in it would only add crossings (ConvNeXt small:
# 31 -> 40).
_IMAGE_MAKERS = ("Conv", "ConvTranspose", "Concat", "MaxPool", "AveragePool",
                 "GlobalAveragePool", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid",
                 "HardSwish", "Resize", "Slice")


def _image(types, v: str) -> tuple[int, int] | None:
    """(N or None, C) of a float32 [N, C, H, W] value with a static channel count."""
    t = types.get(v)
    if t is None or t.dtype != "float32" or len(t.shape) != 4 or t.shape[1] is None:
        return None
    return t.shape[0], int(t.shape[1])


def _per_channel(c: np.ndarray, channels: int) -> np.ndarray | None:
    """A constant that broadcasts against [N, C, H, W] as one value per channel (or one
    value): the [C] vector, else None."""
    c = np.asarray(c)
    if c.ndim > 4 or c.dtype != np.float32:
        return None
    c4 = c.reshape((1,) * (4 - c.ndim) + c.shape)
    if c4.shape[0] != 1 or c4.shape[2:] != (1, 1) or c4.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c4.reshape(-1), (channels,)).astype(np.float32)


def _depthwise(name: str, x: str, out: str, weight: np.ndarray, bias, kernel, strides,
               pads, inits: dict, types: dict, epilogue=(), extra=()) -> Node:
    """A depthwise Conv node ``x`` -> ``out`` with constant ``weight`` [C, 1, kh, kw] and
    ``bias`` [C] (or None); its weight and bias become initializers."""
    w = _fresh(f"{name}/weight", types)
    inits[w] = constant(weight.astype(np.float32))
    types[w] = TensorType("float32", inits[w].shape)
    ins = [x, w, ""]
    if bias is not None:
        ins[2] = _fresh(f"{name}/bias", types)
        inits[ins[2]] = constant(np.asarray(bias, np.float32))
        types[ins[2]] = TensorType("float32", inits[ins[2]].shape)
    ins += list(extra)
    while ins and not ins[-1]:
        ins.pop()
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads),
             "dilations": [1, 1], "group": int(weight.shape[0])}
    if epilogue:
        attrs["epilogue"] = tuple(epilogue)
    return Node("Conv", tuple(ins), (out,), attrs, name)


def _mean_as_pool(node: Node, types: dict) -> list[Node] | None:
    a = node.attrs
    if _image(types, node.inputs[0]) is None or tuple(a.get("axes") or ()) != (2, 3):
        return None
    if a.get("keepdims", 1):
        return [Node("GlobalAveragePool", node.inputs[:1], node.outputs, {}, node.name)]
    t = types[node.inputs[0]]
    pooled = _fresh(f"{node.outputs[0]}/pooled", types)
    types[pooled] = TensorType("float32", t.shape[:2] + (1, 1))
    return [Node("GlobalAveragePool", node.inputs[:1], (pooled,), {}, node.name),
            Node("Flatten", (pooled,), node.outputs, {"axis": 1}, f"{node.name}/flatten")]


def _avg_pool_as_conv(node: Node, inits: dict, types: dict) -> list[Node] | None:
    a = node.attrs
    image = _image(types, node.inputs[0])
    kernel, pads = list(a["kernel_shape"]), list(a["pads"])
    if image is None or len(kernel) != 2 or any(d != 1 for d in a["dilations"]) or \
            (any(pads) and not a.get("count_include_pad")) or types[node.inputs[0]].shape[2] \
            is None or types[node.inputs[0]].shape[3] is None:
        return None
    hw = types[node.inputs[0]].shape[2:]
    if a.get("ceil_mode") and pool_output_shape(hw, kernel, a["strides"], [1, 1], pads, 1) \
            != pool_output_shape(hw, kernel, a["strides"], [1, 1], pads, 0):
        return None  # a ceil-mode window past the padding divides by fewer taps
    channels = image[1]
    weight = np.full((channels, 1, *kernel), 1.0 / (kernel[0] * kernel[1]), np.float32)
    return [_depthwise(node.name, node.inputs[0], node.outputs[0], weight, None, kernel,
                       a["strides"], pads, inits, types)]


def _affine_as_conv(node: Node, producers: dict, inits: dict, types: dict) -> list[Node] | None:
    if node.op not in ("Mul", "Add") or len(node.inputs) != 2:
        return None
    x, c = node.inputs
    if x in inits:
        x, c = c, x
    image = _image(types, x)
    if image is None or c not in inits or x in inits or types[node.outputs[0]] != types[x]:
        return None
    p = producers.get(x)
    if p is not None and p.op not in _IMAGE_MAKERS:
        return None
    vector = _per_channel(inits[c], image[1])
    if vector is None:
        return None
    ones = np.ones((image[1], 1, 1, 1), np.float32)
    if node.op == "Mul":
        return [_depthwise(node.name, x, node.outputs[0], vector.reshape(-1, 1, 1, 1), None,
                           (1, 1), (1, 1), (0, 0, 0, 0), inits, types)]
    return [_depthwise(node.name, x, node.outputs[0], ones, vector, (1, 1), (1, 1),
                       (0, 0, 0, 0), inits, types)]


def _scale_after_residual(node: Node, inits: dict, types: dict) -> list[Node] | None:
    """A Conv whose epilogue has a constant Add/Mul after its residual Add: cut there."""
    steps = node.attrs.get("epilogue", ())
    if node.op != "Conv" or _image(types, node.outputs[0]) is None:
        return None
    residual, cut = False, None
    for k, (op, *args) in enumerate(steps):
        if op not in ("Add", "Mul", "Relu", "Clip"):
            return None  # a table in the epilogue: another form (quantize.py's tails)
        if op in ("Add", "Mul"):
            constant_operand = node.inputs[args[0]] in inits
            if residual and constant_operand:
                cut = k
                break
            if not constant_operand:
                if op == "Mul":
                    return None
                residual = True
    if cut is None:
        return None
    channels = types[node.outputs[0]].shape[1]
    mid = _fresh(f"{node.outputs[0]}/before_scale", types)
    types[mid] = types[node.outputs[0]]
    used = max([2] + [args[0] for op, *args in steps[:cut] if op in ("Add", "Mul")])
    first = Node(node.op, node.inputs[:used + 1], (mid,),
                 {**node.attrs, "epilogue": tuple(steps[:cut])}, node.name)
    extra, rest = [], []
    for op, *args in steps[cut:]:
        if op in ("Add", "Mul"):
            extra.append(node.inputs[args[0]])
            rest.append((op, 3 + len(extra) - 1))
        else:
            rest.append((op, *args))
    second = _depthwise(f"{node.name}/after_residual", mid, node.outputs[0],
                        np.ones((channels, 1, 1, 1), np.float32), None, (1, 1), (1, 1),
                        (0, 0, 0, 0), inits, types, rest, extra)
    # the bias slot (input 2) is empty: operands from input 3 on
    return [first, second]


def _prelu_as_leaky(node: Node, inits: dict) -> list[Node] | None:
    """A PRelu of one slope (``nn.PReLU()``'s default, or a per-channel slope all equal) is
    a LeakyRelu: fused into the layer before it, or a table."""
    slope = inits.get(node.inputs[1]) if len(node.inputs) == 2 else None
    if slope is None or slope.size == 0 or not np.all(slope == slope.reshape(-1)[0]):
        return None
    return [Node("LeakyRelu", node.inputs[:1], node.outputs,
                 {"alpha": float(slope.reshape(-1)[0])}, node.name)]


def quant_forms(graph: Graph) -> Graph:
    """The rewrites of the module doc on an optimized graph (bodies are left as they are),
    then epilogue fusion again (a ReLU after a new depthwise layer fuses into it)."""
    inits = dict(graph.initializers)
    producers, users = graph.producers(), graph.consumers()
    scaled: set[str] = set()  # outputs of Muls made depthwise layers

    def rewrite(node, types, taken):
        new = None
        if node.op == "ReduceMean":
            new = _mean_as_pool(node, types)
        elif node.op == "AveragePool":
            new = _avg_pool_as_conv(node, inits, types)
        elif node.op in ("Mul", "Add"):
            # a shift after a scale made a layer above becomes that layer's bias (fusion)
            after_scale = node.op == "Add" and any(
                i in scaled and len(users.get(i, ())) == 1 for i in node.inputs)
            new = None if after_scale else _affine_as_conv(node, producers, inits, types)
            if new is not None and node.op == "Mul":
                scaled.add(node.outputs[0])
        elif node.op == "PRelu":
            new = _prelu_as_leaky(node, inits)
        elif node.op == "Conv" and node.attrs.get("epilogue"):
            new = _scale_after_residual(node, inits, types)
        return new
    rewritten = rewrite_nodes(graph, rewrite, inits)
    if rewritten is graph:
        return graph
    return remove_dead_code(fuse_epilogues(rewritten))
