"""SmoothQuant-style smoothing (Xiao et al. 2023): move per-channel activation outliers
into the weights before int8 quantization, with an exact float rewrite.

Transformer activations that feed Linear layers (a LayerNormalization's output) have a few
channels far larger than the rest; one int8 scale per tensor then spends its range on those
channels and rounds the others away. For a LayerNormalization whose output (channel j on
its last axis) is read by MatMul/Gemm layers with constant weights W (row j: the weights
that multiply channel j), ``smooth_graph`` chooses per channel

    s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)

(max|X_j| over the calibration samples, max|W_j| over every reader's row j), divides the
normalization's scale and bias by s_j and multiplies each reader's row j by s_j. The float
graph computes the same function up to rounding; its activations have flatter channels
(easier for per-tensor int8) and the weights, quantized per output channel, absorb the
difference.

What is rewritten: a LayerNormalization normalizing its last axis only, with constant
scale (and bias), whose Mean/InvStdDev outputs are unused. Its readers may reach the
layers through ops that keep the last axis as it is (Reshape or Flatten keeping the last
size, Gather/Slice/Squeeze/Unsqueeze on other axes). A MatMul must read the value as its
first input with a constant 2-D second input; a Gemm as its A (transA=0) with a constant B.
When the output also has other readers (a post-norm block's residual Add) or is a graph
output, the normalization is duplicated: the copy, smoothed, feeds the layers, the original
feeds the rest (one more LayerNormalization, a float op on the CPU either way).

``quantize_model(smooth=...)`` applies it (``--smooth`` on the command line); it is off by
default: on the zoo's transformers, with their residual sums float (residual.py), it
changes the cosine to fp32 by -0.005..+0.0002 (docs/graph.md has the numbers).
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, GraphError, Node, TensorType, constant
from .reference import evaluate_node
from .residual import fresh_name

__all__ = ["smooth_graph", "smoothing_candidates", "check_alpha", "DEFAULT_ALPHA"]

DEFAULT_ALPHA = 0.5
# "auto": the alphas tried per normalization, and the rows of its output the error is
# measured on.
AUTO_GRID = (0.25, 0.4, 0.5, 0.6, 0.75, 0.9)
AUTO_ROWS = 256
# The smallest smoothing factor: a channel that was never nonzero keeps s = 1.
_TINY = 1e-12
# Ops between the normalization and its layers that keep the last axis (channel j stays
# channel j of the last axis).
_PASS = ("Reshape", "Flatten", "Gather", "Slice", "Squeeze", "Unsqueeze")


def check_alpha(alpha):
    """``alpha`` as "auto" or a float in [0, 1], else a GraphError saying what it means."""
    if isinstance(alpha, str) and alpha.strip().lower() == "auto":
        return "auto"
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        a = float("nan")
    if not 0.0 <= a <= 1.0:
        raise GraphError(f"smoothing alpha {alpha!r} is not a number in [0, 1] nor 'auto': 0 "
                         "leaves the activations as they are (no smoothing), 1 moves all of "
                         "their range into the weights, 'auto' chooses per LayerNorm "
                         f"(SmoothQuant's usual value: {DEFAULT_ALPHA})")
    return a


def _keeps_last_axis(graph: Graph, node: Node, channels: int) -> bool:
    t_in, t_out = graph.types[node.inputs[0]], graph.types[node.outputs[0]]
    if not t_in.shape or not t_out.shape or t_out.shape[-1] != channels:
        return False
    last = len(t_in.shape) - 1
    if node.op in ("Reshape", "Flatten"):
        # Row-major order: with the same last size, flat index f is channel f % C in both.
        return True
    if node.op == "Gather":
        return node.attr("axis", 0) % len(t_in.shape) != last
    if node.op == "Slice":
        return all(a % len(t_in.shape) != last for a in node.attr("axes", ()))
    if node.op in ("Squeeze", "Unsqueeze"):
        return len(t_out.shape) == len(t_in.shape) - (1 if node.op == "Squeeze" else -1) \
            and t_in.shape[-1] == t_out.shape[-1]
    return False


def _weight_rows(graph: Graph, node: Node, value: str, channels: int):
    """How ``node`` multiplies ``value``'s channels by a constant: (weight name, axis of the
    weight that runs over the channels) or None."""
    if node.op == "MatMul" and node.inputs[0] == value and node.inputs[1] != value:
        w = graph.initializers.get(node.inputs[1])
        if w is not None and w.ndim == 2 and w.shape[0] == channels \
                and np.issubdtype(w.dtype, np.floating):
            return node.inputs[1], 0
    if node.op == "Gemm" and node.inputs[0] == value and node.inputs[1] != value \
            and not node.attr("transA", 0):
        w = graph.initializers.get(node.inputs[1])
        axis = 1 if node.attr("transB", 0) else 0
        if w is not None and w.ndim == 2 and w.shape[axis] == channels \
                and np.issubdtype(w.dtype, np.floating):
            return node.inputs[1], axis
    return None


def _layers(graph: Graph, users: dict, value: str, channels: int):
    """The layers reading ``value`` through last-axis-keeping ops: (layers [(node, weight,
    axis)], pass-through nodes), or None when some reader is neither."""
    layers, passes, other = [], [], False
    for user in users.get(value, []):
        rows = _weight_rows(graph, user, value, channels)
        if rows is not None:
            layers.append((user, *rows))
        elif user.op in _PASS and user.inputs[0] == value \
                and _keeps_last_axis(graph, user, channels) \
                and user.outputs[0] not in graph.outputs:
            found = _layers(graph, users, user.outputs[0], channels)
            if found is None:
                return None
            layers += found[0]
            passes += [user] + found[1]
        else:
            other = True
    if other:
        return None
    return layers, passes


def smoothing_candidates(graph: Graph) -> list[tuple[Node, list, list, bool]]:
    """The LayerNormalizations ``smooth_graph`` rewrites: (node, layers [(node, weight name,
    channel axis)], pass-through nodes, whether it must be duplicated)."""
    users = graph.consumers()
    found = []
    for node in graph.nodes:
        if node.op != "LayerNormalization" or node.attr("epilogue"):
            continue
        x, scale = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else ""
        rank = len(graph.types[x].shape)
        channels = graph.types[x].shape[-1]
        if node.attr("axis", -1) % max(rank, 1) != rank - 1 or channels is None \
                or scale not in graph.initializers or (bias and bias not in graph.initializers):
            continue
        if any(o and users.get(o) or o in graph.outputs for o in node.outputs[1:]):
            continue
        y = node.outputs[0]
        # Split the readers into layers (possibly through pass-through chains) and others.
        layer_users, rest = [], []
        for user in users.get(y, []):
            single = {y: [user]}
            got = _layers(graph, {**users, **single}, y, channels)
            (layer_users if got is not None and got[0] else rest).append((user, got))
        if not layer_users:
            continue
        layers = [lay for _, got in layer_users for lay in got[0]]
        passes = [p for _, got in layer_users for p in got[1]]
        found.append((node, layers, passes, bool(rest) or y in graph.outputs))
    return found


def _channel_maxima(graph: Graph, samples: list[dict], values: set, rows: int = 0):
    """Per-channel (last axis) max |v| of ``values`` over the samples, by the reference, and
    up to ``rows`` rows (vectors along the last axis) of each, spread over the samples."""
    out = {v: np.zeros(graph.types[v].shape[-1]) for v in values}
    kept: dict[str, list] = {v: [] for v in values}
    per_sample = -(-rows // max(len(samples), 1))
    last_use = {i: k for k, node in enumerate(graph.nodes) for i in node.inputs}
    for feeds in samples:
        env = {**graph.initializers, **feeds}
        for k, node in enumerate(graph.nodes):
            results = evaluate_node(node, [env[i] if i else None for i in node.inputs])
            for o, v in zip(node.outputs, results):
                if o:
                    env[o] = v
                    if o in out:
                        a = np.asarray(v, dtype=np.float32).reshape(-1, v.shape[-1])
                        out[o] = np.maximum(out[o], np.abs(a).max(axis=0, initial=0))
                        if per_sample:
                            step = max(1, -(-len(a) // per_sample))
                            kept[o].append(a[::step])
            for i in node.inputs:
                if i and last_use.get(i) == k and i not in graph.initializers:
                    env.pop(i, None)
    return out, {v: np.concatenate(a)[:rows] if a else None for v, a in kept.items()}


def _factors(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's s_j, relative to their median and never below 1: the channels above
    the median are divided down, the others keep their values (scaling a channel up to the
    calibration maximum leaves it no headroom for data beyond the samples, which then
    clips); 1 where a channel or its weights were all zero."""
    ok = (x_max > _TINY) & (w_max > _TINY)
    s = np.ones_like(w_max)
    with np.errstate(all="ignore"):
        s[ok] = x_max[ok] ** alpha / w_max[ok] ** (1 - alpha)
    s[~np.isfinite(s) | (s <= 0)] = 1.0
    if ok.any():
        s[ok] = np.maximum(s[ok] / np.median(s[ok]), 1.0)
    return s


def _int8_error(x: np.ndarray, x_max: np.ndarray, weights: list, s: np.ndarray) -> float:
    """The relative squared error of the layers' products with the activation (rows ``x``,
    channel maxima ``x_max``) divided by ``s`` in per-tensor int8 and the weights (C x N)
    multiplied by ``s`` in per-output-channel int8: how the quantizer will see them."""
    xs = x / s
    step = float((x_max / s).max()) / 127 or 1.0
    xq = np.clip(np.rint(xs / step), -127, 127) * step
    num = den = 0.0
    for w in weights:
        want = x @ w
        ws = w * s[:, None]
        w_step = np.abs(ws).max(axis=0) / 127
        w_step[w_step == 0] = 1.0
        got = xq @ (np.rint(ws / w_step) * w_step)
        num += float(np.square(got - want).sum())
        den += float(np.square(want).sum())
    return num / den if den else 0.0


def smooth_graph(graph: Graph, samples: list[dict], alpha=DEFAULT_ALPHA) -> Graph:
    """The graph with each smoothing candidate rewritten (module doc); ``samples``: feeds
    ({input name: array}) the activation maxima are taken over. ``alpha``: a number in
    [0, 1] (0: no smoothing), or "auto": per normalization, the alpha of ``AUTO_GRID`` (or
    none) whose int8 product with the layers' weights is closest to float on the samples.
    Returns ``graph`` itself when there is nothing to smooth."""
    alpha = check_alpha(alpha)
    auto = alpha == "auto"
    candidates = smoothing_candidates(graph)
    if not candidates or not samples or (not auto and alpha == 0):
        return graph
    values = {n.outputs[0] for n, *_ in candidates}
    if auto and len(samples) > 1:
        # Choose on held-out data: the maxima of half of the samples, the error on rows of
        # the other half (a factor fitted too closely to the samples' maxima clips there).
        fit, _ = _channel_maxima(graph, samples[0::2], values)
        x_max, rows = _channel_maxima(graph, samples[1::2], values, AUTO_ROWS)
        x_max, fit = {v: np.maximum(x_max[v], fit[v]) for v in values}, fit
    elif auto:
        x_max, rows = _channel_maxima(graph, samples, values, AUTO_ROWS)
        fit = x_max
    else:
        x_max, _ = _channel_maxima(graph, samples, values)
    inits = dict(graph.initializers)
    types = dict(graph.types)
    taken = set(types) | {n.name for n in graph.nodes}
    replace: dict[int, list[Node]] = {}  # id(node) -> the nodes that stand for it
    for node, layers, passes, duplicate in candidates:
        y = node.outputs[0]
        w_max = np.zeros_like(x_max[y])
        for _, w, axis in layers:
            a = np.abs(graph.initializers[w].astype(np.float64))
            w_max = np.maximum(w_max, a.max(axis=1 - axis))
        if auto:
            ws = {w: graph.initializers[w].astype(np.float32) for _, w, _ in layers}
            ws = [ws[w] if axis == 0 else ws[w].T for _, w, axis in layers]
            x = rows[y].astype(np.float32)
            best, chosen = _int8_error(x, fit[y], ws, np.ones_like(w_max)), None
            for a in AUTO_GRID:
                e = _int8_error(x, fit[y], ws, _factors(fit[y], w_max, a))
                if e < best:
                    best, chosen = e, a
            if chosen is None:
                continue
            s = _factors(x_max[y], w_max, chosen)
        else:
            s = _factors(x_max[y], w_max, alpha)
        scale = graph.initializers[node.inputs[1]]
        dtype = scale.dtype
        ins = list(node.inputs)
        shape = scale.shape
        s_b = s.reshape((1,) * (len(shape) - 1) + (-1,)) if shape else s
        ins[1] = fresh_name(f"{node.inputs[1]}_smooth", taken)
        inits[ins[1]] = constant((np.broadcast_to(scale, s_b.shape) / s_b).astype(dtype))
        types[ins[1]] = TensorType(str(dtype), inits[ins[1]].shape)
        if len(ins) > 2 and ins[2]:
            bias = graph.initializers[ins[2]]
            ins[2] = fresh_name(f"{node.inputs[2]}_smooth", taken)
            inits[ins[2]] = constant((np.broadcast_to(bias, s_b.shape) / s_b).astype(bias.dtype))
            types[ins[2]] = TensorType(str(bias.dtype), inits[ins[2]].shape)
        rename: dict[str, str] = {}
        if duplicate:
            rename[y] = fresh_name(f"{y}_smooth", taken)
            types[rename[y]] = types[y]
            smoothed = Node(node.op, tuple(ins), (rename[y],), node.attrs,
                            fresh_name(f"{node.name}_smooth", taken))
            replace.setdefault(id(node), [node]).append(smoothed)
            for p in passes:
                o = p.outputs[0]
                rename[o] = fresh_name(f"{o}_smooth", taken)
                types[rename[o]] = types[o]
        else:
            replace.setdefault(id(node), []).append(
                Node(node.op, tuple(ins), node.outputs, node.attrs, node.name))
        for p in passes:
            if duplicate:
                replace.setdefault(id(p), [p]).append(Node(
                    p.op, tuple(rename.get(i, i) for i in p.inputs),
                    tuple(rename.get(o, o) for o in p.outputs), p.attrs,
                    fresh_name(f"{p.name}_smooth", taken)))
        weights: dict[tuple, str] = {}  # (weight, channel axis) -> its smoothed copy
        for layer, w, axis in layers:
            if (w, axis) not in weights:
                weight = graph.initializers[w]
                s_w = s.reshape(-1, 1) if axis == 0 else s.reshape(1, -1)
                name = weights[w, axis] = fresh_name(f"{w}_smooth", taken)
                inits[name] = constant((weight * s_w).astype(weight.dtype))
                types[name] = types[w]
            ins_l = list(layer.inputs)
            ins_l[0] = rename.get(ins_l[0], ins_l[0])
            ins_l[1] = weights[w, axis]
            replace[id(layer)] = [Node(layer.op, tuple(ins_l), layer.outputs, layer.attrs,
                                        layer.name)]
    nodes = [m for n in graph.nodes for m in replace.get(id(n), [n])]
    from .passes import remove_dead_code
    return remove_dead_code(graph.with_nodes(nodes, inits, types))
