"""What a mutated model must do in celosia: ``check_case`` imports it in-process and either
gets a CelosiaError, or a graph that runs on the reference executor and matches onnxruntime
wherever onnxruntime accepts the same model and inputs. Anything else is returned as a
failure text (the caller collects them, so one run reports every failing case)."""

from __future__ import annotations

import traceback

import numpy as np

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.ir import subgraphs
from celosia.compiler.graph.ops_random import NONDETERMINISTIC
from celosia.compiler.graph.reference import run_graph
from celosia.errors import CelosiaError


def random_feeds(graph, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        t = graph.types[name]
        dtype = np.dtype(t.dtype)
        if dtype.kind == "f":
            feeds[name] = rng.normal(size=t.shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.random(t.shape) < 0.5
        else:  # small integers: valid indices and shapes more often than not
            feeds[name] = rng.integers(0, 3, size=t.shape).astype(dtype)
        # A scalar input is a 0-d array, not a numpy scalar (onnxruntime refuses those).
        feeds[name] = np.asarray(feeds[name])
    return feeds


def _crashes_onnxruntime(data: bytes) -> bool:
    """Models that kill onnxruntime's process (a segmentation fault) instead of failing:
    no comparison there. LayerNormalization with its optional bias named "" (onnxruntime
    issue 18967, still in 1.32)."""
    import onnx

    try:
        nodes = onnx.load_from_string(data).graph.node
    except Exception:  # noqa: BLE001 - onnxruntime reports what it cannot parse
        return False
    return any(n.op_type == "LayerNormalization" and len(n.input) > 2 and not n.input[2]
               for n in nodes)


def _onnxruntime(data: bytes, feeds: dict):
    """onnxruntime's outputs, or None where it does not accept the model or the inputs."""
    import onnxruntime as ort

    if _crashes_onnxruntime(data):
        return None

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, feeds)))
    except Exception:  # noqa: BLE001 - onnxruntime refusing the model is an answer
        return None


def _extreme(graph) -> bool:
    """Whether a constant holds NaN, an infinity or a huge value: then where non-finite
    results land depends on the order of operations (0 * NaN in a padded window: numpy gives
    NaN, onnxruntime's convolution skips padding), and so do integers made of them, which
    ONNX does not fix."""
    for a in graph.initializers.values():
        if a.dtype.kind == "f" and a.size and not (np.isfinite(a).all() and
                                                   np.abs(a).max() < 1e20):
            return True
    return False


def _huge_float_attribute(graph) -> bool:
    """Whether a float attribute is non-finite or huge (Resize's cubic_coeff_a = 1e30): the
    result is then a sum of huge terms that cancel, its value whatever the order and
    precision of the arithmetic leave (onnxruntime computes cubic weights in float32,
    celosia in float64); only shapes and types are compared."""
    for node in graph.nodes:
        for v in node.attrs.values():
            for x in (v if isinstance(v, list) else [v]):
                if isinstance(x, float) and not abs(x) < 1e20:
                    return True
    return False


def _draws(graph) -> bool:
    """Whether a node (in a body too) draws random numbers (ops_random.py): its values are
    not onnxruntime's (another generator), only shapes and types are compared."""
    return any(n.op in NONDETERMINISTIC or any(_draws(b) for _, b in subgraphs(n))
               for n in graph.nodes)


def _differs(ours: np.ndarray, theirs: np.ndarray, extreme: bool,
             values: bool = True) -> str | None:
    if ours.shape != theirs.shape:
        return f"shape {ours.shape} vs onnxruntime {theirs.shape}"
    if ours.dtype != theirs.dtype:
        return f"dtype {ours.dtype} vs onnxruntime {theirs.dtype}"
    if not values:
        return None
    if ours.dtype.kind in "biu":  # NaN or infinity made integer is unspecified
        return None if extreme or np.array_equal(ours, theirs) else "integer values differ"
    a, b = ours.astype(np.float64), theirs.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    if not extreme and (not np.array_equal(np.isnan(a), np.isnan(b)) or not np.array_equal(
            a[np.isinf(a)], b[np.isinf(a)])):
        return "NaN or infinity in different places"
    scale = float(np.abs(b[finite]).max()) if finite.any() else 0.0
    tol = 1e-3 if ours.dtype == np.float16 else 1e-4
    if not np.allclose(a[finite], b[finite], rtol=tol, atol=tol * max(scale, 1e-3)):
        return f"max |diff| {np.abs(a[finite] - b[finite]).max():.3g} (scale {scale:.3g})"
    return None


def check_case(data: bytes, input_shapes, seed: int, compare: bool = True) -> tuple[str, str]:
    """(outcome, failure text or ""): outcome is "rejected", "ran" or "compared"."""
    try:
        graph = import_onnx(data, input_shapes)
    except CelosiaError as e:
        text = str(e)
        if "\n" in text or not text:
            return "rejected", f"error is not one line: {text!r}"
        return "rejected", ""
    except Exception:  # noqa: BLE001 - the property under test
        return "crashed", "import_onnx raised " + traceback.format_exc(limit=-4)
    feeds = random_feeds(graph, seed)
    try:
        ours = run_graph(graph, feeds)
        error = None
    except CelosiaError as e:
        ours, error = None, e
    except Exception:  # noqa: BLE001
        return "crashed", "run_graph raised " + traceback.format_exc(limit=-4)
    if not compare:
        return "ran", ""
    theirs = _onnxruntime(data, feeds)
    if theirs is None:
        return "ran", ""
    if error is not None:
        return "crashed", f"run_graph failed ({error}) where onnxruntime ran"
    for name, value in ours.items():
        if name not in theirs:
            return "crashed", f"output {name!r} is not among onnxruntime's {list(theirs)}"
        why = _differs(np.asarray(value), np.asarray(theirs[name]), _extreme(graph),
                       values=not (_huge_float_attribute(graph) or _draws(graph)))
        if why:
            return "crashed", f"output {name!r} differs from onnxruntime: {why}"
    return "compared", ""
