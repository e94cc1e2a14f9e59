"""Compiled LSTM, GRU and RNN layers for the CPU build: the time loop in one kernel.

The layer is two steps of the CPU program (lowered by lower_recurrent.py):

1. the input projection of every time step and direction as one ``dense`` kernel,
   ``xw = X[T*B, I] @ W^T + bias`` (both biases folded in, except GRU's recurrent bias of
   the h gate when ``linear_before_reset``, which the gate needs apart), and
2. a ``recurrent`` kernel (built here) that runs the time loop: per step the recurrent
   product ``h @ R^T`` on top of ``xw``'s row, the gate activations, the state update and
   the writes of ``Y``; ``Y_h`` (and LSTM's ``Y_c``) at the end.

Work items. The recurrent product is a matrix-vector product (batch 1) or a thin matrix
product with the same weights every step. Each gate's block is padded to ``Hp`` units (a
multiple of 16, 8 for H <= 8; padded units have zero weights and never reach the
outputs), and cut into slices of ``S`` units; ``R`` is packed once at build time per
slice as ``[H, gates, S]`` (streamed in order). A work item is a slice for a tile of up to
4 batch rows: every gate of its units accumulates in registers over k < H (8 AVX-512
registers for one row, up to 16 for more: independent sums that hide the FMA latency),
then the item updates those units' state from the registers. The running sum starts
from ``xw`` and adds the products in order of k, where numpy adds ``xw`` to a BLAS
product: the two agree to float32 rounding. GRU without ``linear_before_reset`` needs
``r * h`` of every unit before its h gate: its steps have two phases (z, r and ``r * h``;
then h).

Threads. A step's items need the whole previous ``h``, so a step is a barrier. The spec
says how the kernel is cut (``threads``, the build's thread count, and ``parallel_steps``,
from ``parallel_steps()``). Without parallel steps, a direction's time loop is one
function, and a bidirectional layer on 2+ threads runs each direction on a thread of its
own (no barrier). With them, the segments are ``init``, then per step each phase (a
parallel loop over its items) and ``tick`` (the step counters; ``h`` is double-buffered by
their parity), then ``final``: one function per distinct segment, called in that order, so
the native pool (threads.py) runs each phase on all threads and waits for its end. Items
are cut into as many parts per direction as there are threads: the pool's first claims
then give each thread the same part every step, whose weights stay in its core's L2 (a
256-unit LSTM's R is 1 MB, one core's whole L2). Only steps of STEP_PARALLEL_MACS and more
take the barrier (see there).

Activations: sigmoid is ``1 / (1 + exp(-x))`` with fastmath's inline ``exp``; tanh is
Eigen's float32 rational approximation (odd degree 13 over even degree 6 on x clamped to
+-7.9053, mul/add/div only, so it vectorises): within 4e-7 relative of float64 tanh on all
of float32 (measured on 2.2 M points of [-10, 10] and 1e-8..1), where ``1 - 2 / (exp(2x)
+ 1)`` loses its relative accuracy near 0.

Sequence lengths: a row whose sequence has ended (``t >= lens[b]``) keeps its state and
writes zeros to ``Y``; its final state is 0 for a sequence of length 0 (the reference,
graph/ops_recurrent.py, and onnxruntime).
"""

from __future__ import annotations

import numpy as np

from ..tensor.expr import Var, as_expr, exp, max_expr, min_expr, select
from ..tensor.tir import Allocate, Buffer, For, If, PrimFunc, Store, seq

__all__ = ["GATES", "STEP_PARALLEL_MACS", "parallel_steps", "padded_hidden", "phases",
           "slice_width", "pack_recurrent_weight", "build_recurrent", "compile_recurrent",
           "sigmoid", "tanh"]

F32 = "float32"
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
# Eigen's float32 tanh (generic_fast_tanh_float): numerator odd in x, denominator even.
_TANH_CLAMP = 7.90531110763549805
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
           5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
           4.89352455891786e-03)  # x^13 ... x^1, as polynomials in x^2
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
           4.89352518554385e-03)  # x^6 ... x^0


# Multiply-adds of a step (of one direction) from which its work items run on every thread,
# a barrier per step. Below, a direction's time loop runs on one thread: on this shared
# 2-core machine the zoo's LSTM layer (262 k per step) ran 1.8 times faster on two threads
# at best, but whole-model medians of `bench zoo --models lstm` were 1.45-4.9 times
# onnxruntime's against 0.93-1.69 on one thread (same hour, alternating runs): each of the
# 200 barriers waits whenever a worker is preempted inside its part.
STEP_PARALLEL_MACS = 2_000_000


def parallel_steps(spec: dict) -> bool:
    """Whether each step's work items run on every thread (spec["parallel_steps"]): with
    at least two threads per direction, for steps of STEP_PARALLEL_MACS and more."""
    macs = spec["batch"] * GATES[spec["cell"]] * spec["hidden"] ** 2
    return spec["threads"] >= 2 * spec["directions"] and macs >= STEP_PARALLEL_MACS


def padded_hidden(hidden: int) -> int:
    """The columns of one gate's block: ``hidden`` rounded up to whole vectors."""
    return 8 if hidden <= 8 else -(-hidden // 16) * 16


def row_tile(batch: int) -> int:
    return min(batch, 4)


def phases(spec: dict) -> list[tuple[int, ...]]:
    """The gates of each matrix-vector phase of a step: LSTM (i, o, f, c), RNN and GRU
    with ``linear_before_reset`` one phase from ``h``; GRU without it two (z and r from
    ``h``, then h from ``r * h``)."""
    if spec["cell"] == "GRU" and not spec["linear_before_reset"]:
        return [(0, 1), (2,)]
    return [tuple(range(GATES[spec["cell"]]))]


def slice_width(spec: dict, gates: int) -> int:
    """Hidden units per work item: every gate of a slice accumulates in registers, at
    most 8 AVX-512 registers per batch row for one row, 16 in all for more."""
    hp, rows = padded_hidden(spec["hidden"]), row_tile(spec["batch"])
    budget = 128 if rows == 1 else 256
    return next(w for w in (128, 64, 32, 16, 8) if hp % w == 0
                and (rows * gates * w <= budget or w == 8))


def pack_recurrent_weight(r, spec: dict):
    """``R [dirs, G*H, H]`` -> ``[dirs, G*Hp*H]``: per phase, per slice of ``S`` hidden
    units, ``[H, gates, S]`` (the order the kernel reads it in); padded rows are 0."""
    dirs, _, h = r.shape
    hp, g = padded_hidden(h), GATES[spec["cell"]]
    padded = np.zeros((dirs, g, hp, h), np.float32)
    padded[:, :, :h] = r.reshape(dirs, g, h, h)
    parts = []
    for gates in phases(spec):
        width = slice_width(spec, len(gates))
        w = padded[:, list(gates)]  # [dirs, gates, Hp, H]
        w = w.reshape(dirs, len(gates), hp // width, width, h).transpose(0, 2, 4, 1, 3)
        parts.append(w.reshape(dirs, -1))
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


# ---- element-wise functions ---------------------------------------------------------------


def _f(v: float):
    return as_expr(float(v))


def _horner(x, coefficients):
    out = _f(coefficients[0])
    for c in coefficients[1:]:
        out = out * x + _f(c)
    return out


def sigmoid(v):
    return _f(1.0) / (_f(1.0) + exp(-v))


def tanh(v):
    x = min_expr(max_expr(v, _f(-_TANH_CLAMP)), _f(_TANH_CLAMP))
    x2 = x * x
    return x * _horner(x2, _TANH_P) / _horner(x2, _TANH_Q)


# ---- the kernel ---------------------------------------------------------------------------

class _Buf(Buffer):
    """A buffer whose accesses may use Python ints as indices."""

    def __getitem__(self, indices):
        if not isinstance(indices, tuple):
            indices = (indices,)
        return super().__getitem__(tuple(as_expr(i) for i in indices))


def _store(buf: Buffer, indices, value):
    return Store(buf, tuple(as_expr(i) for i in indices), as_expr(value))


def _loop(name: str, extent: int, body, kind: str = "serial"):
    """``for v in range(extent): body(v)`` (None when the loop is empty)."""
    if extent <= 0:
        return None
    v = Var(name)
    return For(v, extent, body(v), kind)


class _Kernel:
    """The loop IR of one recurrent spec: ``init``, per step the parallel ``phase`` loops
    and ``tick``, then ``final`` (see the module docstring)."""

    def __init__(self, spec: dict):
        self.spec, self.cell = spec, spec["cell"]
        self.t_len, self.batch, self.hidden = spec["steps"], spec["batch"], spec["hidden"]
        self.dirs, self.layout = spec["directions"], spec["layout"]
        self.hp = hp = padded_hidden(self.hidden)
        self.cols = GATES[self.cell] * hp  # one direction's gate columns in xw
        t, b, h, d = self.t_len, self.batch, self.hidden, self.dirs
        state = (b, d, h) if self.layout else (d, b, h)
        self.params = []
        self.xw = self.add_param(True, "xw", (spec["rows"], d * self.cols))
        self.r = self.add_param(True, "r", (d, self.cols * h))
        self.rbh = self.add_param(self.cell == "GRU" and spec["linear_before_reset"], "rbh",
                                  (d, hp))
        self.p = self.add_param(spec["peepholes"], "p", (d, 3 * hp))
        self.lens = self.add_param(spec["seq_lens"], "lens", (b,), "int32")
        self.h0 = self.add_param(spec["initial_h"], "h0", state)
        self.c0 = self.add_param(spec["initial_c"], "c0", state)
        self.y = self.add_param(True, "y", (b, t, d, h) if self.layout else (t, d, b, h))
        self.y_h = self.add_param(True, "y_h", state)
        self.y_c = self.add_param(self.cell == "LSTM", "y_c", state)
        # Temporaries: the step counter, h by step parity (read one, write the other),
        # LSTM's cell (each unit updated by one work item), GRU's z, r and r * h.
        self.clock = _Buf("clock", (d,), "int32")  # steps done, per direction
        self.h = _Buf("h", (2, d, b, hp), F32)
        self.c = _Buf("c", (d, b, hp), F32) if self.cell == "LSTM" else None
        two = len(phases(spec)) == 2
        self.zr = _Buf("zr", (d, b, 2, hp), F32) if two else None
        self.rh = _Buf("rh", (d, b, hp), F32) if two else None
        self.temps = [x for x in (self.clock, self.h, self.c, self.zr, self.rh) if x]
        clip = spec["clip"]
        self.clip = (lambda v: v) if clip is None else (
            lambda v: min_expr(max_expr(v, _f(-clip)), _f(clip)))

    def add_param(self, present: bool, name: str, shape, dtype: str = F32):
        if not present:
            return None
        buf = _Buf(name, tuple(shape), dtype)
        self.params.append(buf)
        return buf

    # ---- indices ---------------------------------------------------------------------

    def xrow(self, t, b):
        return b * self.t_len + t if self.layout else t * self.batch + b

    def state_at(self, d, b, j):
        return (b, d, j) if self.layout else (d, b, j)

    def y_at(self, t, d, b, j):
        return (b, t, d, j) if self.layout else (t, d, b, j)

    # ---- the function ----------------------------------------------------------------

    def build(self):
        """(the function, its segments in run order as statements of its body)."""
        init, final = self.initial(), self.final()
        n_phases = range(len(phases(self.spec)))
        threads = self.spec["threads"]

        def tick(d=None):
            if d is not None:
                return _store(self.clock, (d,), self.clock[d] + 1)
            return _loop("d", self.dirs, lambda d: _store(self.clock, (d,), self.clock[d] + 1))

        def time_loop(d=None):  # every step of direction d (None: of both)
            return _loop("step", self.t_len, lambda _: seq(
                *(self.phase(k, "serial", d) for k in n_phases), tick(d)))

        per_step = self.spec["parallel_steps"]
        if not per_step and (threads == 1 or self.dirs == 1):  # one function
            steps = time_loop()
            order = [init, steps, final]
        elif not per_step:  # a direction per thread, no barrier
            steps = _loop("d", 2, time_loop, "parallel")
            order = [init, steps, final]
        else:  # a segment per phase, each run on every thread, once per step
            loops, last = [self.phase(k, "parallel") for k in n_phases], tick()
            steps, order = seq(*loops, last), [init] + (loops + [last]) * self.t_len + [final]
        body = seq(init, steps, final)
        for buf in reversed(self.temps):
            body = Allocate(buf, body)
        return PrimFunc("recurrent", tuple(self.params), body), order

    def initial(self):
        h, hp = self.hidden, self.hp

        def state(buf, given, at):
            def row(d, b):
                if given is None:
                    return _loop("j", hp, lambda j: _store(buf, at(d, b, j), _f(0.0)),
                                 "vectorize")
                return seq(_loop("j", h, lambda j: _store(buf, at(d, b, j),
                                                         given[self.state_at(d, b, j)])),
                           _loop("j", hp - h, lambda j: _store(buf, at(d, b, j + h), _f(0.0))))
            return _loop("d", self.dirs, lambda d: _loop("b", self.batch, lambda b: row(d, b)))

        zero = _loop("d", self.dirs, lambda d: _loop("b", self.batch, lambda b: _loop(
            "j", hp, lambda j: _store(self.h, (1, d, b, j), _f(0.0)), "vectorize")))
        return seq(_loop("d", self.dirs, lambda d: _store(self.clock, (d,), as_expr(0))),
                   state(self.h, self.h0, lambda d, b, j: (0, d, b, j)), zero,
                   state(self.c, self.c0, lambda d, b, j: (d, b, j)) if self.c else None)

    def final(self):
        last = self.t_len % 2  # the parity the last step wrote

        def out(buf, dest, at):
            def value(d, b, j):
                v = buf[at(d, b, j)]
                return v if self.lens is None else select(self.lens[b] > 0, v, _f(0.0))
            return _loop("d", self.dirs, lambda d: _loop("b", self.batch, lambda b: _loop(
                "j", self.hidden, lambda j: _store(dest, self.state_at(d, b, j), value(d, b, j)),
                "vectorize")))
        return seq(out(self.h, self.y_h, lambda d, b, j: (last, d, b, j)),
                   out(self.c, self.y_c, lambda d, b, j: (d, b, j)) if self.c else None)

    # ---- one phase of a step: a parallel loop over directions, slices and row tiles ----

    def phase(self, k: int, kind: str, direction=None):
        """One phase of a step over its work items (of ``direction``, or of both): a
        direction's slices cut into as many parts as threads per direction, each part's
        slices (and their batch row tiles) in order. Few, fixed parts: the pool's first
        claims give each thread the same part every step, whose weights then stay in its
        core's cache."""
        gates = phases(self.spec)[k]
        width = slice_width(self.spec, len(gates))
        slices = self.hp // width
        parts = max(1, min(slices, self.spec["threads"] // self.dirs))
        per_part = -(-slices // parts)
        per = row_tile(self.batch)
        full, tail = divmod(self.batch, per)

        def item(n):
            if direction is not None:
                d = direction
            else:
                d = n // parts if self.dirs == 2 else as_expr(0)
            clock = self.clock[d]
            if self.dirs == 2:  # direction 1 runs backwards
                t = clock + d * (self.t_len - 1) - d * clock * 2
            else:
                t = (self.t_len - 1) - clock if self.spec["reverse"] else clock

            def one_slice(i):
                at = dict(k=k, gates=gates, width=width, d=d, t=t, parity=clock % 2,
                          s=(n % parts) * per_part + i)
                rows = seq(_loop("bt", full, lambda bt: self.tile(at, bt * per, per)),
                           self.tile(at, full * per, tail) if tail else None)
                return rows if parts * per_part == slices else If(at["s"] < slices, rows)
            return _loop("i", per_part, one_slice)
        items = parts if direction is not None else self.dirs * parts
        return _loop("item", items, item, kind)

    def tile(self, at: dict, b0, rows: int):
        """``rows`` batch rows x every gate of one slice: the products in registers, then
        the state update of those units."""
        k, gates, width, d, s = at["k"], at["gates"], at["width"], at["d"], at["s"]
        lanes = min(width, 64)
        unroll = width // lanes
        g_n = len(gates)
        acc = _Buf("acc", (rows, g_n, unroll, lanes), F32, "local")
        hp, h = self.hp, self.hidden
        src_h = (lambda b, kk: self.rh[d, b, kk]) if k == 1 else \
            (lambda b, kk: self.h[at["parity"], d, b, kk])
        offset = sum(len(g) for g in phases(self.spec)[:k]) * hp * h  # this phase's weights

        def each(body):  # unrolled in Python: register r, gate gi, vector q of a tile
            return seq(*(_loop("c", lanes, lambda c, r=r, gi=gi, q=q: body(r, gi, q, c),
                               "vectorize")
                         for r in range(rows) for gi in range(g_n) for q in range(unroll)))

        def start(r, gi, q, c):
            g = gates[gi]
            if self.cell == "GRU" and g == 2 and self.rbh is not None:
                value = _f(0.0)  # linear_before_reset: h @ Rh^T apart from xw
            else:
                col = d * self.cols + g * hp + s * width + q * lanes + c
                value = self.xw[self.xrow(at["t"], b0 + r), col]
            return _store(acc, (r, gi, q, c), value)

        def product(kk):
            def fma(r, gi, q, c):
                w = self.r[d, offset + s * (h * g_n * width) + kk * (g_n * width)
                           + gi * width + q * lanes + c]
                return _store(acc, (r, gi, q, c), acc[r, gi, q, c] + src_h(b0 + r, kk) * w)
            return each(fma)

        def row(r):
            b = b0 + r
            units = dict(at, b=b, pre=lambda gi, q, c: acc[r, gi, q, c], lanes=lanes,
                         unroll=unroll)
            return self.update(units)

        body = seq(each(start), _loop("kk", h, product), *(row(r) for r in range(rows)))
        return Allocate(acc, body)

    # ---- state updates of one batch row and slice ----------------------------------------

    def update(self, u: dict):
        """The new state of row ``u['b']``'s units in the slice, Y at step t (zeros and the
        state kept past the row's length)."""
        d, b, t, par = u["d"], u["b"], u["t"], u["parity"]
        first = u["s"] * u["width"]

        def units(fn):
            return seq(*(_loop("c", u["lanes"], lambda c, q=q: fn(q, c, first + q * u["lanes"] + c),
                               "vectorize") for q in range(u["unroll"])))

        if self.zr is not None and u["k"] == 0:  # GRU's first phase: z, r and r * h
            def zr(q, c, j):
                z, r = (sigmoid(self.clip(u["pre"](gi, q, c))) for gi in (0, 1))
                return seq(_store(self.zr, (d, b, 0, j), z), _store(self.zr, (d, b, 1, j), r),
                           _store(self.rh, (d, b, j), self.zr[d, b, 1, j]
                                 * self.h[par, d, b, j]))
            return units(zr)
        step = {"LSTM": self.lstm, "GRU": self.gru, "RNN": self.rnn}[self.cell]
        active = seq(units(lambda q, c, j: step(u, q, c, j)), self.write_y(u, first, None))
        if self.lens is None:
            return active
        kept = seq(units(lambda q, c, j: _store(self.h, (1 - par, d, b, j),
                                               self.h[par, d, b, j])),
                   self.write_y(u, first, _f(0.0)))
        return If(t < self.lens[b], active, kept)

    def write_y(self, u: dict, first, value):
        """Y[t] of the slice's units below H: the new h, or ``value``."""
        d, b, t, par = u["d"], u["b"], u["t"], u["parity"]

        def store(j):
            return _store(self.y, self.y_at(t, d, b, j),
                         self.h[1 - par, d, b, j] if value is None else value)
        if self.hidden == self.hp:  # every slice whole: vectors
            return _loop("q", u["width"], lambda q: store(first + q), "vectorize")
        return _loop("q", u["width"], lambda q: If(first + q < self.hidden, store(first + q)))

    def lstm(self, u, q, c, j):
        """c = f * c + i * g, then h = o * tanh(c) (gates i, o, f, c; peepholes on i and f
        see the previous cell, on o the new one)."""
        d, b, par, p, cell = u["d"], u["b"], u["parity"], self.p, self.c
        clip = self.clip

        def gate(gi):
            z = u["pre"](gi, q, c)  # P holds i, o, f: the gates' own order
            return z if p is None or gi == 3 else z + p[d, gi * self.hp + j] * cell[d, b, j]

        i = sigmoid(clip(gate(0)))
        f = _f(1.0) - i if self.spec["input_forget"] else sigmoid(clip(gate(2)))
        return seq(_store(cell, (d, b, j), f * cell[d, b, j] + i * tanh(clip(gate(3)))),
                   # (the cell is the new one from here on: o's peephole reads it)
                   _store(self.h, (1 - par, d, b, j), sigmoid(clip(gate(1))) * tanh(cell[d, b, j])))

    def gru(self, u, q, c, j):
        """h = (1 - z) * hh + z * h."""
        d, b, par = u["d"], u["b"], u["parity"]
        if self.zr is None:  # linear_before_reset: hh from r * (h @ Rh^T + Rbh)
            z, r = (sigmoid(self.clip(u["pre"](gi, q, c))) for gi in (0, 1))
            xw_h = self.xw[self.xrow(u["t"], b), d * self.cols + 2 * self.hp + j]
            pre = xw_h + r * (u["pre"](2, q, c) + self.rbh[d, j])
        else:
            z, pre = self.zr[d, b, 0, j], u["pre"](0, q, c)
        h = self.h[par, d, b, j]
        return _store(self.h, (1 - par, d, b, j), (_f(1.0) - z) * tanh(self.clip(pre)) + z * h)

    def rnn(self, u, q, c, j):
        return _store(self.h, (1 - u["parity"], u["d"], u["b"], j),
                     tanh(self.clip(u["pre"](0, q, c))))


def build_recurrent(spec: dict):
    """(the loop-IR function of a ``recurrent`` spec, its segments' statements in run
    order)."""
    return _Kernel(spec).build()


def compile_recurrent(spec: dict, *, use_cache: bool = True):
    """The compiled kernel of a ``recurrent`` spec: one function per distinct segment
    (init, each phase, tick, final), called in run order (the phases and tick once per
    time step), so the native pool runs each phase's work items on every thread."""
    import time

    from ..tensor.tir import verify
    from .codegen import CpuKernel, _load_or_compile
    from .emit import Segment, emit_module

    start = time.perf_counter()
    func, order = build_recurrent(spec)
    verify(func)
    segments = {}
    for stmt in order:
        if id(stmt) not in segments:
            symbol = f"recurrent_seg{len(segments)}"
            segments[id(stmt)] = Segment(symbol, stmt.body, stmt) if \
                isinstance(stmt, For) and stmt.kind == "parallel" else Segment(symbol, stmt)
    temps = _temps(func)
    llvm_ir = emit_module(func, temps, list(segments.values()))
    obj, path, hit = _load_or_compile(llvm_ir, use_cache)
    kernel = CpuKernel(func, llvm_ir, obj, temps, [segments[id(s)] for s in order], path, hit,
                       0.0)
    kernel.compile_seconds = time.perf_counter() - start
    return kernel


def _temps(func: PrimFunc) -> list:
    """The buffers allocated at the top of ``func`` (the runtime's temporaries)."""
    out, stmt = [], func.body
    while isinstance(stmt, Allocate):
        out.append(stmt.buffer)
        stmt = stmt.body
    return out
