"""Whole models built for the CPU (LLVM kernels + graph executor) against onnxruntime, the
.cel artifact, the memory plan, and bad inputs as clear errors."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from celosia.compiler.cpu import kernels as graph_cpu_kernels
from celosia.compiler.graph.ir import InputShapeError, ModelLoadError, UnsupportedOperatorError
from celosia.errors import CelosiaError
from celosia.models import zoo as models
from celosia.runtime.cpu import ArtifactError, CpuModel
from celosia.runtime.executor import plan_memory

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def onnxruntime_run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _close(got, want):
    # The bar: rtol 1e-4, plus an absolute term relative to the output's scale.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def compare(model, shape, seed=1):
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    built = CpuModel.build(model)
    (got,) = built.run({"image": x}).values()
    (want,) = onnxruntime_run(model, {"image": x})
    assert got.shape == want.shape and got.dtype == want.dtype
    _close(got, want)
    return built, got


def test_small_cnn():
    built, y = compare(models.small_cnn(batch=4), (4, 1, 8, 8))
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-5)
    kinds = {s["op"]: s["kind"] for s in built.program.steps}
    assert kinds["Conv"] == kinds["MaxPool"] == kinds["Gemm"] == "kernel"


@pytest.mark.parametrize("build", [models.resnet18, models.mobilenet_v2])
def test_imagenet_models_224(build):
    built, y = compare(build(image_size=224), (1, 3, 224, 224))
    assert y.std() > 0.1
    # The hot operators are compiled kernels; nothing falls back to numpy.
    assert {s["kind"] for s in built.program.steps} <= {"kernel", "view"}
    assert sum(s["op"] == "Conv" for s in built.program.steps) >= 20


def test_operators_without_kernels_fall_back_to_numpy():
    """A grouped conv, Concat of one block and of two (one converted), an average pool, Transpose, an Add
    broadcast along the last axis, Softmax: compiled where a kernel exists, numpy otherwise,
    and the whole agrees with onnxruntime."""
    rng = np.random.default_rng(0)

    def const(name, shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape,
                                  rng.normal(size=shape).astype(np.float32).ravel())
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"], group=4, kernel_shape=[1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["s"]),
        helper.make_node("Relu", ["c1"], ["r"]),
        helper.make_node("Concat", ["c1", "r"], ["cat1"], axis=1),  # one block: blocked copy
        helper.make_node("Concat", ["cat1", "s"], ["cat"], axis=1),  # blocks 8, 2: s repacked
        helper.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], count_include_pad=0),
        helper.make_node("Transpose", ["ap"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Add", ["t", "bias"], ["a"]),
        helper.make_node("Softmax", ["a"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 5, 24])],
        [const("w1", [8, 8, 3, 3]), const("w2", [8, 2, 1, 1]), const("b2", [8]),
         const("bias", [24])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = models.IR_VERSION
    x = rng.normal(size=(2, 8, 9, 9)).astype(np.float32)
    built = CpuModel.build(m)
    (got,) = built.run({"x": x}).values()
    _close(got, onnxruntime_run(m, {"x": x})[0])
    ops = {(s["op"], s["kind"]) for s in built.program.steps}
    # the NCHW -> NHWC Transpose of a blocked value: one numpy transpose of the blocked array
    assert ("Softmax", "kernel") in ops and ("Transpose", "numpy") in ops
    assert [s["kind"] for s in built.program.steps if s["op"] == "Concat"] == ["concat"] * 2
    assert ("AveragePool", "kernel") in ops and ("Relu", "kernel") in ops


# ---- memory plan -----------------------------------------------------------------------------


def test_memory_plan_reuses_buffers_and_never_overlaps_live_values():
    built = CpuModel.build(models.resnet18(image_size=64))
    program = built.program
    offsets, total, unshared = plan_memory(program)
    assert total < unshared / 2  # ResNet-18 keeps a few activations alive at a time
    size = {v: int(np.prod(program.values[v]["shape"])) * 4 for v in offsets}
    # Every step's inputs and outputs are distinct, non-overlapping memory.
    for step in program.steps:
        if step["kind"] == "view":
            continue
        live = [v for v in dict.fromkeys(step["inputs"] + step["outputs"]) if v in offsets]
        for i, a in enumerate(live):
            for b in live[:i]:
                assert offsets[a] + size[a] <= offsets[b] or offsets[b] + size[b] <= offsets[a]


# ---- the .cel artifact -------------------------------------------------------------------------


def test_cel_round_trip_loads_without_compiling(tmp_path, monkeypatch):
    m = models.mobilenet_v2(image_size=32)
    built = CpuModel.build(m)
    x = np.random.default_rng(2).normal(size=(1, 3, 32, 32)).astype(np.float32)
    want = built.run({"image": x})
    built.save(tmp_path / "m.cel")

    def no_compile(*a, **k):
        raise AssertionError("loading a .cel must not compile")
    monkeypatch.setattr(graph_cpu_kernels, "compile_spec", no_compile)
    monkeypatch.setattr(graph_cpu_kernels, "build_function", no_compile)
    monkeypatch.setattr("celosia.compiler.cpu.codegen._compile_object", no_compile)
    loaded = CpuModel.load(tmp_path / "m.cel")
    got = loaded.run({"image": x})
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert loaded.source == m.SerializeToString()


def test_warm_build_comes_from_the_kernel_cache():
    m = models.small_cnn()
    CpuModel.build(m)
    again = CpuModel.build(m)
    assert again.build_info["kernels_cached"] == again.build_info["kernels"]


def test_truncated_and_corrupt_cel(tmp_path):
    built = CpuModel.build(models.small_cnn())
    built.save(tmp_path / "m.cel")
    data = (tmp_path / "m.cel").read_bytes()
    (tmp_path / "cut.cel").write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=r"cut.cel: not a complete zip archive"):
        CpuModel.load(tmp_path / "cut.cel")
    i = data.index(b"kernels/") + 200  # flip bytes inside stored data: a CRC error
    (tmp_path / "bad.cel").write_bytes(data[:i] + bytes(64) + data[i + 64:])
    with pytest.raises(ArtifactError, match="bad.cel"):
        CpuModel.load(tmp_path / "bad.cel").run({"image": np.zeros((1, 1, 8, 8), np.float32)})
    with pytest.raises(ArtifactError, match="no such file"):
        CpuModel.load(tmp_path / "missing.cel")


def test_version_mismatch(tmp_path):
    import json
    import zipfile
    built = CpuModel.build(models.small_cnn())
    built.save(tmp_path / "m.cel")
    with zipfile.ZipFile(tmp_path / "m.cel") as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members["manifest.json"])
    manifest["version"] = 99
    members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(tmp_path / "v.cel", "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    with pytest.raises(ArtifactError, match="format version 99"):
        CpuModel.load(tmp_path / "v.cel")


# ---- bad inputs --------------------------------------------------------------------------------


def test_wrong_inputs_are_clear_errors():
    built = CpuModel.build(models.small_cnn())
    with pytest.raises(InputShapeError, match=r"'image' is float32\[1,1,28,28\].*"
                                              r"float32\[1,1,8,8\]"):
        built.run({"image": np.zeros((1, 1, 28, 28), np.float32)})
    with pytest.raises(InputShapeError, match=r"float64\[1,1,8,8\]"):
        built.run({"image": np.zeros((1, 1, 8, 8))})
    with pytest.raises(InputShapeError, match="unknown input 'img'"):
        built.run({"img": np.zeros((1, 1, 8, 8), np.float32)})
    with pytest.raises(InputShapeError, match="'image' .* was not given"):
        built.run({})


def test_bad_models_are_clear_errors(tmp_path):
    data = models.small_cnn().SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) - 300])
    with pytest.raises(ModelLoadError, match="cut.onnx"):
        CpuModel.open(tmp_path / "cut.onnx")
    m = models.small_cnn()
    for k, node in enumerate(m.graph.node):
        if node.op_type == "Softmax":
            m.graph.node[k].CopyFrom(helper.make_node(
                "StringNormalizer", node.input, node.output, name="head"))
    with pytest.raises(UnsupportedOperatorError,
                       match=r"StringNormalizer: 1 node \(.head.\)") as e:
        CpuModel.build(m)
    assert isinstance(e.value, CelosiaError)
