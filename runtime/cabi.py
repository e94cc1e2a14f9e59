"""A CPU build as a shared library with a C ABI over DLPack tensors (``celosia export``).

    paths = export_library(CpuModel.build("net.onnx"), "out", "net")
    # out/libnet.so, out/net.h, out/dlpack.h

    int celosia_run(const DLTensor *inputs, int num_inputs, DLTensor *outputs, int num_outputs);
    int celosia_num_inputs(void);  int celosia_num_outputs(void);
    const char *celosia_last_error(void);
    (+ celosia_model_name, celosia_{input,output}_{name,ndim,shape,dtype})

The library is the CPU build itself, with no Python at run time:

- each compiled kernel's object code (the LLVM O3 code ``CpuProgram.kernels`` holds, as the
  JIT runs it), its segment symbols renamed per library (``objcopy --redefine-sym``, then
  every other global symbol made local), so kernels of the same operator never collide;
- the program's sequencing as generated C: one block per step, the kernel's segments called
  on its buffers' addresses in the arena (the executor's memory plan, ``plan_memory``), the
  iterations of each parallel loop cut into chunks for a pool of worker threads (small
  kernels, under ``runner.SERIAL_WORK``, whole on the caller); views cost nothing; numpy
  steps that move data (Concat, Gather, Cast, Slice, Transpose, Split, Expand, reshaping
  copies) run as exact C copies, float32 numpy steps that compute (element-wise with
  broadcasting, reductions, Softmax) as C loops over libm (within float rounding of numpy);
- the constants (packed weights, biases) in one read-only blob (``.incbin`` in an assembly
  file), 64-byte aligned.

``cc`` (``$CC``, else Python's ``sysconfig`` CC, else ``cc``) compiles the C and assembly
and links everything (``-shared``, a version script exporting the API only, ``-Bsymbolic``).
The object code is for this machine's CPU (the same rule as a ``.cel``): build the library
on (or for) the machine that runs it.

Run-time checks: the counts, each tensor's dtype, ndim, shape, device (kDLCPU) and strides
(NULL or C-contiguous; a non-contiguous tensor is refused, not copied) and NULL pointers;
a failure returns nonzero and ``celosia_last_error()`` says what, which tensor, and what
was expected. Inputs are copied into the arena and outputs out of it (one copy each,
as ``GraphExecutor.run`` does by default), so inputs and outputs may share memory.

Threads: ``celosia_run`` may be called from any number of threads; the calls share one
arena and are serialised by a mutex. Inside a call the parallel loops run on the library's
worker threads ($CELOSIA_NUM_THREADS in all, else the CPUs the process may use), started at
the first call and joined when the library is unloaded. ``celosia_last_error`` is per
thread.

What it cannot take (a clear ``ExportError`` at export, naming the nodes): other numpy
steps, If/Loop/Scan, values whose size is known only at run time, and accelerator builds.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

from celosia.errors import CelosiaError

from ..compiler.cpu.runner import SERIAL_WORK, kernel_work
from .executor import ALIGN, _nbytes, plan_memory, run_time_shaped

__all__ = ["ExportError", "export_library", "export_model", "find_cc", "DLPACK_HEADER",
           "API", "Library", "DLTensor", "dltensor"]

DLPACK_HEADER = Path(__file__).with_name("dlpack.h")
API = ("celosia_run", "celosia_num_inputs", "celosia_num_outputs", "celosia_last_error",
       "celosia_model_name", "celosia_input_name", "celosia_output_name",
       "celosia_input_ndim", "celosia_output_ndim", "celosia_input_shape",
       "celosia_output_shape", "celosia_input_dtype", "celosia_output_dtype")
# numpy dtype -> (DLDataTypeCode, bits): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBool 6
DL_DTYPES = {"float32": (2, 32), "int8": (0, 8), "uint8": (1, 8), "int16": (0, 16),
             "int32": (0, 32), "int64": (0, 64), "bool": (6, 8)}


class ExportError(CelosiaError):
    """A model, option or tool ``celosia export`` cannot use: says what and what to do."""


# ---- tools -----------------------------------------------------------------------------------


def find_cc() -> list[str]:
    """The system C compiler as a command: $CC, else Python's configured CC, else ``cc``."""
    for spec, where in ((os.environ.get("CC"), "$CC"),
                        (sysconfig.get_config_var("CC"), "Python's sysconfig CC"),
                        ("cc", "cc")):
        if not spec:
            continue
        cmd = shlex.split(spec)
        if cmd and shutil.which(cmd[0]):
            return cmd
        if where == "$CC":
            raise ExportError(f"$CC is {spec!r}, which is not a program on PATH: set CC to a C "
                              f"compiler (gcc, clang) or unset it")
    raise ExportError("no C compiler found (tried $CC, Python's sysconfig CC and `cc`): "
                      "install one (e.g. `apt-get install gcc`) or set CC")


def _find_objcopy() -> str:
    for name in (os.environ.get("OBJCOPY"), "objcopy", "llvm-objcopy"):
        if name and shutil.which(name):
            return name
    raise ExportError("no objcopy found (tried $OBJCOPY, objcopy, llvm-objcopy): it renames "
                      "the kernels' symbols; install binutils (`apt-get install binutils`) or "
                      "LLVM, or set OBJCOPY")


def _run(cmd: list, what: str) -> None:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise ExportError(f"{what} failed ({shlex.join(map(str, cmd))}):\n"
                          f"{(r.stderr or r.stdout).strip()[-2000:]}")


# ---- what a library can hold -----------------------------------------------------------------


def _source_model(path, input_shapes=None, quantize=None, calibration=None,
                  calibration_method="mse"):
    """The CpuModel an ONNX file or a .cel stands for (an int8 build: the all-CPU build of
    the quantized graph)."""
    from .accel import AccelModel, is_accel_artifact
    from .cpu import CpuModel, is_artifact

    if is_artifact(path):
        if quantize or calibration:
            raise ExportError(f"{path} is a built model (.cel); --quantize/--calibration apply "
                              f"to an ONNX model")
        if is_accel_artifact(path):
            return _all_cpu(AccelModel.load(path), path)
        from .artifact import artifact_format
        from .specialize import FORMAT as DYNAMIC

        if artifact_format(path) == DYNAMIC:
            raise ExportError(f"{path} holds a model with dynamic inputs and a build per shape; "
                              f"a library has one: export the ONNX model with --input-shape")
        model = CpuModel.load(path)
        if input_shapes and any(tuple(s) != model.input_types[n][1]
                                for n, s in input_shapes.items() if n in model.input_types):
            raise ExportError(f"{path} was built for other input shapes; build the ONNX model "
                              f"with --input-shape (or `celosia compile` it again) first")
        return model
    if quantize:
        if quantize != "int8":
            raise ExportError(f"--quantize takes int8, not {quantize!r}")
        built = AccelModel.from_onnx(path, input_shapes=input_shapes, calibration=calibration,
                                     target="cpu", calibration_method=calibration_method)
        return _all_cpu(built, path)
    return CpuModel.build(path, input_shapes)


def _all_cpu(accel, where):
    """The one CpuModel of an all-CPU int8 build (``AccelModel.cpu_build``)."""
    graph = accel.graph
    if accel.programs or len(accel.segments) != 1 or \
            len(accel.segments[0][0]) != len(graph.nodes):
        raise ExportError(f"{where} is an accelerator build: a library holds CPU code only; "
                          f"build the model for the CPU (`celosia compile MODEL.onnx --target "
                          f"cpu --quantize int8 --calibration DATA.npz`, or export the ONNX "
                          f"model with --quantize int8)")
    cpu = accel.segments[0][1]
    p = cpu.program
    if list(p.inputs) != list(graph.inputs) or list(p.outputs) != list(graph.outputs):
        raise ExportError(f"{where}: the CPU segment's inputs/outputs ({p.inputs} -> "
                          f"{p.outputs}) are not the model's ({list(graph.inputs)} -> "
                          f"{list(graph.outputs)}); export the ONNX model instead")
    return cpu


class Unsupported(Exception):
    """A step the library cannot run (the message says why)."""


def unsupported_steps(program) -> list[str]:
    """Why each step the library cannot run is so ("node 'x' (Op): reason"); [] when all can."""
    why = []
    for c in program.control:
        why.append(f"node {c.get('node')!r} ({c.get('op')}): control flow whose bodies the "
                   f"CPU build runs from Python")
    coder = None
    for s in program.steps:
        where = f"node {s['node']!r} ({s['op']})"
        dynamic = [v for v in (*s["inputs"], *s["outputs"])
                   if v and v in program.values and run_time_shaped(program.values[v])]
        if dynamic:
            why.append(f"{where}: {dynamic[0]!r} has a size known only at run time; give the "
                       f"inputs static shapes (--input-shape) so every size is fixed")
            continue
        if s["kind"] in ("kernel", "view") or (s["kind"] == "control" and program.control):
            continue
        coder = coder or _StepCoder(program, _Plan(program))
        try:
            coder.code(s)
        except Unsupported as e:
            why.append(f"{where}: {e}")
    return why


# ---- generation ------------------------------------------------------------------------------


def _c_string(s: str) -> str:
    """``s`` as a C string literal (UTF-8; anything but plain ASCII letters, digits and a
    few punctuation marks as octal escapes)."""
    safe = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.@/:,()[]")
    return '"' + "".join(chr(b) if b in safe else f"\\{b:03o}" for b in s.encode()) + '"'


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class _Plan:
    """Where each value lives: ("A", offset) in the arena, ("C", offset) in the constants."""

    def __init__(self, program):
        self.p = program
        self.offsets, self.arena_bytes, _ = plan_memory(program)
        self.blob = bytearray()
        self.const_at: dict = {}
        self.view_of: dict = {}
        for s in program.steps:  # a view of a constant is that constant's memory
            if s["kind"] == "view" and s["inputs"][0] in program.constants:
                self.view_of[s["outputs"][0]] = s["inputs"][0]

    def constant(self, name: str) -> int:
        if name not in self.const_at:
            a = np.ascontiguousarray(self.p.constants[name])
            self.blob.extend(b"\0" * (_align(len(self.blob)) - len(self.blob)))
            self.const_at[name] = len(self.blob)
            self.blob.extend(a.tobytes())
        return self.const_at[name]

    def where(self, v: str) -> tuple[str, int]:
        v = self.view_of.get(v, v)
        if v in self.p.constants:
            return "C", self.constant(v)
        if v not in self.offsets:
            raise ExportError(f"value {v!r} has no place in the memory plan (an internal "
                              f"error; please report it)")
        return "A", self.offsets[v]

    def expr(self, v: str) -> str:
        base, off = self.where(v)
        return f"(void *)(A + {off})" if base == "A" else f"(void *)(C + {off})"


_C_TYPES = {"float32": "float", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t",
            "int32": "int32_t", "int64": "int64_t", "bool": "uint8_t"}
MAX_DIMS = 16
# Numpy steps the library runs, all exact data movement (no arithmetic): a strided copy of
# a view numpy would make (Slice, Transpose, Split, Expand), a memcpy (a reshaping copy),
# Concat, Gather and Cast. Everything else the CPU build runs in numpy is refused.
_COPY_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")


class _StepCoder:
    """The C code of a non-kernel step (Unsupported when there is none)."""

    def __init__(self, program, plan: "_Plan"):
        self.p, self.plan = program, plan

    def info(self, v: str) -> tuple[tuple, np.dtype]:
        if v in self.p.constants:
            a = self.p.constants[v]
            return tuple(a.shape), a.dtype
        i = self.p.values[v]
        return tuple(int(d) for d in i["shape"]), np.dtype(i["dtype"])

    def ptr(self, v: str) -> str:
        base, off = self.plan.where(v)
        return f"{base} + {off}"

    def out_ptr(self, v: str) -> str:
        base, off = self.plan.where(v)
        if base != "A":
            raise Unsupported(f"writes {v!r}, which is a constant")
        return f"A + {off}"

    def code(self, s: dict) -> str:
        kind, op = s["kind"], s["op"]
        outs = [o for o in s["outputs"] if o]
        ins = [v for v in s["inputs"] if v]
        if kind == "concat":
            return self.concat(ins, outs[0], 1)
        if kind != "numpy":
            raise Unsupported(f"a {kind!r} step")
        a = s.get("attrs", {})
        try:
            if op == "Concat":
                return self.concat(ins, outs[0], int(a["axis"]))
            if op == "Slice":
                index = [slice(None)] * len(self.info(ins[0])[0])
                for start, end, axis, step in zip(a["starts"], a["ends"], a["axes"], a["steps"]):
                    index[int(axis)] = slice(int(start), int(end), int(step))
                return self.view_copy(ins[0], [outs[0]], lambda x: [x[tuple(index)]])
            if op == "Transpose":
                perm = a.get("perm")
                return self.view_copy(ins[0], outs, lambda x: [np.transpose(x, perm)])
            if op == "Split" and len(ins) == 1:
                cuts = np.cumsum(a["split"])[:-1]
                return self.view_copy(ins[0], s["outputs"],
                                      lambda x: np.split(x, cuts, axis=int(a["axis"])))
            if op == "Expand" and len(ins) == 1:
                shape = self.info(outs[0])[0]
                return self.view_copy(ins[0], outs, lambda x: [np.broadcast_to(x, shape)])
            if op in _COPY_OPS:
                return self.reshape(ins[0], outs[0])
            if op == "Gather" and len(ins) == 2:
                return self.gather(s, ins, outs[0], int(a.get("axis", 0)))
            if op == "Cast" and len(ins) == 1:
                return self.cast(ins[0], outs[0])
            if op in _UNARY and len(ins) == 1:
                return self.elementwise(op, ins, outs[0], _UNARY[op])
            if op in _BINARY and len(ins) == 2:
                return self.elementwise(op, ins, outs[0], _BINARY[op])
            if op in _REDUCE and len(ins) == 1:
                return self.reduce(op, ins[0], outs[0], a)
            if op == "Softmax" and len(ins) == 1:
                return self.softmax(ins[0], outs[0], int(a.get("axis", -1)))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise Unsupported(f"attributes the library cannot read ({type(e).__name__}: {e})")
        raise Unsupported("runs as a numpy step in celosia's CPU build (no compiled kernel "
                          "for it), and the library has no Python")

    def concat(self, ins, out, axis) -> str:
        shape, dtype = self.info(out)
        axis = axis % len(shape)
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64)) * dtype.itemsize
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        obase, ooff = self.plan.where(out)
        if obase != "A":
            raise Unsupported(f"writes {out!r}, which is a constant")
        lines, first = [], 0
        for v in ins:
            vshape, vdtype = self.info(v)
            if vdtype != dtype or len(vshape) != len(shape):
                raise Unsupported(f"concatenates {v!r} ({vdtype}{list(vshape)}) into "
                                  f"{dtype}{list(shape)}")
            chunk = vshape[axis] * inner
            if not (outer == 1 and self.plan.where(v) == ("A", ooff + first)):  # else in place
                lines.append(f"for (int64_t n = 0; n < {outer}; n++) memcpy(A + {ooff} + "
                             f"n * {shape[axis] * inner} + {first}, {self.ptr(v)} + n * {chunk}, "
                             f"{chunk});")
            first += chunk
        return "\n  ".join(lines)

    def view_copy(self, src, outs, view) -> str:
        """Each output is ``view(x)``'s strided view of the input, copied contiguous."""
        shape, dtype = self.info(src)
        fake = np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=shape,
                                               strides=_contiguous_strides(shape, dtype))
        base = fake.__array_interface__["data"][0]
        lines = []
        for o, v in zip(outs, view(fake)):
            if not o:
                continue
            oshape, odtype = self.info(o)
            if tuple(v.shape) != oshape or v.dtype != odtype or len(oshape) > MAX_DIMS:
                raise Unsupported(f"gives {v.dtype}{list(v.shape)} where the program holds "
                                  f"{odtype}{list(oshape)}")
            offset = v.__array_interface__["data"][0] - base
            if self.plan.where(o) == (self.plan.where(src)[0], self.plan.where(src)[1] + offset) \
                    and v.flags.c_contiguous:
                continue  # the output lives in its input already
            lines.append(f"{{ static const int64_t shape[] = {{{_ints(v.shape)}}}, strides[] = "
                         f"{{{_ints(v.strides)}}}; strided_copy({self.out_ptr(o)}, "
                         f"{self.ptr(src)} + {offset}, {v.ndim}, shape, strides, "
                         f"{dtype.itemsize}); }}")
        return "\n  ".join(lines)

    def reshape(self, src, out) -> str:
        (shape, dtype), (oshape, odtype) = self.info(src), self.info(out)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if n != int(np.prod(oshape, dtype=np.int64)) * odtype.itemsize:
            raise Unsupported(f"reshapes {dtype}{list(shape)} to {odtype}{list(oshape)}")
        if self.plan.where(src) == self.plan.where(out):
            return ""
        return f"memmove({self.out_ptr(out)}, {self.ptr(src)}, {n});"

    def gather(self, s, ins, out, axis) -> str:
        (shape, dtype), (ishape, idtype) = self.info(ins[0]), self.info(ins[1])
        axis %= max(1, len(shape))
        if idtype not in (np.dtype(np.int64), np.dtype(np.int32)):
            raise Unsupported(f"indices of dtype {idtype}")
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64)) * dtype.itemsize
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        n = int(np.prod(ishape, dtype=np.int64))
        return (f"if (gather({self.out_ptr(out)}, {self.ptr(ins[0])}, {self.ptr(ins[1])}, "
                f"{idtype.itemsize}, {n}, {outer}, {shape[axis]}, {inner}, "
                f"{_c_string(s['node'])})) return -1;")

    def _float32(self, op, values) -> None:
        for v in values:
            if self.info(v)[1] != np.float32:
                raise Unsupported(f"{op} on {self.info(v)[1]} (the library computes float32 "
                                  f"only; {v!r} is {self.info(v)[1]})")

    def _broadcast_strides(self, v, shape) -> tuple:
        """``v``'s strides in elements seen broadcast to ``shape`` (0 where repeated)."""
        vshape, dtype = self.info(v)
        fake = np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=vshape,
                                               strides=_contiguous_strides(vshape, dtype))
        try:
            view = np.broadcast_to(fake, shape)
        except ValueError:
            raise Unsupported(f"{v!r} {list(vshape)} does not broadcast to {list(shape)}") \
                from None
        return tuple(st // dtype.itemsize for st in view.strides)

    def elementwise(self, op, ins, out, formula) -> str:
        """out[i] = formula(a[i], b[i]) in float32, the inputs broadcast numpy's way."""
        self._float32(op, [*ins, out])
        shape = self.info(out)[0]
        if len(shape) > MAX_DIMS:
            raise Unsupported(f"{len(shape)} dimensions")
        n = int(np.prod(shape, dtype=np.int64))
        lines = [f"{{ static const int64_t shape[] = {{{_ints(shape)}}};"]
        names = "ab"
        for k, v in enumerate(ins):
            strides = self._broadcast_strides(v, shape)
            lines.append(f"static const int64_t s{names[k]}[] = {{{_ints(strides)}}};")
            lines.append(f"const float *{names[k]} = (const float *)({self.ptr(v)});")
        lines.append(f"float *y = (float *)({self.out_ptr(out)});")
        reads = " ".join(f"float {names[k]}v = {names[k]}[offset({len(shape)}, shape, "
                         f"s{names[k]}, i)];" for k in range(len(ins)))
        lines.append(f"for (int64_t i = 0; i < {n}; i++) {{ {reads} y[i] = {formula}; }} }}")
        return "\n  ".join(lines)

    def reduce(self, op, src, out, a) -> str:
        """ReduceSum/Mean/Max/Min over ``axes`` (all when absent), float32, sums in double."""
        self._float32(op, [src, out])
        shape, dtype = self.info(src)
        axes = a.get("axes")
        axes = sorted({int(x) % len(shape) for x in axes} if axes is not None
                      else range(len(shape)))
        if not axes and int(a.get("noop_with_empty_axes", 0)):
            return self.reshape(src, out)
        keep = [d for d in range(len(shape)) if d not in axes]
        strides = [st // 4 for st in _contiguous_strides(shape, dtype)]
        kshape = [shape[d] for d in keep] or [1]
        kstrides = [strides[d] for d in keep] or [0]
        rshape = [shape[d] for d in axes] or [1]
        rstrides = [strides[d] for d in axes] or [0]
        nk, nr = int(np.prod(kshape, dtype=np.int64)), int(np.prod(rshape, dtype=np.int64))
        if nk != int(np.prod(self.info(out)[0], dtype=np.int64)):
            raise Unsupported(f"gives {list(self.info(out)[0])} from {list(shape)}")
        kind = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3}[op]
        return (f"{{ static const int64_t ks[] = {{{_ints(kshape)}}}, kt[] = "
                f"{{{_ints(kstrides)}}}, rs[] = {{{_ints(rshape)}}}, rt[] = "
                f"{{{_ints(rstrides)}}}; reduce_f32((float *)({self.out_ptr(out)}), "
                f"(const float *)({self.ptr(src)}), {len(kshape)}, ks, kt, {nk}, "
                f"{len(rshape)}, rs, rt, {nr}, {kind}); }}")

    def softmax(self, src, out, axis) -> str:
        self._float32("Softmax", [src, out])
        shape = self.info(src)[0]
        axis %= len(shape)
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
        return (f"softmax_f32((float *)({self.out_ptr(out)}), (const float *)"
                f"({self.ptr(src)}), {outer}, {shape[axis]}, {inner});")

    def cast(self, src, out) -> str:
        (shape, dtype), (_, odtype) = self.info(src), self.info(out)
        if str(dtype) not in _C_TYPES or str(odtype) not in _C_TYPES:
            raise Unsupported(f"casts {dtype} to {odtype}")
        n = int(np.prod(shape, dtype=np.int64))
        st, dt = _C_TYPES[str(dtype)], _C_TYPES[str(odtype)]
        value = "(v != 0)" if odtype == np.bool_ else f"({dt})v"
        return (f"{{ const {st} *x = (const {st} *)({self.ptr(src)}); {dt} *y = ({dt} *)"
                f"({self.out_ptr(out)}); for (int64_t i = 0; i < {n}; i++) {{ {st} v = x[i]; "
                f"y[i] = {value}; }} }}")


# float32 formulas of av (and bv), after compiler/graph/ops.py's float32 numpy definitions
_UNARY = {"Tanh": "tanhf(av)", "Exp": "expf(av)", "Log": "logf(av)", "Sqrt": "sqrtf(av)",
          "Abs": "fabsf(av)", "Neg": "-av", "Reciprocal": "1.0f / av", "Floor": "floorf(av)",
          "Ceil": "ceilf(av)", "Relu": "(av < 0.0f ? 0.0f : av)", "Erf": "erff(av)",
          "Sigmoid": "1.0f / (1.0f + expf(-av))", "Identity": "av"}
_BINARY = {"Add": "av + bv", "Sub": "av - bv", "Mul": "av * bv", "Div": "av / bv",
           "Pow": "powf(av, bv)", "Max": "(av >= bv || av != av ? av : bv)",
           "Min": "(av <= bv || av != av ? av : bv)"}
_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")


def _contiguous_strides(shape, dtype) -> tuple:
    strides, step = [], np.dtype(dtype).itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


def _ints(xs) -> str:
    return ", ".join(str(int(x)) for x in xs) or "0"


def _kernel_work(program, s) -> int:
    """runner.kernel_work of a kernel step (its arrays' sizes are all it reads)."""
    def sized(v):
        shape = tuple(program.constants[v].shape) if v in program.constants else \
            tuple(program.values[v]["shape"])
        return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=shape,
                                               strides=(0,) * len(shape))
    return kernel_work(program.specs.get(s["kernel"], {}), [sized(v) for v in s["inputs"]])


def _alias(name: str, function: str) -> str:
    """``<name>_run`` for ``celosia_run``: the model's own names for the API, so programs
    can link several exported models at once."""
    return name + function[len("celosia"):]


def _aliased(name: str) -> tuple:
    return () if name == "celosia" else API


def _symbol(name: str, k: int, j: int) -> str:
    return f"__celosia_{name}_k{k}_s{j}"


def _generate_c(program, plan: _Plan, name: str, kernels: list, temps_bytes: int) -> str:
    """The C source: tables of the inputs and outputs, checks, the sequencing."""
    p = program
    index = {key: k for k, key in enumerate(kernels)}
    decls, body = [], []
    coder = _StepCoder(program, plan)
    for key, k in index.items():
        for j, _ in enumerate(p.kernels[key].segments):
            decls.append(f"extern void {_symbol(name, k, j)}(void **, int64_t, int64_t);")
    for n, s in enumerate(p.steps):
        kind = s["kind"]
        label = f"{s['node']} ({s['op']})".replace("*/", "* /")
        comment = f"  /* step {n}: {label} */"
        if kind == "kernel":
            kernel = p.kernels[s["kernel"]]
            k = index[s["kernel"]]
            args = [plan.expr(v) for v in s["inputs"]]
            t = 0
            for b in kernel.temps:
                args.append(f"(void *)(T + {t})")
                t += _align(int(np.prod(b.shape, dtype=np.int64)) * np.dtype(b.dtype).itemsize)
            small = _kernel_work(program, s) < SERIAL_WORK
            calls = " ".join(
                f"{_symbol(name, k, j)}(b, 0, {e if e else 0});" if not e or small else
                f"parallel({_symbol(name, k, j)}, b, {e});"
                for j, e in enumerate(kernel._extents))
            body.append(f"{comment}\n  {{ void *b[{max(1, len(args))}] = {{{', '.join(args)}}}; "
                        f"{calls} }}")
        elif kind != "view":
            code = coder.code(s)
            if code:
                body.append(comment + "\n  " + code)
    ins = [(v, p.values[v]) for v in p.inputs]
    outs = [(v, p.values[v]) for v in p.outputs]

    def table(prefix, items):
        shapes, at = [], []
        for _, info in items:
            at.append(len(shapes))
            shapes.extend(int(d) for d in info["shape"])
        dts = [DL_DTYPES[info["dtype"]] for _, info in items]
        rows = [
            f"static const char *{prefix}_names[] = {{{', '.join(_c_string(v) for v, _ in items) or '0'}}};",
            f"static const int {prefix}_ndim[] = {{{', '.join(str(len(i['shape'])) for _, i in items) or '0'}}};",
            f"static const int64_t {prefix}_shapes[] = {{{', '.join(map(str, shapes)) or '0'}}};",
            f"static const int {prefix}_at[] = {{{', '.join(map(str, at)) or '0'}}};",
            f"static const DLDataType {prefix}_dtypes[] = {{{', '.join(f'{{{c}, {b}, 1}}' for c, b in dts) or '{0, 0, 0}'}}};",
            f"static const int64_t {prefix}_bytes[] = {{{', '.join(str(_nbytes(i)) for _, i in items) or '0'}}};",
        ]
        return rows
    locs_in = ", ".join(str(plan.where(v)[1]) for v, _ in ins) or "0"
    out_src = []
    for v, _ in outs:
        base, off = plan.where(v)
        out_src.append(f"{base} + {off}")
    copy_out = "\n    ".join(
        f"memcpy((char *)outputs[{i}].data + outputs[{i}].byte_offset, {src}, out_bytes[{i}]);"
        for i, src in enumerate(out_src))
    return _C_TEMPLATE.format(
        name=name, name_str=_c_string(name), n_in=len(ins), n_out=len(outs),
        decls="\n".join(decls), tables="\n".join(table("in", ins) + table("out", outs)),
        arena=_align(plan.arena_bytes), temps=temps_bytes, locs_in=locs_in,
        steps="\n".join(body), copy_out=copy_out or "(void)C;",
        constants=f"__celosia_{name}_constants", aliases="\n".join(
            f'API __typeof__({f}) {_alias(name, f)} __attribute__((alias("{f}")));'
            for f in _aliased(name)))


_C_TEMPLATE = r"""/* Generated by `celosia export`: the sequencing of model {name}'s CPU build. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dlpack.h"

#define API __attribute__((visibility("default")))
#define N_IN {n_in}
#define N_OUT {n_out}
#define ARENA_BYTES {arena}
#define TEMP_BYTES {temps}

{decls}
extern const unsigned char {constants}[];

{tables}
static const int64_t in_at_arena[] = {{{locs_in}}};

static _Thread_local char error_text[1024];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *arena;

static int fail(const char *format, ...) {{
  va_list ap;
  va_start(ap, format);
  vsnprintf(error_text, sizeof error_text, format, ap);
  va_end(ap);
  return -1;
}}

static void dtype_text(DLDataType t, char *out, size_t size) {{
  static const char *codes[] = {{"int", "uint", "float", "opaque", "bfloat", "complex", "bool"}};
  const char *c = t.code < 7 ? codes[t.code] : "code?";
  if (t.lanes == 1) snprintf(out, size, "%s%u", c, (unsigned)t.bits);
  else snprintf(out, size, "%s%ux%u", c, (unsigned)t.bits, (unsigned)t.lanes);
}}

static void shape_text(const int64_t *shape, int ndim, char *out, size_t size) {{
  size_t n = 0;
  n += snprintf(out + n, size - n, "[");
  for (int d = 0; d < ndim && n < size; d++)
    n += snprintf(out + n, size - n, d ? ", %" PRId64 : "%" PRId64, shape[d]);
  if (n < size) snprintf(out + n, size - n, "]");
}}

static int check(const DLTensor *t, int i, int output) {{
  const char *what = output ? "output" : "input";
  const char *name = output ? out_names[i] : in_names[i];
  int ndim = output ? out_ndim[i] : in_ndim[i];
  const int64_t *shape = output ? out_shapes + out_at[i] : in_shapes + in_at[i];
  DLDataType want = output ? out_dtypes[i] : in_dtypes[i];
  char a[256], b[256];
  if (t->data == NULL)
    return fail("celosia_run: %s %d (%s): data is NULL", what, i, name);
  if (t->device.device_type != kDLCPU)
    return fail("celosia_run: %s %d (%s) is on device type %d; this library runs on the CPU: "
                "pass host memory (kDLCPU = 1)", what, i, name, (int)t->device.device_type);
  if (t->dtype.code != want.code || t->dtype.bits != want.bits || t->dtype.lanes != want.lanes) {{
    dtype_text(t->dtype, a, sizeof a); dtype_text(want, b, sizeof b);
    return fail("celosia_run: %s %d (%s) has dtype %s; the model takes %s", what, i, name, a, b);
  }}
  shape_text(shape, ndim, b, sizeof b);
  if (t->ndim != ndim)
    return fail("celosia_run: %s %d (%s) has %d dimensions; the model takes shape %s", what, i,
                name, (int)t->ndim, b);
  if (ndim > 0 && t->shape == NULL)
    return fail("celosia_run: %s %d (%s): shape is NULL; the model takes shape %s", what, i,
                name, b);
  for (int d = 0; d < ndim; d++)
    if (t->shape[d] != shape[d]) {{
      shape_text(t->shape, ndim, a, sizeof a);
      return fail("celosia_run: %s %d (%s) has shape %s; the model takes shape %s", what, i,
                  name, a, b);
    }}
  if (t->strides != NULL) {{
    int64_t expect = 1;
    for (int d = ndim - 1; d >= 0; d--) {{
      if (shape[d] != 1 && t->strides[d] != expect) {{
        shape_text(t->strides, ndim, a, sizeof a);
        return fail("celosia_run: %s %d (%s) has strides %s (in elements), not C-contiguous: "
                    "pass a contiguous row-major tensor (e.g. .contiguous() / "
                    "np.ascontiguousarray)", what, i, name, a);
      }}
      expect *= shape[d];
    }}
  }}
  return 0;
}}

/* ---- parallel loops: a pool of worker threads, started at the first run ----
 * A parallel segment's iterations [0, extent) are cut into chunks claimed by the calling
 * thread and the workers ($CELOSIA_NUM_THREADS threads in all, else the CPUs this process
 * may use); small kernels run whole on the caller. Each iteration writes its own outputs,
 * so the split never changes results. Runs hold `lock`, so one job at a time. */
typedef void (*segment_fn)(void **, int64_t, int64_t);
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER, pool_done = PTHREAD_COND_INITIALIZER;
static int pool_threads = 0, pool_started = 0, pool_stop = 0;
static pthread_t pool_workers[256];
static segment_fn job_fn;
static void **job_buffers;
static int64_t job_extent, job_chunks, job_next, job_finished;
static unsigned job_generation;

static void run_chunks(void) {{  /* with pool_lock held; returns with it held */
  while (job_next < job_chunks) {{
    int64_t c = job_next++;
    segment_fn fn = job_fn;
    void **b = job_buffers;
    int64_t begin = job_extent * c / job_chunks, end = job_extent * (c + 1) / job_chunks;
    pthread_mutex_unlock(&pool_lock);
    fn(b, begin, end);
    pthread_mutex_lock(&pool_lock);
    if (++job_finished == job_chunks) pthread_cond_broadcast(&pool_done);
  }}
}}

static void *pool_worker(void *arg) {{
  unsigned seen = 0;
  (void)arg;
  pthread_mutex_lock(&pool_lock);
  for (;;) {{
    while (job_generation == seen && !pool_stop) pthread_cond_wait(&pool_wake, &pool_lock);
    if (pool_stop) break;
    seen = job_generation;
    run_chunks();
  }}
  pthread_mutex_unlock(&pool_lock);
  return NULL;
}}

static void pool_start(void) {{  /* under `lock`, once */
  const char *env = getenv("CELOSIA_NUM_THREADS");
  long n = env && *env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  if (!(env && *env) && sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  if (n < 1) n = 1;
  if (n > 256) n = 256;
  pool_started = 1;
  for (int i = 0; i < n - 1; i++)
    if (pthread_create(&pool_workers[pool_threads], NULL, pool_worker, NULL) == 0) pool_threads++;
}}

static void parallel(segment_fn fn, void **b, int64_t extent) {{
  if (pool_threads == 0 || extent < 2) {{ fn(b, 0, extent); return; }}
  pthread_mutex_lock(&pool_lock);
  job_fn = fn; job_buffers = b; job_extent = extent;
  job_chunks = extent < pool_threads + 1 ? extent : pool_threads + 1;
  job_next = 0; job_finished = 0; job_generation++;
  pthread_cond_broadcast(&pool_wake);
  run_chunks();
  while (job_finished < job_chunks) pthread_cond_wait(&pool_done, &pool_lock);
  pthread_mutex_unlock(&pool_lock);
}}

/* dst (contiguous) = the strided view of src: shape, strides in bytes */
static void strided_copy(unsigned char *dst, const unsigned char *src, int ndim,
                         const int64_t *shape, const int64_t *strides, int64_t item) {{
  int64_t total = 1, idx[16] = {{0}};
  for (int d = 0; d < ndim; d++) total *= shape[d];
  if (total == 0) return;
  if (ndim == 0) {{ memcpy(dst, src, item); return; }}
  int64_t n = shape[ndim - 1], step = strides[ndim - 1];
  for (int64_t row = 0; row < total / n; row++) {{
    const unsigned char *p = src;
    for (int d = 0; d < ndim - 1; d++) p += idx[d] * strides[d];
    if (step == item) {{ memcpy(dst, p, n * item); dst += n * item; }}
    else for (int64_t j = 0; j < n; j++, dst += item) memcpy(dst, p + j * step, item);
    for (int d = ndim - 2; d >= 0; d--) {{ if (++idx[d] < shape[d]) break; idx[d] = 0; }}
  }}
}}

/* np.take(data, indices, axis): outer x dim x inner bytes, indices int32 or int64 */
static int gather(unsigned char *dst, const unsigned char *data, const unsigned char *indices,
                  int index_bytes, int64_t n, int64_t outer, int64_t dim, int64_t inner,
                  const char *node) {{
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < n; k++, dst += inner) {{
      int64_t i = index_bytes == 8 ? ((const int64_t *)indices)[k]
                                   : ((const int32_t *)indices)[k];
      if (i < -dim || i >= dim)
        return fail("celosia_run: node %s (Gather): index %" PRId64 " is out of range for an "
                    "axis of %" PRId64 " (valid: -%" PRId64 " to %" PRId64 ")", node, i, dim,
                    dim, dim - 1);
      if (i < 0) i += dim;
      memcpy(dst, data + (o * dim + i) * inner, inner);
    }}
  return 0;
}}

/* the offset (in elements) of the i-th element of a row-major walk over shape */
static inline int64_t offset(int ndim, const int64_t *shape, const int64_t *strides,
                             int64_t i) {{
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; d--) {{ off += (i % shape[d]) * strides[d]; i /= shape[d]; }}
  return off;
}}

/* kind 0 sum, 1 mean, 2 max, 3 min over the r dimensions, for each of the k positions */
static void reduce_f32(float *y, const float *x, int nk, const int64_t *ks, const int64_t *kt,
                       int64_t kn, int nr, const int64_t *rs, const int64_t *rt, int64_t rn,
                       int kind) {{
  for (int64_t i = 0; i < kn; i++) {{
    const float *base = x + offset(nk, ks, kt, i);
    double sum = 0.0;
    float best = rn ? base[offset(nr, rs, rt, 0)] : (kind == 2 ? -INFINITY : INFINITY);
    for (int64_t j = 0; j < rn; j++) {{
      float v = base[offset(nr, rs, rt, j)];
      sum += v;
      if (kind == 2 && (v > best || v != v)) best = v;
      if (kind == 3 && (v < best || v != v)) best = v;
    }}
    y[i] = kind == 0 ? (float)sum : kind == 1 ? (float)(sum / (double)rn) : best;
  }}
}}

/* softmax over the middle axis of [outer, n, inner] */
static void softmax_f32(float *y, const float *x, int64_t outer, int64_t n, int64_t inner) {{
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < inner; k++) {{
      const float *p = x + o * n * inner + k;
      float *q = y + o * n * inner + k;
      float m = -INFINITY;
      for (int64_t j = 0; j < n; j++) if (p[j * inner] > m) m = p[j * inner];
      double sum = 0.0;
      for (int64_t j = 0; j < n; j++) {{ q[j * inner] = expf(p[j * inner] - m); sum += q[j * inner]; }}
      for (int64_t j = 0; j < n; j++) q[j * inner] = (float)(q[j * inner] / sum);
    }}
}}

static int run_steps(unsigned char *A, const unsigned char *C) {{
  unsigned char *T = A + ARENA_BYTES;
  (void)T; (void)C;
{steps}
  return 0;
}}

API int celosia_run(const DLTensor *inputs, int num_inputs, DLTensor *outputs, int num_outputs) {{
  if (num_inputs != N_IN)
    return fail("celosia_run: model %s takes %d input tensors, given %d", {name_str}, N_IN,
                num_inputs);
  if (num_outputs != N_OUT)
    return fail("celosia_run: model %s gives %d output tensors, given %d", {name_str}, N_OUT,
                num_outputs);
  if (N_IN > 0 && inputs == NULL) return fail("celosia_run: inputs is NULL");
  if (N_OUT > 0 && outputs == NULL) return fail("celosia_run: outputs is NULL");
  for (int i = 0; i < N_IN; i++)
    if (check(&inputs[i], i, 0)) return -1;
  for (int i = 0; i < N_OUT; i++)
    if (check(&outputs[i], i, 1)) return -1;
  pthread_mutex_lock(&lock);
  if (arena == NULL) {{
    void *p = NULL;
    if (posix_memalign(&p, 64, ARENA_BYTES + TEMP_BYTES + 64) != 0) {{
      pthread_mutex_unlock(&lock);
      return fail("celosia_run: out of memory (%lld bytes of working memory)",
                  (long long)(ARENA_BYTES + TEMP_BYTES));
    }}
    arena = p;
  }}
  if (!pool_started) pool_start();
  {{
    unsigned char *A = arena;
    const unsigned char *C = {constants};
    for (int i = 0; i < N_IN; i++)
      memcpy(A + in_at_arena[i], (const char *)inputs[i].data + inputs[i].byte_offset,
             in_bytes[i]);
    if (run_steps(A, C) != 0) {{
      pthread_mutex_unlock(&lock);
      return -1;
    }}
    {copy_out}
  }}
  pthread_mutex_unlock(&lock);
  error_text[0] = 0;
  return 0;
}}

API int celosia_num_inputs(void) {{ return N_IN; }}
API int celosia_num_outputs(void) {{ return N_OUT; }}
API const char *celosia_last_error(void) {{ return error_text; }}
API const char *celosia_model_name(void) {{ return {name_str}; }}
API const char *celosia_input_name(int i) {{ return i >= 0 && i < N_IN ? in_names[i] : NULL; }}
API const char *celosia_output_name(int i) {{ return i >= 0 && i < N_OUT ? out_names[i] : NULL; }}
API int celosia_input_ndim(int i) {{ return i >= 0 && i < N_IN ? in_ndim[i] : -1; }}
API int celosia_output_ndim(int i) {{ return i >= 0 && i < N_OUT ? out_ndim[i] : -1; }}
API const int64_t *celosia_input_shape(int i) {{ return i >= 0 && i < N_IN ? in_shapes + in_at[i] : NULL; }}
API const int64_t *celosia_output_shape(int i) {{ return i >= 0 && i < N_OUT ? out_shapes + out_at[i] : NULL; }}
API DLDataType celosia_input_dtype(int i) {{ DLDataType z = {{0, 0, 0}}; return i >= 0 && i < N_IN ? in_dtypes[i] : z; }}
API DLDataType celosia_output_dtype(int i) {{ DLDataType z = {{0, 0, 0}}; return i >= 0 && i < N_OUT ? out_dtypes[i] : z; }}

__attribute__((destructor)) static void release(void) {{
  pthread_mutex_lock(&pool_lock);  /* the workers stop before the code they run is unloaded */
  pool_stop = 1;
  pthread_cond_broadcast(&pool_wake);
  pthread_mutex_unlock(&pool_lock);
  for (int i = 0; i < pool_threads; i++) pthread_join(pool_workers[i], NULL);
  pool_threads = 0;
  free(arena);
  arena = NULL;
}}
{aliases}
"""


_SIGNATURES = {
    "celosia_run": ("int", "(const DLTensor *inputs, int num_inputs, DLTensor *outputs, "
                           "int num_outputs)"),
    "celosia_num_inputs": ("int", "(void)"), "celosia_num_outputs": ("int", "(void)"),
    "celosia_last_error": ("const char *", "(void)"),
    "celosia_model_name": ("const char *", "(void)"),
    "celosia_input_name": ("const char *", "(int i)"),
    "celosia_output_name": ("const char *", "(int i)"),
    "celosia_input_ndim": ("int", "(int i)"), "celosia_output_ndim": ("int", "(int i)"),
    "celosia_input_shape": ("const int64_t *", "(int i)"),
    "celosia_output_shape": ("const int64_t *", "(int i)"),
    "celosia_input_dtype": ("DLDataType", "(int i)"),
    "celosia_output_dtype": ("DLDataType", "(int i)"),
}


def _header(program, name: str) -> str:
    guard = f"CELOSIA_{name.upper()}_H_"
    aliases = "\n".join(f"{_SIGNATURES[f][0]} {_alias(name, f)}{_SIGNATURES[f][1]};"
                        for f in _aliased(name))

    def rows(kind, names):
        return "\n".join(
            f" *   {kind} {i}: {v.replace('*/', '* /')}  {program.values[v]['dtype']}"
            f"[{', '.join(map(str, program.values[v]['shape']))}]"
            for i, v in enumerate(names))
    return f"""/* {name}.h: the C API of lib{name}.so, written by `celosia export`.
 *
 * Tensors are DLPack DLTensors (dlpack.h, bundled) on the CPU, C-contiguous (strides NULL
 * or row-major), of exactly these dtypes and shapes:
{rows("input ", program.inputs)}
{rows("output", program.outputs)}
 *
 * celosia_run returns 0 on success; otherwise nonzero, and celosia_last_error() (per
 * thread) says what was wrong. Calls from several threads are safe: they are serialised.
 * Parallel loops run on worker threads: $CELOSIA_NUM_THREADS in all, else one per CPU.
 */
#ifndef {guard}
#define {guard}

#include <stdint.h>
#include "dlpack.h"

#ifdef __cplusplus
extern "C" {{
#endif

#define {name.upper()}_NUM_INPUTS {len(program.inputs)}
#define {name.upper()}_NUM_OUTPUTS {len(program.outputs)}

int celosia_run(const DLTensor *inputs, int num_inputs, DLTensor *outputs, int num_outputs);
int celosia_num_inputs(void);
int celosia_num_outputs(void);
const char *celosia_last_error(void);

/* Introspection: NULL / -1 / a zero dtype for an index out of range. */
const char *celosia_model_name(void);
const char *celosia_input_name(int i);
const char *celosia_output_name(int i);
int celosia_input_ndim(int i);
int celosia_output_ndim(int i);
const int64_t *celosia_input_shape(int i);
const int64_t *celosia_output_shape(int i);
DLDataType celosia_input_dtype(int i);
DLDataType celosia_output_dtype(int i);

/* The same functions under this model's own names ({name}_run, {name}_num_inputs, ...),
 * for a program that links several exported models (each also exports celosia_run, and
 * the first library loaded wins that name). */
{aliases}

#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
"""


def library_name(name: str) -> str:
    """``name`` checked as a C identifier (it names lib<name>.so, <name>.h and symbols)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
        raise ExportError(f"--name {name!r} must be a C identifier (letters, digits, _; not "
                          f"starting with a digit): it names lib<name>.so and <name>.h")
    return name


def default_name(path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_]", "_", Path(path).name.split(".")[0]) or "model"
    return stem if not stem[0].isdigit() else f"m_{stem}"


def export_library(model, out_dir, name: str) -> dict:
    """Write ``out_dir/lib<name>.so``, ``<name>.h`` and ``dlpack.h`` for a CpuModel (module
    docstring); returns their paths and figures."""
    from .cpu import CpuModel

    name = library_name(name)
    if not isinstance(model, CpuModel):
        raise ExportError(f"export takes a CPU build (CpuModel), not {type(model).__name__}")
    if not sys.platform.startswith("linux"):
        raise ExportError(f"export links ELF objects with a GNU-style linker: Linux only (this "
                          f"is {sys.platform})")
    program = model.program
    why = unsupported_steps(program)
    if why:
        shown = "; ".join(why[:8]) + (f"; and {len(why) - 8} more" if len(why) > 8 else "")
        raise ExportError(f"the standalone library cannot run {len(why)} step"
                          f"{'s' if len(why) > 1 else ''} of model {program.name!r}: {shown}. "
                          f"Run this model through celosia's Python runtime (`celosia run`, "
                          f"CpuModel) instead")
    bad = [v for v in (*program.inputs, *program.outputs)
           if program.values[v]["dtype"] not in DL_DTYPES]
    if bad:
        raise ExportError(f"value {bad[0]!r} is {program.values[bad[0]]['dtype']}; the library "
                          f"takes {', '.join(DL_DTYPES)}")
    cc, objcopy = find_cc(), _find_objcopy()
    plan = _Plan(program)
    kernels = list(dict.fromkeys(s["kernel"] for s in program.steps if s["kind"] == "kernel"))
    temps_bytes = max([sum(_align(int(np.prod(b.shape, dtype=np.int64)) * np.dtype(b.dtype).itemsize)
                           for b in program.kernels[k].temps) for k in kernels] or [0])
    source = _generate_c(program, plan, name, kernels, temps_bytes)
    for v in program.outputs:
        plan.where(v)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / f"lib{name}.so"
    with tempfile.TemporaryDirectory(prefix="celosia-export-") as tmp:
        tmp = Path(tmp)
        shutil.copyfile(DLPACK_HEADER, tmp / "dlpack.h")
        (tmp / "model.c").write_text(source)
        blob = tmp / "constants.bin"
        blob.write_bytes(bytes(plan.blob) or b"\0")
        const_sym = f"__celosia_{name}_constants"
        (tmp / "constants.S").write_text(
            f'\t.section .rodata\n\t.balign 64\n\t.globl {const_sym}\n\t.hidden {const_sym}\n'
            f'{const_sym}:\n\t.incbin "{blob}"\n'
            f'\t.section .note.GNU-stack,"",@progbits\n')
        objects = []
        for k, key in enumerate(kernels):
            kernel = program.kernels[key]
            raw, renamed = tmp / f"k{k}.raw.o", tmp / f"k{k}.o"
            raw.write_bytes(kernel.obj)
            symbols = [_symbol(name, k, j) for j in range(len(kernel.segments))]
            redefine = [f"--redefine-sym={s.symbol}={new}"
                        for s, new in zip(kernel.segments, symbols)]
            keep = tmp / f"k{k}.keep"
            keep.write_text("\n".join(symbols) + "\n")
            _run([objcopy, *redefine, raw, renamed], f"renaming kernel {k}'s symbols")
            _run([objcopy, f"--keep-global-symbols={keep}", renamed], f"localising kernel {k}")
            objects.append(renamed)
        script = tmp / "exports.map"
        exported = [*API, *(_alias(name, f) for f in _aliased(name))]
        script.write_text("{ global: " + " ".join(f"{f};" for f in exported) + " local: *; };\n")
        _run([*cc, "-shared", "-fPIC", "-O2", "-std=c11", "-fvisibility=hidden",
              "-o", lib, tmp / "model.c", tmp / "constants.S", *objects,
              f"-Wl,--version-script={script}", "-Wl,-Bsymbolic", "-lm", "-lpthread"],
             f"linking lib{name}.so")
    (out / f"{name}.h").write_text(_header(program, name))
    shutil.copyfile(DLPACK_HEADER, out / "dlpack.h")
    return {"library": str(lib), "header": str(out / f"{name}.h"),
            "dlpack": str(out / "dlpack.h"), "kernels": len(kernels),
            "steps": len(program.steps), "arena_bytes": _align(plan.arena_bytes) + temps_bytes,
            "constant_bytes": len(plan.blob), "library_bytes": lib.stat().st_size}


def export_model(path, out_dir, name: str | None = None, *, input_shapes=None, quantize=None,
                 calibration=None, calibration_method="mse") -> dict:
    """``celosia export``: an ONNX model built for the CPU (fp32, or the all-CPU int8 build
    with ``quantize``), or a CPU .cel, written as a library."""
    model = _source_model(path, input_shapes, quantize, calibration, calibration_method)
    return export_library(model, out_dir, name or default_name(path))


# ---- loading a library from Python (ctypes) --------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """dlpack.h's DLTensor."""

    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_NP_FROM_DL = {v: k for k, v in DL_DTYPES.items()}


def dltensor(x) -> tuple[DLTensor, object]:
    """A DLTensor over ``x``'s memory (no copy) and what keeps that memory alive: a numpy
    array described directly, anything else through its ``__dlpack__`` capsule (PyTorch,
    JAX, ...; the DLTensor is the first member of the DLManagedTensor it holds)."""
    if isinstance(x, np.ndarray):
        t = DLTensor()
        t.data = x.ctypes.data if x.size else x.ctypes.data or 1
        t.device = DLDevice(1, 0)
        t.ndim = x.ndim
        code = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}.get(x.dtype.kind, 3)  # 3: opaque
        t.dtype = DLDataType(code, x.dtype.itemsize * 8, 1)
        shape = (ctypes.c_int64 * max(1, x.ndim))(*x.shape)
        strides = (ctypes.c_int64 * max(1, x.ndim))(*(s // x.itemsize for s in x.strides))
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = 0
        return t, (x, shape, strides)
    if hasattr(x, "__dlpack__"):
        capsule = x.__dlpack__()
        ptr = _capsule_pointer(capsule, b"dltensor")
        return DLTensor.from_address(ptr), capsule
    raise ExportError(f"a {type(x).__name__} is not a tensor: pass a numpy array or an object "
                      f"with __dlpack__")


class Library:
    """A library ``celosia export`` wrote, loaded with ctypes.

        lib = Library("out/libnet.so")
        (probabilities,) = lib.run(image)            # numpy outputs, or
        lib.run(image, out=[y])                       # written into y (any DLPack tensor)
    """

    def __init__(self, path):
        self.path = str(path)
        lib = self.lib = ctypes.CDLL(self.path)
        lib.celosia_run.restype = ctypes.c_int
        lib.celosia_run.argtypes = [ctypes.POINTER(DLTensor), ctypes.c_int,
                                    ctypes.POINTER(DLTensor), ctypes.c_int]
        lib.celosia_last_error.restype = ctypes.c_char_p
        lib.celosia_model_name.restype = ctypes.c_char_p
        for side in ("input", "output"):
            getattr(lib, f"celosia_{side}_name").restype = ctypes.c_char_p
            getattr(lib, f"celosia_{side}_shape").restype = ctypes.POINTER(ctypes.c_int64)
            getattr(lib, f"celosia_{side}_dtype").restype = DLDataType
        self.name = lib.celosia_model_name().decode()
        self.inputs = [self._describe("input", i) for i in range(lib.celosia_num_inputs())]
        self.outputs = [self._describe("output", i) for i in range(lib.celosia_num_outputs())]

    def _describe(self, side: str, i: int) -> tuple[str, str, tuple]:
        lib = self.lib
        ndim = getattr(lib, f"celosia_{side}_ndim")(i)
        shape = getattr(lib, f"celosia_{side}_shape")(i)
        t = getattr(lib, f"celosia_{side}_dtype")(i)
        return (getattr(lib, f"celosia_{side}_name")(i).decode(),
                _NP_FROM_DL.get((t.code, t.bits), "?"), tuple(shape[d] for d in range(ndim)))

    @property
    def last_error(self) -> str:
        return self.lib.celosia_last_error().decode()

    def call(self, inputs, outputs) -> int:
        """``celosia_run`` on these tensors as given (any count): its return code."""
        ins = [dltensor(x) for x in inputs]
        outs = [dltensor(x) for x in outputs]
        a = (DLTensor * max(1, len(ins)))(*(t for t, _ in ins))
        b = (DLTensor * max(1, len(outs)))(*(t for t, _ in outs))
        rc = self.lib.celosia_run(a, len(ins), b, len(outs))
        del ins, outs  # (the memory stayed alive through the call)
        return rc

    def run(self, *inputs, out=None) -> list:
        """The outputs (fresh numpy arrays unless ``out``, a list of tensors, is given); an
        ExportError with the library's message when it refuses the tensors."""
        outs = list(out) if out is not None else [np.empty(s, d) for _, d, s in self.outputs]
        if self.call(inputs, outs) != 0:
            raise ExportError(f"lib{self.name}: {self.last_error}")
        return outs
