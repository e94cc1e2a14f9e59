"""`celosia demo`: a real model, split between the accelerator and the CPU, simulated.

The bundled CNN (models/data/digits_cnn.onnx, trained by ``python -m
celosia.models.train_digits``) classifies the handwritten digits that ship with
scikit-learn. The demo

1. runs the float model on the CPU (celosia's LLVM build) and with onnxruntime,
2. quantizes it to int8 from 64 calibration digits, partitions it (convolutions, the
   residual add and the dense layer on the accelerator; Flatten and Softmax on the CPU)
   and runs the 360 held-out digits on the chosen executor (the cycle model by default),
3. checks the accelerator's result bit for bit against the all-CPU build of the same
   quantized graph,

and prints the three accuracies, the per-layer table, total cycles, utilisation (the
model's own multiply-adds over cycles x MACs per cycle) and padding overhead
(compiler/graph/macs.py), and writes a timeline picture and a JSON report.
"""

from __future__ import annotations

import time
from pathlib import Path


from .config import HwConfig


def run_demo(*, target: str = "cycle", config: HwConfig | None = None, out_dir: str = "out") -> int:
    from .models import digits
    from .runtime.accel import AccelModel, compare_outputs
    from .runtime.cpu import CpuModel
    from .runtime.report import format_table, plot_timeline, write_json

    config = config or HwConfig()
    out = Path(out_dir)
    split = digits.load_split()
    x, y = split["test"]
    calib, _ = split["calibration"]
    path = digits.model_path()
    shapes = {"image": x.shape}
    print(f"celosia demo: {path.name}, {len(y)} held-out handwritten digits (scikit-learn)")

    t0 = time.perf_counter()
    fp32 = CpuModel.build(str(path), shapes).run({"image": x})
    acc_fp32 = digits.accuracy(fp32["probs"], y)
    print(f"  fp32 on the CPU (LLVM build):      {acc_fp32:.2%}  ({time.perf_counter() - t0:.1f} s "
          f"with compilation)")
    acc_ort = None
    try:
        import onnxruntime as ort
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        acc_ort = digits.accuracy(session.run(["probs"], {"image": x})[0], y)
        print(f"  fp32 on onnxruntime:               {acc_ort:.2%}")
    except ModuleNotFoundError:
        print("  fp32 on onnxruntime:               (onnxruntime is not installed)")

    t0 = time.perf_counter()
    model = AccelModel.from_onnx(str(path), config, input_shapes=shapes,
                                 calibration={"image": calib}, target=target)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    int8 = model.run({"image": x}, target=target)
    run_s = time.perf_counter() - t0
    acc_int8 = digits.accuracy(int8["probs"], y)
    print(f"  int8 on the accelerator ({target}):  {acc_int8:.2%}  (built in {build_s:.1f} s, "
          f"simulated in {run_s:.1f} s: the first run, cold)")
    rows, summary = model.report, model.summary()
    same, detail = compare_outputs(int8, model.cpu_build().run({"image": x}), exact=True)
    print(f"  int8 accelerator vs int8 all-CPU build of the same graph: "
          f"{'bit-exact' if same else 'DIFFERENT: ' + detail['summary']}")
    print()
    print(format_table(rows, summary))
    if summary["cycles"] is not None:
        per = summary["cycles"] / len(y)
        print(f"\n  {summary['cycles']:,} accelerator cycles for {len(y)} digits ({per:,.0f} per "
              f"digit, {summary['accel_ms'] / len(y) * 1e3:.1f} us at "
              f"{summary['clock']['text']});\n"
              f"  utilisation {summary['utilization']:.1%} (the model's own multiply-adds over "
              f"cycles x {config.macs_per_cycle} MACs per cycle), padding overhead "
              f"{summary['padding_overhead']:+.0%} (GEMM work on channels padded to "
              f"{config.block})")

    out.mkdir(parents=True, exist_ok=True)
    report = {"model": path.name, "target": target, "config": config.to_dict(),
              "images": int(len(y)),
              "accuracy": {"fp32_cpu": acc_fp32, "fp32_onnxruntime": acc_ort,
                           "int8_accelerator": acc_int8},
              "int8_bit_exact_vs_cpu": same, "summary": summary, "nodes": rows,
              "build": model.build_info, "wall_s": {"build": build_s, "run_cold": run_s}}
    write_json(out / "demo.json", report)
    written = [out / "demo.json"]
    try:
        plot_timeline(rows, summary, out / "demo_timeline.png",
                      title=f"digits CNN, {len(y)} images, int8 on the accelerator ({target})")
        written.append(out / "demo_timeline.png")
    except Exception as e:  # noqa: BLE001 - the picture is optional; say why it is missing
        print(f"  (no timeline picture: {e})")
    print(f"  wrote {', '.join(map(str, written))}")
    ok = same and acc_int8 >= acc_fp32 - 0.01
    if not ok:
        print("  demo check failed: the int8 build must match the CPU build bit for bit and "
              "stay within one point of fp32 accuracy")
    return 0 if ok else 1
