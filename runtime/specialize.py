"""A CPU model of an ONNX file with dynamic input dims: one build per input shape.

    model = CpuModel.open("det.onnx")        # inputs declared [-1,3,?,?]: no shape needed
    model.run({"x": a})                      # built for a.shape on first use, then cached
    model.run({"x": b})                      # another shape: another build
    model.builds                             # {shapes: CpuModel}, most recent last

A build is a static CpuModel (compiled kernels, planned arena), so the dims the model
declares dynamic (-1, 0, a dim_param, unnamed) take the sizes of the arrays given. At most
``max_builds`` builds are kept: the least recently used goes first (its kernels stay in the
kernel cache on disk, so building that shape again is quick).

``model.save("det.cel")`` writes one ``.cel`` of format ``celosia-cpu-dynamic``: the ONNX
model once (``model.onnx``) and each build as a member ``builds/K.cel`` (a whole CPU .cel
without its own copy of the model), least recently used first. ``CpuModel.open`` loads it
as a DynamicCpuModel: the saved builds run without compiling, other shapes are built from
the model it keeps. Every member is checked as a .cel is (runtime/artifact.py), and each
build's input shapes against the dims the model declares.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..compiler.frontend.inputs import dims_str, is_dynamic, shape_problem
from ..compiler.graph.ir import InputShapeError
from .artifact import Artifact, ArtifactError, write_artifact

__all__ = ["DynamicCpuModel", "MAX_BUILDS", "FORMAT", "VERSION"]

MAX_BUILDS = 8
FORMAT, VERSION = "celosia-cpu-dynamic", 1


class DynamicCpuModel:
    """An ONNX model whose dynamic input dims take the sizes of the arrays fed (see the
    module docstring), made by ``CpuModel.open``: ``build(path, input_shapes, progress=)``
    makes a build, ``source`` is the model's bytes; ``fixed`` holds shapes given up front
    (``input_shapes``)."""

    def __init__(self, path, declared: dict, fixed: dict | None = None, *, build, source,
                 progress=None, max_builds: int = MAX_BUILDS, onnx=None):
        if not isinstance(max_builds, int) or max_builds < 1:
            raise ValueError(f"max_builds must be a positive integer, not {max_builds!r}")
        self.path = str(path)
        self.source, self._build = source, build
        self._onnx = path if onnx is None else onnx  # what builds are made from
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
        model = self._build(self._onnx, shapes, progress=self.progress)
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

    # ---- one .cel -------------------------------------------------------------------------

    def save(self, path) -> None:
        """Write the model and its builds as one .cel (see the module docstring)."""
        write_artifact(path, *self._artifact())

    def to_bytes(self) -> bytes:
        return write_artifact(None, *self._artifact())

    def _artifact(self) -> tuple[dict, dict]:
        if self.source is None:
            raise ArtifactError(f"{self.path}: the ONNX model's bytes are not kept; open the "
                                "ONNX file with CpuModel.open to save it")
        members = {"model.onnx": self.source}
        for k, build in enumerate(self.builds.values()):
            kept, build.source = build.source, None  # the model is stored once
            try:
                members[f"builds/{k}.cel"] = build.to_bytes()
            finally:
                build.source = kept
        manifest = {"format": FORMAT, "version": VERSION, "max_builds": self.max_builds,
                    "fixed": {n: list(s) for n, s in self.fixed.items()},
                    "builds": [f"builds/{k}.cel" for k in range(len(self.builds))]}
        return manifest, members

    @classmethod
    def load(cls, source, input_shapes: dict | None = None, *, build, load,
             where: str | None = None, progress=None,
             max_builds: int | None = None) -> "DynamicCpuModel":
        """A saved DynamicCpuModel (a path, or bytes with ``where`` naming them): ``load``
        reads a saved build (CpuModel.load), ``build`` makes the builds of other shapes
        (CpuModel.build); ``input_shapes`` fix inputs as ``CpuModel.open`` does."""
        with Artifact(source, where) as a:
            a.manifest(FORMAT, VERSION)
            saved_max, fixed, members = a.check(_check_manifest)
            onnx_bytes = a.read("model.onnx")
            builds = [load(a.read(m), f"{a.where}: {m}") for m in members]
            where = a.where
        declared = _declared(onnx_bytes, where)
        for name, shape in (input_shapes or {}).items():
            if name not in declared:
                raise InputShapeError(f"{where}: the model has no input {name!r}; its inputs "
                                      f"are {', '.join(declared)}")
            fixed[name] = tuple(shape)
        model = cls(where, declared, fixed, build=build, source=onnx_bytes, progress=progress,
                    max_builds=max_builds or saved_max, onnx=onnx_bytes)
        for member, b in zip(members, builds):
            key = _build_key(model, b, f"{where}: {member}")
            if key is not None and key not in model.builds:
                b.source, b.path = onnx_bytes, f"{where}: {member}"
                model.builds[key] = b
        while len(model.builds) > model.max_builds:
            model.builds.popitem(last=False)
        return model


def _check_manifest(root) -> tuple[int, dict, list[str]]:
    fixed = {n: tuple(d.integer() for d in f.list()) for n, f in root["fixed"].items()}
    members = [f.string() for f in root["builds"].list()]
    for k, m in enumerate(members):
        if m != f"builds/{k}.cel":
            raise root["builds"].list()[k].fail(f"names {m!r}, not 'builds/{k}.cel'")
    return root["max_builds"].integer(1, 1 << 16), fixed, members


def _declared(onnx_bytes: bytes, where: str) -> dict:
    from ..compiler.frontend.onnx import declared_inputs
    from ..errors import CelosiaError

    try:
        return declared_inputs(onnx_bytes)
    except CelosiaError as e:
        raise ArtifactError(f"{where}: model.onnx: {e}") from None


def _build_key(model: DynamicCpuModel, build, where: str):
    """The builds-cache key of a saved build, from its own input types: they must fit the
    dims the model declares; a build for other fixed shapes than asked now is left out."""
    types = build.input_types
    if set(types) != set(model.declared):
        raise ArtifactError(f"{where}: its inputs {sorted(types)} are not the model's "
                            f"{sorted(model.declared)}; build it again with CpuModel.open")
    shapes = {}
    for name, (dtype, dims) in model.declared.items():
        built_dtype, shape = types[name]
        problem = shape_problem(name, dims, shape) if dims is not None else None
        if built_dtype != dtype or problem:
            raise ArtifactError(f"{where}: built for {name!r} {built_dtype}{dims_str(shape)}, "
                                f"which the model's {dtype}{dims_str(dims)} does not take; "
                                "build it again with CpuModel.open")
        if name in model.fixed and tuple(model.fixed[name]) != tuple(shape):
            return None
        if name in model.fixed or is_dynamic(dims):
            shapes[name] = tuple(shape)
    return tuple(sorted(shapes.items()))
