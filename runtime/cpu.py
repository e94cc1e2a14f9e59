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

A ``.cel`` file is a zip archive written and read by runtime/artifact.py (digests of every
member, checked before use):

    manifest.json        format "celosia-cpu", version 3, host CPU, origin, the program
                         (values, steps), kernel records, build info, member digests
    manifest.sha256      the digest of manifest.json
    constants/N.npy      packed weights and other constants
    kernels/KEY.o        object code per kernel, KEY = the hash of its spec and compiler
    model.onnx           the source model, when there is one (for --compare and rebuilding)

``origin`` says what the model was built from: ``{"from": "onnx" | "graph", "quantized":
bool}`` (a graph with graph_int's integer operators); a build from ONNX also records
``"inputs"``, each input's dims as the model declares them (ints fixed, strings dynamic:
frontend/inputs.py), so an input of another size is told whether a rebuild can take it and
the command that does. Loading checks the format, the version (older files say to
rebuild), the CPU, every manifest field (runtime/schema.py), every member's digest and each
object file's structure (runtime/elf.py) before LLVM sees it; anything wrong is one
``ArtifactError`` naming the file and the member or field.

An ONNX model with dynamic input dims and no shapes given opens (``CpuModel.open``) as a
:class:`~celosia.runtime.specialize.DynamicCpuModel`: a build per input shape, made from the
arrays of the first run of that shape; saved, it is one .cel holding the model and its
builds (format ``celosia-cpu-dynamic``), which ``CpuModel.open`` loads as one again.
"""

from __future__ import annotations

import io
import shlex
import time
from pathlib import Path

import numpy as np

from .artifact import Artifact, ArtifactError, artifact_format, is_artifact, write_artifact
from .schema import build_info, check_cpu
from .schema import encode as _encode

__all__ = ["CpuModel", "ArtifactError", "FORMAT", "VERSION", "is_artifact"]

FORMAT = "celosia-cpu"
VERSION = 3  # 3: member digests and a checked manifest; 2 added "origin"


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
        """Import (a path, bytes or onnx.ModelProto), optimize, lower and compile. A QDQ
        model (QuantizeLinear/DequantizeLinear nodes, ``is_qdq``) goes through ``from_qdq``
        first, so its int8 layers run on the int8 kernels (``build_info["qdq"]`` counts
        the integer operators and the float ones left)."""
        from ..compiler.frontend.onnx import declared_inputs, import_onnx
        from ..compiler.graph.passes import optimize
        from ..compiler.graph.quantize import from_qdq, is_qdq

        start = time.perf_counter()
        graph = import_onnx(model, input_shapes)
        qdq = is_qdq(graph)
        graph = optimize(from_qdq(graph) if qdq else graph)
        imported = time.perf_counter()
        if qdq:
            qdq = _qdq_summary(graph)
            if progress is not None:
                progress(f"QDQ model: {qdq['integer']} integer operators, {qdq['float']} "
                         "float ones left (from_qdq)")
        built = cls.from_graph(graph, progress=progress, source=_model_bytes(model))
        if qdq:
            built.build_info["qdq"] = qdq
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
    def from_graph(cls, graph, *, progress=None, source: bytes | None = None,
                   int8_form: str | None = None) -> "CpuModel":
        """Lower and compile a graph: an optimized float graph or a quantized one
        (``quantize_model``/``quantize_graph``), whose integer operators become kernels that
        agree with graph_numpy bit for bit; operators without a kernel run as numpy steps.
        ``source``: the ONNX model's bytes, kept in the .cel (``--compare onnxruntime``).
        ``int8_form``: the int8 dot-product instructions of QConv/QGemm (compiler/cpu/
        int8_forms.py: "auto" by default, the host's best; "vnni512", "vnni256", "avx2";
        "none" for the float-FMA kernels), recorded in ``build_info``."""
        from ..compiler.cpu.int8_forms import chosen_form
        from ..compiler.cpu.lowering import compile_program, lower_graph
        from ..compiler.graph.qops import QUANTIZED_KERNELS
        from ..compiler.graph.qrecurrent import Q_RECURRENT_KERNELS
        from ..compiler.graph.qwide import QWIDE_KERNELS

        start = time.perf_counter()
        program = lower_graph(graph, int8_form=int8_form)
        lowered = time.perf_counter()
        stats = compile_program(program, progress=progress)
        info = {"nodes": len(graph.nodes), "steps": len(program.steps),
                "kernels": stats["kernels"], "kernels_cached": stats["cached"],
                "lower_s": lowered - start, "compile_s": stats["seconds"],
                "total_s": time.perf_counter() - start,
                "int8_form": chosen_form(int8_form) or "none"}
        if program.control:  # the path each If/Loop/Scan took (compiled bodies or numpy)
            info["control_flow"] = program.control
        origin = {"from": "graph",
                  "quantized": any(n.op in QUANTIZED_KERNELS or n.op in Q_RECURRENT_KERNELS
                                    or n.op in QWIDE_KERNELS for n in graph.nodes)}
        return cls(program, source=source, build_info=info, origin=origin)

    @classmethod
    def open(cls, path, input_shapes: dict | None = None, *, progress=None, max_builds=None):
        """A .cel file loaded, or an ONNX file built; an ONNX file whose dynamic inputs are
        not all given shapes is a DynamicCpuModel (a build per input shape, up to
        ``max_builds``, made when a run brings that shape)."""
        if is_artifact(path):
            from .specialize import FORMAT as DYNAMIC, DynamicCpuModel

            if artifact_format(path) == DYNAMIC:  # a saved DynamicCpuModel
                return DynamicCpuModel.load(path, input_shapes, build=cls.build, load=cls.load,
                                            progress=progress, max_builds=max_builds)
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
        write_artifact(path, *self._artifact())

    def to_bytes(self) -> bytes:
        """The .cel file's bytes (an accelerator build keeps its CPU parts so)."""
        return write_artifact(None, *self._artifact())

    def _artifact(self) -> tuple[dict, dict]:
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
        members = {member: npy_bytes(p.constants[name]) for name, member in constants.items()}
        members.update({f"kernels/{key}.o": k.obj for key, k in p.kernels.items()})
        if self.source is not None:
            members["model.onnx"] = self.source
        return manifest, members

    @classmethod
    def load(cls, source, where: str | None = None) -> "CpuModel":
        """Load a .cel file (a path, or its bytes with ``where`` naming them in errors):
        its kernels come from their object code, nothing compiles."""
        with Artifact(source, where) as a:
            a.manifest(FORMAT, VERSION)
            _check_target(a)
            origin, constants, build = a.check(_check_head)
            arrays = {name: a.npy(member) for name, member in constants.items()}
            checked = a.check(check_cpu, {k: (str(v.dtype), v.shape) for k, v in arrays.items()})
            kernels = {key: _load_kernel(a, key, rec) for key, rec in checked["kernels"].items()}
            source_bytes = a.read("model.onnx") if a.has("model.onnx") else None
        from ..compiler.cpu.lowering import CpuProgram

        prog = checked["program"]
        program = CpuProgram(prog["name"], prog["inputs"], prog["outputs"], prog["values"],
                             arrays, prog["steps"], prog["specs"], kernels)
        model = cls(program, source=source_bytes, build_info=build, origin=origin)
        model.path = str(source) if isinstance(source, (str, Path)) else where
        return model

    # ---- running -----------------------------------------------------------------------------

    @property
    def executor(self):
        if self._executor is None:
            from . import control  # noqa: F401 - runs "control" steps (If/Loop/Scan bodies)
            from .executor import GraphExecutor
            self._executor = GraphExecutor(self.program)
        return self._executor

    @property
    def input_types(self) -> dict:
        """{input name: (dtype, shape)}."""
        v = self.program.values
        return {n: (v[n]["dtype"], tuple(v[n]["shape"])) for n in self.program.inputs}

    def run(self, feeds: dict, *, profile: bool = False, progress=None,
            out: dict | None = None) -> dict:
        """{output name: array}; with ``profile`` (or ``progress``) per-node times go to
        ``self.profile``. A missing, unknown or mistyped input raises InputShapeError, with
        what to pass or the command that rebuilds the model for that shape. ``out``: numpy
        arrays (of the outputs' dtypes and shapes) some outputs are copied into and
        returned in, instead of fresh arrays (GraphExecutor.run)."""
        ex = self.executor
        if not ex.feeds_match(feeds):  # the common case costs a microsecond, not fifteen
            if any(not isinstance(a, np.ndarray) and hasattr(a, "__dlpack__")
                   for a in feeds.values()):
                return self.run_dlpack(feeds, out, profile=profile, progress=progress)
            self.check_shapes(feeds)
        return ex.run(feeds, profile=profile, progress=progress, out=out)

    def run_dlpack(self, feeds: dict, out: dict | None = None, **kw) -> dict:
        """``run`` on any DLPack tensors (numpy, PyTorch, ...): inputs the kernels read
        directly are read in the caller's memory, and outputs given in ``out`` (writable
        tensors of the output's dtype and shape) are written there, straight from the
        kernels where they can be; the returned arrays are views of those buffers
        (runtime/dlpack.py). ``self.zero_copy.last`` names what was bound directly."""
        from .dlpack import ZeroCopy, as_array

        if getattr(self, "_zero_copy", None) is None or self._zero_copy.ex is not self.executor:
            self._zero_copy = ZeroCopy(self.executor)
        arrays = {n: as_array(a, f"input {n!r}") for n, a in feeds.items()}
        if not self.executor.feeds_match(arrays):
            self.check_shapes(arrays)
        return self._zero_copy.run(arrays, out, **kw)

    @property
    def zero_copy(self):
        """The DLPack binder of the last ``run_dlpack`` (None before one)."""
        return getattr(self, "_zero_copy", None)

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


def _check_target(a: Artifact) -> None:
    """Object code runs only on the CPU it was made for: say so before reading it."""
    from ..compiler.cpu.host import host_target

    target = host_target().__dict__
    built = a.check(lambda root: root["target"].obj())
    if built != target:
        cpu = built.get("cpu") if isinstance(built.get("cpu"), str) else "another CPU"
        raise ArtifactError(f"{a.where}: built for {cpu} ({built.get('triple')}) with other "
                            f"features, this machine is {target['cpu']} "
                            f"({target['triple']}); build it again here with `celosia "
                            f"compile`")


def _check_head(root) -> tuple[dict, dict, dict]:
    """(origin, {constant: member}, build info)."""
    origin = root["origin"]
    checked = {"from": origin["from"].string(("onnx", "graph")),
               "quantized": origin["quantized"].boolean()}
    if origin.get("inputs") is not None:  # each input's dims as the ONNX model declares them
        checked["inputs"] = {name: None if f.value is None else
                             [d.value if isinstance(d.value, str) else d.integer()
                              for d in f.list()]
                             for name, f in origin["inputs"].items()}
    constants = {name: f.string() for name, f in root["constants"].items()}
    return checked, constants, build_info(root)


def _load_kernel(a: Artifact, key: str, rec: dict):
    """A kernel from its verified, structurally checked object code."""
    from celosia.errors import CompilerError

    from ..compiler.cpu.codegen import CpuKernel
    from ..compiler.cpu.host import host_target
    from .elf import ElfError, check_object, elf_machine

    member = f"kernels/{key}.o"
    obj = a.read(member)
    machine = elf_machine(host_target().triple)
    if machine is not None:  # other object formats: the digest alone vouches for them
        try:
            check_object(obj, machine, [s for s, _ in rec["segments"]], _resolvable())
        except ElfError as e:
            raise a.error(str(e), member) from None
    try:
        return CpuKernel.from_record(rec, obj)
    except CompilerError as e:  # says what to do itself (build it again here)
        raise ArtifactError(f"{a.where}: {member}: {e}") from None


def _resolvable():
    """Whether MCJIT will find a symbol in this process. It searches what
    LoadLibraryPermanently(nullptr) registered, which creating an engine does, and llvmlite
    offers no other way to do: so one empty engine is made first (once), else symbols
    such as memset and expf would look unresolvable before the first kernel loads."""
    from ..compiler.cpu.host import llvm_binding, target_machine

    llvm = llvm_binding()
    if not _RESOLVER:
        _RESOLVER.append(llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine()))
    return lambda name: llvm.address_of_symbol(name) is not None


_RESOLVER: list = []  # the engine that registered the process's symbols with LLVM


def npy_bytes(a: np.ndarray) -> bytes:
    """An array as .npy bytes (C order, no pickles)."""
    buf = io.BytesIO()
    a = np.asarray(a)  # (ascontiguousarray would make a scalar 1-D: keep its shape)
    np.save(buf, a if a.flags.c_contiguous else a.copy(order="C"), allow_pickle=False)
    return buf.getvalue()


def _qdq_summary(graph) -> dict:
    """How much of a QDQ model ``from_qdq`` made integer: the integer operators by kind, the
    compute operators left float (their ``float_reason`` says why) and the conversions."""
    from ..compiler.graph.qops import QUANTIZED_KERNELS

    ops: dict = {}
    for n in graph.nodes:
        if n.op in QUANTIZED_KERNELS and n.op not in ("Quantize", "Dequantize"):
            ops[n.op] = ops.get(n.op, 0) + 1
    left = [n for n in graph.nodes if "float_reason" in n.attrs]
    return {"integer": sum(ops.values()), "integer_ops": ops, "float": len(left),
            "float_ops": sorted({n.op for n in left}),
            "conversions": sum(n.op in ("Quantize", "Dequantize", "QuantizeLinear",
                                        "DequantizeLinear") for n in graph.nodes)}


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
