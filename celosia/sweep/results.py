"""The results directory of a sweep (DIR):

    spec.toml              the spec as given (``--resume`` checks it is the same)
    rows.jsonl             one JSON row per finished point, appended and flushed as points
                           finish: what ``--resume`` reads (a torn last line is ignored)
    cache/<config hash>/   the schedule-search entries of that configuration (tune/*.json of
                           the workers, shipped back to them) and synth-<part>.json
    results.parquet        every row, in spec order (written at the end of each run)
    summary.json           counts, timings, the Pareto front, the default configuration's row
    pareto.png             latency against area, the front marked, the default highlighted
    report.md              the front as a table

Parquet (pyarrow) rather than CSV: typed columns (ints stay ints, empty values are nulls,
not empty strings), and pandas, polars, DuckDB and Spark read it as is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

__all__ = ["Store", "pareto_front", "write_outputs"]


class Store:
    def __init__(self, out: Path):
        self.out = Path(out)
        self.rows_path = self.out / "rows.jsonl"

    def rows(self) -> list[dict]:
        if not self.rows_path.exists():
            return []
        rows = {}
        for line in self.rows_path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # the torn last line of a killed run
            rows[row["key"]] = row
        return list(rows.values())

    def repair(self) -> None:
        """Cut a torn last line (a run killed while writing it) so the next row starts on a
        line of its own."""
        if not self.rows_path.exists():
            return
        data = self.rows_path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.rows_path.write_bytes(data[:data.rfind(b"\n") + 1])

    def append(self, row: dict) -> None:
        with open(self.rows_path, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()

    def cache_files(self, config_hash: str) -> dict:
        d = self.out / "cache" / config_hash / "tune"
        return {p.name: p.read_text() for p in sorted(d.glob("*.json"))} if d.is_dir() else {}

    def add_cache(self, config_hash: str, files: dict) -> None:
        if not files:
            return
        d = self.out / "cache" / config_hash / "tune"
        d.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (d / name).write_text(text)

    def synth_report(self, config_hash: str, part: str):
        p = self.out / "cache" / config_hash / f"synth-{part}.json"
        return json.loads(p.read_text()) if p.exists() else None

    def add_synth(self, config_hash: str, part: str, report: dict) -> None:
        d = self.out / "cache" / config_hash
        d.mkdir(parents=True, exist_ok=True)
        (d / f"synth-{part}.json").write_text(json.dumps(report, indent=1))


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point is at least as good as in both coordinates and
    better in one (both minimised)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((a <= x and b <= y) and (a < x or b < y) for j, (a, b) in enumerate(points)
                   if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i])


def per_config(spec, rows: list[dict]) -> list[dict]:
    """One entry per configuration: its fields, area, and the latency summed over the
    workloads (None unless every workload ran and met the constraints)."""
    by_cfg: dict = {}
    for r in rows:
        by_cfg.setdefault(r["config_hash"], []).append(r)
    out = []
    for h, rs in by_cfg.items():
        rs.sort(key=lambda r: r["workload_index"])
        ok = len(rs) == len(spec.workloads) and all(r["feasible"] for r in rs)
        first = rs[0]
        out.append({
            "config_hash": h, "config_index": first["config_index"],
            "config": {k: first[k] for k in spec.space},
            "area": first.get(spec.area), "feasible": ok,
            "latency_ms": sum(r["latency_ms"] for r in rs) if ok else None,
            "cycles": sum(r["cycles"] for r in rs) if ok else None,
            "is_default": first.get("is_default", False),
            "why_not": "" if ok else "; ".join(
                f"{r['workload']}: {r['status']}{': ' + r['reason'] if r['reason'] else ''}"
                f"{': ' + r['violations'] if r.get('violations') else ''}"
                for r in rs if not r["feasible"])[:300],
        })
    out.sort(key=lambda c: c["config_index"])
    return out


def write_outputs(spec, store: Store, rows: list[dict], run_info: dict) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = sorted(rows, key=lambda r: (r["config_index"], r["workload_index"]))
    columns: dict = {}  # every row's keys (a failed point has no metrics), first seen first
    for r in rows:
        columns.update(dict.fromkeys(r))
    table = pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in rows])
    pq.write_table(table, store.out / "results.parquet")
    configs = per_config(spec, rows)
    feasible = [c for c in configs if c["feasible"] and c["area"] is not None]
    front = [feasible[i] for i in pareto_front([(c["area"], c["latency_ms"]) for c in feasible])]
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    default = next((c for c in configs if c["is_default"]), None)
    summary = {
        "points": len(rows), "configurations": len(configs),
        "workloads": [w.name for w in spec.workloads], "status": counts,
        "feasible_configurations": len(feasible), "area": spec.area, "part": spec.part,
        "objectives": spec.objectives, "constraints": spec.constraints,
        "search": {"method": spec.method, "n": spec.n, "seed": spec.seed},
        "pareto_front": front, "default": default, **run_info,
    }
    (store.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    _plot(spec, configs, front, store.out / "pareto.png", bool(run_info.get("synth")))
    _report(spec, summary, configs, front, store.out / "report.md")
    return summary


def _plot(spec, configs, front, path: Path, synth: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    ok = [c for c in configs if c["feasible"] and c["area"] is not None]
    ax.scatter([c["area"] for c in ok], [c["latency_ms"] for c in ok], s=18, c="tab:blue",
               alpha=0.6, label=f"configurations ({len(ok)} feasible)")
    if front:
        ax.plot([c["area"] for c in front], [c["latency_ms"] for c in front], "-o",
                c="tab:red", ms=6, label=f"Pareto front ({len(front)})")
    default = [c for c in ok if c["is_default"]]
    if default:
        ax.scatter([default[0]["area"]], [default[0]["latency_ms"]], marker="*", s=260,
                   c="gold", edgecolors="black", zorder=5, label="base configuration ([base])")
    ax.set_xlabel(f"{spec.area.upper()} on {spec.part} "
                  f"({'Yosys synthesis' if synth else 'analytic estimate'})")
    ax.set_ylabel(f"latency, ms (sum over {len(spec.workloads)} workloads)")
    if ok and max(c["latency_ms"] for c in ok) / max(1e-12, min(c["latency_ms"] for c in ok)) > 20:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("celosia sweep: latency against area")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _report(spec, summary, configs, front, path: Path) -> None:
    keys = list(spec.space)
    lines = [
        "# celosia sweep: the Pareto front", "",
        f"{summary['points']} points ({summary['configurations']} configurations x "
        f"{len(spec.workloads)} workloads: {', '.join(summary['workloads'])}); status "
        f"{', '.join(f'{k} {v}' for k, v in sorted(summary['status'].items()))}; "
        f"{summary['feasible_configurations']} configurations feasible on the {spec.part}.",
        "",
        f"Latency is the sum over the workloads on the cycle model at each configuration's "
        f"clock; area is {spec.area.upper()} ({'Yosys synthesis' if summary.get('synth') else 'analytic estimate, celosia/sweep/resources.py'}).",
        "",
        "| " + " | ".join(keys + [spec.area, "latency (ms)", "cycles", "default"]) + " |",
        "|" + "---|" * (len(keys) + 4),
    ]
    for c in front:
        lines.append("| " + " | ".join([str(c["config"][k]) for k in keys] + [
            f"{c['area']:g}", f"{c['latency_ms']:.4g}", str(c["cycles"]),
            "yes" if c["is_default"] else ""]) + " |")
    d = summary.get("default")
    if d:
        where = "on the front" if any(c["config_hash"] == d["config_hash"] for c in front) \
            else "not on the front"
        lat = f"{d['latency_ms']:.4g} ms" if d["latency_ms"] is not None else d["why_not"]
        lines += ["", f"Default configuration (the base): {spec.area.upper()} {d['area']}, "
                      f"latency {lat}; {where}."]
    infeasible = [c for c in configs if not c["feasible"]]
    if infeasible:
        lines += ["", f"## Not feasible ({len(infeasible)})", ""]
        for c in infeasible[:50]:
            lines.append(f"- {json.dumps(c['config'])}: {c['why_not']}")
        if len(infeasible) > 50:
            lines.append(f"- ... and {len(infeasible) - 50} more (results.parquet)")
    path.write_text("\n".join(lines) + "\n")


def fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
