"""Bias correction of a quantized graph's QConv/QGemm layers (Nagel et al. 2019,
"Data-Free Quantization Through Weight Equalization and Bias Correction", section 4.2).

Rounding weights and activations to int8 leaves a *biased* error in a layer's output: the
mean over the data of (float output - quantized output) is not zero per output channel (a
depthwise 3x3 filter of nine int8 weights shifts its channel's mean by a visible fraction
of a step), and such shifts add up with depth (EfficientNet, MobileNetV3). The correction
measures that mean on the calibration samples and takes it off through the bias:

- the layers are corrected in the graph's order, each with every layer before it already
  quantized and corrected: the quantized graph runs on the samples node by node (qops.py's
  integer kernels, the float nodes by their numpy definition), so a layer sees the inputs
  the deployed graph will give it;
- for a layer whose channels' means are over at least MIN_POINTS points, per output
  channel and in accumulator steps: the layer's *own* error, the mean of ``sum (w / s_w -
  w_q) (x - z_in)`` over the samples and output positions (its weights' rounding through
  the int8 inputs it gets: Nagel's ``E[(W - W_q) x]``, with the windows' means measured),
  plus the rest of the mean error ``e[o]`` (the float graph's pre-activation, with float
  inputs, recorded by calibration, minus the quantized layer's ``(acc + bias - z_out
  term) * s_in * s_w[o]``: what the inputs' own error brings) only where that rest is at
  least SIGNIFICANT standard errors (over the samples) from 0. ``rint`` of the sum is
  added to the int32 bias and the requantization (multiplier, shift) is chosen again for
  the new bias (quantize._requantization). ``mode="global"`` adds all of ``e[o]`` instead
  (the empirical form this module had first), and so does every QGemm: a transformer's
  dense layers read values whose error is systematic (float LayerNorm, Softmax and GELU
  between them): all-MiniLM-L6 (full size, six feeds) 0.865 with all of it, 0.838 with
  the own error and its significant rest.

Why not all of ``e[o]``: on deep random-weight networks (MobileNetV3, EfficientNet at
full size) the inputs' error is mostly each sample's own (the int8 network's path drifts
from the float one), and its mean over six samples corrected noise: full size, mean
cosine to fp32 over 18 test feeds, none / all of ``e[o]`` / own error only / own error and
the significant rest: EfficientNet 0.97824 / 0.97380 / 0.97728 / 0.97771, MobileNetV3
0.97688 / 0.97351 / 0.97648 / 0.97803 (before the tables' input ranges of qtable.py);
where the inputs' error is systematic (the OCR models) its significant part keeps most of
the gain (docs/graph.md).

Only int32 bias constants change (and a shift, when the new bias needs one): the integer
semantics are those of any QConv/QGemm, so CPU and accelerator builds stay bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Graph, constant
from .ops import _windows, conv, pool_output_shape
from .qops import _requantize, pad_value, wrap
from .reference import evaluate_node

__all__ = ["Correction", "correct_biases", "MIN_POINTS"]

# A layer is corrected only when each channel's mean is over at least this many points
# (samples x positions): a squeeze-excitation's 1x1 layers and a classifier see one point
# per sample, and a mean of six was noise that hurt (small size, mean cosine of six test
# feeds: EfficientNet 0.861 uncorrected, 0.802 corrected everywhere, 0.878 with this
# floor; PP-OCR cls 0.99600, 0.99812, 0.99955).
MIN_POINTS = 16
# The propagated part of a layer's mean error is corrected where it is at least this many
# standard errors (over the samples) from 0. Measured 3 and 6 (full size, 18 test feeds,
# with the tables' ranges of least squared error then): EfficientNet 0.97666 / 0.97771;
# small, six feeds: PP-OCR rec 0.98194 / 0.97985, det 0.656 / 0.572 (no correction
# 0.97829 / 0.497 before these changes).
SIGNIFICANT = 6.0


@dataclass
class Correction:
    """What quantize.py knows of one QConv/QGemm (named as the node it replaces): the
    float pre-activation's per-channel mean over the samples (``target``), the accumulator
    scale ``s_in * s_w`` [O], the int32 bias before the rounding term (``bias_q``) and the
    output zero point's share of it (``shifted``), and what _requantization needs again
    (``ratio``, ``w_q``, ``calibrated``)."""

    target: np.ndarray
    acc_scale: np.ndarray
    bias_q: np.ndarray
    shifted: np.ndarray | float
    ratio: np.ndarray
    w_q: np.ndarray
    calibrated: np.ndarray
    weight_steps: np.ndarray | None = None  # the float weight in steps of s_w (w / s_w)
    z_in: int = 0  # the input's zero point


def _accumulator(node, x, w) -> np.ndarray:
    """The exact int accumulator of a QConv/QGemm (as qops.py computes it), as float64."""
    if node.op == "QConv":
        return conv(node.attrs, x.astype(np.float64), w.astype(np.float64),
                    fill=pad_value(node.attrs))
    return x.astype(np.float64) @ w.astype(np.float64).T


def correct_biases(qgraph: Graph, samples: list[dict], corrections: dict,
                   requantization, mode: str = "local") -> Graph:
    """The quantized graph with each corrected layer's bias, multiplier and shift replaced
    (module doc). ``requantization``: quantize._requantization (passed in: quantize.py
    imports this module)."""
    inits = dict(qgraph.initializers)
    envs = [dict(feeds) for feeds in samples]
    last_use = {i: k for k, node in enumerate(qgraph.nodes) for i in node.inputs}
    nodes = []
    for k, node in enumerate(qgraph.nodes):
        c = corrections.get(node.name)
        if c is not None and node.op in ("QConv", "QGemm"):
            node = _correct(node, c, envs, inits, requantization, mode)
        else:
            for env in envs:
                ins = [(env[i] if i in env else inits[i]) if i else None for i in node.inputs]
                for o, v in zip(node.outputs, evaluate_node(node, ins)):
                    if o:
                        env[o] = v
        nodes.append(node)
        for i in node.inputs:
            if i and last_use.get(i) == k:
                for env in envs:
                    env.pop(i, None)
    return qgraph.with_nodes(nodes, inits, qgraph.types)


def _correct(node, c: Correction, envs: list, inits: dict, requantization, mode: str):
    x_name, w_name, bias_name, mult_name = node.inputs[:4]
    residual = node.inputs[4] if len(node.inputs) > 4 and node.inputs[4] else ""
    w = inits[w_name]
    accs = [_accumulator(node, env[x_name], w) for env in envs]
    axes = tuple(d for d in range(accs[0].ndim) if d != 1)
    count = sum(a.size // a.shape[1] for a in accs)
    if count < MIN_POINTS:  # a mean of a few points: noise, not the rounding's bias
        return _run(node, envs, accs, inits, residual)
    # per sample, in accumulator steps: the float pre-activation's mean minus the quantized
    quantized = np.array([a.mean(axis=axes) for a in accs]) + (c.bias_q - c.shifted)
    total = c.target / c.acc_scale - quantized  # [samples, O]
    if mode == "global" or c.weight_steps is None or node.op == "QGemm":
        error = total.mean(axis=0)
    else:
        own = np.array([_weight_error(node, c, [env[x_name]]) for env in envs])
        error = own.mean(axis=0) + _significant(total - own)
    params = requantization(c.ratio, c.bias_q + np.rint(error), c.w_q, c.calibrated)
    if params is not None:
        mult, bias, shift = params
        inits[bias_name], inits[mult_name] = constant(bias), constant(mult)
        node = node.with_attrs(shift=int(shift))
    return _run(node, envs, accs, inits, residual)


def _significant(per_sample: np.ndarray) -> np.ndarray:
    """The mean over samples (axis 0) of each channel's error, where it is at least
    SIGNIFICANT standard errors from 0 (0 elsewhere, and with fewer than 3 samples)."""
    k = len(per_sample)
    if k < 3:
        return np.zeros(per_sample.shape[1:])
    mean = per_sample.mean(axis=0)
    se = per_sample.std(axis=0, ddof=1) / np.sqrt(k)
    return np.where(np.abs(mean) > SIGNIFICANT * se, mean, 0.0)


def _weight_error(node, c: Correction, xs: list) -> np.ndarray:
    """The mean over the samples and output positions of ``sum (w / s_w - w_q) (x - z_in)``
    per output channel, in accumulator steps: what rounding the weights takes off the
    layer's pre-activation on the int8 inputs it gets (its windows' means, the padding
    reading z_in, through the weights' rounding error)."""
    dw = c.weight_steps - c.w_q.astype(np.float64)
    if node.op != "QConv":  # QGemm: x [rows, K]
        mean = sum(x.astype(np.float64).sum(axis=0) for x in xs) / sum(len(x) for x in xs)
        return dw @ (mean - c.z_in)
    a = node.attrs
    kernel, nd, g = a["kernel_shape"], len(a["kernel_shape"]), a["group"]
    total, count = 0.0, 0
    for x in xs:
        out = pool_output_shape(x.shape[2:], kernel, a["strides"], a["dilations"], a["pads"])
        win = _windows(x.astype(np.float64) - c.z_in, kernel, a["strides"], a["dilations"],
                       a["pads"], out, 0)
        axes = (0,) + tuple(range(2, 2 + nd))
        total = total + win.sum(axis=axes)  # [C, *kernel]
        count += x.shape[0] * int(np.prod(out))
    means = total / max(count, 1)
    m = dw.shape[0]
    per_group = means.reshape(g, 1, -1)  # [g, 1, channels per group * window]
    return (dw.reshape(g, m // g, -1) * per_group).sum(axis=2).reshape(m)


def _run(node, envs: list, accs: list, inits: dict, residual: str):
    """Finish a QConv/QGemm from its accumulators on every sample (qops.py's epilogue)."""
    bias, mult = inits[node.inputs[2]], inits[node.inputs[3]]
    shift, lo, hi = int(node.attrs["shift"]), int(node.attrs["lo"]), int(node.attrs["hi"])
    for env, acc in zip(envs, accs):
        r = env[residual] if residual else None
        env[node.outputs[0]] = _requantize(wrap(acc.astype(np.int64)), bias, mult, shift,
                                           lo, hi, r)
    return node
