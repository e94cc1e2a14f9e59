"""A CPU model of an ONNX file with dynamic input dims: one build per input shape.

    model = CpuModel.open("det.onnx")        # inputs declared [-1,3,?,?]: no shape needed
    model.run({"x": a})                      # built for a.shape on first use, then cached
    model.run({"x": b})                      # another shape: another build
    model.builds                             # {shapes: CpuModel}, most recent last

A build is a static CpuModel (compiled kernels, planned arena), so the dims the model
declares dynamic (-1, 0, a dim_param, unnamed) take the sizes of the arrays given. At most
``max_builds`` builds are kept: the least recently used goes first (its kernels stay in the
kernel cache on disk, so building that shape again is quick).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..compiler.frontend.inputs import dims_str, is_dynamic, shape_problem
from ..compiler.graph.ir import InputShapeError

__all__ = ["DynamicCpuModel", "MAX_BUILDS"]

MAX_BUILDS = 8


class DynamicCpuModel:
    """An ONNX model whose dynamic input dims take the sizes of the arrays fed (see the
    module docstring), made by ``CpuModel.open``: ``build(path, input_shapes, progress=)``
    makes a build, ``source`` is the model's bytes; ``fixed`` holds shapes given up front
    (``input_shapes``)."""

    def __init__(self, path, declared: dict, fixed: dict | None = None, *, build, source,
                 progress=None, max_builds: int = MAX_BUILDS):
        if not isinstance(max_builds, int) or max_builds < 1:
            raise ValueError(f"max_builds must be a positive integer, not {max_builds!r}")
        self.path = str(path)
        self.source, self._build = source, build
        self.declared = declared  # {name: (dtype, dims)}
        self.fixed = {n: tuple(s) for n, s in (fixed or {}).items()}
        self.progress, self.max_builds = progress, max_builds
        self.builds: OrderedDict = OrderedDict()
        self.last = None  # the build of the last run
        self.built = 0    # builds made (more than len(builds) once some were dropped)

    @property
    def input_types(self) -> dict:
        """{input name: (dtype, shape)}, None in the shape for a dim a run decides."""
        return {n: (dtype, self.fixed.get(n) or (None if dims is None else tuple(
            d if isinstance(d, int) else None for d in dims)))
                for n, (dtype, dims) in self.declared.items()}

    @property
    def origin(self) -> dict:
        return {"from": "onnx", "quantized": False,
                "inputs": {n: d for n, (_, d) in self.declared.items()}}

    def shapes_for(self, feeds: dict) -> dict:
        """The input shapes of the build that runs ``feeds``: the dynamic inputs' arrays'
        shapes (InputShapeError for an array that does not fit what the model declares)."""
        unknown = sorted(set(feeds) - set(self.declared))
        if unknown:
            raise InputShapeError(f"unknown input{'s' if len(unknown) > 1 else ''} "
                                  f"{', '.join(map(repr, unknown))}: the model's inputs are "
                                  f"{', '.join(self.declared)}")
        shapes = {}
        for name, (dtype, dims) in self.declared.items():
            if name in self.fixed or not is_dynamic(dims):
                continue
            a = feeds.get(name)
            if a is None:
                shown = dims_str(dims) if dims is not None else " of unknown rank"
                raise InputShapeError(f"input {name!r} ({dtype}{shown}) was not given")
            if not isinstance(a, np.ndarray):
                raise InputShapeError(f"input {name!r} must be a numpy array, not "
                                      f"{type(a).__name__}")
            problem = shape_problem(name, dims, a.shape)
            if problem:
                raise InputShapeError(f"{problem}: pass an array the model's declared dims "
                                      f"fit, {dims_str(dims)} (a name or -1 or ? takes any "
                                      "size)")
            shapes[name] = tuple(int(d) for d in a.shape)
        return {**self.fixed, **shapes}

    def build_for(self, shapes: dict):
        """The build for these input shapes: cached, or made now (dropping the least
        recently used build beyond ``max_builds``)."""
        key = tuple(sorted(shapes.items()))
        if key in self.builds:
            self.builds.move_to_end(key)
            return self.builds[key]
        model = self._build(self.path, shapes, progress=self.progress)
        self.built += 1
        self.builds[key] = model
        while len(self.builds) > self.max_builds:
            self.builds.popitem(last=False)
        return model

    def run(self, feeds: dict, *, profile: bool = False, progress=None) -> dict:
        """{output name: array}, by the build for the arrays' shapes."""
        self.last = self.build_for(self.shapes_for(feeds))
        return self.last.run(feeds, profile=profile, progress=progress)

    # What the last run's build reports.

    @property
    def profile(self) -> list[dict]:
        return self.last.profile if self.last else []

    def report(self) -> dict:
        report = self.last.report()
        report["builds"] = {"cached": len(self.builds), "made": self.built,
                            "max_builds": self.max_builds,
                            "input_shapes": {n: list(s) for n, s in
                                             dict(next(reversed(self.builds))).items()}}
        return report
