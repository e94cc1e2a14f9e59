"""`celosia bench cpu-resnet18`: ResNet-18 (fp32, batch 1, 224x224) built for the CPU.

Latency of celosia's CPU build against onnxruntime (default session options, intra-op
threads = the CPUs this process may use, as celosia's kernels use) and against the numpy
reference executor, measured in the same run in alternating blocks (so a noisy, shared
machine slows all of them alike, while neither runtime's spinning worker threads steal a
core from the other); medians. Compile time cold (a fresh kernel cache)
and warm (the same cache again). The outputs are checked against onnxruntime.

Metrics: latency_ms, onnxruntime_ms, numpy_ms, ratio_vs_onnxruntime (ours / theirs; the
goal is at most 1.5), speedup_vs_numpy, compile_s, warm_compile_s.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from celosia.errors import CelosiaError


def _median_ms(samples) -> float:
    return float(np.median(samples) * 1e3)


def run(quick: bool = False) -> dict:
    try:
        import onnxruntime as ort
    except ModuleNotFoundError:
        raise CelosiaError("cpu-resnet18 compares with onnxruntime: pip install "
                           "onnxruntime") from None
    from celosia.compiler.codegen_llvm import num_threads
    from celosia.runtime import models
    from celosia.runtime.cpu import CpuModel
    from celosia.runtime.reference import ReferenceModel

    model = models.resnet18(image_size=224)
    data = model.SerializeToString()
    x = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype(np.float32)
    feeds = {"image": x}

    saved = os.environ.get("CELOSIA_CACHE")
    with tempfile.TemporaryDirectory(prefix="celosia-bench-cache-") as cache:
        os.environ["CELOSIA_CACHE"] = cache
        try:
            t0 = time.perf_counter()
            CpuModel.build(data)
            compile_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            built = CpuModel.build(data)
            warm_compile_s = time.perf_counter() - t0
        finally:
            if saved is None:
                os.environ.pop("CELOSIA_CACHE", None)
            else:
                os.environ["CELOSIA_CACHE"] = saved

    threads = num_threads()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    reference = ReferenceModel.load(data)

    (ours,) = built.run(feeds).values()
    (theirs,) = session.run(None, feeds)
    max_diff = float(np.abs(ours - theirs).max())
    if not np.allclose(ours, theirs, rtol=1e-4, atol=1e-5 * np.abs(theirs).max()):
        raise CelosiaError(f"cpu-resnet18: celosia's output differs from onnxruntime's by "
                           f"up to {max_diff:.3g}")

    # Alternating blocks of runs, a pause before each: both runtimes keep worker threads
    # spinning for a while after a call, which would steal a core from the other if calls
    # were interleaved one by one.
    blocks, per_block = (3, 4) if quick else (8, 6)
    t_ours, t_ort, t_np = [], [], []
    clock = time.perf_counter
    for _ in range(blocks):
        for fn, samples in ((lambda: built.run(feeds), t_ours),
                            (lambda: session.run(None, feeds), t_ort)):
            time.sleep(0.05)
            fn()  # warm-up after the pause
            for _ in range(per_block):
                t0 = clock()
                fn()
                samples.append(clock() - t0)
        time.sleep(0.05)
        t0 = clock()
        reference.run(feeds)
        t_np.append(clock() - t0)
    reps = blocks * per_block
    built.run(feeds, profile=True)
    report = built.report()

    latency, ort_ms, np_ms = _median_ms(t_ours), _median_ms(t_ort), _median_ms(t_np)
    print(f"  celosia {latency:.2f} ms, onnxruntime {ort_ms:.2f} ms, numpy {np_ms:.2f} ms "
          f"({threads} threads); compile {compile_s:.2f} s cold, {warm_compile_s:.2f} s warm",
          flush=True)
    return {
        "metrics": {
            "latency_ms": latency,
            "onnxruntime_ms": ort_ms,
            "numpy_ms": np_ms,
            "ratio_vs_onnxruntime": latency / ort_ms,
            "speedup_vs_numpy": np_ms / latency,
            "compile_s": compile_s,
            "warm_compile_s": warm_compile_s,
        },
        "threads": threads,
        "repetitions": reps,
        "min_ms": {"celosia": min(t_ours) * 1e3, "onnxruntime": min(t_ort) * 1e3,
                   "numpy": min(t_np) * 1e3},
        "max_abs_diff_vs_onnxruntime": max_diff,
        "build": built.build_info,
        "profile_summary": report["summary"],
        "note": "medians of interleaved runs in one process; ratio = celosia / onnxruntime",
    }
