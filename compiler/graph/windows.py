"""The geometry of convolution and pooling windows, shared by ops.py (Conv, the pools, and
through it the quantized operators) and ops_vision.py (LpPool, DeformConv): output sizes,
and the windows of an input as one strided view."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["pool_output_shape", "windows"]


def pool_output_shape(in_shape, kernel, strides, dilations, pads, ceil_mode=0) -> list[int]:
    """Output spatial sizes (ONNX rule: a ceil-mode window must start inside the input or
    its leading padding)."""
    nd = len(kernel)
    out = []
    for i in range(nd):
        span = (kernel[i] - 1) * dilations[i] + 1
        total = in_shape[i] + pads[i] + pads[i + nd] - span
        if ceil_mode:
            o = -(-total // strides[i]) + 1
            if (o - 1) * strides[i] >= in_shape[i] + pads[i]:
                o -= 1
        else:
            o = total // strides[i] + 1
        out.append(int(o))
    return out


def windows(x, kernel, strides, dilations, pads, out_sizes, fill):
    """Windows [N, C, *out, *kernel] of x padded with ``fill`` (extra trailing padding
    for ceil mode, truncation when pads exceed what the windows use)."""
    nd = len(kernel)
    widths = [(0, 0), (0, 0)]
    for i in range(nd):
        span = (kernel[i] - 1) * dilations[i] + 1
        need = (out_sizes[i] - 1) * strides[i] + span
        widths.append((pads[i], max(need - x.shape[2 + i] - pads[i], 0)))
    xp = np.pad(x, widths, constant_values=fill) if any(map(any, widths)) else x
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    w = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + nd)))
    index = ((slice(None), slice(None))
             + tuple(slice(0, o * s, s) for o, s in zip(out_sizes, strides))
             + tuple(slice(None, None, d) for d in dilations))
    return w[index]
