"""Benchmarks: figures of speed and quality, each run as `celosia bench NAME [--out FILE.json]`.

A benchmark is a function ``run(quick: bool) -> dict`` returning ``{"metrics": {name: number},
...details}``; :func:`run_benchmark` adds a description of the machine. Machines are shared
and noisy, so benchmarks report medians of repeated runs and ratios measured in one run.
"""

from __future__ import annotations

import importlib
import os
import platform
from datetime import datetime, timezone

from celosia.errors import CelosiaError

__all__ = ["BENCHMARKS", "run_benchmark", "machine_description"]

# name -> (module, function, one-line summary)
BENCHMARKS = {
    "fsim": ("celosia.benchmarks.fsim_bench", "run",
             "functional simulator speed: 256^3 GEMM and ResNet-18 conv 56x56x64->64 (GMAC/s)"),
    "cycle": ("celosia.benchmarks.cycle_bench", "run",
              "cycle model speed on the fsim benchmark's programs: speedup over the RTL, time "
              "ratio to fsim, simulated cycles/s (cycle counts checked equal to the RTL's)"),
    "rtl": ("celosia.benchmarks.rtl_bench", "run",
            "RTL (Verilator) speed in simulated cycles/s on the same programs, and a cold "
            "build's time"),
    "resnet18-layers": ("celosia.benchmarks.resnet_layers", "run",
                        "ResNet-18 conv layers compiled and run on the cycle model: GEMM "
                        "utilisation with and without virtual threads"),
    "cpu-resnet18": ("celosia.benchmarks.cpu_resnet18", "run",
                     "ResNet-18 fp32 224x224 CPU build: latency vs onnxruntime and numpy, "
                     "cold and warm compile time"),
    "cpu-resnet18-int8": ("celosia.benchmarks.cpu_resnet18_int8", "run",
                          "ResNet-18 int8 224x224 CPU build (QConv/QGemm on the CPU's int8 "
                          "dot-product instructions): latency vs celosia fp32 and onnxruntime's "
                          "int8 QDQ model, bit-exact with qops.py"),
    "resnet18-e2e": ("celosia.benchmarks.resnet18_e2e", "run",
                     "ResNet-18 int8 224x224 split between the accelerator (cycle model) and "
                     "the CPU: latency, shares, speedup over the CPU build, simulation wall time"),
    "cpu-qops": ("celosia.benchmarks.cpu_qops", "run",
                 "int8 CPU build of the small EfficientNet and BERT: compiled QLut/QAdd/QMul/"
                 "QMatMul kernels against numpy steps, median latency and speedup"),
    "overlap": ("celosia.benchmarks.overlap", "run",
                "a stream of 8 inputs (BERT-style encoder, ResNet-18; int8, cycle model) with "
                "the CPU and the accelerator overlapped: throughput against one node at a "
                "time and against the busier side's bound"),
    "fpga": ("celosia.benchmarks.fpga_bench", "run",
             "open-tool FPGA results: Fmax of the small and ecp5 presets on the LFE5U-85F "
             "(place and route), the default core on the xc7z020 (fits), resources, and "
             "ResNet-18's conv layer cycles before/after the pipelined datapath"),
    "sweep": ("celosia.benchmarks.sweep_bench", "run",
              "`celosia sweep` over ResNet-18's conv layers (8 configurations, cold caches): "
              "design points per hour, Ray's scaling from 1 to 2 workers, Ray's wall time "
              "over the local engine's"),
    "zoo": ("celosia.benchmarks.zoo", "run",
            "the model zoo at full size on the CPU build against onnxruntime: models that "
            "import and agree, latency ratio per model, geometric mean and worst"),
}


def machine_description() -> dict:
    import numpy as np

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def run_benchmark(name: str, *, quick: bool = False, models: str | None = None,
                  int8: bool = False, accel: bool = False,
                  time_limit: float | None = None,
                  calibration_method: str | None = None,
                  smooth: float | None = None, int8_residuals: bool = False,
                  bias_correction: bool = True, out: str | None = None) -> dict:
    if name not in BENCHMARKS:
        raise CelosiaError(f"unknown benchmark {name!r}; `celosia bench --list` names them: "
                           f"{', '.join(BENCHMARKS)}")
    module, function, summary = BENCHMARKS[name]
    kwargs = {"quick": quick}
    if name == "overlap":  # its pictures go beside the JSON
        kwargs["out"] = out
    if models:
        if name != "zoo":
            raise CelosiaError(f"--models selects zoo models; benchmark {name!r} has none")
        kwargs["models"] = [m.strip() for m in models.split(",") if m.strip()]
    if int8:
        if name != "zoo":
            raise CelosiaError(f"--int8 measures zoo models; benchmark {name!r} has none")
        kwargs["int8"] = True
    if accel or time_limit is not None:
        if name != "zoo":
            raise CelosiaError(f"--accel and --time-limit measure zoo models; benchmark "
                               f"{name!r} has none")
        kwargs.update(accel=accel, time_limit=time_limit)
    if calibration_method is not None:
        from celosia.compiler.graph.calib import parse_method

        if name != "zoo" or not (int8 or accel):
            raise CelosiaError("--calibration-method goes with `bench zoo --int8` (or --accel)")
        parse_method(calibration_method)  # a bad value fails before the models are built
        kwargs["calibration_method"] = calibration_method
    if smooth is not None:
        from celosia.compiler.graph.smooth import check_alpha

        if name != "zoo" or not (int8 or accel):
            raise CelosiaError("--smooth goes with `bench zoo --int8` (or --accel)")
        kwargs["smooth"] = check_alpha(smooth)
    if int8_residuals:
        if name != "zoo" or not (int8 or accel):
            raise CelosiaError("--int8-residuals goes with `bench zoo --int8` (or --accel)")
        kwargs["int8_residuals"] = True
    if not bias_correction:
        if name != "zoo" or not (int8 or accel):
            raise CelosiaError("--no-bias-correction goes with `bench zoo --int8` (or --accel)")
        kwargs["bias_correction"] = False
    result = getattr(importlib.import_module(module), function)(**kwargs)
    return {"benchmark": name, "summary": summary, "quick": quick, **result,
            "machine": machine_description()}
