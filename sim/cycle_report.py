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
from pathlib import Path

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError
from celosia.isa import AluInsn, FinishInsn, GemmInsn, MemInsn, MemType, format_insn

__all__ = ["timeline_stats", "trace_dict", "write_trace", "plot_timeline", "MODULES"]

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


def _split(begin: np.ndarray, ready: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cycles of [begin, end) spent before ``ready``, and the new begin."""
    mid = np.minimum(np.maximum(ready, begin), end)
    return mid - begin, mid


def _waits(tl, mask):
    """Per instruction of ``mask``: (command-queue wait, [(queue ids, token waits)] per
    pop column, [(queue ids, room waits)] per push column)."""
    ready_cmd = tl.dispatch[mask] + 1
    begin, start = tl.free[mask], tl.start[mask]
    cmd, begin = _split(begin, ready_cmd, start)
    tokens = []
    for col in range(2):
        wait, begin = _split(begin, tl.tok_ready[mask, col], start)
        tokens.append((tl.pop_q[mask, col], wait))
    begin, push = tl.done[mask], tl.push[mask]
    rooms = []
    for col in range(2):
        wait, begin = _split(begin, tl.room_ready[mask, col], push)
        rooms.append((tl.push_q[mask, col], wait))
    return cmd, tokens, rooms


def _overlap(a0, a1, b0, b1) -> int:
    """Total length of the intersection of two sets of disjoint intervals [a0, a1) and
    [b0, b1) (each set sorted)."""
    total = 0
    for s, e in zip(b0.tolist(), b1.tolist()):
        if e <= s:
            continue
        lo = int(np.searchsorted(a1, s, side="right"))
        hi = int(np.searchsorted(a0, e, side="left"))
        if hi > lo:
            total += int((np.minimum(a1[lo:hi], e) - np.maximum(a0[lo:hi], s)).clip(0).sum())
    return total


def timeline_stats(tl, cfg: HwConfig, counters: dict) -> dict:
    """The flat name -> number statistics of one run; ``counters`` are the datapath's."""
    t = tl.timing
    cycles = tl.cycles
    stats: dict = {"cycles": cycles, "time_us": cycles / cfg.clock_mhz}
    n = len(tl.insns)
    bursts = tl.read_bursts()
    fetch_bursts = bursts[bursts[:, 0] == 0]

    # fetch: one busy cycle per dispatch; the gap before each dispatch is first waiting for
    # the instruction's bytes (behind another client's burst: bus; else DRAM), then for
    # room in its module's command queue.
    gap_begin = np.concatenate(([0], tl.dispatch[:-1] + 1))
    data_wait, data_end = _split(gap_begin, tl.avail, tl.dispatch)
    room_wait = tl.dispatch - gap_begin - data_wait
    fetch_bus = _overlap(gap_begin, data_end, fetch_bursts[:, 2], fetch_bursts[:, 3])
    stats["fetch_busy_cycles"] = n
    stats["fetch_stall_dram_cycles"] = int(data_wait.sum()) - fetch_bus
    stats["fetch_stall_bus_cycles"] = fetch_bus
    for m, name in enumerate(MODULES):
        stats[f"fetch_stall_cmdq_full_{name}_cycles"] = int(room_wait[tl.module == m].sum())
    stats["fetch_idle_cycles"] = cycles - int(tl.dispatch[-1]) - 1

    writes = tl.writes or {}
    w_index = np.array(sorted(writes), np.int64)
    w_info = np.array([writes[j] for j in w_index.tolist()], np.int64).reshape(-1, 2)
    write_wait = np.zeros(n, np.int64)
    write_wait[w_index] = w_info[:, 1] * t.write_latency
    for m, name in enumerate(MODULES):
        mask = tl.module == m
        cmd, tokens, rooms = _waits(tl, mask)
        run = tl.done[mask] - tl.start[mask]
        bus, dram = tl.rd_wait[mask], tl.rd_lat[mask] + write_wait[mask]
        busy = run - bus - dram + 1  # + the push cycle
        row = {f"{name}_busy_cycles": int(busy.sum()),
               f"{name}_stall_cmdq_empty_cycles": int(cmd.sum())}
        for q in _POPS[name]:
            row[f"{name}_stall_token_{_QUEUE_ENDS[q][0]}_cycles"] = int(
                sum(w[qs == q].sum() for qs, w in tokens))
        for q in _PUSHES[name]:
            row[f"{name}_stall_push_{_QUEUE_ENDS[q][1]}_cycles"] = int(
                sum(w[qs == q].sum() for qs, w in rooms))
        row[f"{name}_stall_dram_cycles"] = int(dram.sum())
        if name != "store":  # store alone uses the write channel: it never waits for it
            row[f"{name}_stall_bus_cycles"] = int(bus.sum())
        row[f"{name}_idle_cycles"] = cycles - sum(row.values())
        stats.update(row)

    stats["gemm_utilization"] = (counters["macs"] / (cycles * cfg.macs_per_cycle)
                                 if cycles else 0.0)
    # DRAM traffic: bytes the program asked for (no padding, no alignment) and beats used.
    fetch_beats = sum(sum(tl._batch(b).burst_beats) for b in range(len(tl.batches)))
    read_beats = fetch_beats + sum(p.beats for p in tl.plans if not isinstance(p, int))
    write_beats = int(w_info[:, 0].sum())
    fetch_bytes = n * 16
    read_bytes = fetch_bytes + sum(counters[f"{key}_load_bytes"] for key in _LOAD_BYTES.values())
    write_bytes = counters["out_store_bytes"]
    stats.update({
        "fetch_bytes": fetch_bytes,
        "dram_read_bytes": read_bytes,
        "dram_write_bytes": write_bytes,
        "dram_read_beats": read_beats,
        "dram_write_beats": write_beats,
        "dram_read_bursts": int(bursts.shape[0]),
        "dram_read_bytes_per_cycle": read_bytes / cycles if cycles else 0.0,
        "dram_write_bytes_per_cycle": write_bytes / cycles if cycles else 0.0,
        "dram_read_channel_utilization": read_beats / cycles if cycles else 0.0,
        "dram_write_channel_utilization": write_beats / cycles if cycles else 0.0,
    })
    # Achieved bandwidth of each buffer type: its bytes over the cycles its instructions ran.
    mem = np.array([int(i.mem_type) + (8 * int(i.opcode)) if isinstance(i, MemInsn) else -1
                    for i in tl.insns], np.int64)  # LOAD: mem_type, STORE: 8 + mem_type
    ran = tl.push + 1 - tl.start
    for mem_type, key in _LOAD_BYTES.items():
        c = int(ran[mem == int(mem_type)].sum())
        stats[f"{key}_load_bytes_per_cycle"] = counters[f"{key}_load_bytes"] / c if c else 0.0
    c = int(ran[mem == 8 + int(MemType.OUT)].sum())
    stats["out_store_bytes_per_cycle"] = write_bytes / c if c else 0.0
    return stats


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
