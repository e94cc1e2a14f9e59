"""celosia as an ONNX backend (``onnx.backend.base.Backend``), used to run onnx's backend
test suite against celosia's two executors:

- ``CelosiaBackend``: import, optimize, run on the numpy reference executor (the
  definitions of the graph level);
- ``CelosiaCpuBackend``: import, optimize, lower and compile with LLVM, run the compiled
  ``CpuModel`` (runtime/cpu.py) -- the CPU build a user gets from ``celosia compile``.

Shapes are compiled statically, so both prepare lazily: the model is imported on the first
``run`` with the shapes of the arrays given (and again when they change). An input that
decides a shape (a Reshape target or Slice's starts given as a graph input, as several onnx
node tests do; exported models have them as constants) is bound as a constant for that
call: the DynamicShapeError the importer raises names the inputs it depends on.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from ..compiler.graph.ir import DynamicShapeError

__all__ = ["CelosiaBackend", "CelosiaCpuBackend", "CelosiaRep", "EXECUTORS"]


def _reference(model, shapes: dict, bound: dict):
    """(runner, its graph inputs) of the numpy reference executor."""
    from .reference import ReferenceModel

    ref = ReferenceModel.load(model, shapes, bind_inputs=bound)
    return ref.run, list(ref.graph.inputs)


def _cpu_build(model, shapes: dict, bound: dict):
    """(runner, its graph inputs) of the compiled CPU build. The graph is imported here
    (``CpuModel.build`` takes no bound inputs) and built with ``CpuModel.from_graph``, the
    path ``CpuModel.build`` takes after the import."""
    from ..compiler.frontend.onnx import import_onnx
    from ..compiler.graph.passes import optimize
    from .cpu import CpuModel

    built = CpuModel.from_graph(optimize(import_onnx(model, shapes, bind_inputs=bound)))
    return built.run, list(built.program.inputs)


# executor name -> how a model is prepared for it
EXECUTORS = {"reference": _reference, "cpu": _cpu_build}


class CelosiaRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, executor: str = "reference"):
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {sorted(EXECUTORS)}, not {executor!r}")
        self.model = model
        self.executor = executor
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self._compiled: dict = {}

    def _prepare(self, feeds: dict):
        key = tuple((n, a.shape, str(a.dtype)) for n, a in feeds.items())
        if key not in self._compiled:
            shapes = {n: a.shape for n, a in feeds.items()}
            bound: dict = {}
            while True:
                try:
                    built = EXECUTORS[self.executor](
                        self.model, {n: s for n, s in shapes.items() if n not in bound}, bound)
                    break
                except DynamicShapeError as e:
                    names = [n for n in getattr(e, "inputs", ()) if n in feeds and n not in bound]
                    if not names:
                        raise
                    bound.update((n, feeds[n]) for n in names)
            self._compiled[key] = (built, bound)
        built, bound = self._compiled[key]
        if bound:  # values of bound inputs are part of the compiled graph: recompile if changed
            same = all(np.array_equal(v, feeds[n]) for n, v in bound.items())
            if not same:
                del self._compiled[key]
                return self._prepare(feeds)
        return built

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feeds = {n: np.asarray(a) for n, a in zip(self.input_names, inputs)}
        run, graph_inputs = self._prepare(feeds)
        results = run({n: a for n, a in feeds.items() if n in graph_inputs})
        return tuple(results[o] for o in self.output_names)


class CelosiaBackend(Backend):
    """The numpy reference executor as an ONNX backend."""

    executor = "reference"

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs):
        return device == "CPU"

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        return CelosiaRep(model, cls.executor)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)


class CelosiaCpuBackend(CelosiaBackend):
    """The compiled CPU build (LLVM kernels, numpy steps for the rest) as an ONNX backend."""

    executor = "cpu"
