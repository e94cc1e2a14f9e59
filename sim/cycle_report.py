"""What the cycle model reports: statistics, a Chrome/Perfetto trace and a PNG timeline.

Everything here is computed from a :class:`celosia.sim.cycle.Timeline` with numpy over all
instructions at once. Waits are attributed in a fixed order: before an instruction starts,
each cycle goes to the first condition not yet met (the instruction is in the command
queue, then the token of each popped queue in pops_of order); after it completes, to the
first pushed queue without room; inside a LOAD, each read burst's wait for the arbiter
(request to grant) and its latency (grant to first beat). docs/cycle_model.md lists every
statistic.
"""

from __future__ import annotations

import json
from operator import itemgetter
from bisect import bisect_right
from pathlib import Path

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError
from celosia.isa import AluInsn, FinishInsn, GemmInsn, MemInsn, MemType, format_insn

__all__ = ["timeline_stats", "trace_dict", "write_trace", "plot_timeline", "MODULES",
           "MEM_STAT_TYPES", "insn_stat_fields"]

MODULES = ("load", "compute", "store")
# Token queues in fsim.TOKEN_QUEUES order: (producer, consumer).
_QUEUE_ENDS = (("load", "compute"), ("compute", "load"), ("compute", "store"),
               ("store", "compute"))
_QUEUE_NAMES = tuple(f"{a}->{b}" for a, b in _QUEUE_ENDS)
# Per module, the token queues it pops (waiting on the producer) and pushes (room toward
# the consumer): the statistics keys exist for exactly these.
_POPS = {"load": (1,), "compute": (0, 3), "store": (2,)}
_PUSHES = {"load": (0,), "compute": (1, 2), "store": (3,)}
_LOAD_BYTES = {MemType.UOP: "uop", MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc",
               MemType.ACC_8BIT: "acc8"}
_TIDS = {"fetch": 0, "load": 1, "compute": 2, "store": 3, "dram read": 4, "dram write": 5}
#: the memory types whose bytes per cycle are reported: LOADs (mem_type), then STORE OUT
#: (8 + mem_type)
MEM_STAT_TYPES = tuple([int(mt) for mt in _LOAD_BYTES] + [8 + int(MemType.OUT)])
_MEM_STAT_INDEX = {k: i for i, k in enumerate(MEM_STAT_TYPES)}


def _overlap(a0, a1, b0, b1) -> int:
    """Total length of the intersection of two sets of intervals [a0, a1) and [b0, b1): the
    first disjoint, sorted, and starting at or before every b0 (fetch's gaps: the first
    begins in cycle 0), the second with b1 >= b0. With F(t) the length of the first set
    before t, each [b0, b1) adds F(b1) - F(b0)."""
    if not b0.size:
        return 0
    length = np.cumsum(a1 - a0)  # length[k]: of the intervals up to k
    t = np.concatenate((b1, b0))
    k = np.searchsorted(a0, t, side="right") - 1  # the last interval beginning by t
    before = length[k] - np.maximum(a1[k] - t, 0)
    return int(before[:b0.size].sum() - before[b0.size:].sum())


class _StaticStats:
    """The parts of the statistics fixed by the program and the timing (computed on the
    first run and kept in the program's cycle._Static): totals and per-instruction lists
    here, the 0/1 matrices of _sums_numpy (``matrices``) only when a long program first
    needs them, so that a short program's first run builds no numpy tables."""

    def __init__(self, tl):
        n = len(tl.insns)
        timing = tl.timing
        writes = tl.writes or {}
        self.write_wait_list = [0] * n
        for j, (_, bursts) in writes.items():
            self.write_wait_list[j] = bursts * timing.write_latency
        self.write_beats = sum(beats for beats, _ in writes.values())
        read_plans = [p for p in tl.plans if not isinstance(p, int)]
        fetch = [timing.fetch_batch(tl.insn_addr, first, min(timing.fetch_insns, n - first))
                 for first in range(0, n, timing.fetch_insns)]
        self.read_beats = (sum(sum(b.burst_beats) for b in fetch)
                           + sum(p.beats for p in read_plans))
        self.read_bursts = sum(len(b.span) for b in fetch) + sum(p.n for p in read_plans)
        # LOAD: mem_type, STORE: 8 + mem_type
        self.mem_types = list(MEM_STAT_TYPES)
        index = {k: i for i, k in enumerate(self.mem_types)}
        self.mem = [int(i.mem_type) + (8 * int(i.opcode)) if isinstance(i, MemInsn) else -1
                    for i in tl.insns]
        self.mem_index = [index.get(k, -1) for k in self.mem]
        st = tl.static  # the program's own lists (cycle._Static)
        self.module, self.pops, self.pushes = list(st.module), list(st.pops), list(st.pushes)
        self._static = st
        self._matrices = None
        # GEMM/ALU cycles waiting for the last micro-op to leave the pipeline
        self.drain = sum(tl.timing.drain_cycles(i) for i in tl.insns
                         if isinstance(i, (GemmInsn, AluInsn)))

    def matrices(self):
        """(module_hot, pop_hot, push_hot, write_wait, mem_hot) for _sums_numpy: 0/1
        matrices that sum per-instruction quantities per module, popped queue, pushed
        queue and memory type, and the write waits as an array."""
        if self._matrices is None:
            module, pop_q, push_q = self._static.tables()
            n = len(self.module)
            rows = np.arange(n)

            def onehot(ids, width):  # (n,) ids, -1 for none -> (n, width) 0/1
                hot = np.zeros((n, width + 1), np.int64)
                hot[rows, np.where(ids < 0, width, ids)] = 1
                return hot[:, :width]

            # (2n, 4): an instruction's wait for its first / second popped (pushed) queue,
            # laid end to end, times this gives the waits per queue
            pop_hot = np.concatenate([onehot(pop_q[:, col], 4) for col in range(2)])
            push_hot = np.concatenate([onehot(push_q[:, col], 4) for col in range(2)])
            mem = np.array(self.mem, np.int64)
            mem_hot = np.stack([mem == k for k in self.mem_types], axis=1).astype(np.int64)
            self._matrices = (onehot(module, 3), pop_hot, push_hot,
                              np.array(self.write_wait_list, np.int64), mem_hot)
        return self._matrices


# Statistics keys per module, in the order of the dictionary: busy, command queue empty,
# token waits (per popped queue), push waits (per pushed queue), DRAM, bus (not store), idle.
_MODULE_KEYS = {
    name: (f"{name}_busy_cycles", f"{name}_stall_cmdq_empty_cycles",
           [(q, f"{name}_stall_token_{_QUEUE_ENDS[q][0]}_cycles") for q in _POPS[name]],
           [(q, f"{name}_stall_push_{_QUEUE_ENDS[q][1]}_cycles") for q in _PUSHES[name]],
           f"{name}_stall_dram_cycles",
           f"{name}_stall_bus_cycles" if name != "store" else None,
           f"{name}_idle_cycles")
    for name in MODULES}
_CMDQ_FULL_KEYS = [f"fetch_stall_cmdq_full_{name}_cycles" for name in MODULES]
_BYTES_KEYS = [(f"{key}_load_bytes", f"{key}_load_bytes_per_cycle") for key in _LOAD_BYTES.values()]
_LOADED_BYTES = itemgetter(*(key for key, _ in _BYTES_KEYS))  # counters -> their values


def _module_row_keys(name: str) -> list:
    """A module's statistics keys in the order of the dictionary (without idle)."""
    busy, cmdq, tokens, rooms, dram, bus, _ = _MODULE_KEYS[name]
    keys = [busy]
    if name == "compute":
        keys += ["compute_stall_pipeline_cycles", "compute_stall_hazard_cycles"]
    keys += [cmdq, *(key for _, key in tokens), *(key for _, key in rooms), dram]
    return keys + ([bus] if bus is not None else [])


#: every key of timeline_stats, in its order (stat_values fills them in one list)
STAT_KEYS = ("cycles", "time_us", "fetch_busy_cycles", "fetch_stall_dram_cycles",
              "fetch_stall_bus_cycles", *_CMDQ_FULL_KEYS, "fetch_idle_cycles",
              *(key for name in MODULES for key in (*_module_row_keys(name),
                                                    _MODULE_KEYS[name][-1])),
              "gemm_utilization", "fetch_bytes", "dram_read_bytes", "dram_write_bytes",
              "dram_read_beats", "dram_write_beats", "dram_read_bursts",
              "dram_read_bytes_per_cycle", "dram_write_bytes_per_cycle",
              "dram_read_channel_utilization", "dram_write_channel_utilization",
              *(rate for _, rate in _BYTES_KEYS), "out_store_bytes_per_cycle")
# stat_values writes each module's row in this order of its queues
assert _POPS == {"load": (1,), "compute": (0, 3), "store": (2,)}
assert _PUSHES == {"load": (0,), "compute": (1, 2), "store": (3,)}

# rows of Timeline.times
_FREE, _DISPATCH, _AVAIL, _START, _DONE, _PUSH, _RD_WAIT, _RD_LAT = range(8)
_TOK = [8, 9]
_ROOM = [10, 11]


def _times(tl) -> np.ndarray:
    if tl.times is not None:
        return tl.times
    return np.array([tl.free, tl.dispatch, tl.avail, tl.start, tl.done, tl.push, tl.rd_wait,
                     tl.rd_lat, *tl.tok_ready.T, *tl.room_ready.T], np.int64)


def _chain(begin_and_ready: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Waits attributed in order: from row 0 (the begin) to ``end``, each cycle goes to the
    first of rows 1.. (ready cycles) not yet reached. Returns one row of waits per ready
    row. (Clamping each ready cycle in turn between the previous clamp and ``end`` gives
    the running maximum clamped to ``end``; ``end`` is never before the begin.)"""
    mids = np.maximum.accumulate(begin_and_ready, axis=0)
    np.minimum(mids, end, out=mids)
    return np.diff(mids, axis=0)


def _sums_numpy(tl, static):
    """(data wait, fetch bus, per-module sums (busy, command queue, dram, bus, fetch room),
    token waits per queue, room waits per queue, cycles run per memory type of
    _StaticStats.mem_types) with numpy over all instructions at once: per-instruction
    quantities, summed per module or queue by products with 0/1 matrices fixed by the
    program."""
    n = len(tl.insns)
    times = _times(tl)
    dispatch, start, push = times[_DISPATCH], times[_START], times[_PUSH]
    # fetch: one busy cycle per dispatch; the gap before each dispatch is first waiting for
    # the instruction's bytes (behind another client's burst: bus; else DRAM), then for
    # room in its module's command queue.
    gap = np.empty((2, n), np.int64)
    gap[0, 0] = 0
    np.add(dispatch[:-1], 1, out=gap[0, 1:])
    gap[1] = times[_AVAIL]
    data_wait = _chain(gap, dispatch)[0]
    data_end = gap[0] + data_wait
    fetch_bursts = _fetch_bursts(tl)
    fetch_bus = _overlap(gap[0], data_end, fetch_bursts[:, 0], fetch_bursts[:, 1])
    # Waits before the start (command queue, then each popped queue in order) and after
    # DONE (each pushed queue in order).
    pre = times[[_FREE, _DISPATCH, *_TOK]]
    pre[1] += 1  # an instruction can start the cycle after its dispatch
    cmd_tok = _chain(pre, start)  # rows: command queue, first token, second token
    room = _chain(times[[_DONE, *_ROOM]], push)
    module_hot, pop_hot, push_hot, write_wait, mem_hot = static.matrices()
    token_q = cmd_tok[1:].reshape(-1) @ pop_hot  # per queue
    room_q = room.reshape(-1) @ push_hot
    per = np.empty((5, n), np.int64)  # busy, command queue, dram, bus, fetch room
    np.add(times[_RD_LAT], write_wait, out=per[2])
    per[0] = times[_DONE] - start - times[_RD_WAIT] - per[2] + 1  # + the push cycle
    per[1] = cmd_tok[0]
    per[3] = times[_RD_WAIT]
    per[4] = dispatch - data_end
    ran = (push + 1 - start) @ mem_hot
    return (int(data_wait.sum()), fetch_bus, (per @ module_hot).tolist(),
            token_q.tolist(), room_q.tolist(), ran.tolist())


def _sums_python(tl, static):
    """_sums_numpy one instruction at a time, on Python ints: faster for short programs
    (below _PYTHON_STATS instructions), where numpy's per-call cost dominates."""
    rows = getattr(tl, "rows", None)  # the schedule's lists (cycle.Timeline)
    free, dispatch, avail, start, done, push, rd_wait, rd_lat, tok0, tok1, room0, room1 = \
        rows if rows is not None else _times(tl).tolist()
    pops, pushes = static.pops, static.pushes
    module, write_wait, mem_index = static.module, static.write_wait_list, static.mem_index
    per = [[0, 0, 0] for _ in range(5)]  # busy, command queue, dram, bus, fetch room
    busy, cmdq, dram_of, bus_of, fetch_room = per
    token_q, room_q = [0] * 4, [0] * 4
    ran = [0] * len(static.mem_types)
    data_wait = 0
    gap_begin = 0
    gaps = []  # (begin, end) of each wait for instruction bytes
    for j in range(len(module)):
        m, d, s = module[j], dispatch[j], start[j]
        a = avail[j]
        mid = d if a >= d else (a if a > gap_begin else gap_begin)  # min(max(a, begin), d)
        data_wait += mid - gap_begin
        gaps.append((gap_begin, mid))
        fetch_room[m] += d - mid
        gap_begin = d + 1
        b = free[j]
        mid = min(max(d + 1, b), s)
        cmdq[m] += mid - b
        qs = pops[j]
        if qs:  # waits on each popped queue's token, in order
            b, mid = mid, min(max(tok0[j], mid), s)
            token_q[qs[0]] += mid - b
            if len(qs) > 1:
                b, mid = mid, min(max(tok1[j], mid), s)
                token_q[qs[1]] += mid - b
        qs = pushes[j]
        p = push[j]
        if qs:  # waits for room in each pushed queue, in order
            mid = done[j]
            b, mid = mid, min(max(room0[j], mid), p)
            room_q[qs[0]] += mid - b
            if len(qs) > 1:
                b, mid = mid, min(max(room1[j], mid), p)
                room_q[qs[1]] += mid - b
        w = rd_wait[j]
        dram = rd_lat[j] + write_wait[j]
        dram_of[m] += dram
        bus_of[m] += w
        busy[m] += done[j] - s - w - dram + 1
        k = mem_index[j]
        if k >= 0:
            ran[k] += p + 1 - s
    return data_wait, _fetch_bus(tl, gaps), per, token_q, room_q, ran


# later than any cycle (a gap's end)
_AFTER_ANY = 1 << 62


def _fetch_bus(tl, gaps: list) -> int:
    """The cycles of fetch's waits for instruction bytes (``gaps``, [begin, end) each,
    disjoint and sorted) during which its burst waited for the read arbiter."""
    fetch_bus = 0
    pairs = getattr(tl, "_fetch_reads", None)  # request, grant, request, grant, ...
    for r, g in (zip(pairs[::2], pairs[1::2]) if pairs is not None
                 else _fetch_bursts(tl).tolist()):
        # the gaps that end after r and begin before g (disjoint and sorted: from the last
        # one beginning by r, the last gap at most (r, _AFTER_ANY))
        for a0, a1 in gaps[max(bisect_right(gaps, (r, _AFTER_ANY)) - 1, 0):]:
            if a0 >= g:
                break
            if a1 > r:
                fetch_bus += min(a1, g) - max(a0, r)
    return fetch_bus


# Programs shorter than this get their statistics from _sums_python, longer ones from
# _sums_numpy (the same numbers).
_PYTHON_STATS = 48


def _fetch_bursts(tl) -> np.ndarray:
    """(bursts, 2): request and grant of each of fetch's read bursts."""
    if tl.fetch_reads is not None:
        return tl.fetch_reads
    return np.array([(r, g) for client, _, _, r, g, *_ in tl.reads if client == 0],
                    np.int64).reshape(-1, 2)


def insn_stat_fields(insn, plan, writes, timing) -> tuple:
    """What the statistics need of one instruction, fixed by its fields (cycle._Static
    computes it once per instruction word): the index of its memory type in
    MEM_STAT_TYPES (-1: none), its write waits, and its read beats, read bursts, write
    beats and pipeline drain cycles."""
    if isinstance(insn, MemInsn):
        k = _MEM_STAT_INDEX.get(int(insn.mem_type) + 8 * int(insn.opcode), -1)
        if writes is not None:
            return k, writes[1] * timing.write_latency, 0, 0, writes[0], 0
        if isinstance(plan, int):
            return k, 0, 0, 0, 0, 0
        return k, 0, plan.beats, plan.n, 0, 0
    if isinstance(insn, (GemmInsn, AluInsn)):
        return -1, 0, 0, 0, 0, timing.drain_cycles(insn)
    return -1, 0, 0, 0, 0, 0


def timeline_stats(tl, cfg: HwConfig, counters: dict) -> dict:
    """The flat name -> number statistics of one run; ``counters`` are the datapath's.

    A timeline of the cycle model's schedule comes with its sums (``tl.sums``, made as the
    schedule went, by the rules of _sums_python) and the program's fixed parts (its
    cycle._Static); any other timeline gets them from _sums_python or _sums_numpy and
    _StaticStats."""
    pre = getattr(tl, "sums", None)
    if pre is not None:
        data_wait, gaps, *rest = pre
        return dict(zip(STAT_KEYS, stat_values(tl, cfg, counters,
                                               (data_wait, _fetch_bus(tl, gaps), *rest))))
    cycles = tl.cycles
    stats: dict = {"cycles": cycles, "time_us": cycles / cfg.clock_mhz}
    n = len(tl.insns)
    static = getattr(tl.static, "stats", None)
    if static is None:
        static = _StaticStats(tl)
        if tl.static is not None:
            tl.static.stats = static
    sums = _sums_python if n < _PYTHON_STATS else _sums_numpy
    data_wait, fetch_bus, per_module, token_q, room_q, ran = sums(tl, static)
    read_beats, read_bursts = static.read_beats, static.read_bursts
    write_beats, drain = static.write_beats, static.drain

    stats["fetch_busy_cycles"] = n
    stats["fetch_stall_dram_cycles"] = data_wait - fetch_bus
    stats["fetch_stall_bus_cycles"] = fetch_bus
    for key, value in zip(_CMDQ_FULL_KEYS, per_module[4]):
        stats[key] = value
    rows = getattr(tl, "rows", None)
    last_dispatch = rows[1][-1] if rows is not None else int(tl.dispatch[-1])
    stats["fetch_idle_cycles"] = cycles - last_dispatch - 1
    for m, name in enumerate(MODULES):
        busy, cmdq, tokens, rooms, dram, bus, idle = _MODULE_KEYS[name]
        row = [(busy, per_module[0][m]), (cmdq, per_module[1][m])]
        if name == "compute":  # inside busy: pipeline drain and hazard stalls
            hazard = sum(tl.stalls.values()) if tl.stalls else 0
            row = [(busy, per_module[0][m] - drain - hazard),
                   ("compute_stall_pipeline_cycles", drain),
                   ("compute_stall_hazard_cycles", hazard), row[1]]
        row += [(key, token_q[q]) for q, key in tokens]
        row += [(key, room_q[q]) for q, key in rooms]
        row.append((dram, per_module[2][m]))
        if bus is not None:  # store alone uses the write channel: it never waits for it
            row.append((bus, per_module[3][m]))
        stats.update(row)
        total = sum(value for _, value in row)
        stats[idle] = cycles - total

    stats["gemm_utilization"] = (counters["macs"] / (cycles * cfg.macs_per_cycle)
                                 if cycles else 0.0)
    # DRAM traffic: bytes the program asked for (no padding, no alignment) and beats used.
    fetch_bytes = n * 16
    read_bytes = fetch_bytes + sum(counters[f"{key}_load_bytes"] for key in _LOAD_BYTES.values())
    write_bytes = counters["out_store_bytes"]
    stats.update({
        "fetch_bytes": fetch_bytes,
        "dram_read_bytes": read_bytes,
        "dram_write_bytes": write_bytes,
        "dram_read_beats": read_beats,
        "dram_write_beats": write_beats,
        "dram_read_bursts": read_bursts,
        "dram_read_bytes_per_cycle": read_bytes / cycles if cycles else 0.0,
        "dram_write_bytes_per_cycle": write_bytes / cycles if cycles else 0.0,
        "dram_read_channel_utilization": read_beats / cycles if cycles else 0.0,
        "dram_write_channel_utilization": write_beats / cycles if cycles else 0.0,
    })
    # Achieved bandwidth of each buffer type: its bytes over the cycles its instructions ran.
    for c, (key, rate) in zip(ran, _BYTES_KEYS):
        stats[rate] = counters[key] / c if c else 0.0
    c = ran[-1]
    stats["out_store_bytes_per_cycle"] = write_bytes / c if c else 0.0
    return stats


def stat_values(tl, cfg: HwConfig, counters: dict, pre: tuple) -> list:
    """timeline_stats of a timeline with the schedule's sums ``pre`` (Timeline.stat_sums:
    its sums with fetch's bus wait in place of the gaps), as the list of its values in the
    order of STAT_KEYS (a run's statistics: CycleSimulator.run adds them to the counters;
    the rest of timeline_stats does the same one key at a time for any timeline)."""
    (data_wait, fetch_bus, (busy, cmdq, dram, bus, room), tq, rq, ran, fetch_beats,
     fetch_bursts) = pre
    cycles = tl.cycles
    n = len(tl.insns)
    plan_beats, plan_bursts, write_beats, drain = tl.static.stat_totals
    hazard = sum(tl.stalls.values()) if tl.stalls else 0
    read_beats = plan_beats + fetch_beats
    load = [busy[0], cmdq[0], tq[1], rq[0], dram[0], bus[0]]
    compute = [busy[1] - drain - hazard, drain, hazard, cmdq[1], tq[0], tq[3], rq[1], rq[2],
               dram[1], bus[1]]
    store = [busy[2], cmdq[2], tq[2], rq[3], dram[2]]
    loaded = _LOADED_BYTES(counters)
    read_bytes = n * 16 + sum(loaded)
    write_bytes = counters["out_store_bytes"]
    values = [cycles, cycles / cfg.clock_mhz, n, data_wait - fetch_bus, fetch_bus, *room,
              cycles - tl.last_dispatch - 1, *load, cycles - sum(load), *compute,
              cycles - sum(compute), *store, cycles - sum(store)]
    if cycles:
        values += [counters["macs"] / (cycles * cfg.macs_per_cycle), n * 16, read_bytes,
                   write_bytes, read_beats, write_beats, plan_bursts + fetch_bursts,
                   read_bytes / cycles, write_bytes / cycles, read_beats / cycles,
                   write_beats / cycles]
    else:
        values += [0.0, n * 16, read_bytes, write_bytes, read_beats, write_beats,
                   plan_bursts + fetch_bursts, 0.0, 0.0, 0.0, 0.0]
    for b, c in zip(loaded, ran):
        values.append(b / c if c else 0.0)
    c = ran[-1]
    values.append(write_bytes / c if c else 0.0)
    return values


# ---- Chrome / Perfetto trace -----------------------------------------------------------


def _label(insn) -> str:
    if isinstance(insn, MemInsn):
        return f"{insn.opcode.name} {insn.mem_type.name}"
    if isinstance(insn, GemmInsn):
        return "GEMM reset" if insn.reset else "GEMM"
    if isinstance(insn, AluInsn):
        return f"ALU {insn.alu_op.name}"
    assert isinstance(insn, FinishInsn)
    return "FINISH"


def trace_dict(tl) -> dict:
    """Trace Event Format: one track per unit (fetch, load, compute, store, DRAM read and
    write channels), an "X" event per instruction with its index and text, and "X" events
    (category "stall") for every wait. Times are in cycles (shown as microseconds)."""
    events: list[dict] = [{"ph": "M", "pid": 0, "name": "process_name",
                           "args": {"name": "celosia cycle model (1 us shown = 1 cycle)"}}]
    for name, tid in _TIDS.items():
        events.append({"ph": "M", "pid": 0, "tid": tid, "name": "thread_name",
                       "args": {"name": name}})
        events.append({"ph": "M", "pid": 0, "tid": tid, "name": "thread_sort_index",
                       "args": {"sort_index": tid}})

    def span(tid, name, begin, end, cat, args=None):
        if end > begin:
            ev = {"ph": "X", "pid": 0, "tid": tid, "name": name, "cat": cat, "ts": int(begin),
                  "dur": int(end - begin)}
            if args:
                ev["args"] = args
            events.append(ev)

    writes = tl.writes or {}
    for j, insn in enumerate(tl.insns):
        m = int(tl.module[j])
        tid = m + 1
        s, c, p = int(tl.start[j]), int(tl.done[j]), int(tl.push[j])
        span(tid, _label(insn), s, p + 1, "insn", {"index": j, "insn": format_insn(insn)})
        begin = int(tl.free[j])
        mid = min(max(int(tl.dispatch[j]) + 1, begin), s)
        span(tid, "wait: command queue empty", begin, mid, "stall")
        begin = mid
        for col in range(2):
            q = int(tl.pop_q[j, col])
            if q >= 0:
                mid = min(max(int(tl.tok_ready[j, col]), begin), s)
                span(tid, f"wait: token {_QUEUE_NAMES[q]}", begin, mid, "stall")
                begin = mid
        begin = c
        for col in range(2):
            q = int(tl.push_q[j, col])
            if q >= 0:
                mid = min(max(int(tl.room_ready[j, col]), begin), p)
                span(tid, f"wait: room in {_QUEUE_NAMES[q]}", begin, mid, "stall")
                begin = mid
        if isinstance(insn, (GemmInsn, AluInsn)):  # the last micro-ops leave the pipeline
            hazard = tl.stalls.get(j, 0) if tl.stalls else 0
            span(tid, "pipeline drain", c - tl.timing.drain_cycles(insn), c, "stall",
                 {"hazard_stalls": hazard} if hazard else None)
        if j in writes:
            beats, nb = writes[j]
            span(_TIDS["dram write"], f"STORE #{j}", s + 2, c - 1, "dram",
                 {"index": j, "beats": beats, "bursts": nb})
    for client, idx, r, g, f, x in tl.read_bursts().tolist():
        if client == 0:
            name = f"fetch batch {idx}"
        else:
            name = f"{_label(tl.insns[idx])} #{idx}"
            tid = client + 1
            span(tid, "wait: DRAM read channel", r, g, "stall")
            span(tid, "DRAM latency", g, f, "stall")
        span(_TIDS["dram read"], name, f, x + 1, "dram", {"request": r, "grant": g})
    gap_begin = 0
    for j in range(len(tl.insns)):
        d = int(tl.dispatch[j])
        mid = min(max(int(tl.avail[j]), gap_begin), d)
        span(0, "wait: instruction bytes", gap_begin, mid, "stall")
        span(0, f"wait: room in {MODULES[int(tl.module[j])]} command queue", mid, d, "stall")
        gap_begin = d + 1
    for request, first_insn, count in tl.batches.tolist():
        last = int(tl.dispatch[first_insn + count - 1]) + 1
        span(0, f"fetch [{first_insn}, {first_insn + count})", request, last, "insn",
             {"first": first_insn, "count": count})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"time_unit": "cycle", "cycles": tl.cycles}}


def write_trace(tl, path: str | Path) -> None:
    path = Path(path)
    try:
        path.write_text(json.dumps(trace_dict(tl)))
    except OSError as exc:
        raise CelosiaError(f"cannot write the trace {path}: {exc.strerror}") from None


# ---- PNG timeline ----------------------------------------------------------------------

_COLORS = {"LOAD": "#4c72b0", "STORE": "#55a868", "GEMM": "#c44e52", "ALU": "#dd8452",
           "FINISH": "#8172b2", "fetch": "#937860"}


def _as_trace(source) -> dict:
    if isinstance(source, dict) and "traceEvents" in source:
        return source
    if isinstance(source, (str, Path)):
        try:
            return json.loads(Path(source).read_text())
        except OSError as exc:
            raise CelosiaError(f"cannot read the trace {source}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise CelosiaError(f"{source}: not a JSON trace ({exc.msg})") from None
    timeline = getattr(source, "timeline", source)
    if timeline is None or not hasattr(timeline, "trace"):
        raise CelosiaError("plot_timeline needs a trace (dict or JSON file), a Timeline, or a "
                           "CycleSimulator that has run a program")
    return timeline.trace()


def plot_timeline(trace_or_result, path: str | Path, *, width: float = 14.0) -> None:
    """Write a PNG timeline (one row per unit) of a trace dict, a trace JSON file, a
    :class:`~celosia.sim.cycle.Timeline`, or a CycleSimulator after its last run.

    Needs matplotlib (an optional dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CelosiaError("plot_timeline needs matplotlib, which is not installed; install it "
                           "with `pip install matplotlib`") from None
    trace = _as_trace(trace_or_result)
    names = {ev["tid"]: ev["args"]["name"] for ev in trace["traceEvents"]
             if ev.get("ph") == "M" and ev.get("name") == "thread_name"}
    bars: dict = {}
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "X":
            continue
        if ev.get("cat") == "stall":
            color = "#bbbbbb"
        elif ev["tid"] == 0:
            color = _COLORS["fetch"]
        else:
            color = _COLORS.get(ev["name"].split()[0], "#777777")
        bars.setdefault((ev["tid"], color, ev.get("cat") == "stall"), []).append(
            (ev["ts"], ev["dur"]))
    tids = sorted(names)
    fig, ax = plt.subplots(figsize=(width, 0.6 * len(tids) + 1.2))
    for (tid, color, is_stall), spans in bars.items():
        row = tids.index(tid)
        height = 0.35 if is_stall else 0.7
        ax.broken_barh(spans, (row - height / 2, height), facecolors=color, linewidth=0)
    ax.set_yticks(range(len(tids)), [names[t] for t in tids])
    ax.invert_yaxis()
    ax.set_xlabel("cycle")
    ax.set_title("celosia cycle model timeline (grey: waits)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
