"""CNN operators beyond schedules.py's convolutions: ConvTranspose on channel-blocked
tensors (float32).

ConvTranspose scatters each input pixel's kernel window into the output; read from the
output's side (a gather), output row ``oy`` receives tap ``ky`` from input row
``(oy + pad - ky * dilation) / stride`` where that is an integer inside the input. The
kernel computes it so, like a convolution: per (image, output channel block, output row)
in parallel and chunk of ``reg_n`` output columns, ``reg_n`` vectors of ``ob`` output
channels accumulated in registers over the input channels and taps.

- Kernel = stride, dilation 1, no padding and no output padding (U-Net's 2x2, stride 2
  upsampling): every output pixel has exactly one tap, ``(oy % s, ox % s)``, from input
  pixel ``(oy // s, ox // s)``; no condition, no wasted taps.
- The same with few output channels (a detector's last up-sampling to one probability map,
  blocks under 8: a register tile of one-channel vectors, scalar code, 4x slower than
  onnxruntime on PP-OCR's head): lowering.py makes it two kernels instead, a 1x1
  convolution to the ``KH * KW * M`` channels of every tap on the input grid (the
  convolution kernel, vectorised over those channels) and ``pixel_shuffle_nchwc``, which
  moves tap ``(oy % s, ox % s)`` of input pixel ``(oy // s, ox // s)`` to its output pixel
  and adds the bias (``taps_as_channels``: the weights of the first).
- Otherwise, with one group and a stride, the same two kernels with ``fold_taps_nchwc``
  (col2im) in place of the shuffle: it sums the taps landing on each output pixel, a
  select per tap and output channel instead of per tap, input and output channel (3x3
  stride 2, 64 -> 32 channels on 40x40: 14.7 -> 2.0 ms, onnxruntime 1.9-4.3).
- Otherwise (groups, or stride 1, where few taps miss) every tap is visited and a select
  (evaluated lazily: no read out of bounds) keeps those that land on an input pixel.

Weights ``[C, M/g, KH, KW]`` (ONNX) are packed as a convolution's ``[O//ob, I/g//cb, KH,
KW, cb, ob]`` (``pack_conv_transpose_weight``).
"""

from __future__ import annotations

import numpy as np

from celosia.errors import CompilerError

from ..tensor import te
from ..tensor.expr import all_of, as_expr, select
from ..tensor.schedule import Schedule, create_schedule
from .schedules import pack_conv_weight, schedule_rows

__all__ = ["conv_transpose_nchwc", "schedule_conv_transpose_nchwc",
           "pack_conv_transpose_weight", "direct_taps", "taps_as_channels",
           "pixel_shuffle_nchwc", "fold_taps_nchwc"]

_TAG = "conv_transpose_nchwc"


def pack_conv_transpose_weight(w: np.ndarray, groups: int, in_block: int,
                               out_block: int) -> np.ndarray:
    """ONNX ``[C, M/g, KH, KW]`` -> ``[M//out_block, C/g//in_block, KH, KW, in_block,
    out_block]`` (a convolution's packed layout, input and output swapped per group)."""
    c, mg, kh, kw = w.shape
    cg = c // groups
    oihw = w.reshape(groups, cg, mg, kh, kw).transpose(0, 2, 1, 3, 4).reshape(
        groups * mg, cg, kh, kw)
    return pack_conv_weight(oihw, in_block, out_block)


def _direct(stride, pads, dilation, kernel, in_hw, out_hw) -> bool:
    """Whether every output pixel has exactly one tap (see the module docstring)."""
    return tuple(kernel) == tuple(stride) and tuple(dilation) == (1, 1) and not any(pads) \
        and tuple(out_hw) == (in_hw[0] * stride[0], in_hw[1] * stride[1])


def direct_taps(attrs: dict, kernel, in_hw, out_hw) -> bool:
    """Whether every output pixel of a ConvTranspose (ONNX ``attrs``, ``kernel`` (KH, KW))
    has exactly one tap."""
    return _direct(attrs["strides"], attrs["pads"], attrs["dilations"], kernel, in_hw, out_hw)


def taps_as_channels(w: np.ndarray) -> np.ndarray:
    """ONNX ``[C, M, KH, KW]`` (one group) -> OIHW ``[KH * KW * M, C, 1, 1]``: output channel
    ``(ky * KW + kx) * M + m`` of the 1x1 convolution is tap ``(ky, kx)`` of channel ``m``."""
    c, m, kh, kw = w.shape
    return np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(kh * kw * m, c, 1, 1))


def pixel_shuffle_nchwc(taps: te.Tensor, *, kernel, channels: int, out_block: int,
                        bias: te.Tensor | None = None, name: str = "shuffle") -> te.Tensor:
    """``[N, KH*KW*M // tb, H, W, tb]`` (the 1x1 convolution of ``taps_as_channels``) ->
    ``[N, M // out_block, H*KH, W*KW, out_block]``: output pixel ``(y, x)`` is tap
    ``(y % KH, x % KW)`` of input pixel ``(y // KH, x // KW)``, plus ``bias`` ``[M //
    out_block, out_block]``."""
    n, tcc, h, w, tb = taps.shape
    kh, kw = kernel
    _check_taps(taps, kernel, channels, out_block, name)

    def out(b, c, y, x, co):
        t = ((y % kh) * kw + x % kw) * channels + c * out_block + co
        v = taps[b, t // tb, y // kh, x // kw, t % tb]
        return v + bias[c, co] if bias is not None else v

    return te.compute((n, channels // out_block, h * kh, w * kw, out_block), out, name)


def _check_taps(taps: te.Tensor, kernel, channels: int, out_block: int, name: str) -> None:
    _, tcc, _, _, tb = taps.shape
    if tcc * tb != kernel[0] * kernel[1] * channels or channels % out_block:
        raise CompilerError(f"{name}: {taps.shape} does not hold {kernel[0]}x{kernel[1]} taps "
                            f"of {channels} channels in blocks of {out_block}")


def fold_taps_nchwc(taps: te.Tensor, *, kernel, channels: int, out_block: int, stride, pads,
                    dilation, out_hw, bias: te.Tensor | None = None,
                    name: str = "fold") -> te.Tensor:
    """The general form of ``pixel_shuffle_nchwc`` (col2im): output pixel ``(y, x)`` sums
    tap ``(ky, kx)`` of input pixel ``((y + pad - ky * dilation) / stride, ...)`` over the
    taps for which that is an input pixel (a lazy select per tap: no read out of bounds)."""
    n, _, h, w, tb = taps.shape
    (kh, kw), (sh, sw), (dh, dw), (pt, pl) = kernel, stride, dilation, pads[:2]
    _check_taps(taps, kernel, channels, out_block, name)

    def out(b, c, y, x, co):
        total = bias[c, co] if bias is not None else as_expr(0.0)
        for ky in range(kh):
            for kx in range(kw):
                py, px = y + pt - ky * dh, x + pl - kx * dw
                iy, ix = py // sh, px // sw
                ok = all_of(py >= 0, px >= 0, (py % sh).equal(0), (px % sw).equal(0),
                            iy < h, ix < w)
                t = (ky * kw + kx) * channels + c * out_block + co
                total = total + select(ok, taps[b, t // tb, iy, ix, t % tb], as_expr(0.0))
        return total

    return te.compute((n, channels // out_block, *out_hw, out_block), out, name)


def conv_transpose_nchwc(data: te.Tensor, weight: te.Tensor, *, stride, pads, dilation,
                         out_hw, groups: int = 1, bias: te.Tensor | None = None,
                         epilogue=None, name: str = "convT") -> te.Tensor:
    """ConvTranspose of ``[N, C//cb, H, W, cb]`` with packed weights ``[M//ob, C/g//cb, KH,
    KW, cb, ob]``: ``[N, M//ob, OH, OW, ob]`` (``out_hw`` = (OH, OW) as ONNX computes it,
    ``pads`` (top, left, bottom, right) >= 0); ``bias`` ``[M//ob, ob]``."""
    n, icc, h, w, cb = data.shape
    occ, icc_g, kh, kw, cb_w, ob = weight.shape
    if cb_w != cb or icc_g * groups != icc or occ % groups or any(p < 0 for p in pads):
        raise CompilerError(f"{name}: the kernel {weight.shape} with groups={groups} does not "
                            f"fit the data {data.shape} (pads {pads} must be >= 0)")
    occ_g = occ // groups
    (sh, sw), (dh, dw), (pt, pl) = stride, dilation, pads[:2]
    oh, ow = out_hw
    out_shape = (n, occ, oh, ow, ob)
    rc, ri = te.reduce_axis(icc_g, "rc"), te.reduce_axis(cb, "ri")

    def channel(c):
        return rc if groups == 1 else (c // occ_g) * icc_g + rc

    if _direct(stride, pads, dilation, (kh, kw), (h, w), out_hw):
        acc = te.compute(out_shape, lambda b, c, y, x, co: te.sum(
            data[b, channel(c), y // sh, x // sw, ri]
            * weight[c, rc, y % sh, x % sw, ri, co], axis=[rc, ri]), f"{name}.acc", tag=_TAG)
    else:
        ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")

        def body(b, c, y, x, co):
            py, px = y + pt - ry * dh, x + pl - rx * dw
            iy, ix = py // sh, px // sw
            ok = all_of(py >= 0, px >= 0, (py % sh).equal(0), (px % sw).equal(0), iy < h,
                        ix < w)
            v = select(ok, data[b, channel(c), iy, ix, ri], as_expr(0.0))
            return te.sum(v * weight[c, rc, ry, rx, ri, co], axis=[rc, ry, rx, ri])
        acc = te.compute(out_shape, body, f"{name}.acc", tag=_TAG)
    if bias is not None and tuple(bias.shape) != (occ, ob):
        raise CompilerError(f"{name}: bias must have shape {(occ, ob)}, not {bias.shape}")

    def out(b, c, y, x, co):
        v = acc[b, c, y, x, co]
        if bias is not None:
            v = v + bias[c, co]
        return epilogue(v, (b, c, y, x, co)) if epilogue is not None else v

    return te.compute(out_shape, out, name, tag=_TAG)


def _largest_divisor(n: int, at_most: int, multiple_of: int = 1) -> int:
    ok = [d for d in range(1, min(n, at_most) + 1) if n % d == 0 and d % multiple_of == 0]
    return max(ok) if ok else 1


def schedule_conv_transpose_nchwc(out: te.Tensor) -> Schedule:
    """Per (image, output channel block, output row) in parallel and chunk of ``reg_n``
    columns (a multiple of the column stride when it can be, so that ``x // s`` and
    ``x % s`` fold into constants of the unrolled columns), the accumulator in registers."""
    if out.op.tag != _TAG:
        raise CompilerError(f"schedule_conv_transpose_nchwc: {out.name} was not made by "
                            f"conv_transpose_nchwc")
    s = create_schedule(out)
    acc = s[next(st for st in s.stages if st.name == out.name + ".acc").tensor]
    _, _, _, ow, ob = out.shape
    w = te.inputs_of(acc.op)[0].shape[3]  # the data's width: the direct form's stride
    stride_w = ow // w if ow % w == 0 else 1
    reg_n = _largest_divisor(ow, 28 if ob <= 8 else 14, stride_w)
    if reg_n == 1:
        reg_n = _largest_divisor(ow, 28 if ob <= 8 else 14)
    schedule_rows(s, None, out, acc, reg_n)  # no padding stage: taps read in range only
    leaves = acc.leaves
    data_axes, reduce_axes = leaves[:5], leaves[5:]
    acc.reorder(*data_axes[:3], *reduce_axes, *data_axes[3:])
    acc.unroll(data_axes[3])
    acc.vectorize(data_axes[4])
    return s
