"""One design point, the unit of work of every engine: ``run_point(payload) -> result``.

The payload carries everything the point needs (the configuration, the workload, the part,
the constraints, the synthesis report if any, and the schedule-cache entries the results
directory holds for this configuration), so a worker needs no shared disk: it runs with
``CELOSIA_CACHE`` pointing at a private temporary directory seeded with those entries, and
returns the entries the schedule search wrote (the driver stores them in
``DIR/cache/<config hash>/``). The models' torch exports and the RTL builds are the worker
machine's own caches (linked in), as they do not depend on the configuration.

``run_synth(payload)`` synthesises one configuration (fpga/synth.py) for ``--synth``.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

from celosia.config import ConfigError, HwConfig
from celosia.errors import CelosiaError

__all__ = ["run_point", "run_synth", "point_key", "CRASH_ENV"]

# A test hook: a worker evaluating the workload named in this variable dies (os._exit)
# before evaluating it; with "NAME@FILE" only while FILE does not exist (it is created
# first, so the retry succeeds). tests/sweep use it to check that a dead worker loses only
# its point.
CRASH_ENV = "CELOSIA_SWEEP_TEST_CRASH"


def point_key(config_hash: str, workload: str) -> str:
    return f"{config_hash}/{workload}"


def _crash_hook(workload: str) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    name, _, marker = spec.partition("@")
    if name != workload:
        return
    if marker:
        if Path(marker).exists():
            return
        Path(marker).touch()
    os._exit(17)


def _cache_root() -> Path:
    root = os.environ.get("CELOSIA_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "celosia"


class _PrivateCache:
    """CELOSIA_CACHE set to a temporary directory holding ``files`` under tune/ (and the
    usual cache's config-independent parts linked in) for the duration of a point."""

    def __init__(self, files: dict):
        self.files = files

    def __enter__(self):
        self.old = os.environ.get("CELOSIA_CACHE")
        usual = _cache_root()
        self.tmp = tempfile.TemporaryDirectory(prefix="celosia-sweep-")
        root = Path(self.tmp.name)
        (root / "tune").mkdir()
        for name, text in self.files.items():
            (root / "tune" / name).write_text(text)
        for sub in ("models", "rtl"):
            target = usual / sub
            target.mkdir(parents=True, exist_ok=True)
            (root / sub).symlink_to(target, target_is_directory=True)
        os.environ["CELOSIA_CACHE"] = str(root)
        return self

    def new_files(self) -> dict:
        tune = Path(self.tmp.name) / "tune"
        return {p.name: p.read_text() for p in sorted(tune.glob("*.json"))
                if p.name not in self.files}

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("CELOSIA_CACHE", None)
        else:
            os.environ["CELOSIA_CACHE"] = self.old
        self.tmp.cleanup()


def _constraint_violations(row: dict, constraints: dict) -> list[str]:
    out = []
    for key, limit in constraints.items():
        if key == "fits":
            continue
        metric = key.split("_", 1)[1]
        value = row.get(metric)
        if value is None:
            if key == "min_fmax_mhz":
                out.append(f"{key}: no place-and-route result gives an Fmax")
            continue
        if key.startswith("max_") and value > limit:
            out.append(f"{metric} {value:.6g} > {limit:g}")
        elif key.startswith("min_") and value < limit:
            out.append(f"{metric} {value:.6g} < {limit:g}")
    return out


def run_point(payload: dict) -> dict:
    """Evaluate one (configuration, workload): the row and the new schedule-cache entries.
    Errors of the point (it does not compile, does not fit) are the row's status and reason;
    only the death of the worker escapes (the engine retries the point once)."""
    from .resources import ANALYTIC_NOTE, analytic, fit, synthesised
    from .workloads import evaluate

    w = payload["workload"]
    cfg = HwConfig.from_dict(payload["config"])
    part = payload["part"]
    row = {"status": "ok", "reason": ""}
    t0, c0 = time.perf_counter(), time.process_time()
    synth = payload.get("synth")
    if synth and "error" not in synth:
        res, source = synthesised(synth), f"yosys ({part})"
    else:
        res, source = analytic(cfg, part), "analytic"
        if synth:
            source = f"analytic (synthesis failed: {synth['error']})"
    fits, over = fit(res, part)
    row.update(res, part=part, fits=fits, resource_source=source)
    fmax = None
    if synth and synth.get("fmax_mhz"):
        fmax, fmax_source = synth["fmax_mhz"], f"place and route ({part}, --synth)"
    else:
        from celosia.fpga.clock import clock_status

        clock = clock_status(cfg)
        fmax, fmax_source = clock["fmax_mhz"], (f"place and route ({clock['part']}, "
                                                f"fpga/results)" if clock["fmax_mhz"] else "")
    row.update(fmax_mhz=fmax, fmax_source=fmax_source)
    new_files: dict = {}
    if not fits and payload["constraints"].get("fits", True):
        row.update(status="does_not_fit",
                   reason=f"does not fit the {part}: {over} ({source}); not simulated")
    else:
        _crash_hook(w.name)
        with _PrivateCache(payload.get("cache", {})) as cache:
            try:
                row.update(evaluate(cfg, w))
            except (CelosiaError, ConfigError) as exc:
                row.update(status="compile_failed", reason=f"{type(exc).__name__}: {exc}")
            except MemoryError:
                row.update(status="failed", reason="out of memory")
            except Exception as exc:  # a bug: recorded with where it happened
                tb = traceback.extract_tb(exc.__traceback__)[-1]
                row.update(status="failed", reason=f"{type(exc).__name__}: {exc} (at "
                                                  f"{Path(tb.filename).name}:{tb.lineno})")
            if payload.get("rtl") and row["status"] == "ok":
                # the RTL check of a sampled point: its cycles must equal the cycle model's
                from .workloads import rtl_cycles

                try:
                    row["rtl_cycles"] = rtl_cycles(cfg, w.params, row["schedule"])
                    row["rtl_match"] = row["rtl_cycles"] == row["cycles"]
                    if not row["rtl_match"]:
                        row.update(status="rtl_mismatch",
                                   reason=f"the RTL ran {row['rtl_cycles']} cycles, the cycle "
                                          f"model {row['cycles']}: a bug, please report it")
                except CelosiaError as exc:
                    row["rtl_match"] = None
                    row["reason"] = f"RTL check not run: {exc}"
            new_files = cache.new_files()
    violations = _constraint_violations(row, payload["constraints"]) \
        if row["status"] == "ok" else []
    row["feasible"] = row["status"] == "ok" and not violations
    row["violations"] = "; ".join(violations)
    row["resource_note"] = ANALYTIC_NOTE if source == "analytic" else ""
    # the point's wall and CPU time (of this process): the only columns that depend on the
    # machine and its load rather than on the design point
    row["eval_s"] = time.perf_counter() - t0
    row["eval_cpu_s"] = time.process_time() - c0
    return {"key": payload["key"], "row": row, "cache": new_files}


def run_synth(payload: dict) -> dict:
    """fpga/synth.py's report of one configuration on the part ({"error": reason} when the
    synthesis fails or the tools are missing)."""
    from celosia.fpga.synth import synth

    cfg = HwConfig.from_dict(payload["config"])
    with tempfile.TemporaryDirectory(prefix="celosia-sweep-synth-") as work:
        try:
            report = synth(cfg, payload["part"], Path(work))
        except CelosiaError as exc:
            report = {"error": str(exc)}
    return {"key": payload["key"], "synth": report}
