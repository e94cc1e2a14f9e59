"""A stream of inputs pipelined: the CPU works on one input while the accelerator runs another.

``AccelModel.run`` executes one node at a time, so one input's latency is the sum of its
accelerator time, its CPU time and the packing/unpacking at region borders. Given several
inputs (a batch split into single inputs, or a stream), the two sides can overlap: while the
accelerator runs input k's layers, the CPU can run input k-1's CPU segment. This module lays
the work of such a stream on one timeline.

Each input is run for real (``AccelModel.run_stream``: outputs identical to ``run``'s, one
input at a time); its per-node report gives the durations, which this module schedules on two
resources:

- the **accelerator** lane: each accelerator node for its simulated cycles at the configured
  clock;
- the **CPU** lane: each CPU node for its measured time, and the packing/unpacking at region
  borders (CPU work) for its measured time.

Within one input the stages keep the order they ran in (a conservative choice: independent
branches of one input do not overlap each other). Consecutive stages on the same lane merge
into one. The schedule is greedy list scheduling: whenever a lane can start something, it
starts the stage that can start earliest, the oldest input first on a tie. At most ``depth``
inputs are in flight at once: each one in flight needs its own copy of the activation buffers
in DRAM (weights and programs are shared), so ``depth`` = 2 is double buffering.

Figures (``schedule``): ``makespan_ms`` of the whole stream, ``throughput_ips`` (inputs per
second), ``serial_ms`` and ``serial_throughput_ips`` (one stage at a time, as ``run`` does),
``cpu_ms_per_input`` and ``accel_ms_per_input`` (means), ``bound_ips`` = 1 / max(the two),
the most any schedule of these stages can reach, and ``throughput_vs_bound``; per input its
``latency_ms`` (from the moment it is admitted to its last stage's end).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["stages", "schedule", "plot_stream"]

LANES = ("accel", "cpu")


def stages(rows: list[dict]) -> list[dict]:
    """One input's report rows as ordered stages ``{"lane", "ms", "nodes"}``: a node's
    layout time (packing its inputs, or unpacking at a border) on the CPU lane, then its own
    work on its lane; consecutive stages of one lane merged."""
    out: list[dict] = []

    def add(lane: str, ms: float, node: str) -> None:
        if ms <= 0:
            return
        if out and out[-1]["lane"] == lane:
            out[-1]["ms"] += ms
            if out[-1]["nodes"][-1] != node:
                out[-1]["nodes"].append(node)
        else:
            out.append({"lane": lane, "ms": ms, "nodes": [node]})

    for r in rows:
        add("cpu", r.get("layout_ms") or 0.0, r["node"])
        if r["target"] == "accel":
            if r.get("accel_ms") is None:
                raise ValueError(f"node {r['node']!r} has no accelerator time: pipelining "
                                 f"needs a timed target (the cycle model)")
            add("accel", r["accel_ms"], r["node"])
        else:
            add("cpu", r.get("cpu_ms") or 0.0, r["node"])
    return out


def schedule(reports: list[list[dict]], depth: int = 2) -> dict:
    """The pipelined timeline of the inputs whose per-node reports are ``reports`` (module
    doc): figures and the ``spans`` ``{"input", "lane", "start", "end", "nodes"}``."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1 (inputs in flight), not {depth}")
    if not reports:
        raise ValueError("no inputs to schedule")
    work = [stages(rows) for rows in reports]
    n = len(work)
    nxt = [0] * n                 # each input's next stage
    ready = [0.0] * n             # when that stage may start
    admitted = [None] * n         # when each input entered the pipeline
    finish: list[float | None] = [None] * n
    free = {lane: 0.0 for lane in LANES}
    spans: list[dict] = []
    while any(f is None for f in finish):
        best = None
        for k in range(n):
            if finish[k] is not None:
                continue
            if k >= depth and finish[k - depth] is None:
                break  # later inputs wait for a free set of buffers too
            if admitted[k] is None:
                admitted[k] = ready[k] = finish[k - depth] if k >= depth else 0.0
                if not work[k]:  # nothing to do: done as it enters
                    finish[k] = admitted[k]
                    break  # the inputs it held back may enter now
            st = work[k][nxt[k]]
            start = max(free[st["lane"]], ready[k])
            if best is None or start < best[0]:
                best = (start, k)
        if best is None:
            continue
        start, k = best
        st = work[k][nxt[k]]
        end = start + st["ms"]
        spans.append({"input": k, "lane": st["lane"], "start": start, "end": end,
                      "nodes": st["nodes"]})
        free[st["lane"]] = ready[k] = end
        nxt[k] += 1
        if nxt[k] == len(work[k]):
            finish[k] = end
    makespan = max(finish)
    per_lane = {lane: sum(s["ms"] for w in work for s in w if s["lane"] == lane) / n
                for lane in LANES}
    serial = sum(s["ms"] for w in work for s in w)
    busiest = max(per_lane.values())
    latencies = [finish[k] - admitted[k] for k in range(n)]
    ips = (lambda ms: n / ms * 1e3 if ms > 0 else float("inf"))
    return {
        "inputs": n, "depth": depth,
        "makespan_ms": makespan, "throughput_ips": ips(makespan),
        "serial_ms": serial, "serial_throughput_ips": ips(serial),
        "cpu_ms_per_input": per_lane["cpu"], "accel_ms_per_input": per_lane["accel"],
        "bound_ips": 1e3 / busiest if busiest > 0 else float("inf"),
        "throughput_vs_bound": (busiest * n / makespan) if makespan > 0 else 1.0,
        "speedup_vs_serial": serial / makespan if makespan > 0 else 1.0,
        "latency_ms": latencies,
        "spans": spans,
    }


def plot_stream(result: dict, path, *, title: str = "") -> None:
    """A PNG of the pipelined stream: the accelerator and CPU lanes, each stage coloured by
    its input, above the same stages run one at a time for comparison."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        from ..errors import CelosiaError
        raise CelosiaError("the timeline picture needs matplotlib: pip install "
                           "'celosia[plot]'") from None
    n = result["inputs"]
    cmap = plt.get_cmap("tab10")
    lanes = {"accel": 1, "cpu": 0}
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 4.8), sharex=True)
    for s in result["spans"]:
        ax.barh(lanes[s["lane"]], s["end"] - s["start"], left=s["start"], height=0.6,
                color=cmap(s["input"] % 10), edgecolor="none")
    # the same stages one at a time (``run``'s order): input after input
    t = 0.0
    for k in range(n):
        for s in sorted((s for s in result["spans"] if s["input"] == k),
                        key=lambda s: s["start"]):
            ms = s["end"] - s["start"]
            ax2.barh(lanes[s["lane"]], ms, left=t, height=0.6, color=cmap(k % 10),
                     edgecolor="none")
            t += ms
    for a, what in ((ax, f"pipelined, {result['depth']} inputs in flight: "
                         f"{result['throughput_ips']:.1f} inputs/s "
                         f"({result['throughput_vs_bound']:.0%} of the bound "
                         f"{result['bound_ips']:.1f})"),
                    (ax2, f"one node at a time: {result['serial_throughput_ips']:.1f} "
                          f"inputs/s")):
        a.set_yticks([1, 0])
        a.set_yticklabels(["accelerator", "CPU + layout"])
        a.set_title(what, fontsize=9)
    ax2.set_xlabel("time (ms): accelerator simulated at the configured clock, CPU measured; "
                   "colour = input")
    ax2.set_xlim(0, max(t, result["makespan_ms"], 1e-6))
    fig.suptitle(title or f"a stream of {n} inputs")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
