"""`celosia bench zoo --int8`: per model, celosia's int8 CPU build against fp32 and against
onnxruntime's own static quantizer, on the same calibration data.

Protocol (issue #13): six calibration feeds, the entry's ``make_feeds`` with seeds 1..6, and
six test feeds, seeds 100..105 (one test feed let a single input decide: a change that
improved YOLO's mean over six feeds moved seed 100 the other way). fp32 is onnxruntime's
output on the float model; a feed's cosine is celosia's int8 CPU build (``quantize_model``
then ``CpuModel.from_graph``, which runs qops.py's integer kernels bit for bit) against it,
the worst over the outputs; ``int8_cosine`` is its mean over the test feeds and
``int8_cosine_worst`` the worst feed. ``int8_cosine_ort`` (and ``_worst``) the same for
onnxruntime's ``quantize_static`` QDQ model (per-channel QInt8 weights, QInt8 activations,
after ``quant_pre_process``) run on onnxruntime, and ``int8_cosine_vs_ort_quantizer`` the
difference of the means (>= 0: celosia at least as close to fp32). ``--accel`` runs the
first test feed (seed 100).
``int8_mac_share`` is the share of the model's multiply-adds (Conv, ConvTranspose, Gemm,
MatMul, recurrent cells; inside Loop/Scan/If bodies per run: ``body_parts``) that the
quantized graph computes in integer operators.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from celosia.compiler.graph.macs import body_parts, node_macs
from celosia.errors import CelosiaError

CALIBRATION_SEEDS = range(1, 7)
TEST_SEEDS = range(100, 106)


def cosine(a, b) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def mac_share(qgraph) -> float:
    """The share of multiply-adds in integer (Q*) nodes of a quantized graph."""
    total = quantized = 0
    for node in qgraph.nodes:
        parts = body_parts(node, qgraph.types, qgraph.initializers) or \
            [(node_macs(node, qgraph.types), node, "")]
        for m, n, _ in parts:
            total += m
            if n.op.startswith("Q"):
                quantized += m
    return quantized / total if total else 0.0


def _feed_cosines(outputs: list, names: list, wants: list) -> list:
    """Per test feed: the worst cosine over the outputs."""
    return [min(cosine(got[n], w) for n, w in zip(names, want))
            for got, want in zip(outputs, wants)]


def celosia_int8(model, calib: list, tests: list, wants: list, names: list,
                 keep: dict | None = None, method: str = "mse",
                 smooth: float | None = None, int8_residuals: bool = False,
                 bias_correction: bool = True) -> dict:
    from celosia.compiler.pipeline import quantize_model
    from celosia.runtime.cpu import CpuModel

    q = quantize_model(model, calib, input_shapes={k: v.shape for k, v in tests[0].items()},
                       method=method, int8_residuals=int8_residuals,
                       bias_correction=bias_correction,
                       **({} if smooth is None else {"smooth": smooth}))
    cpu = CpuModel.from_graph(q)
    outs = [cpu.run(t) for t in tests]
    if keep is not None:  # for zoo_accel: the same graph on the accelerator, the first feed
        keep.update(graph=q, feeds=tests[0], outputs=outs[0])
    ops: dict[str, int] = {}
    for n in q.nodes:
        ops[n.op] = ops.get(n.op, 0) + 1
    per_feed = _feed_cosines(outs, names, wants)
    return {"int8_cosine": float(np.mean(per_feed)), "int8_cosine_worst": min(per_feed),
            "int8_mac_share": mac_share(q),
            "int8_ops": {k: v for k, v in sorted(ops.items()) if k.startswith("Q")},
            "int8_float_nodes": sum(v for k, v in ops.items() if not k.startswith("Q")
                                    and k not in ("Quantize", "Dequantize"))}


def ort_int8(model, calib: list, tests: list, wants: list) -> list:
    """Per test feed, the cosine to fp32 of onnxruntime's quantize_static QDQ model (module
    doc)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            return next(self.it, None)

    # onnxruntime's preprocessing and quantizer leave scratch files (sym_shape_infer_temp.onnx,
    # <uuid>.data) in the working directory: run them inside a temporary one.
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "m.onnx"), os.path.join(d, "q.onnx")
        onnx.save(model, src)
        os.chdir(d)
        try:
            try:
                quant_pre_process(src, src)
            except Exception:  # optional preprocessing (shape inference); quantize as it is
                pass
            quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ,
                            per_channel=True, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8)
        finally:
            os.chdir(here)
        session = ort.InferenceSession(dst, providers=["CPUExecutionProvider"])
        return [min(cosine(g, w) for g, w in zip(session.run(None, test), want))
                for test, want in zip(tests, wants)]


def measure(entry, size: str, keep: dict | None = None, method: str = "mse",
            smooth: float | None = None, int8_residuals: bool = False,
            bias_correction: bool = True) -> dict:
    """The int8 record of one zoo entry (module doc); errors are kept as results. ``keep``
    receives the quantized graph, the test feed and the int8 CPU build's outputs;
    ``method``: celosia's calibration method (compiler/graph/calib.py); ``smooth``: the
    smoothing alpha (compiler/graph/smooth.py; None: quantize_model's default, none);
    ``int8_residuals``: dense layers' residual sums int8 (compiler/graph/residual.py);
    ``bias_correction``: compiler/graph/biascorr.py (on by default)."""
    import onnxruntime as ort

    model = entry.model(size)
    calib = [entry.make_feeds(size, seed=s) for s in CALIBRATION_SEEDS]
    tests = [entry.make_feeds(size, seed=s) for s in TEST_SEEDS]
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wants = [session.run(None, t) for t in tests]
    record: dict = {}
    try:
        record.update(celosia_int8(model, calib, tests, wants, names, keep, method, smooth,
                                   int8_residuals, bias_correction))
    except CelosiaError as e:
        record["int8_error"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # a bug in celosia, kept as a result
        record["int8_error"] = f"internal error (a bug): {type(e).__name__}: {e}"
    try:
        per_feed = ort_int8(model, calib, tests, wants)
        record["int8_cosine_ort"] = float(np.mean(per_feed))
        record["int8_cosine_ort_worst"] = min(per_feed)
    except Exception as e:  # onnxruntime's quantizer does not take every model
        record["int8_ort_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if "int8_cosine" in record and "int8_cosine_ort" in record:
        record["int8_cosine_vs_ort_quantizer"] = (record["int8_cosine"]
                                                  - record["int8_cosine_ort"])
    return record


def totals(results: dict) -> dict:
    """Totals over the models: the worst difference to onnxruntime's quantizer, the worst
    cosine and MAC share, and how many models quantize."""
    rs = list(results.values())
    diffs = [r["int8_cosine_vs_ort_quantizer"] for r in rs if "int8_cosine_vs_ort_quantizer"
             in r]
    out = {"models_ok_int8": sum("int8_cosine" in r for r in rs)}
    if diffs:
        out["int8_cosine_vs_ort_quantizer_min"] = float(min(diffs))
    cos = [r["int8_cosine"] for r in rs if "int8_cosine" in r]
    if cos:
        out["int8_cosine_min"] = float(min(cos))
        out["int8_mac_share_min"] = float(min(r["int8_mac_share"] for r in rs
                                              if "int8_mac_share" in r))
    return out
