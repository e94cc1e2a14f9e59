"""LSTM, GRU and RNN nodes in the CPU program: a ``dense`` step (the input projection of
every time step and direction) and a ``recurrent`` step (the time loop), see
kernels_recurrent.py. A node the kernels do not cover stays a numpy step
(graph/ops_recurrent.py); ``numpy_reason`` says why.
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from ..graph.ops_recurrent import DEFAULT_ACTIVATIONS
from .host import num_threads
from .kernels import spec_key
from . import kernels_recurrent
from .kernels_recurrent import GATES, pack_recurrent_weight, padded_hidden
from .schedules import channel_block, pack_dense_weight

__all__ = ["lower_recurrent", "numpy_reason"]

F32 = "float32"
_INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def _inputs(node: Node) -> dict:
    """The node's inputs by ONNX name (absent ones left out)."""
    return {name: v for name, v in zip(_INPUTS, node.inputs) if v}


def numpy_reason(lw, node: Node) -> str | None:
    """Why ``node`` stays a numpy step, or None when it compiles."""
    ins, a = _inputs(node), node.attrs
    if lw.type(ins["X"]).dtype != F32:
        return f"X is {lw.type(ins['X']).dtype}: the kernels are float32"
    weights = [k for k in ("W", "R", "B", "P") if k in ins and not lw.is_const(ins[k])]
    if weights:
        return f"{', '.join(weights)} computed at run time: the kernels pack weights at build time"
    if "sequence_lens" in ins and not lw.is_const(ins["sequence_lens"]):
        # numpy checks them at run time (an error naming the node), a kernel cannot
        return "sequence_lens computed at run time: the numpy step checks their range"
    if "sequence_lens" in ins:
        lens = np.asarray(lw.const(ins["sequence_lens"]))
        t_len = lw.type(ins["X"]).shape[1 if a["layout"] else 0]
        if lens.size and (lens.min() < 0 or lens.max() > t_len):
            return "sequence_lens out of range: the numpy step reports it"
    dirs = 2 if a["direction"] == "bidirectional" else 1
    if list(a["activations"]) != list(DEFAULT_ACTIVATIONS[node.op]) * dirs:
        return (f"activations {a['activations']}: the kernels compute the default "
                f"{list(DEFAULT_ACTIVATIONS[node.op])}")
    return None


def _gate_rows(w: np.ndarray, gates: int, hidden: int) -> np.ndarray:
    """``[dirs, G*H, ...]`` -> ``[dirs, G*Hp, ...]``, each gate's rows padded with zeros."""
    dirs, rest = w.shape[0], w.shape[2:]
    hp = padded_hidden(hidden)
    out = np.zeros((dirs, gates, hp) + rest, np.float32)
    out[:, :, :hidden] = w.reshape((dirs, gates, hidden) + rest)
    return out.reshape((dirs, gates * hp) + rest)


def _projection_bias(node: Node, b: np.ndarray | None, dirs: int, gates: int, hidden: int):
    """The bias of the input projection, ``[dirs, G*H]``: both biases summed (GRU with
    linear_before_reset: the h gate's recurrent bias stays apart, for the kernel)."""
    if b is None:
        return np.zeros((dirs, gates * hidden), np.float32)
    wb, rb = b[:, :gates * hidden], b[:, gates * hidden:].copy()
    if node.op == "GRU" and node.attrs["linear_before_reset"]:
        rb[:, 2 * hidden:] = 0
    return wb + rb


def lower_recurrent(lw, node: Node, padded_rows) -> bool:
    """Lower ``node`` with the _Lowering ``lw`` (lowering.py; ``padded_rows(m)``: the rows
    its dense kernels compute for m); False: a numpy step."""
    if numpy_reason(lw, node) is not None:
        return False
    ins, a, op = _inputs(node), node.attrs, node.op
    x_t = lw.type(ins["X"])
    t_len, batch, size = (x_t.shape[1], x_t.shape[0], x_t.shape[2]) if a["layout"] \
        else x_t.shape
    hidden, gates = a["hidden_size"], GATES[op]
    dirs = 2 if a["direction"] == "bidirectional" else 1
    hp = padded_hidden(hidden)
    const = {k: np.asarray(lw.const(v), np.float32) for k, v in ins.items()
             if k in ("W", "R", "B", "P")}
    # 1. xw = X @ W^T + bias for every step and direction, gate blocks padded to Hp.
    n = dirs * gates * hp
    weight = _gate_rows(const["W"], gates, hidden).reshape(n, size)
    bias = _gate_rows(_projection_bias(node, const.get("B"), dirs, gates, hidden)[..., None],
                      gates, hidden).reshape(n)
    m = t_len * batch
    data = lw.view_of(lw.plain(ins["X"]), (m, size), f"{ins['X']}@2d")
    rows = padded_rows(m)
    if rows != m:
        data = lw.pad_rows(node, data, rows)
    nb = channel_block(n)
    packed = lw.add_const(f"{node.name}@W@dense{nb}", pack_dense_weight(weight, nb))
    bias = lw.add_const(f"{node.name}@bias", bias)
    xw = lw.define(f"{node.name}@xw", F32, (rows, n))
    lw.kernel(node, {"op": "dense", "data": [rows, size], "weight": [n // nb, size, nb],
                     "bias": True, "epilogue": []}, [data, packed, bias, xw], xw)
    # 2. the time loop.
    spec = {"op": "recurrent", "cell": op, "steps": t_len, "batch": batch, "hidden": hidden,
            "directions": dirs, "reverse": a["direction"] == "reverse", "layout": a["layout"],
            "rows": rows, "seq_lens": "sequence_lens" in ins, "initial_h": "initial_h" in ins,
            "initial_c": "initial_c" in ins and op == "LSTM", "peepholes": "P" in ins,
            "input_forget": bool(a.get("input_forget", 0)),
            "clip": None if a["clip"] is None else float(a["clip"]),
            "linear_before_reset": bool(a.get("linear_before_reset", 0)),
            "threads": num_threads()}
    spec["parallel_steps"] = kernels_recurrent.parallel_steps(spec)
    args = [xw, lw.add_const(f"{node.name}@R", pack_recurrent_weight(const["R"], spec))]
    if spec["cell"] == "GRU" and spec["linear_before_reset"]:
        rbh = np.zeros((dirs, hp), np.float32)
        if "B" in const:
            rbh[:, :hidden] = const["B"][:, (gates + 2) * hidden:]
        args.append(lw.add_const(f"{node.name}@Rbh", rbh))
    if spec["peepholes"]:
        args.append(lw.add_const(f"{node.name}@P", _gate_rows(const["P"], 3, hidden)))
    if spec["seq_lens"]:
        args.append(lw.add_const(f"{node.name}@lens", np.asarray(
            lw.const(ins["sequence_lens"]), np.int32)))
    args += [lw.plain(ins[k]) for k in ("initial_h", "initial_c") if spec[k]]
    outs = []
    for k, shape in enumerate(_output_shapes(spec)[:3 if op == "LSTM" else 2]):
        given = node.outputs[k] if k < len(node.outputs) else ""
        outs.append(lw.produce(given, 0) if given else
                    lw.define(f"{node.name}@{('Y', 'Y_h', 'Y_c')[k]}", F32, shape))
    lw.step("kernel", node, args + outs, outs, kernel=_register(lw, spec))
    return True


def _output_shapes(spec: dict) -> list[tuple]:
    t, b, d, h = spec["steps"], spec["batch"], spec["directions"], spec["hidden"]
    state = (b, d, h) if spec["layout"] else (d, b, h)
    return [(b, t, d, h) if spec["layout"] else (t, d, b, h), state, state]


def _register(lw, spec: dict) -> str:
    """Register ``spec`` with the lowering (as ``_Lowering.kernel`` does) and return its key."""
    key = spec_key(spec)
    lw.specs[key] = spec
    return key
