"""The `celosia` command line: exec, disasm, config, bench, demo, verilog, fpga, compile, run,
export."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .errors import CelosiaError

__all__ = ["main"]


def _config(spec):
    from .config import HwConfig

    return HwConfig.load(spec)


def _write_json(path: str | Path, data: dict) -> None:
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


# ---- subcommands ---------------------------------------------------------------------------


def cmd_exec(args) -> int:
    import numpy as np

    from .driver.board import make_any_executor
    from .image import ProgramImage

    cfg = _config(args.config)
    board = args.target.startswith("board:")
    if board and (args.max_cycles is not None or args.max_work is not None or args.trace
                  or args.timeline):
        raise CelosiaError("--max-cycles, --max-work, --trace and --timeline apply to the "
                           "simulators; a board runs for real (its runs stop after "
                           "60 s)")
    if args.baud is not None and not board:
        raise CelosiaError("--baud applies to a board on a serial port (--target board:PORT)")
    if args.target == "fsim" and (args.max_cycles is not None or args.trace):
        raise CelosiaError("--max-cycles and --trace apply to the timed targets (cycle, rtl); "
                           "fsim has no cycles: bound its work with --max-work N")
    if args.target == "rtl" and args.max_work is not None:
        raise CelosiaError("--max-work bounds fsim and the cycle model; bound the rtl target "
                           "with --max-cycles N")
    if args.timeline and args.target != "cycle":
        raise CelosiaError("--timeline is drawn by the cycle model: use --target cycle")
    options = {}
    for flag, name in (("--max-cycles", "max_cycles"), ("--max-work", "max_work")):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise CelosiaError(f"{flag} must be a positive integer, not {value}")
            options[name] = value
    if args.trace:
        options["trace"] = args.trace
    image = ProgramImage.load(args.image)
    if args.baud is not None:
        options["baud"] = args.baud
    executor = make_any_executor(args.target, cfg, image.dram.size, **options)
    executor.write_dram(0, image.dram)
    stats = executor.run(image.insn_addr, image.insn_count)
    dram = executor.read_dram(0, image.dram.size)
    if args.timeline:
        from .sim.cycle import plot_timeline
        plot_timeline(executor, args.timeline)
    _write(args.out, "--out", lambda f: np.savez_compressed(f, dram=dram))
    stats = {"target": args.target, **stats}
    if args.stats:
        _write(args.stats, "--stats", lambda f: _write_json(f, stats))
    if not args.quiet:
        shown = ", ".join(f"{k}={v}" for k, v in stats.items()
                          if k in ("cycles", "insn_count", "gemm_uops", "alu_uops", "macs", "work"))
        print(f"{args.image}: ran on {args.target}: {shown}; DRAM written to {args.out}")
    return 0


def _write(path: str, flag: str, write) -> None:
    """Write an output file, turning a bad path into a one-line error."""
    try:
        write(path)
    except OSError as exc:
        raise CelosiaError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None


def cmd_disasm(args) -> int:
    from .image import ProgramImage
    from .isa import decode_program, disassemble

    cfg = _config(args.config)
    image = ProgramImage.load(args.image)
    print(disassemble(decode_program(image.program_bytes, cfg)))
    return 0


def cmd_config(args) -> int:
    cfg = _config(args.config)
    if args.format == "json":
        print(cfg.to_json())
    elif args.format == "vta":
        print(json.dumps(cfg.to_vta_dict(), indent=2))
    else:
        print(cfg.describe())
    return 0


def cmd_bench(args) -> int:
    from .benchmarks import BENCHMARKS, run_benchmark

    if args.list or not args.name:
        for name, (_, _, summary) in BENCHMARKS.items():
            print(name if args.names else f"{name:<18} {summary}")
        return 0
    if args.time_limit is not None and not args.time_limit > 0:
        raise CelosiaError(f"--time-limit must be a positive number of seconds, not "
                           f"{args.time_limit:g}")
    result = run_benchmark(args.name, quick=args.quick, models=args.models,
                           int8=args.int8, accel=args.accel, time_limit=args.time_limit,
                           calibration_method=args.calibration_method, smooth=args.smooth,
                           int8_residuals=args.int8_residuals,
                           bias_correction=not args.no_bias_correction, out=args.out)
    if args.out:
        _write_json(args.out, result)
    width = max(len(k) for k in result["metrics"]) if result["metrics"] else 0
    for key, value in result["metrics"].items():
        print(f"{key:<{width}}  {value:.6g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(target=args.target, config=_config(args.config), out_dir=args.out_dir)


def cmd_verilog(args) -> int:
    try:
        from celosia.hw.export import verilog_text
    except ModuleNotFoundError as exc:
        raise CelosiaError(f"Verilog export needs {exc.name}, which celosia installs; "
                           f"reinstall celosia (pip install celosia)") from None
    cfg = _config(args.config)
    text = verilog_text(cfg)
    Path(args.output).write_text(text)
    print(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


def cmd_fpga_build(args) -> int:
    from .fpga.build import command

    return command(args)


def _exec_target(value: str) -> str:
    if value in ("fsim", "cycle", "rtl") or (value.startswith("board:") and len(value) > 6):
        return value
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from fsim, cycle, rtl, "
                                     f"board:PORT)")


def cmd_fpga_synth(args) -> int:
    from .fpga.synth import command

    return command(args)


def cmd_sweep(args) -> int:
    from .sweep.cli import command

    return command(args)


# ---- whole models (compile, run) --------------------------------------------------------------

MODEL_TARGETS = ("cpu", "fsim", "cycle", "rtl")


def _check_model_target(target: str) -> None:
    if target not in MODEL_TARGETS:
        raise CelosiaError(f"unknown target {target!r}: whole models run on "
                           f"{', '.join(MODEL_TARGETS)}")


def _accel_build(args) -> bool:
    """Whether compile/run builds the partitioned (quantized) model rather than the float
    CPU build."""
    if args.quantize not in (None, "int8"):
        raise CelosiaError(f"--quantize {args.quantize!r}: only int8 is supported")
    if args.calibration and not args.quantize:
        raise CelosiaError("--calibration goes with --quantize int8")
    if args.calibration_method and not args.quantize:
        raise CelosiaError("--calibration-method goes with --quantize int8")
    if args.smooth is not None and not args.quantize:
        raise CelosiaError("--smooth goes with --quantize int8")
    if args.int8_residuals and not args.quantize:
        raise CelosiaError("--int8-residuals goes with --quantize int8")
    if args.no_bias_correction and not args.quantize:
        raise CelosiaError("--no-bias-correction goes with --quantize int8")
    if args.targets is not None:
        if args.target == "cpu" and not args.quantize:
            raise CelosiaError("--targets goes with an accelerator build (--target fsim, "
                               "cycle or rtl, or --quantize int8)")
        from .runtime.targets import target_order

        target_order(args.targets)  # an unknown target fails before the build
    if args.smooth is not None:
        from .compiler.graph.smooth import check_alpha

        check_alpha(args.smooth)  # a bad value fails before the build
    if args.calibration_method:
        from .compiler.graph.calib import parse_method

        parse_method(args.calibration_method)  # a bad value fails before the build
    return args.target != "cpu" or args.quantize is not None


def _input_shapes(specs) -> dict | None:
    shapes = {}
    for spec in specs or ():
        name, sep, dims = spec.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or min(shape) < 1:
            raise CelosiaError(f"--input-shape {spec!r}: expected NAME=D1,D2,... with positive "
                               f"integers, e.g. image=1,3,224,224")
        shapes[name] = shape
    return shapes or None


def _progress(enabled: bool):
    if not enabled:
        return None
    return lambda line: print(line, file=sys.stderr, flush=True)


def cmd_targets(args) -> int:
    from .runtime.targets import available_targets

    rows = available_targets()
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<10} not loaded: {r['error']}")
        else:
            print(f"{r['name']:<10} {r['description']}\n{'':<10} ({r['origin']})")
    return 1 if any("error" in r for r in rows) else 0


def cmd_compile(args) -> int:
    from .runtime.cpu import CpuModel, is_artifact

    _check_model_target(args.target)
    if is_artifact(args.model):
        return _recompile(args)
    if _accel_build(args):
        from .runtime.accel import AccelModel

        model = AccelModel.from_onnx(args.model, _config(args.config),
                                     input_shapes=_shapes_from_inputs(args),
                                     calibration=args.calibration, target=args.target,
                                     calibration_method=args.calibration_method or "mse",
                                     smooth=args.smooth, int8_residuals=args.int8_residuals,
                                     bias_correction=not args.no_bias_correction,
                                     progress=_progress(args.progress),
                                     targets=args.targets)
        model.save(args.output)
        info = model.build_info
        print(f"wrote {args.output}: {info['nodes']} nodes, {info['accel_nodes']} on the "
              f"accelerator in {info['regions']} regions, {info['instructions']:,} "
              f"instructions, {info['dram_bytes']:,} bytes of DRAM image, in "
              f"{info['total_s']:.2f} s; runs on {args.target}")
        return 0
    if args.config:
        raise CelosiaError("--config applies to the accelerator targets (fsim, cycle, rtl)")
    model = CpuModel.build(args.model, _input_shapes(args.input_shape),
                           progress=_progress(args.progress))
    model.save(args.output)
    info = model.build_info
    types = ", ".join(f"{n}: {d}[{','.join(map(str, s))}]" for n, (d, s) in
                      model.input_types.items())
    print(f"wrote {args.output}: {info['nodes']} nodes, {info['steps']} steps, "
          f"{info['kernels']} kernels ({info['kernels_cached']} from the cache) in "
          f"{info['total_s']:.2f} s; inputs {types}")
    return 0


def _recompile(args) -> int:
    """`celosia compile MODEL.cel`: a CPU build again from the ONNX model it keeps, for the
    shapes given (the command a wrong-shape run of a .cel prints)."""
    from .runtime.accel import is_accel_artifact
    from .runtime.cpu import CpuModel

    if is_accel_artifact(args.model) or args.target != "cpu" or args.quantize or args.config:
        raise CelosiaError(f"{args.model} is a built model already (.cel); compile takes an "
                           f"ONNX model (or a CPU .cel to build again for --input-shape)")
    old = CpuModel.load(args.model)
    if old.source is None or old.origin.get("from", "onnx") != "onnx":
        raise CelosiaError(f"{args.model} holds no ONNX model to build again from; compile "
                           f"the ONNX model")
    model = old.rebuild(_input_shapes(args.input_shape) or {}, progress=_progress(args.progress))
    model.save(args.output)
    types = ", ".join(f"{n}: {d}[{','.join(map(str, s))}]" for n, (d, s) in
                      model.input_types.items())
    print(f"wrote {args.output}: built again from the ONNX model in {args.model} in "
          f"{model.build_info['total_s']:.2f} s; inputs {types}")
    return 0


def _load_inputs(specs, names) -> dict:
    """{input name: array} from ``--input NAME=FILE.npy`` (NAME may be left out for a
    model with one input) or ``--input FILE.npz`` (arrays named after the inputs; one array
    for a one-input model; with NAME=, the array of that name or the only one). Files are
    read by the checked reader (runtime/npyio.py): no pickles, headers checked first."""
    from .runtime.npyio import NpyError, load_file

    feeds = {}
    names = list(names)
    for spec in specs or ():
        name, sep, file = spec.rpartition("=")
        try:
            data = load_file(file, file)
        except FileNotFoundError:
            raise CelosiaError(f"--input {spec!r}: no such file {file!r}") from None
        except OSError as e:
            raise CelosiaError(f"--input {spec!r}: cannot read {file!r} ({e.strerror})") from None
        except NpyError as e:
            raise CelosiaError(f"--input {spec!r}: {file} {e}; save the array with numpy.save "
                               f"(or several, named after the inputs, with numpy.savez)") from None
        if isinstance(data, dict):
            if sep:  # NAME=FILE.npz: the array of that name, or its only one
                if name in data:
                    data = {name: data[name]}
                elif len(data) == 1:
                    data = {name: next(iter(data.values()))}
                else:
                    raise CelosiaError(f"--input {spec!r}: {file} has no array named {name!r}")
            elif len(data) == 1 and len(names) == 1:
                data = {names[0]: next(iter(data.values()))}
            unknown = sorted(set(data) - set(names))
            if unknown:
                raise CelosiaError(f"--input {spec!r}: {file} holds {', '.join(map(repr, unknown))}"
                                   f", not inputs of the model ({', '.join(names)})")
            given = data
        else:
            if not sep:
                if len(names) != 1:
                    raise CelosiaError(f"--input {spec!r}: name the input (NAME=FILE.npy); "
                                       f"the model's inputs are {', '.join(names)}")
                name = names[0]
            given = {name: data}
        for name, a in given.items():
            if name in feeds:
                raise CelosiaError(f"--input {spec!r}: input {name!r} is given twice")
            feeds[name] = a
    return feeds


# --compare: an output agrees when its largest absolute difference is within this share of
# its scale (the reference's largest magnitude). Two correct float32 evaluations of a deep
# network differ by about 1e-6 of the scale (ResNet-50: 5e-7; docs/runtime.md, Accuracy),
# while a wrong element is off by the order of the scale. An element-wise rtol would fail
# correct networks on their outputs near zero, whose absolute error is that of the large
# ones.
COMPARE_TOLERANCE = 1e-4


def compare_to_scale(ours: dict, theirs: dict, tolerance: float) -> tuple[bool, dict]:
    """(all within?, {output: row}): per output the largest absolute difference, the
    output's scale (max |reference|), their ratio, whether it is within ``tolerance`` (0:
    bit for bit), and the five largest differences."""
    import numpy as np

    ok, rows = True, {}
    for name, got in ours.items():
        ref = np.asarray(theirs[name])
        if ref.shape != got.shape:
            rows[name] = {"shape": list(got.shape), "reference_shape": list(ref.shape),
                          "within_tolerance": False}
            ok = False
            continue
        a, b = got.astype(np.float64), ref.astype(np.float64)
        with np.errstate(invalid="ignore"):  # equal (NaN in both too) agrees, else a NaN
            same = (a == b) | (np.isnan(a) & np.isnan(b))  # or infinity is infinitely off
            diff = np.where(same, 0.0,
                            np.nan_to_num(np.abs(a - b), nan=np.inf, posinf=np.inf))
        worst = float(diff.max()) if diff.size else 0.0
        finite = np.abs(b[np.isfinite(b)])
        scale = float(finite.max()) if finite.size else 0.0
        relative = worst / scale if scale else (0.0 if worst == 0 else float("inf"))
        within = bool(worst == 0 if tolerance == 0 else relative <= tolerance)
        ok &= within
        top = np.argsort(diff, axis=None)[::-1][:5] if worst else []
        rows[name] = {
            "max_abs_diff": worst, "scale": scale, "max_diff_vs_scale": relative,
            "differing": int(np.count_nonzero(diff)), "elements": int(diff.size),
            "tolerance": tolerance, "within_tolerance": within,
            "largest": [{"index": [int(i) for i in np.unravel_index(k, diff.shape)],
                         "ours": float(a.flat[k]), "reference": float(b.flat[k]),
                         "abs_diff": float(diff.flat[k])} for k in top],
        }
    return ok, rows


def _print_compare(rows: dict, ours: str, against: str) -> None:
    """One line per output (and its largest differences when it is outside)."""
    for name, r in rows.items():
        if "shape" in r:
            print(f"{name}: shape {r['shape']} but {against} gives {r['reference_shape']}")
            continue
        if r["tolerance"] == 0:
            verdict = "identical" if r["within_tolerance"] else "DIFFERENT"
            rule = "required: bit for bit"
            shown = (f"{r['differing']} of {r['elements']} elements differ, max |diff| "
                     f"{r['max_abs_diff']:.3g} = {r['max_diff_vs_scale']:.3g} of its scale")
        else:
            verdict = "within" if r["within_tolerance"] else "OUTSIDE"
            rule = f"tolerance {r['tolerance']:g} of the scale"
            shown = (f"max |diff| {r['max_abs_diff']:.3g} = {r['max_diff_vs_scale']:.3g} of its "
                     f"scale (max |{against}| {r['scale']:.4g})")
        print(f"{name} vs {against}: {shown}: {verdict} ({rule})" if r["max_abs_diff"]
              else f"{name} vs {against}: identical ({rule})")
        if not r["within_tolerance"]:
            for w in r["largest"]:
                print(f"  [{','.join(map(str, w['index']))}] {ours} {w['ours']:.7g} "
                      f"{against} {w['reference']:.7g} diff {w['abs_diff']:.3g}")


def _compares(spec, allowed) -> list[str]:
    names = [c.strip() for c in (spec or "").split(",") if c.strip()]
    for c in names:
        if c not in allowed:
            raise CelosiaError(f"--compare {spec!r}: {c!r} cannot be compared here; choose "
                               f"from {', '.join(allowed)}")
    return names


def cmd_run(args) -> int:
    from .runtime.cpu import is_artifact

    _check_model_target(args.target)
    accel_artifact = False
    if is_artifact(args.model):
        from .runtime.accel import is_accel_artifact

        accel_artifact = is_accel_artifact(args.model)
    if accel_artifact or _accel_build(args):
        return _run_accel(args, accel_artifact)
    return _run_cpu(args)


def _run_accel(args, artifact: bool) -> int:
    import numpy as np

    from .runtime.accel import AccelModel, compare_outputs
    from .runtime.report import format_table, plot_timeline, write_json

    compares = _compares(args.compare, ("cpu", "onnxruntime"))
    progress = _progress(args.progress)
    if artifact:
        if args.quantize or args.calibration or args.calibration_method or args.input_shape \
                or args.smooth is not None or args.int8_residuals or args.no_bias_correction \
                or args.targets:
            raise CelosiaError(f"{args.model} is built already: --quantize, --calibration, "
                               f"--calibration-method, --smooth, --int8-residuals, "
                               f"--no-bias-correction, --targets and "
                               f"--input-shape apply to ONNX models")
        model = AccelModel.load(args.model)
        if args.config and _config(args.config) != model.config:
            raise CelosiaError(f"{args.model} was built for another configuration than "
                               f"--config {args.config}; build it again with that --config")
    else:
        model = AccelModel.from_onnx(args.model, _config(args.config),
                                     input_shapes=_shapes_from_inputs(args),
                                     calibration=args.calibration, target=args.target,
                                     calibration_method=args.calibration_method or "mse",
                                     smooth=args.smooth, int8_residuals=args.int8_residuals,
                                     bias_correction=not args.no_bias_correction,
                                     progress=progress, targets=args.targets)
    cpu = None
    if args.target == "cpu" or "cpu" in compares:  # the all-CPU build, made at most once
        cpu = model if not model.programs else model.cpu_build()
    if args.target == "cpu":
        model = cpu
    feeds = _load_inputs(args.input, model.input_types)
    target = "fsim" if args.target == "cpu" else args.target
    runs = _timed_accel_runs(model, feeds, target, progress, warm=bool(args.report))
    outputs = runs["outputs"]
    rows, summary = model.report, model.summary()
    print(format_table(rows, summary))
    print(_runs_line(runs))
    ok, compared = True, {}
    if "cpu" in compares:  # the same quantized graph: equal bit for bit, or a bug
        same, per_output = compare_to_scale(outputs, cpu.run(feeds), 0)
        compared["cpu"] = {"outputs": per_output, "tolerance": "bit for bit",
                           "identical": same}
        ok &= same
        print(f"vs the all-CPU build of the same quantized graph: "
              f"{'identical' if same else 'DIFFERENT'} (required: bit for bit)")
        _print_compare(per_output, "accelerator", "all-CPU build")
    if "onnxruntime" in compares:  # the float model: int8 quantization error, reported only
        theirs = _onnxruntime_outputs(model, feeds)
        _, detail = compare_outputs(outputs, theirs, exact=False)
        compared["onnxruntime"] = detail
        print(f"vs onnxruntime (float): {detail['summary']} (int8 against float: shown, "
              f"not checked)")
    if args.output:
        np.savez(args.output, **outputs)
    if args.report:
        write_json(args.report, {"model": str(args.model), "target": args.target,
                                 "summary": summary, "nodes": rows, "build": model.build_info,
                                 "runs": {k: v for k, v in runs.items() if k != "outputs"},
                                 "compare": compared})
    if args.timeline:
        plot_timeline(rows, summary, args.timeline, title=f"{Path(args.model).name} on {args.target}")
    shown = ", ".join(f"{n}: {a.dtype}[{','.join(map(str, a.shape))}]" for n, a in outputs.items())
    written = [f for f in (args.output, args.report, args.timeline) if f]
    print(f"ran {args.model} on {args.target}: {shown}"
          + (f"; wrote {', '.join(written)}" if written else ""))
    if not ok:
        print("the accelerator build differs from the all-CPU build of the same graph",
              file=sys.stderr)
        return 1
    return 0


def _timed_accel_runs(model, feeds, target: str, progress, *, warm: bool) -> dict:
    """Run an accelerator build once (cold: the process's first inference, which pays
    one-time set-up such as the CPU segments' first calls and the simulator's decoding of
    each program), and with ``warm`` a second time (the steady state; ``model.report`` is
    then that run's). The outputs of both must be identical."""
    import numpy as np

    t0 = time.perf_counter()
    outputs = model.run(feeds, target=target, progress=progress)
    runs = {"timed": "cold", "cold": {"wall_s": time.perf_counter() - t0,
                                      **_latency_figures(model.summary())}}
    if warm:
        t0 = time.perf_counter()
        again = model.run(feeds, target=target)
        runs["warm"] = {"wall_s": time.perf_counter() - t0, **_latency_figures(model.summary())}
        runs["timed"] = "warm"
        for name, a in outputs.items():
            if not np.array_equal(a, again[name]):
                raise CelosiaError(f"output {name!r} of the second run on {target} differs "
                                   f"from the first's (a bug: please report it with the model)")
    runs["outputs"] = outputs
    return runs


def _latency_figures(summary: dict) -> dict:
    return {k: summary[k] for k in ("latency_ms", "accel_ms", "cpu_ms", "layout_ms")}


def _runs_line(runs: dict) -> str:
    """Which run the table shows, and the cold (and warm) latency and wall time."""
    def one(r):
        return f"latency {r['latency_ms']:.3f} ms (CPU {r['cpu_ms']:.3f} ms, layout " \
               f"{r['layout_ms']:.3f} ms), {r['wall_s']:.2f} s wall"
    cold = f"cold (the process's first run): {one(runs['cold'])}"
    if "warm" not in runs:
        return f"the table is the {cold}"
    return f"the table is the warm run (the second): {one(runs['warm'])}; {cold}"


def _shapes_from_inputs(args) -> dict | None:
    """--input-shape, and for an ONNX model's dynamic inputs not given one, the shapes of
    the --input arrays, else of the --calibration samples (a build needs static shapes: the
    data says which)."""
    import numpy as np

    from .compiler.frontend.inputs import is_dynamic
    from .compiler.frontend.onnx import declared_inputs

    shapes = _input_shapes(args.input_shape) or {}
    declared = declared_inputs(args.model)
    wanted = [n for n, (_, d) in declared.items() if n not in shapes and is_dynamic(d)]
    if wanted and getattr(args, "input", None):
        feeds = _load_inputs(args.input, declared)
        shapes.update((n, feeds[n].shape) for n in wanted if n in feeds)
    elif wanted and args.calibration:
        try:
            with np.load(args.calibration, allow_pickle=False) as samples:
                arrays = {n: samples[n].shape for n in wanted if n in samples.files}
        except (ValueError, OSError, EOFError):
            arrays = {}  # the calibration loader reports an unreadable file
        for n, shape in arrays.items():
            dims = declared[n][1]
            if dims is not None and len(shape) == len(dims) + 1:  # [samples, *shape]
                shapes[n] = shape[1:]
            elif dims is not None and len(shape) == len(dims) and shape:  # along the batch
                shapes[n] = (dims[0] if isinstance(dims[0], int) else 1, *shape[1:])
    return shapes or None


def _onnxruntime_outputs(model, feeds) -> dict:
    try:
        import onnxruntime as ort
    except ModuleNotFoundError:
        raise CelosiaError("--compare onnxruntime needs onnxruntime: pip install "
                           "onnxruntime") from None
    if model.source is None:
        raise CelosiaError("--compare onnxruntime: this .cel holds no source model; build "
                           "it again with `celosia compile`")
    try:
        session = ort.InferenceSession(model.source, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, feeds)))
    except Exception as e:  # noqa: BLE001 - onnxruntime's own errors, reported in one line
        raise CelosiaError(f"--compare onnxruntime: onnxruntime failed: "
                           f"{str(e).splitlines()[0]}") from None


def _run_cpu(args) -> int:
    import numpy as np

    from .runtime.cpu import CpuModel
    from .runtime.specialize import DynamicCpuModel

    compare = bool(_compares(args.compare, ("onnxruntime",)))
    if args.config or args.timeline:
        raise CelosiaError("--config and --timeline apply to the accelerator targets (fsim, "
                           "cycle, rtl) and to --quantize int8 builds")
    model = CpuModel.open(args.model, _input_shapes(args.input_shape),
                          progress=_progress(args.progress))
    feeds = _load_inputs(args.input, model.input_types)
    timed = bool(args.report or args.progress)
    if args.report:
        model.run(feeds)  # warm-up: the report times a steady run
    outputs = model.run(feeds, profile=timed, progress=_progress(args.progress))
    if isinstance(model, DynamicCpuModel):
        shapes = ", ".join(f"{n}: {d}[{','.join(map(str, model.last.input_types[n][1]))}]"
                           for n, (d, _) in model.input_types.items())
        print(f"built {args.model} for the arrays given ({shapes}): the model's inputs "
              f"have dynamic dims")
    if args.output:
        np.savez(args.output, **outputs)
    report = model.report() if timed else None
    ok = True
    if compare:
        ok, rows = compare_to_scale(outputs, _onnxruntime_outputs(model, feeds),
                                    COMPARE_TOLERANCE)
        _print_compare(rows, "celosia", "onnxruntime")
        if report is not None:
            report["compare"] = {"against": "onnxruntime", "within_tolerance": ok,
                                 "tolerance": COMPARE_TOLERANCE, "measure":
                                 "max |diff| / max |onnxruntime| per output",
                                 "outputs": rows}
    if args.report:
        _write_json(args.report, report)
    shown = ", ".join(f"{n}: {a.dtype}[{','.join(map(str, a.shape))}]" for n, a in outputs.items())
    where = f"; wrote {args.output}" if args.output else ""
    total = f" in {report['summary']['total_ms']:.2f} ms" if report else ""
    print(f"ran {args.model} on cpu{total}: {shown}{where}"
          + (f"; report {args.report}" if args.report else ""))
    if not ok:
        print(f"outputs differ from onnxruntime by more than {COMPARE_TOLERANCE:g} of their "
              f"scale", file=sys.stderr)
        return 1
    return 0


def cmd_export(args) -> int:
    """`celosia export MODEL --target cpu -o DIR`: lib<name>.so + <name>.h (runtime/cabi.py)."""
    from .runtime.cabi import export_model

    if args.target != "cpu":
        raise CelosiaError(f"export --target {args.target!r}: a library holds CPU code only "
                           f"(--target cpu); the accelerator targets run through `celosia run`")
    info = export_model(args.model, args.output, args.name,
                        input_shapes=_input_shapes(args.input_shape), quantize=args.quantize,
                        calibration=args.calibration,
                        calibration_method=args.calibration_method or "mse")
    print(f"wrote {info['library']} ({info['library_bytes']:,} bytes: {info['kernels']} "
          f"kernels, {info['steps']} steps, {info['constant_bytes']:,} bytes of constants, "
          f"{info['arena_bytes']:,} bytes of working memory), {info['header']} and "
          f"{info['dlpack']}")
    return 0


# ---- parser --------------------------------------------------------------------------------


def quantizer_options(p, scope: str) -> None:
    """The int8 quantizer's choices, for `compile`/`run --quantize` and `bench zoo --int8`."""
    p.add_argument("--calibration-method", metavar="METHOD",
                   help=f"{scope}: how each int8 range is chosen from the calibration "
                        f"samples: mse (default), minmax, percentile (99.99 of |x|; "
                        f"percentile:P for another), entropy (KL divergence)")
    p.add_argument("--smooth", metavar="ALPHA",
                   help=f"{scope}: SmoothQuant alpha (0..1, or auto: chosen per LayerNorm), "
                        f"how much of LayerNorm outputs' per-channel range moves into the "
                        f"Linear weights reading them (default none, docs/graph.md)")
    p.add_argument("--int8-residuals", action="store_true",
                   help=f"{scope}: keep the residual sums of dense (MatMul/Gemm) layers int8 "
                        f"(default: float, docs/graph.md)")
    p.add_argument("--no-bias-correction", action="store_true",
                   help=f"{scope}: keep the int32 biases as rounded, without the empirical "
                        f"bias correction on the calibration samples (default: corrected, "
                        f"compiler/graph/biascorr.py)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="celosia", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def config_option(p):
        p.add_argument("--config", metavar="CFG",
                       help="a preset name (default, small) or a JSON file (celosia's or VTA's "
                            "vta_config.json format); the default configuration if omitted")

    p = sub.add_parser("exec", help="run a program image on an executor")
    p.add_argument("image", help="program image (.npz with dram, insn_addr, insn_count)")
    p.add_argument("--target", default="fsim", type=_exec_target,
                   help="fsim, cycle, rtl, or board:PORT (a board top over its UART: a serial "
                        "device, or socket:HOST:PORT; docs/board.md)")
    config_option(p)
    p.add_argument("--baud", type=int, help="board:PORT on a serial device: the bitstream's "
                                            "UART rate (default 115200)")
    p.add_argument("--out", required=True, help="where to write the final DRAM (.npz, key dram)")
    p.add_argument("--stats", help="where to write the counters (JSON)")
    p.add_argument("--max-cycles", type=int, metavar="N",
                   help="timed targets (cycle, rtl): stop a run longer than N cycles")
    p.add_argument("--max-work", type=int, metavar="N",
                   help="fsim and cycle: stop a run that would do more work than N "
                        "instructions plus micro-op iterations (default 2^24 = 16777216)")
    p.add_argument("--trace", help="timed targets: write a trace (cycle: Perfetto JSON; rtl: FST)")
    p.add_argument("--timeline", help="cycle target: draw a PNG timeline of the modules")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_exec)

    p = sub.add_parser("disasm", help="print a program image's instructions, one per line")
    p.add_argument("image")
    config_option(p)
    p.set_defaults(func=cmd_disasm)

    p = sub.add_parser("config", help="show a hardware configuration")
    p.add_argument("action", choices=["show"])
    config_option(p)
    p.add_argument("--format", choices=["text", "json", "vta"], default="text",
                   help="text summary, celosia's JSON, or VTA's vta_config.json keys")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("bench", help="run a benchmark and write its metrics")
    p.add_argument("name", nargs="?")
    p.add_argument("--list", action="store_true", help="list the benchmarks")
    p.add_argument("--names", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help="write the result (metrics + machine) as JSON")
    p.add_argument("--quick", action="store_true", help="smaller problem sizes (smoke test)")
    p.add_argument("--models", help="zoo only: a comma-separated subset of the zoo's models")
    p.add_argument("--int8", action="store_true",
                   help="zoo only: int8 accuracy against fp32 and onnxruntime's quantizer")
    p.add_argument("--accel", action="store_true",
                   help="zoo only: the int8 build on the accelerator (cycle model): bit-exact "
                        "check, MAC share, crossings, layout share, utilisation, cycles")
    quantizer_options(p, "zoo --int8/--accel only")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="zoo --accel only: seconds per model for its accelerator build and "
                        "run (default 600); a model over it is recorded with the reason")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="the main job: the bundled digits CNN, int8 on the "
                                     "accelerator against fp32 on the CPU and onnxruntime")
    p.add_argument("--target", default="cycle", choices=["fsim", "cycle", "rtl"],
                   help="the executor of the accelerator part (default: the cycle model)")
    config_option(p)
    p.add_argument("--out-dir", default="out", help="where to write the demo's files")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("verilog", help="write the accelerator as one Verilog file")
    config_option(p)
    p.add_argument("-o", "--output", default="accel.v")
    p.set_defaults(func=cmd_verilog)

    p = sub.add_parser("fpga", help="FPGA implementation with open tools (docs/fpga.md)")
    fpga = p.add_subparsers(dest="fpga_command", required=True, metavar="ACTION")
    q = fpga.add_parser("synth", help="synthesise (and for the ECP5, place and route) a "
                                      "configuration for an FPGA part: resources, fit, Fmax, "
                                      "critical path")
    from .fpga.synth import add_arguments as synth_arguments
    synth_arguments(q)
    q.set_defaults(func=cmd_fpga_synth)
    q = fpga.add_parser("build", help="a board's files: the ULX3S-85F bitstream (open tools), "
                                      "or the PYNQ-Z1's Verilog and Vivado script "
                                      "(docs/board.md)")
    from .fpga.build import add_arguments as build_arguments
    build_arguments(q)
    q.set_defaults(func=cmd_fpga_build)

    p = sub.add_parser("sweep", help="design-space exploration: configurations x workloads "
                                      "on the cycle model, locally or on Ray (docs/sweep.md)")
    from .sweep.cli import add_arguments as sweep_arguments
    sweep_arguments(p)
    p.set_defaults(func=cmd_sweep)

    def model_options(p):
        p.add_argument("--target", default="cpu", choices=MODEL_TARGETS,
                       help="cpu (LLVM float build, or the all-CPU int8 build with --quantize), "
                            "or an accelerator executor: fsim, cycle, rtl (default cpu)")
        config_option(p)
        p.add_argument("--quantize", metavar="int8",
                       help="post-training int8 quantization (needed for the accelerator "
                            "targets unless the model is a QDQ model)")
        p.add_argument("--calibration", metavar="DATA.npz",
                       help="calibration inputs for --quantize: one array per model input, "
                            "named after it, samples along the first axis")
        quantizer_options(p, "with --quantize")
        p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                       help="static shape of an input with dynamic dimensions (repeatable); "
                            "`run` takes them from the --input arrays when left out")
        p.add_argument("--progress", action="store_true",
                       help="one line per layer compiled and per node run (stderr)")
        p.add_argument("--targets", metavar="accel,NAME,...",
                       help="accelerator builds: the code generation targets to partition "
                            "between, in order of preference (plug-ins included; `celosia "
                            "targets` lists them; default accel,cpu)")

    p = sub.add_parser("targets", help="list the code generation targets (built-in and "
                                       "plug-ins) and plug-ins that failed to load")
    p.set_defaults(func=cmd_targets)

    p = sub.add_parser("compile", help="build an ONNX model for a target into one file (.cel)")
    p.add_argument("model", help="ONNX model (.onnx), or a CPU .cel to build again from the "
                                 "ONNX model it keeps (for other --input-shape)")
    model_options(p)
    p.add_argument("-o", "--output", required=True, help="the built model (.cel)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run an ONNX model or a built one (.cel) on inputs")
    p.add_argument("model", help="ONNX model (.onnx; built first) or built model (.cel)")
    model_options(p)
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="an input array (repeatable; NAME= may be left out for one input), "
                        "or FILE.npz with arrays named after the inputs")
    p.add_argument("--output", help="write the outputs, by their ONNX names (.npz)")
    p.add_argument("--report", help="write per-node figures and a summary (JSON)")
    p.add_argument("--timeline", help="accelerator builds: draw the run's timeline (PNG)")
    p.add_argument("--compare", metavar="cpu,onnxruntime",
                   help="compare with the all-CPU build of the same quantized graph (must be "
                        "identical: exit 1 otherwise) and/or onnxruntime's float result; float "
                        "CPU builds compare with onnxruntime (exit 1 when an output's largest "
                        "difference is beyond 1e-4 of its largest magnitude)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("export", help="write a CPU build as a shared library with a C ABI "
                                      "(lib<name>.so, <name>.h, dlpack.h; docs/export.md)")
    p.add_argument("model", help="ONNX model (.onnx; built for the CPU first) or a CPU build "
                                 "(.cel)")
    p.add_argument("--target", default="cpu", help="cpu (the only target a library holds)")
    p.add_argument("-o", "--output", required=True, metavar="OUT_DIR",
                   help="the folder to write lib<name>.so, <name>.h and dlpack.h into")
    p.add_argument("--name", help="the library's name (a C identifier; default: the model "
                                  "file's name)")
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="static shape of an input with dynamic dimensions (repeatable)")
    p.add_argument("--quantize", metavar="int8",
                   help="the all-CPU int8 build of the quantized model (needs --calibration)")
    p.add_argument("--calibration", metavar="DATA.npz",
                   help="calibration inputs for --quantize (as for `celosia compile`)")
    p.add_argument("--calibration-method", metavar="METHOD",
                   help="with --quantize: mse (default), minmax, percentile[:P], entropy")
    p.set_defaults(func=cmd_export)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CelosiaError as exc:
        print(f"celosia {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("celosia: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
