"""CPU builds of whole models: build from ONNX or from a graph, save and load ``.cel`` files,
run.

    model = CpuModel.build("resnet18.onnx")            # import, optimize, lower, compile
    model = CpuModel.from_graph(quantize_model(onnx_model, calibration))   # int8, bit-exact
    model.save("resnet18.cel")
    model = CpuModel.load("resnet18.cel")              # no compilation: object code inside
    outputs = model.run({"image": x})                  # {ONNX output name: array}
    model.run({"image": x}, profile=True); model.profile   # per-node times

The pipeline, top to bottom:

1. ``import_onnx`` (static shapes; ``input_shapes`` for dynamic dimensions) and
   ``optimize`` (constant folding, BN folding, epilogue fusion): graph_passes.py. This is
   ``build``; ``from_graph`` starts at step 2 with a graph made elsewhere, e.g. a quantized
   graph (compiler/quantize.py), whose outputs equal graph_numpy.run_graph's bit for bit.
2. ``lower_graph``: layouts, packed weights, one step per node (graph_cpu.py).
3. ``compile_program``: each distinct kernel spec compiled once, through the kernel cache
   (graph_cpu_kernels.py, codegen_llvm.py).
4. ``GraphExecutor``: planned arena, bound kernels, timing (executor.py).

A ``.cel`` file is a zip archive (stored, not compressed):

    manifest.json        format, version, host CPU, origin, the program (values, steps),
                         kernel records, build info
    constants/N.npy      packed weights and other constants
    kernels/KEY.o        object code per kernel, KEY = the hash of its spec and compiler
    model.onnx           the source model, when there is one (for --compare and rebuilding)

``origin`` (version 2) says what the model was built from: ``{"from": "onnx" | "graph",
"quantized": bool}`` (a graph with graph_int's integer operators); a build from ONNX also
records ``"inputs"``, each input's dims as the model declares them (ints fixed, strings
dynamic: frontend/inputs.py), so an input of another size is told whether a rebuild can
take it and the command that does. Loading checks the format, version (1 or 2: version 1
files, all built from ONNX, load too) and CPU; a truncated or corrupt file is an
``ArtifactError`` naming the file.

An ONNX model with dynamic input dims and no shapes given opens (``CpuModel.open``) as a
:class:`~celosia.runtime.specialize.DynamicCpuModel`: a build per input shape, made from the
arrays of the first run of that shape.
"""

from __future__ import annotations

import io
import json
import shlex
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np

from ..compiler.graph.ir import Graph, Node, TensorType, constant
from ..errors import CelosiaError

__all__ = ["CpuModel", "ArtifactError", "FORMAT", "VERSION", "is_artifact"]

FORMAT = "celosia-cpu"
VERSION = 2
_READS = (1, 2)  # version 1 has no "origin": built from ONNX


class ArtifactError(CelosiaError):
    """A .cel file that cannot be loaded: names the file and what to do."""


def is_artifact(path) -> bool:
    """Whether ``path`` looks like a .cel (a zip archive) rather than an ONNX file."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


# ---- JSON for attributes of numpy steps ------------------------------------------------------


def _encode(v):
    if isinstance(v, np.ndarray):
        return {"__ndarray__": v.tolist(), "dtype": str(v.dtype), "shape": list(v.shape)}
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, Graph):
        return {"__graph__": encode_graph(v)}
    if isinstance(v, (list, tuple)):
        return [_encode(x) for x in v]
    if isinstance(v, dict):
        return {k: _encode(x) for k, x in v.items()}
    return v


def _decode(v):
    if isinstance(v, dict):
        if "__ndarray__" in v:
            return np.array(v["__ndarray__"], dtype=v["dtype"]).reshape(v["shape"])
        if "__graph__" in v:
            return decode_graph(v["__graph__"])
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


def encode_graph(g: Graph) -> dict:
    """A graph held by a node's attribute (If's branches, Loop's and Scan's bodies) as
    JSON-able data; its nodes' attributes (and nested bodies) encoded like a step's."""
    return {"name": g.name, "inputs": list(g.inputs), "outputs": list(g.outputs),
            "outer": list(g.outer),
            "nodes": [{"op": n.op, "inputs": list(n.inputs), "outputs": list(n.outputs),
                       "attrs": _encode(n.attrs), "name": n.name} for n in g.nodes],
            "initializers": {k: _encode(a) for k, a in g.initializers.items()},
            "types": {k: [t.dtype, list(t.shape)] for k, t in g.types.items()}}


def decode_graph(d: dict) -> Graph:
    """The inverse of ``encode_graph``."""
    nodes = tuple(Node(n["op"], tuple(n["inputs"]), tuple(n["outputs"]), _decode(n["attrs"]),
                       n["name"]) for n in d["nodes"])
    inits = {k: constant(_decode(a)) for k, a in d["initializers"].items()}
    types = {k: TensorType(dtype, tuple(shape)) for k, (dtype, shape) in d["types"].items()}
    return Graph(d["name"], tuple(d["inputs"]), tuple(d["outputs"]), nodes, inits, types,
                 tuple(d["outer"]))


class CpuModel:
    """A whole model compiled for this CPU (see the module docstring)."""

    def __init__(self, program, *, source: bytes | None = None, build_info: dict | None = None,
                 origin: dict | None = None):
        self.program = program
        self.source = source
        self.build_info = build_info or {}
        self.origin = origin or {}
        self._executor = None
        self.path = None         # the .cel it was loaded from
        self.source_path = None  # the ONNX file it was built from

    # ---- building, saving, loading ---------------------------------------------------------

    @classmethod
    def build(cls, model, input_shapes: dict | None = None, *, progress=None) -> "CpuModel":
        """Import (a path, bytes or onnx.ModelProto), optimize, lower and compile."""
        from ..compiler.frontend.onnx import declared_inputs, import_onnx
        from ..compiler.graph.passes import optimize

        start = time.perf_counter()
        graph = optimize(import_onnx(model, input_shapes))
        imported = time.perf_counter()
        built = cls.from_graph(graph, progress=progress, source=_model_bytes(model))
        built.origin["from"] = "onnx"
        built.origin["inputs"] = {n: dims for n, (_, dims) in declared_inputs(model).items()}
        built.build_info["import_s"] = imported - start
        built.build_info["total_s"] = time.perf_counter() - start
        if isinstance(model, (str, Path)):
            built.source_path = str(model)
        return built

    def rebuild(self, input_shapes: dict, *, progress=None) -> "CpuModel":
        """The same ONNX model built for other input shapes (from the source it keeps)."""
        if self.source is None or self.origin.get("from", "onnx") != "onnx":
            raise ArtifactError("this model was not built from an ONNX model it keeps; build "
                                "the ONNX model with CpuModel.build(path, input_shapes)")
        model = CpuModel.build(self.source, input_shapes, progress=progress)
        model.source_path = self.source_path
        return model

    @classmethod
    def from_graph(cls, graph, *, progress=None, source: bytes | None = None) -> "CpuModel":
        """Lower and compile a graph: an optimized float graph or a quantized one
        (``quantize_model``/``quantize_graph``), whose integer operators become kernels that
        agree with graph_numpy bit for bit; operators without a kernel run as numpy steps.
        ``source``: the ONNX model's bytes, kept in the .cel (``--compare onnxruntime``)."""
        from ..compiler.cpu.lowering import compile_program, lower_graph
        from ..compiler.graph.qops import QUANTIZED_KERNELS

        start = time.perf_counter()
        program = lower_graph(graph)
        lowered = time.perf_counter()
        stats = compile_program(program, progress=progress)
        info = {"nodes": len(graph.nodes), "steps": len(program.steps),
                "kernels": stats["kernels"], "kernels_cached": stats["cached"],
                "lower_s": lowered - start, "compile_s": stats["seconds"],
                "total_s": time.perf_counter() - start}
        origin = {"from": "graph",
                  "quantized": any(n.op in QUANTIZED_KERNELS for n in graph.nodes)}
        return cls(program, source=source, build_info=info, origin=origin)

    @classmethod
    def open(cls, path, input_shapes: dict | None = None, *, progress=None, max_builds=None):
        """A .cel file loaded, or an ONNX file built; an ONNX file whose dynamic inputs are
        not all given shapes is a DynamicCpuModel (a build per input shape, up to
        ``max_builds``, made when a run brings that shape)."""
        if is_artifact(path):
            model = cls.load(path)
            types = model.input_types
            if any(tuple(s) != types.get(n, (None, None))[1]
                   for n, s in (input_shapes or {}).items()):
                how = (f"build it for these: `celosia compile {_q(path)} "
                       f"{_flags(input_shapes)} -o {_q(path)}`" if model.source is not None and
                       model.origin.get("from", "onnx") == "onnx"
                       else "compile the ONNX model with --input-shape instead")
                built = ", ".join(f"{n}: {d}[{','.join(map(str, s))}]"
                                  for n, (d, s) in types.items())
                raise ArtifactError(f"{path} was built for other input shapes ({built}); "
                                    f"{how}")
            return model
        from ..compiler.frontend.inputs import is_dynamic
        from ..compiler.frontend.onnx import declared_inputs

        declared = declared_inputs(path)
        if all(n in (input_shapes or {}) or not is_dynamic(d) for n, (_, d) in declared.items()):
            return cls.build(path, input_shapes, progress=progress)
        from .specialize import DynamicCpuModel

        return DynamicCpuModel(path, declared, input_shapes, build=cls.build,
                               source=_model_bytes(path), progress=progress,
                               **({} if max_builds is None else {"max_builds": max_builds}))

    def save(self, path) -> None:
        """Write a .cel file (see the module docstring)."""
        from ..compiler.cpu.host import host_target

        p = self.program
        constants = {name: f"constants/{n}.npy" for n, name in enumerate(p.constants)}
        manifest = {
            "format": FORMAT, "version": VERSION, "target": host_target().__dict__,
            "origin": self.origin,
            "program": {"name": p.name, "inputs": p.inputs, "outputs": p.outputs,
                        "values": p.values, "steps": _encode(p.steps), "specs": p.specs},
            "kernels": {key: k.record() for key, k in p.kernels.items()},
            "constants": constants, "build": self.build_info,
        }
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
            z.writestr("manifest.json", json.dumps(manifest))
            for name, member in constants.items():
                buf = io.BytesIO()
                np.save(buf, p.constants[name], allow_pickle=False)
                z.writestr(member, buf.getvalue())
            for key, k in p.kernels.items():
                z.writestr(f"kernels/{key}.o", k.obj)
            if self.source is not None:
                z.writestr("model.onnx", self.source)
        tmp.replace(path)

    @classmethod
    def load(cls, path) -> "CpuModel":
        """Load a .cel file: its kernels come from their object code, nothing compiles."""
        from celosia.errors import CompilerError

        from ..compiler.cpu.codegen import CpuKernel
        from ..compiler.cpu.host import host_target
        from ..compiler.cpu.lowering import CpuProgram

        path = Path(path)
        if not path.exists():
            raise ArtifactError(f"{path}: no such file")
        try:
            with zipfile.ZipFile(path) as z:
                manifest = json.loads(z.read("manifest.json"))
                if manifest.get("format") != FORMAT:
                    raise ArtifactError(f"{path}: not a celosia CPU model (format "
                                        f"{manifest.get('format')!r})")
                origin = manifest.get("origin", {"from": "onnx", "quantized": False})
                if manifest.get("version") not in _READS:
                    how = ("CpuModel.from_graph" if origin.get("from") == "graph"
                           else "`celosia compile`")
                    raise ArtifactError(f"{path}: format version {manifest.get('version')}, "
                                        f"this celosia reads versions "
                                        f"{', '.join(map(str, _READS))}; build it again "
                                        f"with {how}")
                target = host_target().__dict__
                if manifest["target"] != target:
                    raise ArtifactError(f"{path}: built for {manifest['target'].get('cpu')} "
                                        f"({manifest['target'].get('triple')}), this machine is "
                                        f"{target['cpu']}; build it again here")
                prog = manifest["program"]
                constants = {name: np.load(io.BytesIO(z.read(member)), allow_pickle=False)
                             for name, member in manifest["constants"].items()}
                kernels = {key: CpuKernel.from_record(rec, z.read(f"kernels/{key}.o"))
                           for key, rec in manifest["kernels"].items()}
                source = z.read("model.onnx") if "model.onnx" in z.namelist() else None
        except ArtifactError:
            raise
        except CompilerError as e:
            raise ArtifactError(f"{path}: {e}") from None
        except (zipfile.BadZipFile, zlib.error, KeyError, ValueError, EOFError, OSError,
                TypeError, AttributeError) as e:
            raise ArtifactError(f"{path}: not a complete celosia model (truncated or corrupt: "
                                f"{e}); build it again with `celosia compile`") from None
        program = CpuProgram(prog["name"], prog["inputs"], prog["outputs"], prog["values"],
                             constants, _decode(prog["steps"]), prog["specs"], kernels)
        model = cls(program, source=source, build_info=manifest.get("build", {}), origin=origin)
        model.path = str(path)
        return model

    # ---- running -----------------------------------------------------------------------------

    @property
    def executor(self):
        if self._executor is None:
            from .executor import GraphExecutor
            self._executor = GraphExecutor(self.program)
        return self._executor

    @property
    def input_types(self) -> dict:
        """{input name: (dtype, shape)}."""
        v = self.program.values
        return {n: (v[n]["dtype"], tuple(v[n]["shape"])) for n in self.program.inputs}

    def run(self, feeds: dict, *, profile: bool = False, progress=None) -> dict:
        """{output name: array}; with ``profile`` (or ``progress``) per-node times go to
        ``self.profile``. A missing, unknown or mistyped input raises InputShapeError, with
        what to pass or the command that rebuilds the model for that shape."""
        self.check_shapes(feeds)
        return self.executor.run(feeds, profile=profile, progress=progress)

    def check_shapes(self, feeds: dict) -> None:
        """An InputShapeError for arrays of another shape or dtype than the build takes:
        what to pass (another dtype, or the size a fixed dim has), or, when only dims the
        model declares dynamic differ, the command that rebuilds it for those arrays."""
        from ..compiler.frontend.inputs import dims_str, is_dynamic, shape_problem
        from ..compiler.graph.ir import InputShapeError, TensorType
        from ..compiler.graph.reference import fits

        declared = self.origin.get("inputs")
        wrong = {n: feeds[n] for n, (dtype, shape) in self.input_types.items()
                 if isinstance(feeds.get(n), np.ndarray) and (
                     not fits(feeds[n].shape, TensorType(dtype, shape))
                     or str(feeds[n].dtype) != dtype)}
        for name, a in wrong.items():  # absent or not arrays: the executor's check says so
            dtype, shape = self.input_types[name]
            built = f"{self.path} was" if self.path else "the model was"
            text = (f"input {name!r} is {a.dtype}{dims_str(a.shape)} but {built} built for "
                    f"{dtype}{dims_str(shape)}")
            if str(a.dtype) != dtype:
                raise InputShapeError(f"{text}: pass a {dtype} array (numpy: "
                                      f"a.astype('{dtype}'))")
            if declared is None or name not in declared:  # no record (from_graph, version 1)
                raise InputShapeError(f"{text}: pass an array of shape {dims_str(shape)}")
            if shape_problem(name, declared[name], a.shape):
                raise InputShapeError(f"{text}, where the ONNX model fixes the sizes that "
                                      f"differ ({dims_str(declared[name])}): pass an array "
                                      f"of shape {dims_str(shape)}")
        if wrong:
            shapes = {n: tuple(wrong[n].shape) if n in wrong else s
                      for n, (_, s) in self.input_types.items() if is_dynamic(declared.get(n))}
            listed = "; ".join(f"{n!r} is {dims_str(a.shape)}, built for "
                               f"{dims_str(self.input_types[n][1])}, declared "
                               f"{dims_str(declared[n])}" for n, a in wrong.items())
            raise InputShapeError(f"{self.path or 'the model'} was built for other sizes of "
                                  f"dynamic dims ({listed}); rebuild it for these arrays: "
                                  f"{self._rebuild_command(shapes)}")

    def _rebuild_command(self, shapes: dict) -> str:
        flags = _flags(shapes)
        python = "model.rebuild({" + ", ".join(f"{n!r}: {tuple(s)!r}" for n, s in
                                               shapes.items()) + "})"
        if self.path and self.source is not None:
            return f"`celosia compile {_q(self.path)} {flags} -o {_q(self.path)}` (Python: " \
                   f"{python})"
        if self.source_path:
            out = Path(self.source_path).with_suffix(".cel")
            return f"`celosia compile {_q(self.source_path)} {flags} -o {_q(out)}` (Python: " \
                   f"{python})"
        return python

    @property
    def profile(self) -> list[dict]:
        return self.executor.last_profile

    def report(self) -> dict:
        """The last profiled run: per-node rows and a summary (with memory figures)."""
        from .executor import summarize_profile

        ex = self.executor
        summary = summarize_profile(ex.last_profile)
        summary.update({"arena_bytes": ex.arena_bytes, "unshared_bytes": ex.unshared_bytes,
                        "kernels": len(self.program.kernels),
                        "kernel_steps": self.program.kernel_steps()})
        return {"model": self.program.name, "target": "cpu", "origin": self.origin,
                "nodes": ex.last_profile, "summary": summary, "build": self.build_info}


def _model_bytes(model) -> bytes | None:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, Path)):
        return Path(model).read_bytes()
    serialize = getattr(model, "SerializeToString", None)
    return serialize() if serialize else None


def _q(path) -> str:
    """A path as a shell word (a command in a message must work when pasted)."""
    return shlex.quote(str(path))


def _flags(shapes: dict) -> str:
    from ..compiler.frontend.inputs import shape_flags

    return shape_flags(shapes)
