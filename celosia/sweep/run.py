"""``run_sweep``: the driver of `celosia sweep` (docs/sweep.md). It lists the points of the
spec, skips those already in DIR (``resume``), sends the rest to an engine, appends every
finished row to DIR/rows.jsonl, keeps the workers' schedule-cache entries in DIR/cache, and
writes the results, the summary, the Pareto picture and the report."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from celosia.config import ConfigError
from celosia.errors import CelosiaError

from .engines import ENGINES, run_local, run_ray
from .results import Store, fmt_eta, write_outputs
from .spec import Spec, config_hash
from .task import point_key, run_point, run_synth

__all__ = ["run_sweep", "Progress"]


class Progress:
    """Points done, rate and ETA on one line (rewritten in place on a terminal; a line per
    5% otherwise)."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.done, self.enabled = total, 0, enabled
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.step = max(1, total // 20)

    def line(self) -> str:
        elapsed = time.perf_counter() - self.t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        width = 24
        filled = int(width * self.done / self.total) if self.total else width
        return (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} points, "
                f"{rate * 3600:.0f} points/h, elapsed {fmt_eta(elapsed)}, ETA {fmt_eta(eta)}")

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.tty:
            print("\r" + self.line(), end="", file=self.stream, flush=True)
        elif self.done % self.step == 0 or self.done == self.total:
            print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=self.stream, flush=True)


def _engine(engine: str, fn, payloads, workers: int, address: str | None,
            timing: dict | None = None):
    if engine == "local":
        return run_local(fn, payloads, workers, timing)
    return run_ray(fn, payloads, workers, address, timing)


def run_sweep(spec: Spec, out, *, engine: str = "local", address: str | None = None,
              workers: int | None = None, resume: bool = False, limit: int | None = None,
              synth: bool = False, progress: bool = True) -> dict:
    """Run (or continue) the sweep; the summary (also DIR/summary.json)."""
    if engine not in ENGINES:
        raise CelosiaError(f"unknown engine {engine!r}; engines are {', '.join(ENGINES)}")
    if address and engine != "ray":
        raise CelosiaError("--address joins a Ray cluster: use it with --engine ray")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise CelosiaError(f"--workers must be at least 1, not {workers}")
    if limit is not None and limit < 0:
        raise CelosiaError(f"--limit must be at least 0, not {limit}")
    out = Path(out)
    store = Store(out)
    kept = out / "spec.toml"
    if store.rows_path.exists() and not resume:
        raise CelosiaError(f"{out} holds a sweep already (rows.jsonl): give --resume to "
                           f"continue it, or another --out")
    if resume and kept.exists() and kept.read_text() != spec.text:
        raise CelosiaError(f"--resume: the spec differs from the one {out} was started with "
                           f"({kept}); resume with that spec or use another --out")
    out.mkdir(parents=True, exist_ok=True)
    kept.write_text(spec.text)
    store.repair()

    # the points, in spec order; a combination HwConfig rejects is a row at once
    done = {r["key"]: r for r in store.rows()}
    payloads, invalid = [], []
    for ci, point in enumerate(spec.configs()):
        try:
            cfg = spec.config_of(point)
            h, reason = config_hash(cfg), ""
        except ConfigError as exc:
            cfg, h, reason = None, "invalid-" + str(ci), str(exc)
        for wi, w in enumerate(spec.workloads):
            key = point_key(h, w.name)
            base = {"key": key, "config_hash": h, "config_index": ci, "workload_index": wi,
                    "workload": w.name, "workload_kind": w.kind,
                    "is_default": cfg == spec.base,
                    **(cfg.to_dict() if cfg else {**spec.base.to_dict(), **point})}
            if key in done:
                continue
            if cfg is None:
                invalid.append({**base, "status": "invalid_config", "reason": reason,
                                "feasible": False, "violations": ""})
                continue
            payloads.append({"key": key, "config": cfg.to_dict(), "workload": w,
                             "part": spec.part, "constraints": spec.constraints, "base": base})
    for row in invalid:
        store.append(row)
    skipped = len(done)
    if limit is not None:
        payloads = payloads[:limit]

    t0 = time.perf_counter()
    synth_s = 0.0
    if synth:  # each configuration once, through the same engine, before its points
        need = {}
        for p in payloads:
            h = p["base"]["config_hash"]
            if store.synth_report(h, spec.part) is None:
                need.setdefault(h, {"key": h, "config": p["config"], "part": spec.part})
        if need and progress:
            print(f"synthesising {len(need)} configurations for the {spec.part} "
                  f"(cached in {out}/cache)", file=sys.stderr, flush=True)
        for payload, result, reason in _engine(engine, run_synth, list(need.values()),
                                               workers, address):
            store.add_synth(payload["key"], spec.part,
                            result["synth"] if result else {"error": reason})
        synth_s = time.perf_counter() - t0
    for p in payloads:
        h = p["base"]["config_hash"]
        p["cache"] = store.cache_files(h)
        if synth:
            p["synth"] = store.synth_report(h, spec.part)

    bar = Progress(len(payloads), progress)
    timing: dict = {}
    t1 = time.perf_counter()
    failed = 0
    try:
        for payload, result, reason in _engine(engine, run_point, payloads, workers, address,
                                               timing):
            base = payload["base"]
            if result is None:
                failed += 1
                row = {**base, "status": "failed", "reason": reason, "feasible": False,
                       "violations": "", "attempts": 2}
            else:
                store.add_cache(base["config_hash"], result["cache"])
                row = {**base, **result["row"]}
            store.append(row)
            bar.update()
    finally:
        bar.close()
    points_s = time.perf_counter() - t1
    rows = store.rows()
    summary = write_outputs(spec, store, rows, {
        "engine": engine, "workers": workers, "synth": synth,
        "this_run": {"evaluated": len(payloads), "skipped_done": skipped,
                     "invalid_configs": len(invalid), "workers_died_twice": failed,
                     "points_s": round(points_s, 3), "synth_s": round(synth_s, 3),
                     "engine_start_s": timing.get("start_s"),
                     "points_per_hour": (round(len(payloads) / points_s * 3600, 1)
                                         if payloads and points_s > 0 else None)},
    })
    return summary
