"""celosia inside PyTorch: a ``torch.compile`` backend and ahead-of-time compilation.

``import celosia.torch`` registers the backend "celosia"::

    model = torch.compile(model, backend="celosia",
                          options={"target": "fsim", "quantize": "int8",
                                   "calibration": [x0, x1, x2]})

Each graph TorchDynamo captures (one per stretch of code between graph breaks) is frozen (its
parameters and buffers become constants), written to ONNX in memory by torch's TorchScript
exporter and built by celosia: the CPU build (fp32 or int8) or the int8 accelerator build run
on the functional simulator ("fsim") or the cycle model ("cycle"). A graph celosia cannot take
(the exporter or the importer refuses it, autograd is on, int8 calibration samples cannot be
mapped to its inputs) runs in PyTorch; ``report()`` lists every graph with the target that ran
it or the reason it stayed in PyTorch, and TorchDynamo's own graph-break reasons.

Why ONNX in memory rather than the FX graph: celosia's whole compiler is built on its ONNX
importer (canonicalisation, shape inference, the quantizer, the accelerator partitioner); the
TorchScript exporter (``torch.onnx.export(..., dynamo=False)``) ships inside torch 2.13 and
needs nothing else, where the dynamo exporter needs onnxscript (not a dependency of torch).
One path means every model the ONNX importer takes, the backend takes too.

``compile_module(model, example_inputs, ...)`` exports the whole module ahead of time (no
graph breaks: the TorchScript tracer records one graph) and returns a ``CompiledModule`` that
runs on torch tensors and can ``save`` its ``.cel``.
"""

from __future__ import annotations

import logging
import re
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from .errors import CelosiaError

__all__ = ["TARGETS", "OPTIONS", "TorchOptionsError", "Options", "check_options",
           "celosia_backend", "report", "reset_report", "built_models", "compile_module", "CompiledModule",
           "to_onnx"]

log = logging.getLogger("celosia.torch")

TARGETS = ("cpu", "fsim", "cycle")
MAX_BUILDS = 8  # builds kept per graph (one per set of input shapes it was called with)
OPTIONS = ("target", "quantize", "calibration", "calibration_method", "config")


class TorchOptionsError(CelosiaError, ValueError):
    """Options of the celosia backend or of ``compile_module`` that cannot be used."""


@dataclass(frozen=True)
class Options:
    target: str = "cpu"
    quantize: str | None = None      # None (fp32, target cpu) or "int8"
    calibration: tuple = ()          # samples: tuples of arrays (positional) or dicts by name
    calibration_method: str = "mse"
    config: object = None            # an HwConfig, a preset name or a JSON path


def _sample(s, k: int):
    def arr(t, where):
        if isinstance(t, torch.Tensor):
            return t.detach().cpu().numpy()
        if isinstance(t, np.ndarray):
            return t
        raise TorchOptionsError(
            f"celosia.torch: calibration sample {k}{where} is a {type(t).__name__}, not a "
            f"tensor: give each sample as a tensor (one input), a tuple of tensors (the "
            f"positional inputs) or a dict {{argument name: tensor}}")
    if isinstance(s, dict):
        return {str(n): arr(t, f" [{n!r}]") for n, t in s.items()}
    if isinstance(s, (tuple, list)):
        return tuple(arr(t, f" [{i}]") for i, t in enumerate(s))
    return (arr(s, ""),)


def check_options(options) -> Options:
    """``options`` of ``torch.compile(backend="celosia", options=...)`` checked: a
    TorchOptionsError naming the option and what to give otherwise."""
    if options is None:
        options = {}
    if isinstance(options, Options):
        return options
    if not isinstance(options, dict):
        raise TorchOptionsError(f"celosia.torch: options must be a dict, not "
                                f"{type(options).__name__} (keys: {', '.join(OPTIONS)})")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TorchOptionsError(f"celosia.torch: unknown option(s) {unknown}; the options are "
                                f"{', '.join(OPTIONS)}")
    target = options.get("target", "cpu")
    if target not in TARGETS:
        raise TorchOptionsError(f"celosia.torch: option 'target' is {target!r}; it must be one "
                                f"of {', '.join(map(repr, TARGETS))}")
    quantize = options.get("quantize")
    if quantize not in (None, "int8"):
        raise TorchOptionsError(f"celosia.torch: option 'quantize' is {quantize!r}; it must be "
                                f"'int8' or left out (fp32, target 'cpu')")
    if quantize is None and target != "cpu":
        raise TorchOptionsError(f"celosia.torch: target {target!r} runs int8 models: add "
                                f"\"quantize\": \"int8\" and \"calibration\": [samples] to the "
                                f"options, or use target 'cpu' for fp32")
    calibration = options.get("calibration")
    if calibration is not None and quantize is None:
        raise TorchOptionsError("celosia.torch: option 'calibration' is for int8: add "
                                "\"quantize\": \"int8\" or leave the calibration out")
    if quantize == "int8":
        if calibration is None or isinstance(calibration, (torch.Tensor, np.ndarray, dict)) \
                or not isinstance(calibration, (list, tuple)) or not len(calibration):
            raise TorchOptionsError(
                "celosia.torch: \"quantize\": \"int8\" needs \"calibration\": a non-empty list "
                "of samples of the model's inputs (each a tensor, a tuple of tensors or a dict "
                "{argument name: tensor}) to choose the int8 scales"
                + (f"; got a {type(calibration).__name__}" if calibration is not None else ""))
        calibration = tuple(_sample(s, k) for k, s in enumerate(calibration))
    method = options.get("calibration_method", "mse")
    if not isinstance(method, str):
        raise TorchOptionsError(f"celosia.torch: option 'calibration_method' is "
                                f"{type(method).__name__}; give 'mse', 'minmax', "
                                f"'percentile[:P]' or 'entropy'")
    config = options.get("config")
    if config is not None:
        from .config import HwConfig
        config = HwConfig.load(config)  # a ConfigError now, not at the first call
    return Options(target, quantize, calibration or (), method, config)


# ---- the report ----------------------------------------------------------------------------

_GRAPHS: list[dict] = []
_BUILT: list[tuple] = []


def report() -> dict:
    """Every graph the backend was given since ``reset_report``: ``graphs`` (per graph its
    index, FX node count, operators, and ``ran_on`` "celosia:TARGET" or "pytorch" with the
    ``reason``), counts ``taken``/``refused``, and ``graph_breaks``: TorchDynamo's own
    reasons for splitting the code (each a stretch that runs in Python between graphs)."""
    breaks = {}
    try:
        from torch._dynamo.utils import counters
        breaks = {k.split("\n")[0].strip(): v for k, v in counters["graph_break"].items()}
    except Exception:  # noqa: BLE001 - torch's private counters moved: no break reasons
        pass
    return {"graphs": [dict(g) for g in _GRAPHS],
            "taken": sum(g["ran_on"].startswith("celosia") for g in _GRAPHS),
            "refused": sum(g["ran_on"] == "pytorch" for g in _GRAPHS),
            "graph_breaks": breaks}


def built_models() -> list:
    """(graph index, celosia model) of the builds since ``reset_report`` still in use: a
    CpuModel (fp32) or an AccelModel (int8), e.g. to save one or to compare with its
    ``cpu_build()``."""
    return [(k, m) for k, ref in _BUILT for m in (ref(),) if m is not None]


def reset_report() -> None:
    _GRAPHS.clear()
    _BUILT.clear()
    try:
        from torch._dynamo.utils import counters
        counters["graph_break"].clear()
    except Exception:  # noqa: BLE001
        pass


class _Refused(Exception):
    """Why a graph (or a build of it for some shapes) stays in PyTorch."""


# ---- export ------------------------------------------------------------------------------

def to_onnx(module, example_inputs: tuple, input_names: list[str], output_names: list[str]):
    """``module`` written to ONNX in memory (torch.onnx's TorchScript exporter, opset 17,
    an IR version onnxruntime and celosia read): a ModelProto."""
    from .models.torch_export import export

    # nn.MultiheadAttention's inference fast path is one fused operator the exporter has no
    # ONNX form of; the plain path computes the same thing.
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        return export(module, tuple(example_inputs), input_names, output_names)
    except CelosiaError:
        raise
    except Exception as e:  # the exporter's own errors: an operator it has no ONNX form of
        first = str(e).strip().split("\n")[0][:300]
        hint = ""
        if "_transformer_encoder_layer_fwd" in first or "_native_multi_head_attention" in first:
            # TorchDynamo traced nn.Transformer*'s or nn.MultiheadAttention's fused
            # inference path: one operator with no ONNX form
            hint = ("; call torch.backends.mha.set_fastpath_enabled(False) before the "
                    "compiled model's first call (the plain path computes the same)")
        raise _Refused(f"torch.onnx.export: {type(e).__name__}: {first}{hint}") from e
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


def _is_constant(value, source) -> bool:
    if isinstance(value, torch.nn.Parameter):
        return True
    name = ""
    try:
        name = source.name if isinstance(source.name, str) else source.name()
    except Exception:  # noqa: BLE001
        pass
    return "._parameters[" in name or "._buffers[" in name


def _local_name(source):
    n = getattr(source, "local_name", None)
    return n if isinstance(n, str) and type(source).__name__ == "LocalSource" else None


class _Frozen(torch.nn.Module):
    """A dynamo graph whose parameters are buffers and whose sizes are numbers: its forward
    takes the user's tensors only."""

    def __init__(self, gm, kinds: list, consts: dict, ints: dict):
        super().__init__()
        self.gm, self.kinds, self.ints = gm, kinds, ints
        for i, t in consts.items():
            self.register_buffer(f"c{i}", t.detach())

    def forward(self, *xs):
        it = iter(xs)
        args = [next(it) if k == "input" else self.ints[i] if k == "int"
                else getattr(self, f"c{i}") for i, k in enumerate(self.kinds)]
        out = self.gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


# Methods and functions whose result shares its first operand's memory: an in-place
# operation on one of them writes the graph's input.
_VIEWS = {"view", "view_as", "reshape", "flatten", "unflatten", "transpose", "permute", "t",
          "select", "narrow", "unsqueeze", "squeeze", "expand", "expand_as", "unfold",
          "as_strided", "split", "chunk", "unbind", "movedim", "swapaxes", "diagonal",
          "contiguous", "detach", "__getitem__", "getitem", "real", "imag", "view_as_real",
          "view_as_complex", "T", "mT", "H", "mH", "alias", "split_with_sizes",
          "tensor_split", "moveaxis", "swapdims"}


def _mutated_input(gm) -> str | None:
    """The first placeholder an operation of ``gm`` writes in place (through views of it
    too), as "name (by node)"; None when the graph only reads its inputs."""
    import operator

    def base(n):
        return n.__name__ if callable(n) and hasattr(n, "__name__") else str(n)

    reaches = {}  # node -> the placeholder whose memory it may be
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            reaches[n] = n.name
            continue
        if n.op not in ("call_method", "call_function") or not n.args:
            continue
        name = base(n.target)
        first = n.args[0]
        src = reaches.get(first) if hasattr(first, "op") else None
        if src is None:
            continue
        inplace = (name.endswith("_") and not name.endswith("__")) or \
            n.kwargs.get("inplace") is True or \
            n.target in (operator.setitem, operator.iadd, operator.isub, operator.imul,
                         operator.itruediv) or name == "copy_"
        if inplace:
            return f"{src!r} (node {n.name!r}: {name})"
        if name in _VIEWS:
            reaches[n] = src
    return None


def _name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", s)


def _build(model, opts: Options, calibration):
    """The celosia build of an ONNX model and the function that runs it on numpy feeds."""
    from .runtime.accel import AccelModel
    from .runtime.cpu import CpuModel

    if opts.quantize is None:
        built = CpuModel.build(model)
        return built, built.run
    built = AccelModel.from_onnx(model, opts.config, calibration=calibration,
                                 target=opts.target, calibration_method=opts.calibration_method)
    if opts.target == "cpu":
        # The all-CPU int8 build (no accelerator node): its one CPU segment is a CpuModel
        # over the whole graph; run it itself (LLVM kernels, DLPack in and out) rather than
        # through the accelerator model's per-node loop.
        graph = built.graph
        if not built.programs and len(built.segments) == 1:
            cpu = built.segments[0][1]
            if set(cpu.program.inputs) == set(graph.inputs) and \
                    set(graph.outputs) <= set(cpu.program.outputs):
                return cpu, cpu.run
    return built, lambda feeds: built.run(feeds, target=opts.target)


def _run_tensors(built, run, feeds: dict, out_names: list, dtypes: list) -> tuple:
    """Run on torch tensors. A CPU build reads them and writes fresh output tensors through
    DLPack (runtime/dlpack.py: no copy where the layout allows); an accelerator build
    through numpy views of them."""
    from .runtime.cpu import CpuModel

    feeds = {n: t.detach() if isinstance(t, torch.Tensor) else t for n, t in feeds.items()}
    if isinstance(built, CpuModel):
        values = built.program.values
        if all(str(d).removeprefix("torch.") == values[n]["dtype"]
               for n, d in zip(out_names, dtypes)):
            out = {n: torch.empty(tuple(values[n]["shape"]), dtype=d)
                   for n, d in zip(out_names, dtypes)}
            built.run_dlpack(feeds, out)
            return tuple(out[n] for n in out_names)
    outs = run({n: t.cpu().numpy() if isinstance(t, torch.Tensor) else t
                for n, t in feeds.items()})
    return tuple(torch.from_numpy(np.ascontiguousarray(outs[n])).to(d)
                 for n, d in zip(out_names, dtypes))


class _Graph:
    """One graph TorchDynamo captured, built by celosia per set of input shapes."""

    def __init__(self, gm, example_inputs, opts: Options, frame_args):
        self.gm, self.opts = gm, opts
        self.places = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.kinds, self.consts, self.sources = [], {}, []
        for i, (node, value) in enumerate(zip(self.places, example_inputs)):
            src = getattr(node.meta.get("grapharg"), "source", None)
            self.sources.append(src)
            if isinstance(value, (int, torch.SymInt)):
                self.kinds.append("int")
            elif isinstance(value, torch.Tensor) and _is_constant(value, src):
                self.kinds.append("const")
                self.consts[i] = value
            elif isinstance(value, torch.Tensor):
                self.kinds.append("input")
            else:
                self.kinds.append("other")
        self.versions = {i: t._version for i, t in self.consts.items()}
        self.frame_args = frame_args
        self.builds: dict = {}
        self.row = {"graph": len(_GRAPHS), "fx_nodes": sum(n.op == "call_function" or
                                                             n.op == "call_method" or
                                                             n.op == "call_module"
                                                             for n in gm.graph.nodes),
                    "ran_on": "pytorch", "reason": "not run yet", "builds": 0}
        _GRAPHS.append(self.row)
        self.refused = self._refusal(example_inputs)
        if self.refused:
            self._refuse(self.refused)

    def _refusal(self, example_inputs) -> str | None:
        if "other" in self.kinds:
            k = self.kinds.index("other")
            return (f"input {self.places[k].name!r} is a {type(example_inputs[k]).__name__}, "
                    f"not a tensor or a size")
        mutated = _mutated_input(self.gm)
        if mutated:
            return (f"the graph writes its input {mutated} in place; a celosia build only "
                    f"reads its inputs")
        if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad
                                           for v in example_inputs):
            return ("autograd is on and an input or parameter requires grad: celosia builds "
                    "are for inference; call the model under torch.no_grad() or "
                    "torch.inference_mode()")
        return None

    def _refuse(self, reason: str) -> None:
        self.row.update(ran_on="pytorch", reason=reason)
        log.warning("celosia.torch: graph %d stays in PyTorch: %s", self.row["graph"], reason)

    def _calibration(self, args, names: list[str]) -> list[dict]:
        """The calibration samples as feeds of this graph's inputs: each input must be an
        argument of the compiled function (a graph after a graph break takes values the
        samples do not give)."""
        fn, params = self.frame_args
        user = [i for i, k in enumerate(self.kinds) if k == "input"]
        locals_ = [_local_name(self.sources[i]) for i in user]
        if fn is None or fn.startswith("torch_dynamo_resume_in_") or None in locals_ or \
                any(n not in params for n in locals_):
            raise _Refused(
                "int8 calibration samples give the compiled function's arguments, and this "
                "graph (after a graph break) takes other values "
                f"({', '.join(self.places[i].name for i in user)}): it runs in PyTorch; "
                "remove the graph break or compile it with celosia.torch.compile_module")
        feeds = []
        for k, s in enumerate(self.opts.calibration):
            if isinstance(s, dict):
                missing = [n for n in locals_ if n not in s]
                if missing:
                    raise _Refused(f"calibration sample {k} has no tensor for the arguments "
                                   f"{missing} (it has {sorted(s)})")
                arrays = [s[n] for n in locals_]
            else:
                # a method's first argument is its module (the base of its parameters)
                pos = params[1:] if params and params[0] in self._owners() else params
                given = dict(zip(pos, s))
                if len(s) > len(pos) or any(n not in given for n in locals_):
                    raise _Refused(f"calibration sample {k} has {len(s)} tensors; the compiled "
                                   f"function takes {len(pos)} ({', '.join(pos)}) and this "
                                   f"graph reads {', '.join(locals_)}")
                arrays = [given[n] for n in locals_]
            for n, a, i in zip(locals_, arrays, user):
                if tuple(a.shape) != tuple(args[i].shape):
                    raise _Refused(f"calibration sample {k}: argument {n!r} is "
                                   f"{list(a.shape)} but the model was called with "
                                   f"{list(args[i].shape)}: give samples of the called shapes")
            feeds.append({name: np.ascontiguousarray(a) for name, a in zip(names, arrays)})
        return feeds

    def _owners(self) -> set:
        """The local names the constants are attributes of (a method's ``self``)."""
        names = set()
        for i in self.consts:
            src = self.sources[i]
            while getattr(src, "base", None) is not None:
                src = src.base
            if _local_name(src):
                names.add(_local_name(src))
        return names

    def _make(self, args):
        ints = {i: int(a) for i, a in enumerate(args) if self.kinds[i] == "int"}
        frozen = _Frozen(self.gm, self.kinds, dict(self.consts), ints).eval()
        inputs = [a for a, k in zip(args, self.kinds) if k == "input"]
        names = [_name(self.places[i].name) for i, k in enumerate(self.kinds) if k == "input"]
        with torch.no_grad():
            outs = frozen(*inputs)
        bad = [k for k, o in enumerate(outs) if not isinstance(o, torch.Tensor)]
        if bad:
            raise _Refused(f"output {bad[0]} is a {type(outs[bad[0]]).__name__}, not a tensor")
        out_names = [f"output_{k}" for k in range(len(outs))]
        model = to_onnx(frozen, tuple(inputs), names, out_names)
        kept = {i.name for i in model.graph.input}
        calibration = None
        if self.opts.quantize:
            calibration = [{n: f[n] for n in f if n in kept}
                           for f in self._calibration(args, names)]
        try:
            built, run = _build(model, self.opts, calibration)
        except CelosiaError as e:
            raise _Refused(f"celosia: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from e
        except Exception as e:  # noqa: BLE001 - a bug in celosia: PyTorch runs the graph
            log.warning("celosia.torch: building graph %d failed", self.row["graph"],
                        exc_info=True)
            raise _Refused(f"celosia failed (a bug; please report it with this graph): "
                           f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                           ) from e
        ops = sorted({n.op_type for n in model.graph.node})
        _BUILT.append((self.row["graph"], weakref.ref(built)))  # (not kept alive by this)
        self.row.update(ran_on=f"celosia:{self.opts.target}", reason="", onnx_ops=ops,
                        quantize=self.opts.quantize or "fp32", builds=self.row["builds"] + 1)
        log.info("celosia.torch: graph %d built for %s (%s)", self.row["graph"],
                 self.opts.target, ", ".join(ops))
        feed_at = [(n, j) for n, j in zip(names, [i for i, k in enumerate(self.kinds)
                                                 if k == "input"]) if n in kept]
        dtypes = [o.dtype for o in outs]
        return built, run, feed_at, out_names, dtypes

    def __call__(self, *args):
        if self.refused:
            return self.gm(*args)
        for i, t in self.consts.items():  # weights changed since the build: build again
            if args[i] is not t or t._version != self.versions[i]:
                self.consts = {j: args[j] for j in self.consts}
                self.versions = {j: a._version for j, a in self.consts.items()}
                self.builds.clear()
                break
        key = tuple((tuple(a.shape), a.dtype) if k == "input" else int(a) if k == "int"
                    else None for a, k in zip(args, self.kinds))
        entry = self.builds.get(key)
        if entry is None:
            try:
                entry = self._make(args)
            except _Refused as e:
                entry = str(e)
                self._refuse(entry)
            if len(self.builds) >= MAX_BUILDS:  # the least recently made goes first
                self.builds.pop(next(iter(self.builds)))
            self.builds[key] = entry
        if isinstance(entry, str):
            return self.gm(*args)
        built, run, feed_at, out_names, dtypes = entry
        return _run_tensors(built, run, {n: args[j] for n, j in feed_at}, out_names, dtypes)


def _frame_args():
    """The name and positional argument names of the function TorchDynamo is compiling."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        code = InstructionTranslator.current_tx().f_code
        return code.co_name, list(code.co_varnames[:code.co_argcount])
    except Exception:  # noqa: BLE001 - torch's private API moved: positional samples only
        return None, []


def celosia_backend(gm, example_inputs, options=None, mode=None):
    """The ``torch.compile`` backend (module doc): a callable per captured graph."""
    if mode is not None:
        raise TorchOptionsError(f"celosia.torch: torch.compile's mode={mode!r} is a setting of "
                                f"the inductor backend; the celosia backend takes none (leave "
                                f"mode out, and give celosia's settings in options=)")
    opts = check_options(options)
    return _Graph(gm, list(example_inputs), opts, _frame_args())


def _register() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "celosia" not in _COMPILER_FNS:
        register_backend(celosia_backend, name="celosia")


_register()


# ---- ahead of time -----------------------------------------------------------------------

class CompiledModule:
    """A torch module built by celosia ahead of time: call it with tensors (the positional
    inputs it was built for), ``save`` the ``.cel``."""

    def __init__(self, built, run, input_names, output_names, opts: Options, dtypes, kept):
        self.built, self._run, self._kept = built, run, set(kept)
        self.input_names, self.output_names = input_names, output_names
        self.options, self._dtypes = opts, dtypes

    def __call__(self, *inputs):
        if len(inputs) != len(self.input_names):
            raise TorchOptionsError(f"celosia.torch: the module was built for "
                                    f"{len(self.input_names)} inputs "
                                    f"({', '.join(self.input_names)}), got {len(inputs)}")
        feeds = {n: t if isinstance(t, torch.Tensor) else torch.as_tensor(np.asarray(t))
                 for n, t in zip(self.input_names, inputs) if n in self._kept}
        res = _run_tensors(self.built, self._run, feeds, self.output_names, self._dtypes)
        return res[0] if len(res) == 1 else res

    def save(self, path) -> None:
        """The ``.cel`` (CpuModel or AccelModel), loadable with ``celosia run``."""
        self.built.save(path)


def compile_module(model: torch.nn.Module, example_inputs, *, target: str = "cpu",
                   quantize: str | None = None, calibration=None,
                   calibration_method: str = "mse", config=None,
                   save: str | None = None) -> CompiledModule:
    """``model`` (eval mode) written to ONNX with ``example_inputs`` (a tensor or a tuple of
    them) and built by celosia for ``target`` (options as for the backend); ``save``: write
    the ``.cel`` there too."""
    opts = check_options({"target": target, "quantize": quantize, "calibration_method":
                          calibration_method, "config": config,
                          **({"calibration": calibration} if calibration is not None else {})})
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    try:
        import inspect
        params = [p for p in inspect.signature(model.forward).parameters]
    except (TypeError, ValueError):
        params = []
    names = [_name(params[k]) if k < len(params) else f"input_{k}"
             for k in range(len(example_inputs))]
    model = model.eval()
    with torch.no_grad():
        outs = model(*example_inputs)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    out_names = [f"output_{k}" for k in range(len(outs))]
    try:
        onnx_model = to_onnx(model, example_inputs, names, out_names)
    except _Refused as e:
        raise TorchOptionsError(f"celosia.torch.compile_module: {e}") from e
    kept = [i.name for i in onnx_model.graph.input]
    feeds = None
    if opts.quantize:
        feeds = []
        for k, s in enumerate(opts.calibration):
            arrays = [s[n] for n in params[:len(names)]] if isinstance(s, dict) else s
            if len(arrays) != len(names):
                raise TorchOptionsError(f"celosia.torch.compile_module: calibration sample {k} "
                                        f"has {len(arrays)} tensors; the model takes "
                                        f"{len(names)} ({', '.join(names)})")
            feeds.append({n: np.ascontiguousarray(a) for n, a in zip(names, arrays)
                          if n in kept})
    built, run = _build(onnx_model, opts, feeds)
    if save:
        built.save(save)
    return CompiledModule(built, run, names, out_names, opts, [o.dtype for o in outs], kept)
