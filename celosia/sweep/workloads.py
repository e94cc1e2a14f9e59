"""Sweep workloads: single conv layers, the model zoo's models and ONNX files, each compiled
for one configuration and run on the cycle model (``evaluate``).

Names (``[workloads]`` of the spec, docs/sweep.md):

- ``layers``: ``"resnet18-conv"`` (ResNet-18's ten conv layers, C2-C11 of VTA's benchmark),
  ``"resnet18-conv:N"`` (layer CN, N in 2..11), or a conv layer by shape,
  ``"conv:HxWxC->O[:kK][:sS][:pP]"`` (kernel 3, stride 1 and "same" padding K // 2 unless
  given). Channels are padded to BLOCK and the batch to BATCH as the compiler does; the
  utilisation counts the layer's own multiply-adds. The layer is compiled by the schedule
  search (compiler/accel/tune.py, virtual threads allowed) with a requantizing ReLU epilogue
  (>> 8, clip to [0, 127]), as `celosia bench resnet18-layers` does.
- ``models``: model zoo names (models/registry.py) at ``model_size`` ("small", the default,
  or "full"), quantized to int8 with six random calibration feeds of the zoo's own input
  generator, built for the configuration and run once on the cycle model.
- ``onnx``: ONNX files (relative to the spec), with static input shapes; calibrated and run
  on standard-normal inputs (the cycle count does not depend on the values).

Model rows time the accelerator's part only (``cycles`` of the accelerator nodes, at the
configuration's clock); the CPU nodes' wall time depends on the machine and is not a
property of the design point, so it is not in the row (``cpu_nodes`` counts them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from celosia.errors import CelosiaError

from .errors import SpecError

__all__ = ["Workload", "parse_workloads", "evaluate", "RESNET18_LAYERS"]

# (name, H = W, Cin, Cout, kernel, stride): benchmarks/resnet_layers.py's LAYERS
from celosia.benchmarks.resnet_layers import LAYERS as RESNET18_LAYERS  # noqa: E402

_CONV = re.compile(r"^conv:(\d+)x(\d+)x(\d+)->(\d+)((?::[ksp]\d+)*)$")
# The counters of the cycle model kept in a row: the stall breakdown of the three modules
# (docs/cycle_model.md) and the DRAM traffic.
STALL_KEYS = (
    "compute_busy_cycles", "compute_stall_token_load_cycles", "compute_stall_token_store_cycles",
    "compute_stall_pipeline_cycles", "compute_stall_hazard_cycles",
    "compute_stall_cmdq_empty_cycles", "load_busy_cycles", "load_stall_bus_cycles",
    "load_stall_dram_cycles", "load_stall_token_compute_cycles", "store_busy_cycles",
    "store_stall_dram_cycles", "store_stall_token_compute_cycles",
)
DRAM_KEYS = ("dram_read_bytes", "dram_write_bytes")


@dataclass(frozen=True)
class Workload:
    name: str  # as given in the spec (canonical for layers)
    kind: str  # "conv", "zoo" or "onnx"
    params: dict = field(default_factory=dict, hash=False, compare=False)


def _bad(source: str, key: str, msg: str) -> CelosiaError:
    return SpecError(f"{source}: workloads.{key}: {msg}")


def _conv(name: str, source: str, key: str) -> list[Workload]:
    if name == "resnet18-conv":
        return [w for n in range(2, 12) for w in _conv(f"resnet18-conv:{n}", source, key)]
    if name.startswith("resnet18-conv:"):
        tail = name.split(":", 1)[1].removeprefix("C")
        layers = {row[0]: row for row in RESNET18_LAYERS}
        if f"C{tail}" not in layers:
            raise _bad(source, key, f"{name!r}: ResNet-18's conv layers are resnet18-conv:2 to "
                                    f"resnet18-conv:11 (C2-C11 of VTA's benchmark)")
        _, hw, cin, cout, k, s = layers[f"C{tail}"]
        return [Workload(f"resnet18-conv:{tail}", "conv",
                         dict(h=hw, w=hw, c=cin, o=cout, k=k, stride=s, pad=k // 2))]
    m = _CONV.match(name)
    if not m:
        raise _bad(source, key, f"{name!r} is not a layer; layers are resnet18-conv, "
                                f"resnet18-conv:N or conv:HxWxC->O[:kK][:sS][:pP] "
                                f"(e.g. conv:14x14x64->64:k3:s1)")
    h, w, c, o = (int(g) for g in m.groups()[:4])
    opts = {t[0]: int(t[1:]) for t in m.group(5).split(":") if t}
    k = opts.get("k", 3)
    p = dict(h=h, w=w, c=c, o=o, k=k, stride=opts.get("s", 1), pad=opts.get("p", k // 2))
    if min(h, w, c, o, k, p["stride"]) < 1 or k > h + 2 * p["pad"] or k > w + 2 * p["pad"]:
        raise _bad(source, key, f"{name!r}: sizes must be positive and the kernel no larger "
                                f"than the padded input")
    return [Workload(name, "conv", p)]


def parse_workloads(table: dict, source: str, root: Path) -> list[Workload]:
    extra = set(table) - {"layers", "models", "onnx", "model_size"}
    if extra:
        raise _bad(source, sorted(extra)[0], "unknown key; keys are layers, models, onnx, "
                                             "model_size")
    size = table.get("model_size", "small")
    if size not in ("small", "full"):
        raise _bad(source, "model_size", f"{size!r}: use \"small\" or \"full\"")
    out: list[Workload] = []
    for key in ("layers", "models", "onnx"):
        items = table.get(key, [])
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, list):
            raise _bad(source, key, "a list of names")
        for i, item in enumerate(items):
            where = f"{key}[{i}]"
            if not isinstance(item, str):
                raise _bad(source, where, f"{item!r} is not a string")
            if key == "layers":
                out += _conv(item, source, where)
            elif key == "models":
                from celosia.models.registry import ZOO

                if item not in ZOO:
                    raise _bad(source, where, f"no zoo model named {item!r}; the zoo has "
                                              f"{', '.join(ZOO)}")
                missing = ZOO[item].missing()
                if missing:
                    raise _bad(source, where, f"{item}: {missing}")
                out.append(Workload(f"zoo:{item}", "zoo", dict(model=item, size=size)))
            else:
                path = (root / item).resolve()
                if not path.is_file():
                    raise _bad(source, where, f"{item!r}: no such file ({path})")
                out.append(Workload(f"onnx:{item}", "onnx", dict(path=str(path))))
    names = [w.name for w in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise _bad(source, "layers" if dup.startswith(("conv", "resnet")) else "models",
                   f"{dup!r} is listed twice")
    if not out:
        raise _bad(source, "layers", "no workload: give [workloads] layers, models or onnx")
    return out


# ---- evaluation ---------------------------------------------------------------------------


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def conv_specs(cfg, p: dict):
    """The layer as given (its own multiply-adds) and as compiled (channels padded to BLOCK,
    the batch to BATCH)."""
    from celosia.compiler.accel.ops import ConvSpec, Epilogue

    ep = Epilogue(shift=8, relu=True)
    real = ConvSpec(1, p["c"], p["h"], p["w"], p["o"], p["k"], p["k"], p["stride"], p["pad"], ep)
    padded = ConvSpec(cfg.batch, _round_up(p["c"], cfg.block), p["h"], p["w"],
                      _round_up(p["o"], cfg.block), p["k"], p["k"], p["stride"], p["pad"], ep)
    return real, padded


def _eval_conv(cfg, p: dict) -> dict:
    from dataclasses import asdict
    import json

    from celosia.compiler.accel.tune import tune_conv

    real, padded = conv_specs(cfg, p)
    knobs, stats = tune_conv(cfg, padded, vthreads=True)
    return {"cycles": int(stats["cycles"]), "macs": real.macs, "gemm_macs": int(stats["macs"]),
            "items": 1, "schedule": json.dumps(asdict(knobs), sort_keys=True),
            **{k: int(stats[k]) for k in STALL_KEYS + DRAM_KEYS if k in stats}}


def rtl_cycles(cfg, p: dict, schedule: str) -> int:
    """The layer with ``schedule`` (a row's JSON knobs) run on the RTL (Verilator; built
    once per configuration and cached, sim/rtl.py): its cycle count."""
    import json

    import numpy as np

    from celosia.compiler.accel.ops import ConvKnobs, conv2d, pack_nchw, pack_oihw
    from celosia.driver import Device

    _, spec = conv_specs(cfg, p)
    rng = np.random.default_rng(0)
    b, k = cfg.batch, cfg.block
    fn = conv2d(cfg, spec, ConvKnobs(**json.loads(schedule)))
    args = [pack_nchw(rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8),
                      b, k),
            pack_oihw(rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw),
                                   dtype=np.int8), k),
            np.zeros((spec.n // b, spec.o // k, spec.oh, spec.ow, b, k), np.int8)]
    size = sum(a.nbytes for a in args) * 2 + (8 << 20)
    return int(fn(Device(cfg, target="rtl", dram_size=size), *args)["cycles"])


_GRAPHS: dict = {}  # quantized graphs of this process, per workload (config-independent)


def _quantized(w: Workload):
    if w.name in _GRAPHS:
        return _GRAPHS[w.name]
    import numpy as np
    import onnx

    from celosia.compiler.frontend.onnx import import_onnx
    from celosia.compiler.pipeline import quantize_model

    if w.kind == "zoo":
        from celosia.models.registry import entry

        e = entry(w.params["model"])
        model = e.model(w.params["size"])
        feeds = e.make_feeds(w.params["size"], seed=100)
        samples = [e.make_feeds(w.params["size"], seed=s) for s in range(6)]
        shapes = {k: v.shape for k, v in feeds.items()} if e.dynamic else None
    else:
        model = onnx.load(w.params["path"])
        graph = import_onnx(model, None)
        rng = np.random.default_rng(0)
        feeds, samples = {}, []
        for s in range(7):
            one = {}
            for name in graph.inputs:
                t = graph.types[name]
                if any(not isinstance(d, int) for d in t.shape):
                    raise CelosiaError(f"{w.params['path']}: input {name!r} has dynamic "
                                       f"dimensions {t.shape}; export it with static shapes")
                one[name] = rng.normal(size=t.shape).astype(t.dtype)
            (samples.append(one) if s < 6 else feeds.update(one))
        shapes = None
    calibration = {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}
    graph = import_onnx(model, shapes)
    qgraph = quantize_model(graph, calibration)
    _GRAPHS[w.name] = (qgraph, feeds)
    return qgraph, feeds


def _eval_model(cfg, w: Workload) -> dict:
    from celosia.runtime.accel import AccelModel

    qgraph, feeds = _quantized(w)
    model = AccelModel.build(qgraph, cfg, accelerate=True)
    model.run(feeds, target="cycle")
    s = model.summary()
    row = {"cycles": s["cycles"] or 0, "macs": s["macs"], "gemm_macs": s["gemm_macs"],
           "items": 1, "accel_nodes": s["accel_nodes"], "cpu_nodes": s["cpu_nodes"]}
    for key in STALL_KEYS + DRAM_KEYS:  # summed over the accelerator nodes
        row[key] = sum(int(c.get(key, 0)) for c in model.node_counters.values())
    return row


def evaluate(cfg, w: Workload) -> dict:
    """Compile ``w`` for ``cfg`` and run it on the cycle model: cycles, the multiply-adds
    (the workload's own and the GEMM core's), the stall breakdown and the DRAM traffic."""
    row = _eval_conv(cfg, w.params) if w.kind == "conv" else _eval_model(cfg, w)
    cycles = row["cycles"]
    row["latency_ms"] = cycles / (cfg.clock_mhz * 1e3)
    row["throughput_gops"] = (2 * row["macs"] / (row["latency_ms"] * 1e6)
                              if cycles else None)
    row["utilization"] = row["macs"] / (cycles * cfg.macs_per_cycle) if cycles else None
    row["dram_bytes"] = row.get("dram_read_bytes", 0) + row.get("dram_write_bytes", 0)
    return row
