"""The cycle model: fsim's values with time (``--target cycle``).

A run has two passes:

1. **Values.** fsim's own token machine runs the program with the shared
   :class:`~celosia.sim.datapath.Datapath`, so the final DRAM, the counters, every
   :class:`ProgramError` and every deadlock report are fsim's by construction. As each
   instruction executes, :class:`~celosia.sim.cycle_timing.Timing` turns it into a plan:
   the cycles from its start to its push, or for a LOAD that reads DRAM a
   :class:`~celosia.sim.cycle_timing.ReadPlan` (its read bursts, timed as if the read
   channel were free).
2. **Time.** :class:`_Schedule` places every instruction in time, following the RTL's rules
   (docs/microarchitecture.md): fetch (batches of 8 instructions read over the DRAM read
   channel, dispatch into bounded command queues), load, compute and store (in order, under
   the token rules of docs/isa.md with bounded token queues), and the read arbiter (one
   burst at a time, registered round-robin between fetch, load and compute). It is a
   discrete-event loop over instructions and read bursts, not cycles: each unit is a
   generator that runs ahead, computing times as maxima of times already known, and blocks
   only on an event another unit has not reached yet or on a read burst, which the arbiter
   grants once every unit is blocked (then no unit can still ask earlier).

The timing rules themselves live in cycle_timing.py; statistics, the Perfetto trace and the
PNG timeline in cycle_report.py. docs/cycle_model.md describes all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError, SimulationLimitError
from celosia.isa import AluInsn, GemmInsn, Insn, MemInsn, MemType, Module, Opcode, module_of

from .cycle_report import plot_timeline, timeline_stats, write_trace
from .cycle_timing import NEVER, Timing
from .fsim import TOKEN_QUEUES, FunctionalSimulator, _TokenMachine, load_program, pops_of, pushes_of

__all__ = ["CycleSimulator", "Timeline", "Timing", "plot_timeline"]

_MODULE_NAMES = {Module.LOAD: "load", Module.COMPUTE: "compute", Module.STORE: "store"}
# LOAD/STORE plans are memoised per run (at most this many).
_CACHED_PLANS = 4096


class CycleSimulator(FunctionalSimulator):
    """fsim's values plus a cycle count and per-module utilisation (docs/cycle_model.md).

    Options: ``max_cycles`` (a run longer than this raises SimulationLimitError),
    ``trace`` (path of a Chrome/Perfetto JSON trace written after each run), ``timing``
    (a :class:`Timing` replacing the configuration's defaults), ``read_latency`` and
    ``write_latency`` (the DRAM model's, as the rtl target's options; default the
    configuration's dram_latency) and fsim's ``max_uop_execs``. After a run,
    :attr:`timeline` holds the per-instruction times.
    """

    name = "cycle"
    models_time = True

    def __init__(self, config: HwConfig, dram_size: int, *, max_cycles: int = 10**10,
                 trace: str | Path | None = None, timing: Timing | None = None,
                 read_latency: int | None = None, write_latency: int | None = None,
                 max_uop_execs: int = 1 << 34):
        super().__init__(config, dram_size, max_uop_execs=max_uop_execs)
        if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or max_cycles < 1:
            raise CelosiaError(f"max_cycles must be a positive integer, not {max_cycles!r}")
        if timing is not None and not isinstance(timing, Timing):
            raise CelosiaError(f"timing must be a celosia.sim.cycle.Timing, not {timing!r}")
        self.max_cycles = max_cycles
        self.trace = Path(trace) if trace is not None else None
        if timing is not None and (read_latency is not None or write_latency is not None):
            raise CelosiaError("give either timing or read_latency/write_latency, not both")
        self.timing = timing or Timing.from_config(config, read_latency=read_latency,
                                                   write_latency=write_latency)
        self.timeline: Timeline | None = None

    def run(self, insn_addr: int, insn_count: int) -> dict:
        insns = load_program(self.dram, insn_addr, insn_count, self.config)
        self.datapath.reset_counters()
        self.timeline = None
        plans, writes = self._execute(insns)
        timeline = _Schedule(insns, plans, self.timing, insn_addr).run(self.max_cycles)
        timeline.writes = writes
        self.timeline = timeline
        stats = dict(self.datapath.counters)
        stats.update(timeline_stats(timeline, self.config, stats))
        if self.trace is not None:
            write_trace(timeline, self.trace)
        return stats

    def _execute(self, insns: list[Insn]) -> tuple[list, dict]:
        """Pass 1: fsim's token machine and datapath, recording each instruction's plan.

        Each module runs its instructions one after another, so the sum of their shortest
        durations bounds the run from below: crossing ``max_cycles`` stops the run before
        the datapath does the work of an instruction that cannot fit. Also returns, per
        STORE, its write beats and bursts."""
        timing, datapath, cfg = self.timing, self.datapath, self.config
        writes: dict = {}
        limit = self.max_cycles
        plans: list = [None] * len(insns)
        lower = [0, 0, 0]
        elem_bytes = {mt: cfg.elem_bytes(mt) for mt in MemType}
        mem_plans: dict = {}

        def check(index: int, module: int, cycles: int) -> None:
            if cycles > limit:
                raise SimulationLimitError(
                    f"instruction {index}: the {_MODULE_NAMES[Module(module)]} module alone "
                    f"needs more than max_cycles={limit} cycles by this instruction; raise "
                    f"max_cycles (--max-cycles) if the program is meant to run this long")

        def execute(index: int, insn: Insn) -> None:
            module = modules[index]
            if isinstance(insn, (GemmInsn, AluInsn)):
                plan = timing.loop_plan(insn)
                check(index, module, lower[module] + plan)
            elif isinstance(insn, MemInsn):
                # LOAD/STORE plans depend on the fields other than sram_base and the flags
                key = (insn.opcode, insn.mem_type, insn.dram_base, insn.y_size, insn.x_size,
                       insn.x_stride, insn.y_pad_0, insn.y_pad_1, insn.x_pad_0, insn.x_pad_1)
                plan = mem_plans.get(key)
                if plan is None:
                    eb = elem_bytes[insn.mem_type]
                    plan = (timing.store_plan(insn, eb) if insn.opcode == Opcode.STORE
                            else timing.load_plan(insn, eb))
                    if len(mem_plans) < _CACHED_PLANS:
                        mem_plans[key] = plan
                if isinstance(plan, tuple):  # STORE: (push offset, write beats, bursts)
                    writes[index] = plan[1:]
                    plan = plan[0]
            else:
                plan = timing.plan(insn, cfg)
            lower[module] += (plan if isinstance(plan, int) else plan.push) + 1
            check(index, module, lower[module])
            datapath.execute(index, insn)
            plans[index] = plan

        machine = _TokenMachine(insns, cfg, execute)
        modules = machine.modules
        machine.run()
        return plans, writes


@dataclass
class Timeline:
    """Per-instruction times of one run (cycles from the start write; -1 where not
    applicable).

    ``free``: the first cycle the module could start this instruction (the cycle after its
    previous push; 0 for its first); ``dispatch``: when fetch wrote it into its command
    queue; ``avail``: when it was readable in fetch's buffer; ``start``: the module took it
    (and its tokens); ``done``: the first cycle it could push (the PUSH state); ``push``:
    the cycle it pushed (its last cycle); ``rd_wait``/``rd_lat``: over its read bursts,
    cycles waiting for the read arbiter (request to grant) and from grant to first beat;
    ``tok_ready``/``room_ready``: per popped/pushed queue (columns in pops_of/pushes_of
    order), the first cycle the token or the room was there; ``batches``: fetch batches
    (request cycle, first instruction, count); ``reads``: the read bursts granted one at a
    time and the starts of bulk grants (see :meth:`read_bursts`).
    """

    insns: list
    plans: list
    timing: Timing
    insn_addr: int
    module: np.ndarray
    free: np.ndarray
    dispatch: np.ndarray
    avail: np.ndarray
    start: np.ndarray
    done: np.ndarray
    push: np.ndarray
    rd_wait: np.ndarray
    rd_lat: np.ndarray
    pop_q: np.ndarray  # (n, 2) token queue ids popped, -1 for none
    push_q: np.ndarray
    tok_ready: np.ndarray  # (n, 2)
    room_ready: np.ndarray
    batches: np.ndarray  # (batches, 3)
    reads: list  # (client, index, burst, request, grant, first beat, delta, bulk)
    #: per STORE instruction: (write beats, write bursts)
    writes: dict = None  # type: ignore[assignment]

    @property
    def cycles(self) -> int:
        return int(self.push.max()) + 1

    def read_bursts(self) -> np.ndarray:
        """Every read burst of the run, in grant order: rows of (client, index, request,
        grant, first beat, RLAST), client 0 = fetch (index: batch), 1 = load, 2 = compute
        (index: instruction)."""
        out = []
        for client, idx, i, r, g, f, delta, bulk in self.reads:
            if client == 0:
                span = self._batch(idx).span
                out.append((0, idx, r, g, f, f + span[i]))
                continue
            plan, t0 = self.plans[idx], int(self.start[idx])
            out.append((client, idx, r, g, f, f + plan.span[i]))
            if bulk:
                for k in range(i + 1, plan.n):
                    fk = t0 + plan.first[k] + delta
                    rk = t0 + plan.req[k] + delta
                    out.append((client, idx, rk, rk, fk, fk + plan.span[k]))
        return np.array(out, np.int64).reshape(-1, 6)

    def _batch(self, b: int):
        first, count = int(self.batches[b, 1]), int(self.batches[b, 2])
        return self.timing.fetch_batch(self.insn_addr, first, count)

    def trace(self) -> dict:
        """The Chrome/Perfetto trace of this run, as a dict."""
        from .cycle_report import trace_dict

        return trace_dict(self)


class _Schedule:
    """Pass 2: the times of every instruction (see the module docstring).

    Units are generators. ``yield None``: blocked on an event registered in ``waiters``;
    ``yield r``: a read burst whose ARVALID rises in cycle r, resumed with ``(bulk, g)``:
    granted in cycle g, and with ``bulk`` the rest of the instruction's bursts are granted
    as they are requested (nothing else can ask for the channel before they are done).
    """

    def __init__(self, insns: list[Insn], plans: list, timing: Timing, insn_addr: int):
        n = len(insns)
        self.insns, self.plans, self.timing, self.insn_addr = insns, plans, timing, insn_addr
        self.module = [int(module_of(i)) for i in insns]
        self.seq = {m: [] for m in range(3)}
        self.local = [0] * n
        for j, m in enumerate(self.module):
            self.local[j] = len(self.seq[m])
            self.seq[m].append(j)
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
        self.start, self.done, self.push = neg[:], neg[:], neg[:]
        self.rd_wait, self.rd_lat = [0] * n, [0] * n
        self.tok_ready = [neg[:], neg[:]]
        self.room_ready = [neg[:], neg[:]]
        self.push_t: list[list[int]] = [[] for _ in TOKEN_QUEUES]
        self.pop_t: list[list[int]] = [[] for _ in TOKEN_QUEUES]
        self.batches: list[tuple[int, int, int]] = []
        self.batch_req: list[int] = []
        self.reads: list = []
        self.waiters: dict = {}
        self.runnable: list = []
        self.channel_free = 0  # the first cycle the read arbiter is idle

    def _notify(self, key) -> None:
        unit = self.waiters.pop(key, None)
        if unit is not None:
            self.runnable.append((unit, None))

    # ---- fetch: the DMA (read client 0) and the dispatcher ---------------------------------

    def _fetch_dma(self, me):
        t = self.timing
        n, L, size = len(self.insns), t.read_latency, t.fetch_insns
        waiters, reads = self.waiters, self.reads
        first, b = 0, 0
        while first < n:
            if b >= len(self.batch_req):
                waiters[("batch", b)] = me
                yield None
            q = self.batch_req[b]
            count = min(size, n - first)
            batch = t.fetch_batch(self.insn_addr, first, count)
            self.batches.append((q, first, count))
            r, bound, k = q + 1, NEVER, 0
            for i in range(len(batch.span)):
                _, g = yield r
                f = max(g + 1 + L, bound)
                reads.append((0, b, i, r, g, f, 0, False))
                x = f + batch.span[i]
                self.channel_free = x + 1
                r, bound = x + 1, x + batch.buf_after[i]
                # the burst's instructions can be dispatched while the next burst waits
                while k < count and batch.insn_burst[k] == i:
                    self.avail[first + k] = f + batch.insn_ready[k]
                    self._notify(("a", first + k))
                    k += 1
            first += count
            b += 1

    def _fetch_dispatch(self, me):
        t = self.timing
        n, depth, size = len(self.insns), t.cmd_queue_depth, t.fetch_insns
        waiters, avail, start = self.waiters, self.avail, self.start
        self.batch_req.append(t.FIRST_FETCH)
        self._notify(("batch", 0))
        last = -1
        for j in range(n):
            if avail[j] < 0:
                waiters[("a", j)] = me
                yield None
            d = max(avail[j], last + 1)
            m, local = self.module[j], self.local[j]
            if local >= depth:  # room once the instruction `depth` ahead has started
                ahead = self.seq[m][local - depth]
                if start[ahead] < 0:
                    waiters[("s", ahead)] = me
                    yield None
                d = max(d, start[ahead] + 1)
            self.dispatch[j] = last = d
            self._notify(("d", j))
            if (j + 1) % size == 0 and j + 1 < n:  # the batch is dispatched: request the next
                self.batch_req.append(d + 1)
                self._notify(("batch", len(self.batch_req) - 1))

    # ---- load, compute, store ---------------------------------------------------------------

    def _module(self, me, m: int):
        t = self.timing
        L, depth = t.read_latency, t.token_queue_depth
        waiters, push_t, pop_t, reads = self.waiters, self.push_t, self.pop_t, self.reads
        client = me  # read client id (load 1, compute 2; store never reads)
        free = 0
        for j in self.seq[m]:
            if self.dispatch[j] < 0:
                waiters[("d", j)] = me
                yield None
            s = max(free, self.dispatch[j] + 1)
            for col, q in enumerate(self.pops[j]):
                k = len(pop_t[q])
                if k >= len(push_t[q]):
                    waiters[("push", q, k)] = me
                    yield None
                ready = push_t[q][k] + 1
                self.tok_ready[col][j] = ready
                if ready > s:
                    s = ready
            self.free[j], self.start[j] = free, s
            self._notify(("s", j))
            for q in self.pops[j]:
                pop_t[q].append(s)
                self._notify(("pop", q, len(pop_t[q]) - 1))
            plan = self.plans[j]
            if isinstance(plan, int):
                p = s + plan
            else:  # a LOAD's bursts on the read channel
                req, buf, first, span = plan.req, plan.buf, plan.first, plan.span
                delta = wait = lat = i = 0
                nb = plan.n
                while i < nb:
                    r = s + req[i] + delta
                    bulk, g = yield r
                    f = g + 1 + L
                    bound = s + buf[i] + delta
                    if bound > f:
                        f = bound
                    wait += g - r
                    lat += f - g
                    delta = f - s - first[i]
                    reads.append((client, j, i, r, g, f, delta, bulk))
                    if bulk:
                        lat += plan.lat_after[i]
                        i = nb - 1
                        self.channel_free = s + first[i] + span[i] + delta + 1
                        break
                    self.channel_free = f + span[i] + 1
                    i += 1
                self.rd_wait[j], self.rd_lat[j] = wait, lat
                p = s + plan.push + delta
            self.done[j] = p
            for col, q in enumerate(self.pushes[j]):
                k = len(push_t[q])
                if k >= depth:  # room once the token `depth` ahead has been popped
                    if len(pop_t[q]) <= k - depth:
                        waiters[("pop", q, k - depth)] = me
                        yield None
                    room = pop_t[q][k - depth] + 1
                    self.room_ready[col][j] = room
                    if room > p:
                        p = room
            for q in self.pushes[j]:
                push_t[q].append(p)
                self._notify(("push", q, len(push_t[q]) - 1))
            self.push[j] = p
            free = p + 1

    # ---- the loop -----------------------------------------------------------------------

    def run(self, max_cycles: int) -> Timeline:
        gens = [self._fetch_dma(0), self._module(1, int(Module.LOAD)),
                self._module(2, int(Module.COMPUTE)), self._module(3, int(Module.STORE)),
                self._fetch_dispatch(4)]
        # read clients of the arbiter: fetch 0, load 1, compute 2 (unit ids are the same)
        self.runnable = [(u, None) for u in reversed(range(len(gens)))]
        pending: dict[int, int] = {}
        finished = 0
        last = 2  # round robin: the first search starts at fetch
        runnable = self.runnable
        while True:
            while runnable:
                u, value = runnable.pop()
                try:
                    r = gens[u].send(value)
                except StopIteration:
                    finished += 1
                    continue
                if r is not None:
                    pending[u] = r
            if not pending:
                break
            if len(pending) == 1:
                c, r = pending.popitem()
                g = max(r, self.channel_free)
                bulk = True
            else:
                g = max(self.channel_free, min(pending.values()))
                for off in (1, 2, 3):
                    c = (last + off) % 3
                    if c in pending and pending[c] <= g:
                        break
                del pending[c]
                bulk = False
            if g > max_cycles:
                raise SimulationLimitError(
                    f"the run passed max_cycles={max_cycles} cycles; raise max_cycles "
                    f"(--max-cycles) if the program is meant to run this long")
            last = c
            runnable.append((c, (bulk, g)))
        if finished != len(gens):  # fsim found no deadlock, so this is a model bug
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
            insns=self.insns, plans=self.plans, timing=self.timing, insn_addr=self.insn_addr,
            module=arr(self.module), free=arr(self.free), dispatch=arr(self.dispatch),
            avail=arr(self.avail), start=arr(self.start), done=arr(self.done),
            push=arr(self.push), rd_wait=arr(self.rd_wait), rd_lat=arr(self.rd_lat),
            pop_q=cols(self.pops), push_q=cols(self.pushes),
            tok_ready=arr(self.tok_ready).T.copy(), room_ready=arr(self.room_ready).T.copy(),
            batches=arr(self.batches).reshape(-1, 3), reads=self.reads)
