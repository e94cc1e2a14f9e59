"""DLPack tensors in and out of a compiled CPU model, without copies where the layout allows.

``CpuModel.run_dlpack(feeds, out=...)`` (and ``CpuModel.run``, given such a tensor) takes any
object with ``__dlpack__`` (numpy arrays, PyTorch tensors, JAX or TensorFlow CPU arrays) as an
input and any writable one as an output buffer.
Each is seen as a numpy array over the same memory (``np.from_dlpack``: no copy). Then:

- an input the compiled kernels read directly (every step that reads it is a kernel, no view
  or in-place value lives in its memory) is read in the caller's memory: the kernels'
  pointers are bound to it for the run and restored after; other inputs are copied into the
  arena as usual;
- an output made and read only by kernels is written straight into the caller's buffer; any
  other output in ``out`` is copied there from the arena (the one copy a run makes anyway).

Direct binding needs the array C-contiguous, of the model's dtype and shape, 64-byte aligned
(the arena's alignment, which the kernels may assume) and, for an output, writable and not
overlapping any input; otherwise that array takes the copying path, with the same result.
``ZeroCopy.last`` says which names were bound directly in the last run.
"""

from __future__ import annotations

import numpy as np

from ..compiler.graph.ir import InputShapeError
from .executor import ALIGN, in_place

__all__ = ["as_array", "ZeroCopy"]


def as_array(x, what: str) -> np.ndarray:
    """``x`` as a numpy array over its own memory: a numpy array as it is, anything with
    ``__dlpack__`` through DLPack (no copy); an error naming ``what`` otherwise."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError, ValueError) as e:
            raise InputShapeError(
                f"{what} ({type(x).__name__}) cannot be read through DLPack: {e}. celosia's "
                f"CPU build takes CPU tensors of float32/int8/uint8/int32/int64/bool (PyTorch: "
                f"t.detach().cpu(); JAX: jax.device_put(a, jax.devices('cpu')[0]))") from e
    raise InputShapeError(f"{what} is a {type(x).__name__}: pass a numpy array or a tensor "
                          f"with __dlpack__ (PyTorch, JAX, TensorFlow, CuPy on the CPU)")


class ZeroCopy:
    """The kernel argument slots of each value a run may bind to the caller's memory."""

    def __init__(self, executor):
        from ..compiler.cpu.runner import BoundKernel

        self.ex = executor
        program = executor.program
        aliased = set()  # values that share storage with another (views, in-place places)
        for v, (parent, _) in dict(in_place(program)).items():
            aliased |= {v, parent}
        for s in program.steps:
            if s["kind"] != "kernel":
                aliased |= {v for v in (*s["inputs"], *s["outputs"]) if v}
        slots: dict = {}
        for s, call in zip(program.steps, executor._calls):
            if s["kind"] == "kernel" and isinstance(call, BoundKernel):
                for j, v in enumerate(s["inputs"]):
                    slots.setdefault(v, []).append((call, j))
        names = set(program.inputs) | set(program.outputs)
        self.slots = {v: slots[v] for v in names
                      if v in slots and v not in aliased and v not in executor._dynamic
                      and v not in program.constants
                      and not (v in program.inputs and v in program.outputs)}
        self.types = {v: (np.dtype(program.values[v]["dtype"]), tuple(program.values[v]["shape"]))
                      for v in names if v not in executor._dynamic}
        self.last: dict = {"inputs": [], "outputs": []}

    def _fits(self, name: str, a: np.ndarray, write: bool) -> bool:
        return (name in self.slots and a.flags.c_contiguous and a.ctypes.data % ALIGN == 0
                and (a.dtype, a.shape) == self.types[name]
                and (a.flags.writeable or not write))

    def run(self, arrays: dict, out: dict | None = None, **kw) -> dict:
        """Run on input ``arrays`` (numpy, already checked: ``CpuModel.run_dlpack``), the
        outputs in ``out``'s tensors where given (module doc)."""
        program = self.ex.program
        outs = {}
        for n, x in (out or {}).items():
            if n not in program.outputs:
                raise InputShapeError(f"out[{n!r}]: the model's outputs are "
                                      f"{', '.join(program.outputs)}")
            a = as_array(x, f"out[{n!r}]")
            info = program.values[n]
            if (a.dtype, a.shape) != self.types.get(n) or not a.flags.writeable:
                raise InputShapeError(
                    f"out[{n!r}] is {'a read-only ' if not a.flags.writeable else ''}"
                    f"{a.dtype}[{','.join(map(str, a.shape))}]; output {n!r} is "
                    f"{info['dtype']}[{','.join(map(str, info['shape']))}]: pass a writable "
                    f"buffer of that dtype and shape")
            outs[n] = a
        direct = [n for n, a in arrays.items() if self._fits(n, a, False)]
        direct += [n for n, a in outs.items() if self._fits(n, a, True) and
                   not any(np.may_share_memory(a, b) for b in arrays.values()) and
                   not any(np.may_share_memory(a, b) for m, b in outs.items() if m != n)]
        saved = []
        try:
            for n in direct:
                addr = (arrays[n] if n in arrays else outs[n]).ctypes.data
                for call, j in self.slots[n]:
                    saved.append((call, j, call.ptrs[j]))
                    call.ptrs[j] = addr
            result = self.ex.run(arrays, direct=frozenset(direct), out=outs, **kw)
        finally:
            for call, j, addr in reversed(saved):
                call.ptrs[j] = addr
        self.last = {"inputs": [n for n in direct if n in arrays],
                     "outputs": [n for n in direct if n in outs]}
        return result
