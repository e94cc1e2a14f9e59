"""`celosia bench zoo`: every model of the zoo (models/registry.py) at full size, celosia's
CPU build against onnxruntime.

Per model: the CPU build (import, optimize, compile; dynamic axes bound to the benchmark's
input shapes, as `--input-shape` does) runs once and is compared with onnxruntime's outputs
(max abs error relative to each output's largest value, within the entry's tolerance:
``ok_cpu``); a model that does not import or build keeps the one-line error. Then both
runtimes are timed in the same run with the same intra-op thread count (celosia's:
$CELOSIA_NUM_THREADS or the CPUs this process may use), in alternating blocks with a pause
before each (both keep worker threads spinning for a while after a call, which would steal
a core from the other if calls alternated one by one); per runtime the median over all
``repetitions`` (``blocks`` blocks) with its interquartile range (``iqr_ms``, and the 25th
and 75th percentiles; benchmarks/spread.py), and the ratio also block by block
(``cpu_ratio_per_block``: median, IQR and count of the ratios of the blocks' medians).
Models celosia cannot run are timed on onnxruntime alone.

Metrics: ``models`` (zoo entries measured; pretrained ones whose packages are missing are
listed under ``missing`` instead), ``models_ok_cpu``, and over the models that run
``cpu_ratio_vs_onnxruntime_geomean`` and ``_max`` (celosia / onnxruntime; targets 1.0 and
1.5). ``--quick`` runs the small sizes of the tests instead; ``--models a,b`` a subset
(the totals are then over that subset only). ``--int8`` adds int8 accuracy per model
against fp32 and against onnxruntime's static quantizer (benchmarks/zoo_int8.py), with the
totals ``int8_cosine_vs_ort_quantizer_min`` (target >= 0), ``int8_cosine_min`` and
``int8_mac_share_min``. ``--accel`` (which implies ``--int8``) builds that int8 graph for
the accelerator and runs it on the cycle model (benchmarks/zoo_accel.py: ``ok_accel``,
``accel_mac_share``, ``cpu_accel_transitions``, ``layout_share``, ``utilization``, ``padding_overhead``,
cycles and simulation wall time per model, at most ``time_limit`` seconds each), with the
totals ``models_ok_accel``, ``accel_mac_share_min`` and ``layout_share_max``.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from celosia.errors import CelosiaError

from .spread import block_ratios, summary_ms

# Time spent per runtime and model, roughly: blocks x per_block runs (blocks of about
# _TARGET_BLOCK_S, at least _MIN_PER_BLOCK runs each: a model slower than a block still gets
# 2 x blocks samples). Shorter blocks, more of them, alternate the runtimes more often, so
# that a change of load between blocks falls on both.
_BLOCKS = {"full": 11, "small": 3}
_TARGET_BLOCK_S = 0.3
_MIN_PER_BLOCK = 2


def _progress(text: str) -> None:
    print(f"zoo: {text}", file=sys.stderr, flush=True)


def _time(runners: list, blocks: int) -> tuple[list[list[float]], int]:
    """Alternating blocks of each runner; per_block from one timed call so that a block
    takes about _TARGET_BLOCK_S. Returns the samples of each runner in seconds, and
    per_block."""
    clock = time.perf_counter
    t0 = clock()
    runners[0]()
    # (up to 1000 runs: a block of a 0.1 ms model then lasts 0.1 s, not 2 ms, so one burst of
    # another job's load cannot decide a whole block)
    per_block = int(np.clip(round(_TARGET_BLOCK_S / max(clock() - t0, 1e-6)),
                            _MIN_PER_BLOCK, 1000))
    samples = [[] for _ in runners]
    for _ in range(blocks):
        for run, out in zip(runners, samples):
            time.sleep(0.05)
            run()  # warm-up after the pause
            for _ in range(per_block):
                t0 = clock()
                run()
                out.append(clock() - t0)
    return samples, per_block


def _cpu_build(model, feeds, want: list, names: list, tolerance: float) -> tuple:
    """(built model or None, record): build, run once, compare with onnxruntime."""
    from celosia.models.registry import relative_error
    from celosia.runtime.cpu import CpuModel

    t0 = time.perf_counter()
    try:
        built = CpuModel.build(model, {k: v.shape for k, v in feeds.items()})
        compile_s = time.perf_counter() - t0
        got = built.run(feeds)
    except CelosiaError as e:
        return None, {"ok_cpu": False, "error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # not a user error: a bug in celosia, kept as a result
        return None, {"ok_cpu": False, "error": f"internal error (a bug): "
                                                f"{type(e).__name__}: {e}"}
    errors = {n: relative_error(got.get(n), w) if n in got else float("inf")
              for n, w in zip(names, want)}
    worst = max(errors.values())
    record = {"ok_cpu": worst <= tolerance, "compile_s": compile_s,
              "relative_error": {n: float(e) for n, e in errors.items()}}
    if not record["ok_cpu"]:
        record["error"] = (f"outputs differ from onnxruntime's by up to {worst:.3g} of their "
                           f"scale (tolerance {tolerance:g})")
    return built, record


def _measure(entry, size: str, threads: int, blocks: int) -> dict:
    import onnxruntime as ort

    t0 = time.perf_counter()
    model = entry.model(size)
    feeds = entry.make_feeds(size)
    record = {"stands_for": entry.stands_for, "source": entry.source,
              "dynamic": entry.dynamic, "build_model_s": time.perf_counter() - t0,
              "inputs": {k: list(v.shape) for k, v in feeds.items()}}
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = session.run(None, feeds)
    built, cpu = _cpu_build(model, feeds, want, names, entry.tolerance)
    record.update(cpu)

    runners = [lambda: session.run(None, feeds)]
    if record["ok_cpu"]:
        runners.append(lambda: built.run(feeds))
    samples, per_block = _time(runners, blocks)
    record["onnxruntime"] = summary_ms(samples[0])
    record["repetitions"] = len(samples[0])
    record["blocks"] = blocks
    if record["ok_cpu"]:
        record["celosia"] = summary_ms(samples[1])
        record["cpu_ratio_vs_onnxruntime"] = (record["celosia"]["median_ms"]
                                              / record["onnxruntime"]["median_ms"])
        record["cpu_ratio_per_block"] = block_ratios(samples[1], samples[0], per_block)
    return record


def _accel(kept: dict, record: dict, time_limit: float | None) -> dict:
    """The accelerator record of a model whose int8 graph ``kept`` holds (zoo_accel.py)."""
    from celosia.benchmarks import zoo_accel

    if "graph" not in kept:
        return {"ok_accel": False,
                "accel_error": f"no int8 graph: {record.get('int8_error', 'not quantized')}"}
    limit = zoo_accel.DEFAULT_TIME_LIMIT_S if time_limit is None else time_limit
    return zoo_accel.measure(kept["graph"], kept["feeds"], kept["outputs"], time_limit=limit)


def _summary(name: str, r: dict) -> str:
    ort = r["onnxruntime"]
    if r["ok_cpu"]:
        ours, per = r["celosia"], r["cpu_ratio_per_block"]
        return (f"{name}: celosia {ours['median_ms']:.2f} ms (IQR {ours['iqr_ms']:.2f}), "
                f"onnxruntime {ort['median_ms']:.2f} ms (IQR {ort['iqr_ms']:.2f}), ratio "
                f"{r['cpu_ratio_vs_onnxruntime']:.2f} (per block {per['median']:.2f}, IQR "
                f"{per['iqr']:.2f}; {r['repetitions']} runs each in {r['blocks']} blocks)")
    return f"{name}: onnxruntime {ort['median_ms']:.2f} ms; celosia: {r['error'][:100]}"


def run(quick: bool = False, models: list | None = None, int8: bool = False,
        accel: bool = False, time_limit: float | None = None,
        calibration_method: str = "mse", smooth: float | None = None,
        int8_residuals: bool = False, bias_correction: bool = True) -> dict:
    try:
        import onnxruntime  # noqa: F401
    except ModuleNotFoundError:
        raise CelosiaError("zoo compares with onnxruntime: pip install onnxruntime") from None
    from celosia.compiler.cpu.host import num_threads
    from celosia.models.registry import ZOO

    size = "small" if quick else "full"
    threads = num_threads()
    unknown = sorted(set(models or ()) - set(ZOO))
    if unknown:
        raise CelosiaError(f"no zoo model {', '.join(unknown)}; the zoo has {', '.join(ZOO)}")
    chosen = {n: e for n, e in ZOO.items() if not models or n in models}
    results, missing = {}, {}
    for k, (name, entry) in enumerate(chosen.items(), 1):
        why = entry.missing()
        if why:
            missing[name] = why
            _progress(f"[{k}/{len(chosen)}] {name}: missing ({why})")
            continue
        _progress(f"[{k}/{len(chosen)}] {name} ({entry.stands_for}) ...")
        results[name] = r = _measure(entry, size, threads, _BLOCKS[size])
        done = (f"ratio {r['cpu_ratio_vs_onnxruntime']:.2f}" if r["ok_cpu"]
                else f"not on the CPU build: {r['error'][:80]}")
        _progress(f"[{k}/{len(chosen)}] {name}: {done}")
        if int8 or accel:
            from celosia.benchmarks import zoo_int8

            kept: dict = {}
            r.update(zoo_int8.measure(entry, size, keep=kept, method=calibration_method,
                                      smooth=smooth, int8_residuals=int8_residuals,
                                      bias_correction=bias_correction))
            _progress(f"[{k}/{len(chosen)}] {name}: int8 cosine "
                      f"{r.get('int8_cosine', float('nan')):.5f}, onnxruntime's quantizer "
                      f"{r.get('int8_cosine_ort', float('nan')):.5f}")
            if accel:
                r.update(_accel(kept, r, time_limit))
                _progress(f"[{k}/{len(chosen)}] {name}: accelerator "
                          + (f"MAC share {r['accel_mac_share']:.3f}, {r['accel_cycles']:,} "
                             f"cycles in {r['accel_sim_wall_s']:.1f} s" if r["ok_accel"]
                             else r["accel_error"][:100]))

    ratios = [r["cpu_ratio_vs_onnxruntime"] for r in results.values() if r["ok_cpu"]]
    metrics = {"models": len(results), "models_ok_cpu": len(ratios)}
    if ratios:
        metrics["cpu_ratio_vs_onnxruntime_geomean"] = float(np.exp(np.mean(np.log(ratios))))
        metrics["cpu_ratio_vs_onnxruntime_max"] = float(max(ratios))
    if int8 or accel:
        from celosia.benchmarks import zoo_int8

        metrics.update(zoo_int8.totals(results))
    if accel:
        from celosia.benchmarks import zoo_accel

        metrics.update(zoo_accel.totals(results))
    for name, r in results.items():
        print(f"  {_summary(name, r)}", flush=True)
    for name, why in missing.items():
        print(f"  {name}: missing, {why}", flush=True)
    return {
        "metrics": metrics,
        "size": size,
        "threads": threads,
        "models": results,
        "missing": missing,
        **({"calibration_method": calibration_method} if int8 or accel else {}),
        **({"smooth": smooth} if (int8 or accel) and smooth is not None else {}),
        **({"int8_residuals": True} if (int8 or accel) and int8_residuals else {}),
        **({"bias_correction": False} if (int8 or accel) and not bias_correction else {}),
        "note": "per model: medians (with IQR) of interleaved blocks, same intra-op threads "
                "for both runtimes; ratio = celosia / onnxruntime over the models whose CPU "
                "build matches onnxruntime (ok_cpu); cpu_ratio_per_block: its spread",
    }
