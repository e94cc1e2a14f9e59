"""The cycle model: fsim's values with time (``--target cycle``).

A run has two passes:

1. **Values.** fsim's own token machine runs the program with the shared
   :class:`~celosia.sim.datapath.Datapath`, so the final DRAM, the counters, every
   :class:`ProgramError` and every deadlock report are fsim's by construction.
   :class:`~celosia.sim.cycle_timing.Timing` turns each instruction into a plan: the
   cycles from its start to its push, or for a LOAD that reads DRAM a
   :class:`~celosia.sim.cycle_timing.ReadPlan` (its read bursts, timed as if the read
   channel were free). Plans depend only on the instructions' fields, so they are computed
   once per program (:class:`_Static`, kept with the decoded program for its later runs),
   with the per-module lower bounds that enforce ``max_cycles`` during this pass.
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

import math
from operator import itemgetter
from pathlib import Path

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError, SimulationLimitError
from celosia.isa import INSN_BYTES, AluInsn, GemmInsn, Insn, MemInsn, Module, Opcode, decode_uops

from .cycle_report import (_MEM_STAT_INDEX, _POPS, _PUSHES, MEM_STAT_TYPES, MODULES, STAT_KEYS,
                           plot_timeline, stat_values, write_trace)
from .cycle_timing import NEVER, TWO_STAGE_ALU_OPS, Timing, alu_hazards, one_uop_hazards
from .datapath import DEFAULT_MAX_WORK, _mem_sizes, single_threaded_blas
from .fsim import FunctionalSimulator, Program, _TokenMachine

__all__ = ["CycleSimulator", "Timeline", "Timing", "plot_timeline"]

_MODULE_NAMES = {Module.LOAD: "load", Module.COMPUTE: "compute", Module.STORE: "store"}
# a row's plan and statistics index (_Static.rows)
_FIRST, _STAT_INDEX = itemgetter(0), itemgetter(5)
# a row's cost (shortest duration + the push cycle), write waits, and the fields
# _Static.stat_totals sums: read beats, read bursts, write beats, drain cycles
_COST, _WRITE_WAIT = itemgetter(2), itemgetter(6)
_STAT_TOTALS = (itemgetter(7), itemgetter(8), itemgetter(9), itemgetter(10))
# per module (Module order), the token queues it pops and those it pushes
_MODULE_POPS = tuple(_POPS[name] for name in MODULES)
_MODULE_PUSHES = tuple(_PUSHES[name] for name in MODULES)
# LOAD/STORE plans are memoised per timing, for all programs (at most this many each; the
# plans are immutable and shared).
_CACHED_PLANS = 1 << 15
_CACHED_PLAN_TIMINGS = 8
_PLANS: dict = {}


def _mem_plans(timing: Timing) -> dict:
    """The LOAD/STORE plans memoised for a timing."""
    plans = _PLANS.get(timing)
    if plans is None:
        if len(_PLANS) >= _CACHED_PLAN_TIMINGS:
            _PLANS.clear()
        plans = _PLANS[timing] = {}
    return plans


def _clear_caches() -> None:
    """Forget the decoded programs with their plans, the LOAD/STORE plans and the fetch
    batches (sim/base.py ``clear_caches``)."""
    from . import cycle_timing, fsim

    fsim._clear_caches()
    _PLANS.clear()
    cycle_timing._fetch_batch.cache_clear()


# Timings (and program addresses) a program keeps its plans for.
_CACHED_STATICS = 8


class CycleSimulator(FunctionalSimulator):
    """fsim's values plus a cycle count and per-module utilisation (docs/cycle_model.md).

    Options: ``max_cycles`` (a run longer than this raises SimulationLimitError),
    ``trace`` (path of a Chrome/Perfetto JSON trace written after each run), ``timing``
    (a :class:`Timing` replacing the configuration's defaults), ``read_latency`` and
    ``write_latency`` (the DRAM model's, as the rtl target's options; default the
    configuration's dram_latency) and fsim's ``max_work``. After a run,
    :attr:`timeline` holds the per-instruction times.
    """

    name = "cycle"
    models_time = True

    def __init__(self, config: HwConfig, dram_size: int, *, max_cycles: int = 10**10,
                 trace: str | Path | None = None, timing: Timing | None = None,
                 read_latency: int | None = None, write_latency: int | None = None,
                 max_work: int = DEFAULT_MAX_WORK):
        super().__init__(config, dram_size, max_work=max_work)
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
        insns = self._load(insn_addr, insn_count)
        self.timeline = None
        static = self._static(insns, insn_addr)
        with single_threaded_blas():
            stalls = self._execute(insns, static)
        timeline = _Schedule(insns, static, self.timing, insn_addr, stalls).run(self.max_cycles)
        self.timeline = timeline
        stats = self._counters()
        # cycle_report.timeline_stats, from the schedule's sums, added in place
        stats.update(zip(STAT_KEYS, stat_values(timeline, self.config, stats,
                                                timeline.stat_sums())))
        if self.trace is not None:
            write_trace(timeline, self.trace)
        return stats

    def _static(self, insns: Program, insn_addr: int) -> "_Static":
        """The program's plans and tables under this timing, computed on its first run."""
        key = ("cycle", self.timing, insn_addr)
        static = insns.cache.get(key)
        if static is None:
            if len(insns.cache) >= _CACHED_STATICS:
                insns.cache.clear()
            static = insns.cache[key] = _Static(insns, self.timing, self.config)
        return static

    def _execute(self, insns: Program, static: "_Static") -> dict:
        """Pass 1: fsim's token machine and datapath. Returns the hazard stalls of the
        SHR/MUL ALU instructions (index -> cycles), which depend on the micro-ops in the UOP
        buffer when each runs.

        Each module runs its instructions one after another, so the sum of their shortest
        durations bounds the run from below: crossing ``max_cycles`` stops the run before
        the datapath does the work of an instruction that cannot fit."""
        datapath, limit = self.datapath, self.max_cycles
        if static.max_lower <= limit:  # no instruction can cross the limit
            execute = datapath.execute
        else:
            lower, modules = static.lower, static.module

            def execute(index: int, insn: Insn) -> None:
                if lower[index] > limit:
                    raise SimulationLimitError(
                        f"instruction {index}: the {_MODULE_NAMES[Module(modules[index])]} module "
                        f"alone needs more than max_cycles={limit} cycles by this instruction; "
                        f"raise max_cycles (--max-cycles) if the program is meant to run this "
                        f"long")
                datapath.execute(index, insn)

        stalls: dict = dict(static.fixed_stalls)
        if static.hazard_alu:
            timed, cfg, hazard_alu = execute, self.config, static.hazard_alu

            def execute(index: int, insn: Insn) -> None:
                if index in hazard_alu:
                    dst, src, _ = decode_uops(datapath.uop[insn.uop_bgn:insn.uop_end], cfg)
                    n = alu_hazards(insn, dst, src)
                    if n:
                        stalls[index] = n
                timed(index, insn)

        _TokenMachine(insns, self.config, execute).run()
        return stalls


class _Static:
    """What every run of one program under one timing shares: each instruction's plan
    (cycle_timing.py), each STORE's write beats and bursts, the hazard stalls fixed by the
    instruction alone, each module's instruction indices, the lower bounds of the run
    (``max_lower``; ``lower`` per instruction, made when first read: the shortest durations
    of its module's instructions up to it, each plus its push cycle), the schedule's tables,
    and ``stats`` (the static part of the statistics, filled by
    cycle_report.timeline_stats).

    Plans and the rest are computed once per distinct instruction object (a repeated word
    is one object, fsim._decode) and spread over the program with list comprehensions: a
    program's first run pays per instruction word, not per instruction."""

    def __init__(self, insns: Program, timing: Timing, cfg: HwConfig):
        sizes = _mem_sizes(cfg)
        mem_plans = _mem_plans(timing)
        window = math.lcm(timing.burst_bytes, timing.bus_bytes)
        burst, bus = timing.burst_bytes, timing.bus_bytes
        hazards = timing.hazard_stalls
        mem_stat_index = _MEM_STAT_INDEX
        self.module = modules = insns.modules
        self.pops, self.pushes = insns.pops, insns.pushes
        # per distinct instruction: (plan, STORE writes or None, cost, fixed hazard stalls,
        # whether its hazard stalls depend on the micro-ops and are counted per run)
        per: dict = {}
        any_fixed = any_per_run = False
        write_latency = timing.write_latency
        # GEMM/ALU: Timing.loop_cycles(n) is n + loop_cycles_1 for n > 0; drain_cycles
        loop_cycles_0, loop_cycles_1 = timing.loop_cycles(0), timing.loop_cycles(1) - 1
        drain = timing.exec_stage + 1
        ids = list(map(id, insns))
        for insn in dict(zip(ids, insns)).values():
            writes, fixed, per_run = None, 0, False
            # the statistics' fields (cycle_report.insn_stat_fields, inlined): memory type
            # index, write waits, read beats, read bursts, write beats, drain cycles
            if isinstance(insn, MemInsn):
                # LOAD/STORE plans depend on the element bytes (configurations of equal
                # timings share the memo), the fields other than sram_base and the flags,
                # and on dram_base only through the byte address within a window of whole
                # bursts and beats (bursts are cut at multiples of burst_bytes, beats at
                # multiples of bus_bytes: every time is the same a window further on). One
                # row inside one burst window (a micro-op load, a short row) depends only on
                # the address within a beat: no burst boundary cuts it.
                eb = sizes[insn.mem_type][0]
                a = insn.dram_base * eb
                if insn.y_size == 1 and a // burst == (a + insn.x_size * eb - 1) // burst:
                    where = (a % bus, "one burst")
                else:
                    where = a % window
                key = (insn.opcode, insn.mem_type, eb, where, insn.y_size, insn.x_size,
                       insn.x_stride, insn.y_pad_0, insn.y_pad_1, insn.x_pad_0, insn.x_pad_1)
                plan = mem_plans.get(key)
                if plan is None:
                    plan = (timing.store_plan(insn, eb) if insn.opcode == Opcode.STORE
                            else timing.load_plan(insn, eb))
                    if len(mem_plans) >= _CACHED_PLANS:
                        mem_plans.clear()
                    mem_plans[key] = plan
                k = mem_stat_index.get(insn.mem_type + 8 * insn.opcode, -1)  # IntEnums
                if type(plan) is tuple:  # STORE: (push offset, write beats, bursts)
                    plan, writes = plan[0], plan[1:]
                    stat = (k, writes[1] * write_latency, 0, 0, writes[0], 0)
                elif type(plan) is int:
                    stat = (k, 0, 0, 0, 0, 0)
                else:
                    stat = (k, 0, plan.beats, plan.n, 0, 0)
            elif isinstance(insn, (GemmInsn, AluInsn)):
                n = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
                plan = n + loop_cycles_1 if n else loop_cycles_0
                stat = (-1, 0, 0, 0, 0, drain if n else 0)
                if hazards and n > 1 and isinstance(insn, AluInsn) \
                        and insn.alu_op in TWO_STAGE_ALU_OPS:
                    if insn.use_imm and insn.uop_end - insn.uop_bgn == 1:
                        # one micro-op and no source row: its stalls do not depend on the
                        # micro-op's word (alu_hazards compares the row with itself)
                        fixed = one_uop_hazards(insn)
                        any_fixed = any_fixed or fixed > 0
                    else:
                        per_run = any_per_run = True
            else:  # FINISH: no memory, no micro-ops (insn_stat_fields)
                plan = timing.plan(insn, cfg)
                stat = (-1, 0, 0, 0, 0, 0)
            cost = (plan if type(plan) is int else plan.push) + 1
            per[id(insn)] = (plan, writes, cost, fixed, per_run, *stat)
        #: per instruction, its word's row of ``per``: (plan, STORE writes or None, cost,
        #: fixed hazard stalls, hazard stalls per run, then cycle_report.insn_stat_fields)
        self.rows = rows = list(map(per.__getitem__, ids))
        self.plans: list = list(map(_FIRST, rows))
        #: per instruction, the index of its memory type in the statistics (-1 for none)
        self.stat_index: list = list(map(_STAT_INDEX, rows))
        self.seq: dict = {0: [], 1: [], 2: []}
        totals = [0, 0, 0]
        #: per module, the write waits of its instructions (the schedule's DRAM cycles
        #: beside its read latencies)
        self.write_wait_sums = write_wait_sums = [0, 0, 0]
        seq = self.seq
        appends = (seq[0].append, seq[1].append, seq[2].append)
        for j, m in enumerate(modules):
            appends[m](j)
        for m, sq in seq.items():
            mine = list(map(rows.__getitem__, sq))
            totals[m] = sum(map(_COST, mine))
            write_wait_sums[m] = sum(map(_WRITE_WAIT, mine))
        self.max_lower = max(totals)
        # over the program, for the statistics: the plans' read beats and bursts, the
        # write beats and the pipeline drain cycles
        self.stat_totals = [sum(map(get, rows)) for get in _STAT_TOTALS]
        #: per instruction, the instruction cmd_queue_depth ahead of it in its module's
        #: command queue (fetch dispatches it once that one has started), -1 for none
        self.ahead = ahead = [-1] * len(modules)
        depth = timing.cmd_queue_depth
        for sq in seq.values():
            for j, k in zip(sq[depth:], sq):
                ahead[j] = k
        self._lower = self._fetch = self._writes = None
        #: hazard stalls that the instruction's fields alone decide (index -> cycles)
        self.fixed_stalls = {j: r[3] for j, r in enumerate(rows) if r[3]} if any_fixed else {}
        # SHR/MUL ALU instructions whose hazard stalls are counted per run, from the
        # micro-ops in the UOP buffer
        self.hazard_alu = (frozenset(j for j, r in enumerate(rows) if r[4]) if any_per_run
                           else frozenset())
        self.arrays = None  # module, pop_q, push_q as arrays (``tables``)
        self.stats = None

    def fetch_batches(self, timing: Timing, insn_addr: int) -> list:
        """The program's fetch batches (Timing.fetch_batch), made on its first run."""
        if self._fetch is None:
            n, size = len(self.module), timing.fetch_insns
            burst = timing.burst_bytes
            # batches at the same offset in a burst window are equal, and so are those of
            # whole beats inside one burst (Timing._fetch_batch: they depend on the count
            # alone), keyed by their count
            whole = INSN_BYTES % timing.bus_bytes == 0 and insn_addr % timing.bus_bytes == 0
            span = size * INSN_BYTES
            if whole and insn_addr % span == 0 and burst % span == 0:
                # every batch starts a whole batch's bytes into a burst window, so none
                # crosses one: all full batches are one, the last may be shorter
                full, rest = divmod(n, size)
                fetch = [timing._fetch_batch(0, size)] * full
                if rest:
                    fetch.append(timing._fetch_batch(0, rest))
                self._fetch = fetch
                return fetch
            memo: dict = {}
            fetch = []
            for first in range(0, n, size):
                count = min(size, n - first)
                addr = (insn_addr + first * INSN_BYTES) % burst
                key = count if whole and addr + count * INSN_BYTES <= burst else (addr, count)
                batch = memo.get(key)
                if batch is None:
                    batch = memo[key] = timing._fetch_batch(addr, count)
                fetch.append(batch)
            self._fetch = fetch
        return self._fetch

    @property
    def write_waits(self) -> list:
        """Per instruction, its write waits (insn_stat_fields; the schedule reads their sum
        per module, ``write_wait_sums``)."""
        return [r[6] for r in self.rows]

    @property
    def writes(self) -> dict:
        """Per STORE instruction: (write beats, write bursts)."""
        if self._writes is None:
            self._writes = {j: r[1] for j, r in enumerate(self.rows) if r[1] is not None}
        return self._writes

    @property
    def lower(self) -> list:
        """Per instruction, the sum of its module's shortest durations (each plus the push
        cycle) up to it: a lower bound of the cycle it can push in."""
        if self._lower is None:
            lower, totals = [0] * len(self.module), [0, 0, 0]
            for j, (m, r) in enumerate(zip(self.module, self.rows)):
                totals[m] += r[2]
                lower[j] = totals[m]
            self._lower = lower
        return self._lower

    def tables(self) -> tuple:
        """(module, pop_q, push_q) as read-only arrays (Timeline's), made when first read:
        a short program's statistics need none."""
        if self.arrays is None:
            def cols(seqs):  # queue ids, two columns, -1 for none
                return np.array([(*qs, -1, -1)[:2] for qs in seqs], np.int64).reshape(-1, 2)

            self.arrays = (np.asarray(self.module, dtype=np.int64), cols(self.pops),
                           cols(self.pushes))
            for a in self.arrays:
                a.setflags(write=False)
        return self.arrays


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
    time and the starts of bulk grants (see :meth:`read_bursts`); ``module``, ``pop_q``,
    ``push_q``: the program's tables (properties: the same every run).

    The schedule hands over Python lists (``rows``, the rows of ``times`` in its order;
    or ``rows=None`` and ``derive``, a function that makes them, with the dispatch and push
    rows: the statistics read only those); the numpy arrays are made when first read (the
    statistics of a short program need none).
    """

    def __init__(self, insns: list, plans: list, timing: Timing, insn_addr: int,
                 rows: list | None, batches: list, reads: list, writes: dict | None, static,
                 fetch_reads: list, stalls: dict, *, dispatch: list | None = None,
                 push: list | None = None, derive=None):
        self.insns, self.plans, self.timing, self.insn_addr = insns, plans, timing, insn_addr
        self._rows, self._derive = rows, derive
        self._dispatch = dispatch if rows is None else rows[1]
        self._push = push if rows is None else rows[5]
        self._batches = batches
        #: (client, index, burst, request, grant, first beat, delta, bulk)
        self.reads = reads
        self._writes = writes
        #: what every run of the program shares (cycle._Static)
        self.static = static
        self._fetch_reads = fetch_reads  # request, grant, request, grant, ...
        #: hazard stall cycles of the SHR/MUL ALU instructions that had any (index -> cycles)
        self.stalls = stalls
        self._times = self._batch_array = self._fetch_array = None
        # the statistics' sums the schedule made as it went: data wait, fetch's bus wait
        # (None: from the gaps), per module, token and room waits, cycles run per memory
        # type, fetch's beats and bursts (``sums`` adds the gaps when read)
        self._sum_parts = self._sums = None

    @property
    def sums(self) -> tuple | None:
        """The statistics' sums (cycle_report.timeline_stats): data wait, fetch's waits for
        bytes ([begin, end) of each, made from the dispatch and avail rows when first
        read), per module, token and room waits, cycles run per memory type, fetch's beats
        and bursts; None for a timeline without them."""
        if self._sums is None and self._sum_parts is not None:
            data_wait, _, per, token_q, room_q, ran, beats, bursts = self._sum_parts
            gaps, last = [], -1
            for a, d in zip(self.rows[2], self._dispatch):
                gap = last + 1
                gaps.append((gap, d if a >= d else (a if a > gap else gap)))
                last = d
            self._sums = (data_wait, gaps, per, token_q, room_q, ran, beats, bursts)
        return self._sums

    @sums.setter
    def sums(self, value: tuple | None) -> None:
        self._sums, self._sum_parts = value, None

    def stat_sums(self) -> tuple:
        """What cycle_report.stat_values needs of the sums: data wait, fetch's bus wait, per
        module, token and room waits, cycles run per memory type, fetch's beats and
        bursts."""
        if self._sum_parts is None:
            from .cycle_report import _fetch_bus

            data_wait, gaps, *rest = self.sums
            return (data_wait, _fetch_bus(self, gaps), *rest)
        if self._sum_parts[1] is None:
            from .cycle_report import _fetch_bus

            self._sum_parts = (self._sum_parts[0], _fetch_bus(self, self.sums[1]),
                               *self._sum_parts[2:])
        return self._sum_parts

    @property
    def rows(self) -> list:
        """free, dispatch, avail, start, done, push, rd_wait, rd_lat, tok_ready (2 rows),
        room_ready (2 rows), as Python lists."""
        if self._rows is None:
            self._rows = self._derive()
            self._derive = None
        return self._rows

    @property
    def last_dispatch(self) -> int:
        """The cycle of the last dispatch."""
        return self._dispatch[-1]

    @property
    def writes(self) -> dict:
        """Per STORE instruction: (write beats, write bursts) (the program's, when the
        schedule gave None)."""
        return self._writes if self._writes is not None else self.static.writes

    @property
    def times(self) -> np.ndarray:
        """(12, n): free, dispatch, avail, start, done, push, rd_wait, rd_lat, tok_ready (2
        rows), room_ready (2 rows); the per-instruction arrays are its rows."""
        if self._times is None:
            self._times = np.array(self.rows, dtype=np.int64).reshape(12, -1)
        return self._times

    free = property(lambda self: self.times[0])
    dispatch = property(lambda self: self.times[1])
    avail = property(lambda self: self.times[2])
    start = property(lambda self: self.times[3])
    done = property(lambda self: self.times[4])
    push = property(lambda self: self.times[5])
    rd_wait = property(lambda self: self.times[6])
    rd_lat = property(lambda self: self.times[7])
    tok_ready = property(lambda self: self.times[8:10].T)  # (n, 2)
    room_ready = property(lambda self: self.times[10:12].T)

    @property
    def batches(self) -> np.ndarray:
        """(batches, 3): request cycle, first instruction, count of each fetch batch."""
        if self._batch_array is None:
            self._batch_array = np.array(self._batches, dtype=np.int64).reshape(-1, 3)
        return self._batch_array

    @property
    def fetch_reads(self) -> np.ndarray:
        """(fetch bursts, 2): request and grant of each of fetch's read bursts."""
        if self._fetch_array is None:
            self._fetch_array = np.array(self._fetch_reads, dtype=np.int64).reshape(-1, 2)
        return self._fetch_array

    @property
    def cycles(self) -> int:
        return max(self._push) + 1

    # The program's tables (the same every run: cycle._Static's, as arrays when first read)
    @property
    def module(self) -> np.ndarray:
        """(n,) the module of each instruction (Module: load 0, compute 1, store 2)."""
        return self.static.tables()[0]

    @property
    def pop_q(self) -> np.ndarray:
        """(n, 2) the token queue ids each instruction pops, -1 for none."""
        return self.static.tables()[1]

    @property
    def push_q(self) -> np.ndarray:
        """(n, 2) the token queue ids each instruction pushes, -1 for none."""
        return self.static.tables()[2]

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

    Units are generators. ``yield None``: blocked on an event, registered in the waiter
    table of its kind (``w_*``: event -> unit; a unit waits for one event at a time);
    ``yield r``: a read burst whose ARVALID rises in cycle r, resumed with ``(bulk, g)``:
    granted in cycle g, and with ``bulk`` the rest of the instruction's bursts are granted
    as they are requested (nothing else can ask for the channel before they are done).
    An event that happens wakes its waiter, if any, by appending it to ``runnable``.
    """

    def __init__(self, insns: list[Insn], static: _Static, timing: Timing, insn_addr: int,
                 stalls: dict | None = None):
        n = len(insns)
        self.static = static
        self.stalls = stalls or {}
        self.insns, self.plans, self.timing, self.insn_addr = insns, static.plans, timing, insn_addr
        self.module, self.seq = static.module, static.seq
        self.pops, self.pushes = static.pops, static.pushes
        # the Timeline's rows kept as the schedule goes (the others: _rows)
        neg = [-1] * n
        self.dispatch, self.avail, self.start, self.push = neg[:], neg[:], neg[:], neg
        self.push_t: list[list[int]] = [[], [], [], []]  # per queue (TOKEN_QUEUES)
        self.pop_t: list[list[int]] = [[], [], [], []]
        self.batches: list[tuple[int, int, int]] = []
        self.batch_req: list[int] = []
        self.reads: list = []
        self.fetch_reads: list = []  # request, grant, request, grant, ...
        # waiters: instruction readable in fetch's buffer ("a"), dispatched ("d"), started
        # ("s"), per queue its k-th push and k-th pop, and fetch batch b requested
        self.w_a: dict = {}
        self.w_d: dict = {}
        self.w_s: dict = {}
        self.w_push: list[dict] = [{}, {}, {}, {}]
        self.w_pop: list[dict] = [{}, {}, {}, {}]
        self.w_batch: dict = {}
        self.runnable: list = []
        self.channel_free = 0  # the first cycle the read arbiter is idle
        # statistics summed as the schedule goes (cycle_report.timeline_stats)
        self.token_q, self.room_q = [0] * 4, [0] * 4
        self.ran = [0] * len(MEM_STAT_TYPES)
        self.module_sums: list = [None] * 3
        self.fetch_sums = None
        self.fetch_beats = self.fetch_bursts = 0
        self.fetch_bus = 0  # fetch's waits for bytes behind the arbiter; None: not summed

    # ---- fetch: the DMA (read client 0) and the dispatcher ---------------------------------

    def _fetch_dma(self, me):
        t = self.timing
        n, L, size = len(self.insns), t.read_latency, t.fetch_insns
        reads, avail, runnable, w_a = self.reads, self.avail, self.runnable, self.w_a
        fetch_reads = self.fetch_reads
        batch_req = self.batch_req
        batches = self.static.fetch_batches(t, self.insn_addr)
        first, b = 0, 0
        while first < n:
            if b >= len(batch_req):
                self.w_batch[b] = me
                yield None
            q = batch_req[b]
            count = min(size, n - first)
            batch = batches[b]
            self.batches.append((q, first, count))
            insn_burst, insn_ready, span = batch.insn_burst, batch.insn_ready, batch.span
            self.fetch_beats += batch.beats
            self.fetch_bursts += len(span)
            if len(span) == 1:  # the usual batch: one burst delivers every instruction
                _, g = yield q + 1
                # fetch waits for this batch's bytes from its request on (the gap before
                # its first instruction's dispatch begins at q and ends after the data), so
                # its whole wait for the arbiter is a wait for bytes (cycle_report._fetch_bus)
                if self.fetch_bus is not None:
                    self.fetch_bus += g - q - 1
                f = g + 1 + L
                reads.append((0, b, 0, q + 1, g, f, 0, False))
                fetch_reads += (q + 1, g)
                self.channel_free = f + span[0] + 1
                end = first + count
                avail[first:end] = map(f.__add__, insn_ready)
                if w_a:  # the dispatcher, if it waits for one of these
                    for j in w_a:
                        if j < end:
                            runnable.append((w_a.pop(j), None))
                        break
                first = end
                b += 1
                continue
            self.fetch_bus = None  # bursts after the first: from the gaps (Timeline.sums)
            r, bound, k = q + 1, NEVER, 0
            for i in range(len(span)):
                _, g = yield r
                f = max(g + 1 + L, bound)
                reads.append((0, b, i, r, g, f, 0, False))
                fetch_reads += (r, g)
                x = f + span[i]
                self.channel_free = x + 1
                r, bound = x + 1, x + batch.buf_after[i]
                # the burst's instructions can be dispatched while the next burst waits
                while k < count and insn_burst[k] == i:
                    j = first + k
                    avail[j] = f + insn_ready[k]
                    if w_a:
                        u = w_a.pop(j, None)
                        if u is not None:
                            runnable.append((u, None))
                    k += 1
            first += count
            b += 1

    def _fetch_dispatch(self, me):
        t = self.timing
        n, size = len(self.insns), t.fetch_insns
        avail, start, dispatch = self.avail, self.start, self.dispatch
        module, aheads = self.module, self.static.ahead
        runnable, w_d, w_batch, batch_req = self.runnable, self.w_d, self.w_batch, self.batch_req
        batch_req.append(t.FIRST_FETCH)
        u = w_batch.pop(0, None)
        if u is not None:
            runnable.append((u, None))
        last = -1
        # statistics (cycle_report): the gap before each dispatch is first a wait for the
        # instruction's bytes, then for command queue room: the wait for room is the part
        # of the gap after both the bytes and the previous dispatch (max(a, last + 1)), the
        # waits for bytes the rest of the gaps (last + 1 - n cycles in all)
        room_wait = [0, 0, 0]
        for first in range(0, n, size):
            for j in range(first, min(first + size, n)):
                a = avail[j]
                if a < 0:
                    self.w_a[j] = me
                    yield None
                    a = avail[j]
                d = a if a > last else last + 1
                ahead = aheads[j]
                if ahead >= 0:  # room once the instruction `depth` ahead has started
                    s = start[ahead]
                    if s < 0:
                        self.w_s[ahead] = me
                        yield None
                        s = start[ahead]
                    if s >= d:
                        room_wait[module[j]] += s + 1 - d
                        d = s + 1
                dispatch[j] = last = d
                if w_d:
                    u = w_d.pop(j, None)
                    if u is not None:
                        runnable.append((u, None))
            if first + size < n:  # the batch is dispatched: request the next
                batch_req.append(last + 1)
                u = w_batch.pop(len(batch_req) - 1, None)
                if u is not None:
                    runnable.append((u, None))
        self.fetch_sums = (last + 1 - n - sum(room_wait), room_wait)

    # ---- load, compute, store ---------------------------------------------------------------

    def _module(self, me, m: int):
        t = self.timing
        L, depth = t.read_latency, t.token_queue_depth
        push_t, pop_t, reads, plans = self.push_t, self.pop_t, self.reads, self.plans
        dispatch, start, push = self.dispatch, self.start, self.push
        pops_of_, pushes_of_ = self.pops, self.pushes
        runnable, w_s, w_push, w_pop = self.runnable, self.w_s, self.w_push, self.w_pop
        client = me  # read client id (load 1, compute 2; store never reads)
        stalls = self.stalls
        w_d = self.w_d
        # statistics (cycle_report): waits attributed in order (the command, then each
        # popped token; after DONE, room in each pushed queue), DRAM and bus cycles; busy is
        # the rest of the module's cycles (each instruction's waits and busy cycles cover
        # [free, push + 1), so the module's cover [0, its last push + 1))
        stat_index = self.static.stat_index
        token_q, room_q, ran = self.token_q, self.room_q, self.ran
        cmdq = dram = bus = 0
        free = 0
        for j in self.seq[m]:
            s = dispatch[j]
            if s < 0:
                w_d[j] = me
                yield None
                s = dispatch[j]
            s += 1
            if free > s:
                s = free
            cmdq += s - free
            pops = pops_of_[j]
            if pops:  # the tokens: the k-th pop of a queue takes its k-th push
                q = pops[0]
                k = len(pop_t[q])
                if k >= len(push_t[q]):
                    w_push[q][k] = me
                    yield None
                mid = s
                ready = push_t[q][k] + 1
                if ready > s:
                    s = ready
                if len(pops) == 1:
                    token_q[q] += s - mid
                    pop_t[q].append(s)
                    if w_pop[q]:
                        u = w_pop[q].pop(len(pop_t[q]) - 1, None)
                        if u is not None:
                            runnable.append((u, None))
                else:
                    q1 = pops[1]
                    k = len(pop_t[q1])
                    if k >= len(push_t[q1]):
                        w_push[q1][k] = me
                        yield None
                    ready1 = push_t[q1][k] + 1
                    if ready1 > s:
                        s = ready1
                    if ready < mid:
                        ready = mid
                    token_q[q] += ready - mid
                    token_q[q1] += s - ready
                    for q in pops:
                        pop_t[q].append(s)
                        if w_pop[q]:
                            u = w_pop[q].pop(len(pop_t[q]) - 1, None)
                            if u is not None:
                                runnable.append((u, None))
            start[j] = s
            if w_s:
                u = w_s.pop(j, None)
                if u is not None:
                    runnable.append((u, None))
            plan = plans[j]
            if type(plan) is int:
                p = s + plan
                if stalls:
                    p += stalls.get(j, 0)
            else:  # a LOAD's bursts on the read channel
                # burst i's offsets: the plan's scalars for the first burst (usually the
                # only one granted alone), its lists for later ones
                r, bound, first_i, span_i = s + plan.req0, s + plan.buf0, plan.first0, plan.span0
                wait = lat = i = 0
                nb = plan.n
                while True:
                    bulk, g = yield r
                    f = g + 1 + L
                    if bound > f:
                        f = bound
                    wait += g - r
                    lat += f - g
                    delta = f - s - first_i
                    reads.append((client, j, i, r, g, f, delta, bulk))
                    if bulk:
                        lat += plan.lat_after_at(i) if i else plan.lat0
                        self.channel_free = s + plan.end + delta + 1
                        break
                    self.channel_free = f + span_i + 1
                    i += 1
                    if i == nb:
                        break
                    r, bound, first_i, span_i = plan.burst(i)
                    r += s + delta
                    bound += s + delta
                p = s + plan.push + delta
                dram += lat
                bus += wait
            pushes = pushes_of_[j]
            if pushes:  # room: the k-th push of a queue needs its (k - depth)-th pop
                q = pushes[0]
                k = len(push_t[q])
                mid = p
                if k >= depth:
                    if len(pop_t[q]) <= k - depth:
                        w_pop[q][k - depth] = me
                        yield None
                    room = pop_t[q][k - depth] + 1
                    if room > p:
                        p = room
                if len(pushes) == 1:
                    room_q[q] += p - mid
                else:
                    q1 = pushes[1]
                    k = len(push_t[q1])
                    ready = p
                    if k >= depth:
                        if len(pop_t[q1]) <= k - depth:
                            w_pop[q1][k - depth] = me
                            yield None
                        room = pop_t[q1][k - depth] + 1
                        if room > p:
                            p = room
                    room_q[q] += ready - mid
                    room_q[q1] += p - ready
                for q in pushes:
                    push_t[q].append(p)
                    if w_push[q]:
                        u = w_push[q].pop(len(push_t[q]) - 1, None)
                        if u is not None:
                            runnable.append((u, None))
            push[j] = p
            free = p + 1
            k = stat_index[j]
            if k >= 0:
                ran[k] += free - s
        waits = cmdq + dram + bus
        for q in _MODULE_POPS[m]:
            waits += token_q[q]
        for q in _MODULE_PUSHES[m]:
            waits += room_q[q]
        dram += self.static.write_wait_sums[m]
        self.module_sums[m] = (free - waits - self.static.write_wait_sums[m], cmdq, dram, bus)

    # ---- the loop -----------------------------------------------------------------------

    def run(self, max_cycles: int) -> Timeline:
        gens = [self._fetch_dma(0), self._module(1, int(Module.LOAD)),
                self._module(2, int(Module.COMPUTE)), self._module(3, int(Module.STORE)),
                self._fetch_dispatch(4)]
        # read clients of the arbiter: fetch 0, load 1, compute 2 (unit ids are the same)
        runnable = self.runnable
        runnable += [(4, None), (3, None), (2, None), (1, None), (0, None)]
        pending: dict[int, int] = {}
        finished = 0
        last = 2  # round robin: the first search starts at fetch
        sends = [gens[0].send, gens[1].send, gens[2].send, gens[3].send, gens[4].send]
        pop = runnable.pop
        while True:
            while runnable:
                u, value = pop()
                try:
                    r = sends[u](value)
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
        tl = Timeline(self.insns, list(self.plans), self.timing, self.insn_addr, None,
                      self.batches, self.reads, None, self.static, self.fetch_reads,
                      dict(self.stalls), dispatch=self.dispatch, push=self.push,
                      derive=self._rows)
        data_wait, room_wait = self.fetch_sums
        per = [*map(list, zip(*self.module_sums)), room_wait]
        tl._sum_parts = (data_wait, self.fetch_bus, per, self.token_q, self.room_q, self.ran,
                         self.fetch_beats, self.fetch_bursts)
        return tl

    def _rows(self) -> list:
        """The Timeline's rows (when first read): those the schedule kept, and the others
        as it had them: free (the cycle after the module's previous push), done (the plan
        from the start, shifted by the last read burst's delta), the read waits and
        latencies (from the read bursts), and the cycles the k-th token of a queue (its
        k-th push + 1) and room for the k-th push (its (k - depth)-th pop + 1) were there."""
        n = len(self.insns)
        start, push, plans, stalls = self.start, self.push, self.plans, self.stalls
        depth = self.timing.token_queue_depth
        neg = [-1] * n
        free, done, tok, room = neg[:], neg[:], [neg[:], neg[:]], [neg[:], neg]
        rd_wait, rd_lat = [0] * n, [0] * n
        for seq in self.seq.values():
            f = 0
            for j in seq:
                free[j] = f
                f = push[j] + 1
        delta_of = {}
        for client, j, i, r, g, f, delta, bulk in self.reads:
            if client:
                rd_wait[j] += g - r
                rd_lat[j] += f - g
                if bulk:
                    plan = plans[j]
                    rd_lat[j] += plan.lat_after_at(i) if i else plan.lat0
                delta_of[j] = delta
        for j, plan in enumerate(plans):
            if type(plan) is int:
                done[j] = start[j] + plan + stalls.get(j, 0)
            else:
                done[j] = start[j] + plan.push + delta_of[j]
        pushers: list = [[], [], [], []]  # per queue, its pushing and popping instructions
        poppers: list = [[], [], [], []]
        pops_of, pushes_of = self.pops, self.pushes
        for j, (pops, pushes) in enumerate(zip(pops_of, pushes_of)):
            for q in pops:
                poppers[q].append(j)
            for q in pushes:
                pushers[q].append(j)
        for q in range(4):
            for k, j in enumerate(poppers[q]):
                tok[pops_of[j].index(q)][j] = push[pushers[q][k]] + 1
            for k, j in enumerate(pushers[q][depth:], depth):
                room[pushes_of[j].index(q)][j] = start[poppers[q][k - depth]] + 1
        return [free, self.dispatch, self.avail, start, done, push, rd_wait, rd_lat, *tok,
                *room]
