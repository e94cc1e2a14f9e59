"""The CPU backend: a loop-IR function compiled by LLVM (llvmlite) for the host CPU.

    kernel = compile_cpu(lower(s, [A, W, C]))
    kernel(a, w, c)          # numpy arrays, checked against the parameters; c is written

``llvm_emit`` turns the function into LLVM IR (one exported function per top-level
segment, see there); here the IR is optimised at O3 for the host CPU's name and features
(so LLVM uses its vector units), compiled to object code, cached on disk, and loaded into an
MCJIT engine. A parallel segment's iterations are split into chunks run by a thread pool:
calls through ctypes release the GIL, so the chunks run on all cores at once.

The cache key is the SHA-256 of the LLVM IR text, the CPU name and features and the
llvmlite and LLVM versions; the object file lives under $CELOSIA_CACHE/llvm (default
~/.cache/celosia/llvm). A warm cache skips optimisation and code generation.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from celosia.errors import CompilerError

from ..tensor.tir import ACCEL_CALLS, Allocate, Buffer, Evaluate, Kernel, PrimFunc, Store, verify, walk
from .emit import emit_module, split_segments
from .host import cache_dir, host_target, llvm_binding, num_threads, target_machine
from .threads import native_pool

__all__ = ["compile_cpu", "CpuKernel", "SavedSegment"]

_NP_DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
              "uint8": np.uint8, "float32": np.float32, "bool": np.bool_}
_SEGMENT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_lock = threading.Lock()
_state: dict = {}


def _pool() -> ThreadPoolExecutor:
    with _lock:
        if "pool" not in _state:
            _state["pool"] = ThreadPoolExecutor(max_workers=max(1, num_threads() - 1),
                                                thread_name_prefix="celosia-cpu")
        return _state["pool"]


def _compile_object(llvm_ir: str) -> bytes:
    """Optimise at O3 for the host CPU and generate its object code."""
    llvm = llvm_binding()
    tm = target_machine()
    module = llvm.parse_assembly(llvm_ir)
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    module.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = True
    tuning.loop_unrolling = True
    builder = llvm.create_pass_builder(tm, tuning)
    builder.getModulePassManager().run(module, builder)
    return tm.emit_object(module)


def _cache_key(llvm_ir: str) -> str:
    import llvmlite
    llvm, target = llvm_binding(), host_target()
    h = hashlib.sha256()
    for part in (llvm_ir, target.triple, target.cpu, target.features, llvmlite.__version__,
                 ".".join(map(str, llvm.llvm_version_info))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _load_or_compile(llvm_ir: str, use_cache: bool) -> tuple[bytes, Path | None, bool]:
    """(object code, its cache file, whether it came from the cache)."""
    if not use_cache:
        return _compile_object(llvm_ir), None, False
    path = cache_dir() / f"{_cache_key(llvm_ir)}.o"
    try:
        return path.read_bytes(), path, True
    except FileNotFoundError:
        pass
    obj = _compile_object(llvm_ir)
    try:  # written under a temporary name, then renamed: concurrent builds never see half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(obj)
        os.replace(tmp, path)
    except OSError:
        path = None  # a read-only cache only costs time
    return obj, path, False


@dataclass(frozen=True)
class SavedSegment:
    """A segment of a loaded kernel: its symbol and its parallel loop's extent (None: serial)."""

    symbol: str
    extent: int | None


def _segment_extent(segment) -> int | None:
    if isinstance(segment, SavedSegment):
        return segment.extent
    return None if segment.loop is None else segment.loop.extent


class CpuKernel:
    """A compiled loop-IR function; call it with one numpy array per parameter.

    ``record()`` describes it as plain data (parameters, temporaries, segments) and
    ``CpuKernel.from_record(record, obj)`` loads it again from that and its object code,
    without the loop IR and without compiling (how a saved model's kernels come back)."""

    def __init__(self, func: PrimFunc | None, llvm_ir: str | None, obj: bytes,
                 temps: list[Buffer], segments: list, cache_path: Path | None,
                 from_cache: bool, compile_seconds: float, *, name: str | None = None,
                 params: list[Buffer] | None = None, written: list[int] | None = None):
        llvm = llvm_binding()
        self.func, self.llvm_ir, self.temps, self.segments = func, llvm_ir, temps, segments
        self.obj = obj
        self.params = list(func.params) if func is not None else list(params)
        if func is not None:
            stored = {n.buffer.name for n in walk(func.body) if isinstance(n, Store)}
            written = [i for i, b in enumerate(self.params) if b.name in stored]
        # Parameters the kernel writes: only they must not overlap another argument (the
        # noalias parameters of llvm_emit allow read-only arguments to share memory).
        self.written = tuple(written if written is not None else range(len(self.params)))
        self._name = func.name if func is not None else name
        self.cache_path, self.from_cache, self.compile_seconds = cache_path, from_cache, compile_seconds
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine())
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self._engine.finalize_object()
        self._fns = [_SEGMENT_FN(self._engine.get_function_address(s.symbol)) for s in segments]
        self._extents = [_segment_extent(s) for s in segments]
        self._fn_table = (ctypes.c_void_p * len(segments))(
            *(self._engine.get_function_address(s.symbol) for s in segments))
        self._extent_table = (ctypes.c_int64 * len(segments))(
            *(-1 if e is None else e for e in self._extents))
        self._spare_temps: list = []

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        params = ", ".join(f"{b.name}: {b.dtype}[{', '.join(map(str, b.shape))}]"
                           for b in self.params)
        return f"CpuKernel({self.name}({params}), {len(self.segments)} segments)"

    def record(self) -> dict:
        """The kernel as JSON-able data; with ``self.obj`` it is all ``from_record`` needs."""
        def bufs(bs):
            return [[b.name, list(b.shape), b.dtype] for b in bs]
        return {"name": self.name, "params": bufs(self.params), "temps": bufs(self.temps),
                "written": list(self.written),
                "segments": [[s.symbol, e] for s, e in zip(self.segments, self._extents)],
                "target": host_target().__dict__}

    @classmethod
    def from_record(cls, record: dict, obj: bytes) -> "CpuKernel":
        """Load a kernel saved with ``record()`` and its object code; the object code must
        have been made for this CPU (CompilerError otherwise)."""
        target = host_target()
        if record.get("target") != target.__dict__:
            saved = record.get("target", {})
            raise CompilerError(f"kernel {record.get('name')!r} was compiled for "
                                f"{saved.get('cpu', '?')} ({saved.get('triple', '?')}), this "
                                f"machine is {target.cpu} ({target.triple}): build it again here")

        def bufs(rows):
            return [Buffer(n, tuple(shape), dtype) for n, shape, dtype in rows]
        segments = [SavedSegment(symbol, extent) for symbol, extent in record["segments"]]
        return cls(None, None, obj, bufs(record["temps"]), segments, None, True, 0.0,
                   name=record["name"], params=bufs(record["params"]),
                   written=record.get("written"))

    def check_args(self, arrays) -> None:
        """Raise CompilerError unless ``arrays`` match the parameters one to one."""
        params, fname = self.params, self.name
        if len(arrays) != len(params):
            names = ", ".join(b.name for b in params)
            raise CompilerError(f"{fname} takes {len(params)} arrays ({names}), given "
                                f"{len(arrays)}")
        for i, (a, buf) in enumerate(zip(arrays, params)):
            where = f"{fname}: argument {i} ({buf.name})"
            if not isinstance(a, np.ndarray):
                raise CompilerError(f"{where} must be a numpy array, not {type(a).__name__}")
            if a.dtype != _NP_DTYPES[buf.dtype]:
                raise CompilerError(f"{where} must be {buf.dtype}, not {a.dtype}; convert it "
                                    f"with .astype(np.{buf.dtype})")
            if a.shape != tuple(buf.shape):
                raise CompilerError(f"{where} must have shape {tuple(buf.shape)}, not {a.shape}")
            if not a.flags.c_contiguous:
                raise CompilerError(f"{where} must be C-contiguous; pass "
                                    f"np.ascontiguousarray(...)")
        for i in self.written:
            for j in range(len(arrays)):
                if j != i and np.may_share_memory(arrays[i], arrays[j]):
                    raise CompilerError(
                        f"{fname}: argument {i} ({params[i].name}), which the kernel writes, "
                        f"shares memory with argument {j} ({params[j].name}); pass distinct "
                        f"arrays")

    def __call__(self, *arrays: np.ndarray) -> None:
        self.check_args(arrays)
        with _lock:
            temps = self._spare_temps.pop() if self._spare_temps else self._new_temps()
        try:
            ptrs = (ctypes.c_void_p * (len(arrays) + len(temps)))(
                *(a.ctypes.data for a in list(arrays) + temps))
            self._run_all(ptrs)
        finally:
            with _lock:
                self._spare_temps.append(temps)

    def bind(self, *arrays: np.ndarray, serial: bool = False):
        """Check ``arrays`` once and return a function of no arguments that runs the kernel
        on them (with temporaries of its own): for a caller that calls the kernel many times
        on the same memory, like a graph executor with planned buffers. The arrays must stay
        alive and in place while the function is used. ``serial``: on the calling thread
        only (a small kernel in a loop body, where waking the pool costs more than it
        saves)."""
        self.check_args(arrays)
        temps = self._new_temps()
        ptrs = (ctypes.c_void_p * (len(arrays) + len(temps)))(
            *(a.ctypes.data for a in list(arrays) + temps))
        if serial:
            parts = [(fn, extent or 0) for fn, extent in zip(self._fns, self._extents)]
            if len(parts) == 1:  # one C call, no Python frame around it
                ptrs._keep = (arrays, temps)  # (the memory stays alive with the pointers)
                return functools.partial(parts[0][0], ptrs, 0, parts[0][1])

            def bound_serial(_keep=(arrays, temps), _ptrs=ptrs) -> None:
                for fn, extent in parts:
                    fn(_ptrs, 0, extent)
            return bound_serial

        def bound(_keep=(arrays, temps), _ptrs=ptrs) -> None:  # _keep: the memory stays alive
            self._run_all(_ptrs)
        return bound

    def _new_temps(self) -> list:
        return [np.empty(b.shape, _NP_DTYPES[b.dtype]) for b in self.temps]

    def _run_all(self, ptrs) -> None:
        threads = num_threads()
        if threads == 1:
            for fn, extent in zip(self._fns, self._extents):
                fn(ptrs, 0, extent or 0)
            return
        pool = native_pool(threads)
        if pool is not None and pool.workers == threads - 1:
            pool.run_kernel(len(self._fns), self._fn_table, self._extent_table, ptrs)
            return
        # Python threads: when the native pool cannot start, or the thread count changed.
        for fn, extent in zip(self._fns, self._extents):
            if extent is None:
                fn(ptrs, 0, 0)
                continue
            chunks = min(extent, num_threads())
            if chunks == 1:
                fn(ptrs, 0, extent)
                continue
            bounds = [extent * c // chunks for c in range(chunks + 1)]
            futures = [_pool().submit(fn, ptrs, bounds[c], bounds[c + 1])
                       for c in range(1, chunks)]
            fn(ptrs, bounds[0], bounds[1])  # the calling thread takes the first chunk
            for fut in futures:
                fut.result()

    def assembly(self) -> str:
        """The optimised machine code as assembly text (for inspection; compiles again)."""
        llvm = llvm_binding()
        tm = target_machine()
        if self.llvm_ir is None:
            raise CompilerError(f"{self.name} was loaded from object code; its IR is not kept")
        module = llvm.parse_assembly(self.llvm_ir)
        module.triple, module.data_layout = tm.triple, str(tm.target_data)
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        builder = llvm.create_pass_builder(tm, tuning)
        builder.getModulePassManager().run(module, builder)
        return tm.emit_assembly(module)


def compile_cpu(func: PrimFunc, *, use_cache: bool = True) -> CpuKernel:
    """Compile a lowered function for the host CPU (see the module docstring)."""
    if not isinstance(func, PrimFunc):
        raise CompilerError(f"compile_cpu takes a tir.PrimFunc (from lower()), not "
                            f"{type(func).__name__}")
    verify(func)
    for node in walk(func.body):
        if isinstance(node, Kernel) or (isinstance(node, Evaluate) and node.call.name in ACCEL_CALLS):
            raise CompilerError(f"{func.name}: the CPU backend runs plain loops; this function "
                                f"holds accelerator operations (lower it without the "
                                f"accelerator pipeline)")
    for buf in [*func.params, *(n.buffer for n in walk(func.body) if isinstance(n, Allocate))]:
        if buf.dtype not in _NP_DTYPES:
            raise CompilerError(f"{func.name}: buffer {buf.name} is {buf.dtype}; the CPU "
                                f"backend takes {', '.join(_NP_DTYPES)} (convert "
                                f"float64/float16 data to float32)")
    start = time.perf_counter()
    temps, segments = split_segments(func)
    llvm_ir = emit_module(func, temps, segments)
    obj, path, hit = _load_or_compile(llvm_ir, use_cache)
    kernel = CpuKernel(func, llvm_ir, obj, temps, segments, path, hit, 0.0)
    kernel.compile_seconds = time.perf_counter() - start
    return kernel
