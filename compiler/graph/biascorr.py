"""Empirical bias correction of a quantized graph's QConv/QGemm layers (Nagel et al. 2019,
"Data-Free Quantization Through Weight Equalization and Bias Correction", section 4.2, its
empirical form).

Rounding weights and activations to int8 leaves a *biased* error in a layer's output: the
mean over the data of (float output - quantized output) is not zero per output channel (a
depthwise 3x3 filter of nine int8 weights shifts its channel's mean by a visible fraction
of a step), and such shifts add up with depth (EfficientNet, MobileNetV3). The correction
measures that mean on the calibration samples and takes it off through the bias:

- the layers are corrected in the graph's order, each with every layer before it already
  quantized and corrected: the quantized graph runs on the samples node by node (qops.py's
  integer kernels, the float nodes by their numpy definition), so a layer sees the inputs
  the deployed graph will give it;
- for a layer whose channels' means are over at least MIN_POINTS points, ``e[o]`` = the mean over samples and positions of the float graph's
  pre-activation (its output before residual and activation, with float inputs, recorded
  by calibration) minus the quantized layer's, ``(acc + bias - z_out term) * s_in * s_w[o]``,
  in accumulator steps; ``rint(e[o])`` is added to the int32 bias, and the requantization
  (multiplier, shift) is chosen again for the new bias (quantize._requantization).

Only int32 bias constants change (and a shift, when the new bias needs one): the integer
semantics are those of any QConv/QGemm, so CPU and accelerator builds stay bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Graph, constant
from .ops import conv
from .qops import _requantize, pad_value, wrap
from .reference import evaluate_node

__all__ = ["Correction", "correct_biases", "MIN_POINTS"]

# A layer is corrected only when each channel's mean is over at least this many points
# (samples x positions): a squeeze-excitation's 1x1 layers and a classifier see one point
# per sample, and a mean of six was noise that hurt (small size, mean cosine of six test
# feeds: EfficientNet 0.861 uncorrected, 0.802 corrected everywhere, 0.878 with this
# floor; PP-OCR cls 0.99600, 0.99812, 0.99955).
MIN_POINTS = 16


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


def _accumulator(node, x, w) -> np.ndarray:
    """The exact int accumulator of a QConv/QGemm (as qops.py computes it), as float64."""
    if node.op == "QConv":
        return conv(node.attrs, x.astype(np.float64), w.astype(np.float64),
                    fill=pad_value(node.attrs))
    return x.astype(np.float64) @ w.astype(np.float64).T


def correct_biases(qgraph: Graph, samples: list[dict], corrections: dict,
                   requantization) -> Graph:
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
            node = _correct(node, c, envs, inits, requantization)
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


def _correct(node, c: Correction, envs: list, inits: dict, requantization):
    x_name, w_name, bias_name, mult_name = node.inputs[:4]
    residual = node.inputs[4] if len(node.inputs) > 4 and node.inputs[4] else ""
    w = inits[w_name]
    accs = [_accumulator(node, env[x_name], w) for env in envs]
    axes = tuple(d for d in range(accs[0].ndim) if d != 1)
    total = sum(a.sum(axis=axes) for a in accs)
    count = sum(a.size // a.shape[1] for a in accs)
    quantized = total / max(count, 1) + (c.bias_q - c.shifted)  # accumulator steps
    error = c.target / c.acc_scale - quantized
    if count < MIN_POINTS:  # a mean of a few points: noise, not the rounding's bias
        return _run(node, envs, accs, inits, residual)
    params = requantization(c.ratio, c.bias_q + np.rint(error), c.w_q, c.calibrated)
    if params is not None:
        mult, bias, shift = params
        inits[bias_name], inits[mult_name] = constant(bias), constant(mult)
        node = node.with_attrs(shift=int(shift))
    return _run(node, envs, accs, inits, residual)


def _run(node, envs: list, accs: list, inits: dict, residual: str):
    """Finish a QConv/QGemm from its accumulators on every sample (qops.py's epilogue)."""
    bias, mult = inits[node.inputs[2]], inits[node.inputs[3]]
    shift, lo, hi = int(node.attrs["shift"]), int(node.attrs["lo"]), int(node.attrs["hi"])
    for env, acc in zip(envs, accs):
        r = env[residual] if residual else None
        env[node.outputs[0]] = _requantize(wrap(acc.astype(np.int64)), bias, mult, shift,
                                           lo, hi, r)
    return node
