"""Graph passes, each Graph -> Graph, and the pipeline ``optimize`` that runs them in order.

Every pass keeps the graph's meaning (run_graph gives the same outputs, up to float
rounding where weights are rescaled) and its inputs and outputs; tests/compiler/
test_graph_passes.py checks each one numerically and structurally.

Bodies (If's branches, Loop's and Scan's bodies: ir.py) are graphs of their own: every
pass below runs on each body too, before the graph that holds it, with the body's outputs
as the outputs to keep. A value a body reads is an input of the node that holds the body,
so liveness and readers need no special case. Values of the enclosing graph are not
propagated into bodies (a constant a body reads stays a value the node passes):
folding within a body uses the body's own constants. ``fold_constants`` also inlines the
taken branch of an If whose condition is a constant.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import numpy as np

from .ir import (
    EPILOGUE_BINARY,
    Graph,
    Node,
    TensorType,
    captured_inputs,
    constant,
    map_subgraphs,
    subgraphs,
    verify_graph,
)
from .ops import OWN_INPUTS
from .ops_random import NONDETERMINISTIC
from .reference import evaluate_node, stand_in

__all__ = ["fold_constants", "eliminate_identities", "fold_pads", "fold_batch_norm",
           "fuse_layer_norms", "fuse_mish", "fuse_epilogues",
           "remove_dead_code", "optimize", "PIPELINE", "inline_branch", "conv1d_as_2d"]

# A folded constant larger than this (elements) stays a node: folding would only grow the
# model (a broadcast of a scalar to a feature map).
FOLD_LIMIT = 1 << 22
_STATIC_SHAPE_OPS = ("Shape", "Size")


def _fresh(name: str, taken) -> str:
    k, new = 0, name
    while new in taken:
        k += 1
        new = f"{name}_{k}"
    return new


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all constants (and Shape/Size, whose inputs'
    shapes are static), random draws excepted (ops_random.NONDETERMINISTIC): their
    outputs become initializers. An If with a constant
    condition becomes the nodes of its taken branch (folded in turn)."""
    inits, types = dict(graph.initializers), dict(graph.types)
    nodes = []
    work = deque(graph.nodes)
    while work:
        node = map_subgraphs(work.popleft(), fold_constants)
        if node.op == "If" and node.inputs[0] in inits:
            taken = "then_branch" if bool(np.asarray(inits[node.inputs[0]]).reshape(-1)[0]) \
                else "else_branch"
            work.extendleft(reversed(inline_branch(node, node.attrs[taken], inits, types)))
            continue
        if node.op in _STATIC_SHAPE_OPS:  # only the input's shape matters: static or not
            foldable = types[node.inputs[0]].static
        elif node.op in NONDETERMINISTIC:  # random draws: new ones in every run
            foldable = False
        else:
            foldable = all(not i or i in inits for i in node.inputs)
        # A size only known at run time (a node in run-time form) is known once its inputs
        # are: fold it, and retype the value with the size it has.
        small = all(not types[o].static or types[o].size <= FOLD_LIMIT
                    for o in node.outputs if o)
        if foldable and small:
            args = [None if not i else inits.get(i) for i in node.inputs]
            if node.op in _STATIC_SHAPE_OPS:
                args = [stand_in(types[node.inputs[0]])]
            results = evaluate_node(node, args)
            if all(r.size <= FOLD_LIMIT for r in results):
                for o, v in zip(node.outputs, results):
                    if o:
                        inits[o] = constant(v)
                        types[o] = TensorType(str(v.dtype), v.shape)
                continue
        nodes.append(node)
    return graph.with_nodes(nodes, initializers=inits, types=types)


def inline_branch(node: Node, branch: Graph, inits: dict, types: dict) -> list[Node]:
    """The nodes of an If's branch in the enclosing graph: its outer values are the If's
    captured inputs, its outputs the If's outputs, its other values renamed where their
    names are taken (``inits`` and ``types`` get the branch's constants and types)."""
    rename = dict(zip(branch.outer, captured_inputs(node)))
    produced = {o for n in branch.nodes for o in n.outputs if o}
    for b_out, out in zip(branch.outputs, node.outputs):
        if out and b_out in produced and b_out not in rename:
            rename[b_out] = out
    local = [*branch.initializers, *produced]
    for name in local:
        if name not in rename:
            rename[name] = _fresh(name, types)
            types[rename[name]] = branch.types[name]
    for name, a in branch.initializers.items():
        inits[rename[name]] = a
    nodes = [Node(n.op, tuple(rename.get(i, i) for i in n.inputs),
                  tuple(rename.get(o, o) for o in n.outputs), n.attrs, n.name)
             for n in branch.nodes]
    for b_out, out in zip(branch.outputs, node.outputs):
        if out and rename.get(b_out) != out:  # an outer value, a constant, or a repeat
            nodes.append(Node("Identity", (rename[b_out],), (out,), {},
                              f"{node.name}/{out}"))
    return nodes


def _in_bodies(graph: Graph, graph_pass) -> Graph:
    """The graph with ``graph_pass`` run on the bodies of its nodes."""
    return graph.with_nodes([map_subgraphs(n, graph_pass) for n in graph.nodes])


def eliminate_identities(graph: Graph) -> Graph:
    """Identity (and a Dropout without its mask) is a copy: readers use its input instead.
    One whose output is a graph output stays (the name must survive)."""
    rename: dict[str, str] = {}
    nodes = []
    for node in _in_bodies(graph, eliminate_identities).nodes:
        node = _renamed(node, rename)
        copy = node.op == "Identity" or (node.op == "Dropout" and len(node.outputs) == 1)
        if copy and node.outputs[0] not in graph.outputs:
            rename[node.outputs[0]] = node.inputs[0]
            continue
        nodes.append(node)
    return graph.with_nodes(nodes)


def fold_pads(graph: Graph) -> Graph:
    """A constant-zero Pad of only spatial axes whose every reader is a Conv (as its data)
    becomes those Convs' own padding: TensorFlow exports pad explicitly before "same"
    convolutions, causal 1-D convolutions pad on the left, Keras' ZeroPadding2D. The Pad
    was a pass over the image (on the CPU a numpy step, between layout conversions) and a
    copy of it. Kept when a side's total padding would exceed the convolution's dilated
    kernel extent less one (the padding a convolution can have without a window wholly
    outside the image)."""
    graph = _in_bodies(graph, fold_pads)
    users = graph.consumers()
    folded: dict[str, list] = {}  # Conv name -> its new pads
    removed: set[str] = set()
    rename: dict[str, str] = {}
    for pad in graph.nodes:
        if pad.op != "Pad" or len(pad.inputs) != 1 or pad.attrs.get("mode") != "constant" \
                or pad.attrs.get("value", 0) != 0 or pad.outputs[0] in graph.outputs:
            continue
        pads = [int(p) for p in pad.attrs["pads"]]
        rank = len(pads) // 2
        readers = users.get(pad.outputs[0], ())
        if rank < 3 or min(pads) < 0 or any(pads[a] or pads[a + rank] for a in (0, 1)) \
                or not readers or any(r.op != "Conv" or r.inputs[0] != pad.outputs[0]
                                      or pad.outputs[0] in r.inputs[1:] for r in readers):
            continue
        plans = {}
        for conv in readers:
            a = conv.attrs
            nd = rank - 2
            extent = [(int(k) - 1) * int(d) for k, d in zip(a["kernel_shape"], a["dilations"])]
            new = [int(p) for p in a["pads"]]
            for i in range(nd):
                new[i] += pads[2 + i]
                new[i + nd] += pads[rank + 2 + i]
            if any(new[i] > extent[i] or new[i + nd] > extent[i] for i in range(nd)):
                break
            plans[conv.name] = new
        else:
            folded.update(plans)
            removed.add(pad.name)
            rename[pad.outputs[0]] = pad.inputs[0]
    if not removed:
        return graph
    nodes = []
    for node in graph.nodes:
        if node.name in removed:
            continue
        if node.name in folded:
            node = Node(node.op, (rename.get(node.inputs[0], node.inputs[0]),) + node.inputs[1:],
                        node.outputs, {**node.attrs, "pads": folded[node.name]}, node.name)
        nodes.append(node)
    return graph.with_nodes(nodes)


def _scalar_const(inits, v) -> float | None:
    a = inits.get(v)
    return float(a.reshape(-1)[0]) if a is not None and a.size == 1 else None


def _layer_norm_at(mean: Node, graph: Graph, users, inits):
    """(nodes, x, scale array, bias array or None, axis, epsilon, output) of LayerNorm
    spelt out from ``mean`` (a ReduceMean): x - mean(x), its square's mean + eps, sqrt,
    the division, then optionally * scale and + bias (constants); or None."""
    types = graph.types
    x = mean.inputs[0]
    t = types[x]
    rank = len(t.shape)
    axes = sorted(int(a) % rank for a in (mean.attrs.get("axes") or range(rank)))
    if t.dtype != "float32" or not mean.attrs.get("keepdims", 1) or not axes \
            or axes != list(range(axes[0], rank)):
        return None

    def only(v, op):
        nxt = users.get(v, ())
        return nxt[0] if len(nxt) == 1 and nxt[0].op == op and v not in graph.outputs \
            else None
    sub = only(mean.outputs[0], "Sub")
    if sub is None or tuple(sub.inputs) != (x, mean.outputs[0]):
        return None
    d = sub.outputs[0]
    readers = list({n.name: n for n in users.get(d, ())}.values())  # Mul(d, d) reads it twice
    if len(readers) != 2 or d in graph.outputs:
        return None
    square = next((n for n in readers if (n.op == "Pow" and n.inputs[0] == d
                                          and _scalar_const(inits, n.inputs[1]) == 2.0)
                   or (n.op == "Mul" and tuple(n.inputs) == (d, d))), None)
    div = next((n for n in readers if n.op == "Div" and n.inputs[0] == d), None)
    if square is None or div is None:
        return None
    var = only(square.outputs[0], "ReduceMean")
    if var is None or var.attrs.get("axes") is None or sorted(
            int(a) % rank for a in var.attrs["axes"]) != axes or not var.attrs.get("keepdims", 1):
        return None
    add = only(var.outputs[0], "Add")
    eps = None
    if add is not None:
        other = add.inputs[1] if add.inputs[0] == var.outputs[0] else add.inputs[0]
        eps = _scalar_const(inits, other)
    sqrt = add and only(add.outputs[0], "Sqrt")
    if eps is None or eps < 0 or sqrt is None or div.inputs[1] != sqrt.outputs[0]:
        return None
    nodes = [mean, sub, square, var, add, sqrt, div]
    tail = tuple(t.shape[axes[0]:])

    def per_element(v):  # a constant broadcast over the normalized axes only
        a = inits.get(v)
        if a is None or a.ndim > rank or any(d != 1 for d in a.shape[:max(0, a.ndim - len(tail))]):
            return None
        try:
            return np.broadcast_to(a.reshape(a.shape[max(0, a.ndim - len(tail)):]), tail) \
                .astype(np.float32)
        except ValueError:
            return None
    out, found = div.outputs[0], {}
    for op in ("Mul", "Add"):  # * scale, then + bias: each only after the one before
        step = only(out, op)
        if step is None:
            break
        a = per_element(step.inputs[1] if step.inputs[0] == out else step.inputs[0])
        if a is None:
            break
        nodes.append(step)
        out, found[op] = step.outputs[0], a
    scale = found.get("Mul", np.ones(tail, np.float32))
    return nodes, x, scale, found.get("Add"), axes[0], eps, out


def fuse_layer_norms(graph: Graph) -> Graph:
    """LayerNormalization spelt out (exporters before opset 17: ReduceMean, Sub, Pow,
    ReduceMean, Add eps, Sqrt, Div, then * scale + bias) becomes one LayerNormalization
    node (stash type float32): on the CPU build the row-wise kernel instead of two numpy
    reductions and five element-wise passes. The same values within float32 rounding (the
    kernel multiplies by 1/sqrt where the spelt-out form divides)."""
    graph = _in_bodies(graph, fuse_layer_norms)
    users, inits, types = graph.consumers(), dict(graph.initializers), dict(graph.types)
    absorbed: set[str] = set()
    placed: dict[str, Node] = {}
    for node in graph.nodes:
        if node.op != "ReduceMean" or node.name in absorbed:
            continue
        found = _layer_norm_at(node, graph, users, inits)
        if found is None:
            continue
        nodes, x, scale, bias, axis, eps, out = found
        inputs = [x]
        for what, a in (("scale", scale), ("bias", bias)):
            if a is None:
                continue
            name = _fresh(f"{node.name}/{what}", types)
            inits[name] = constant(a)
            types[name] = TensorType("float32", a.shape)
            inputs.append(name)
        absorbed.update(n.name for n in nodes)
        placed[node.name] = Node("LayerNormalization", tuple(inputs), (out,),
                                 {"axis": axis, "epsilon": eps,
                                  "stash_type": np.dtype(np.float32)}, node.name + "/layernorm")
    if not placed:
        return graph
    kept = [placed.get(n.name, n) for n in graph.nodes
            if n.name in placed or n.name not in absorbed]
    return graph.with_nodes(kept, initializers=inits, types=types)


def fuse_mish(graph: Graph) -> Graph:
    """Mish spelt out, ``x * tanh(softplus(x))`` (PyTorch's export before opset 18, YOLOv4's
    and CSPDarknet's activation), becomes one Mish node: an element-wise kernel on the CPU
    build instead of two numpy steps between layout conversions, one int8 table in a
    quantized graph instead of two tables and a product."""
    graph = _in_bodies(graph, fuse_mish)
    users = graph.consumers()
    absorbed: set[str] = set()
    placed: dict[str, Node] = {}
    for sp in graph.nodes:
        if sp.op != "Softplus" or sp.outputs[0] in graph.outputs:
            continue
        x = sp.inputs[0]
        th = users.get(sp.outputs[0], ())
        if len(th) != 1 or th[0].op != "Tanh" or th[0].outputs[0] in graph.outputs:
            continue
        mul = users.get(th[0].outputs[0], ())
        if len(mul) != 1 or mul[0].op != "Mul" or sorted(mul[0].inputs) != sorted(
                (x, th[0].outputs[0])) or graph.types[x].dtype not in ("float32", "float64"):
            continue
        absorbed.update((sp.name, th[0].name, mul[0].name))
        placed[mul[0].name] = Node("Mish", (x,), mul[0].outputs, {}, mul[0].name)
    if not placed:
        return graph
    return graph.with_nodes([placed.get(n.name, n) for n in graph.nodes
                             if n.name in placed or n.name not in absorbed])


def _renamed(node: Node, rename: dict) -> Node:
    if not any(i in rename for i in node.inputs):
        return node
    return Node(node.op, tuple(rename.get(i, i) for i in node.inputs), node.outputs,
                node.attrs, node.name)


def fold_batch_norm(graph: Graph) -> Graph:
    """Inference BatchNormalization with constant parameters: folded into the weights and
    bias of the Conv or Gemm before it when that node feeds only the BN; otherwise a
    per-channel scale and shift (Mul, Add) that fusion can absorb."""
    graph = _in_bodies(graph, fold_batch_norm)
    inits, types = dict(graph.initializers), dict(graph.types)
    users, producers = graph.consumers(), graph.producers()
    removed: set[str] = set()
    replaced: dict[str, Node] = {}  # producer node name -> folded node
    extra: dict[str, list[Node]] = {}  # BN name -> nodes that replace it
    for bn in graph.nodes:
        if bn.op != "BatchNormalization" or bn.attrs.get("training_mode") or \
                not all(i in inits for i in bn.inputs[1:5]):
            continue
        x = bn.inputs[0]
        dtype = np.dtype(types[x].dtype)
        scale, bias, mean, var = (inits[i].astype(np.float64) for i in bn.inputs[1:5])
        k = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
        shift = bias - mean * k
        prod = producers.get(x)
        if prod is not None and len(users.get(x, ())) == 1 and x not in graph.outputs and \
                not prod.attrs.get("epilogue") and _foldable_into(prod, inits):
            replaced[prod.name] = _fold_into(prod, bn, k, shift, inits, types, dtype)
            removed.add(bn.name)
            continue
        rank = len(types[x].shape)
        shape = (-1,) + (1,) * (rank - 2)
        names = [_fresh(f"{bn.name}/{s}", types) for s in ("scale", "shift", "scaled")]
        for name, v in zip(names, (k, shift)):
            inits[name] = constant(v.reshape(shape).astype(dtype))
            types[name] = TensorType(str(dtype), inits[name].shape)
        types[names[2]] = types[x]
        extra[bn.name] = [Node("Mul", (x, names[0]), (names[2],), {}, bn.name + "/scale"),
                          Node("Add", (names[2], names[1]), bn.outputs[:1], {},
                               bn.name + "/shift")]
    nodes = []
    for node in graph.nodes:
        if node.name in removed:
            continue
        nodes += extra.get(node.name, [replaced.get(node.name, node)])
    return graph.with_nodes(nodes, initializers=inits, types=types)


def _foldable_into(node: Node, inits) -> bool:
    if node.op == "Conv":
        return node.inputs[1] in inits and (len(node.inputs) < 3 or not node.inputs[2]
                                            or node.inputs[2] in inits)
    if node.op == "Gemm":
        return not node.attrs["transA"] and node.inputs[1] in inits and (
            len(node.inputs) < 3 or not node.inputs[2] or node.inputs[2] in inits)
    return False


def _fold_into(node, bn, k, shift, inits, types, dtype) -> Node:
    """The Conv/Gemm ``node`` with the BN's per-output-channel scale k and shift folded in."""
    w = inits[node.inputs[1]].astype(np.float64)
    b = inits[node.inputs[2]].astype(np.float64) if len(node.inputs) > 2 and node.inputs[2] \
        else np.zeros(())
    attrs = dict(node.attrs)
    if node.op == "Conv":
        w = w * k.reshape(-1, *[1] * (w.ndim - 1))
        b = b * k + shift
    else:  # Gemm: output columns are the channels; Y = alpha*A@B + beta*C
        w = w * (k[:, None] if attrs["transB"] else k[None, :]) * attrs["alpha"]
        b = b * attrs["beta"] * k + shift
        attrs.update(alpha=1.0, beta=1.0)
    names = [_fresh(f"{node.inputs[1]}/bn", types), _fresh(f"{bn.name}/bias", types)]
    for name, v in zip(names, (w, b)):
        inits[name] = constant(v.astype(dtype))
        types[name] = TensorType(str(dtype), inits[name].shape)
    return Node(node.op, (node.inputs[0], *names), bn.outputs[:1], attrs, node.name)


def _unary_step(node: Node, inits):
    """The epilogue step of an element-wise node on one operand, or None."""
    if node.op in ("Relu", "HardSwish", "Sigmoid"):
        return (node.op,)
    if node.op == "LeakyRelu":
        return ("LeakyRelu", float(node.attrs.get("alpha", 0.01)))
    if node.op == "HardSigmoid":
        return ("HardSigmoid", float(node.attrs.get("alpha", 0.2)),
                float(node.attrs.get("beta", 0.5)))
    if node.op == "Clip":
        bounds = []
        for i in node.inputs[1:3]:
            if i and (i not in inits or inits[i].size != 1):
                return None
            bounds.append(inits[i].item() if i else None)
        bounds += [None] * (2 - len(bounds))
        return ("Clip", *bounds)
    return None


def fuse_epilogues(graph: Graph) -> Graph:
    """A Conv/Gemm/MatMul followed by a chain of element-wise ops on its output alone (bias
    or residual Add, Mul by a broadcast operand, Relu, Clip, LeakyRelu, HardSigmoid,
    HardSwish, Sigmoid; SiLU: a Sigmoid of the output and a Mul of the output by it;
    Gelu: exact GELU spelt out with Erf, see _gelu;
    HardSwish spelt out as x * clip(x + 3, 0, 6) / 6)
    becomes one node with an ``epilogue``; a constant per-channel Add right after a
    bias-less Conv or C-less Gemm becomes its bias."""
    graph = _in_bodies(graph, fuse_epilogues)
    users = graph.consumers()
    inits, types = dict(graph.initializers), dict(graph.types)
    absorbed: set[str] = set()
    placed: dict[str, Node] = {}  # name of the chain's last node -> the fused node
    for node in graph.nodes:
        if node.op not in OWN_INPUTS or node.name in absorbed or node.attrs.get("epilogue"):
            continue
        inputs = list(node.inputs) + [""] * (OWN_INPUTS[node.op] - len(node.inputs))
        attrs, steps, out, last = dict(node.attrs), [], node.outputs[0], None
        while out not in graph.outputs and len(users.get(out, ())) in (1, 2):
            gated = _silu(out, users, graph.outputs) or _hard_swish(out, users, inits,
                                                                    graph.outputs) \
                or _gelu(out, users, inits, graph.outputs)
            if gated is not None:  # x * f(x): one step for the nodes of f and the Mul
                step, chain = gated
                steps.append((step,))
                absorbed.update(n.name for n in chain)
                out, last = chain[-1].outputs[0], chain[-1]
                continue
            if len(users[out]) != 1:
                break
            nxt = users[out][0]
            if nxt.name in absorbed:  # already the epilogue of the other operand's producer
                break
            step = _unary_step(nxt, inits) if nxt.inputs[0] == out else None
            if nxt.op in EPILOGUE_BINARY and len(nxt.inputs) == 2 and out in nxt.inputs:
                other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
                t, ot = types[out], types[other]
                if other == out or ot.dtype != t.dtype or not (t.static and ot.static) or \
                        np.broadcast_shapes(t.shape, ot.shape) != t.shape:
                    break  # (an operand of run-time size may broadcast the output)
                bias = _as_bias(node, other, inits, t, steps, inputs)
                if nxt.op == "Add" and bias is not None:
                    name = _fresh(f"{other}/bias", types)
                    inits[name] = constant(bias)
                    types[name] = TensorType(t.dtype, bias.shape)
                    inputs[2] = name
                    if node.op == "Gemm":
                        attrs["beta"] = 1.0
                else:
                    inputs.append(other)
                    steps.append((nxt.op, len(inputs) - 1))
            elif step is not None:
                steps.append(step)
            else:
                break
            absorbed.add(nxt.name)
            out, last = nxt.outputs[0], nxt
        if last is None:
            continue
        if steps:
            attrs["epilogue"] = tuple(steps)
        while inputs and not inputs[-1]:
            inputs.pop()
        placed[last.name] = Node(node.op, tuple(inputs), (out,), attrs, node.name)
        absorbed.add(node.name)
    nodes = [placed.get(n.name, n) for n in graph.nodes
             if n.name not in absorbed or n.name in placed]
    return graph.with_nodes(nodes, initializers=inits, types=types)


def _silu(out: str, users: dict, outputs) -> tuple | None:
    """("SiLU", [Sigmoid, Mul]) when ``out``'s readers are exactly a Sigmoid of it and a Mul
    of it by that Sigmoid, which nothing else reads: x * sigmoid(x), PyTorch's export."""
    readers = users.get(out, ())
    if len(readers) != 2:
        return None
    sig = next((n for n in readers if n.op == "Sigmoid"), None)
    mul = next((n for n in readers if n.op == "Mul"), None)
    if sig is None or mul is None or sig.outputs[0] in outputs \
            or sorted(mul.inputs) != sorted((out, sig.outputs[0])) \
            or [n.name for n in users.get(sig.outputs[0], ())] != [mul.name]:
        return None
    return "SiLU", [sig, mul]


def _scalar(inits, v, want: float) -> bool:
    return v in inits and inits[v].size == 1 and abs(float(inits[v].item()) - want) <= 1e-6


def _hard_swish(out: str, users: dict, inits, outputs) -> tuple | None:
    """("HardSwish", nodes) for x * clip(x + 3, 0, 6) / 6 spelt out (Paddle's export):
    Add 3, Clip [0, 6], then Mul by x and Div by 6 (or Mul by 1/6), in either order."""
    readers = users.get(out, ())
    add = next((n for n in readers if n.op == "Add"), None)
    mul = next((n for n in readers if n.op == "Mul"), None)
    if len(readers) != 2 or add is None or mul is None or out not in mul.inputs \
            or not _scalar(inits, add.inputs[1] if add.inputs[0] == out else add.inputs[0], 3):
        return None

    def only_reader(node, op):
        nxt = users.get(node.outputs[0], ())
        if node.outputs[0] in outputs or len(nxt) != 1 or nxt[0].op != op:
            return None
        return nxt[0]

    def sixth(node):  # Div by 6 or Mul by 1/6, of the previous node's output
        prev_out = chain[-1].outputs[0]
        if node is None or (node.op == "Div" and node.inputs[0] != prev_out):
            return False
        other = [v for v in node.inputs if v != prev_out]
        return len(other) == 1 and (_scalar(inits, other[0], 6) if node.op == "Div"
                                    else _scalar(inits, other[0], 1 / 6))
    clip = only_reader(add, "Clip")
    if clip is None or len(clip.inputs) != 3 or not _scalar(inits, clip.inputs[1], 0) \
            or not _scalar(inits, clip.inputs[2], 6):
        return None
    chain = [add, clip]
    nxt = users.get(clip.outputs[0], ())
    if clip.outputs[0] in outputs or len(nxt) != 1:
        return None
    if nxt[0] is mul:  # x * clip, then / 6
        chain.append(mul)
        last = users.get(mul.outputs[0], ())
        if mul.outputs[0] in outputs or len(last) != 1 or last[0].op not in ("Div", "Mul") \
                or not sixth(last[0]):
            return None
        chain.append(last[0])
    else:  # clip / 6, then x * that
        if nxt[0].op not in ("Div", "Mul") or not sixth(nxt[0]):
            return None
        chain.append(nxt[0])
        after = only_reader(nxt[0], "Mul")
        if after is None or after.name != mul.name:
            return None
        chain.append(mul)
    if sorted(mul.inputs) != sorted((out, chain[chain.index(mul) - 1].outputs[0])):
        return None
    return "HardSwish", chain


def _gelu(out: str, users: dict, inits, outputs) -> tuple | None:
    """("Gelu", nodes) for exact GELU spelt out, as torch exports it before opset 20 (x /
    sqrt 2, Erf, + 1, * x, * 0.5) or as Hugging Face writes it (x * 0.5 * (1 + erf(x /
    sqrt 2))): the scaled Erf's input is the output, the products read it once more."""
    readers = users.get(out, ())
    if len(readers) != 2:
        return None

    def other(node, v):
        rest = [i for i in node.inputs if i != v]
        return rest[0] if len(rest) == 1 and len(node.inputs) == 2 else None

    def only_reader(node, op):
        nxt = users.get(node.outputs[0], ())
        if node.outputs[0] in outputs or len(nxt) != 1 or nxt[0].op != op:
            return None
        return nxt[0]
    scale = next((n for n in readers if n.inputs and n.inputs[0] == out and (
        (n.op == "Div" and _scalar(inits, other(n, out), math.sqrt(2)))
        or (n.op == "Mul" and _scalar(inits, other(n, out), 1 / math.sqrt(2))))), None)
    gate = next((n for n in readers if n is not scale and n.op == "Mul"), None)
    if scale is None or gate is None:
        return None
    erf = only_reader(scale, "Erf")
    add = erf and only_reader(erf, "Add")
    if add is None or not _scalar(inits, other(add, erf.outputs[0]), 1.0):
        return None
    if other(gate, out) == add.outputs[0]:  # x * (1 + erf), then * 0.5
        last = only_reader(gate, "Mul")
        if last is None or not _scalar(inits, other(last, gate.outputs[0]), 0.5):
            return None
    elif _scalar(inits, other(gate, out), 0.5):  # (x * 0.5) * (1 + erf)
        last = only_reader(gate, "Mul")
        if last is None or other(last, gate.outputs[0]) != add.outputs[0] \
                or only_reader(add, "Mul") is not last:
            return None
    else:
        return None
    return "Gelu", [scale, erf, add, gate, last]


def _as_bias(node, other, inits, out_type, steps, inputs):
    """A constant added straight after a node that has no bias, reshaped as its bias."""
    if steps or other not in inits or (len(inputs) > 2 and inputs[2]):
        return None
    c = inits[other]
    if node.op == "Conv":
        channels = out_type.shape[1]
        want = [1] * len(out_type.shape)
        want[1] = channels
        lead = len(out_type.shape) - c.ndim
        padded = (1,) * lead + c.shape
        if all(d == 1 or (i == 1 and d == channels) for i, d in enumerate(padded)) \
                and lead <= 1:
            return np.broadcast_to(c.reshape(-1), (channels,)).copy()
        return None
    if node.op == "Gemm":
        return c.copy()
    return None


def remove_dead_code(graph: Graph) -> Graph:
    """Drop nodes no output depends on, unused initializers and types, and outputs of a
    node nobody reads beyond its first (MaxPool's indices); in bodies too, where an outer
    value no body of a node reads any more stops being passed."""
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if not any(o in live for o in node.outputs if o):
            continue
        outs = tuple(o if k == 0 or o in live else "" for k, o in enumerate(node.outputs))
        while len(outs) > 1 and not outs[-1]:
            outs = outs[:-1]
        if outs != node.outputs:
            node = Node(node.op, node.inputs, outs, node.attrs, node.name)
        node = _drop_unread_captures(map_subgraphs(node, remove_dead_code))
        kept.append(node)
        live.update(i for i in node.inputs if i)
        live.update(o for o in outs if o)  # an unread first output keeps its type
    kept.reverse()
    live.update(graph.inputs)
    live.update(graph.outer)
    inits = {k: v for k, v in graph.initializers.items() if k in live}
    types = {k: v for k, v in graph.types.items() if k in live}
    return graph.with_nodes(kept, initializers=inits, types=types)


def _drop_unread_captures(node: Node) -> Node:
    bodies = subgraphs(node)
    if not bodies:
        return node
    reads = [{i for n in b.nodes for i in n.inputs} | set(b.outputs) for _, b in bodies]
    keep = [k for k in range(len(bodies[0][1].outer))
            if any(b.outer[k] in r for (_, b), r in zip(bodies, reads))]
    if len(keep) == len(bodies[0][1].outer):
        return node
    captured = captured_inputs(node)
    attrs = {}
    for key, b in bodies:
        outer = tuple(b.outer[k] for k in keep)
        dropped = set(b.outer) - set(outer)
        attrs[key] = replace(b, outer=outer,
                             types={k: v for k, v in b.types.items() if k not in dropped})
    own = node.inputs[:len(node.inputs) - len(captured)]
    return Node(node.op, own + tuple(captured[k] for k in keep), node.outputs,
                {**node.attrs, **attrs}, node.name)


def conv1d_as_2d(graph: Graph) -> Graph:
    """Each 1-D Conv or ConvTranspose with a constant weight ([N, C, L] data; the weight
    [O, C/g, K] or [C, O/g, K], the kernel last either way) as a 2-D one of height 1:
    Unsqueeze(axis 2) -> Conv [O, C/g, 1, K] -> Squeeze(axis 2), its attributes and
    fused epilogue operands (a per-channel [C, 1] constant, a residual [N, C, L]) given
    the height axis too. Not part of ``optimize`` (the CPU build has 1-D kernels of its
    own): the quantizer's path runs it, so that 1-D layers become the 2-D integer
    convolutions the CPU build and the accelerator run. The float meaning is unchanged."""
    graph = _in_bodies(graph, conv1d_as_2d)
    inits, types = dict(graph.initializers), dict(graph.types)
    producers = graph.producers()
    nodes: list[Node] = []
    changed = False
    # A value of [N, C, L] -> the [N, C, 1, L] value it is (a lifted convolution's output
    # before its Squeeze, or an element-wise function of one done again on the 4-D value):
    # the next 1-D convolution reads that instead of an Unsqueeze of the Squeeze, so a
    # stack of 1-D layers stays 4-D (int8, and on the accelerator, from layer to layer).
    wide_of: dict[str, str] = {}
    for node in graph.nodes:
        w = inits.get(node.inputs[1]) if node.op in ("Conv", "ConvTranspose") and \
            len(node.inputs) > 1 else None
        x = node.inputs[0] if node.inputs else ""
        if w is None or w.ndim != 3 or len(types[x].shape) != 3:
            nodes.append(node)
            continue
        changed = True
        a = dict(node.attrs)

        def lifted(v):  # a value of [.., C, L] rank >= 2 gets the height axis before L
            t = types[v]
            if len(t.shape) < 2:
                return v
            if v in wide_of:
                return wide_of[v]
            p = producers.get(v)
            if p is not None and len(t.shape) == 3 and p.op in _POINTWISE and \
                    len(p.inputs) == 1 and len(p.outputs) == 1 and \
                    (p.inputs[0] in wide_of or _pointwise_of_wide(p.inputs[0], producers,
                                                                  wide_of, types)):
                name = _fresh(f"{v}/h1", types)
                types[name] = TensorType(t.dtype, t.shape[:-1] + (1,) + t.shape[-1:])
                nodes.append(Node(p.op, (lifted(p.inputs[0]),), (name,), p.attrs,
                                  _fresh(f"{p.name}/h1", types)))
                wide_of[v] = name
                return name
            name = _fresh(f"{v}/h1", types)
            shape = t.shape[:-1] + (1,) + t.shape[-1:]
            types[name] = TensorType(t.dtype, shape)
            if v in inits:
                inits[name] = constant(np.asarray(inits[v]).reshape(shape))
            else:
                nodes.append(Node("Unsqueeze", (v,), (name,), {"axes": (len(t.shape) - 1,)},
                                  _fresh(f"{node.name}/unsqueeze_{v}", types)))
            return name

        ins = list(node.inputs)
        ins[0] = lifted(x)
        ins[1] = _fresh(f"{node.inputs[1]}/h1", types)
        inits[ins[1]] = constant(np.asarray(w)[:, :, None, :])
        types[ins[1]] = TensorType(types[node.inputs[1]].dtype, inits[ins[1]].shape)
        for k in range(3, len(ins)):  # fused epilogue operands
            if ins[k]:
                ins[k] = lifted(ins[k])
        if "kernel_shape" in a:
            a["kernel_shape"] = (1, *a["kernel_shape"])
        for key in ("strides", "dilations"):
            if key in a:
                a[key] = (1, *a[key])
        if "output_padding" in a:  # ConvTranspose's
            a["output_padding"] = (0, *a["output_padding"])
        if "pads" in a:
            p = tuple(a["pads"])
            a["pads"] = (0, p[0], 0, p[1])
        out = node.outputs[0]
        t = types[out]
        wide = _fresh(f"{out}/h1", types)
        types[wide] = TensorType(t.dtype, t.shape[:2] + (1,) + t.shape[2:])
        nodes.append(Node(node.op, tuple(ins), (wide,), a, node.name))
        nodes.append(Node("Squeeze", (wide,), (out,), {"axes": (2,)},
                          _fresh(f"{node.name}/squeeze", types)))
        wide_of[out] = wide
    if not changed:
        return graph
    # the Squeezes and 3-D element-wise nodes no one reads any more
    return remove_dead_code(graph.with_nodes(nodes, initializers=inits, types=types))


# Element-wise functions of one value whose attributes do not depend on its shape.
_POINTWISE = ("Relu", "Gelu", "Erf", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Celu",
              "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Mish", "Abs", "Neg",
              "Exp", "Identity")


def _pointwise_of_wide(v: str, producers: dict, wide_of: dict, types: dict) -> bool:
    """Whether ``v`` [N, C, L] is a chain of _POINTWISE functions of a value in
    ``wide_of`` (a lifted convolution's output)."""
    for _ in range(8):
        if v in wide_of:
            return True
        p = producers.get(v)
        if p is None or p.op not in _POINTWISE or len(p.inputs) != 1 or \
                len(types[v].shape) != 3:
            return False
        v = p.inputs[0]
    return False


# The pipeline, in order. Each entry: (name, pass); optimize verifies the graph after each.
PIPELINE = (
    # Shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) and weight
    # preprocessing on constants become initializers; BN folding needs constant weights.
    ("fold_constants", fold_constants),
    # Copies would hide a Conv -> BN or Conv -> Relu pair from the passes below.
    ("eliminate_identities", eliminate_identities),
    # A zero Pad before a Conv is the Conv's padding (before BN folding: the same Conv).
    ("fold_pads", fold_pads),
    # Before fusion: the Relu after a BN must see the Conv as its producer.
    ("fold_batch_norm", fold_batch_norm),
    # LayerNorm and Mish spelt out by older exporters, as one node each.
    ("fuse_layer_norms", fuse_layer_norms),
    ("fuse_mish", fuse_mish),
    # Bias, residual and activation into the producing Conv/Gemm/MatMul.
    ("fuse_epilogues", fuse_epilogues),
    # Last: the weights BN folding replaced, the shape tensors folding consumed.
    ("remove_dead_code", remove_dead_code),
)


def optimize(graph: Graph, passes=PIPELINE) -> Graph:
    """Run the passes in order, verifying the graph after each."""
    for _, p in passes:
        graph = p(graph)
        verify_graph(graph)
    return graph
