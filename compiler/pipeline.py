"""The path a model takes through the compiler, as one function per step a caller chooses.

``import_onnx`` (frontend) -> ``optimize`` (graph passes) -> ``quantize_graph`` or
``from_qdq`` (graph level) -> a backend: ``celosia.compiler.cpu.lowering`` for the CPU build,
``celosia.compiler.accel.partition`` to place and compile layers on the accelerator (the
runtime, ``celosia.runtime``, drives these and runs the result).

This module is the only one that reaches both the frontend and the graph level: it is where a
model file becomes a quantized graph.
"""

from __future__ import annotations

import numpy as np

from .frontend.onnx import import_onnx
from .graph.ir import Graph
from .graph.passes import conv1d_as_2d, optimize
from .graph.qforms import quant_forms
from .graph.quantize import (_samples, from_qdq, is_qdq, quantize_graph,
                             split_dense_epilogues)
from .graph.residual import float_residuals
from .graph.smooth import check_alpha, smooth_graph

__all__ = ["quantize_model"]


def quantize_model(model_or_graph, calibration=None, *, per_channel: bool = True,
                   input_shapes: dict | None = None, method: str = "mse",
                   percentile: float | None = None,
                   smooth: float | str | None = None,
                   int8_residuals: bool = False, bias_correction: bool = True) -> Graph:
    """The quantized graph of an ONNX model (path, bytes, ModelProto; imported with
    ``input_shapes``, by default the shapes of the first calibration feed when
    ``calibration`` is a list of feeds) or of a graph (imported, optimized or not).

    A model with QuantizeLinear/DequantizeLinear nodes is a QDQ model: ``from_qdq``, then
    ``optimize`` for the float rest (``calibration`` is not needed). Otherwise ``optimize``
    then ``quantize_graph`` with ``calibration`` (feeds, a dict of sample arrays or an .npz
    path; ``method``: how each int8 range is chosen, "mse", "minmax", "percentile" (with
    ``percentile``, or "percentile:P") or "entropy", graph/calib.py). ``smooth``:
    the SmoothQuant alpha of ``smooth_graph`` (graph/smooth.py: a number in [0, 1] or
    "auto"), applied before quantizing; None (the default: measured, it does not pay on the
    zoo once residual sums are float, docs/graph.md) or 0 leaves the activations as they are.
    ``int8_residuals``: keep dense layers' residual sums fused and int8; by default they are
    float (``float_residuals``, graph/residual.py).
    """
    if input_shapes is None and not isinstance(model_or_graph, Graph) and \
            isinstance(calibration, (list, tuple)) and calibration and \
            isinstance(calibration[0], dict):
        # a model with dynamic dims takes its sizes from the feeds, as `celosia run` does
        # from its arrays (every feed must then have them)
        input_shapes = {k: np.shape(v) for k, v in calibration[0].items()}
    graph = model_or_graph if isinstance(model_or_graph, Graph) else \
        import_onnx(model_or_graph, input_shapes)
    if is_qdq(graph):
        return optimize(from_qdq(graph))
    # 1-D convolutions as 2-D ones of height 1: the integer convolutions are 2-D.
    graph = conv1d_as_2d(optimize(graph))
    # Spatial means, average pools, unfused per-channel scales: forms with int8 layers.
    graph = quant_forms(graph)
    if smooth is not None and check_alpha(smooth):
        calibration = _samples(graph, calibration)
        graph = smooth_graph(graph, calibration, smooth)
    if not int8_residuals:
        # (a dense layer's epilogue the int8 layer cannot take whole is split first, as
        # quantize_graph does, so a residual sum inside it is found at its end)
        graph = float_residuals(split_dense_epilogues(graph))
    return quantize_graph(graph, calibration, per_channel=per_channel,
                          method=method, percentile=percentile,
                          bias_correction=bias_correction)
