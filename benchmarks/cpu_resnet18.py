"""`celosia bench cpu-resnet18`: ResNet-18 (fp32, batch 1, 224x224) built for the CPU.

Latency of celosia's CPU build against onnxruntime (default session options, intra-op
threads = the CPUs this process may use, as celosia's kernels use), against the numpy
reference executor and, where `apache-tvm` is installed, against TVM's own LLVM build of
the same ONNX model (Relax frontend, TVM's default CPU pipeline, target llvm with the host
CPU, TVM_NUM_THREADS = celosia's threads; untuned: no MetaSchedule, which would take
hours). All are measured in the same run in alternating blocks (so a noisy, shared
machine slows all of them alike, while neither runtime's spinning worker threads steal a
core from the other); medians. Compile time cold (a fresh kernel cache) and warm (the
same cache again). The outputs of celosia and TVM are checked against onnxruntime.
Spread: each runtime's interquartile range, and the ratio to onnxruntime block by block
(``ratio_vs_onnxruntime_per_block``: median, IQR and count of the ratios of the blocks'
medians); ``repetitions`` and ``blocks`` say how many runs (benchmarks/spread.py).

Metrics: latency_ms, onnxruntime_ms, numpy_ms, ratio_vs_onnxruntime (ours / theirs; the
goal is at most 1.5), speedup_vs_numpy, compile_s, warm_compile_s; with TVM also tvm_ms,
ratio_vs_tvm (ours / TVM's) and tvm_compile_s (ONNX import + build). The JSON's "tvm" says
which TVM was measured, or why not (not installed, or the one-line reason it failed).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time

import numpy as np

from celosia.errors import CelosiaError

from .spread import block_ratios, summary_ms

TVM_NOT_INSTALLED = "not installed (pip install apache-tvm)"


def _median_ms(samples) -> float:
    return float(np.median(samples) * 1e3)


def _agrees(ours, theirs) -> bool:
    return np.allclose(ours, theirs, rtol=1e-4, atol=1e-5 * np.abs(theirs).max())


@contextlib.contextmanager
def _env(name: str, value: str):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def _build_tvm(model):
    """TVM's untuned LLVM build of `model`: (run(x) -> output, compile seconds, description)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.target.codegen import llvm_get_system_cpu

    t0 = time.perf_counter()
    cpu = llvm_get_system_cpu()
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    mod = relax.transform.DecomposeOpsForInference()(from_onnx(model))
    executable = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
    main = relax.VirtualMachine(executable, tvm.cpu())["main"]
    compile_s = time.perf_counter() - t0
    description = (f"apache-tvm {tvm.__version__}, untuned (no MetaSchedule): Relax ONNX "
                   f"frontend, default CPU pipeline, target llvm -mcpu={cpu}")
    return (lambda x: main(tvm.runtime.tensor(x)).numpy()), compile_s, description


def _tvm(model, x, expected):
    """(run, compile seconds, description) of TVM's build, or (None, None, why not)."""
    try:
        run, compile_s, description = _build_tvm(model)
        out = run(x)
    except Exception as e:  # TVM failing to import, build or run this model is a result
        if isinstance(e, ModuleNotFoundError) and e.name == "tvm":
            return None, None, TVM_NOT_INSTALLED
        lines = str(e).strip().splitlines()
        return None, None, f"failed: {type(e).__name__}: {lines[0] if lines else ''}"
    if not _agrees(out, expected):
        return None, None, (f"failed: output differs from onnxruntime's by up to "
                            f"{float(np.abs(out - expected).max()):.3g}")
    return run, compile_s, description


def run(quick: bool = False) -> dict:
    try:
        import onnxruntime as ort
    except ModuleNotFoundError:
        raise CelosiaError("cpu-resnet18 compares with onnxruntime: pip install "
                           "onnxruntime") from None
    from celosia.compiler.cpu.host import num_threads
    from celosia.models import zoo as models
    from celosia.runtime.cpu import CpuModel
    from celosia.runtime.reference import ReferenceModel

    model = models.resnet18(image_size=224)
    data = model.SerializeToString()
    x = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype(np.float32)
    feeds = {"image": x}

    with tempfile.TemporaryDirectory(prefix="celosia-bench-cache-") as cache, \
            _env("CELOSIA_CACHE", cache):
        t0 = time.perf_counter()
        CpuModel.build(data)
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        built = CpuModel.build(data)
        warm_compile_s = time.perf_counter() - t0

    threads = num_threads()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    reference = ReferenceModel.load(data)

    (ours,) = built.run(feeds).values()
    (theirs,) = session.run(None, feeds)
    max_diff = float(np.abs(ours - theirs).max())
    if not _agrees(ours, theirs):
        raise CelosiaError(f"cpu-resnet18: celosia's output differs from onnxruntime's by "
                           f"up to {max_diff:.3g}")

    with _env("TVM_NUM_THREADS", str(threads)):  # read when TVM's thread pool starts
        tvm_run, tvm_compile_s, tvm_status = _tvm(model, x, theirs)

        # Alternating blocks of runs, a pause before each: both runtimes keep worker
        # threads spinning for a while after a call, which would steal a core from the
        # other if calls were interleaved one by one. The slow executors (numpy, untuned
        # TVM: 0.1 to 2 s a run) run once per block.
        blocks, per_block = (3, 4) if quick else (10, 8)
        t_ours, t_ort, t_np, t_tvm = [], [], [], []
        fast = ((lambda: built.run(feeds), t_ours), (lambda: session.run(None, feeds), t_ort))
        slow = [(lambda: reference.run(feeds), t_np)]
        if tvm_run:
            slow.append((lambda: tvm_run(x), t_tvm))
        clock = time.perf_counter
        for _ in range(blocks):
            for fn, samples in fast:
                time.sleep(0.05)
                fn()  # warm-up after the pause
                for _ in range(per_block):
                    t0 = clock()
                    fn()
                    samples.append(clock() - t0)
            for fn, samples in slow:
                time.sleep(0.05)
                t0 = clock()
                fn()
                samples.append(clock() - t0)
    reps = blocks * per_block
    built.run(feeds, profile=True)
    report = built.report()

    latency, ort_ms, np_ms = _median_ms(t_ours), _median_ms(t_ort), _median_ms(t_np)
    metrics = {
        "latency_ms": latency,
        "onnxruntime_ms": ort_ms,
        "numpy_ms": np_ms,
        "ratio_vs_onnxruntime": latency / ort_ms,
        "speedup_vs_numpy": np_ms / latency,
        "compile_s": compile_s,
        "warm_compile_s": warm_compile_s,
    }
    min_ms = {"celosia": min(t_ours) * 1e3, "onnxruntime": min(t_ort) * 1e3,
              "numpy": min(t_np) * 1e3}
    spread = {"celosia": summary_ms(t_ours), "onnxruntime": summary_ms(t_ort),
              "numpy": summary_ms(t_np)}
    ratio_blocks = block_ratios(t_ours, t_ort, per_block)
    tvm_text = f"TVM: {tvm_status}"
    if tvm_run:
        tvm_ms = _median_ms(t_tvm)
        metrics.update(tvm_ms=tvm_ms, ratio_vs_tvm=latency / tvm_ms, tvm_compile_s=tvm_compile_s)
        min_ms["tvm"] = min(t_tvm) * 1e3
        spread["tvm"] = summary_ms(t_tvm)
        tvm_text = f"TVM untuned {tvm_ms:.2f} ms, compile {tvm_compile_s:.2f} s"
    print(f"  celosia {latency:.2f} ms (IQR {spread['celosia']['iqr_ms']:.2f}), onnxruntime "
          f"{ort_ms:.2f} ms (IQR {spread['onnxruntime']['iqr_ms']:.2f}), ratio "
          f"{latency / ort_ms:.3f} (per block {ratio_blocks['median']:.3f}, IQR "
          f"{ratio_blocks['iqr']:.3f}; {reps} runs each in {blocks} blocks), numpy "
          f"{np_ms:.2f} ms ({threads} threads); compile {compile_s:.2f} s cold, "
          f"{warm_compile_s:.2f} s warm; {tvm_text}", flush=True)
    return {
        "metrics": metrics,
        "threads": threads,
        "repetitions": reps,
        "blocks": blocks,
        "spread": spread,
        "ratio_vs_onnxruntime_per_block": ratio_blocks,
        "min_ms": min_ms,
        "max_abs_diff_vs_onnxruntime": max_diff,
        "tvm": tvm_status,
        "build": built.build_info,
        "profile_summary": report["summary"],
        "note": "medians of interleaved runs in one process (celosia and onnxruntime: "
                "repetitions runs each in blocks blocks; numpy and TVM: one run per block), "
                "spread: their IQR; ratio = celosia / onnxruntime (per block: the ratio of "
                "the blocks' medians), ratio_vs_tvm = celosia / TVM (an untuned TVM build)",
    }
