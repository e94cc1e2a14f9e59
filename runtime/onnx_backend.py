"""celosia as an ONNX backend (``onnx.backend.base.Backend``): import, optimize, run on the
numpy reference executor. Used to run onnx's backend test suite against celosia.

Shapes are compiled statically, so the backend prepares lazily: the model is imported on
the first ``run`` with the shapes of the arrays given (and again when they change). An
input that decides a shape (a Reshape target given as a graph input, as several onnx node
tests do) is bound as a constant for that call: the DynamicShapeError the importer raises
names the inputs it depends on.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from ..compiler.graph.ir import DynamicShapeError
from .reference import ReferenceModel

__all__ = ["CelosiaBackend", "CelosiaRep"]


class CelosiaRep(BackendRep):
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self._compiled: dict = {}

    def _prepare(self, feeds: dict) -> ReferenceModel:
        key = tuple((n, a.shape, str(a.dtype)) for n, a in feeds.items())
        if key not in self._compiled:
            shapes = {n: a.shape for n, a in feeds.items()}
            bound: dict = {}
            while True:
                try:
                    ref = ReferenceModel.load(self.model, {n: s for n, s in shapes.items()
                                                           if n not in bound},
                                              bind_inputs=bound)
                    break
                except DynamicShapeError as e:
                    names = [n for n in getattr(e, "inputs", ()) if n in feeds and n not in bound]
                    if not names:
                        raise
                    bound.update((n, feeds[n]) for n in names)
            self._compiled[key] = (ref, bound)
        ref, bound = self._compiled[key]
        if bound:  # values of bound inputs are part of the compiled graph: recompile if changed
            same = all(np.array_equal(v, feeds[n]) for n, v in bound.items())
            if not same:
                del self._compiled[key]
                return self._prepare(feeds)
        return ref

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feeds = {n: np.asarray(a) for n, a in zip(self.input_names, inputs)}
        ref = self._prepare(feeds)
        results = ref.run({n: a for n, a in feeds.items() if n in ref.graph.inputs})
        return tuple(results[o] for o in self.output_names)


class CelosiaBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs):
        return device == "CPU"

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        return CelosiaRep(model)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)
