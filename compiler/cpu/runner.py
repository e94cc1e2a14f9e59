"""Kernel steps bound to fixed memory, run many at a time by one native call.

    step = BoundKernel(kernel, arrays, work=kernel_work(spec, arrays))  # checked once
    run = KernelRun([step, ...])       # consecutive kernel steps of a program
    mode, pool = run_mode()            # once per program run: threads, native runtime
    run(mode, pool)                    # one ctypes call for all of them

A graph executor (runtime/executor.py) binds each kernel step to its planned memory once.
Calling each bound kernel from Python cost 5-8 microseconds a step beyond the kernel (a
closure, the thread count read from the environment, the pool's lookup and lock, a ctypes
call of five arguments): on a small model (the zoo's small_cnn, 0.15 ms) that was a third
of its time. Here a run of consecutive kernel steps is one table of records ``{segments,
function table, extent table, buffer pointers}`` that threads.py's ``celosia_run_steps``
walks in machine code: one ctypes call, about a microsecond, for the whole run.

A kernel too small to split (``kernel_work`` under ``SERIAL_WORK``) runs its parallel loops
whole on the calling thread: handing out chunks costs a few cache-line transfers, and on a
loaded machine a worker that claims a chunk and is then descheduled makes the caller wait
for it. The split never changes results: each parallel iteration writes its own outputs.
With one thread (``CELOSIA_NUM_THREADS=1``) every kernel runs so, on a runtime without
worker threads (``serial_pool``).
"""

from __future__ import annotations

import ctypes
import math
import os

from .host import num_threads
from .threads import native_pool, serial_pool

__all__ = ["BoundKernel", "KernelRun", "kernel_work", "run_mode", "SERIAL_WORK"]

# Work units (elements touched plus multiply-adds) under which a kernel runs on one thread.
# Measured kernel by kernel (small_cnn, MobileNetV2 and ResNet-18 at 32x32 and small_cnn at
# batch 64; 2 threads, this 2-core machine under load): below about 1.3e5 units (2-4 us)
# splitting gained -1.4 to +1.4 us, from 1.4e5 on it gained 1-9 us.
SERIAL_WORK = 1 << 17

_RECORD = ctypes.c_int64 * 4  # threads.py's step record: segments, fns, extents, buffers


def kernel_work(spec: dict, arrays) -> int:
    """A rough size of a kernel step's work: every element of its arrays, plus for a kernel
    with a reduction (a ``weight`` operand, batch_matmul, a pooling window, int8_dot.py's
    window of a group's channels) the products per output. The output is the last array (kernels.py's parameter order)."""
    touched = sum(int(a.size) for a in arrays)
    out = int(arrays[-1].size) if arrays else 0
    def ints(v) -> bool:  # (a spec read from a .cel: checked, but not for this use)
        return isinstance(v, list) and bool(v) and all(type(d) is int and d >= 0 for d in v)

    weight, a, window = spec.get("weight"), spec.get("a"), spec.get("kernel")
    per_output = 0  # an element-wise kernel: its elements are its work
    group = [spec.get("channels"), spec.get("groups")]
    if spec.get("op") == "qdot" and ints(window) and ints(group):  # int8_dot.py
        per_output = math.prod(window) * (group[0] // max(1, group[1]))
    elif spec.get("op") in ("batch_matmul", "qdot_matmul") and ints(a):
        per_output = a[-1]
    elif ints(weight) and len(weight) >= 2:
        # [outer out-channel blocks, ..., inner out-channel block]: the rest is the reduction
        per_output = math.prod(weight) // max(1, weight[0] * weight[-1])
    elif ints(window):  # a pooling window
        per_output = math.prod(window)
    return touched + out * per_output


class BoundKernel:
    """A compiled kernel checked once against fixed arrays, with temporaries of its own;
    ``records[mode]`` is its step record. The arrays must stay alive and in place."""

    def __init__(self, kernel, arrays, *, work: int | None = None):
        kernel.check_args(arrays)
        self.kernel = kernel
        temps = kernel._new_temps()
        self._keep = (tuple(arrays), temps)  # the memory the pointers point to stays alive
        self.ptrs = (ctypes.c_void_p * (len(arrays) + len(temps)))(
            *(a.ctypes.data for a in list(arrays) + temps))
        extents = kernel._extents
        n = len(extents)
        self.serial_extents = (ctypes.c_int64 * n)(*(-1 if e is None else -e - 1
                                                     for e in extents))
        self.small = work is not None and work < SERIAL_WORK
        parallel = self.serial_extents if self.small else kernel._extent_table
        fns, ptrs = ctypes.addressof(kernel._fn_table), ctypes.addressof(self.ptrs)
        self.records = {
            "parallel": _RECORD(n, fns, ctypes.addressof(parallel), ptrs),
            "serial": _RECORD(n, fns, ctypes.addressof(self.serial_extents), ptrs)}
        self._extents_keep = parallel

    def __call__(self) -> None:
        """Run it through the kernel's own path (Python threads when the native runtime
        cannot serve this thread count)."""
        self.kernel._run_all(self.ptrs)


class KernelRun:
    """Consecutive bound kernel steps as one step table per mode."""

    def __init__(self, steps: list[BoundKernel]):
        self.steps = steps
        n = len(steps)
        self.tables = {mode: (_RECORD * n)(*(s.records[mode] for s in steps))
                       for mode in ("parallel", "serial")}

    def __call__(self, mode: str | None, pool) -> None:
        if mode is None:
            for s in self.steps:
                s()
        else:
            pool.run_steps(len(self.steps), self.tables[mode])


_threads: dict = {}  # $CELOSIA_NUM_THREADS -> threads (host.num_threads)


def run_mode() -> tuple[str | None, object]:
    """How this program run runs its kernels: ("serial", runtime) on one thread,
    ("parallel", pool) on the native pool, (None, None) where neither serves (no pthreads,
    or the thread count changed after the pool started: Python threads)."""
    env = os.environ.get("CELOSIA_NUM_THREADS")
    threads = _threads.get(env)
    if threads is None:  # the CPUs this process may use: a system call, so read once
        threads = _threads[env] = num_threads()
    if threads == 1:
        pool = serial_pool()
        return ("serial", pool) if pool is not None else (None, None)
    pool = native_pool(threads)
    if pool is not None and pool.workers == threads - 1:
        return "parallel", pool
    return None, None
