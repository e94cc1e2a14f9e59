"""Reports of a partitioned model's run: a per-node table, a JSON file and a timeline picture.

The timeline lays the nodes end to end as they ran (the runtime runs one node at a time):
accelerator nodes for their simulated time at the configured clock, CPU nodes for their
measured time, and the packing/unpacking at region borders as its own lane. A second panel
shows each accelerator layer's utilisation (real multiply-adds over cycles x MACs per cycle,
compiler/graph/macs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["format_table", "write_json", "plot_timeline"]


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def format_table(rows: list[dict], summary: dict) -> str:
    """A fixed-width table: node, op, where, accelerator cycles and ms, CPU ms, utilisation
    (real multiply-adds over cycles x MACs per cycle), padding overhead (the GEMM core's
    multiply-adds on padding, relative to the real ones), and for CPU nodes why they are
    there."""
    head = (f"{'node':<18} {'op':<22} {'where':<6} {'cycles':>11} {'accel ms':>9} "
            f"{'cpu ms':>8} {'util':>5} {'pad':>6}  why on the CPU")
    lines = [head, "-" * len(head)]
    for r in rows:
        accel = r["target"] == "accel"
        cycles = _fmt(r["cycles"], ",") if accel and r["cycles"] is not None else "-"
        ms = _fmt(r["accel_ms"], ".3f") if accel and r["accel_ms"] is not None else "-"
        util = _fmt(r.get("utilization"), ".0%")
        pad = _fmt(r.get("padding_overhead"), "+.0%")
        why = "" if accel else r.get("reason", "")
        lines.append(f"{r['node'][:18]:<18} {r['op'][:22]:<22} {r['target']:<6} {cycles:>11} "
                     f"{ms:>9} {r['cpu_ms'] + r['layout_ms']:>8.3f} {util:>5} {pad:>6}  {why}")
    s = summary
    lines.append("-" * len(head))
    cyc = f"{s['cycles']:,} cycles" if s["cycles"] is not None else "untimed target"
    lines.append(f"{s['accel_nodes']} nodes on the accelerator ({cyc}, "
                 f"{_fmt(s['accel_ms'], '.3f')} ms at {_clock(s)}, utilisation "
                 f"{_fmt(s['utilization'], '.1%')} of real multiply-adds, padding overhead "
                 f"{_fmt(s.get('padding_overhead'), '+.1%')}), {s['cpu_nodes']} on the CPU "
                 f"({s['cpu_ms']:.3f} ms) + layout {s['layout_ms']:.3f} ms")
    return "\n".join(lines)


def _clock(s: dict) -> str:
    """The claimed clock and what place and route has shown of it (fpga/clock.py)."""
    clock = s.get("clock")
    if clock is None:
        return f"{s['clock_mhz']:g} MHz"
    if clock["met"] is False and s.get("accel_ms_at_fmax") is not None:
        return f"{clock['text']}; {s['accel_ms_at_fmax']:.3f} ms at its Fmax"
    return clock["text"]


def write_json(path, data: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, default=float) + "\n")


def plot_timeline(rows: list[dict], summary: dict, path, *, title: str = "") -> None:
    """A PNG: the model's latency as a Gantt chart (accelerator, CPU, layout lanes) and the
    accelerator layers' utilisation."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        from ..errors import CelosiaError
        raise CelosiaError("the timeline picture needs matplotlib: pip install "
                           "'celosia[plot]'") from None
    lanes = {"accel": 2, "cpu": 1, "layout": 0}
    colors = {"accel": "#2a9d8f", "cpu": "#e76f51", "layout": "#adb5bd"}
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 5.5), height_ratios=[1.4, 1])
    t = 0.0
    for r in rows:
        spans = [("layout", r["layout_ms"])]
        spans.append(("accel", r["accel_ms"] or 0.0) if r["target"] == "accel"
                     else ("cpu", r["cpu_ms"]))
        for lane, ms in spans:
            if ms <= 0:
                continue
            ax.barh(lanes[lane], ms, left=t, height=0.6, color=colors[lane],
                    edgecolor="white", linewidth=0.5)
            if lane != "layout" and ms > 0.04 * max(summary["latency_ms"], 1e-9):
                ax.text(t + ms / 2, lanes[lane], r["node"], ha="center", va="center",
                        fontsize=7, color="white", clip_on=True)
            t += ms
    ax.set_yticks(list(lanes.values()))
    ax.set_yticklabels(["accelerator", "CPU", "pack/unpack"])
    ax.set_xlabel("time (ms): accelerator simulated at the configured clock, CPU measured")
    ax.set_xlim(0, max(t, 1e-6))
    ax.set_title(title or "model timeline")
    accel = [r for r in rows if r["target"] == "accel"]
    if accel:
        names = [r["node"] for r in accel]
        util = [(r.get("utilization") or 0.0) * 100 for r in accel]
        ax2.bar(range(len(accel)), util, color=colors["accel"])
        ax2.set_xticks(range(len(accel)))
        ax2.set_xticklabels(names, rotation=45 if len(names) > 8 else 0, ha="right"
                            if len(names) > 8 else "center", fontsize=7)
        ax2.set_ylabel("utilisation (% of peak,\nreal MACs)")
        ax2.set_ylim(0, 100)
    else:
        ax2.text(0.5, 0.5, "no accelerator layers", ha="center", va="center")
        ax2.set_axis_off()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
