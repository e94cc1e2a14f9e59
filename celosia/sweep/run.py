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


def run_sweep(spec: Spec, out, *, engine: str = "local", address: str | None = None,
              workers: int | None = None, resume: bool = False, limit: int | None = None,
              synth: bool = False, rtl_sample: int = 0, progress: bool = True) -> dict:
    """Run (or continue) the sweep; the summary (also DIR/summary.json)."""
    if engine not in ENGINES:
        raise CelosiaError(f"unknown engine {engine!r}; engines are {', '.join(ENGINES)}")
    if address and engine != "ray":
        raise CelosiaError("--address joins a Ray cluster: use it with --engine ray")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise CelosiaError(f"--workers must be at least 1, not {workers}")
    if rtl_sample < 0:
        raise CelosiaError(f"--rtl-sample must be at least 0, not {rtl_sample}")
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

    state = {"rtl_sample": rtl_sample, "evaluated": 0, "invalid": 0, "failed": 0,
             "synth_s": 0.0, "points_s": 0.0, "skipped": 0}
    timing: dict = {}
    session = _Session(engine, workers, address)
    bar = None
    try:
        if spec.method == "optuna":
            from .search import optuna_search

            bar = Progress(spec.n * len(spec.workloads), progress)
            optuna_search(spec, lambda configs: _evaluate(
                spec, store, configs, session, state, timing, synth, limit, bar, out,
                progress), workers)
        else:
            configs = list(enumerate(spec.configs()))
            total = len(configs) * len(spec.workloads)
            bar = Progress(total, progress)
            _evaluate(spec, store, configs, session, state, timing, synth, limit, bar, out,
                      progress)
    finally:
        session.close()
        if bar is not None:
            bar.close()
    rows = store.rows()
    n, points_s = state["evaluated"], state["points_s"]
    summary = write_outputs(spec, store, rows, {
        "engine": engine, "workers": workers, "synth": synth,
        "this_run": {"evaluated": n, "skipped_done": state["skipped"],
                     "invalid_configs": state["invalid"],
                     "workers_died_twice": state["failed"],
                     "points_s": round(points_s, 3), "synth_s": round(state["synth_s"], 3),
                     "engine_start_s": timing.get("start_s"),
                     "points_per_hour": (round(n / points_s * 3600, 1)
                                         if n and points_s > 0 else None)},
    })
    return summary


class _Session:
    """The engine for the whole sweep: the local pool's processes or the Ray cluster are
    started once, however many batches the search sends."""

    def __init__(self, engine: str, workers: int, address: str | None):
        self.engine, self.workers, self.address = engine, workers, address
        self.pool, self.ray_started = None, False

    def run(self, fn, payloads, timing: dict | None = None):
        if self.engine == "local":
            if self.pool is None:
                from .engines import LocalPool

                self.pool = LocalPool(self.workers)
            return run_local(fn, payloads, self.workers, timing, pool=self.pool)
        gen = run_ray(fn, payloads, self.workers, self.address, timing, keep=True)
        self.ray_started = True
        return gen

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self.ray_started:
            import ray

            if ray.is_initialized():
                ray.shutdown()


def _evaluate(spec: Spec, store: Store, configs, session, state, timing, synth, limit, bar,
              out, progress) -> list:
    """Evaluate the points of ``configs`` ([(config index, {field: value})]) not already in
    DIR; every row of those configurations (evaluated now or before), in order."""
    done = {r["key"]: r for r in store.rows()}
    payloads, keys, queued = [], [], set()
    for ci, point in configs:
        try:
            cfg = spec.config_of(point)
            h, reason = config_hash(cfg), ""
        except ConfigError as exc:
            cfg, h, reason = None, "invalid-" + str(ci), str(exc)
        for wi, w in enumerate(spec.workloads):
            key = point_key(h, w.name)
            keys.append(key)
            base = {"key": key, "config_hash": h, "config_index": ci, "workload_index": wi,
                    "workload": w.name, "workload_kind": w.kind,
                    "is_default": cfg == spec.base,
                    **(cfg.to_dict() if cfg else {**spec.base.to_dict(), **point})}
            if key in done or key in queued:
                state["skipped"] += key in done
                bar.total -= 1  # (already done, or twice in this batch)
                continue
            if cfg is None:
                row = {**base, "status": "invalid_config", "reason": reason,
                       "feasible": False, "violations": ""}
                store.append(row)
                done[key] = row
                state["invalid"] += 1
                bar.total -= 1
                continue
            payloads.append({"key": key, "config": cfg.to_dict(), "workload": w,
                             "part": spec.part, "constraints": spec.constraints, "base": base})
            queued.add(key)
    if state["rtl_sample"]:  # the first layer points of the spec (in its order) not yet done
        for p in payloads:
            if state["rtl_sample"] and p["workload"].kind == "conv":
                p["rtl"] = True
                state["rtl_sample"] -= 1
    if limit is not None:
        room = max(0, limit - state["evaluated"])
        bar.total -= max(0, len(payloads) - room)
        payloads = payloads[:room]

    if synth:  # each configuration once, through the same engine, before its points
        t0 = time.perf_counter()
        need = {}
        for p in payloads:
            h = p["base"]["config_hash"]
            if store.synth_report(h, spec.part) is None:
                need.setdefault(h, {"key": h, "config": p["config"], "part": spec.part})
        if need and progress:
            print(f"synthesising {len(need)} configurations for the {spec.part} "
                  f"(cached in {out}/cache)", file=sys.stderr, flush=True)
        for payload, result, reason in session.run(run_synth, list(need.values())):
            store.add_synth(payload["key"], spec.part,
                            result["synth"] if result else {"error": reason})
        state["synth_s"] += time.perf_counter() - t0
    for p in payloads:
        h = p["base"]["config_hash"]
        p["cache"] = store.cache_files(h)
        if synth:
            p["synth"] = store.synth_report(h, spec.part)

    t1 = time.perf_counter()
    for payload, result, reason in session.run(run_point, payloads, timing):
        base = payload["base"]
        if result is None:
            state["failed"] += 1
            row = {**base, "status": "failed", "reason": reason, "feasible": False,
                   "violations": "", "attempts": 2}
        else:
            store.add_cache(base["config_hash"], result["cache"])
            row = {**base, **result["row"]}
        store.append(row)
        done[row["key"]] = row
        state["evaluated"] += 1
        bar.update()
    state["points_s"] += time.perf_counter() - t1
    return [done.get(k) for k in keys]
