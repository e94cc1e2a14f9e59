"""Post-training int8 quantization: a float graph becomes a *quantized graph* of integer
operators (graph_int.py) that numpy and the accelerator execute bit for bit alike.

Two ways in:

- ``quantize_graph(graph, calibration)``: a float graph, optimized (``optimize``: BatchNorm
  folded, Relu/Clip and bias/residual Adds fused into Conv/Gemm epilogues), and sample
  inputs. The float graph runs on the samples; every value's max |x| gives its scale.
- ``from_qdq(graph)``: a QDQ model (QuantizeLinear/DequantizeLinear around float operators,
  as onnxruntime's ``quantize_static`` writes them): the scales are in the model.

``quantize_model`` does either, from an ONNX model or a graph.

Scales are symmetric, zero points are 0: a value v of scale s is stored as int8
``q = clip(rint(v / s), -128, 127)``, ``s = range / 127`` over the calibration samples,
the range being max|v| (method "minmax") or, by default ("mse"), for values never
negative that do not feed a QLut, the clipping range of least squared error, for signed
ones the least squared error range clipping at most 1e-4 of the samples
(``_mse_ranges``; docs/graph.md has the measurements behind the choice), or a percentile
of |v| ("percentile") or TensorRT's KL-divergence threshold ("entropy"), calib.py. The exception:
values never negative whose writers and readers fold a zero point into their constants
exactly (qzero.py: Relu outputs read by convolutions, padded ones too (``pad_value``), Gemm,
Linear) get zero point -128 and all 256 steps on [0, range], and so do signed values only
lookup tables write, from the tables' least entry (``_table_lows``; Slice, Concat and Add
carry such a lower end), and signed values with none whose calibrated [min, max] rounds
held-out calibration samples better (``_zero_point_pays``, chosen per value); a global average
pool writes its own scale (``_pool_params``). ``zero_points=False`` turns zero points off.

A Conv (2-D), Gemm (no transA) or MatMul (any rank >= 2 by a constant [K,O]; N-d inputs
run as a QGemm on their rows, between two int8 Reshapes) with a constant weight becomes
QConv/QGemm when its epilogue has only constant per-channel Adds (a bias) and Muls (a layer
scale, folded into the weights and the bias), at most one
residual Add, then Relu/Clip steps (together one clamp [lo, hi]), optionally followed by
unary steps with no exact int8 form (SiLU, HardSwish, Sigmoid, ...) and constant Adds/Muls
of one value: those become a QLut (a 256-entry int8 table) after the layer, which then
writes an intermediate int8 value, and optionally a QAdd/QMul of a run-time value of the
output's type after the table. An Add of two int8 values of its output's shape is a QAdd,
a Mul of two int8 values that broadcast to its output (squeeze-excitation's gate) a QMul. A ConvTranspose with strides equal to its kernel is a 1x1
Conv and an int8 pixel shuffle first (qtranspose.py):

- weights: per output channel (``per_channel``; else one scale) ``s_w[o] = max|w[o]|/127``,
  ``w_q = rint(w / s_w)``; Gemm's alpha is folded into w, its beta into the bias.
- the accumulator ``acc`` has scale ``s_in * s_w[o]``; ``bias_q = rint(b / (s_in*s_w[o]))``.
- requantization to the output scale: ``r[o] = s_in * s_w[o] / s_out ~ multiplier[o] /
  2**shift`` with one shift per node, the largest in 0..31 such that every multiplier fits
  int32 and ``|multiplier[o]| * A[o] < 2**31``, where A[o] bounds |acc + bias|: twice the
  calibration maximum (a safety margin), never less than |bias| nor than ``128 / r[o]``
  (the accumulator that fills the output range: a channel that was ~0 on the samples
  stays safe), and never more than the worst case ``128 * sum|w_q[o]| + |bias|``
  (from_qdq, without samples, uses the worst case). Then ``(acc + bias) * multiplier``
  cannot wrap on data like the calibration's.
- rounding: the shift floors. Adding ``2**(shift-1)`` before it would round to nearest;
  ``rint(2**(shift-1) / multiplier[o])`` is added to the bias instead (the accelerator's
  epilogue has no rounding step), so ``(acc + bias) * multiplier >> shift`` rounds to
  nearest up to ``|multiplier|/2**(shift+1) = r/2`` of an output step.
- bias correction (biascorr.py, ``bias_correction=True``): the int32 biases then take off
  the mean error of each layer's pre-activation on the samples, layer by layer.
- a residual is added after the shift, in the output's scale: the residual value and the
  node's output share one scale (values are merged with union-find; the shared scale is
  the largest calibrated range of them / 127). A quantized node producing such a value
  simply requantizes to the shared scale; a float one gets a Quantize to it. A Conv's
  residual Add that ends its epilogue is split off first (``own_residual_scales``,
  residual.py's split_residuals): the QConv writes its own scale and a QAdd requantizes
  both operands (each with its own scale and zero point) into the sum's, so a residual
  stage no longer forces one scale on every value it joins (MobileNetV3's projections
  got 2-3x coarser steps from their stage's largest sum; docs/graph.md).
- a convolution's table input (the intermediate value it writes for its QLut) takes its
  calibrated range clipped where the table's function is flat, with a zero point
  (qtable.py).
- Relu gives ``lo = 0``; Clip(a, b) gives ``lo, hi = clip(rint(a/s_out)), clip(rint(b/s_out))``
  within [-128, 127]; no activation gives [-128, 127].

MaxPool, Flatten, Reshape, Relu, Identity and Slice (and a ConvTranspose's pixel shuffle) on an
int8 value stay int8 in the same scale (so does a Concat of int8 values that already share one
scale, and a channel Concat of int8 images, whose inputs are given one shared scale); GlobalAveragePool
becomes QGlobalAveragePool; an element-wise function of one value (``_LUT_OPS``) on an int8
value becomes a QLut. Every other node stays float: a Dequantize is inserted before it for an
int8 input, and a Quantize after a float value only where a quantized node reads it. Graph
inputs and outputs keep their names and float types (a final Dequantize writes an output).
Each node left float carries ``float_reason``, a string attribute saying why, named by
what is missing ("its epilogue's Gelu has no int8 form ...", "the quantizer has no int8
form of Softmax", "its input 'x' is float ..."): backends report it (the accelerator's
partition, compiler/accel/partition.py) and no kernel reads it.
"""

from __future__ import annotations

import math
import os
import zipfile
from dataclasses import dataclass

import numpy as np

from .biascorr import Correction, correct_biases
from .calib import CalibrationError, entropy_range, parse_method, percentile_range
from .ir import EPILOGUE_UNARY, Graph, GraphError, Node, TensorType, constant, verify_graph
from .ops import KERNELS, OWN_INPUTS
from .passes import remove_dead_code
from .qbody import (dense_input, hoist_loop_products, inline_constant_captures,
                    quantize_bodies, wide_layer)
from .qrecurrent import WEIGHT_BITS as RECURRENT_WEIGHT_BITS
from .qrecurrent import (calibrated_values, h_range, quantized_layer, recurrent_problem,
                         Q_RECURRENT_OPS)
from .qtable import table_input_range
from .qtranspose import conv_transpose_reason, expand_conv_transposes
from .qzero import affine, asymmetric_classes, mse_top
from .reference import apply_epilogue, evaluate_node
from .residual import split_residuals
from .matmul_epilogue import split_layer_epilogues, split_matmul_epilogues, swap_constant_lhs

__all__ = ["quantize_graph", "from_qdq", "is_qdq", "calibration_from_npz",
           "split_dense_epilogues",
           "CalibrationError", "MARGIN"]

# Calibration keeps about this many elements of each value per sample (evenly strided) for
# the MSE range search, which tries ranges down to _MSE_LOWEST of the maximum.
_KEPT = 20000
_MSE_LOWEST = 0.3
# Zero points go to values never negative on the samples (Relu outputs) only: on the
# signed values that could take one (SiLU outputs, projections read by 1x1 convolutions) they
# cost EfficientNet (small) 0.99269 -> 0.96574 and YOLO 0.99974 -> 0.99969 in cosine to fp32
# (test data beyond a calibrated minimum is clipped where the symmetric range had room).
_SIGNED_ZERO_POINTS = 0.0  # the largest -min/max given one (0: never negative)
# The share of calibration samples the "mse" range of a signed value may clip
# (``_signed_range``).
_SIGNED_CLIP = 1e-4
# A[o], the bound on |acc + bias| the shift is chosen for, is MARGIN times the calibration
# maximum: inputs somewhat beyond the samples still do not wrap.
MARGIN = 2.0
# Ops that keep their int8 input's scale (they only move or select values, or clamp at 0).
_SAME_SCALE = ("MaxPool", "Flatten", "Reshape", "Relu", "Identity")
_RECURRENT = tuple(Q_RECURRENT_OPS.values())  # LSTM, GRU, RNN: qrecurrent.py
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# Plan kinds of the int8 nodes whose inputs may come from a Quantize with a zero point.
_ZERO_READERS = ("layer", "lut", "pool", "same")
# Epilogue steps with no exact int8 form: the layer ends before them, a QLut computes them.
_LUT_STEPS = ("SiLU", "HardSwish", "Sigmoid", "LeakyRelu", "HardSigmoid", "Gelu")
# Element-wise functions of one value that become a QLut on an int8 input.
_LUT_OPS = ("Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu", "Gelu", "Elu",
            "Selu", "Softplus", "Softsign", "Erf", "Celu", "Mish", "ThresholdedRelu")


def is_qdq(graph: Graph) -> bool:
    """Whether a graph is a QDQ model (QuantizeLinear/DequantizeLinear nodes): ``from_qdq``
    turns it into a quantized graph, with no calibration."""
    return any(n.op in _QDQ_OPS for n in graph.nodes)


# ---- calibration samples ---------------------------------------------------------------------


def calibration_from_npz(path, graph: Graph) -> list[dict]:
    """Samples from an ``.npz`` holding one array per graph input, named after it, each
    with a leading axis of samples: ``[samples, *input shape]``, or samples along the
    input's batch axis ``[samples, *input shape[1:]]`` (grouped into the model's batch; the
    last group completed with the first samples again). Raises CalibrationError naming the
    array and what was expected."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CalibrationError(f"{path}: not a readable .npz file ({type(e).__name__}: {e}); "
                               "write one with numpy.savez(path, **{input name: samples})"
                               ) from None
    return _samples_from_arrays(arrays, graph, str(path))


def _samples_from_arrays(arrays: dict, graph: Graph, where: str) -> list[dict]:
    names = list(graph.inputs)
    unknown = sorted(set(arrays) - set(names))
    missing = [n for n in names if n not in arrays]
    if unknown or missing:
        raise CalibrationError(
            f"{where}: " + "; ".join(filter(None, [
                f"arrays {unknown} name no input of the graph" if unknown else "",
                f"no array for the inputs {missing}" if missing else ""]))
            + f". The graph's inputs are {names}: give one array per input, named after it")
    per_input = {}
    for name in names:
        t = graph.types[name]
        a = _as_input_dtype(np.asarray(arrays[name]), t, where, name)
        rank, shape = len(t.shape), tuple(t.shape)
        expected = (f"[samples,{','.join(map(str, shape))}]" +
                    (f" or [samples,{','.join(map(str, shape[1:]))}] (along the batch axis, "
                     f"grouped by {shape[0]})" if rank else ""))
        got = f"{a.dtype}[{','.join(map(str, a.shape))}]"
        if a.ndim not in (rank, rank + 1):
            raise CalibrationError(f"{where}: array {name!r} is {got}, of rank {a.ndim}, but "
                                   f"input {name!r} is {t}: expected rank {rank + 1} or {rank} "
                                   f"({expected})")
        if a.shape == shape:
            samples = [a]
        elif a.ndim == rank + 1 and a.shape[1:] == shape:
            samples = list(a)
        elif rank and a.ndim == rank and a.shape[1:] == shape[1:] and shape[0]:
            # Along the batch axis: batches of the model's size, the last one completed with
            # the first samples again (the maxima calibration records do not change).
            index = np.arange(-(-a.shape[0] // shape[0]) * shape[0]) % max(a.shape[0], 1)
            samples = [a[index[k:k + shape[0]]] for k in range(0, len(index), shape[0])]
        else:
            raise CalibrationError(f"{where}: array {name!r} is {got} but input {name!r} is "
                                   f"{t}: expected {expected}")
        if not samples:
            raise CalibrationError(f"{where}: array {name!r} holds no samples")
        per_input[name] = samples
    counts = {n: len(s) for n, s in per_input.items()}
    if len(set(counts.values())) > 1:
        raise CalibrationError(f"{where}: the inputs have different numbers of samples "
                               f"{counts}; give every input the same number")
    return [{n: per_input[n][k] for n in names} for k in range(counts[names[0]])]


def _as_input_dtype(a: np.ndarray, t: TensorType, where: str, name: str) -> np.ndarray:
    want = np.dtype(t.dtype)
    if a.dtype == want:
        return a
    if a.dtype.kind == "f" and want.kind == "f":
        return a.astype(want)
    raise CalibrationError(f"{where}: array {name!r} is {a.dtype} but input {name!r} is "
                           f"{t.dtype}: store the samples as the model takes them "
                           f"(preprocessed, {t.dtype})")


def _samples(graph: Graph, calibration) -> list[dict]:
    """Calibration in any accepted form (module doc of quantize_graph) as a list of feeds."""
    if calibration is None:
        raise CalibrationError("a float model needs calibration samples to choose its int8 "
                               "scales: pass a list of {input: array} feeds, a dict of "
                               "sample arrays or an .npz path")
    if isinstance(calibration, (str, os.PathLike)):
        samples = calibration_from_npz(calibration, graph)
    elif isinstance(calibration, dict):
        samples = _samples_from_arrays(calibration, graph, "calibration")
    else:
        samples = [s for k, feeds in enumerate(calibration)
                   for s in _samples_from_arrays(feeds, graph, f"calibration sample {k}")]
    if not samples:
        raise CalibrationError("no calibration samples were given")
    return samples


# ---- which nodes become integer ones ---------------------------------------------------------


@dataclass
class _Layer:
    """A Conv/Gemm/MatMul that becomes QConv/QGemm, in float64: ``weight`` [O, ...] with
    Gemm's alpha and the epilogue's constant per-channel Muls (a layer scale) folded in,
    ``bias`` [O] (its own bias and the epilogue's constant Adds and Muls; ``linear``: those
    epilogue steps, which calibration applies), the residual value (or ""), and its
    activations as one clamp [lo, hi] (infinite when absent). ``axis``: the output's channel
    axis (-1 for a MatMul, whose leading axes become QGemm rows). ``head``: the epilogue
    steps up to the clamp; ``tail``: the unary steps from the first one with no exact int8
    form (SiLU, HardSwish, Sigmoid, ...) on, with constant Adds/Muls of one value among
    them (_uniform), done by a QLut after the layer."""

    weight: np.ndarray
    bias: np.ndarray
    linear: tuple
    residual: str
    lo: float
    hi: float
    axis: int = 1
    head: tuple = ()
    tail: tuple = ()
    after: tuple = ()  # (op, input index, value): an Add/Mul of the QLut's result by a value


def _per_channel(c: np.ndarray, out_shape, channel_axis: int):
    """A constant broadcast along the output channel only, as a vector [O], or None."""
    channels = out_shape[channel_axis]
    if c.ndim > len(out_shape):
        return None
    padded = (1,) * (len(out_shape) - c.ndim) + c.shape
    if any(d != 1 and (k != channel_axis or d != channels) for k, d in enumerate(padded)):
        return None
    return np.broadcast_to(c.astype(np.float64).reshape(-1), (channels,)).copy()


def _uniform(graph: Graph, name: str, out_shape, channel_axis: int):
    """A constant operand of an epilogue Add/Mul that is one value for every element of the
    output (a scalar, or a per-channel vector of equal entries), as a float32 scalar, or
    None."""
    c = graph.initializers.get(name)
    if c is None or c.size == 0:
        return None
    vector = _per_channel(c, out_shape, channel_axis)
    if vector is None or not (c == c.reshape(-1)[0]).all():
        return None
    return np.float32(c.reshape(-1)[0])


def _tail_function(graph: Graph, node: Node, layer: "_Layer"):
    """The layer's table steps as a function of one float32 array (the QLut's table), its
    constant operands (_uniform) as scalars."""
    out = graph.types[node.outputs[0]].shape
    operands = [_uniform(graph, i, out, layer.axis) if i in graph.initializers else None
                for i in node.inputs]
    return lambda v: apply_epilogue(v, layer.tail, operands)


def _clamp(steps):
    """The Relu/Clip steps as one clamp (lo, hi): a composition of clamps is a clamp."""
    lo, hi = -math.inf, math.inf
    for op, *args in steps:
        a, b = (0.0, math.inf) if op == "Relu" else (
            -math.inf if args[0] is None else float(args[0]),
            math.inf if len(args) < 2 or args[1] is None else float(args[1]))
        lo, hi = min(max(lo, a), b), min(max(hi, a), b)
    return lo, hi


def _layer_form(graph: Graph, node: Node) -> _Layer | str:
    """The node as a _Layer, or why it has to stay float (``float_reason``, module doc)."""
    if node.op not in OWN_INPUTS or not node.outputs:
        return f"{node.op} is not a Conv, Gemm or MatMul"
    types, inits = graph.types, graph.initializers
    own = OWN_INPUTS[node.op]
    ins = list(node.inputs) + [""] * (own - len(node.inputs))
    x, out = types[ins[0]], types[node.outputs[0]]
    w = inits.get(ins[1])
    if x.dtype != "float32" or out.dtype != "float32":
        return f"its input and output are {x.dtype} and {out.dtype}, not float32"
    if w is None:
        return f"its weight {ins[1]!r} is computed at run time (an int8 layer needs a constant one)"
    if w.ndim not in (2, 4) or ins[0] in inits:
        return (f"its weight has {w.ndim} axes (an int8 layer takes 2 or 4)" if ins[0] not in
                inits else "its data input is a constant")
    if own > 2 and ins[2] and ins[2] not in inits:
        return f"its bias {ins[2]!r} is computed at run time"
    c = inits[ins[2]] if own > 2 and ins[2] else None
    if node.op == "Conv":
        if w.ndim != 4 or len(x.shape) != 4:
            return f"a {len(x.shape) - 2}-D convolution (int8 layers are 2-D convolutions)"
        weight = w.astype(np.float64)
        bias = np.zeros(w.shape[0]) if c is None else c.astype(np.float64).reshape(-1)
    elif node.op == "Gemm":
        a = node.attrs
        if a["transA"] or w.ndim != 2:
            return "a Gemm with transA=1" if a["transA"] else f"its weight has {w.ndim} axes"
        weight = (w if a["transB"] else w.T).astype(np.float64) * a["alpha"]
        bias = np.zeros(weight.shape[0]) if c is None else _per_channel(c, out.shape, 1)
        if bias is None:
            return f"its bias {c.shape} is not one value per output channel"
        bias = bias * a["beta"]
    else:  # MatMul: the rows of x's leading axes (a transformer's Linear on [B, S, D])
        if w.ndim != 2 or len(x.shape) < 2 or not x.static or not out.static:
            return (f"its weight has {w.ndim} axes" if w.ndim != 2 else
                    f"its input has rank {len(x.shape)}" if len(x.shape) < 2 else
                    f"its shapes {x} -> {out} are only known at run time")
        weight, bias = w.T.astype(np.float64), np.zeros(w.shape[1])
    axis = 1 if node.op != "MatMul" else len(out.shape) - 1
    linear, residual, activations, head, tail, after = [], "", [], [], [], ()
    for op, *args in node.attrs.get("epilogue", ()):
        if after:  # nothing after the Add/Mul that follows the table
            return f"its epilogue goes on with {op} after the {after[0]} that follows its table"
        # A constant Add/Mul of one value for every element after the table (PP-LCNetV3's
        # learnable affine a * hardswish(x) + b) keeps the tail a function of one int8
        # value: the table computes it.
        if tail and op in ("Add", "Mul") and _uniform(graph, node.inputs[args[0]], out.shape,
                                                      axis) is not None:
            tail.append((op, *args))
            continue
        # SE's x * sigmoid(gate): a QMul after the table; YOLO's x + silu(conv): a QAdd
        # (YOLO (small) in cosine to fp32: 0.99974 -> 0.99933 on the bench's test feed,
        # 0.99882 -> 0.99912 in the mean over six; docs/graph.md).
        if tail and op == "Mul":
            operand = node.inputs[args[0]]
            if operand in inits or types[operand] != out:
                return (f"its epilogue multiplies the {tail[0][0]} result by "
                        f"{'a per-channel constant' if operand in inits else types[operand]}"
                        f" (after a table an int8 layer takes a constant of one value, folded "
                        f"into the table, or a run-time value of the output's type {out})")
            after = (op, args[0], operand)
            continue
        if tail and op == "Add" and node.inputs[args[0]] not in inits and \
                types[node.inputs[args[0]]] == out:
            after = (op, args[0], node.inputs[args[0]])
            continue
        if tail or op in _LUT_STEPS:  # from here on a function of one int8 value: a table
            if op not in EPILOGUE_UNARY:
                return (f"its epilogue adds a run-time value of type "
                        f"{types[node.inputs[args[0]]]} after {tail[0][0]} (a lookup table's "
                        f"result), broadcast to {out} (QAdd takes the output's type)"
                        if op == "Add" and node.inputs[args[0]] not in inits else
                        f"its epilogue's {op} after {tail[0][0]} by a per-channel constant "
                        f"has no int8 form (a table is one function for every channel)"
                        if op == "Add" else
                        f"its epilogue's {op} after {tail[0][0]} has no int8 form")
            tail.append((op, *args))
            continue
        head.append((op, *args))
        if op in ("Relu", "Clip"):
            activations.append((op, *args))
            continue
        if op not in ("Add", "Mul"):
            return (f"its epilogue's {op} has no int8 form (an int8 layer's epilogue: constant "
                    f"Adds and Muls, one residual Add, Relu/Clip, then a table for "
                    f"{', '.join(_LUT_STEPS)})")
        if activations:  # no Add or Mul after the clamp
            return f"its epilogue has an {op} after {activations[-1][0]} (an int8 layer clamps last)"
        operand = node.inputs[args[0]]
        if operand in inits and not residual:  # folded: a bias, or a per-channel scale
            vector = _per_channel(inits[operand], out.shape, axis)
            if vector is None:
                return (f"its epilogue's {op} of a constant {inits[operand].shape} is not "
                        f"per output channel")
            linear.append((op, *args))
            if op == "Add":
                bias = bias + vector
            else:
                weight = weight * vector.reshape((-1,) + (1,) * (weight.ndim - 1))
                bias = bias * vector
        elif op == "Mul" or residual or types[operand] != out:
            return (f"its epilogue's {op} of a constant comes after its residual Add (an int8 "
                    f"layer scales and shifts before it adds its residual)"
                    if operand in inits else
                    "its epilogue multiplies by a run-time value (an int8 layer scales by "
                    "constants only)" if op == "Mul" else
                    "its epilogue adds a second run-time value (an int8 layer takes one "
                    "residual)" if residual else
                    f"its epilogue adds a run-time value of type {types[operand]}, broadcast "
                    f"to {out} (a residual must have the output's type)")
        else:
            residual = operand
    return _Layer(weight, bias, tuple(linear), residual, *_clamp(activations), axis,
                  tuple(head), tuple(tail), after)


class _Classes:
    """Union-find over value names: values that must share one scale."""

    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, v: str) -> str:
        self.parent.setdefault(v, v)
        while self.parent[v] != v:
            self.parent[v] = self.parent[self.parent[v]]
            v = self.parent[v]
        return v

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


@dataclass
class _Plan:
    layers: dict      # node name -> _Layer
    kinds: dict       # node name -> "layer" | "same" | "pool" | "lut" for the nodes made integer
    int8: set         # values the quantized graph holds as int8
    classes: _Classes
    float_reasons: dict  # node name -> why it stays float (the nodes not in kinds)


def _after_lut(node: Node) -> str:
    """The calibration key of a layer's QLut result when an Add/Mul follows it."""
    return f"{node.name}/after_lut"


def _is_int8_binary(graph: Graph, node: Node, int8: set) -> bool:
    """An Add of two int8 values of the output's shape (a QAdd), a Mul of two int8 values
    that broadcast to it (a QMul: squeeze-excitation's features times its gate [N, C, 1, 1])."""
    if node.op not in ("Add", "Mul") or len(node.inputs) != 2 or len(node.outputs) != 1:
        return False
    out = graph.types[node.outputs[0]]
    if out.dtype != "float32" or not all(v in int8 for v in node.inputs):
        return False
    shapes = [graph.types[v].shape for v in node.inputs]
    if node.op == "Add" or not out.static or not all(graph.types[v].static for v in node.inputs):
        return all(s == out.shape for s in shapes)
    try:
        return np.broadcast_shapes(*map(tuple, shapes)) == tuple(out.shape)
    except ValueError:
        return False


def _matmul_factor(graph: Graph, node: Node) -> float | None:
    """The constant positive scalar a MatMul's epilogue multiplies its result by (attention's
    ``(Q x K^T) * d**-0.5``: the QMatMul's requantization takes it), 1.0 without an
    epilogue, None for any other epilogue."""
    steps = node.attrs.get("epilogue") or ()
    if not steps:
        return 1.0 if len(node.inputs) == 2 else None
    if len(steps) != 1 or steps[0][0] != "Mul" or len(node.inputs) != 3 or steps[0][1] != 2:
        return None
    k = graph.initializers.get(node.inputs[2])
    if k is None or np.size(k) != 1 or not float(np.asarray(k).reshape(())) > 0:
        return None
    return float(np.asarray(k).reshape(()))


def split_dense_epilogues(graph: Graph) -> Graph:
    """matmul_epilogue.split_layer_epilogues with this quantizer's own test of what an int8
    layer takes (_layer_form)."""
    return split_layer_epilogues(graph, lambda g, n: isinstance(_layer_form(g, n), _Layer))


def _is_activation_matmul(graph: Graph, node: Node) -> bool:
    """A MatMul of two values computed at run time (attention's Q x K^T and P x V), of
    static shapes, without an epilogue or with a constant positive scalar Mul as its only
    epilogue: a QMatMul."""
    if node.op != "MatMul" or _matmul_factor(graph, node) is None or len(node.outputs) != 1:
        return False
    if node.inputs[0] in graph.initializers:
        return False
    if node.inputs[1] in graph.initializers and graph.initializers[node.inputs[1]].ndim < 3:
        return False  # a dense layer's weight: a QGemm (_layer_form)
    ts = [graph.types[v] for v in (*node.inputs[:2], node.outputs[0])]
    return all(t.dtype == "float32" and t.static and len(t.shape) >= 2 for t in ts)


def _is_channel_concat(graph: Graph, node: Node) -> bool:
    """A Concat of images along channels (YOLO's C2f joins its halves and its bottlenecks'
    outputs so): its int8 inputs take one shared scale, the largest range of theirs, and it
    stays int8 (a QConv or QAdd writing one of them requantizes to that scale for free;
    on the accelerator its inputs are written into their slices of its output)."""
    out = graph.types[node.outputs[0]] if node.outputs else None
    return node.op == "Concat" and out is not None and len(out.shape) == 4 and \
        int(node.attrs.get("axis", 1)) % 4 == 1


def _int8_move(node: Node) -> bool:
    """A Pad that only moves (or repeats) its input's values, so it keeps them int8 in
    their scale: by reflection, edge or wrap, or by the value 0 (in int8 the zero point).
    (A nearest Resize would too, but then its input and output share one scale, and with
    a channel Concat after it, as in an FPN, the Concat's: YOLO (small) 0.99947 -> 0.99923
    in mean cosine to fp32. Float, it requantizes into the Concat's scale.)"""
    if len(node.inputs) != 1 or node.op != "Pad":
        return False
    a = node.attrs
    return a.get("mode", "constant") in ("reflect", "edge", "wrap") or \
        float(a.get("value", 0.0)) == 0.0


def _mid(node: Node) -> str:
    """The calibration key of a layer's int8 result before its QLut tail (not a value of the
    graph: the quantized graph names it afresh)."""
    return f"{node.name}/before_lut"


def _plan(graph: Graph, shuffles=frozenset()) -> _Plan:
    """Which nodes become integer ones; ``shuffles``: the Transposes of qtranspose.py's
    pixel shuffles, int8 in the same scale (other Transposes stay float: int8 ones made
    ConvNeXt's residual Adds QAdds, 0.99946 -> 0.99931 in mean cosine to fp32)."""
    plan = _Plan({}, {}, set(), _Classes(), {})
    producers = {o: n for n in graph.nodes for o in n.outputs if o}
    for node in graph.nodes:
        if node.op in ("MatMul", "Gemm") and _reads_recurrent(graph, node, producers, plan):
            plan.kinds[node.name] = "wide"  # float in and out, a 16-bit product inside
            continue
        layer = _layer_form(graph, node)
        out = node.outputs[0] if node.outputs else ""
        int8_in = bool(node.inputs) and all(i in plan.int8 for i in node.inputs)
        if isinstance(layer, _Layer):
            plan.layers[node.name], plan.kinds[node.name] = layer, "layer"
            if layer.residual:
                plan.classes.union(layer.residual, _mid(node) if layer.tail else out)
        elif node.op in _LUT_OPS and int8_in and len(node.inputs) == 1 and \
                len(node.outputs) == 1 and graph.types[out].dtype == "float32":
            plan.kinds[node.name] = "lut"
        elif len(node.outputs) == 1 and int8_in and (
                node.op in _SAME_SCALE + ("Slice",) or node.name in shuffles or
                _int8_move(node) or (
                    node.op == "Concat" and len({plan.classes.find(i)
                                                 for i in node.inputs}) == 1)
                or _is_channel_concat(graph, node)):
            plan.kinds[node.name] = "same"
            for i in (node.inputs if node.op == "Concat" else node.inputs[:1]):
                plan.classes.union(i, out)
        elif _is_activation_matmul(graph, node):
            plan.kinds[node.name] = "matmul"
        elif node.op in _RECURRENT and recurrent_problem(graph, node) is None:
            plan.kinds[node.name] = "recurrent"  # float in and out: integer products inside
            continue
        elif _is_int8_binary(graph, node, plan.int8):
            plan.kinds[node.name] = "binary"
        elif node.op == "GlobalAveragePool" and int8_in and len(graph.types[out].shape) == 4:
            plan.kinds[node.name] = "pool"  # its own scale (_pool_params)
        else:
            plan.float_reasons[node.name] = _float_reason(graph, node, plan, layer)
            continue
        plan.int8.add(out)
    return plan


# Operators that only move a value (the way from a recurrent layer's output to its head).
_MOVES = ("Squeeze", "Unsqueeze", "Reshape", "Flatten", "Transpose", "Gather", "Slice",
          "Identity", "Concat")


def _reads_recurrent(graph: Graph, node: Node, producers: dict, plan: _Plan) -> bool:
    """Whether a MatMul/Gemm with a constant weight reads (through views) the output of a
    recurrent layer the plan makes QLSTM/QGRU/QRNN: such a head keeps the 16-bit form of
    the recurrence (QMatMulWide) rather than narrowing the state to int8."""
    v = dense_input(graph, node)
    seen = 0
    while v is not None and seen < 16:
        p = producers.get(v)
        if p is None:
            return False
        if plan.kinds.get(p.name) == "recurrent":
            return True
        if p.op not in _MOVES or not p.inputs:
            return False
        v, seen = p.inputs[0], seen + 1
    return False


def _float_reason(graph: Graph, node: Node, plan: _Plan, layer_reason: str) -> str:
    """Why ``_plan`` leaves a node float, named by what is missing: the reader of the
    partition's report sees it (``float_reason``, module doc)."""
    out = graph.types[node.outputs[0]] if node.outputs else None
    inputs = [i for i in node.inputs if i]
    if any(isinstance(v, Graph) for v in node.attrs.values()):
        return ("control flow: its bodies' MatMul, Gemm, LSTM, GRU and RNN layers with "
                "constant weights take the 16-bit integer form (qbody.py), the rest of "
                "them stays float")
    if node.op == "MatMul" and not any(i in graph.initializers for i in node.inputs[:2]):
        ts = [graph.types[v] for v in (*node.inputs[:2], *node.outputs)]
        if node.attrs.get("epilogue"):
            steps = ", ".join(s[0] for s in node.attrs["epilogue"])
            return (f"a MatMul of two run-time values with an epilogue ({steps}): QMatMul "
                    f"takes only a Mul by a constant positive scalar")
        if not all(t.static for t in ts):
            return "a MatMul of two run-time values whose shapes are only known at run time"
        return "a MatMul of two run-time values of rank < 2 or not float32"
    if node.op in OWN_INPUTS:
        return layer_reason
    if node.op in _RECURRENT:
        return recurrent_problem(graph, node)
    if node.op == "ConvTranspose" and conv_transpose_reason(graph, node):
        return conv_transpose_reason(graph, node)
    if out is None or out.dtype != "float32":
        return (f"it computes {out.dtype} values (indices, shapes or masks), not float data"
                if out is not None else "it has no output")
    floats = [i for i in inputs if i not in plan.int8 and i not in graph.initializers]
    int8_forms = (*_LUT_OPS, *_SAME_SCALE, "Slice", "Concat", "GlobalAveragePool", "Add",
                  "Mul")
    if node.op == "AveragePool":  # the others became depthwise convolutions (qforms.py)
        a = node.attrs
        why = ("count_include_pad=0 with padding" if any(a["pads"]) and
               not a.get("count_include_pad") else "a ceil-mode window past the padding"
               if a.get("ceil_mode") else None)
        if why and len(a["kernel_shape"]) == 2:
            return (f"its border windows divide by fewer taps than the kernel's ({why}): its "
                    f"int8 form, a depthwise convolution, divides every window by the kernel "
                    f"size")
        return (f"the quantizer has no int8 form of this AveragePool (its int8 form is a 2-D "
                f"depthwise convolution: kernel {list(a['kernel_shape'])}, dilations "
                f"{list(a['dilations'])})")
    if node.op == "Pad" and not floats and len(inputs) == 1:
        return (f"it pads with the value {node.attrs.get('value')} (an int8 Pad reflects, "
                f"repeats edges or pads with 0)")
    if node.op == "Resize" and not floats and len(inputs) == 1:
        return ("Resize stays float: it requantizes into its reader's scale (an int8 "
                "nearest Resize would share one scale with its input, and after a Concat "
                "with the Concat's other inputs)" if node.attrs.get("mode") == "nearest" else
                f"its mode {node.attrs.get('mode')!r} interpolates between values")
    if node.op not in int8_forms + ("Pad",):
        return f"the quantizer has no int8 form of {node.op}"
    if floats:
        return f"its input {floats[0]!r} is float ({node.op} is int8 only on int8 inputs)"
    if any(i in graph.initializers for i in inputs):
        return f"{node.op} of a constant (the int8 form takes run-time int8 values)"
    if node.op == "Concat":
        return "its int8 inputs have different scales (an int8 Concat needs one shared scale)"
    if node.op in ("Add", "Mul"):
        shapes = ", ".join(str(graph.types[i]) for i in inputs)
        if node.op == "Mul":
            return (f"its operands ({shapes}) or output {out} have sizes known only at run "
                    f"time (a QMul broadcasts static shapes)")
        return (f"it broadcasts its operands ({shapes}) to {out} (QAdd takes two operands "
                f"of the output's shape)")
    return f"no int8 form of this {node.op} ({len(inputs)} inputs, output {out})"


# ---- calibration -----------------------------------------------------------------------------


def _calibrate(graph: Graph, samples: list[dict], plan: _Plan, needed: set):
    """Run the float graph on every sample: max |x| of the ``needed`` values, and per layer
    the per-channel max |acc + bias| in float (its output before residual and activation)."""
    maxabs = dict.fromkeys(needed, 0.0)
    mins: dict[str, tuple] = {}  # (min, max), for zero points
    mids = {node.name: _mid(node) for node in graph.nodes
            if node.name in plan.layers and plan.layers[node.name].tail}
    maxabs.update(dict.fromkeys(mids.values(), 0.0))
    afters = {node.name: _after_lut(node) for node in graph.nodes
              if node.name in plan.layers and plan.layers[node.name].after}
    maxabs.update(dict.fromkeys(afters.values(), 0.0))
    pre = {name: np.zeros(len(layer.bias)) for name, layer in plan.layers.items()}
    # per layer and sample: the mean of its float pre-activation per channel (biascorr.py)
    sums: dict[str, list] = {name: [] for name in plan.layers}
    kept: dict[str, list] = {v: [] for v in maxabs}

    def record(name, v):
        v = np.asarray(v, dtype=np.float32).reshape(-1)
        maxabs[name] = max(maxabs[name], float(np.abs(v).max(initial=0)))
        lo, hi = mins.get(name, (0.0, 0.0))
        mins[name] = (min(lo, float(v.min(initial=0))), max(hi, float(v.max(initial=0))))
        kept[name].append(v[::max(1, v.size // _KEPT)])

    last_use = {i: k for k, node in enumerate(graph.nodes) for i in node.inputs}
    keep = set(graph.initializers)
    for feeds in samples:
        env = {**graph.initializers, **feeds}
        for name in needed & set(feeds):
            record(name, feeds[name])
        for k, node in enumerate(graph.nodes):
            ins = [env[i] if i else None for i in node.inputs]
            layer = plan.layers.get(node.name)
            if layer is None:
                results = evaluate_node(node, ins)
            else:
                with np.errstate(all="ignore"):
                    y = KERNELS[node.op](node.attrs, *ins[:OWN_INPUTS[node.op]])
                    before = apply_epilogue(y, layer.linear, ins)
                    axes = tuple(d for d in range(y.ndim) if d != layer.axis)
                    sums[node.name].append(before.mean(axis=axes, dtype=np.float64))
                    pre[node.name] = np.maximum(pre[node.name], np.abs(before).max(axis=axes))
                    y = apply_epilogue(y, layer.head, ins)
                    if layer.tail:
                        key = mids[node.name]
                        record(key, y)
                    y = apply_epilogue(y, layer.tail, ins)
                    if layer.after:
                        record(afters[node.name], y)
                        y = apply_epilogue(y, [layer.after[:2]], ins)
                    results = (y,)
            for o, v in zip(node.outputs, results):
                if o:
                    env[o] = v
                    if o in maxabs:
                        record(o, v)
            for i in node.inputs:
                if i and last_use.get(i) == k and i not in keep:
                    env.pop(i, None)
    means = {name: np.array(v) if v else np.zeros((1, len(plan.layers[name].bias)))
             for name, v in sums.items()}
    return maxabs, mins, pre, kept, means


def _mse_ranges(graph: Graph, plan: _Plan, top: dict, members: dict, asym=()) -> dict:
    """The "mse" method: the MSE range (_mse_range) for the classes of values that were never
    negative on the samples (a Relu output), a mildly clipped one for signed values
    (``_signed_range``; the maximum for a graph output), the maximum for the inputs of
    a QLut and for the outputs of a layer clamped above (Relu6: the clamp already bounds
    the range, and narrowing it cost MobileNetV2 0.9975 -> 0.9970). Measured on the zoo's
    small models (docs/graph.md): MSE ranges for every value lose accuracy on the SiLU
    models (YOLO, EfficientNet: clipping a signed pre-activation or a residual cuts values
    the next layer needs), for non-negative ones they gain (EfficientNet 0.987 -> 0.993,
    ResNet-18 0.9989 -> 0.9992). A class with a zero point (``asym``) searches the upper end
    of [0, t] in 256 steps instead.

    The output of a table whose steps include a constant Add/Mul (PP-LCNetV3's learnable
    affine ``a * hardswish(x) + b``) takes the MSE range even when signed (unless it gets a
    zero point): a few channels reach 10x the others' range (PP-OCR rec's 2.76 against 0.27
    for nine channels in ten). Measured (small, cosine to fp32 on the bench's test feed,
    then the mean over six): PP-OCR rec 0.953 -> 0.988 (0.965 -> 0.981), det 0.522 -> 0.714
    (0.338 -> 0.305). For every table it costs the SiLU and plain HardSwish models
    (EfficientNet 0.883 -> 0.865, MobileNetV3 0.707 -> 0.657 in the mean): it stays with
    these."""
    kept = {plan.classes.find(_mid(n)) for n in graph.nodes
            if n.name in plan.layers and plan.layers[n.name].tail}
    kept |= {plan.classes.find(n.inputs[0]) for n in graph.nodes
             if plan.kinds.get(n.name) == "lut"}
    kept |= {plan.classes.find(n.outputs[0]) for n in graph.nodes
             if n.name in plan.layers and not plan.layers[n.name].tail
             and math.isfinite(plan.layers[n.name].hi)}
    affine_tails = _affine_tails(graph, plan)
    # (a graph output keeps its maximum: its extremes are the answer; a signed graph input
    # is clipped like other values: U-Net, full size, +7.8e-6 against onnxruntime with,
    # +1.1e-6 without)
    ends = {plan.classes.find(v) for v in graph.outputs}
    out = {}
    for root, t in top.items():
        values = np.concatenate(members[root])
        if root in affine_tails and root not in asym:
            out[root] = _mse_range(values, t)
        elif root in kept or root in ends:
            out[root] = t
        elif values.min(initial=0) < 0:
            out[root] = _signed_range(values, t)
        elif root in asym:
            out[root] = mse_top(values, t, _MSE_LOWEST)
        else:
            out[root] = _mse_range(values, t)
    return out


# Ops whose output is never below their input's least value (they move, select or average
# values), and functions into [0, 1] (gates).
_KEEPS_LOW = ("GlobalAveragePool", "AveragePool", "MaxPool", "Flatten", "Reshape", "Identity",
              "Squeeze", "Unsqueeze", "Transpose", "Slice")
_UNIT_OPS = ("Sigmoid", "HardSigmoid")


def _table_lows(graph: Graph, plan: _Plan, roots: set, scale, zero, candidates=()) -> dict:
    """{class root: a lower bound of every value of the class} for the classes among
    ``roots`` whose every member (of ``plan.int8`` and ``candidates``) has one: a value
    QLut tables write (a layer's tail or a lookup node, not one with an Add/Mul after it),
    each table's input of a final scale and zero point (``scale``, ``zero``: a class not
    among ``roots``, or one left unbounded, below), has its tables' least entry (the entries are f at every int8
    input, ``s_in * (q - z_in)``, so nothing it writes is below that least f); an average,
    pooling or view of a bounded value has its bound, and so has a product of one with a
    gate (a Sigmoid or HardSigmoid, in [0, 1]: squeeze-excitation's ``x * gate``); a Relu's
    output 0. A gate's table counts as one when its entries are in [0, 1]."""
    tables = {}  # output value -> (input value, function)
    for n in graph.nodes:
        layer = plan.layers.get(n.name)
        if layer is not None and layer.tail and not layer.after:
            tables[n.outputs[0]] = (_mid(n), _tail_function(graph, n, layer))
        elif plan.kinds.get(n.name) == "lut":
            tables[n.outputs[0]] = (n.inputs[0],
                                    lambda v, n=n: evaluate_node(n, [v])[0])
    values: dict = {}
    for v in set(plan.int8) | set(candidates):
        if plan.classes.find(v) in roots:
            values.setdefault(plan.classes.find(v), []).append(v)

    def bounded(lows):  # (a bound of 0: a table too coarse to write a negative entry)
        return {root: min(min(lows[v] for v in vs), 0.0) for root, vs in values.items()
                if all(v in lows for v in vs)}

    # A table's least entry needs its input's final scale: first with no table reading a
    # class among ``roots``, then also reading the roots left unbounded (their scales
    # stay), until no root a table read is bounded after all.
    lows, _ = _bounds(graph, plan, tables, roots, scale, zero)
    open_roots = set(bounded(lows))
    while True:
        lows, used = _bounds(graph, plan, tables, open_roots, scale, zero)
        out = bounded(lows)
        read = (set(out) - open_roots) & used
        if not read:
            return out
        open_roots |= read


def _bounds(graph: Graph, plan: _Plan, tables: dict, open_roots: set, scale, zero):
    """({value: lower bound}, the classes among roots whose scales the tables read) for
    _table_lows, no table read from a class in ``open_roots``."""
    used: set = set()

    def final(v):
        root = plan.classes.find(v)
        if root in open_roots:
            return False
        used.add(root)
        return True

    lows: dict = {}  # value -> its lower bound
    unit: set = set()  # values in [0, 1]
    for n in graph.nodes:
        if not n.outputs or not n.outputs[0]:
            continue
        out = n.outputs[0]
        layer = plan.layers.get(n.name)
        if layer is not None and layer.tail and layer.after and layer.after[0] == "Mul":
            # a gate's table times a bounded value (the QMul after the layer's table)
            if layer.after[2] in lows and final(_mid(n)):
                grid = (np.arange(-128, 128) - zero(_mid(n))).astype(np.float32) * \
                    np.float32(scale(_mid(n)))
                with np.errstate(all="ignore"):
                    y = np.asarray(_tail_function(graph, n, layer)(grid), np.float64)
                if np.isfinite(y).all() and y.min() >= 0 and y.max() <= 1:
                    lows[out] = min(lows[layer.after[2]], 0.0)
        elif out in tables and final(tables[out][0]):
            x_in, f = tables[out]
            grid = (np.arange(-128, 128) - zero(x_in)).astype(np.float32) * np.float32(
                scale(x_in))
            with np.errstate(all="ignore"):
                y = np.asarray(f(grid), np.float64)
            lo = float(np.nanmin(y)) if np.isfinite(y).any() else -math.inf
            if math.isfinite(lo):
                lows[out] = lo
                if lo >= 0 and float(np.nanmax(y)) <= 1:
                    unit.add(out)
        elif n.op in _UNIT_OPS and n.name not in plan.layers:
            lows[out] = 0.0
            unit.add(out)
        elif n.op == "Relu" and n.name not in plan.layers:
            lows[out] = 0.0
        elif n.op == "Add" and len(n.inputs) == 2 and n.name not in plan.layers and \
                all(i in lows for i in n.inputs):
            lows[out] = min(lows[n.inputs[0]] + lows[n.inputs[1]], 0.0)  # (a sum of two)
        elif n.op == "Concat" and n.inputs and all(i in lows for i in n.inputs):
            lows[out] = min(lows[i] for i in n.inputs)  # (a concatenation of bounded values)
            if all(i in unit for i in n.inputs):
                unit.add(out)
        elif (n.op in _KEEPS_LOW or _int8_move(n)) and n.inputs and n.inputs[0] in lows:
            lows[out] = lows[n.inputs[0]]  # (a zero Pad adds 0, above a bound <= 0)
            if n.inputs[0] in unit:
                unit.add(out)
        elif n.op == "Mul" and len(n.inputs) == 2 and n.name not in plan.layers:
            a, c = n.inputs
            if c in unit and a in lows or a in unit and c in lows:
                lows[out] = min(lows[c if a in unit else a], 0.0)
    return lows, used


def _affine_tails(graph: Graph, plan: _Plan) -> set:
    """The classes of the outputs of tables whose steps include a constant Add/Mul."""
    return {plan.classes.find(n.outputs[0]) for n in graph.nodes
            if n.name in plan.layers and not plan.layers[n.name].after
            and any(s[0] in ("Add", "Mul") for s in plan.layers[n.name].tail)}


def _zero_point_pays(samples: dict) -> bool:
    """Whether a signed value's calibrated [min, max] with a zero point (256 steps, as
    onnxruntime's MinMax calibration gives every activation) rounds it with less squared
    error than its symmetric range (``_signed_range``), judged the way a test input meets
    it: each calibration sample quantized with the ranges the other samples give
    (leave-one-out), the errors summed. A lopsided value (U-Net's concatenation of a
    Relu output and an upsampling's [-1.4, 4.6]) gains up to a bit; one whose minimum moves
    from sample to sample loses what the samples beyond the others' minimum clip (why
    calibrated zero points for every signed value measured worse, ``_SIGNED_ZERO_POINTS``).
    ``samples``: {sample index: [the kept elements of each member of the class]}."""
    from .qzero import quantize_affine

    parts = [np.concatenate(v).astype(np.float64) for _, v in sorted(samples.items())]
    parts = [p for p in parts if p.size]
    if len(parts) < 2:
        return False
    sym = aff = 0.0
    for k, held in enumerate(parts):
        rest = np.concatenate(parts[:k] + parts[k + 1:])
        top = float(np.abs(rest).max())
        t = _signed_range(rest, top)
        s = _scale(t)
        sym += float(((np.clip(np.rint(held / s), -128, 127) * s - held) ** 2).sum())
        sa, za = affine(float(rest.min()), float(rest.max()))
        aff += float(((quantize_affine(held, sa, za) - held) ** 2).sum())
    return aff < sym


def _signed_range(values: np.ndarray, top: float) -> float:
    """The range of a signed value the "mse" method gives: the least squared error range
    (``_mse_range``) among those that clip at most ``_SIGNED_CLIP`` of the calibration
    samples (so in [the (1 - _SIGNED_CLIP) quantile of |x|, max |x|]). Unbounded, the least
    squared error of a signed value clips far more (YOLO's concatenated SiLU outputs 12.3 ->
    7.3 by entropy): values a later layer needs, and measured worse at the end (YOLO, full
    size, mean cosine of six: the maximum 0.999701, unbounded MSE 0.999764, entropy
    0.999763, this 0.999775; onnxruntime 0.999765)."""
    if top <= 0 or values.size == 0:
        return top
    floor = percentile_range(values, top, 100 * (1 - _SIGNED_CLIP))
    return _mse_range(values, top, floor / top)


def _mse_range(values: np.ndarray, top: float, lowest: float = _MSE_LOWEST) -> float:
    """The range in [lowest * top, top] (by default ``_MSE_LOWEST``) whose symmetric int8
    rounding (values beyond it clipped) has the least mean squared error over ``values``: a
    few outliers no longer widen every step of the rest."""
    if top <= 0 or values.size == 0:
        return top
    v = values.astype(np.float64)
    best, best_err = top, math.inf
    # The error of each candidate computed in one buffer (no temporaries: each of a large
    # value's was a fresh allocation); the same operations on the same elements in the same
    # order as ((clip(rint(v / s), -128, 127) * s - v) ** 2).mean(), so the same sums.
    buf = np.empty_like(v)
    for t in np.linspace(lowest, 1.0, 57) * top:
        s = float(np.float32(t / 127))
        np.divide(v, s, out=buf)
        np.rint(buf, out=buf)
        np.clip(buf, -128, 127, out=buf)
        np.multiply(buf, s, out=buf)
        np.subtract(buf, v, out=buf)
        np.multiply(buf, buf, out=buf)
        err = float(buf.mean())
        if err < best_err:
            best, best_err = t, err
    return best


# ---- integer parameters ----------------------------------------------------------------------


def _scale(max_abs: float) -> float:
    """The symmetric scale of a range, as the float32 the kernels use (1/127 for a value
    that was always 0: any scale represents it)."""
    return float(np.float32(max_abs / 127 if max_abs > 0 else 1 / 127))


def _quantize_weights(weight: np.ndarray, per_channel: bool):
    """(w_q int8, s_w [O] float64): symmetric, per output channel or one for all."""
    o = weight.shape[0]
    top = np.abs(weight.reshape(o, -1)).max(axis=1)
    if not per_channel:
        top = np.full(o, top.max())
    scales = np.where(top > 0, top / 127, 1 / 127)
    w_q = np.clip(np.rint(weight / scales.reshape((-1,) + (1,) * (weight.ndim - 1))),
                  -127, 127).astype(np.int8)
    return w_q, scales


def _bias_fit(weight: np.ndarray, w_q: np.ndarray, s_w: np.ndarray, bias: np.ndarray,
              s_in: float):
    """(w_q, s_w) with each channel's weight scale at least |bias| / (s_in * 2^24): a
    channel whose weights are all but zero (a pruned channel after BatchNorm folding:
    PP-OCR's have weights of 1e-40 and biases of 1e-19) would otherwise need a bias far
    beyond int32 in its tiny accumulator scale. Raising the scale costs nothing real: such
    weights round to about 0, which they are."""
    need = np.abs(np.asarray(bias, np.float64)) / (s_in * 2.0 ** 24)
    low = s_w < need
    if not low.any():
        return w_q, s_w
    s_w = np.where(low, need, s_w)
    w_q = np.clip(np.rint(weight / s_w.reshape((-1,) + (1,) * (weight.ndim - 1))),
                  -127, 127).astype(np.int8)
    return w_q, s_w


def _requantization(ratio, bias_q, w_q, calibrated=None, zero_out: int = 0):
    """(multiplier int32[O], bias int32[O] with the rounding term, shift), or None when no
    shift in 0..31 makes the node fit int32 (module doc). ``zero_out``: an output zero
    point folded into the bias with the rounding term (``rint((2**(shift-1) + zero_out *
    2**shift) / multiplier)``), so ``(acc + bias) * multiplier >> shift`` is the output
    step plus ``zero_out`` to within ``multiplier / 2**(shift+1)`` of a step (from_qdq)."""
    worst_acc = 128.0 * np.abs(w_q.reshape(len(ratio), -1).astype(np.float64)).sum(axis=1)
    for shift in range(31, -1, -1):
        m = np.rint(ratio * 2.0 ** shift)
        if np.abs(m).max(initial=0) >= 2**31:
            continue
        if zero_out and not m.all():
            continue  # a multiplier of 0 cannot carry the zero point
        numer = (2.0 ** (shift - 1) if shift else 0.0) + zero_out * 2.0 ** shift
        half = np.rint(numer / np.where(m == 0, np.inf, m))
        bias = bias_q + half
        bound = worst_acc + np.abs(bias)
        if calibrated is not None:
            floor = np.maximum(np.abs(bias), 128 / np.abs(ratio))
            bound = np.minimum(bound, np.maximum(MARGIN * calibrated, floor))
        if (np.abs(bias) < 2**31).all() and (np.abs(m) * np.maximum(bound, 1) < 2**31).all():
            return m.astype(np.int32), bias.astype(np.int32), shift
    return None


def _emit_binary(b: _Builder, op: str, x: str, y: str, s_x: float, s_y: float, s_out: float,
                 out: str, name: str, fresh: bool = True, zeros=(0, 0, 0)) -> None:
    """QAdd (``(x - z_x) * s_x + (y - z_y) * s_y`` in the scale s_out) or QMul (``(x - z_x)
    * (y - z_y) * s_x * s_y``), plus z_out (``zeros``: z_x, z_y, z_out): the largest shift
    in 1..31 with which no step can leave int32 for any int8 inputs."""
    ratios = [s_x / s_out, s_y / s_out] if op == "Add" else [s_x * s_y / s_out]
    # the largest |operand - zero point| of each product
    worst = [(128.0 + abs(zeros[0])) * (128.0 + abs(zeros[1]))] if op == "Mul" else \
        [128.0 + abs(zeros[0]), 128.0 + abs(zeros[1])]
    for shift in range(31, 0, -1):
        m = [round(r * 2**shift) for r in ratios]
        if max(m) < 2**31 and sum(a * w for a, w in zip(m, worst)) + 2 ** (shift - 1) < 2**31:
            break
    attrs = {"multipliers": m, "shift": shift, "scale": float(s_out)}
    if any(zeros):
        attrs["zero_points"] = [int(z) for z in zeros]
    b.add("QAdd" if op == "Add" else "QMul", [x, y], [out], attrs, name, fresh=fresh)


def _matmul_params(ratio: float, calibrated: float) -> tuple[int, int]:
    """(multiplier, shift) of a QMatMul: ``multiplier / 2**shift ~ ratio``, the largest
    shift in 1..31 with ``multiplier * A + 2**(shift-1) < 2**31`` for A bounding |acc|:
    MARGIN times the calibrated maximum, at least the accumulator that fills the output
    range (``128 / ratio``), as for QConv/QGemm."""
    bound = max(MARGIN * calibrated, 128 / ratio, 1.0)
    for shift in range(31, 0, -1):
        m = round(ratio * 2**shift)
        if 1 <= m < 2**31 and m * bound + 2 ** (shift - 1) < 2**31:
            return m, shift
    raise GraphError(f"a MatMul's requantization (ratio {ratio:g}) does not fit int32 for "
                     "any shift; is the calibration data representative?")


def _clamp_q(lo: float, hi: float, s_out: float, z_out: int = 0) -> tuple[int, int]:
    def q(v, default):
        return default if math.isinf(v) else int(np.clip(np.rint(v / s_out) + z_out,
                                                          -128, 127))
    return q(lo, -128), q(hi, 127)


def _pool_params(hw: int, ratio: float = 1.0, offset: float = 0.0) -> tuple[int, int, int]:
    """(multiplier, shift, offset) of QGlobalAveragePool over hw elements from the input's
    scale to the output's (``ratio`` = s_in / s_out) with the zero points' ``offset`` (z_out
    - z_in * ratio, in output steps): the largest shift with which ``sum * multiplier +
    2**(shift-1) + offset`` stays within int32 for any int8 input. The output has its own
    scale: an average of a SiLU or Relu output spans a fraction of the input's range (a
    squeeze-excitation's input), which the input's steps would cover with a few levels."""
    for shift in range(31, 0, -1):
        m = round(2**shift * ratio / hw)
        off = round(offset * 2**shift)
        if m >= 1 and 128 * hw * m + 2 ** (shift - 1) + abs(off) < 2**31:
            return m, shift, off
    raise GraphError(f"global average pool over {hw} elements (scales {ratio:g} apart) "
                     "cannot be done in int32")


class _Builder:
    """New nodes, initializers and types. A node that replaces one of the graph's keeps its
    name; new values and nodes get fresh names."""

    def __init__(self, graph: Graph):
        self.inits, self.types = dict(graph.initializers), dict(graph.types)
        self.nodes: list[Node] = []
        self.node_names = {n.name for n in graph.nodes}

    def value(self, base: str, t: TensorType) -> str:
        k, name = 0, base
        while name in self.types:
            k += 1
            name = f"{base}_{k}"
        self.types[name] = t
        return name

    def const(self, base: str, array: np.ndarray) -> str:
        name = self.value(base, TensorType(str(array.dtype), array.shape))
        self.inits[name] = constant(array)
        return name

    def add(self, op, inputs, outputs, attrs, base: str, *, fresh: bool = True) -> None:
        """A node named ``base`` (``fresh=False``: it replaces the graph's node of that
        name) or a fresh name made from it."""
        k, name = 0, base
        while fresh and name in self.node_names:
            k += 1
            name = f"{base}_{k}"
        self.node_names.add(name)
        self.nodes.append(Node(op, tuple(inputs), tuple(outputs), attrs, name))

    def graph(self, graph: Graph) -> Graph:
        g = remove_dead_code(graph.with_nodes(self.nodes, self.inits, self.types))
        verify_graph(g)
        return g


def _emit_layer(b: _Builder, node: Node, x_q: str, w_q, params, clamp, s_out: float,
                out: str, residual: str = "", z_in: int = 0) -> None:
    """A QConv/QGemm in place of ``node``: params = (multiplier, bias, shift), clamp =
    (lo, hi); ``z_in`` the input's zero point, which a padded QConv's padding reads
    (``pad_value``, qzero.py)."""
    (mult, bias, shift), (lo, hi), base = params, clamp, node.name
    inputs = [x_q, b.const(f"{base}/weight_int8", w_q), b.const(f"{base}/bias_int32", bias),
              b.const(f"{base}/multiplier", mult)] + ([residual] if residual else [])
    attrs = {"shift": int(shift), "lo": int(lo), "hi": int(hi), "scale": float(s_out)}
    if node.op == "Conv":
        attrs = {k: node.attrs[k] for k in ("kernel_shape", "strides", "pads", "dilations",
                                            "group")} | attrs
        if z_in and any(node.attrs["pads"]):
            attrs["pad_value"] = int(z_in)
    b.add("QConv" if node.op == "Conv" else "QGemm", inputs, [out], attrs, base, fresh=False)


def _emit_rows(b: _Builder, graph: Graph, node: Node, x_q: str, w_q, params, clamp,
               s_out: float, out: str, residual: str = "", z_in: int = 0) -> None:
    """_emit_layer, for a MatMul on an N-d input as a QGemm on its rows: Reshape to [rows,
    K] (and the residual to [rows, O]), QGemm, Reshape back (int8 values, same scales)."""
    shape = graph.types[node.inputs[0]].shape
    if node.op != "MatMul" or len(shape) == 2:
        _emit_layer(b, node, x_q, w_q, params, clamp, s_out, out, residual, z_in)
        return
    out_shape = tuple(b.types[out].shape)
    rows = math.prod(shape[:-1])

    def reshape(v, to, base):
        r = b.value(base, TensorType("int8", to))
        b.add("Reshape", [v], [r], {"shape": list(to)}, f"{node.name}/{base.rsplit('/')[-1]}")
        return r

    x2 = reshape(x_q, (rows, shape[-1]), f"{x_q}/rows")
    r2 = reshape(residual, (rows, out_shape[-1]), f"{residual}/rows") if residual else ""
    y2 = b.value(f"{out}/rows", TensorType("int8", (rows, out_shape[-1])))
    _emit_layer(b, node, x2, w_q, params, clamp, s_out, y2, r2)
    b.add("Reshape", [y2], [out], {"shape": list(out_shape)}, f"{node.name}/unrows")


def _convert_attrs(scale: float, zero: int) -> dict:
    """A Quantize's or Dequantize's attributes: the scale, and the zero point if any."""
    return {"scale": scale, **({"zero_point": int(zero)} if zero else {})}


def _table(f, s_in: float, s_out: float, z_in: int = 0, z_out: int = 0) -> np.ndarray:
    """The int8 -> int8 table of an element-wise float function f between two scales: entry
    k is Quantize(f(Dequantize(k - 128))) with the kernels' own float32 steps (and zero
    points z_in, z_out)."""
    x = (np.arange(-128, 128) - z_in).astype(np.float32) * np.float32(s_in)
    with np.errstate(all="ignore"):
        y = np.asarray(f(x), dtype=np.float32)
    q = np.rint(y / np.float32(s_out)) + z_out
    return np.clip(np.nan_to_num(q, nan=0.0), -128, 127).astype(np.int8)


# ---- quantize_graph --------------------------------------------------------------------------


def quantize_graph(graph: Graph, calibration, *, per_channel: bool = True,
                   method: str = "mse", zero_points: bool = True,
                   percentile: float | None = None,
                   recurrent_weight_bits: int = RECURRENT_WEIGHT_BITS,
                   bias_correction: bool = True,
                   own_residual_scales: bool = True) -> Graph:
    """The quantized graph of an optimized float graph (module doc).

    ``method``: how each value's range is chosen from the samples, "mse" (default),
    "minmax", "percentile" (of |x|: ``percentile``, default 99.99, or "percentile:P") or
    "entropy" (KL divergence); calib.py has the details.

    ``recurrent_weight_bits``: 8 or 16, the weights of LSTM/GRU/RNN layers (qrecurrent.py).

    ``bias_correction``: biascorr.py (True: each convolution's own error and the
    significant rest of its mean error, a dense layer's whole mean error; "global": every
    layer's whole mean error; False: none).

    ``own_residual_scales``: a convolution's residual sum as a QAdd of the QConv's output
    in its own scale and the residual (module doc); False fuses it into the QConv, the
    residual sharing the output's scale.

    ``zero_points``: give a zero point to the values whose writers and readers fold it
    into their constants exactly (qzero.py); False keeps every activation symmetric.

    ``calibration``: a list of feeds ({input name: array of the input's type}), one dict of
    arrays (one sample, or samples along a leading axis as in ``calibration_from_npz``), or
    an .npz path. Inputs and outputs keep their names and types.
    """
    method, percent = parse_method(method, percentile)
    samples = _samples(graph, calibration)
    graph, shuffles = expand_conv_transposes(graph)  # the upsamplers' int8 form
    if own_residual_scales:  # a convolution's residual sum: a QAdd after the QConv
        graph = split_residuals(graph, ("Conv",))
    # a constant times a run-time value (DETR's learned queries x keys): the constant second
    graph = swap_constant_lhs(graph)
    # attention scores plus a run-time mask or bias: a QMatMul and a float Add
    graph = split_matmul_epilogues(graph)
    # a dense layer's epilogue the int8 layer cannot take whole (MobileBERT's residual
    # then NoNorm): the layer with the part it takes, the rest float nodes
    graph = split_dense_epilogues(graph)
    # Control-flow bodies: their products in 16-bit integer form (qbody.py), calibrated on
    # what each body sees when the float graph runs; the node holding a body is unchanged.
    graph = inline_constant_captures(graph)
    bodies = {n.name: n.attrs for n in quantize_bodies(graph, samples).nodes
              if any(isinstance(v, Graph) for v in n.attrs.values())}
    plan = _plan(graph, shuffles)
    layer_inputs = {n.inputs[0] for n in graph.nodes if n.name in plan.layers}
    layer_inputs |= {v for n in graph.nodes if plan.kinds.get(n.name) == "matmul"
                     for v in n.inputs[:2] if v not in graph.initializers}
    layer_inputs |= {layer.after[2] for layer in plan.layers.values() if layer.after}
    layer_inputs |= {n.inputs[0] for n in graph.nodes if plan.kinds.get(n.name) == "wide"}
    residuals = {layer.residual for layer in plan.layers.values() if layer.residual}
    recurrent = {v for n in graph.nodes if plan.kinds.get(n.name) == "recurrent"
                 for v in calibrated_values(n) if v not in graph.initializers}
    needed = plan.int8 | layer_inputs | residuals | recurrent
    maxabs, mins, pre, kept, means = _calibrate(graph, samples, plan, needed)
    corrections: dict[str, Correction] = {}
    top: dict[str, float] = {}
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    members: dict[str, list] = {}
    per_sample: dict[str, dict] = {}
    for v in maxabs:
        root = plan.classes.find(v)
        top[root] = max(top.get(root, 0.0), maxabs[v])
        lo, hi = mins.get(v, (0.0, 0.0))
        low[root], high[root] = min(low.get(root, 0.0), lo), max(high.get(root, 0.0), hi)
        members.setdefault(root, []).append(np.concatenate(kept[v]) if kept[v] else
                                            np.zeros(0, np.float32))
        for k, a in enumerate(kept[v]):  # (per calibration sample: _zero_point_pays)
            per_sample.setdefault(root, {}).setdefault(k, []).append(a)
    # float values a Quantize converts for an int8 reader (the Quantize can add a zero
    # point); not graph inputs (nothing bounds what a caller passes)
    converted = {i for n in graph.nodes if plan.kinds.get(n.name) in _ZERO_READERS
                 for i in n.inputs if i in needed and i not in plan.int8
                 and i not in graph.initializers and i not in graph.inputs}
    asym = asymmetric_classes(graph, plan.kinds, plan.layers, plan.classes, plan.int8,
                              converted) if zero_points else set()
    # Signed classes take a zero point only from their tables' least entry (below); the
    # range methods see the others (an affine table's output keeps its MSE range).
    signed = {r for r in asym if low[r] < -_SIGNED_ZERO_POINTS * high[r]}
    asym = asym - signed
    if method == "mse":
        top = _mse_ranges(graph, plan, top, members, asym)
    elif method == "percentile":
        top = {r: percentile_range(np.concatenate(members[r]), t, percent)
               for r, t in top.items()}
    elif method == "entropy":  # 256 levels on [0, t] for a value that takes a zero point
        top = {r: entropy_range(np.concatenate(members[r]), t,
                                256 if r in asym and low[r] >= 0 else 128)
               for r, t in top.items()}
    affine_of = {r: affine(low[r], top[r]) for r in asym}

    def scale(v):
        root = plan.classes.find(v)
        return affine_of[root][0] if root in affine_of else _scale(top[root])

    def zero(v):
        root = plan.classes.find(v)
        return affine_of[root][1] if root in affine_of else 0

    # A signed value only tables write (SiLU, HardSwish, GELU outputs) has an exact lower
    # end, the least entry of its tables: no test value falls below it, so it takes a zero
    # point (``_table_lows``) where a calibrated minimum would clip. Not a table with a
    # constant Add/Mul (``a * hardswish(x) + b``): its least entry is f at an extreme input,
    # far below the data, and its MSE range (``_mse_ranges``) measured better (PP-OCR rec
    # 0.944 with the table's lower end, 0.971 without, quick size, mean of six feeds).
    # A convolution's table input (its pre-activation, which only its QLut reads) takes
    # its calibrated range clipped where the table's function is flat (qtable.py), with a
    # zero point. (Not a dense layer's: on all-MiniLM-L6's GELU it cost 0.865 -> 0.856.)
    for node in graph.nodes if zero_points else ():
        layer = plan.layers.get(node.name)
        if layer is None or not layer.tail or layer.residual or node.op != "Conv":
            continue
        root = plan.classes.find(_mid(node))
        found = table_input_range(_tail_function(graph, node, layer), low[root],
                                  high[root])
        if found is not None:
            affine_of[root] = found[:2]
    tails = _affine_tails(graph, plan)
    bounded = _table_lows(graph, plan, signed - tails, scale, zero, converted)
    # A signed value with no such lower end takes its calibrated [min, max] with a zero
    # point when that rounds the samples better than its symmetric range, each sample
    # judged by the ranges of the others (``_zero_point_pays``): the choice is per value.
    chosen = {r for r in sorted(signed - tails - set(bounded))
              if method == "mse" and _zero_point_pays(per_sample.get(r, {}))}
    for r in chosen:
        affine_of[r] = affine(low[r], high[r])
    if chosen:  # (a table reading one of them has new entries: its bounds again)
        bounded = _table_lows(graph, plan, signed - tails - chosen, scale, zero, converted)
    for r, lo in bounded.items():
        affine_of[r] = affine(lo, high[r])

    b = _Builder(graph)
    int8_name = {}
    for v in sorted(plan.int8):
        t = TensorType("int8", graph.types[v].shape)
        if v in graph.outputs:  # the output's name is for the float result
            int8_name[v] = b.value(f"{v}/int8", t)
        else:
            int8_name[v] = v
            b.types[v] = t
    quantized, dequantized = {}, {}

    def as_int8(v):
        if v in plan.int8:
            return int8_name[v]
        if v not in quantized:
            quantized[v] = b.value(f"{v}/int8", TensorType("int8", graph.types[v].shape))
            b.add("Quantize", [v], [quantized[v]], _convert_attrs(scale(v), zero(v)),
                  f"{v}/quantize")
        return quantized[v]

    def as_float(v):
        if v not in plan.int8:
            return v
        if v not in dequantized:
            dequantized[v] = v if v in graph.outputs else b.value(f"{v}/float", graph.types[v])
            b.add("Dequantize", [int8_name[v]], [dequantized[v]],
                  _convert_attrs(scale(v), zero(v)), f"{v}/dequantize")
        return dequantized[v]

    for node in graph.nodes:
        kind = plan.kinds.get(node.name)
        if kind == "layer":
            layer, out = plan.layers[node.name], node.outputs[0]
            written = _mid(node) if layer.tail else out
            s_in, s_out, z_out = scale(node.inputs[0]), scale(written), zero(written)
            # (the output's zero point is added in the accumulator's scale as the bias is)
            w_q, s_w = _bias_fit(layer.weight, *_quantize_weights(layer.weight, per_channel),
                                 np.abs(layer.bias) + abs(z_out * s_out), s_in)
            acc_scale = s_in * s_w
            # Zero points (qzero.py): the input's is taken off exactly, the output's added
            # before the shift (within the ratio's rounding).
            sum_w = w_q.reshape(len(s_w), -1).astype(np.float64).sum(axis=1)
            # (a residual, of the output's class, brings z_out itself: qzero.py)
            shifted = 0.0 if layer.residual else np.rint(z_out * s_out / acc_scale)
            bias_q = np.rint(layer.bias / acc_scale) - zero(node.inputs[0]) * sum_w + shifted
            calibrated = pre[node.name] / acc_scale + np.abs(shifted)
            params = _requantization(acc_scale / s_out, bias_q, w_q, calibrated)
            corrections[node.name] = Correction(means[node.name], acc_scale, bias_q, shifted,
                                                acc_scale / s_out, w_q, calibrated,
                                                layer.weight / s_w.reshape(
                                                    (-1,) + (1,) * (w_q.ndim - 1)),
                                                zero(node.inputs[0]))
            if params is None:
                raise GraphError(f"node {node.name!r} ({node.op}): its requantization (scales "
                                 f"in {s_in:g}, out {s_out:g}, weights up to {s_w.max():g}) "
                                 "does not fit int32 for any shift; is the calibration data "
                                 "representative (an output range of almost 0)?")
            x_q = as_int8(node.inputs[0])
            residual = as_int8(layer.residual) if layer.residual else ""
            target = int8_name[out]
            if layer.tail:
                target = b.value(f"{out}/before_lut", TensorType("int8", graph.types[out].shape))
            _emit_rows(b, graph, node, x_q, w_q, params,
                       _clamp_q(layer.lo, layer.hi, s_out, z_out), s_out, target, residual,
                       zero(node.inputs[0]))
            if layer.tail:
                s_lut = scale(_after_lut(node)) if layer.after else scale(out)
                lut = int8_name[out]
                if layer.after:
                    lut = b.value(f"{out}/lut", TensorType("int8", graph.types[out].shape))
                z_lut = 0 if layer.after else zero(out)
                table = _table(_tail_function(graph, node, layer), s_out, s_lut, z_out,
                               z_lut)
                b.add("QLut", [target, b.const(f"{node.name}/table", table)],
                      [lut], {"scale": s_lut}, f"{node.name}/lut")
                if layer.after:
                    op, _, other = layer.after
                    _emit_binary(b, op, lut, as_int8(other), s_lut, scale(other), scale(out),
                                 int8_name[out], f"{node.name}/{op.lower()}",
                                 zeros=(0, zero(other), zero(out)))
        elif kind == "binary":
            (x, y), out = node.inputs, node.outputs[0]
            _emit_binary(b, node.op, as_int8(x), as_int8(y), scale(x), scale(y), scale(out),
                         int8_name[out], node.name, fresh=False,
                         zeros=(zero(x), zero(y), zero(out)))
        elif kind == "matmul":
            (a, c), out = node.inputs[:2], node.outputs[0]
            factor = _matmul_factor(graph, node)  # a scalar Mul fused into the MatMul
            if c in graph.initializers:  # batched constant matrices (DeBERTa's position
                # keys): one symmetric scale for the whole constant, quantized here
                w = np.asarray(graph.initializers[c], np.float32)
                s_c = float(np.abs(w).max(initial=0)) / 127 or 1.0
                c_q = b.const(f"{c}/int8", np.clip(np.rint(w / np.float32(s_c)), -127,
                                                   127).astype(np.int8))
            else:
                s_c, c_q = scale(c), as_int8(c)
            ratio = scale(a) * s_c * factor / scale(out)
            m, shift = _matmul_params(ratio, maxabs[out] / (scale(a) * s_c * factor))
            b.add("QMatMul", [as_int8(a), c_q], [int8_name[out]],
                  {"multiplier": m, "shift": shift, "scale": scale(out)}, node.name,
                  fresh=False)
        elif kind == "wide":
            wide, consts = wide_layer(graph, node, maxabs.get(node.inputs[0], 0.0),
                                      taken=set(b.types))
            names = {c: b.const(c, arr) for c, arr in consts.items()}
            b.add(wide.op, [names.get(i, as_float(i) if i else "") for i in wide.inputs],
                  node.outputs, wide.attrs, node.name, fresh=False)
        elif kind == "recurrent":
            known = {**maxabs, **{v: float(np.abs(graph.initializers[v]).max(initial=0))
                                  for v in node.inputs if v in graph.initializers}}
            op, ins, attrs = quantized_layer(node, graph, known.get(node.inputs[0], 0.0),
                                             h_range(node, known), recurrent_weight_bits)
            names = ("", "W_q", "R_q", "W_scale", "R_scale")
            ins = [b.const(f"{node.name}/{names[k]}", v) if not isinstance(v, str) else
                   (as_float(v) if v else "") for k, v in enumerate(ins)]
            b.add(op, ins, node.outputs, attrs, node.name, fresh=False)
        elif kind == "lut":
            x = node.inputs[0]
            y = node.outputs[0]
            table = _table(lambda v: evaluate_node(node, [v])[0], scale(x), scale(y),
                           zero(x), zero(y))
            b.add("QLut", [as_int8(x), b.const(f"{node.name}/table", table)],
                  [int8_name[node.outputs[0]]], {"scale": scale(node.outputs[0])}, node.name,
                  fresh=False)
        elif kind == "same":
            attrs = node.attrs
            if node.op == "Pad" and attrs.get("mode", "constant") == "constant":
                attrs = {**attrs, "value": zero(node.inputs[0])}  # the int8 form of 0
            b.add(node.op, [as_int8(i) for i in node.inputs], [int8_name[node.outputs[0]]],
                  attrs, node.name, fresh=False)
        elif kind == "pool":
            x, y = node.inputs[0], node.outputs[0]
            ratio = scale(x) / scale(y)
            m, shift, off = _pool_params(math.prod(graph.types[x].shape[2:]), ratio,
                                         zero(y) - zero(x) * ratio)
            attrs = {"multiplier": m, "shift": shift, "scale": scale(y)}
            if off:
                attrs["offset"] = off
            b.add("QGlobalAveragePool", [as_int8(x)], [int8_name[y]], attrs, node.name,
                  fresh=False)
        else:
            attrs = bodies.get(node.name, node.attrs)
            if node.name in plan.float_reasons:  # for the partition's report
                attrs = {**attrs, "float_reason": plan.float_reasons[node.name]}
            b.add(node.op, [as_float(i) if i else "" for i in node.inputs], node.outputs,
                  attrs, node.name, fresh=False)
    for o in graph.outputs:
        as_float(o)
    qgraph = b.graph(graph)
    if bias_correction:
        qgraph = correct_biases(qgraph, samples, corrections, _requantization,
                                "global" if bias_correction == "global" else "local")
    return hoist_loop_products(qgraph)


# ---- from_qdq --------------------------------------------------------------------------------


def _zero_point(graph: Graph, node: Node, dtype: str = "int8") -> int | None:
    """The constant per-tensor zero point of a Q/DQ node, of ``dtype`` (0 when absent), or
    None."""
    name = node.inputs[2] if len(node.inputs) > 2 else ""
    if not name:
        return 0
    z = graph.initializers.get(name)
    if z is None or str(z.dtype) != dtype or z.size != 1:
        return None
    return int(z.reshape(()))


def _is_zero(graph: Graph, name: str, dtype: str) -> bool:
    """An absent zero point, or a constant one of ``dtype`` that is all zeros."""
    if not name:
        return True
    z = graph.initializers.get(name)
    return z is not None and str(z.dtype) == dtype and not z.any()


def _tensor_scale(graph: Graph, node: Node) -> float | None:
    """The positive per-tensor scale of a Q/DQ node, when constant."""
    s = graph.initializers.get(node.inputs[1])
    if s is None or s.size != 1 or not s.reshape(()) > 0:
        return None
    return float(s.reshape(()))


def _dq_int8(graph: Graph, producers, value: str):
    """(int8 value, scale, zero point) when ``value`` is DequantizeLinear(int8 activation,
    per-tensor scale and zero point)."""
    dq = producers.get(value)
    if dq is None or dq.op != "DequantizeLinear" or graph.types[dq.inputs[0]].dtype != "int8" \
            or dq.inputs[0] in graph.initializers:
        return None
    s, z = _tensor_scale(graph, dq), _zero_point(graph, dq)
    if s is None or z is None:
        return None
    return dq.inputs[0], s, z


def _dq_constant(graph: Graph, producers, value: str, dtype: str, axis: int):
    """(integers, scale per element of ``axis``) when ``value`` is DequantizeLinear of a
    constant of ``dtype`` with a zero point of 0 and a per-tensor scale or one per index
    of ``axis``."""
    dq = producers.get(value)
    if dq is None or dq.op != "DequantizeLinear":
        return None
    q, s = (graph.initializers.get(i) for i in dq.inputs[:2])
    zero = dq.inputs[2] if len(dq.inputs) > 2 else ""
    if q is None or s is None or str(q.dtype) != dtype or not _is_zero(graph, zero, dtype) \
            or dq.attrs["block_size"] or not (s > 0).all():
        return None
    if s.size == 1:
        return q, np.full(q.shape[axis], float(s.reshape(())))
    if s.ndim != 1 or dq.attrs["axis"] != axis:
        return None
    return q, s.astype(np.float64)


def _qdq_weight(graph: Graph, producers, node: Node):
    """(w_q int8 [O, ...], s_w [O]) of a Conv/Gemm/MatMul in a QDQ graph, or None: the
    weight's DequantizeLinear, or a float constant (optimize folded the DequantizeLinear;
    quantized again per channel, which gives back symmetric max-scaled int8 weights such as
    onnxruntime's exactly)."""
    w = node.inputs[1]
    transposed = node.op == "MatMul" or (node.op == "Gemm" and not node.attrs["transB"])
    found = _dq_constant(graph, producers, w, "int8", 1 if transposed else 0)
    if found is not None:
        w_q, s_w = found
        return (w_q.T if transposed else w_q), s_w
    f = graph.initializers.get(w)
    if f is None or f.dtype != np.float32:
        return None
    return _quantize_weights((f.T if transposed else f).astype(np.float64), True)


def _qdq_bias(graph: Graph, producers, node: Node, out_shape):
    """The float64 bias [O] of a Conv/Gemm: DequantizeLinear(const int32 [O]), or a
    constant (Conv: [O]; Gemm: C broadcast along the output channels), or None."""
    channels = out_shape[-1 if node.op == "MatMul" else 1]
    name = node.inputs[2] if len(node.inputs) > 2 and node.op != "MatMul" else ""
    if not name:
        return np.zeros(channels)
    found = _dq_constant(graph, producers, name, "int32", 0)
    if found is not None:
        q, s = found
        return q.astype(np.float64) * s if q.shape == (channels,) else None
    c = graph.initializers.get(name)
    if c is None:
        return None
    if node.op == "Conv":
        return c.astype(np.float64) if c.shape == (channels,) else None
    return _per_channel(c, out_shape, 1)


def _activation(graph: Graph, node: Node):
    if node.op == "Relu":
        return ("Relu",)
    if node.op == "Clip":
        bounds = [graph.initializers.get(i) if i else None for i in node.inputs[1:3]]
        if any(i and (v is None or v.size != 1) for i, v in zip(node.inputs[1:3], bounds)):
            return None
        return ("Clip", *[None if v is None else float(v.reshape(())) for v in bounds])
    return None


def _qdq_output(graph: Graph, users, value: str, steps: list):
    """Follow single-reader Relu/Clip nodes from ``value`` to a QuantizeLinear(int8,
    per-tensor scale and zero point): (the nodes passed, the QuantizeLinear, its scale, its
    zero point), or None."""
    passed = []
    while value not in graph.outputs and len(users.get(value, ())) == 1:
        nxt = users[value][0]
        step = _activation(graph, nxt) if nxt.inputs[0] == value else None
        if nxt.op == "QuantizeLinear" and nxt.inputs[0] == value:
            s, z = _tensor_scale(graph, nxt), _zero_point(graph, nxt)
            if s is None or z is None or nxt.attrs["output_dtype"] != "int8" or \
                    nxt.attrs["precision"] != "float32":
                return None
            return passed, nxt, s, z
        if step is None:
            return None
        steps.append(step)
        passed.append(nxt)
        value = nxt.outputs[0]
    return None


@dataclass
class _Rewrite:
    """A node of a QDQ graph made integer: it reads the int8 ``x_q`` (``y_q`` too: QAdd)
    and writes ``output``, the int8 value of the QuantizeLinear it absorbs (with the
    Relu/Clip nodes before it, ``absorbed``). ``layer``: (w_q, (multiplier, bias, shift),
    (lo, hi), output scale, input zero point) of a QConv/QGemm; ``op``/``attrs``: the
    integer operator otherwise (None: the node's own op on the int8 values)."""

    x_q: str
    output: str
    absorbed: list
    layer: tuple | None = None
    op: str | None = None
    attrs: dict | None = None
    y_q: str = ""


def _qdq_layer(graph: Graph, producers, users, node: Node) -> _Rewrite | None:
    """A DQ -> Conv/Gemm/MatMul [-> Relu/Clip] -> Q pattern as a QConv/QGemm, or None. The
    input's zero point z_x: the padding reads it (``pad_value``) and the bias takes off
    ``z_x * sum(w_q[o])``; the output's is folded into the bias with the rounding term
    (``_requantization``)."""
    a = node.attrs
    if node.op not in OWN_INPUTS or len(node.outputs) != 1 or \
            (node.op == "Gemm" and a["transA"]):
        return None
    out_t = graph.types[node.outputs[0]]
    steps = list(a.get("epilogue", ()))
    rank = len(out_t.shape)
    if any(s[0] not in ("Relu", "Clip") for s in steps) or out_t.dtype != "float32" or \
            not (rank == 4 if node.op == "Conv" else rank == 2 or
                 (node.op == "MatMul" and rank > 2 and out_t.static)):
        return None
    x = _dq_int8(graph, producers, node.inputs[0])
    weight = _qdq_weight(graph, producers, node)
    if x is None or weight is None or weight[0].ndim != (4 if node.op == "Conv" else 2):
        return None
    (x_q, s_x, z_x), (w_q, s_w) = x, weight
    bias = _qdq_bias(graph, producers, node, out_t.shape)
    found = _qdq_output(graph, users, node.outputs[0], steps)
    if bias is None or found is None or \
            w_q.shape[0] != out_t.shape[-1 if node.op == "MatMul" else 1]:
        return None
    passed, q, s_y, z_y = found
    ratio = s_x * s_w / s_y
    if node.op == "Gemm":
        ratio, bias = ratio * a["alpha"], bias * a["beta"]
    w_sum = w_q.reshape(len(ratio), -1).astype(np.float64).sum(axis=1)
    params = _requantization(ratio, np.rint(bias / (s_x * s_w)) - z_x * w_sum, w_q,
                             zero_out=z_y)
    if params is None:
        return None
    return _Rewrite(x_q, q.outputs[0], passed + [q],
                    (w_q, params, _clamp_q(*_clamp(steps), s_y, z_y), s_y, z_x))


# ops that commute with Q(DQ(v)) = v for any scale and zero point (Relu: only with 0)
_QDQ_SAME = ("MaxPool", "Flatten", "Reshape", "Relu", "Identity", "Transpose", "Squeeze",
             "Unsqueeze")


def _qdq_same_scale(graph: Graph, producers, users, node: Node) -> _Rewrite | None:
    """DQ -> MaxPool/Flatten/Reshape/Transpose/Squeeze/Unsqueeze/Identity (Relu: with a zero
    point of 0) -> Q of the same scale and zero point, int8, as the op on the int8 values,
    or None. It computes exactly what the float ops do: Q(DQ(v)) = v, and these ops commute
    with a positive scale and an offset."""
    if node.op not in _QDQ_SAME or len(node.outputs) != 1 or len(node.inputs) != 1:
        return None
    x = _dq_int8(graph, producers, node.inputs[0])
    found = _qdq_output(graph, users, node.outputs[0], [])
    if x is None or found is None or found[0] or np.float32(found[2]) != np.float32(x[1]) \
            or found[3] != x[2] or (node.op == "Relu" and x[2]):
        return None
    return _Rewrite(x[0], found[1].outputs[0], [found[1]])


def _redundant_clamp(steps, s_y: float, z_y: int) -> bool:
    """Whether Relu/Clip steps before a QuantizeLinear clamp nothing the int8 range does not
    (a Relu before an output of zero point -128)."""
    return _clamp_q(*_clamp(steps), s_y, z_y) == (-128, 127) if steps else True


def _dq_const_int8(graph: Graph, producers, value: str):
    """(int8 array, scale, zero point) when ``value`` is DequantizeLinear of a constant
    int8 or uint8 tensor of more than one element (uint8 as int8, 128 lower) with a
    per-tensor scale and zero point, or None."""
    dq = producers.get(value)
    c = graph.initializers.get(dq.inputs[0]) if dq is not None and \
        dq.op == "DequantizeLinear" else None
    if c is None or str(c.dtype) not in ("int8", "uint8") or c.size < 2:
        return None
    s, z = _tensor_scale(graph, dq), _zero_point(graph, dq, str(c.dtype))
    if s is None or z is None:
        return None
    if c.dtype == np.uint8:
        return (c.astype(np.int16) - 128).astype(np.int8), s, z - 128
    return np.asarray(c, np.int8), s, z


def _qdq_add(graph: Graph, producers, users, node: Node) -> _Rewrite | None:
    """DQ(a) + DQ(b) [-> Relu/Clip the output range makes redundant] -> Q, int8, as a QAdd
    with zero points (za, zb, zo), or None: both activations of the output's shape, or one
    of them and a constant that broadcasts to it (the bias Add after a QDQ model's MatMul;
    ``attrs["constant"]``: its position and int8 values)."""
    if node.op != "Add" or len(node.inputs) != 2 or node.attrs.get("epilogue"):
        return None
    xs = [_dq_int8(graph, producers, v) for v in node.inputs]
    shape = graph.types[node.outputs[0]].shape
    constant = None
    if xs.count(None) == 1:
        k = xs.index(None)
        c = _dq_const_int8(graph, producers, node.inputs[k])
        if c is None or not graph.types[node.outputs[0]].static or \
                np.broadcast_shapes(c[0].shape, shape) != tuple(shape):
            return None
        constant, xs[k] = (k, c[0]), ("", *c[1:])
    steps: list = []
    found = _qdq_output(graph, users, node.outputs[0], steps)
    if None in xs or found is None or any(graph.types[v].shape != shape for v, x in
                                          zip(node.inputs, xs) if x[0]):
        return None
    passed, q, s_y, z_y = found
    if not _redundant_clamp(steps, s_y, z_y):
        return None
    (a, s_a, z_a), (b, s_b, z_b) = xs
    ratios = (s_a / s_y, s_b / s_y)
    if max(ratios) >= 2**20 or min(ratios) < 2**-20:
        return None  # scales too far apart for one shift
    return _Rewrite(a, q.outputs[0], passed + [q], op="QAdd", y_q=b,
                    attrs={"scales": (s_a, s_b, s_y), "zeros": (z_a, z_b, z_y),
                           "constant": constant})


def _qdq_pool(graph: Graph, producers, users, node: Node) -> _Rewrite | None:
    """DQ -> GlobalAveragePool [-> redundant Relu/Clip] -> Q as a QGlobalAveragePool (its
    offset carries the zero points), or None."""
    if node.op != "GlobalAveragePool":
        return None
    x = _dq_int8(graph, producers, node.inputs[0])
    steps: list = []
    found = _qdq_output(graph, users, node.outputs[0], steps)
    shape = graph.types[node.inputs[0]].shape
    if x is None or found is None or len(shape) < 3:
        return None
    passed, q, s_y, z_y = found
    if not _redundant_clamp(steps, s_y, z_y):
        return None
    ratio = x[1] / s_y
    try:
        m, shift, off = _pool_params(math.prod(shape[2:]), ratio, z_y - x[2] * ratio)
    except GraphError:
        return None
    attrs = {"multiplier": m, "shift": shift, "scale": s_y} | ({"offset": off} if off else {})
    return _Rewrite(x[0], q.outputs[0], passed + [q], op="QGlobalAveragePool", attrs=attrs)


def _qdq_matmul(graph: Graph, producers, users, node: Node) -> _Rewrite | None:
    """DQ(a) @ DQ(b) -> Q of two int8 activations, every zero point 0 (onnxruntime's
    ``ActivationSymmetric``), as a QMatMul, its shift for the worst case ``128 * 128 * K``
    (no samples); None otherwise: QMatMul has no zero points (they would need the operands'
    row and column sums at run time), so asymmetric attention products stay float."""
    if node.op != "MatMul" or node.attrs.get("epilogue"):
        return None
    xs = [_dq_int8(graph, producers, v) for v in node.inputs]
    found = _qdq_output(graph, users, node.outputs[0], [])
    if None in xs or found is None or found[0] or found[3] or any(x[2] for x in xs) or \
            any(len(graph.types[v].shape) < 2 for v in node.inputs):
        return None
    (a, s_a, _), (c, s_c, _) = xs
    k = graph.types[node.inputs[0]].shape[-1]
    if not isinstance(k, int):
        return None
    ratio = s_a * s_c / found[2]
    try:
        m, shift = _matmul_params(ratio, 128.0 * 128.0 * k / MARGIN)
    except GraphError:
        return None
    return _Rewrite(a, found[1].outputs[0], [found[1]], op="QMatMul", y_q=c,
                    attrs={"multiplier": m, "shift": shift, "scale": found[2]})


def _uint8_as_int8(graph: Graph) -> Graph:
    """The QDQ graph with its uint8 activations as int8: a uint8 value q of zero point z is
    exactly the int8 value q - 128 of zero point z - 128 (QuantizeLinear saturates to [0,
    255] what the int8 form saturates to [-128, 127], 128 lower), so a QuantizeLinear to
    uint8 whose readers are all DequantizeLinear nodes (per-tensor constant scales and zero
    points) writes int8 and they read int8. The model's own inputs and outputs do not
    change."""
    users = graph.consumers()
    b = _Builder(graph)
    renamed: dict[str, str] = {}  # a node's name -> its int8 zero point's constant
    for q in graph.nodes:
        out = q.outputs[0] if q.op == "QuantizeLinear" else ""
        if not out or q.attrs["output_dtype"] != "uint8" or out in graph.outputs or \
                _tensor_scale(graph, q) is None or _zero_point(graph, q, "uint8") is None:
            continue
        readers = users.get(out, ())
        if not readers or any(r.op != "DequantizeLinear" or r.inputs[0] != out or
                              _tensor_scale(graph, r) is None or
                              _zero_point(graph, r, "uint8") is None for r in readers):
            continue
        for n in (q, *readers):
            z = np.array(_zero_point(graph, n, "uint8") - 128, np.int8)
            renamed[n.name] = b.const(f"{n.name}/zero_point_int8", z)
        b.types[out] = TensorType("int8", graph.types[out].shape)
    if not renamed:
        return graph
    for n in graph.nodes:
        if n.name in renamed:
            inputs = (*n.inputs[:2], renamed[n.name])
            attrs = {**n.attrs, "output_dtype": "int8"} if n.op == "QuantizeLinear" else \
                n.attrs
            n = Node(n.op, inputs, n.outputs, attrs, n.name)
        b.nodes.append(n)
    return b.graph(graph)


def _converted(graph: Graph, node: Node) -> Node | None:
    """A QuantizeLinear/DequantizeLinear of an activation with a constant per-tensor scale
    and int8 zero point as celosia's Quantize/Dequantize (compiled kernels on the CPU: the
    same float32 steps, saturating, rounding half to even), or None."""
    s, z = _tensor_scale(graph, node), _zero_point(graph, node)
    if s is None or z is None or node.inputs[0] in graph.initializers:
        return None
    if node.op == "QuantizeLinear" and node.attrs["output_dtype"] == "int8" and \
            node.attrs["precision"] == "float32" and \
            graph.types[node.inputs[0]].dtype == "float32":
        return Node("Quantize", node.inputs[:1], node.outputs, _convert_attrs(s, z), node.name)
    if node.op == "DequantizeLinear" and graph.types[node.inputs[0]].dtype == "int8" and \
            node.attrs["output_dtype"] == "float32" and \
            graph.initializers[node.inputs[1]].dtype == np.float32:
        return Node("Dequantize", node.inputs[:1], node.outputs, _convert_attrs(s, z),
                    node.name)
    return None


def from_qdq(graph: Graph) -> Graph:
    """Rewrite a QDQ graph's int8 patterns into integer operators (onnxruntime's
    ``quantize_static`` defaults: asymmetric activations, int8 or uint8, per-channel
    symmetric int8 weights, int32 biases):

    - uint8 activations become int8 ones 128 lower (``_uint8_as_int8``: exact);
    - ``DequantizeLinear(x int8) -> Conv/Gemm/MatMul [-> Relu/Clip] -> QuantizeLinear(int8)``
      with a weight DequantizeLinear(const int8, per tensor or per output channel) and a
      bias constant or DequantizeLinear(const int32) becomes QConv/QGemm: ``multiplier /
      2**shift ~ s_x * s_w[o] / s_y``, the shift chosen for the worst case ``128 *
      sum|w_q[o]| + |bias|`` (there are no samples), rounding and the output's zero point
      folded into the bias, the input's zero point taken off the bias (``- z_x *
      sum(w_q[o])``) and read by the padding (``pad_value``);
    - ``DQ(a) + DQ(b) -> Q`` becomes QAdd, ``DQ -> GlobalAveragePool -> Q``
      QGlobalAveragePool (Relu/Clip between allowed when the output's range makes them
      redundant), ``DQ(a) @ DQ(b) -> Q`` with zero points 0 QMatMul;
    - ``DequantizeLinear -> MaxPool/Flatten/Reshape/Transpose/Squeeze/Unsqueeze/Identity
      (Relu: zero point 0) -> QuantizeLinear`` of the same scale and zero point runs on the
      int8 values;
    - the QuantizeLinear/DequantizeLinear nodes left around float operators become
      Quantize/Dequantize (per-tensor constant scale and zero point).

    Everything else stays as it is: float operators between their QuantizeLinear/
    DequantizeLinear nodes, correct and run on the CPU.

    Works on the graph as imported (weights behind their DequantizeLinear, used as they
    are) and on an optimized one (optimize folds the weights' DequantizeLinear into float
    constants, which are quantized again per output channel).
    """
    graph = _uint8_as_int8(graph)
    producers, users = graph.producers(), graph.consumers()
    rewrites: dict[str, _Rewrite] = {}
    absorbed: set[str] = set()
    for node in graph.nodes:
        if node.name in absorbed:
            continue
        rewrite = _qdq_layer(graph, producers, users, node) or \
            _qdq_same_scale(graph, producers, users, node) or \
            _qdq_add(graph, producers, users, node) or \
            _qdq_pool(graph, producers, users, node) or \
            _qdq_matmul(graph, producers, users, node)
        if rewrite is not None:
            rewrites[node.name] = rewrite
            absorbed.update(n.name for n in rewrite.absorbed)
    b = _Builder(graph)
    for node in graph.nodes:
        r = rewrites.get(node.name)
        if node.name in absorbed:
            continue
        if r is None and node.op in _QDQ_OPS:
            b.nodes.append(_converted(graph, node) or node)
        elif r is None:  # for the partition's report
            b.nodes.append(node.with_attrs(float_reason=(
                f"the QDQ model's {node.op} is not one celosia turns into an integer operator "
                f"(DequantizeLinear -> Conv/Gemm/MatMul [-> Relu/Clip], Add or "
                f"GlobalAveragePool -> QuantizeLinear, or MaxPool/Flatten/Reshape/Transpose/"
                f"... between them, int8 or uint8 with per-tensor scales)")))
        elif r.op == "QAdd":
            (s_a, s_b, s_y), zeros = r.attrs["scales"], r.attrs["zeros"]
            operands = [r.x_q, r.y_q]
            if r.attrs["constant"] is not None:
                k, values = r.attrs["constant"]
                operands[k] = b.const(f"{node.inputs[k]}/int8", values)
            _emit_binary(b, "Add", *operands, s_a, s_b, s_y, r.output, node.name,
                         fresh=False, zeros=zeros)
        elif r.op is not None:
            b.add(r.op, [r.x_q] + ([r.y_q] if r.y_q else []), [r.output], r.attrs, node.name,
                  fresh=False)
        elif r.layer is None:
            b.add(node.op, [r.x_q], [r.output], node.attrs, node.name, fresh=False)
        else:
            w_q, params, clamp, scale, z_in = r.layer
            _emit_rows(b, graph, node, r.x_q, w_q, params, clamp, scale, r.output, z_in=z_in)
    return b.graph(graph)
