"""A native parallel runtime for the CPU kernels, itself written in LLVM IR.

Python's thread pool costs about 100 microseconds per parallel loop on a loaded machine
(a futex wake-up, then the GIL); a ResNet-18 runs about 45 parallel loops. Here worker
threads (pthreads, started once) spin on a generation counter, so handing out a loop's
chunks costs a few cache-line transfers:

    celosia_run_kernel(n, fns, extents, buffers)   # every segment of a kernel, in order

    celosia_run_steps(n, steps)                    # n kernels' segments, in order (runner.py)

runs each segment ``fns[i](buffers, begin, end)``: a serial one (extent -1) on the calling
thread, as is a parallel loop run whole (extent -e-1: a kernel too small to split, or one
thread); a parallel one cut into ``4 x threads`` equal chunks (fewer for a short loop) that
the caller and the workers claim one at a time with a compare-and-swap on a word holding
the task's generation and the next chunk. The caller claims too, so a worker that is not
running (a busy machine) only leaves more chunks to the others, and a worker that wakes
up late finds the generation changed and claims nothing. The caller then waits for the
chunks claimed by others to finish, yielding its CPU after a few microseconds of spinning
(on a busy machine the worker holding the last chunk may be waiting for one). Workers that find no work for a while (50,000 pause
instructions, about a millisecond) poll every 50 microseconds instead, so an idle
process does not burn CPUs.

One task at a time: ``run_kernel`` and ``run_steps`` hold a lock (the kernels themselves release the GIL).
"""

from __future__ import annotations

import ctypes
import threading

from .host import host_target, llvm_binding, target_machine

__all__ = ["NativePool", "native_pool", "serial_pool"]

_IR = r"""
; The current task: a segment, its buffers, its loop extent cut into @chunks pieces.
; @claim holds (generation << 32) | next chunk: a claim is a compare-and-swap, so a worker
; that wakes up late (a stale generation) can never take a chunk of a newer task.
@fn = internal global ptr null
@bufs = internal global ptr null
@extent = internal global i64 0
@chunks = internal global i64 1
@claim = internal global i64 0
@done = internal global i64 0
@generation = internal global i64 0

declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(i64)
declare i32 @usleep(i32)
declare i32 @sched_yield()
PAUSE_DECL

; Claim and run chunks of generation %gen until none is left.
define internal void @drain(i64 %gen) {
entry:
  br label %try
try:
  %w = load atomic i64, ptr @claim acquire, align 8
  %wgen = lshr i64 %w, 32
  %idx = and i64 %w, 4294967295
  %c = load i64, ptr @chunks
  %same = icmp eq i64 %wgen, %gen
  %left = icmp ult i64 %idx, %c
  %ok = and i1 %same, %left
  br i1 %ok, label %cas, label %exit
cas:
  %w1 = add i64 %w, 1
  %pair = cmpxchg ptr @claim, i64 %w, i64 %w1 acq_rel acquire
  %won = extractvalue { i64, i1 } %pair, 1
  br i1 %won, label %run, label %try
run:
  %f = load ptr, ptr @fn
  %p = load ptr, ptr @bufs
  %e = load i64, ptr @extent
  %c2 = load i64, ptr @chunks
  %b0 = mul i64 %e, %idx
  %b = udiv i64 %b0, %c2
  %idx1 = add i64 %idx, 1
  %e0 = mul i64 %e, %idx1
  %en = udiv i64 %e0, %c2
  %nonempty = icmp ult i64 %b, %en
  br i1 %nonempty, label %call, label %count
call:
  call void %f(ptr %p, i64 %b, i64 %en)
  br label %count
count:
  %old = atomicrmw add ptr @done, i64 1 release
  br label %try
exit:
  ret void
}

define internal ptr @worker(ptr %arg) {
entry:
  %seen = alloca i64
  %spins = alloca i64
  store i64 0, ptr %seen
  br label %loop
loop:
  store i64 0, ptr %spins
  br label %spin
spin:
  %w = load atomic i64, ptr @claim acquire, align 8
  %g = lshr i64 %w, 32
  %s = load i64, ptr %seen
  %new = icmp ne i64 %g, %s
  br i1 %new, label %work, label %idle
idle:
  %n = load i64, ptr %spins
  %n1 = add i64 %n, 1
  store i64 %n1, ptr %spins
  %long = icmp ugt i64 %n1, 50000
  br i1 %long, label %sleep, label %relax
relax:
  PAUSE_CALL
  br label %spin
sleep:
  %r = call i32 @usleep(i32 50)
  br label %spin
work:
  store i64 %g, ptr %seen
  call void @drain(i64 %g)
  br label %loop
}

define void @celosia_threads_start(i64 %n) {
entry:
  %tid = alloca i64
  br label %head
head:
  %i = phi i64 [1, %entry], [%i1, %body]
  %more = icmp ule i64 %i, %n
  br i1 %more, label %body, label %exit
body:
  %arg = inttoptr i64 %i to ptr
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @worker, ptr %arg)
  %t = load i64, ptr %tid
  %rd = call i32 @pthread_detach(i64 %t)
  %i1 = add i64 %i, 1
  br label %head
exit:
  ret void
}

define internal void @parallel(ptr %f, ptr %p, i64 %e, i64 %c) {
entry:
  store ptr %f, ptr @fn
  store ptr %p, ptr @bufs
  store i64 %e, ptr @extent
  store i64 %c, ptr @chunks
  store i64 0, ptr @done
  %g0 = load i64, ptr @generation
  %g = add i64 %g0, 1
  store i64 %g, ptr @generation
  %word = shl i64 %g, 32
  store atomic i64 %word, ptr @claim release, align 8
  call void @drain(i64 %g)
  br label %wait
wait:
  %spun = phi i64 [0, %entry], [%spun1, %relax], [0, %yield]
  %d = load atomic i64, ptr @done acquire, align 8
  %all = icmp uge i64 %d, %c
  br i1 %all, label %exit, label %relax
relax:
  PAUSE_CALL
  %spun1 = add i64 %spun, 1
  %long = icmp ugt i64 %spun1, 2000
  br i1 %long, label %yield, label %wait
yield:
  ; A worker holding a chunk was descheduled (a busy machine): give it the CPU.
  %ry = call i32 @sched_yield()
  br label %wait
exit:
  ret void
}

; Every segment of a kernel in order; extents[i] < 0: serial, the caller runs it over
; [0, -extents[i] - 1) (-1: a serial segment; -e-1: a parallel loop of extent e run whole).
define void @celosia_run_kernel(i64 %n, ptr %fns, ptr %extents, ptr %p, i64 %per) {
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%i1, %next]
  %more = icmp ult i64 %i, %n
  br i1 %more, label %body, label %exit
body:
  %fp = getelementptr ptr, ptr %fns, i64 %i
  %f = load ptr, ptr %fp
  %ep = getelementptr i64, ptr %extents, i64 %i
  %e = load i64, ptr %ep
  %serial = icmp slt i64 %e, 0
  br i1 %serial, label %one, label %many
one:
  %hi = xor i64 %e, -1
  call void %f(ptr %p, i64 0, i64 %hi)
  br label %next
many:
  %c0 = icmp ult i64 %e, %per
  %c = select i1 %c0, i64 %e, i64 %per
  call void @parallel(ptr %f, ptr %p, i64 %e, i64 %c)
  br label %next
next:
  %i1 = add i64 %i, 1
  br label %head
exit:
  ret void
}

; Consecutive kernel steps in one call: %steps holds per step {i64 segments, ptr fns,
; ptr extents, ptr buffers} (runner.py's table).
define void @celosia_run_steps(i64 %n, ptr %steps, i64 %per) {
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%i1, %body]
  %more = icmp ult i64 %i, %n
  br i1 %more, label %body, label %exit
body:
  %rec = getelementptr [4 x i64], ptr %steps, i64 %i
  %cnt = load i64, ptr %rec
  %fp = getelementptr [4 x i64], ptr %steps, i64 %i, i64 1
  %fns = load ptr, ptr %fp
  %ep = getelementptr [4 x i64], ptr %steps, i64 %i, i64 2
  %ext = load ptr, ptr %ep
  %bp = getelementptr [4 x i64], ptr %steps, i64 %i, i64 3
  %bufs = load ptr, ptr %bp
  call void @celosia_run_kernel(i64 %cnt, ptr %fns, ptr %ext, ptr %bufs, i64 %per)
  %i1 = add i64 %i, 1
  br label %head
exit:
  ret void
}
"""

_RUN_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_int64)
_RUN_STEPS = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
# Chunks per thread of a parallel loop: enough that a late or busy thread's share is
# taken by the others, few enough that claiming costs nothing.
CHUNKS_PER_THREAD = 4


class NativePool:
    """The worker threads and ``run_kernel``; ``workers`` threads besides the caller."""

    def __init__(self, workers: int):
        llvm = llvm_binding()
        x86 = host_target().triple.startswith(("x86_64", "i686", "i386"))
        text = _IR.replace("PAUSE_DECL", "declare void @llvm.x86.sse2.pause()" if x86 else "")
        text = text.replace("PAUSE_CALL", "call void @llvm.x86.sse2.pause()" if x86 else
                            "fence seq_cst")
        module = llvm.parse_assembly(text)
        module.verify()
        tm = target_machine()
        module.triple, module.data_layout = tm.triple, str(tm.target_data)
        self._engine = llvm.create_mcjit_compiler(module, tm)
        self._engine.finalize_object()
        self.workers = workers
        self._run = _RUN_KERNEL(self._engine.get_function_address("celosia_run_kernel"))
        self._run_steps = _RUN_STEPS(self._engine.get_function_address("celosia_run_steps"))
        self.per = CHUNKS_PER_THREAD * (workers + 1)
        self.lock = threading.Lock()
        start = ctypes.CFUNCTYPE(None, ctypes.c_int64)(
            self._engine.get_function_address("celosia_threads_start"))
        if workers:
            start(workers)

    def run_kernel(self, n: int, fns, extents, buffers) -> None:
        """Run ``n`` segments (addresses ``fns``, extents, -1 for serial) on ``buffers``."""
        with self.lock:
            self._run(n, fns, extents, buffers, self.per)

    def run_steps(self, n: int, table) -> None:
        """Run ``n`` kernel steps of a step table (runner.py) in order: one native call."""
        with self.lock:
            self._run_steps(n, table, self.per)


_state: dict = {}
_lock = threading.Lock()


def native_pool(threads: int) -> NativePool | None:
    """The process's native pool for ``threads`` threads in all (started on first use),
    or None when it cannot start here (the caller falls back to Python threads)."""
    with _lock:
        pool = _state.get("pool")
        if pool is None and "failed" not in _state:
            try:
                pool = _state["pool"] = NativePool(max(0, threads - 1))
            except Exception as exc:  # noqa: BLE001 - e.g. no pthreads: Python threads work
                _state["failed"] = repr(exc)
        return pool


def serial_pool() -> NativePool | None:
    """A runtime without worker threads, for runs on one thread (runner.py's serial
    tables: every extent negative, every loop run whole by the caller), or None when it
    cannot be made. Separate from ``native_pool`` so that CELOSIA_NUM_THREADS=1 starts no
    workers and a later run with more threads still gets a pool of the right size."""
    with _lock:
        pool = _state.get("serial")
        if pool is None and "serial failed" not in _state:
            try:
                pool = _state["serial"] = NativePool(0)
            except Exception as exc:  # noqa: BLE001 - the caller falls back to ctypes calls
                _state["serial failed"] = repr(exc)
        return pool
