"""The cycle model: fsim's values with time (``--target cycle``).

A run has two passes:

1. **Values.** fsim's own token machine runs the program with the shared
   :class:`~celosia.sim.datapath.Datapath`, so the final DRAM, the counters, every
   :class:`ProgramError` and every deadlock report are fsim's by construction. As each
   instruction executes, :class:`~celosia.sim.cycle_timing.Timing` turns it into a
   :class:`~celosia.sim.cycle_timing.Plan` (its busy cycles, DRAM beats and GEMM/ALU hazard
   stalls; micro-ops are read from the UOP buffer as they are at that moment).
2. **Time.** :class:`_Schedule` places every instruction in time: fetch (bursts over the DRAM
   read channel, dispatch into bounded command queues), load, compute and store (in order,
   under the token rules of docs/isa.md with bounded token queues), and the DRAM read
   channel, which serves requests in request order. It is a discrete-event loop over
   instructions, not cycles: each unit is a generator that runs ahead, computing start and
   end times as maxima of times already known, and blocks only on an event another unit has
   not reached yet or on a DRAM read, which is granted once no unit can still ask earlier.

The timing rules themselves live in cycle_timing.py; statistics, the Perfetto trace and the
PNG timeline in cycle_report.py. docs/cycle_model.md describes all three.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError, SimulationLimitError
from celosia.isa import AluInsn, GemmInsn, Insn, MemInsn, MemType, Module, module_of

from .cycle_report import plot_timeline, timeline_stats, write_trace
from .cycle_timing import READ, Plan, Timing
from .fsim import TOKEN_QUEUES, FunctionalSimulator, _TokenMachine, load_program, pops_of, pushes_of

__all__ = ["CycleSimulator", "Timeline", "Timing", "plot_timeline"]

_MODULE_NAMES = {Module.LOAD: "load", Module.COMPUTE: "compute", Module.STORE: "store"}
# Fixed priority on the DRAM read channel for requests made in the same cycle.
_READ_PRIORITY = {"fetch": 0, "load": 1, "compute": 2, "store": 3}
# Plans of GEMM/ALU instructions with at most this many micro-ops are memoised (at most
# _CACHED_PLANS of them per run).
_CACHED_UOPS, _CACHED_PLANS = 256, 4096


class CycleSimulator(FunctionalSimulator):
    """fsim's values plus a cycle count and per-module utilisation (docs/cycle_model.md).

    Options: ``max_cycles`` (a run longer than this raises SimulationLimitError),
    ``trace`` (path of a Chrome/Perfetto JSON trace written after each run), ``timing``
    (a :class:`Timing` replacing the configuration's defaults) and fsim's ``max_uop_execs``.
    After a run, :attr:`timeline` holds the per-instruction times.
    """

    name = "cycle"
    models_time = True

    def __init__(self, config: HwConfig, dram_size: int, *, max_cycles: int = 10**10,
                 trace: str | Path | None = None, timing: Timing | None = None,
                 max_uop_execs: int = 1 << 34):
        super().__init__(config, dram_size, max_uop_execs=max_uop_execs)
        if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or max_cycles < 1:
            raise CelosiaError(f"max_cycles must be a positive integer, not {max_cycles!r}")
        if timing is not None and not isinstance(timing, Timing):
            raise CelosiaError(f"timing must be a celosia.sim.cycle.Timing, not {timing!r}")
        self.max_cycles = max_cycles
        self.trace = Path(trace) if trace is not None else None
        self.timing = timing or Timing.from_config(config)
        self.timeline: Timeline | None = None

    def run(self, insn_addr: int, insn_count: int) -> dict:
        insns = load_program(self.dram, insn_addr, insn_count, self.config)
        self.datapath.reset_counters()
        self.timeline = None
        plans = self._execute(insns)
        timeline = _Schedule(insns, plans, self.timing, insn_addr).run(self.max_cycles)
        self.timeline = timeline
        stats = dict(self.datapath.counters)
        stats.update(timeline_stats(timeline, self.config, stats))
        if self.trace is not None:
            write_trace(timeline, self.trace)
        return stats

    def _execute(self, insns: list[Insn]) -> list[Plan]:
        """Pass 1: fsim's token machine and datapath, recording each instruction's plan.

        Each module runs its instructions one after another, so the sum of their shortest
        durations bounds the run from below: crossing ``max_cycles`` stops the run before
        the datapath does the work of an instruction that cannot fit."""
        timing, datapath, cfg = self.timing, self.datapath, self.config
        latency, limit = timing.dram_latency, self.max_cycles
        plans: list[Plan | None] = [None] * len(insns)
        lower = [0, 0, 0]
        elem_bytes = {mt: cfg.elem_bytes(mt) for mt in MemType}
        # Programs repeat the same micro-op kernels: a GEMM/ALU plan depends only on the
        # loop fields, the kind of reads and the micro-ops, so short kernels are memoised.
        loop_plans: dict = {}

        def check(index: int, module: int, cycles: int) -> None:
            if cycles > limit:
                raise SimulationLimitError(
                    f"instruction {index}: the {_MODULE_NAMES[Module(module)]} module alone "
                    f"needs more than max_cycles={limit} cycles by this instruction; raise "
                    f"max_cycles (--max-cycles) if the program is meant to run this long")

        def execute(index: int, insn: Insn) -> None:
            module = modules[index]
            if isinstance(insn, (GemmInsn, AluInsn)):
                check(index, module, lower[module] + timing.loop_min_cycles(insn))
                datapath.execute(index, insn)
                plan = key = None
                if insn.uop_end - insn.uop_bgn <= _CACHED_UOPS:
                    gemm = isinstance(insn, GemmInsn)
                    key = (gemm, insn.reset if gemm else insn.use_imm, insn.iter_out,
                           insn.iter_in, insn.dst_factor_out, insn.dst_factor_in,
                           insn.src_factor_out, insn.src_factor_in,
                           datapath.uop[insn.uop_bgn:insn.uop_end].tobytes())
                    plan = loop_plans.get(key)
                if plan is None:
                    plan = timing.loop_plan(insn, datapath)
                    if key is not None and len(loop_plans) < _CACHED_PLANS:
                        loop_plans[key] = plan
            elif isinstance(insn, MemInsn):
                datapath.execute(index, insn)
                plan = timing.mem_plan(insn, elem_bytes[insn.mem_type])
            else:
                datapath.execute(index, insn)
                plan = timing.plan(insn, cfg, datapath)
            lower[module] += plan.min_cycles(latency)
            check(index, module, lower[module])
            plans[index] = plan

        machine = _TokenMachine(insns, cfg, execute)
        modules = machine.modules
        machine.run()
        return plans  # type: ignore[return-value]


@dataclass
class Timeline:
    """Per-instruction times of one run (cycles; -1 where not applicable).

    ``free``: when the module finished its previous instruction (its pushes done);
    ``dispatch``: when fetch put the instruction into its command queue; ``avail``: when
    its bytes had arrived; ``start``/``done``: execution; ``push``: pushes done;
    ``req``/``data``: a READ's request and first beat; ``tok_ready``/``room_ready``: per
    popped/pushed queue (columns in pops_of/pushes_of order), when the token or the room
    became visible; ``bursts``: fetch bursts (request, first beat, beats, first, count).
    """

    insns: list
    plans: list
    timing: Timing
    module: np.ndarray
    free: np.ndarray
    dispatch: np.ndarray
    avail: np.ndarray
    start: np.ndarray
    done: np.ndarray
    push: np.ndarray
    req: np.ndarray
    data: np.ndarray
    pop_q: np.ndarray  # (n, 2) token queue ids popped, -1 for none
    push_q: np.ndarray
    tok_ready: np.ndarray  # (n, 2)
    room_ready: np.ndarray
    bursts: np.ndarray  # (bursts, 5)

    @property
    def cycles(self) -> int:
        return int(self.push.max())

    def trace(self) -> dict:
        """The Chrome/Perfetto trace of this run, as a dict."""
        from .cycle_report import trace_dict

        return trace_dict(self)


class _Schedule:
    """Pass 2: the times of every instruction (see the module docstring)."""

    def __init__(self, insns: list[Insn], plans: list[Plan], timing: Timing, insn_addr: int):
        n = len(insns)
        self.insns, self.plans, self.timing, self.insn_addr = insns, plans, timing, insn_addr
        self.module = [int(module_of(i)) for i in insns]
        self.seq = {m: [] for m in range(3)}
        self.local = [0] * n
        for j, m in enumerate(self.module):
            self.local[j] = len(self.seq[m])
            self.seq[m].append(j)
        # Token queues (as indices into TOKEN_QUEUES) each instruction pops and pushes; they
        # depend only on the module and the four flags, so each combination is asked once.
        qid = {q: k for k, q in enumerate(TOKEN_QUEUES)}
        flags: dict = {}
        self.pops, self.pushes = [], []
        for m, insn in zip(self.module, insns):
            key = (m, insn.deps)
            if key not in flags:
                flags[key] = (tuple(qid[q] for q in pops_of(Module(m), insn)),
                              tuple(qid[q] for q in pushes_of(Module(m), insn)))
            pops, pushes = flags[key]
            self.pops.append(pops)
            self.pushes.append(pushes)
        neg = [-1] * n
        self.free, self.dispatch, self.avail = neg[:], neg[:], neg[:]
        self.start, self.done, self.push, self.req, self.data = neg[:], neg[:], neg[:], neg[:], neg[:]
        self.tok_ready = [neg[:], neg[:]]
        self.room_ready = [neg[:], neg[:]]
        self.push_t: list[list[int]] = [[] for _ in TOKEN_QUEUES]
        self.pop_t: list[list[int]] = [[] for _ in TOKEN_QUEUES]
        self.bursts: list[tuple[int, int, int, int, int]] = []
        self.waiters: dict = {}
        self.runnable: list = []

    def _notify(self, key) -> None:
        unit = self.waiters.pop(key, None)
        if unit is not None:
            self.runnable.append((unit, None))

    # ---- units (generators: yield None = blocked on a registered key; yield (r, beats) =
    # ---- a DRAM read requested at cycle r, resumed with the cycle of its first beat) --------

    def _fetch(self, me):
        t = self.timing
        n, depth, slot = len(self.insns), t.cmd_queue_depth, t.cmd_slot_latency
        j, last, request = 0, -1, 0
        while j < n:
            count = min(t.fetch_burst_insns, n - j)
            beats = t.fetch_beats(self.insn_addr, j, count)
            first_beat = yield (request, beats)
            self.bursts.append((request, first_beat, beats, j, count))
            for k in range(count):
                avail = first_beat + t.fetch_arrival(self.insn_addr, j, k)
                when = max(avail, last + 1)
                m, local = self.module[j], self.local[j]
                if local >= depth:  # room once the instruction `depth` ahead has started
                    ahead = self.seq[m][local - depth]
                    if self.start[ahead] < 0:
                        self.waiters[("s", ahead)] = me
                        yield None
                    when = max(when, self.start[ahead] + slot)
                self.avail[j] = avail
                self.dispatch[j] = when
                self._notify(("d", j))
                last = when
                j += 1
            request = last + 1

    def _module(self, me, m: int):
        t = self.timing
        tok_lat, disp_lat, depth = t.token_latency, t.dispatch_latency, t.token_queue_depth
        waiters, push_t, pop_t = self.waiters, self.push_t, self.pop_t
        free = 0
        for j in self.seq[m]:
            if self.dispatch[j] < 0:
                waiters[("d", j)] = me
                yield None
            s = max(free, self.dispatch[j] + disp_lat)
            for col, q in enumerate(self.pops[j]):
                k = len(pop_t[q])
                if k >= len(push_t[q]):
                    waiters[("push", q, k)] = me
                    yield None
                ready = push_t[q][k] + tok_lat
                self.tok_ready[col][j] = ready
                if ready > s:
                    s = ready
            self.free[j], self.start[j] = free, s
            self._notify(("s", j))
            for q in self.pops[j]:
                pop_t[q].append(s)
                self._notify(("pop", q, len(pop_t[q]) - 1))
            plan = self.plans[j]
            if plan.kind == READ:
                r = s + plan.issue
                first_beat = yield (r, plan.beats)
                self.req[j], self.data[j] = r, first_beat
                c = first_beat + plan.beats + plan.work
            else:
                c = s + plan.issue + plan.beats + plan.work
            self.done[j] = p = c
            for col, q in enumerate(self.pushes[j]):
                k = len(push_t[q])
                if k >= depth:  # room once the token `depth` ahead has been popped
                    if len(pop_t[q]) <= k - depth:
                        waiters[("pop", q, k - depth)] = me
                        yield None
                    room = pop_t[q][k - depth] + tok_lat
                    self.room_ready[col][j] = room
                    if room > p:
                        p = room
            for q in self.pushes[j]:
                push_t[q].append(p)
                self._notify(("push", q, len(push_t[q]) - 1))
            self.push[j] = free = p

    # ---- the loop -----------------------------------------------------------------------

    def run(self, max_cycles: int) -> Timeline:
        latency = self.timing.dram_latency
        units = {}
        for name in ("fetch", "load", "compute", "store"):
            me = _READ_PRIORITY[name]
            units[me] = (self._fetch(me) if name == "fetch"
                         else self._module(me, int(getattr(Module, name.upper()))))
        self.runnable = [(me, None) for me in units]
        heap: list[tuple[int, int, int]] = []
        channel_free = 0
        finished = set()
        while True:
            while self.runnable:
                me, value = self.runnable.pop()
                try:
                    request = units[me].send(value)
                except StopIteration:
                    finished.add(me)
                    continue
                if request is not None:
                    heapq.heappush(heap, (request[0], me, request[1]))
            if not heap:
                break
            r, me, beats = heapq.heappop(heap)
            if r > max_cycles:
                raise SimulationLimitError(
                    f"the run passed max_cycles={max_cycles} cycles; raise max_cycles "
                    f"(--max-cycles) if the program is meant to run this long")
            first_beat = max(r + latency, channel_free)
            channel_free = first_beat + beats
            self.runnable.append((me, first_beat))
        if len(finished) != len(units):  # fsim found no deadlock, so this is a model bug
            raise CelosiaError("cycle model: the schedule stopped before every instruction "
                               "ran (an internal error; please report it with the program)")
        timeline = self._timeline()
        if timeline.cycles > max_cycles:
            raise SimulationLimitError(
                f"the run takes {timeline.cycles} cycles, more than max_cycles={max_cycles}; "
                f"raise max_cycles (--max-cycles) if the program is meant to run this long")
        return timeline

    def _timeline(self) -> Timeline:
        def arr(values):
            return np.asarray(values, dtype=np.int64)

        def cols(seqs):
            out = np.full((len(seqs), 2), -1, np.int64)
            for j, qs in enumerate(seqs):
                out[j, :len(qs)] = qs
            return out

        return Timeline(
            insns=self.insns, plans=self.plans, timing=self.timing, module=arr(self.module),
            free=arr(self.free), dispatch=arr(self.dispatch), avail=arr(self.avail),
            start=arr(self.start), done=arr(self.done), push=arr(self.push), req=arr(self.req),
            data=arr(self.data), pop_q=cols(self.pops), push_q=cols(self.pushes),
            tok_ready=arr(self.tok_ready).T.copy(), room_ready=arr(self.room_ready).T.copy(),
            bursts=arr(self.bursts).reshape(-1, 5))
