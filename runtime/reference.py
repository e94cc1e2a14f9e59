"""The reference CPU executor: a model imported, optimized, and run by the numpy kernels.

This is the correctness oracle the compiled CPU build (LLVM) and the accelerator build are
compared against, and the fallback for nodes they do not take.
"""

from __future__ import annotations

import numpy as np

from ..compiler.graph.ir import Graph
from ..compiler.frontend.onnx import import_onnx
from ..compiler.graph.reference import run_graph
from ..compiler.graph.passes import optimize as optimize_graph

__all__ = ["ReferenceModel"]


class ReferenceModel:
    """A graph ready to run on numpy: ``ReferenceModel.load(path).run({name: array})``."""

    def __init__(self, graph: Graph):
        self.graph = graph

    @classmethod
    def load(cls, model, input_shapes: dict | None = None, *, optimize: bool = True,
             bind_inputs: dict | None = None) -> "ReferenceModel":
        graph = import_onnx(model, input_shapes, bind_inputs=bind_inputs)
        return cls(optimize_graph(graph) if optimize else graph)

    @property
    def input_types(self) -> dict:
        return {i: self.graph.types[i] for i in self.graph.inputs}

    def run(self, feeds: dict) -> dict[str, np.ndarray]:
        """Outputs by name; an input of the wrong shape or type raises InputShapeError."""
        return run_graph(self.graph, feeds)
