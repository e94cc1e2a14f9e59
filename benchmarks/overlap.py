"""`celosia bench overlap`: a stream of inputs with the CPU and the accelerator overlapped.

For the zoo's BERT-style encoder and ResNet-18 (full size; ``--quick``: the zoo's small
versions), int8 (six calibration feeds, as `bench zoo --int8`), built for the default
configuration and run on the cycle model: a stream of ``STREAM`` inputs through
``AccelModel.run_stream`` (runtime/overlap.py), each input's outputs checked bit for bit
against the all-CPU int8 build of the same graph. Per model:

- ``throughput_ips``: inputs per second of the pipelined stream (``DEPTH`` inputs in flight:
  double buffering), against ``serial_throughput_ips``, the same work one node at a time as
  ``run`` does it;
- ``bound_ips``: 1 / max(CPU time, accelerator time) per input, the most any overlap of these
  stages reaches; ``throughput_vs_bound`` = throughput / bound (the goal: >= 0.9);
- ``latency_ms_median``: per input, from entering the pipeline to its last stage;
- ``cpu_ms_per_input`` (CPU nodes and packing/unpacking) and ``accel_ms_per_input``.

CPU times are measured (each input's own run, after one warm-up run); accelerator times are
cycles at the configured clock. ``timeline_png`` pictures are written beside ``--out`` (or in
the working directory) as overlap_<model>.png. Metrics: each model's figures prefixed by its
name, and ``throughput_vs_bound_min``.
"""

from __future__ import annotations

import os

import numpy as np

from celosia.errors import CelosiaError

MODELS = ("bert", "resnet18")
STREAM = 8
DEPTH = 2


def _measure(name: str, size: str, picture_dir: str) -> dict:
    from celosia.compiler.pipeline import quantize_model
    from celosia.models.registry import entry
    from celosia.runtime.accel import AccelModel, compare_outputs
    from celosia.runtime.cpu import CpuModel
    from celosia.runtime.overlap import plot_stream

    from .zoo_int8 import CALIBRATION_SEEDS

    zoo = entry(name)
    model = zoo.model(size)
    calib = [zoo.make_feeds(size, seed=s) for s in CALIBRATION_SEEDS]
    stream = [zoo.make_feeds(size, seed=200 + k) for k in range(STREAM)]
    q = quantize_model(model, calib, input_shapes={k: v.shape for k, v in stream[0].items()})
    accel = AccelModel.build(q, "default")
    cpu = CpuModel.from_graph(q)
    outs = accel.run_stream(stream, target="cycle", depth=DEPTH)
    for k, (feeds, got) in enumerate(zip(stream, outs)):
        same, detail = compare_outputs(got, cpu.run(feeds), exact=True)
        if not same:
            raise CelosiaError(f"overlap: {name} input {k}: the accelerator build differs "
                               f"from the all-CPU int8 build: {detail['summary']}")
    s = accel.stream
    picture = os.path.join(picture_dir, f"overlap_{name}.png")
    plot_stream(s, picture, title=f"{name} ({size}): a stream of {STREAM} inputs, int8, "
                                  f"cycle model at {accel.config.clock_mhz:g} MHz")
    print(f"overlap: {name}: {s['throughput_ips']:.2f} inputs/s pipelined, "
          f"{s['serial_throughput_ips']:.2f} one node at a time, bound {s['bound_ips']:.2f} "
          f"({s['throughput_vs_bound']:.1%})", flush=True)
    return {
        "throughput_ips": s["throughput_ips"],
        "serial_throughput_ips": s["serial_throughput_ips"],
        "bound_ips": s["bound_ips"],
        "throughput_vs_bound": s["throughput_vs_bound"],
        "speedup_vs_serial": s["speedup_vs_serial"],
        "latency_ms_median": float(np.median(s["latency_ms"])),
        "latency_ms": s["latency_ms"],
        "cpu_ms_per_input": s["cpu_ms_per_input"],
        "accel_ms_per_input": s["accel_ms_per_input"],
        "bit_exact_vs_cpu_build": True,
        "timeline_png": picture,
    }


def run(quick: bool = False, out: str | None = None) -> dict:
    size = "small" if quick else "full"
    picture_dir = os.path.dirname(os.path.abspath(out)) if out else os.getcwd()
    per = {name: _measure(name, size, picture_dir) for name in MODELS}
    metrics = {}
    for name, r in per.items():
        for key in ("throughput_ips", "serial_throughput_ips", "bound_ips",
                    "throughput_vs_bound", "latency_ms_median"):
            metrics[f"{name}_{key}"] = r[key]
    metrics["throughput_vs_bound_min"] = min(r["throughput_vs_bound"] for r in per.values())
    return {"metrics": metrics, "models": per, "stream": STREAM, "depth": DEPTH,
            "size": size}
