"""`celosia bench cpu-resnet18-int8`: ResNet-18 (batch 1, 224x224, the zoo's random
weights) quantized to int8 and built for the CPU, against celosia's fp32 build of the same
model and against onnxruntime's own int8 model of it.

- celosia int8: ``quantize_model`` (four calibration images, normal(0, 1), seed 0), then
  ``CpuModel.from_graph``: QConv/QGemm on the CPU's int8 dot-product instructions
  (compiler/cpu/int8_forms.py: the host's best form, recorded as ``int8_form``). Its output
  must equal, bit for bit, the quantized graph run by the reference executor (qops.py's
  numpy definitions): the benchmark fails otherwise.
- celosia fp32: ``CpuModel.build`` of the float model.
- onnxruntime int8: ``quantize_static`` of the same model on the same calibration images
  (after ``quant_pre_process``), QDQ format, per-channel weights, run by onnxruntime with
  intra-op threads = celosia's threads; both of its activation types, QInt8 (its default,
  S8S8) and QUInt8 (U8S8, the form its x86 kernels are known for), and the faster of the two
  is ``onnxruntime_int8_ms``. onnxruntime's fp32 model runs too, for reference.

The bound: the int8 layers' multiply-adds (QConv, QGemm) at the form's peak rate, measured
in the same blocks as the models by a kernel of independent dot-product instructions on
every thread (``compile_peak``): ``bound_ms``, and ``fraction_of_peak`` = bound / latency.
``bound_vs_onnxruntime_int8`` = bound / onnxruntime's time is the least
``ratio_vs_onnxruntime_int8`` any exact kernel could reach on this machine.

All run in one process in interleaved blocks (a pause, a warm-up run, then ``per_block``
timed runs of one runtime, then the next), so a shared machine's load falls on all alike
and no runtime's spinning threads steal a core from another. Figures are medians with the
interquartile range (``iqr_ms``: [25th, 75th percentile]) over ``repetitions`` runs each.

Metrics: latency_ms, fp32_latency_ms, onnxruntime_int8_ms, ratio_vs_fp32 (goal <= 0.4),
ratio_vs_onnxruntime_int8 (goal <= 0.6), onnxruntime_fp32_ms, bound_ms, fraction_of_peak,
bound_vs_onnxruntime_int8, and qdq_latency_ms: onnxruntime's QUInt8 QDQ model (its
defaults: asymmetric activations) built by ``CpuModel.build`` as a user's int8 model is
(``from_qdq`` makes its layers QConv/QGemm/QAdd, the int8 kernels run them; bit-exact with
the reference executor, else the benchmark fails), with qdq_ratio_vs_onnxruntime against
onnxruntime's run of that same model, and ``qdq_vs_onnxruntime``: the outputs' distance
from onnxruntime's in output steps (max, RMS, share identical).
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from celosia.errors import CelosiaError

CALIBRATION_IMAGES = 4


def _ort_quantized(model, calib: np.ndarray, activation: str) -> bytes:
    """onnxruntime's QDQ model of ``model`` (module doc), as bytes."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"image": calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.it, None)

    here = os.getcwd()  # its tools leave scratch files in the working directory
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "m.onnx"), os.path.join(d, "q.onnx")
        onnx.save(model, src)
        os.chdir(d)
        try:
            quant_pre_process(src, src)
            quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ,
                            per_channel=True, activation_type=getattr(QuantType, activation),
                            weight_type=QuantType.QInt8)
        finally:
            os.chdir(here)
        with open(dst, "rb") as f:
            return f.read()


def _agreement(got: np.ndarray, want: np.ndarray, graph) -> dict:
    """How far celosia's run of a QDQ model is from onnxruntime's, in steps of the output's
    scale (its Dequantize's): max, RMS, and the share of outputs that are identical."""
    (dq,) = [n for n in graph.nodes if n.outputs[0] == graph.outputs[0]]
    steps = np.rint(np.abs(got - want) / np.float32(dq.attrs["scale"]))
    return {"max_steps": float(steps.max()), "rms_steps": float(np.sqrt((steps ** 2).mean())),
            "identical": float((steps == 0).mean())}


def _bit_exact(what: str, built, graph, feeds) -> np.ndarray:
    """The output of ``built`` on ``feeds``, checked equal, bit for bit, to the reference
    executor's run of ``graph`` (qops.py's definitions): the benchmark fails otherwise."""
    from celosia.compiler.graph.reference import run_graph

    (got,) = built.run(feeds).values()
    (want,) = run_graph(graph, feeds).values()
    if not np.array_equal(got, want):
        raise CelosiaError(f"cpu-resnet18-int8: {what} differs from the reference executor's "
                           f"qops.py in {int(np.sum(got != want))} of {got.size} outputs")
    return got


def _stats(samples) -> dict:
    ms = np.asarray(samples) * 1e3
    return {"median_ms": float(np.median(ms)),
            "iqr_ms": [float(np.percentile(ms, 25)), float(np.percentile(ms, 75))],
            "min_ms": float(ms.min())}


def run(quick: bool = False) -> dict:
    try:
        import onnxruntime as ort
    except ModuleNotFoundError:
        raise CelosiaError("cpu-resnet18-int8 compares with onnxruntime: pip install "
                           "onnxruntime") from None
    from celosia.benchmarks.zoo_int8 import node_macs
    from celosia.compiler.cpu.host import num_threads
    from celosia.compiler.cpu.int8_dot import compile_peak
    from celosia.compiler.pipeline import quantize_model
    from celosia.models import zoo as models
    from celosia.runtime.cpu import CpuModel

    model = models.resnet18(image_size=224)
    data = model.SerializeToString()
    rng = np.random.default_rng(0)
    calib = rng.normal(size=(CALIBRATION_IMAGES, 3, 224, 224)).astype(np.float32)
    feeds = {"image": rng.normal(size=(1, 3, 224, 224)).astype(np.float32)}

    graph = quantize_model(data, {"image": calib})
    int8 = CpuModel.from_graph(graph)
    fp32 = CpuModel.build(data)
    _bit_exact("the int8 build", int8, graph, feeds)

    threads = num_threads()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sessions = {"onnxruntime_fp32": ort.InferenceSession(data, options,
                                                         providers=["CPUExecutionProvider"])}
    qdq_bytes = {}
    for activation, name in (("QInt8", "onnxruntime_int8_s8s8"),
                             ("QUInt8", "onnxruntime_int8_u8s8")):
        qdq_bytes[activation] = _ort_quantized(model, calib, activation)
        sessions[name] = ort.InferenceSession(qdq_bytes[activation],
                                              options, providers=["CPUExecutionProvider"])
    # onnxruntime's QUInt8 model as a user brings it: CpuModel.build (from_qdq inside)
    qdq = CpuModel.build(qdq_bytes["QUInt8"])
    qdq_graph = quantize_model(qdq_bytes["QUInt8"])
    got = _bit_exact("the QDQ model's build", qdq, qdq_graph, feeds)
    qdq_agreement = _agreement(got, sessions["onnxruntime_int8_u8s8"].run(None, feeds)[0],
                               qdq_graph)
    runners = {"celosia_int8": lambda: int8.run(feeds), "celosia_fp32": lambda: fp32.run(feeds),
               "celosia_qdq": lambda: qdq.run(feeds)}
    for name, s in sessions.items():
        runners[name] = lambda s=s: s.run(None, feeds)
    form = int8.build_info.get("int8_form")
    macs = sum(node_macs(n, graph.types) for n in graph.nodes if n.op in ("QConv", "QGemm"))
    if form and form != "none":
        items = 8 * threads
        peak, peak_macs = compile_peak(form, items, 4000)
        runners["peak"] = peak.bind(np.empty(peak.params[0].shape, np.int32))

    blocks, per_block = (3, 3) if quick else (10, 6)
    samples: dict = {name: [] for name in runners}
    clock = time.perf_counter
    for _ in range(blocks):
        for name, fn in runners.items():
            time.sleep(0.05)
            fn()  # warm-up after the pause
            for _ in range(per_block):
                t0 = clock()
                fn()
                samples[name].append(clock() - t0)
    stats = {name: _stats(s) for name, s in samples.items()}
    ours, fp = stats["celosia_int8"]["median_ms"], stats["celosia_fp32"]["median_ms"]
    ort_int8 = min(stats[n]["median_ms"] for n in ("onnxruntime_int8_s8s8",
                                                    "onnxruntime_int8_u8s8"))
    bound = {}
    if "peak" in stats:
        rate = peak_macs / (stats["peak"]["median_ms"] * 1e-3)
        bound_ms = macs / rate * 1e3
        bound = {"bound_ms": bound_ms, "fraction_of_peak": bound_ms / ours,
                 "bound_vs_onnxruntime_int8": bound_ms / ort_int8}
    int8.run(feeds, profile=True)
    report = int8.report()
    print(f"  celosia int8 {ours:.2f} ms, celosia QDQ model "
          f"{stats['celosia_qdq']['median_ms']:.2f} ms, celosia fp32 {fp:.2f} ms, "
          f"onnxruntime int8 "
          f"{ort_int8:.2f} ms, onnxruntime fp32 {stats['onnxruntime_fp32']['median_ms']:.2f} ms "
          f"({threads} threads, {blocks * per_block} runs each)", flush=True)
    return {
        "metrics": {
            "latency_ms": ours,
            "fp32_latency_ms": fp,
            "onnxruntime_int8_ms": ort_int8,
            "ratio_vs_fp32": ours / fp,
            "ratio_vs_onnxruntime_int8": ours / ort_int8,
            "onnxruntime_fp32_ms": stats["onnxruntime_fp32"]["median_ms"],
            "qdq_latency_ms": stats["celosia_qdq"]["median_ms"],
            "qdq_ratio_vs_onnxruntime": stats["celosia_qdq"]["median_ms"] /
            stats["onnxruntime_int8_u8s8"]["median_ms"],
            **bound,
        },
        "qdq_vs_onnxruntime": qdq_agreement,
        "qdq_build": qdq.build_info.get("qdq"),
        "int8_macs": macs,
        "peak_gmac_per_s": (peak_macs / stats["peak"]["median_ms"] * 1e-6
                            if "peak" in stats else None),
        "timings": stats,
        "threads": threads,
        "repetitions": blocks * per_block,
        "protocol": f"{blocks} interleaved blocks of {per_block} timed runs per runtime, "
                    f"each block after a 50 ms pause and a warm-up run",
        "int8_form": int8.build_info.get("int8_form"),
        "bit_exact_vs_reference": True,
        "build": int8.build_info,
        "profile_summary": report["summary"],
    }
