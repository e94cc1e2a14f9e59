"""Whole quantized models split between the accelerator and the CPU.

    model = AccelModel.build(qgraph, "default")       # partition, schedule, place in DRAM
    model.save("m.cel");  model = AccelModel.load("m.cel")   # no recompilation
    outputs = model.run({"image": x}, target="cycle") # fsim | cycle | rtl
    model.report                                       # per node: where, time, cycles, why

Building (``build``) takes a quantized graph (compiler/quantize.py), asks
compiler/partition.py what the configured accelerator can run, compiles each accelerator
node (schedule search on the cycle model, cached on disk) and emits it through the driver
into a program that stays resident in DRAM, next to its packed weights and the DRAM
buffers of its input and output values. The result is one DRAM image plus, per
accelerator node, the address of its program: running the model writes the image into an
executor once and then only moves activations.

Running walks the graph in order. An accelerator node's int8 inputs are packed into DRAM
only if the CPU produced them (values flowing between accelerator nodes never leave DRAM),
its program runs, and its output stays in DRAM until a CPU node reads it (then it is read
back and unpacked once). A QMatMul's second operand is packed into the weight layout
before each run of its program (read back first if the accelerator made it; a constant
one once, at build time): programs list such operands as ``staged``, counted as layout
time and as crossings. A recurrent layer (QLSTM, QGRU, QRNN), a 16-bit product (QMatMulWide, QConvWide) and
control flow whose bodies hold such nodes are accelerator nodes whose values stay on the
host: they pack their own operands and run a program per product, per step or iteration
(runtime/accel_recurrent.py). CPU nodes run the numpy kernels that define each operator
(compiler/graph_numpy.py, graph_int.py), the same code as the all-CPU build
(``accelerate=False``), so the two builds agree bit for bit. CPU nodes computed in place on
the packed layout (partition.packed_nodes: a table between accelerator nodes) read and
write their values in DRAM, through views of the executor's memory
(``Executor.dram_view``) where it offers them: no crossing.

The report gives, per node: where it ran (and for CPU nodes why), the CPU time measured,
the accelerator cycles and their time at the configured clock, the node's real
multiply-adds (``macs``, the model's own) and the GEMM core's (``gemm_macs``, padded
channels and rows included), ``utilization`` (real multiply-adds over cycles x MACs per
cycle) and ``padding_overhead`` (gemm_macs / macs - 1; compiler/graph/macs.py defines
both); the time spent packing and unpacking at region borders is reported as
``layout_ms`` (each crossing planned once per executor by runtime/crossing.py: DRAM views,
bound kernels, kept host buffers; docs/runtime.md, "The accelerator build's border").
``summary()`` adds ``layout_share`` (layout time over latency) and ``crossings``: the
values that crossed between CPU and accelerator in the run (packed into DRAM for an
accelerator node, or read back for the CPU or as an output).

A ``.cel`` file of this kind is a zip archive (deflated), written and read by
runtime/artifact.py (member digests checked before use, the manifest checked field by
field by runtime/schema.py and against the graph, the DRAM image and the CPU parts):

    manifest.json      format "celosia-accel", version 2, configuration, graph, placements,
                       programs, value buffers, CPU segments, build info, member digests
    manifest.sha256    the digest of manifest.json
    constants/N.npy    the quantized graph's initializers
    dram.npy           the DRAM image (weights, micro-ops, instructions)
    cpu/K.cel          each CPU segment, a CPU build (runtime/cpu.py) of its nodes
    model.onnx         the source model, when built from one (for --compare onnxruntime)
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from functools import partial

import numpy as np

from ..config import HwConfig
from . import schema
from .accel_recurrent import HOST_KINDS
from .artifact import Artifact, artifact_format, write_artifact
from .cpu import npy_bytes
from .crossing import Crossing, staged_packer

__all__ = ["AccelModel", "FORMAT", "VERSION", "is_accel_artifact", "compare_outputs"]

FORMAT = "celosia-accel"
VERSION = 2  # 2: member digests and a checked manifest


def is_accel_artifact(path) -> bool:
    """Whether a .cel file says it is an accelerator build (rather than a CPU build)."""
    return artifact_format(path) == FORMAT


def compare_outputs(ours: dict, theirs: dict, *, exact: bool) -> tuple[bool, dict]:
    """(identical?, details) per output: elements that differ, the largest difference,
    relative to the reference's range, and for outputs of shape [N, classes] the share of
    rows whose arg-max agrees."""
    same, rows = True, {}
    for name, a in ours.items():
        b = np.asarray(theirs[name])
        if a.shape != b.shape:
            rows[name] = {"shape": list(a.shape), "reference_shape": list(b.shape)}
            same = False
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        span = float(np.abs(b).max()) if b.size else 0.0
        row = {"differing": int(np.count_nonzero(diff)), "elements": int(diff.size),
               "max_abs_diff": float(diff.max()) if diff.size else 0.0,
               "max_diff_vs_range": float(diff.max() / span) if span and diff.size else 0.0}
        if a.ndim == 2 and a.shape[1] > 1:
            row["argmax_agreement"] = float(np.mean(a.argmax(1) == b.argmax(1)))
        same &= row["differing"] == 0
        rows[name] = row
    parts = []
    for name, r in rows.items():
        if "shape" in r:
            parts.append(f"{name}: shape {r['shape']} vs {r['reference_shape']}")
        elif exact:
            parts.append(f"{name}: {r['differing']} of {r['elements']} elements differ")
        else:
            agree = (f", arg-max agrees on {r['argmax_agreement']:.1%} of rows"
                     if "argmax_agreement" in r else "")
            parts.append(f"{name}: max |diff| {r['max_abs_diff']:.3g} "
                         f"({r['max_diff_vs_range']:.2%} of its range){agree}")
    return same, {"outputs": rows, "summary": "; ".join(parts)}


def _graph_to_json(graph) -> tuple[dict, dict]:
    """(JSON-able description, {file name: array}) of a graph."""
    consts = {f"constants/{k}.npy": np.asarray(a) for k, a in enumerate(graph.initializers.values())}
    return {
        "name": graph.name, "inputs": list(graph.inputs), "outputs": list(graph.outputs),
        "nodes": [{"op": n.op, "inputs": list(n.inputs), "outputs": list(n.outputs),
                   "attrs": schema.encode(n.attrs), "name": n.name} for n in graph.nodes],
        "types": {k: [t.dtype, list(t.shape)] for k, t in graph.types.items()},
        "initializers": {name: f"constants/{k}.npy" for k, name in enumerate(graph.initializers)},
    }, consts


class AccelModel:
    """A quantized model partitioned between the accelerator and the CPU (module doc)."""

    def __init__(self, graph, config: HwConfig, placements: dict, programs: dict,
                 values: dict, image: np.ndarray, *, segments: list | None = None,
                 source: bytes | None = None, build_info: dict | None = None,
                 packed: set | None = None, external: list | None = None):
        self.graph = graph
        self.config = config
        self.placements = placements  # node name -> Placement
        self.programs = programs      # node name -> {insn_addr, insn_count, kind, spec, knobs, ...}
        self.values = values          # value name -> {"addr", "shape" (packed)}
        self.image = image            # DRAM bytes [0, len)
        self.segments = segments or []  # [(node names, CpuModel)]: compiled CPU parts
        # [(target name, node names, module)]: partitions of plug-in targets
        # (runtime/targets.py)
        self.external = external or []
        self.source = source
        self.build_info = build_info or {}
        self.report: list[dict] = []
        self.crossings = {"to_accel": 0, "to_cpu": 0}  # of the last run (``summary``)
        # values in-place CPU nodes read or wrote in DRAM, packed, in the last run
        # (partition.packed_nodes): no crossing, no layout conversion
        self.in_place = 0
        # ms the last run spent planning its executor's border (its first run on it only)
        self.border_setup_ms = 0.0
        self._executors: dict = {}
        # CPU nodes computed in place on the packed layout (partition.packed_nodes)
        self.packed = _packed(graph, placements) if packed is None else set(packed)

    # ---- building --------------------------------------------------------------------------

    @classmethod
    def build(cls, graph, config=None, *, accelerate: bool = True, tune_top: int = 4,
              progress=None, source: bytes | None = None, targets=None) -> "AccelModel":
        """Partition, compile and place a quantized graph (see the module docstring).
        ``targets``: the targets to partition between, in order of preference (names
        registered in runtime/targets.py; default accel, cpu); plug-in targets' partitions
        are built by their targets and run on the host."""
        from celosia.errors import CompilerError

        from ..compiler.accel.partition import in_dram, packed_nodes
        from ..compiler.accel.split import split_sliced_layers
        from ..compiler.accel.matmul import bind_matmul, pack_weights, weights_shape
        from ..compiler.accel.partition import (
            ALIAS_OPS,
            ALU_OPS,
            PLACED_OPS,
            Placement,
            annotate,
            compile_layer,
            concat_slices,
            dram_reads,
            layer_for,
            packed_shape,
            regions,
            value_layouts,
            root_of,
        )
        from ..compiler.accel import fuse_pool, im2col
        from ..compiler.accel.recurrent import is_host_node
        from ..driver import Device
        from .accel_recurrent import build_host_node, host_bytes

        start = time.perf_counter()
        cfg = HwConfig.load(config)
        if accelerate:  # a layer read only through channel slices: a layer per slice
            graph = split_sliced_layers(graph)
        refusals = {}
        if accelerate and targets is not None:
            from .targets import place

            placed = place(graph, cfg, targets)
            placements, refusals = placed.placements, placed.refusals
        else:
            placements = annotate(graph, cfg, accelerate=accelerate)
        accel = [n for n in graph.nodes if placements[n.name].target == "accel"]
        producer = {o: n for n in graph.nodes for o in n.outputs if o}
        compiled, views, windows = {}, [], {}
        fused = {}  # a MaxPool run by its QConv's program -> that QConv (fuse_pool.py)
        apart = {}  # a MaxPool after a QConv, not fused -> why
        for k, node in enumerate(accel):
            if node.name in fused:
                continue
            if node.op in ALIAS_OPS + ALU_OPS + PLACED_OPS:
                # (a node before it that left the accelerator may have taken the in-place
                # node that made its input with it)
                packed = packed_nodes(graph, placements)
                cpu = [producer[v].name for v in dram_reads(node) if v in producer and
                       not in_dram(v, producer, placements, packed)]
                if cpu:
                    placements[node.name] = Placement(
                        "cpu", f"{node.op} of a value the CPU makes (its producer {cpu[0]!r} "
                        f"has no accelerator schedule): on the accelerator it would add a "
                        f"crossing, not save one")
                    continue
            if node.op in ALIAS_OPS + PLACED_OPS:  # a view or a placement: no program
                views.append(node.name)
                continue
            if is_host_node(node):  # programs per product: accel_recurrent.py
                compiled[node.name] = None
                continue
            t0 = time.perf_counter()
            roots = {v: root_of(v, producer, placements) for v in node.inputs[:1]}
            layer = layer_for(node, graph, cfg, roots=roots)
            try:
                # a few-channel layer fed by the CPU: its windows packed by the runtime
                windowed = im2col.plan(node, graph, cfg, placements, layer, top=tune_top)
                if windowed:
                    layer, windows[node.name] = windowed
                # the max pooling that alone reads it, pooled before the store
                pooled, why = fuse_pool.plan(node, graph, cfg, placements, layer, top=tune_top)
                if why:
                    apart[why[0]] = f"not fused with {node.name}: {why[1]}"
                if pooled:
                    fn, knobs, pool = pooled
                    fused[pool.name] = node.name
                else:
                    fn, knobs = compile_layer(layer, cfg, top=tune_top)
            except CompilerError as e:
                placements[node.name] = Placement("cpu", f"no accelerator schedule: {e}")
                continue
            compiled[node.name] = (layer, fn, knobs)
            if progress:
                progress(f"[{k + 1}/{len(accel)}] {node.name}: {layer.kind} {_spec_str(layer.spec)}"
                         f" -> {_knobs_str(knobs)} ({time.perf_counter() - t0:.2f} s)"
                         + (f"; {apart[node.name]}" if node.name in apart else ""))
        region_of = regions(graph, placements)
        layouts = value_layouts(graph, placements)
        packed = packed_nodes(graph, placements) if accelerate else set()

        # DRAM: constants, values and programs, each in its own buffer (a matmul's weights:
        # a buffer the runtime packs its second operand into).
        need = sum((l.weight.nbytes if l.weight is not None else
                    int(np.prod(weights_shape(graph.types[n.inputs[1]].shape, cfg))))
                   + l.bias.nbytes + l.scale.nbytes
                   for n in graph.nodes if compiled.get(n.name)
                   for l in (compiled[n.name][0],))
        need += sum(host_bytes(n, graph, cfg) for n in graph.nodes
                    if n.name in compiled and compiled[n.name] is None)
        for name in {i for n in graph.nodes if compiled.get(n.name) or n.name in packed
                     for i in (*dram_reads(n), n.outputs[0]) if i}:
            need += int(np.prod(packed_shape(graph.types[name].shape, cfg, layouts.get(name))))
        # A device only to place programs and data (nothing runs on it); none for an all-CPU
        # build.
        dev = Device(cfg, target="fsim", dram_size=_round_up(2 * need + (64 << 20), 1 << 20)) \
            if compiled else None
        values: dict[str, object] = {}
        slices = concat_slices(graph, placements, cfg)

        def value_buffer(name, align):
            # A value is one element size wherever it is used (BATCH x BLOCK int8 bytes), so
            # its first user's alignment holds for every user. A view's value is its root's
            # buffer.
            if name not in values:
                root = root_of(name, producer, placements)
                if root != name:
                    buf = value_buffer(root, align)
                    values[name] = (buf, values[root][1], root)
                elif name in slices:  # its bytes lie in a Concat's output
                    outer, offset = slices[name]
                    base = value_buffer(outer, align)
                    shape = packed_shape(graph.types[name].shape, cfg, layouts.get(name))
                    buf = _sub_buffer(base, offset, int(np.prod(shape)))
                    values[name] = (buf, shape, None)
                else:
                    shape = packed_shape(graph.types[name].shape, cfg, layouts.get(name))
                    values[name] = (dev.alloc(int(np.prod(shape)), align=align), shape, None)
            return values[name][0]

        programs = {}
        elem = max(64, cfg.batch * cfg.block)
        for node in graph.nodes:
            if node.name in packed:  # its operands and result stay in DRAM, packed
                for v in (*dram_reads(node), node.outputs[0]):
                    value_buffer(v, elem)
            if node.name in views and dev is not None:
                value_buffer(node.outputs[0], elem)
                view = node.op in ALIAS_OPS
                programs[node.name] = {
                    "insn_addr": 0, "insn_count": 0, "kind": "view" if view else "concat",
                    "spec": {"of": root_of(node.outputs[0], producer, placements)} if view
                    else {"slices": {v: slices[v][1] for v in node.inputs}},
                    "knobs": {}, "macs": 0, "region": region_of[node.name]}
            if node.name in fused:  # its QConv's program writes its output
                value_buffer(node.outputs[0], elem)
                programs[node.name] = {"insn_addr": 0, "insn_count": 0, "kind": "fused",
                                       "spec": {"into": fused[node.name]}, "knobs": {},
                                       "macs": 0, "region": region_of[node.name]}
                continue
            if node.name not in compiled:
                continue
            if compiled[node.name] is None:  # a recurrent layer, or control flow
                programs[node.name] = {**build_host_node(node, graph, cfg, dev),
                                       "region": region_of[node.name]}
                continue
            layer, fn, knobs = compiled[node.name]
            align = [a for _, _, _, a in fn.arg_specs()]
            staged = []
            if layer.kind == "matmul":
                # The second operand is packed by the runtime into its own weight buffer
                # before every run (``run``), or here if it is a constant; the program binds
                # each matrix's slices.
                w_shape = weights_shape(graph.types[node.inputs[1]].shape, cfg)
                if node.inputs[1] in graph.initializers:
                    w_buf = dev.upload(pack_weights(np.asarray(graph.initializers[node.inputs[1]]),
                                                    cfg), align=align[1])
                else:
                    w_buf = dev.alloc(int(np.prod(w_shape)), align=align[1])
                    staged.append({"value": node.inputs[1], "addr": w_buf.addr,
                                   "shape": list(w_shape), "layout": "weights"})
                a_buf = value_buffer(node.inputs[0], align[0])
                o_buf = value_buffer(node.outputs[0], align[-1])
                bind_matmul(fn, dev, layer.shape, a_buf, values[node.inputs[0]][1], w_buf,
                            w_shape, dev.upload(layer.bias, align=align[2]),
                            dev.upload(layer.scale, align=align[3]), o_buf,
                            values[node.outputs[0]][1])
            else:
                operands = layer.operands(node)
                pool = [n for n, conv in fused.items() if conv == node.name]
                if pool:  # the program stores the pooled output
                    operands[-1] = ("value", next(n.outputs[0] for n in graph.nodes
                                                  if n.name == pool[0]))
                bufs = [value_buffer(x, a) if what == "value" else dev.upload(x, align=a)
                        for (what, x), a in zip(operands, align)]
                if node.name in windows:  # the input's windows, packed by the runtime
                    shape = windows[node.name].packed_shape(cfg)
                    bufs[0] = dev.alloc(int(np.prod(shape)), align=align[0])
                    staged.append({"value": node.inputs[0], "addr": bufs[0].addr,
                                   "shape": list(shape), "layout": im2col.LAYOUT})
                fn.bind(dev, bufs)
            prog = dev.build_program()
            programs[node.name] = {
                "insn_addr": prog.insn_addr, "insn_count": prog.insn_count,
                "kind": "conv_pool" if node.name in fused.values() else layer.kind,
                "spec": asdict(layer.spec), "knobs": asdict(knobs), "macs": layer.macs,
                "region": region_of[node.name],
                **({"staged": staged} if layer.kind == "matmul" or staged else {}),
            }
        image = (dev.executor.read_dram(0, dev.allocator.high_water) if dev is not None
                 else np.zeros(0, np.uint8))
        t0 = time.perf_counter()
        shapes = {k: s for k, (_, s, _) in values.items()}
        segments = _cpu_segments(graph, placements, progress, packed, shapes)
        cpu_s = time.perf_counter() - t0
        external = _external_partitions(graph, placements, progress)
        info = {"nodes": len(graph.nodes), "accel_nodes": len(programs),
                "cpu_segments": len(segments), "cpu_compile_s": cpu_s,
                **({"external": [{"target": t, "nodes": len(n)} for t, n, _ in external],
                    "refusals": refusals} if external or refusals else {}),
                "regions": len(set(region_of.values())), "dram_bytes": int(image.size),
                "instructions": sum(p["insn_count"] for p in programs.values()),
                "total_s": time.perf_counter() - start}
        return cls(graph, cfg, placements, programs,
                   {k: {"addr": b.addr, "shape": list(s),
                        **({"layout": layouts[k]} if layouts.get(k) == "matrices" else {}),
                        **({"of": r} if r else {})}
                    for k, (b, s, r) in values.items()},
                   image, segments=segments, source=source, build_info=info,
                   packed=packed, external=external)._warm_layouts()

    @classmethod
    def from_onnx(cls, model, config=None, *, input_shapes: dict | None = None,
                  calibration=None, target: str = "fsim", tune_top: int = 4,
                  progress=None, calibration_method: str = "mse",
                  smooth: float | None = None,
                  int8_residuals: bool = False,
                  bias_correction: bool = True, targets=None) -> "AccelModel":
        """Import an ONNX model (path, bytes or ModelProto), quantize it to int8 (with
        ``calibration``: an .npz path or {input: samples}; a QDQ model needs none) and build
        it for ``target`` (``"cpu"``: the all-CPU build of the same quantized graph).
        ``calibration_method``: "mse", "minmax", "percentile[:P]" or "entropy"
        (compiler/graph/calib.py); ``smooth``: the SmoothQuant alpha (compiler/graph/smooth.py;
        None or 0 for none, quantize_model's default); ``int8_residuals``: dense layers'
        residual sums int8 rather than float (compiler/graph/residual.py);
        ``bias_correction``: compiler/graph/biascorr.py (on by default); ``targets``: the
        targets to partition between (``build``)."""
        from ..compiler.frontend.onnx import import_onnx
        from ..compiler.graph.quantize import CalibrationError
        from ..compiler.pipeline import quantize_model
        from .cpu import _model_bytes

        start = time.perf_counter()
        graph = import_onnx(model, input_shapes)  # quantize_model optimizes (after from_qdq)
        if calibration is None and not any(n.op in ("QuantizeLinear", "DequantizeLinear")
                                           for n in graph.nodes):
            raise CalibrationError(
                "the accelerator runs int8 models: quantize this float model with --quantize "
                "int8 --calibration DATA.npz (in Python: calibration={input: samples}), or "
                "give a QDQ model from onnxruntime's quantizer")
        qgraph = quantize_model(graph, calibration, method=calibration_method,
                                int8_residuals=int8_residuals,
                                bias_correction=bias_correction,
                                **({} if smooth is None else {"smooth": smooth}))
        if progress:
            n = sum(node.op in ("QConv", "QGemm") for node in qgraph.nodes)
            progress(f"quantized to int8: {n} integer conv/dense layers "
                     f"({time.perf_counter() - start:.2f} s)")
        built = cls.build(qgraph, config, accelerate=target != "cpu", tune_top=tune_top,
                          progress=progress, source=_model_bytes(model), targets=targets)
        built.build_info["target"] = target
        built.build_info["total_s"] = time.perf_counter() - start
        return built

    def cpu_build(self) -> "AccelModel":
        """The all-CPU build of the same quantized graph: no accelerator node, the whole
        graph one compiled CPU segment (LLVM kernels, runtime/cpu.py)."""
        return AccelModel.build(self.graph, self.config, accelerate=False, source=self.source)

    # ---- saving and loading ----------------------------------------------------------------

    def save(self, path) -> None:
        """Write a .cel file (see the module docstring)."""
        graph_json, consts = _graph_to_json(self.graph)
        manifest = {
            "format": FORMAT, "version": VERSION, "config": self.config.to_dict(),
            "graph": graph_json,
            "placements": {k: [p.target, p.reason] for k, p in self.placements.items()},
            "programs": self.programs, "values": self.values, "build": self.build_info,
            "segments": [names for names, _ in self.segments],
            "in_place": sorted(self.packed),
            "external": [{"target": t, "nodes": names} for t, names, _ in self.external],
        }
        members = {name: npy_bytes(a) for name, a in consts.items()}
        members["dram.npy"] = npy_bytes(self.image)
        for k, (_, cpu) in enumerate(self.segments):
            members[f"cpu/{k}.cel"] = cpu.to_bytes()
        for k, (t, names, module) in enumerate(self.external):
            data = module.to_bytes()
            if not isinstance(data, (bytes, bytearray)):
                from .targets import TargetError

                raise TargetError(f"target {t!r}: to_bytes() of its module for nodes "
                                  f"{names[0]!r}.. returned {type(data).__name__}, not bytes")
            members[f"external/{k}.bin"] = bytes(data)
        if self.source is not None:
            members["model.onnx"] = self.source
        write_artifact(path, manifest, members, deflate=True)

    @classmethod
    def load(cls, path) -> "AccelModel":
        """Load a .cel file of an accelerator build: nothing compiles, everything is
        checked first (the module docstring)."""
        from .cpu import CpuModel

        with Artifact(path) as a:
            a.manifest(FORMAT, VERSION)
            cfg = a.check(schema.check_config)
            members = a.check(lambda root: {n: f.string() for n, f in
                                            root["graph"]["initializers"].items()})
            inits = {name: a.npy(member) for name, member in members.items()}
            graph = a.check(schema.check_graph, inits)
            image = a.npy("dram.npy")
            if image.dtype != np.uint8 or image.ndim != 1:
                raise a.error(f"is {image.dtype}{list(image.shape)}, not a DRAM image "
                              f"(uint8, one axis)", "dram.npy")
            parts = a.check(schema.check_accel, graph, cfg, image.size)
            names = a.check(schema.check_segments, graph, parts["placements"])
            packed = a.check(schema.check_in_place, graph, parts["placements"])
            build = a.check(schema.build_info)
            segments = [(n, CpuModel.load(a.read(f"cpu/{k}.cel"), f"{a.where}: cpu/{k}.cel"))
                        for k, n in enumerate(names)]
            parts_ext = a.check(schema.check_external, graph, parts["placements"])
            external = [(t, n, _load_partition(t, n, a.read(f"external/{k}.bin"), a.where))
                        for k, (t, n) in enumerate(parts_ext)]
            source = a.read("model.onnx") if a.has("model.onnx") else None
            model = cls(graph, cfg, parts["placements"], parts["programs"], parts["values"],
                        image, segments=segments, source=source, build_info=build,
                        packed=packed, external=external)
            problem = model._flow_problem()
            if problem:
                raise a.error(problem, "manifest.json")
        return model._warm_layouts()

    def _warm_layouts(self) -> "AccelModel":
        """Make (or load from the disk cache) the compiled pack/unpack kernels of the values
        that cross between CPU and accelerator (``_pack``, ``_unpack``), so that a run's
        layout time is the conversions', not their compilation's."""
        from ..compiler.cpu.packed_layout import compiled_layout, layout_kernel

        graph, cfg = self.graph, self.config
        made = {o: n for n in graph.nodes for o in n.outputs if o}
        dram = {o for n in graph.nodes if n.name in self.programs or n.name in self.packed
                for o in n.outputs if o}
        cpu_reads = {i for n in graph.nodes if n.name not in self.programs and
                     n.name not in self.packed for i in n.inputs if i} | set(graph.outputs)
        windowed = _windowed(self.programs.values())
        for name, v in self.values.items():
            shape = graph.types[name].shape
            if "of" in v or v.get("layout") or len(shape) not in (3, 4) or name in windowed:
                continue
            image = shape if len(shape) == 4 else (shape[0], shape[1], 1, shape[2])
            if not compiled_layout(image, v["shape"], cfg.batch, cfg.block):
                continue
            pixels = math.prod(shape[2:])
            if name not in dram or name not in made:  # packed by the runtime
                layout_kernel("pack", shape[0], shape[1], pixels, cfg.block)
            if name in dram and name in cpu_reads:  # read back
                layout_kernel("unpack", shape[0], shape[1], pixels, cfg.block)
        # a QMatMul's staged second operand: the weight-layout kernel its kept host buffer
        # is packed by (runtime/crossing.py staged_packer's ``fixed``)
        k = cfg.block
        if 2 <= k <= 64 and not k & (k - 1):
            from ..compiler.cpu.weight_layout import weights_kernel

            for prog in self.programs.values():
                for st in prog.get("staged") or ():
                    shape = graph.types[st["value"]].shape if st["value"] in graph.types \
                        else None
                    if st["layout"] == "weights" and shape and len(shape) >= 2 and \
                            len(st["shape"]) == 2 and None not in shape:
                        weights_kernel(math.prod(shape[:-2]), shape[-2], shape[-1], k,
                                       st["shape"][1])
        return self

    def _flow_problem(self) -> str | None:
        """Walk the graph as ``run`` does: what is wrong if a node or CPU segment would
        read a value that nothing made (where it would be), or a segment disagrees with
        the graph on a value's type; None if nothing."""
        from ..compiler.accel.partition import dram_reads

        graph = self.graph
        made = set(graph.inputs) | set(graph.initializers)
        segment_of = {names[0]: (names, cpu) for names, cpu in self.segments}
        external_of = {names[0]: (t, names) for t, names, _ in self.external}
        for node in graph.nodes:
            if node.name in external_of:
                t, names = external_of[node.name]
                ins, outs = _partition_values(graph, names)
                missing = [v for v in ins if v not in made]
                if missing:
                    return (f"the {t!r} partition of {names[0]!r} reads {missing[0]!r} before "
                            f"it is made")
                made.update(outs)
            elif node.name in self.programs and self.programs[node.name]["kind"] in HOST_KINDS:
                missing = [v for v in node.inputs if v and v not in made]
                if missing:
                    return f"accelerator node {node.name!r} reads {missing[0]!r} before it is made"
                made.update(o for o in node.outputs if o)
            elif node.name in self.programs:
                staged = [s["value"] for s in self.programs[node.name].get("staged", ())]
                for v in (*dram_reads(node), *staged):
                    if v and v not in made:
                        return f"accelerator node {node.name!r} reads {v!r} before it is made"
                made.add(node.outputs[0])
            elif node.name in segment_of:
                names, cpu = segment_of[node.name]
                p = cpu.program
                ours = {o for n in graph.nodes if n.name in names for o in n.outputs if o}
                # (in-place nodes: flat arrays of the values' packed bytes)
                if len({n in self.packed for n in names}) > 1:
                    return (f"CPU segment of {names[0]!r} mixes nodes computed in place on "
                            f"the packed layout with others")
                missing = [v for n in graph.nodes if n.name in names and n.name in self.packed
                           for v in (*dram_reads(n), n.outputs[0]) if v not in self.values]
                if missing:
                    return (f"in-place CPU segment of {names[0]!r}: {missing[0]!r} has no "
                            f"DRAM buffer")
                flat = _flat_types(graph, names, self.packed,
                                   {k: v["shape"] for k, v in self.values.items()})
                for v in (*p.inputs, *p.outputs):
                    t = flat.get(v, graph.types.get(v))
                    if t is None or (p.values[v]["dtype"], tuple(p.values[v]["shape"])) != \
                            (t.dtype, t.shape):
                        return f"CPU segment of {names[0]!r}: value {v!r} disagrees with the graph"
                    if flat and v not in flat:
                        return f"in-place CPU segment of {names[0]!r}: {v!r} is not in DRAM"
                    if v in p.inputs and v not in made:
                        return f"CPU segment of {names[0]!r} reads {v!r} before it is made"
                    if v in p.outputs and v not in ours:
                        return f"CPU segment of {names[0]!r} makes {v!r}, not its nodes' value"
                made.update(p.outputs)
        missing = [o for o in graph.outputs if o not in made]
        return f"graph outputs {missing} are made by no node" if missing else None

    @property
    def input_types(self) -> dict:
        return {i: (self.graph.types[i].dtype, self.graph.types[i].shape) for i in self.graph.inputs}

    # ---- running ---------------------------------------------------------------------------

    def _executor(self, target: str):
        from ..driver.board import make_any_executor  # the simulators, and board:PORT

        ex = self._executors.get(target)
        if ex is None:
            ex = make_any_executor(target, self.config,
                                   _round_up(max(self.image.size, 1 << 16), 1 << 16))
            ex.write_dram(0, self.image)
            self._executors[target] = ex
        return ex

    def _shape_advice(self, name: str, a: np.ndarray) -> str:
        """What to do about an input array of another shape: a rebuild only where the ONNX
        model (kept as ``source``) declares the dims that differ dynamic."""
        from ..compiler.frontend.inputs import is_dynamic, shape_flags, shape_problem
        from ..compiler.frontend.onnx import declared_inputs
        from ..errors import CelosiaError

        try:
            dims = declared_inputs(self.source).get(name) if self.source else None
        except CelosiaError:
            dims = None
        t = self.graph.types[name]
        if str(a.dtype) != t.dtype or dims is None or not is_dynamic(dims[1]) or \
                shape_problem(name, dims[1], a.shape):
            return "pass an array of that shape and type"
        return (f"pass an array of that shape, or build the model again for this one: add "
                f"{shape_flags({name: a.shape})} to the `celosia compile` that built it")

    def run(self, feeds: dict, *, target: str = "fsim", progress=None) -> dict:
        """Outputs by ONNX name; ``self.report`` holds the per-node report of this run."""
        from ..compiler.graph.ir import InputShapeError
        from .accel_recurrent import run_host_node
        from ..compiler.graph.macs import node_macs, padding_overhead, utilization

        graph, cfg = self.graph, self.config
        for name in graph.inputs:
            if name not in feeds:
                raise InputShapeError(f"input {name!r} ({graph.types[name]}) was not given")
            a, t = np.asarray(feeds[name]), graph.types[name]
            if tuple(a.shape) != t.shape or str(a.dtype) != t.dtype:
                raise InputShapeError(
                    f"input {name!r} is {a.dtype}[{','.join(map(str, a.shape))}] but the model "
                    f"was built for {t}: {self._shape_advice(name, a)}")
        unknown = set(feeds) - set(graph.inputs)
        if unknown:
            raise InputShapeError(f"unknown inputs {sorted(unknown)}: the model's inputs are "
                                  f"{list(graph.inputs)}")
        ex = self._executor(target) if self.programs else None
        border = self._border(ex)  # {value: its Crossing on ex}, made as values cross
        # {accelerator node: ((value, packer) of its staged operands)} on ex
        staged_of = self.__dict__.setdefault("_staged_of", {}).setdefault(id(ex), {})
        planned = self.__dict__.setdefault("_border_planned", {})
        self.border_setup_ms = 0.0
        if ex is not None and planned.get(id(ex)) is not ex:
            t_plan = time.perf_counter()
            self._plan_border(ex, border, staged_of)
            planned[id(ex)] = ex
            self.border_setup_ms = (time.perf_counter() - t_plan) * 1e3
        host = {**graph.initializers, **{k: np.asarray(v) for k, v in feeds.items()}}
        in_dram: set[str] = set()
        clock_khz = cfg.clock_mhz * 1e3
        # Values that cross between the CPU and the accelerator in this run, each way.
        crossings = {"to_accel": 0, "to_cpu": 0}
        in_place = 0

        roots = self._view_roots()

        def to_host(name):
            if name and name not in host:
                if name in roots:  # a view: its root's bytes, unpacked once, reshaped
                    to_host(roots[name])
                    host[name] = host[roots[name]].reshape(graph.types[name].shape)
                    return
                crossings["to_cpu"] += 1
                # Unpacked from the executor's DRAM where it can be seen in place (a value's
                # buffer is written once per run, so such a view stays valid), else from a
                # copy; the way planned once per executor (runtime/crossing.py).
                host[name] = border[name].unpack()

        # the executor's counters of each accelerator node in this run
        self.node_counters: dict[str, dict] = {}
        segment_of = {names[0]: (names, cpu) for names, cpu in self.segments}
        external_of = {names[0]: (t, names, m) for t, names, m in self.external}
        rows: dict[str, dict] = {}
        for node in graph.nodes:
            rows[node.name] = {"node": node.name, "op": node.op, "target": "cpu",
                               "cpu_ms": 0.0, "layout_ms": 0.0, "cycles": None,
                               "accel_ms": None}
            if node.name not in self.programs:
                rows[node.name]["reason"] = self.placements[node.name].reason
            if node.name in self.packed:
                rows[node.name]["in_place"] = True  # on the packed layout, in DRAM
        done = 0

        def shown(upto):
            nonlocal done
            for node in graph.nodes[done:upto]:
                if progress:
                    progress(_progress_line(done, len(graph.nodes), rows[node.name]))
                done += 1

        for k, node in enumerate(graph.nodes):
            row = rows[node.name]
            t0 = time.perf_counter()
            prog = self.programs.get(node.name)
            if node.name in external_of:
                # A plug-in target's partition: its inputs on the host, its outputs kept
                # there (runtime/targets.py).
                t, names, module = external_of[node.name]
                ins, outs = _partition_values(graph, names)
                read = crossings["to_cpu"]
                for name in ins:
                    to_host(name)
                t1 = time.perf_counter()
                results = _run_partition(t, names, module, {v: host[v] for v in ins},
                                         {v: graph.types[v] for v in outs})
                t2 = time.perf_counter()
                for name, value in results.items():
                    host[name] = value
                    in_dram.discard(name)
                for name in names:
                    rows[name]["target"] = t
                rows[names[0]]["cpu_ms"] = (t2 - t1) * 1e3
                rows[names[0]]["layout_ms"] = ((t1 - t0) * 1e3
                                               if crossings["to_cpu"] > read else 0.0)
                shown(k + len(names))
            elif prog is not None and prog["kind"] in HOST_KINDS:
                # Values on the host; the layer packs its products' operands itself.
                for name in node.inputs:
                    to_host(name)
                t1 = time.perf_counter()
                results, st = run_host_node(node, prog, [host[v] if v else None
                                                         for v in node.inputs], ex, cfg, graph)
                for name, value in zip(node.outputs, results):
                    if name:
                        host[name] = value
                        in_dram.discard(name)
                layout = st["layout_ms"] + (t1 - t0) * 1e3
                # each product packs its operand into DRAM and reads its result back
                crossings["to_accel"] += st["launches"]
                crossings["to_cpu"] += st["launches"]
                row.update(target="accel", region=prog["region"], cycles=st["cycles"],
                           accel_ms=st["cycles"] / clock_khz, macs=st["macs"],
                           utilization=utilization(st["macs"], st["cycles"],
                                                   cfg.macs_per_cycle),
                           layout_ms=layout, launches=st["launches"],
                           cpu_ms=max(0.0, (time.perf_counter() - t1) * 1e3 - st["layout_ms"]
                                      - st["sim_ms"]),
                           sim_s=time.perf_counter() - t0)
                shown(k + 1)
            elif prog is not None:
                packed = False
                reads = self._border_reads(node, prog)
                # the staged operands' packers on this executor (made below the first time:
                # their set-up is the first run's layout time)
                staged = staged_of.get(node.name) if prog.get("staged") else ()
                t0 = time.perf_counter()  # (the lookups above are not packing)
                for name in reads:
                    if name not in in_dram:
                        # packed straight into DRAM where the executor offers a view
                        # (runtime/crossing.py)
                        border[name].pack(host[name])
                        in_dram.add(name)
                        crossings["to_accel"] += 1
                        packed = True
                # Operands packed into a weight layout before every run (a matmul's second
                # operand): read back first if the accelerator made it.
                if staged is None:
                    staged = staged_of[node.name] = tuple(
                        (st["value"], *self._stager(ex, node.name, j, st))
                        for j, st in enumerate(prog["staged"]))
                for value, stage, buf, fixed in staged:
                    to_host(value)
                    x = host[value]
                    if x is buf:  # the host buffer kept for the value: all bound, one call
                        fixed()
                    else:
                        stage(x)
                    crossings["to_accel"] += 1
                    packed = True
                # Layout time: packing values at the border (a node that packs nothing has
                # none).
                row["layout_ms"] = (time.perf_counter() - t0) * 1e3 if packed else 0.0
                counters = (ex.run(prog["insn_addr"], prog["insn_count"])
                            if prog["insn_count"] else {"cycles": 0})
                self.node_counters[node.name] = counters  # (celosia sweep's stall breakdown)
                out = node.outputs[0]
                in_dram.add(out)
                host.pop(out, None)
                cycles = int(counters["cycles"]) if "cycles" in counters else None
                # the model's own multiply-adds, and the GEMM core's (padding included):
                # compiler/graph/macs.py defines both and the figures on them
                macs = node_macs(node, graph.types)
                gemm_macs = int(counters.get("macs", 0))
                row.update(target="accel", region=prog["region"], cycles=cycles,
                           accel_ms=cycles / clock_khz if cycles is not None else None,
                           macs=macs, gemm_macs=gemm_macs,
                           utilization=utilization(macs, cycles, cfg.macs_per_cycle),
                           padding_overhead=padding_overhead(gemm_macs, macs),
                           sim_s=time.perf_counter() - t0)
                shown(k + 1)
            elif node.name in segment_of and node.name in self.packed:
                # In-place CPU nodes: their operands' packed bytes from DRAM as flat arrays,
                # their results back to DRAM (no unpacking or packing: the DRAM reads and
                # writes are the layout time).
                names, cpu = segment_of[node.name]
                direct = self._in_place_direct(ex, node.name, cpu)
                if direct is not None:
                    # The kernels read and write the executor's DRAM where the values are:
                    # no copy at all, the whole step is the nodes' CPU time.
                    t0 = time.perf_counter()
                    for name, run in direct:
                        t1 = time.perf_counter()
                        run()
                        rows[name]["cpu_ms"] += (time.perf_counter() - t1) * 1e3
                    rows[names[0]]["cpu_ms"] += (time.perf_counter() - t0) * 1e3 - sum(
                        rows[n]["cpu_ms"] for n, _ in direct)
                    outs = list(cpu.program.outputs)
                    in_dram.update(outs)
                    for name in outs:
                        host.pop(name, None)
                    in_place += len(cpu.program.inputs) + len(outs)
                    shown(k + len(names))
                    continue
                reads, writes = self._in_place_plan(node.name, cpu)
                t0 = time.perf_counter()
                feeds = {name: ex.read_dram(addr, size).view(np.int8)
                         for name, addr, size in reads}
                layout = (time.perf_counter() - t0) * 1e3
                results = cpu.run(feeds, profile=True)
                t1 = time.perf_counter()
                for name, value in results.items():
                    ex.write_dram(writes[name], value)
                layout += (time.perf_counter() - t1) * 1e3
                in_dram.update(results)
                for name in results:
                    host.pop(name, None)
                in_place += len(feeds) + len(results)
                _attribute_profile(cpu.profile, names, rows, layout)
                shown(k + len(names))
            elif node.name in segment_of:
                # A compiled CPU segment: the CPU nodes from here to the next accelerator node.
                names, cpu = segment_of[node.name]
                read = crossings["to_cpu"]
                t0 = time.perf_counter()  # (the lookups above are not unpacking)
                for name in cpu.program.inputs:
                    to_host(name)
                # layout: reading values back at the border (none if all were on the host)
                layout = (time.perf_counter() - t0) * 1e3 if crossings["to_cpu"] > read else 0.0
                # (values it makes that cross to the accelerator are copied into host
                # buffers kept from run to run, as the executor copies every output out of
                # its arena, so their packing is bound to fixed memory: _segment_out)
                results = cpu.run({name: host[name] for name in cpu.program.inputs},
                                  profile=True, out=self._segment_out(names[0], cpu))
                _attribute_profile(cpu.profile, names, rows, layout)
                for name, value in results.items():
                    host[name] = value
                    in_dram.discard(name)
                shown(k + len(names))
        t0 = time.perf_counter()
        read = crossings["to_cpu"]
        for name in graph.outputs:
            to_host(name)
        if graph.nodes and crossings["to_cpu"] > read:
            # reading outputs back from DRAM: layout at the model's exit
            rows[graph.nodes[-1].name]["layout_ms"] += (time.perf_counter() - t0) * 1e3
        self.report = [rows[n.name] for n in graph.nodes]
        self.crossings = crossings
        self.in_place = in_place
        # (an output unpacked as a view of the executor's DRAM, or one that is a host
        # buffer kept for unpacking, as a plug-in target may return its input, gets memory
        # of its own: the next run writes there)
        kept = {id(b) for b in self.__dict__.get("_host_buffers", {}).values()}
        return {name: host[name] if host[name].flags.owndata and id(host[name]) not in kept
                else host[name].copy() for name in graph.outputs}

    def _windows(self, name: str):
        """The window geometry of accelerator node ``name``, whose input the runtime packs
        as im2col windows (compiler/accel/im2col.py)."""
        from ..compiler.accel.im2col import windows_of

        cache = self.__dict__.setdefault("_windows_of", {})
        if name not in cache:
            cache[name] = windows_of(next(n for n in self.graph.nodes if n.name == name),
                                     self.graph, self.config)
        return cache[name]

    def _stager(self, ex, name: str, j: int, st: dict):
        """(stage, buffer, fixed): ``stage`` a function of the host value packing staged
        operand ``j`` of accelerator node ``name`` (record ``st``) into its DRAM buffer
        (im2col windows: im2col.stager, bound to the buffer; or a matmul's weight layout),
        ``buffer`` the value's host buffer kept from run to run (``_host_buffer``, None
        without one) and ``fixed`` the packing of that buffer as a function of no arguments
        (a compiled kernel bound to both ends where there is one); made once per
        executor."""
        stage = self._stage_of(ex, name, j, st)
        buf = self._host_buffer(st["value"])
        if buf is None:
            return stage, None, None
        fixed = getattr(stage, "fixed", None)
        return stage, buf, (fixed(buf) if fixed is not None else partial(stage, buf))

    def _stage_of(self, ex, name: str, j: int, st: dict):
        """``_stager``'s ``stage``."""
        cache = self.__dict__.setdefault("_stagers", {})
        found = cache.get((name, j))
        if found is not None and found[0] is ex:
            return found[1]
        from ..compiler.accel import im2col
        from ..compiler.accel.matmul import pack_weights

        cfg = self.config
        view = ex.dram_view(st["addr"], math.prod(st["shape"]))
        view = None if view is None else view.view(np.int8).reshape(st["shape"])
        if st["layout"] == im2col.LAYOUT and view is not None:
            # the windows' packing bound to this DRAM buffer
            stage = im2col.stager(self._windows(name), cfg, view)
        elif st["layout"] == "weights" and view is not None and \
                (stage := staged_packer(view, self.graph.types[st["value"]].shape, cfg)):
            pass  # the weight layout's views of this DRAM buffer, made once
        else:
            pack_st = (partial(im2col.pack, win=self._windows(name), cfg=cfg)
                       if st["layout"] == im2col.LAYOUT else partial(pack_weights, cfg=cfg))
            if view is not None:
                stage = partial(pack_st, out=view)
            else:
                def stage(x, addr=st["addr"]):
                    ex.write_dram(addr, pack_st(x))
        cache[(name, j)] = (ex, stage)
        return stage

    def _border_reads(self, node, prog) -> tuple:
        """The values accelerator node ``node`` reads from DRAM that the runtime packs if
        the CPU made them (its windowed input is staged instead), found once."""
        cache = self.__dict__.setdefault("_border_reads_of", {})
        found = cache.get(node.name)
        if found is None:
            from ..compiler.accel.partition import dram_reads

            windowed = _windowed([prog])
            found = cache[node.name] = tuple(n for n in dram_reads(node)
                                             if n and n not in windowed)
        return found

    def _view_roots(self) -> dict:
        """{value: the value whose DRAM bytes it is} of the values that are views."""
        roots = self.__dict__.get("_roots")
        if roots is None:
            roots = self._roots = {k: v["of"] for k, v in self.values.items() if v.get("of")}
        return roots

    def _border(self, ex) -> dict:
        """{value name: its planned crossing on executor ``ex``} (runtime/crossing.py: its
        DRAM view, views or bound kernel, and host buffer), each made the first time the
        value crosses and kept for the executor."""
        cache = self.__dict__.get("_borders")
        if cache is None or cache[0] is not ex:
            model = self

            class Border(dict):
                def __missing__(self, name):
                    v = model.values[name]
                    c = self[name] = Crossing(ex, v["addr"], v["shape"],
                                              model.graph.types[name].shape, model.config,
                                              layout=v.get("layout"),
                                              out=model._host_buffer(name))
                    return c
            cache = self._borders = (ex, Border())
        return cache[1]

    def _plan_border(self, ex, border: dict, staged_of: dict) -> None:
        """Plan, once per executor and before a run's first timed window, the crossings
        the walk will make (``border``: the values an accelerator node reads that the
        host makes, and the accelerator's values the host reads) and the staged operands'
        packers (``staged_of``): set-up that does not depend on the values (views of the
        executor's DRAM, kernels bound to them), as ``_warm_layouts`` compiles the kernels
        at build time, so that layout time is the conversions'. A crossing not found here
        is still planned the first time it crosses, as before."""
        graph, values = self.graph, self.values
        accel_made, host_reads = set(), set(graph.outputs)
        for node in graph.nodes:
            prog = self.programs.get(node.name)
            on_accel = (prog is not None and prog["kind"] not in HOST_KINDS) or \
                node.name in self.packed
            if on_accel:
                accel_made.update(o for o in node.outputs if o)
            else:  # CPU nodes, plug-in partitions, host-run accelerator layers
                host_reads.update(i for i in node.inputs if i)
        roots = self._view_roots()
        reads = self._accel_reads()
        wanted = {roots.get(n, n) for n in (accel_made & host_reads) | (reads - accel_made)}
        for name in sorted(wanted):
            if name in values and "of" not in values[name] and name in graph.types:
                try:
                    border[name]  # (Border.__missing__ plans it)
                except (ValueError, KeyError, TypeError):
                    pass  # (planned, or refused with the run's own error, if it crosses)
        for node in graph.nodes:
            prog = self.programs.get(node.name)
            if prog is not None and prog["kind"] not in HOST_KINDS and prog.get("staged") \
                    and node.name not in staged_of:
                staged_of[node.name] = tuple((st["value"], *self._stager(ex, node.name, j, st))
                                             for j, st in enumerate(prog["staged"]))

    def _accel_reads(self) -> set:
        """The values accelerator nodes read from DRAM (packed or staged), found once."""
        read = self.__dict__.get("_accel_read_set")
        if read is None:
            read = self._accel_read_set = set()
            for node in self.graph.nodes:
                prog = self.programs.get(node.name)
                if prog is not None and prog["kind"] not in HOST_KINDS:
                    read.update(self._border_reads(node, prog))
                    read.update(st["value"] for st in prog.get("staged") or ())
        return read

    def _segment_out(self, first: str, cpu) -> dict | None:
        """{value: its host buffer (``_host_buffer``)} of the values the CPU segment that
        starts at node ``first`` makes and an accelerator node reads (packed or staged),
        for ``cpu.run(out=...)``: the executor copies them there instead of into fresh
        arrays, so each crossing of such a value packs the same memory every run, bound
        once (runtime/crossing.py). None if there are none. Made once."""
        cache = self.__dict__.setdefault("_segment_outs", {})
        if first not in cache:
            read = self._accel_reads()
            values = cpu.program.values
            out = {}
            for name in cpu.program.outputs:
                buf = self._host_buffer(name) if name in read else None
                if buf is not None and values.get(name, {}).get("dtype") == "int8" and \
                        tuple(values[name]["shape"]) == buf.shape:
                    out[name] = buf
            cache[first] = out or None
        return cache[first]

    def _host_buffer(self, name: str) -> np.ndarray | None:
        """An int8 array of the value's shape kept from run to run to unpack it into (None
        for a graph output, which the caller keeps)."""
        if name in self.graph.outputs or self.graph.types[name].dtype != "int8":
            return None
        bufs = self.__dict__.setdefault("_host_buffers", {})
        if name not in bufs:
            bufs[name] = np.empty(self.graph.types[name].shape, np.int8)
        return bufs[name]

    def _in_place_direct(self, ex, first: str, cpu):
        """[(node, run)]: the kernels of the in-place segment that starts at node ``first``
        bound to views of the executor's DRAM (``Executor.dram_view``) and their constants,
        when every step is a kernel whose values all have DRAM buffers; else None (then the
        runtime copies the values out and back). Made once per executor."""
        cache = self.__dict__.setdefault("_in_place_bound", {})
        key = (id(ex), first)
        if key not in cache:
            p, bound = cpu.program, []
            for step in p.steps:
                if step["kind"] != "kernel" or step["kernel"] not in p.kernels:
                    bound = None
                    break
                args = []
                for v in step["inputs"]:
                    if v in p.constants:
                        args.append(np.ascontiguousarray(p.constants[v]))
                    elif v in self.values and "of" not in self.values[v]:
                        info = self.values[v]
                        view = ex.dram_view(info["addr"], int(np.prod(info["shape"])))
                        if view is None or p.values.get(v, {}).get("dtype") != "int8":
                            bound = None
                            break
                        args.append(view.view(np.int8).reshape(p.values[v]["shape"]))
                    else:
                        bound = None
                        break
                if bound is None:
                    break
                bound.append((step["node"], p.kernels[step["kernel"]].bind(*args)))
            cache[key] = bound or None
        return cache[key]

    def _in_place_plan(self, first: str, cpu) -> tuple[list, dict]:
        """The DRAM reads (value, address, bytes) and writes ({value: address}) of the
        in-place segment that starts at node ``first`` (made once)."""
        plans = self.__dict__.setdefault("_in_place_plans", {})
        if first not in plans:
            v = self.values
            plans[first] = ([(n, v[n]["addr"], int(np.prod(v[n]["shape"])))
                             for n in cpu.program.inputs],
                            {n: v[n]["addr"] for n in cpu.program.outputs})
        return plans[first]

    def run_stream(self, stream: list[dict], *, target: str = "cycle", depth: int = 2,
                   warm_up: bool = True, progress=None) -> list[dict]:
        """Run a stream of inputs and pipeline them (runtime/overlap.py): each input runs as
        ``run`` runs it (its outputs are ``run``'s, in order); their measured work is laid on
        one timeline where the CPU side of one input overlaps the accelerator side of another,
        at most ``depth`` inputs in flight. ``self.stream`` holds the timeline's figures and
        ``self.stream_reports`` each input's report. ``warm_up`` first runs the first input
        once, untimed, so one-time costs (the first call of each compiled CPU segment) are
        not counted as a pipeline stage."""
        from ..errors import CelosiaError
        from .overlap import schedule

        stream = list(stream)
        if not stream:
            raise CelosiaError("run_stream: the stream has no inputs")
        if warm_up:
            self.run(stream[0], target=target)
        outputs, reports = [], []
        for k, feeds in enumerate(stream):
            outputs.append(self.run(feeds, target=target))
            reports.append(self.report)
            if progress:
                progress(f"stream: input {k + 1}/{len(stream)} run")
        try:
            self.stream = schedule(reports, depth)
        except ValueError as e:
            raise CelosiaError(f"run_stream on target {target!r}: {e}") from None
        self.stream_reports = reports
        return outputs

    def run_batch(self, feeds: dict, *, target: str = "cycle", depth: int = 2,
                  warm_up: bool = True, progress=None) -> dict:
        """``feeds`` with k times the model's batch along the first axis of every input: the
        k slices as a pipelined stream (``run_stream``), outputs concatenated back."""
        from ..errors import CelosiaError

        types = {i: self.graph.types[i] for i in self.graph.inputs}
        counts = set()
        for name, a in feeds.items():
            if name not in types:
                raise CelosiaError(f"unknown input {name!r}: the model's inputs are "
                                   f"{list(types)}")
            shape, got = types[name].shape, np.shape(a)
            if not shape or len(got) != len(shape) or tuple(got[1:]) != tuple(shape[1:]) \
                    or got[0] % shape[0]:
                raise CelosiaError(
                    f"run_batch: input {name!r} is [{','.join(map(str, got))}]; the model was "
                    f"built for {types[name]}, so a batch must be a multiple of {shape[0]} "
                    f"along the first axis with the other dimensions the same")
            counts.add(got[0] // shape[0])
        if len(counts) != 1:
            raise CelosiaError(f"run_batch: the inputs hold different numbers of batches "
                               f"({sorted(counts)})")
        k = counts.pop()
        stream = [{name: np.asarray(a)[i * types[name].shape[0]:(i + 1) * types[name].shape[0]]
                   for name, a in feeds.items()} for i in range(k)]
        outs = self.run_stream(stream, target=target, depth=depth, warm_up=warm_up,
                               progress=progress)
        return {name: np.concatenate([o[name] for o in outs]) for name in outs[0]}

    def summary(self) -> dict:
        """Totals of the last run's report. ``utilization``: the accelerator nodes' real
        multiply-adds over their cycles x MACs per cycle; ``padding_overhead``: the GEMM
        core's multiply-adds over the real ones, minus 1 (compiler/graph/macs.py)."""
        from ..compiler.graph.macs import padding_overhead, utilization

        rows = self.report
        accel = [r for r in rows if r["target"] == "accel"]
        timed = all(r["cycles"] is not None for r in accel)
        cycles = sum(r["cycles"] for r in accel) if timed else None
        macs = sum(r.get("macs", 0) for r in accel)
        gemm_macs = sum(r.get("gemm_macs", 0) for r in accel)
        accel_ms = sum(r["accel_ms"] for r in accel) if timed else 0.0
        cpu_ms = sum(r["cpu_ms"] for r in rows)
        layout_ms = sum(r["layout_ms"] for r in rows)
        total = accel_ms + cpu_ms + layout_ms
        from ..fpga.clock import clock_status

        clock = clock_status(self.config)
        return {
            "nodes": len(rows), "accel_nodes": len(accel), "cpu_nodes": len(rows) - len(accel),
            "cycles": cycles, "accel_ms": accel_ms if timed else None, "cpu_ms": cpu_ms,
            "layout_ms": layout_ms,
            # the one-time planning of this executor's border (first run only), kept out
            # of layout_ms and the latency, reported here so it stays visible
            "border_setup_ms": self.border_setup_ms,
            "latency_ms": total, "accel_share": accel_ms / total if total else 0.0,
            "layout_share": layout_ms / total if total else 0.0,
            # values packed into DRAM for the accelerator plus values read back by the CPU
            "crossings": self.crossings["to_accel"] + self.crossings["to_cpu"],
            # values in-place CPU nodes read from DRAM or wrote there, packed (their DRAM
            # reads and writes are in layout_ms)
            "in_place": self.in_place,
            "utilization": utilization(macs, cycles, self.config.macs_per_cycle),
            "padding_overhead": padding_overhead(gemm_macs, macs),
            "macs": macs, "gemm_macs": gemm_macs,
            "clock_mhz": self.config.clock_mhz,
            # whether place and route has met that clock, and the time at its Fmax if not
            "clock": clock,
            "accel_ms_at_fmax": (cycles / (clock["fmax_mhz"] * 1e3)
                                 if timed and clock["met"] is False else None),
        }


def _windowed(programs) -> set:
    """The values the runtime packs as a layer's im2col windows (compiler/accel/im2col.py)
    in these program records."""
    from ..compiler.accel.im2col import LAYOUT

    return {st["value"] for p in programs for st in p.get("staged", ())
            if st["layout"] == LAYOUT}


def _packed(graph, placements: dict) -> set:
    """The CPU nodes computed in place on the packed layout (partition.packed_nodes);
    none in an all-CPU build."""
    from ..compiler.accel.partition import packed_nodes

    if not any(p.target == "accel" for p in placements.values()):
        return set()
    return packed_nodes(graph, placements)


def _flat_types(graph, names, packed: set, shapes: dict) -> dict:
    """The types a segment of in-place nodes gives its values: each value its node reads or
    writes as a flat int8 array of its packed bytes (``shapes``: value -> packed shape);
    {} for a segment of other CPU nodes."""
    from ..compiler.accel.partition import dram_reads
    from ..compiler.graph.ir import TensorType

    if names[0] not in packed:
        return {}
    nodes = [n for n in graph.nodes if n.name in set(names)]
    return {v: TensorType("int8", (int(np.prod(shapes[v])),))
            for n in nodes for v in (*dram_reads(n), n.outputs[0])}


def _partition_values(graph, names) -> tuple[list, list]:
    """The values a run of consecutive nodes reads from outside it (not constants), and
    those it makes that are read after it or are graph outputs."""
    chosen = set(names)
    nodes = [n for n in graph.nodes if n.name in chosen]
    start = graph.nodes.index(nodes[0])
    later = {i for n in graph.nodes[start + len(nodes):] for i in n.inputs if i}
    later |= set(graph.outputs)
    produced = {o for n in nodes for o in n.outputs if o}
    reads = [i for n in nodes for i in n.inputs if i]
    inputs = list(dict.fromkeys(i for i in reads
                                if i not in produced and i not in graph.initializers))
    outputs = [o for n in nodes for o in n.outputs if o and o in later]
    return inputs, outputs


def _partition_graph(graph, names, name: str):
    """A run of consecutive nodes as a Graph of its own (``_partition_values``' inputs and
    outputs, the constants it reads)."""
    from ..compiler.graph.ir import Graph

    chosen = set(names)
    nodes = [n for n in graph.nodes if n.name in chosen]
    inputs, outputs = _partition_values(graph, names)
    produced = {o for n in nodes for o in n.outputs if o}
    reads = [i for n in nodes for i in n.inputs if i]
    inits = {i: graph.initializers[i] for i in reads if i in graph.initializers}
    types = {v: graph.types[v] for v in (*inputs, *produced, *inits)}
    return Graph(name, tuple(inputs), tuple(outputs), tuple(nodes), inits, types)


def _external_partitions(graph, placements: dict, progress=None) -> list:
    """Each maximal run of consecutive nodes placed on one plug-in target, built by that
    target: [(target name, node names, module)] (runtime/targets.py)."""
    from .targets import BUILTIN, TargetError, get_target, plugin_errors

    runs: list[tuple[str, list]] = []
    for node in graph.nodes:
        t = placements[node.name].target
        if t in BUILTIN:
            continue
        k = graph.nodes.index(node)
        if runs and runs[-1][0] == t and graph.nodes[k - 1].name == runs[-1][1][-1]:
            runs[-1][1].append(node.name)
        else:
            runs.append((t, [node.name]))
    out = []
    for k, (t, names) in enumerate(runs):
        if not _partition_values(graph, names)[1]:
            raise TargetError(f"the {t!r} partition of {names[0]!r} makes nothing read after "
                              f"it; its nodes would be dead code")
        target = get_target(t)
        t0 = time.perf_counter()
        sub = _partition_graph(graph, names, f"{graph.name}_{t}{k}")
        with plugin_errors(f"target {t!r} failed to build its partition of {len(names)} "
                           f"nodes ({names[0]!r}..)"):
            module = target.build(sub)
        for method in ("run", "to_bytes"):
            if not callable(getattr(module, method, None)):
                raise TargetError(f"target {t!r}: build() returned {type(module).__name__}, "
                                  f"which has no {method}() method")
        if progress:
            progress(f"{t} partition {k}: {len(names)} nodes ({', '.join(names[:4])}"
                     f"{', ...' if len(names) > 4 else ''}) built in "
                     f"{time.perf_counter() - t0:.2f} s")
        out.append((t, names, module))
    return out


def _load_partition(target: str, names, data: bytes, where: str):
    from .targets import TargetError, get_target, plugin_errors

    try:
        t = get_target(target)
    except TargetError as e:
        raise TargetError(f"{where}: its nodes {names[0]!r}.. run on target {target!r}: {e}") \
            from None
    with plugin_errors(f"{where}: target {target!r} could not load its partition of "
                       f"{names[0]!r}.."):
        return t.load(data)


def _run_partition(target: str, names, module, feeds: dict, wanted: dict) -> dict:
    from .targets import check_outputs, plugin_errors

    with plugin_errors(f"target {target!r} failed running its partition of {names[0]!r}.."):
        results = module.run(feeds)
    return check_outputs(target, names, wanted, results)


def _cpu_segments(graph, placements: dict, progress=None, packed: set = frozenset(),
                  shapes: dict | None = None) -> list:
    """The CPU nodes as compiled segments: each maximal run of consecutive CPU nodes (in the
    graph's order) becomes a graph of its own, built with CpuModel.from_graph; its inputs
    are the values it reads from outside, its outputs those read after it. Nodes computed in
    place on the packed layout (``packed``) make runs of their own, whose values are flat
    int8 arrays of their packed bytes (``shapes``: value -> packed shape)."""
    from .cpu import CpuModel

    runs, current = [], []
    for node in graph.nodes:
        if current and (placements[node.name].target != "cpu" or
                        (node.name in packed) != (current[0].name in packed)):
            runs.append(current)
            current = []
        if placements[node.name].target == "cpu":
            current.append(node)
    if current:
        runs.append(current)
    segments = []
    for k, nodes in enumerate(runs):
        names = [n.name for n in nodes]
        if not _partition_values(graph, names)[1]:
            continue
        sub = _partition_graph(graph, names, f"{graph.name}_cpu{k}")
        sub.types.update(_flat_types(graph, names, packed, shapes or {}))
        t0 = time.perf_counter()
        cpu = CpuModel.from_graph(sub)
        if progress:
            progress(f"cpu segment {k}: {len(nodes)} nodes ({', '.join(n.name for n in nodes[:4])}"
                     f"{', ...' if len(nodes) > 4 else ''}) compiled in "
                     f"{time.perf_counter() - t0:.2f} s")
        segments.append(([n.name for n in nodes], cpu))
    return segments


def _attribute_profile(profile: list[dict], names: list[str], rows: dict, layout_ms: float):
    """Per-node CPU times from a segment's profile. Reading the segment's inputs back from
    DRAM and unpacking them (``layout_ms``) is layout time at a region border, of the
    segment's first node. Steps named after no node of the segment (views, loop bodies'
    hoisted steps, the CPU build's own blocked layouts) are CPU work: they count to the
    next node (the last for trailing ones), not as layout."""
    known = set(names)
    rows[names[0]]["layout_ms"] += layout_ms
    pending = 0.0
    for step in profile:
        if step["node"] in known:
            row = rows[step["node"]]
            row["cpu_ms"] += step["ms"] + pending
            pending = 0.0
        else:
            pending += step["ms"]
    rows[names[-1]]["cpu_ms"] += pending


def _sub_buffer(base, offset: int, nbytes: int):
    """A DramBuffer for bytes [offset, offset + nbytes) of ``base`` (a Concat's input inside
    its output; it lives as long as ``base``)."""
    from ..driver.alloc import DramBuffer

    assert offset + nbytes <= base.nbytes, (offset, nbytes, base)
    return DramBuffer(base.addr + offset, nbytes, base._allocator, base._executor, base._config)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _spec_str(spec) -> str:
    from ..compiler.accel.ops import ConvSpec
    from ..compiler.accel.ops_group import GroupConvSpec

    if isinstance(spec, ConvSpec):
        return (f"{spec.n}x{spec.c}x{spec.h}x{spec.w} -> {spec.o} {spec.kh}x{spec.kw} "
                f"s{spec.stride} p{spec.pad}")
    if isinstance(spec, GroupConvSpec):
        return (f"{spec.n}x{spec.c}x{spec.h}x{spec.w} -> {spec.o} {spec.kh}x{spec.kw} "
                f"groups={spec.groups} s{list(spec.strides)} p{list(spec.pads)}")
    if hasattr(spec, "op"):  # element-wise
        return f"{spec.op} of {spec.rows} rows"
    if hasattr(spec, "multiplier"):  # global average pooling
        return f"{spec.n}x{spec.c}x{spec.h}x{spec.w} -> 1x1"
    if hasattr(spec, "oh"):  # max pooling
        return f"{spec.n}x{spec.c}x{spec.h}x{spec.w} -> {spec.oh}x{spec.ow} {spec.kh}x{spec.kw}"
    return f"{spec.n}x{spec.k} -> {spec.o}"


def _knobs_str(knobs) -> str:
    return " ".join(f"{k}={v}" for k, v in asdict(knobs).items())


def _progress_line(k: int, n: int, row: dict) -> str:
    if row["target"] == "accel" and row["cycles"] is None:
        return f"[{k + 1}/{n}] {row['node']} ({row['op']}) accel: {row['sim_s'] * 1e3:.1f} ms simulated"
    if row["target"] == "accel":
        util = row["utilization"]
        return (f"[{k + 1}/{n}] {row['node']} ({row['op']}) accel: {row['cycles']:,} cycles = "
                f"{row['accel_ms']:.3f} ms" + (f", utilisation {util:.0%}" if util is not None else ""))
    return f"[{k + 1}/{n}] {row['node']} ({row['op']}) cpu: {row['cpu_ms']:.3f} ms"


def _install_packers() -> None:
    """The im2col windows' compiled packing kernels, from the CPU backend, for the
    accelerator stage's packing (compiler/accel/im2col.py ``use_compiled``)."""
    from ..compiler.accel import im2col
    from ..compiler.cpu.im2col_layout import pack_windows, packer
    from ..compiler.cpu.packed_layout import compiled_layout, pack_fast

    im2col.use_compiled(pack_windows=pack_windows, packer=packer,
                        compiled_layout=compiled_layout, pack_fast=pack_fast)


_install_packers()
