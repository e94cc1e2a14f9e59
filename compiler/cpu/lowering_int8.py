"""Lowering QConv, QGemm and QMatMul to the dot-product kernels of int8_dot.py, when the
build has an int8 form (int8_forms.py: chosen from the host CPU, or forced by the build's
``int8_form`` option or $CELOSIA_INT8_FORM). QMatMul's checks and operands stay
lowering_q.py's; ``matmul_spec`` gives its kernel.

Each handler takes the lowering (lowering._Lowering) and a node and returns False to leave
the node to lowering.py's tensor-language kernels (float32 FMA on exact integers):

- no form (a CPU without AVX2, or ``int8_form="none"``);
- depthwise convolutions and groups too narrow for a vector of output channels or a
  group of input channels (the padding would more than double the work; see ``_WASTE``);
- anything those kernels would refuse too (non-constant weights, attributes qops.py
  rejects: the numpy step reports them at run time).

Layouts are the ones lowering.py's QConv uses (the output block of schedules.``output_block``), so
a model mixing both kinds of kernel converts nothing between them; the kernel reads its
input in whatever channel block it has (a plain NCHW input of at most 4 channels, an image,
as blocks of 1). QGemm's ``[M, K]`` and ``[M, N]`` are the convolution's one-row images.
"""

from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from ..graph.qops import pad_value
from .int8_dot import dot_tile
from .int8_forms import (FORMS, fold_columns, folds_columns, pack_dot_weight, per_channel,
                         tap_sums, unsigned_bias)

__all__ = ["qconv", "qgemm", "matmul_spec", "dot_reason"]

I8 = "int8"
# At most this much more work than the layer's own multiply-adds, counting the zero
# channels the kernel pads each group with (to a vector of output channels and a multiple
# of the form's group of input channels): a depthwise layer would be 16 x 4 = 64 times.
_WASTE = 2.0


def _requant(lw, node: Node, rounding: int = 0) -> str:
    a = node.attrs
    return lw.add_const(f"{node.name}@requant4", np.array(
        [a["shift"], a["lo"], a["hi"], rounding], np.int32))


def _valid_epilogue(attrs, conv: bool = False) -> bool:
    """Whether qops.py takes the attributes (else the numpy step reports them at run time);
    a QConv's ``pad_value`` too."""
    try:
        if conv:
            pad_value(attrs)
        return 0 <= int(attrs["shift"]) <= 31 \
            and -128 <= int(attrs["lo"]) <= int(attrs["hi"]) <= 127
    except (KeyError, TypeError, ValueError):
        return False


def dot_reason(form_name: str, channels: int, out_channels: int, groups: int) -> str | None:
    """Why a convolution of these channels does not take the dot-product kernels, or None."""
    f = FORMS[form_name]
    cg, mg = channels // groups, out_channels // groups
    cp = -(-cg // f.group) * f.group
    mp = -(-mg // f.lanes) * f.lanes
    waste = cp * mp / (cg * mg)
    if waste > _WASTE:
        return (f"{groups} groups of {cg} -> {mg} channels would be padded to {cp} -> {mp} "
                f"for the {form_name} kernels ({waste:.1f}x the work)")
    return None


def _operands(lw, node: Node, w: np.ndarray, groups: int, vectors: int, layout: str = ""):
    """(weight, bias, multiplier) constant names for the form's kernel; ``layout`` tags
    weights arranged otherwise (``f``: ``fold_columns``). ``w`` may have more output
    channels than the node (``padded_channels``): the extra ones get zero bias and
    multiplier."""
    f = FORMS[lw.int8_form]
    _, wv, bias, multiplier = node.inputs[:4]
    extra = w.shape[0] - np.asarray(lw.const(bias)).shape[0]
    tag = f"{f.name}v{vectors}{layout}" + (f"p{w.shape[0]}" if extra else "")
    weight = lw.add_const(f"{wv}@{tag}", pack_dot_weight(w, groups, f, vectors))
    padded = [np.pad(np.asarray(lw.const(v)), (0, extra)) for v in (bias, multiplier)]
    b = per_channel(unsigned_bias(padded[0], w, f), groups, f, vectors)
    m = per_channel(padded[1], groups, f, vectors)
    return (weight, lw.add_const(f"{node.name}@bias.{tag}", b),
            lw.add_const(f"{multiplier}@{tag}", m))


def qconv(lw, node: Node) -> bool:
    """A QConv (2-D, any groups but depthwise-like ones) as one ``qdot`` kernel."""
    from .schedules import channel_block, output_block, padded_channels

    if lw.int8_form is None:
        return False
    x, wv, bias, multiplier = node.inputs[:4]
    residual = node.inputs[4] if len(node.inputs) > 4 else ""
    tx, a = lw.type(x), node.attrs
    if len(tx.shape) != 4 or tx.dtype != I8 or len(node.outputs) != 1 \
            or not all(lw.is_const(v) for v in (wv, bias, multiplier)) \
            or not _valid_epilogue(a, conv=True) or lw.type(wv).dtype != I8 \
            or len(lw.type(wv).shape) != 4:
        return False
    w = np.asarray(lw.const(wv), np.int8)
    out_t = lw.type(node.outputs[0])
    (n, c, h, wd), m, g = tx.shape, out_t.shape[1], int(a["group"])
    if dot_reason(lw.int8_form, c, m, g) is not None:
        return False
    f = FORMS[lw.int8_form]
    # Output channels with no block of 8 or more (an int8 YOLO head's 255): computed
    # padded (zero weights, bias and multiplier), cropped by the unpack below.
    mp = padded_channels(m) if g == 1 and not residual else m
    if mp != m:
        w = np.concatenate([w, np.zeros((mp - m, *w.shape[1:]), np.int8)])
    ob = output_block(mp // g, out_t.shape[3])
    vectors, columns = dot_tile(f, mp // g, out_t.shape[3])
    have = lw.current_block(x)
    if have and (c // have) * have == c:
        data = lw.blocked(x, have)
    elif c <= 4:  # a plain image: NCHW is NCHW1c
        data = lw.view_of(lw.plain(x), (n, c, h, wd, 1), f"{x}@nchw1c")
    else:
        data = lw.blocked(x, channel_block(c))
    fold = folds_columns(f, c, g, w.shape[3], int(a["dilations"][1]))
    wk = fold_columns(w) if fold else w   # the weights as the kernel reduces them
    weight, b, mult = _operands(lw, node, wk, g, vectors, "f" if fold else "")
    args = [data, weight, b, mult, _requant(lw, node)]
    pads = list(a["pads"])
    skip = any(pads[:4])  # border taps skipped, their padding added from tap sums
    if skip:
        args.append(lw.add_const(f"{node.name}@tapsum.{f.name}v{vectors}", tap_sums(
            wk, g, f, vectors, pad_value(a))))
    if residual:
        args.append(lw.blocked(residual, ob))
    if mp == m:
        out = lw.produce(node.outputs[0], ob)
    else:
        oh, ow = out_t.shape[2:]
        out = lw.define(f"{node.outputs[0]}@pad{mp}", I8, (n, mp // ob, oh, ow, ob))
    spec = {"op": "qdot", "form": lw.int8_form, "data": lw.values[data]["shape"],
            "channels": c, "groups": g, "out": lw.values[out]["shape"], "out_channels": mp,
            "kernel": list(w.shape[2:]), "strides": list(a["strides"]),
            "pads": pads[:4], "dilations": list(a["dilations"]),
            "pad_value": pad_value(a), "tile": [vectors, columns],
            "residual": bool(residual), "skip_padding": skip, "fold_columns": fold}
    lw.kernel(node, spec, args + [out], out)
    if mp != m:
        plain = lw.produce(node.outputs[0], 0)
        lw.kernel(None, {"op": "unpack", "shape": lw.values[out]["shape"], "dtype": I8,
                         "out": list(out_t.shape)}, [out, plain], plain)
    return True


def qgemm(lw, node: Node) -> bool:
    """A QGemm ``[M, K] x [N, K]^T`` as the 1x1 ``qdot`` of an image of one row of M
    pixels."""
    if lw.int8_form is None:
        return False
    x, wv, bias, multiplier = node.inputs[:4]
    residual = node.inputs[4] if len(node.inputs) > 4 else ""
    tx = lw.type(x)
    if len(tx.shape) != 2 or tx.dtype != I8 or len(node.outputs) != 1 \
            or not all(lw.is_const(v) for v in (wv, bias, multiplier)) \
            or not _valid_epilogue(node.attrs) or lw.type(wv).dtype != I8 \
            or len(lw.type(wv).shape) != 2:
        return False
    (m, k), w = tx.shape, np.asarray(lw.const(wv), np.int8)
    n = w.shape[0]
    f = FORMS[lw.int8_form]
    vectors, columns = dot_tile(f, n, m)
    data = lw.view_of(lw.plain(x), (1, 1, 1, m, k), f"{x}@rows")
    weight, b, mult = _operands(lw, node, w.reshape(n, k, 1, 1), 1, vectors)
    args = [data, weight, b, mult, _requant(lw, node)]
    if residual:
        args.append(lw.view_of(lw.plain(residual), (1, 1, 1, m, n), f"{residual}@rows"))
    out_v = node.outputs[0]
    flat = lw.define(f"{out_v}@rows", I8, (1, 1, 1, m, n))
    spec = {"op": "qdot", "form": lw.int8_form, "data": [1, 1, 1, m, k], "channels": k,
            "groups": 1, "out": [1, 1, 1, m, n], "out_channels": n, "kernel": [1, 1],
            "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "pad_value": 0,
            "tile": [vectors, columns], "residual": bool(residual)}
    lw.kernel(node, spec, args + [flat], flat)
    lw.step("view", None, [flat], [lw.produce(out_v, 0)])  # the node's step is the kernel
    return True


def matmul_spec(lw, z: int, m: int, k: int, n: int) -> dict | None:
    """The ``qdot_matmul`` spec of a QMatMul of ``[z, m, k] @ [z, k, n]`` (lowering_q.py
    builds the rest), or None without a form."""
    if lw.int8_form is None:
        return None
    vectors, columns = dot_tile(FORMS[lw.int8_form], n, m)
    return {"op": "qdot_matmul", "form": lw.int8_form, "a": [z, m, k], "b": [z, k, n],
            "tile": [vectors, columns]}
