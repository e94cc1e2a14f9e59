"""Every timing rule of the cycle model, as closed forms (docs/cycle_model.md).

The rules are the RTL's (hw/, docs/microarchitecture.md), cycle for cycle. The cycle model
(:mod:`celosia.sim.cycle`) schedules instructions on fetch, load, compute, store and the
shared DRAM read channel; everything it needs to know about one instruction is computed
here, once, as a *plan*:

* an ``int`` ``d``: the instruction, started in cycle ``t0``, is ready to push in cycle
  ``t0 + d`` (FINISH, GEMM, ALU, STORE, and LOADs that read nothing);
* a :class:`ReadPlan`: a LOAD that reads DRAM. Its bursts need the shared read channel, so
  their grant cycles come from the schedule; the plan holds every other time of the
  instruction *relative to its start, as if each burst were granted the cycle it is
  requested* (offsets), and the schedule shifts them by the waits it finds (a wait of ``w``
  cycles for a burst delays everything after it by ``w``, see :meth:`ReadPlan`).

Time base: cycle 0 is the cycle of the host's start write (``s`` in
docs/microarchitecture.md); the run's ``cycles`` is the first cycle in which the core is
finished, i.e. the last push + 1.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from dataclasses import dataclass, fields
from functools import cached_property, lru_cache

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError
from celosia.isa import (INSN_BYTES, AluInsn, AluOp, FinishInsn, GemmInsn, Insn, MemInsn,
                         Opcode, elem_bytes)

__all__ = ["Timing", "ReadPlan", "FetchBatch", "NEVER", "gemm_tree_stages", "alu_hazards",
           "one_uop_hazards", "TWO_STAGE_ALU_OPS"]

#: an offset earlier than any cycle (a bound that never binds)
NEVER = -(1 << 62)
# LOADs of at most this many rows are planned row by row in Python, longer ones with numpy.
_PY_ROWS = 32


# Plans are shared by every program that has the same instruction fields and never
# changed; they are not frozen dataclasses because a program's first run makes many, and a
# frozen __init__ costs four times a plain one.
class ReadPlan:
    """A LOAD that reads DRAM, as bursts on the shared read channel.

    For burst ``i`` (in order; a data row's DMA request is one or more bursts), offsets
    relative to the instruction's start ``t0`` if no burst ever waits for the channel:

    * ``req[i]``: the first cycle its ARVALID is high (the read arbiter can grant it);
    * ``first[i]``: the cycle its first beat is accepted, ``= max(grant + 1 + L, buf[i])``
      where ``buf[i]`` is the cycle the DMA's one-beat buffer can take it (narrow elements;
      ``NEVER`` otherwise);
    * ``span[i]``: cycles from the first beat to the RLAST beat (the channel is free again
      the cycle after RLAST);
    * ``push``: the cycle the instruction is ready to push.

    If burst ``i`` is granted ``w`` cycles after it is requested, every later time of the
    instruction moves by the same amount as its first beat does; the schedule keeps that
    shift (``delta``) and reads every other time off these offsets.

    The schedule usually needs only the first burst: when it is granted while no other unit
    asks for the channel, the rest of the LOAD is granted as requested. So a plan always
    holds the scalars that case uses (``n``, ``push``, ``beats``; the first burst's
    ``req0``, ``buf0``, ``first0``, ``span0`` and ``lat0`` = ``lat_after[0]``; ``end`` =
    the last burst's ``first + span``), and a plan of wide elements (Timing.load_plan)
    computes them per row in closed form, making the per-burst lists only when first read
    (a contended LOAD, the trace).
    """

    __slots__ = ("n", "push", "beats", "req0", "buf0", "first0", "span0", "lat0", "end",
                 "_lists", "_make", "_row")

    def __init__(self, req: list, buf: list, first: list, span: list, push: int, beats: int,
                 burst_beats: list, lat_after: list):
        self.n, self.push, self.beats = len(req), push, beats
        self.req0, self.buf0, self.first0, self.span0 = req[0], buf[0], first[0], span[0]
        self.lat0, self.end = lat_after[0], first[-1] + span[-1]
        self._lists = (req, buf, first, span, burst_beats, lat_after)
        self._make = self._row = None

    @classmethod
    def lazy(cls, n: int, push: int, beats: int, req0: int, buf0: int, first0: int,
             span0: int, lat0: int, end: int, make, row: tuple | None = None) -> "ReadPlan":
        """A plan from its scalars; ``make()`` returns the eager plan of the same LOAD
        (``make`` None: a plan of one burst, whose lists hold its scalars).
        ``row``: for one row of wide elements, (L + 1, beats of the first burst, of a whole
        burst, of the last burst), from which ``burst`` gives any burst's offsets."""
        plan = cls.__new__(cls)
        plan.n, plan.push, plan.beats = n, push, beats
        plan.req0, plan.buf0, plan.first0, plan.span0 = req0, buf0, first0, span0
        plan.lat0, plan.end = lat0, end
        plan._lists, plan._make, plan._row = None, make, row
        return plan

    def burst(self, i: int) -> tuple:
        """(req, buf, first, span) of burst i. One row of wide elements: in closed form
        (burst i is requested i * (L + 1) plus the beats before it after the first, and
        all bursts between the first and the last are whole)."""
        if i == 0:
            return self.req0, self.buf0, self.first0, self.span0
        row = self._row
        if row is not None and self._lists is None:
            step, first_beats, full, last_beats = row
            req = self.req0 + i * step + first_beats + (i - 1) * full
            return req, NEVER, req + step, (last_beats if i == self.n - 1 else full) - 1
        req, buf, first, span = self._expand()[:4]
        return req[i], buf[i], first[i], span[i]

    def lat_after_at(self, i: int) -> int:
        """lat_after[i]."""
        if self._row is not None and self._lists is None:
            return (self.n - 1 - i) * self._row[0]
        return self._expand()[5][i]

    def _expand(self) -> tuple:
        if self._lists is None:
            if self._make is None:  # one burst: its lists are the scalars
                self._lists = ([self.req0], [self.buf0], [self.first0], [self.span0],
                               [self.beats], [0])
            else:
                self._lists = self._make()._lists
                self._make = None
        return self._lists

    @property
    def req(self) -> list:
        return self._expand()[0]

    @property
    def buf(self) -> list:
        return self._expand()[1]

    @property
    def first(self) -> list:
        return self._expand()[2]

    @property
    def span(self) -> list:
        return self._expand()[3]

    @property
    def burst_beats(self) -> list:
        """Per burst, its number of beats (for the trace)."""
        return self._expand()[4]

    @property
    def lat_after(self) -> list:
        """lat_after[i]: sum over the bursts after i of (first - req), the latency those
        bursts see when none of them waits."""
        return self._expand()[5]

    def min_cycles(self) -> int:
        return self.push


@dataclass(slots=True, eq=False)
class FetchBatch:
    """One fetch batch (a DMA request of up to 8 instructions): its bursts
    (``span``, ``buf_after``: the cycle after a burst's RLAST at which the beat buffer can
    take the next burst's first beat, relative to RLAST; ``NEVER`` for wide elements) and,
    per instruction, its burst and the cycles from that burst's first beat to the
    instruction being readable at the head of fetch's buffer."""

    span: list
    buf_after: list
    burst_beats: list
    insn_burst: list
    insn_ready: list
    #: sum(burst_beats)
    beats: int = 0


def _bursts(a: np.ndarray, e: np.ndarray, eb: int, bus: int, burst: int):
    """Split DMA requests [a, e) (byte ranges, one per row, eb-aligned) into AXI bursts: the
    beat-aligned range, cut at every ``burst``-byte boundary. Returns per burst: its row,
    whether it is its row's first and last, beats, and (narrow elements) the request's
    elements in the burst and in its last beat."""
    A = a // bus * bus
    E = -(-e // bus) * bus
    w0 = A // burst
    nb = (E - 1) // burst - w0 + 1
    rows = a.size
    if int(nb.max()) == 1:
        row = np.arange(rows)
        k = np.zeros(rows, np.int64)
        bs, be = A, E
        first = last = np.ones(rows, bool)
    else:
        row = np.repeat(np.arange(rows), nb)
        k = np.arange(row.size) - np.repeat(np.cumsum(nb) - nb, nb)
        bs = np.maximum(A[row], (w0[row] + k) * burst)
        be = np.minimum(E[row], (w0[row] + k + 1) * burst)
        first = k == 0
        last = k == nb[row] - 1
    beats = (be - bs) // bus
    ar, er = a[row], e[row]
    elems = (np.minimum(er, be) - np.maximum(ar, bs)) // eb
    n_last = (np.minimum(er, be) - np.maximum(ar, be - bus)) // eb
    return row, first, last, beats, elems, n_last


#: ALU operations whose result is known one stage late: the micro-op right behind one of
#: them waits a cycle if it reads the row it writes (hw/alu.py)
TWO_STAGE_ALU_OPS = (AluOp.SHR, AluOp.MUL)


def gemm_tree_stages(block: int) -> int:
    """Register stages of the GEMM adder tree over ``block`` products, four terms summed per
    stage (hw/gemm.py tree_stages)."""
    stages, terms = 0, block
    while terms > 1:
        terms = -(-terms // 4)
        stages += 1
    return stages


def _request_bursts(a: int, e: int, eb: int, bus: int, burst: int) -> tuple[list, list, list]:
    """_bursts of one request [a, e) in Python (it has a few bursts at most): per burst,
    its beats, the request's elements in it and in its last beat."""
    pos, end = a // bus * bus, -(-e // bus) * bus
    beats, elems, n_last = [], [], []
    while pos < end:
        b_end = min(end, (pos // burst + 1) * burst)
        beats.append((b_end - pos) // bus)
        elems.append((min(e, b_end) - max(a, pos)) // eb)
        n_last.append((min(e, b_end) - max(a, b_end - bus)) // eb)
        pos = b_end
    return beats, elems, n_last


@dataclass(frozen=True, kw_only=True)
class Timing:
    """The timing parameters of one configuration and the closed forms built on them."""

    #: DRAM bus width, bytes per beat
    bus_bytes: int
    #: cycles from a read burst's AR handshake to its first beat (the RTL harness's DRAM
    #: model treats 0 as 1)
    read_latency: int
    #: cycles from a write burst's WLAST beat to its write response
    write_latency: int
    cmd_queue_depth: int
    token_queue_depth: int
    #: the GEMM/ALU pipeline stage that computes a micro-op's result (the loop counters'
    #: stage is 0; hw/compute.py exec_stage: 6 + the GEMM adder tree's stages); the
    #: micro-op writes ACC in the next stage
    exec_stage: int
    #: instructions fetch reads in one batch (hw/fetch.py FETCH_INSNS; also its buffer size)
    fetch_insns: int = 8
    #: cycles an instruction spends in fetch's check stages between the DMA and the buffer
    check_stages: int = 3
    #: whether SHR/MUL micro-ops wait for the row the micro-op before them writes
    hazard_stalls: bool = True

    def __post_init__(self):
        for name in ("bus_bytes", "read_latency", "write_latency", "cmd_queue_depth",
                     "token_queue_depth", "exec_stage", "fetch_insns"):
            if getattr(self, name) < 1:
                raise CelosiaError(f"Timing.{name} must be at least 1, not {getattr(self, name)}")

    def __hash__(self) -> int:
        """The fields' hash, computed once (a Timing keys the plan memo and each program's
        kept plans, looked up on every run)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple([getattr(self, f.name) for f in fields(self)]))
            self.__dict__["_hash"] = h
        return h

    @classmethod
    def from_config(cls, cfg: HwConfig, *, read_latency: int | None = None,
                    write_latency: int | None = None, **overrides) -> "Timing":
        """The configuration's timing; latencies default to ``cfg.dram_latency`` (at least 1,
        as in the RTL's DRAM model)."""
        lat = max(1, cfg.dram_latency)
        return cls(bus_bytes=cfg.bus_bytes,
                   read_latency=max(1, lat if read_latency is None else read_latency),
                   write_latency=max(1, lat if write_latency is None else write_latency),
                   cmd_queue_depth=cfg.cmd_queue_depth, token_queue_depth=cfg.token_queue_depth,
                   **{"exec_stage": 6 + gemm_tree_stages(cfg.block), **overrides})

    @classmethod
    def unpipelined(cls, cfg: HwConfig, **options) -> "Timing":
        """The timing of the RTL before its datapath was pipelined for FPGA clocks (issue
        15): a three-stage GEMM/ALU with transparent ACC reads and no stalls (GEMM/ALU push
        in t0 + N + 3), and fetch checking the buffer's head as it dispatches. For
        before/after comparisons (``celosia bench fpga``)."""
        return cls.from_config(cfg, exec_stage=1, check_stages=0, hazard_stalls=False,
                               **options)

    @cached_property
    def burst_bytes(self) -> int:
        """Bursts never cross a boundary of this many bytes (AXI's 4 KiB, 256 beats)."""
        return min(4096, 256 * self.bus_bytes)

    # ---- fetch ---------------------------------------------------------------------------

    #: the first batch is requested in this cycle (start in 0, program range check in 1)
    FIRST_FETCH = 2

    def fetch_batch(self, insn_addr: int, first: int, count: int) -> FetchBatch:
        """Instructions [first, first + count) as one DMA request of 16-byte elements."""
        return _fetch_batch(self, (insn_addr + first * INSN_BYTES) % self.burst_bytes, count)

    def _fetch_batch(self, addr: int, count: int) -> FetchBatch:
        bus = self.bus_bytes
        end = addr + count * INSN_BYTES
        if INSN_BYTES >= bus and INSN_BYTES % bus == 0 and addr % bus == 0 \
                and addr // self.burst_bytes == (end - 1) // self.burst_bytes:
            # the usual batch: whole beats in one burst (what the general case below gives
            # for it, without splitting: instruction j's last beat is (j + 1) * k - 1)
            k = INSN_BYTES // bus
            beats = count * k
            ready = 1 + self.check_stages
            return FetchBatch([beats - 1], [NEVER], [beats], [0] * count,
                              list(range(k + ready, count * k + ready + 1, k)), beats)
        return self._fetch_batch_general(addr, count)

    def _fetch_batch_general(self, addr: int, count: int) -> FetchBatch:
        """_fetch_batch of any batch: its request split into bursts."""
        bus = self.bus_bytes
        beats, elems, n_last = _request_bursts(addr, addr + count * INSN_BYTES, INSN_BYTES,
                                               bus, self.burst_bytes)
        insn_burst, insn_ready = [], []
        if INSN_BYTES >= bus:
            k = INSN_BYTES // bus
            span = [b - 1 for b in beats]
            buf_after = [NEVER] * len(beats)
            start = list(itertools.accumulate([0] + beats[:-1]))
            for j in range(count):
                beat = (j + 1) * k - 1  # its last beat, counted over the whole request
                b = bisect_right(start, beat) - 1  # the last burst starting by then
                insn_burst.append(b)
                # delivered the cycle after its last beat, checked, readable the cycle after
                insn_ready.append(beat - start[b] + 2 + self.check_stages)
        else:
            span = [e - n for e, n in zip(elems, n_last)]
            buf_after = list(n_last)
            start = list(itertools.accumulate([0] + elems[:-1]))
            for j in range(count):
                b = bisect_right(start, j) - 1
                insn_burst.append(b)
                # beats are accepted as the buffer drains: element m of the burst drains in
                # first + 1 + m, is checked, and is readable the cycle after
                insn_ready.append(j - start[b] + 2 + self.check_stages)
        return FetchBatch(span, buf_after, beats, insn_burst, insn_ready, sum(beats))

    # ---- per-instruction plans -----------------------------------------------------------

    def load_plan(self, insn: MemInsn, eb: int):
        """LOAD (TensorLoad, hw/tensor_load.py). The module starts in t0 and hands the
        command over in t0 + 1; the walker walks from t0 + 2, one cycle per padding element;
        at a data row's first element it requests the row from the DMA (cycle q: ARVALID
        from q + 1), then waits for the row's last element (wide elements: the cycle after
        the last beat; narrow: beats are taken as the one-beat buffer drains, one element per
        cycle) and walks on the cycle after. After the last row: one cycle to see the end,
        DONE, and PUSH the cycle after DONE."""
        W = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        if insn.x_size == 0:
            return 3  # the walker goes straight to DONE
        if insn.y_size == 0:
            return 2 + rows * W + 2
        if insn.y_size <= _PY_ROWS:
            if eb >= self.bus_bytes:
                return self._load_plan_wide(insn, eb)
            if insn.y_size == 1:
                return self._load_plan_narrow_row(insn, eb)
            return self._load_plan_rows(insn, eb)
        bus, L, burst = self.bus_bytes, self.read_latency, self.burst_bytes
        r = np.arange(insn.y_size, dtype=np.int64)
        a = (insn.dram_base + r * insn.x_stride) * eb
        e = a + insn.x_size * eb
        row, first, last, beats, elems, n_last = _bursts(a, e, eb, bus, burst)
        if eb >= bus:
            span = beats - 1
            tail = np.ones_like(beats)  # last element delivered the cycle after RLAST
            buf_gap = np.full_like(beats, L + 2)
        else:
            span = elems - n_last
            tail = n_last  # the last beat's elements drain one per cycle after it
            buf_gap = np.maximum(L + 2, n_last)
        # first[i] - first[i - 1]: from the previous first beat to RLAST (span), then either
        # to the next row's request (the row's last element, one cycle back to WALK,
        # x_pad_1 + x_pad_0 zeros, then request, grant, AR, latency) or, within a row, the
        # next burst's request the cycle after RLAST (and the beat buffer).
        row_gap = tail + 1 + insn.x_pad_1 + insn.x_pad_0 + 2 + L
        inc = np.empty_like(beats)
        inc[0] = 2 + insn.y_pad_0 * W + insn.x_pad_0 + 2 + L
        inc[1:] = span[:-1] + np.where(first[1:], row_gap[:-1], buf_gap[:-1])
        off_first = np.cumsum(inc)
        off_x = off_first + span
        off_req = np.empty_like(beats)
        off_req[first] = off_first[first] - 1 - L
        off_req[~first] = off_x[:-1][~first[1:]] + 1
        off_buf = np.full_like(beats, NEVER)
        if eb < bus:
            nf = ~first
            off_buf[nf] = (off_x[:-1] + n_last[:-1])[nf[1:]]
        push = int(off_x[-1] + tail[-1] + 1 + insn.x_pad_1 + insn.y_pad_1 * W + 2)
        lat = off_first - off_req
        lat_after = (np.cumsum(lat[::-1])[::-1] - lat).tolist()
        return ReadPlan(off_req.tolist(), off_buf.tolist(), off_first.tolist(), span.tolist(),
                        push, int(beats.sum()), beats.tolist(), lat_after)

    def _load_plan_wide(self, insn: MemInsn, eb: int) -> ReadPlan:
        """_load_plan_rows's plan for wide elements (``eb >= bus_bytes``), its scalars in
        closed form per row (the lists are made when first read). A wide burst's first beat
        is never held by the beat buffer: burst k of a row is requested the cycle after the
        previous RLAST (the row's first, x_pad_0 + 1 cycles into the row), has its first
        beat L + 1 cycles later and its RLAST beats - 1 after that; so a row of nb bursts
        and ``beats`` beats ends nb * (L + 1) + beats - 1 cycles after its first request,
        and the walk goes on two cycles (last element written, back to WALK) plus x_pad_1
        later."""
        bus, L, burst = self.bus_bytes, self.read_latency, self.burst_bytes
        W = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        row_bytes, stride = insn.x_size * eb, insn.x_stride * eb
        y = insn.y_size
        t = 2 + insn.y_pad_0 * W  # the walker, at the start of the first data row
        a = insn.dram_base * eb
        req0 = t + insn.x_pad_0 + 1
        pos, end = a // bus * bus, -(-(a + row_bytes) // bus) * bus
        first_beats = (min(end, (pos // burst + 1) * burst) - pos) // bus
        last_beats = (end - (end - 1) // burst * burst) // bus
        if eb % bus:  # elements of whole beats only (powers of two of at least a beat)
            return self._load_plan_rows(insn, eb)
        # every row has row_bytes / bus beats (its address is whole beats) and one burst
        # more than the burst boundaries inside it; those are the same in every row when
        # the stride is whole bursts
        beats = y * (row_bytes // bus)
        last = row_bytes - 1
        if stride % burst == 0:
            n = y * ((a + last) // burst - a // burst + 1)
        else:
            n = y + sum([(r + last) // burst - r // burst
                         for r in range(a, a + y * stride, stride)])
        # each row: its first request x_pad_0 + 1 cycles into it, per burst L + 1 cycles
        # from request to first beat, its beats, then the last element written and back to
        # WALK (2) and x_pad_1; the last row's last RLAST is those 2 + x_pad_1 before the end
        t += y * (insn.x_pad_0 + 1 + 2 + insn.x_pad_1 - 1) + n * (L + 1) + beats
        x = t - 2 - insn.x_pad_1
        push = t + insn.y_pad_1 * W + 2
        if n == 1:
            return ReadPlan.lazy(1, push, beats, req0, NEVER, req0 + 1 + L, first_beats - 1, 0,
                                 x, None)
        row = (L + 1, first_beats, burst // bus, last_beats) if insn.y_size == 1 else None
        return ReadPlan.lazy(n, push, beats, req0, NEVER, req0 + 1 + L, first_beats - 1,
                             (n - 1) * (L + 1), x, lambda: self._load_plan_wide_lists(insn, eb),
                             row)

    def _load_plan_narrow_row(self, insn: MemInsn, eb: int) -> ReadPlan:
        """_load_plan_rows for one row of narrow elements (micro-op loads) in one burst:
        requested x_pad_0 + 1 cycles into the row, first beat L + 1 later, RLAST once all
        but the last beat's elements have drained, the row's end once those have too."""
        bus, L, burst = self.bus_bytes, self.read_latency, self.burst_bytes
        a = insn.dram_base * eb
        e = a + insn.x_size * eb
        pos, end = a // bus * bus, -(-e // bus) * bus
        if pos // burst != (end - 1) // burst:  # bursts: the general rows
            return self._load_plan_rows(insn, eb)
        W = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        r = 2 + insn.y_pad_0 * W + insn.x_pad_0 + 1
        n_last = (e - max(a, end - bus)) // eb
        span = (e - a) // eb - n_last
        x = r + 1 + L + span
        push = x + n_last + 1 + insn.x_pad_1 + insn.y_pad_1 * W + 2
        return ReadPlan.lazy(1, push, (end - pos) // bus, r, NEVER, r + 1 + L, span, 0, x, None)

    def _load_plan_wide_lists(self, insn: MemInsn, eb: int) -> ReadPlan:
        """_load_plan_rows for wide elements, a row's bursts at a time: its bursts are the
        partial ones at its ends and whole ones between; burst k is requested
        k * (L + 1) + (the beats of the bursts before it) cycles after the first."""
        bus, L, burst = self.bus_bytes, self.read_latency, self.burst_bytes
        full, step = burst // bus, L + 1
        W = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        row_bytes, stride = insn.x_size * eb, insn.x_stride * eb
        req, first, span, beats_of = [], [], [], []
        t = 2 + insn.y_pad_0 * W
        a = insn.dram_base * eb
        for _ in range(insn.y_size):
            pos, end = a // bus * bus, -(-(a + row_bytes) // bus) * bus
            b_end = min(end, (pos // burst + 1) * burst)
            beats = [(b_end - pos) // bus]
            if b_end < end:
                last = (end - 1) // burst * burst
                beats += [full] * ((last - b_end) // burst)
                beats.append((end - last) // bus)
            reqs = list(itertools.accumulate([step + b for b in beats[:-1]],
                                             initial=t + insn.x_pad_0 + 1))
            req += reqs
            first += [r + step for r in reqs]
            span += [b - 1 for b in beats]
            beats_of += beats
            t = reqs[-1] + step + beats[-1] - 1 + 2 + insn.x_pad_1
            a += stride
        n = len(req)
        return ReadPlan(req, [NEVER] * n, first, span, t + insn.y_pad_1 * W + 2, sum(beats_of),
                        beats_of, [(n - 1 - i) * step for i in range(n)])

    def _load_plan_rows(self, insn: MemInsn, eb: int) -> ReadPlan:
        """load_plan one row and burst at a time (faster for a few rows; the same rules)."""
        bus, L, burst = self.bus_bytes, self.read_latency, self.burst_bytes
        narrow = eb < bus
        W = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        req, buf, first, span, beats_of = [], [], [], [], []
        t = 2 + insn.y_pad_0 * W  # the walker, at the start of the first data row
        for row in range(insn.y_size):
            a = (insn.dram_base + row * insn.x_stride) * eb
            e = a + insn.x_size * eb
            pos, end = a // bus * bus, -(-e // bus) * bus
            r = t + insn.x_pad_0 + 1  # the walker requests in t + x_pad_0, ARVALID after
            bound = NEVER
            while pos < end:
                b_end = min(end, (pos // burst + 1) * burst)
                beats = (b_end - pos) // bus
                f = r + 1 + L
                if bound > f:
                    f = bound
                if narrow:
                    hi = min(e, b_end)
                    n_last = (hi - max(a, b_end - bus)) // eb
                    sp, tail = (hi - max(a, pos)) // eb - n_last, n_last
                else:
                    sp, tail = beats - 1, 1
                x = f + sp
                req.append(r)
                buf.append(bound)
                first.append(f)
                span.append(sp)
                beats_of.append(beats)
                r = x + 1
                bound = x + tail if narrow else NEVER
                pos = b_end
            t = x + tail + 1 + insn.x_pad_1
        push = t + insn.y_pad_1 * W + 2
        lat_after, acc = [0] * len(req), 0
        for i in range(len(req) - 1, -1, -1):
            lat_after[i] = acc
            acc += first[i] - req[i]
        return ReadPlan(req, buf, first, span, push, sum(beats_of), beats_of, lat_after)

    def store_plan(self, insn: MemInsn, eb: int) -> tuple[int, int, int]:
        """STORE (TensorStore, hw/tensor_store.py): (push offset, write beats, bursts).

        Start t0, command t0 + 1, ROW from t0 + 2. Per row: ROW (1), then per burst AW (1),
        the W beats (wide elements: one per beat; narrow: per beat one FILL cycle per element
        and one SEND cycle), and the write response ``write_latency`` cycles after WLAST
        (the next state follows it). The ROW that finds no row left is DONE; PUSH follows."""
        if insn.x_size == 0 or insn.y_size == 0:
            return 3, 0, 0
        bus = self.bus_bytes
        if insn.y_size <= _PY_ROWS:  # row by row: the same sums, faster for a few rows
            burst, row_bytes = self.burst_bytes, insn.x_size * eb
            beats = bursts = 0
            for row in range(insn.y_size):
                a = (insn.dram_base + row * insn.x_stride) * eb
                lo, hi = a // bus * bus, -(-(a + row_bytes) // bus) * bus
                beats += (hi - lo) // bus  # bursts cut the beat range at multiples of bus
                bursts += (hi - 1) // burst - lo // burst + 1
            w = beats if eb >= bus else insn.y_size * insn.x_size + beats
            total = w + bursts * (1 + self.write_latency) + insn.y_size
            return 2 + total + 1, beats, bursts
        r = np.arange(insn.y_size, dtype=np.int64)
        a = (insn.dram_base + r * insn.x_stride) * eb
        _, _, _, beats, elems, _ = _bursts(a, a + insn.x_size * eb, eb, bus, self.burst_bytes)
        w = beats if eb >= bus else elems + beats
        total = int(w.sum()) + beats.size * (1 + self.write_latency) + insn.y_size
        return 2 + total + 1, int(beats.sum()), int(beats.size)

    def loop_cycles(self, n: int, stalls: int = 0) -> int:
        """GEMM/ALU (hw/compute.py) with ``n`` micro-ops, ``stalls`` of which wait a cycle:
        the micro-op generator issues in t0 + 1 .. t0 + n + stalls, the last micro-op writes
        ``exec_stage + 1`` cycles after its issue (forwarding, no other stalls) and PUSH is
        the cycle after; with no micro-op, PUSH is t0 + 2."""
        return n + stalls + self.exec_stage + 2 if n else 2

    def loop_plan(self, insn) -> int:
        """GEMM/ALU without hazard stalls (those depend on the micro-ops: alu_hazards)."""
        return self.loop_cycles(insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn))

    def drain_cycles(self, insn) -> int:
        """The cycles of a GEMM/ALU spent only waiting for its last micro-op to leave the
        pipeline (from the cycle after its last issue to its last write)."""
        n = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        return self.exec_stage + 1 if n else 0

    def plan(self, insn: Insn, cfg: HwConfig):
        """The plan of any instruction."""
        if isinstance(insn, MemInsn):
            eb = elem_bytes(cfg, insn.mem_type)
            if insn.opcode == Opcode.STORE:
                return self.store_plan(insn, eb)[0]
            return self.load_plan(insn, eb)
        if isinstance(insn, (GemmInsn, AluInsn)):
            return self.loop_plan(insn)
        assert isinstance(insn, FinishInsn)
        return 1  # PUSH the cycle after the start


def alu_hazards(insn: AluInsn, dst: np.ndarray, src: np.ndarray) -> int:
    """The cycles a SHR or MUL ALU instruction stalls (hw/compute.py, stage R): one per
    micro-op that reads the ACC row written by the micro-op right before it (its dst; or its
    src, unless the instruction uses its immediate). ``dst``/``src``: the micro-ops' fields
    (uop_bgn .. uop_end). Counted in closed form over the loops, never per execution:
    consecutive executions are (i, j, k) -> (i, j, k+1), (i, j, last) -> (i, j+1, first) and
    (i, last j, last) -> (i+1, 0, first); rows are ``field + i * factor_out + j * factor_in``,
    so each pair's condition is fixed or linear in (i, j)."""
    if insn.alu_op not in TWO_STAGE_ALU_OPS:
        return 0
    u, I, J = len(dst), insn.iter_out, insn.iter_in
    if u == 0 or I == 0 or J == 0:
        return 0
    d = np.asarray(dst, np.int64)
    s = np.asarray(src, np.int64)
    Fo, Fi, Go, Gi = (insn.dst_factor_out, insn.dst_factor_in, insn.src_factor_out,
                      insn.src_factor_in)
    reads_src = not insn.use_imm
    total = 0
    if u > 1:  # within one pass over the micro-ops, at every (i, j)
        same = d[1:] == d[:-1]
        total += int(same.sum()) * I * J
        if reads_src:  # s[k+1] + i*Go + j*Gi == d[k] + i*Fo + j*Fi
            total += _solutions(Fo - Go, Fi - Gi, (s[1:] - d[:-1])[~same], I, J)
    if J > 1:  # (i, j, last) -> (i, j + 1, first), j < J - 1
        if d[0] + Fi == d[-1]:
            total += I * (J - 1)
        elif reads_src:  # s[0] + i*Go + (j+1)*Gi == d[-1] + i*Fo + j*Fi
            total += _solutions(Go - Fo, Gi - Fi, np.array([d[-1] - s[0] - Gi]), I, J - 1)
    if I > 1:  # (i, J - 1, last) -> (i + 1, 0, first), i < I - 1
        if d[0] + Fo == d[-1] + (J - 1) * Fi:
            total += I - 1
        elif reads_src:  # s[0] + (i+1)*Go == d[-1] + i*Fo + (J-1)*Fi
            total += _solutions(Go - Fo, 0, np.array([d[-1] + (J - 1) * Fi - s[0] - Go]),
                                I - 1, 1)
    return total


def one_uop_hazards(insn: AluInsn) -> int:
    """alu_hazards of a SHR/MUL with one micro-op and an immediate operand, which do not
    depend on the micro-op: consecutive executions (i, j) -> (i, j + 1) write and read the
    same row when dst_factor_in is 0, and (i, last j) -> (i + 1, 0) when dst_factor_out =
    (iter_in - 1) x dst_factor_in."""
    if insn.alu_op not in TWO_STAGE_ALU_OPS or insn.uop_end - insn.uop_bgn != 1:
        raise ValueError("one_uop_hazards: a SHR/MUL ALU instruction of one micro-op only")
    I, J, Fo, Fi = insn.iter_out, insn.iter_in, insn.dst_factor_out, insn.dst_factor_in
    total = I * (J - 1) if J > 1 and Fi == 0 else 0
    if I > 1 and Fo == (J - 1) * Fi:
        total += I - 1
    return total


def _solutions(a: int, b: int, c: np.ndarray, I: int, J: int) -> int:
    """The number of (i, j, m) with 0 <= i < I, 0 <= j < J and a*i + b*j == c[m]."""
    if c.size == 0:
        return 0
    values, counts = np.unique(c, return_counts=True)
    if a == 0 and b == 0:
        return int(counts[values == 0].sum()) * I * J
    if b == 0:  # swap: solve for i, j free
        a, b, I, J = b, a, J, I
    total = 0
    # a*i + b*j == v, b != 0: for each i, j = (v - a*i) / b must be a whole number in [0, J)
    i = np.arange(I, dtype=np.int64)
    step = max(1, (1 << 20) // I)  # bound the (values x i) block
    for k in range(0, values.size, step):
        rest = values[k:k + step, None] - a * i[None, :]
        q, r = np.divmod(rest, b)
        ok = (r == 0) & (q >= 0) & (q < J)
        total += int((ok.sum(axis=1) * counts[k:k + step]).sum())
    return total


@lru_cache(maxsize=1024)
def _fetch_batch(timing: Timing, addr: int, count: int) -> FetchBatch:
    """Timing.fetch_batch by (timing, address within a burst window, count): batches repeat."""
    return timing._fetch_batch(addr, count)
