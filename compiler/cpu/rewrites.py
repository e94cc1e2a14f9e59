"""The graph rewrites the CPU build makes before lowering, in order: one list for the main
graph (lowering.lower_graph) and for control-flow bodies (control.py), so that a body
gets every form the main graph does."""

from __future__ import annotations

from ..graph.ir import Graph
from .conv1d import conv1d_as_2d  # 1-D convolutions on the 2-D kernels
from .conv1d_dense import conv1d_as_dense  # or, with long kernels, on the dense one
from .conv3d import conv3d_as_2d  # 3-D convolutions as sums of 2-D ones
from .convt import unit_stride_transposed_as_conv  # stride-1 ConvTranspose as a Conv
from .dead_taps import prune_dead_taps  # kernel taps that only read padding

__all__ = ["before_lowering"]


def before_lowering(graph: Graph) -> Graph:
    """``graph`` with the CPU build's kernel forms made (the modules above)."""
    graph = conv1d_as_2d(conv1d_as_dense(unit_stride_transposed_as_conv(graph)))
    return prune_dead_taps(conv3d_as_2d(graph))
