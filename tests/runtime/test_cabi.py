"""`celosia export`: a CPU build as lib<name>.so + <name>.h with a C ABI over DLPack tensors,
checked from a C program compiled with the system compiler and from Python (ctypes)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from celosia.cli import main
from celosia.models.registry import ZOO
from celosia.runtime.cabi import ExportError, Library, export_library, export_model, find_cc
from celosia.runtime.cpu import CpuModel

HERE = Path(__file__).parent


def conv_matmul_softmax(seed: int = 0) -> onnx.ModelProto:
    """x[2,3,8,8] -> Conv 3x3 (pad 1) -> Relu -> Flatten -> MatMul -> Add -> Softmax."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(4, 3, 3, 3)).astype(np.float32) * 0.3
    b = rng.normal(size=(4,)).astype(np.float32)
    m = rng.normal(size=(256, 10)).astype(np.float32) * 0.1
    c = rng.normal(size=(10,)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("Flatten", ["relu"], ["flat"]),
             helper.make_node("MatMul", ["flat", "m"], ["mm"]),
             helper.make_node("Add", ["mm", "c"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    graph = helper.make_graph(
        nodes, "conv_matmul_softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [2, 10])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (m, "m"), (c, "c"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The conv/matmul/softmax model exported with the CLI, and a C program linked to it."""
    root = tmp_path_factory.mktemp("cabi")
    model = conv_matmul_softmax()
    onnx.save(model, root / "net.onnx")
    assert main(["export", str(root / "net.onnx"), "--target", "cpu", "-o",
                 str(root / "out"), "--name", "net"]) == 0
    exe = _compile_program(root / "out", "net", root / "run_net")
    return {"root": root, "model": model, "out": root / "out", "exe": exe}


def _compile_program(out: Path, name: str, exe: Path) -> Path:
    cc = find_cc()
    subprocess.run([*cc, "-O1", "-std=c11", "-I", str(out), "-include", f"{name}.h",
                    str(HERE / "cabi" / "run_model.c"), "-L", str(out), f"-l{name}",
                    f"-Wl,-rpath,{out}", "-o", str(exe)], check=True, capture_output=True)
    return exe


def _run_program(exe: Path, work: Path, inputs: list, mode: str = "run"):
    work.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(inputs):
        (work / f"in{i}.bin").write_bytes(np.ascontiguousarray(a).tobytes())
    return subprocess.run([str(exe), str(work), mode], capture_output=True, text=True)


def _relative(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def test_c_program_matches_onnxruntime(built):
    x = np.random.default_rng(1).normal(size=(2, 3, 8, 8)).astype(np.float32)
    r = _run_program(built["exe"], built["root"] / "run1", [x])
    assert r.returncode == 0, r.stderr
    assert "net: 1 inputs, 1 outputs, ok" in r.stdout
    y = np.frombuffer((built["root"] / "run1" / "out0.bin").read_bytes(), np.float32)
    want = ort.InferenceSession(built["model"].SerializeToString()).run(None, {"x": x})[0]
    assert y.shape == (20,)
    assert _relative(y.reshape(2, 10), want) < 1e-5
    assert np.allclose(y.reshape(2, 10).sum(1), 1, atol=1e-5)


def test_c_program_wrong_shape_and_count(built):
    x = np.zeros((2, 3, 8, 8), np.float32)
    r = _run_program(built["exe"], built["root"] / "run2", [x], "wrong_shape")
    assert r.returncode != 0
    assert "input 0 (x) has shape [3, 3, 8, 8]; the model takes shape [2, 3, 8, 8]" in r.stderr
    r = _run_program(built["exe"], built["root"] / "run3", [x], "wrong_count")
    assert r.returncode != 0
    assert "takes 1 input tensors, given 0" in r.stderr


def test_files_and_exports(built):
    out = built["out"]
    assert sorted(p.name for p in out.iterdir()) == ["dlpack.h", "libnet.so", "net.h"]
    header = (out / "net.h").read_text()
    assert "int celosia_run(const DLTensor *inputs, int num_inputs, DLTensor *outputs, " \
           "int num_outputs);" in header
    assert "input  0: x  float32[2, 3, 8, 8]" in header
    assert "DLPACK_MAJOR_VERSION 1" in (out / "dlpack.h").read_text()
    exported = subprocess.run(["nm", "-D", "--defined-only", str(out / "libnet.so")],
                              capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in exported.splitlines() if line.strip()}
    assert {"celosia_run", "celosia_num_inputs", "celosia_num_outputs",
            "celosia_last_error"} <= names
    assert not any("seg" in n or n.startswith("__celosia") for n in names)  # kernels stay inside
    deps = subprocess.run(["ldd", str(out / "libnet.so")], capture_output=True, text=True).stdout
    assert "python" not in deps.lower()


def test_ctypes_numpy_and_torch(built):
    torch = pytest.importorskip("torch")
    lib = Library(built["out"] / "libnet.so")
    assert lib.name == "net"
    assert lib.inputs == [("x", "float32", (2, 3, 8, 8))]
    assert lib.outputs == [("probs", "float32", (2, 10))]
    x = np.random.default_rng(2).normal(size=(2, 3, 8, 8)).astype(np.float32)
    want = CpuModel.build(built["model"]).run({"x": x})["probs"]
    (y,) = lib.run(x)
    np.testing.assert_array_equal(y, want)  # the same kernels, the same bits
    t = torch.from_numpy(x.copy())
    out = torch.empty(2, 10)
    lib.run(t, out=[out])  # through the tensors' __dlpack__ capsules
    np.testing.assert_array_equal(out.numpy(), want)


def test_ctypes_errors(built):
    lib = Library(built["out"] / "libnet.so")
    x = np.zeros((2, 3, 8, 8), np.float32)
    y = np.empty((2, 10), np.float32)
    cases = [
        ([x.astype(np.float64)], [y], "input 0 (x) has dtype float64; the model takes float32"),
        ([np.zeros((2, 3, 8), np.float32)], [y],
         "input 0 (x) has 3 dimensions; the model takes shape [2, 3, 8, 8]"),
        ([np.zeros((2, 3, 8, 16), np.float32)[..., ::2]], [y],
         "input 0 (x) has strides [384, 128, 16, 2] (in elements), not C-contiguous"),
        ([x], [np.empty((10, 2), np.float32)], "output 0 (probs) has shape [10, 2]"),
        ([x, x], [y], "takes 1 input tensors, given 2"),
        ([x], [], "gives 1 output tensors, given 0"),
    ]
    for ins, outs, message in cases:
        assert lib.call(ins, outs) != 0
        assert message in lib.last_error, lib.last_error
    with pytest.raises(ExportError, match="libnet: celosia_run: input 0"):
        lib.run(np.zeros((1, 3, 8, 8), np.float32))
    assert lib.call([x], [y]) == 0 and lib.last_error == ""


def test_null_data_and_device(built):
    from celosia.runtime.cabi import dltensor

    lib = Library(built["out"] / "libnet.so")
    x, y = np.zeros((2, 3, 8, 8), np.float32), np.empty((2, 10), np.float32)
    import ctypes
    from celosia.runtime.cabi import DLTensor
    tx, keep_x = dltensor(x)
    ty, keep_y = dltensor(y)
    for change, message in ((lambda t: setattr(t, "data", None), "input 0 (x): data is NULL"),
                            (lambda t: setattr(t.device, "device_type", 2),
                             "is on device type 2; this library runs on the CPU")):
        t = DLTensor.from_buffer_copy(tx)
        change(t)
        rc = lib.lib.celosia_run((DLTensor * 1)(t), 1, (DLTensor * 1)(ty), 1)
        assert rc != 0 and message in lib.last_error
    assert lib.lib.celosia_run(None, 1, (DLTensor * 1)(ty), 1) != 0
    assert "inputs is NULL" in lib.last_error
    assert ctypes.sizeof(DLTensor) == 48  # dlpack.h's layout on 64-bit hosts
    del keep_x, keep_y


def test_threads_share_the_library(built):
    """Calls from several threads at once (serialised inside) each get their own result."""
    lib = Library(built["out"] / "libnet.so")
    model = CpuModel.build(built["model"])
    xs = [np.random.default_rng(10 + k).normal(size=(2, 3, 8, 8)).astype(np.float32)
          for k in range(4)]
    want = [model.run({"x": x})["probs"] for x in xs]
    got: dict = {}

    def work(k):
        for _ in range(20):
            got[k] = lib.run(xs[k])[0]
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        np.testing.assert_array_equal(got[k], want[k])


def test_zoo_small_cnn_from_c(tmp_path):
    entry = ZOO["small_cnn"]
    model = entry.model("small")
    feeds = entry.make_feeds("small", seed=3)
    onnx.save(model, tmp_path / "small_cnn.onnx")
    info = export_model(tmp_path / "small_cnn.onnx", tmp_path / "out")
    assert Path(info["library"]).name == "libsmall_cnn.so"
    exe = _compile_program(tmp_path / "out", "small_cnn", tmp_path / "run")
    r = _run_program(exe, tmp_path / "work", [feeds["image"]])
    assert r.returncode == 0, r.stderr
    y = np.frombuffer((tmp_path / "work" / "out0.bin").read_bytes(), np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    assert _relative(y.reshape(want.shape), want) < entry.tolerance


def test_int8_build_is_bit_exact_with_the_cpu_int8_build(tmp_path):
    from celosia.runtime.accel import AccelModel

    entry = ZOO["small_cnn"]
    model = entry.model("small")
    rng = np.random.default_rng(4)
    np.savez(tmp_path / "cal.npz", image=rng.normal(size=(2, 4, 1, 8, 8)).astype(np.float32))
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["export", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"), "--name",
                 "q", "--quantize", "int8", "--calibration", str(tmp_path / "cal.npz")]) == 0
    reference = AccelModel.from_onnx(tmp_path / "m.onnx", calibration=str(tmp_path / "cal.npz"),
                                     target="cpu").cpu_build()
    ops = {s["op"] for s in reference.segments[0][1].program.steps if s["kind"] == "kernel"}
    assert {"QConv", "QGemm"} <= ops  # integer kernels
    lib = Library(tmp_path / "out" / "libq.so")
    for k in range(3):
        x = rng.normal(size=(4, 1, 8, 8)).astype(np.float32)
        (y,) = lib.run(x)
        want = reference.run({"image": x})
        np.testing.assert_array_equal(y, want[lib.outputs[0][0]])


def test_unsupported_steps_are_named(tmp_path):
    entry = ZOO["control_flow"]
    model = entry.model("small")
    shapes = {k: v.shape for k, v in entry.make_feeds("small").items()}
    with pytest.raises(ExportError) as e:
        export_library(CpuModel.build(model, shapes), tmp_path, "cf")
    text = str(e.value)
    assert "node 'Loop_7' (Loop): control flow" in text
    assert "node 'Equal_8' (Equal): runs as a numpy step" in text
    assert "celosia run" in text
    assert not (tmp_path / "libcf.so").exists()


def test_bad_name_target_and_compiler(built, tmp_path, monkeypatch, capsys):
    model = CpuModel.build(built["model"])
    with pytest.raises(ExportError, match="must be a C identifier"):
        export_library(model, tmp_path, "9lives")
    assert main(["export", str(built["root"] / "net.onnx"), "--target", "fsim", "-o",
                 str(tmp_path)]) == 2
    assert "a library holds CPU code only" in capsys.readouterr().err
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(ExportError, match=r"\$CC is '/nonexistent/cc', which is not a program"):
        export_library(model, tmp_path, "net")


def _data_movement_model():
    """Gather (run-time indices) -> Concat with a constant -> Transpose -> Slice (negative
    step) -> Split; Cast of the indices; a constant output."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("Concat", ["extra", "emb"], ["cat"], axis=1),
        helper.make_node("Transpose", ["cat"], ["tr"], perm=[0, 2, 1]),
        helper.make_node("Slice", ["tr", "st", "en", "ax", "sp"], ["sl"]),
        helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
        helper.make_node("Split", ["sl"], ["s1", "s2"], axis=1, num_outputs=2),
        helper.make_node("Expand", ["bias", "eshape"], ["ex"]),
    ]
    arrays = {"table": rng.normal(size=(20, 6)).astype(np.float32),
              "extra": rng.normal(size=(2, 1, 6)).astype(np.float32),
              "st": np.array([5, 0], np.int64), "en": np.array([-7, 100], np.int64),
              "ax": np.array([2, 0], np.int64), "sp": np.array([-2, 1], np.int64),
              "bias": np.arange(3, dtype=np.float32), "eshape": np.array([2, 1, 3], np.int64)}
    outs = [("s1", [2, 3, 3]), ("s2", [2, 3, 3]), ("idsf", [2, 5]), ("ex", [2, 1, 3])]
    graph = helper.make_graph(
        nodes, "moves", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outs],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_numpy_steps_of_data_movement(tmp_path):
    """Gather, Concat, Cast, Split (numpy steps in the CPU build) run in C, exactly."""
    model = _data_movement_model()
    cpu = CpuModel.build(model)
    numpy_ops = {s["op"] for s in cpu.program.steps if s["kind"] == "numpy"}
    assert {"Gather", "Concat", "Cast", "Split"} <= numpy_ops
    lib = Library(export_library(cpu, tmp_path, "moves")["library"])
    session = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(5)
    for _ in range(3):
        ids = rng.integers(-20, 20, size=(2, 5)).astype(np.int64)  # negative ones wrap
        outs = lib.run(ids)
        want, ours = session.run(None, {"ids": ids}), cpu.run({"ids": ids})
        for (name, _, _), y, w in zip(lib.outputs, outs, want):
            np.testing.assert_array_equal(y, w)
            np.testing.assert_array_equal(y, ours[name])
    ids[1, 3] = 20
    assert lib.call([ids], [np.empty(s, d) for _, d, s in lib.outputs]) != 0
    assert "node Gather_0 (Gather): index 20 is out of range for an axis of 20 " \
           "(valid: -20 to 19)" in lib.last_error


def test_zoo_lstm_exports_bit_exact(tmp_path):
    pytest.importorskip("torch")
    entry = ZOO["lstm"]
    feeds = entry.make_feeds("small", seed=2)
    cpu = CpuModel.build(entry.model("small"), {k: v.shape for k, v in feeds.items()})
    lib = Library(export_library(cpu, tmp_path, "lstm")["library"])
    outs = lib.run(*[feeds[n] for n, _, _ in lib.inputs])
    ref = cpu.run(feeds)
    for (name, _, _), y in zip(lib.outputs, outs):
        np.testing.assert_array_equal(y, ref[name])


TWO_MODELS_C = r"""
#include <stdio.h>
#include "a.h"
#include "b.h"
int main(void) {
  static float x[2 * 3 * 8 * 8], pa[20], pb[20];
  for (int i = 0; i < 2 * 3 * 64; i++) x[i] = (float)(i % 11) / 11.0f;
  int64_t s_in[] = {2, 3, 8, 8}, s_out[] = {2, 10};
  DLTensor in = {.data = x, .device = {kDLCPU, 0}, .ndim = 4, .dtype = {kDLFloat, 32, 1},
                 .shape = s_in};
  DLTensor oa = {.data = pa, .device = {kDLCPU, 0}, .ndim = 2, .dtype = {kDLFloat, 32, 1},
                 .shape = s_out};
  DLTensor ob = oa;
  ob.data = pb;
  if (a_run(&in, 1, &oa, 1) || b_run(&in, 1, &ob, 1)) return 1;
  for (int i = 0; i < 20; i++) printf("%.9g %.9g\n", pa[i], pb[i]);
  fprintf(stderr, "%s %s %d\n", a_model_name(), b_model_name(), A_NUM_OUTPUTS);
  return 0;
}
"""


def test_two_models_in_one_program(tmp_path):
    """Each library also exports the API under its own name (<name>_run, ...), so one
    program links two exported models; the kernels' symbols never clash."""
    m1, m2 = conv_matmul_softmax(seed=0), conv_matmul_softmax(seed=1)
    for model, name in ((m1, "a"), (m2, "b")):
        export_library(CpuModel.build(model), tmp_path, name)
    (tmp_path / "two.c").write_text(TWO_MODELS_C)
    subprocess.run([*find_cc(), "-std=c11", str(tmp_path / "two.c"), "-I", str(tmp_path),
                    "-L", str(tmp_path), "-la", "-lb", f"-Wl,-rpath,{tmp_path}", "-o",
                    str(tmp_path / "two")], check=True, capture_output=True)
    r = subprocess.run([str(tmp_path / "two")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip() == "a b 1"
    got = np.array([[float(v) for v in line.split()] for line in r.stdout.splitlines()])
    x = (np.arange(2 * 3 * 64) % 11 / np.float32(11)).astype(np.float32).reshape(2, 3, 8, 8)
    for k, model in enumerate((m1, m2)):
        want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        assert _relative(got[:, k].reshape(2, 10), want) < 1e-5
    assert not np.allclose(got[:, 0], got[:, 1])  # two different models really ran


def test_constant_outputs_and_an_input_as_output(tmp_path):
    from onnx_builders import onnxruntime_run

    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Relu", ["x"], ["relu"]),
             helper.make_node("Add", ["shape", "shape"], ["twice"])]
    graph = helper.make_graph(
        nodes, "constant_outputs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_empty_tensor_value_info(o) for o in ("shape", "relu", "twice", "table", "x")],
        [numpy_helper.from_array(np.arange(5, dtype=np.int64), "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    lib = Library(export_library(CpuModel.build(model), tmp_path, "c")["library"])
    x = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    want = onnxruntime_run(model, {"x": x})
    for (name, _, _), y in zip(lib.outputs, lib.run(x)):
        np.testing.assert_array_equal(y, want[name])


def test_export_from_a_cel(built, tmp_path, capsys):
    cel = tmp_path / "net.cel"
    assert main(["compile", str(built["root"] / "net.onnx"), "-o", str(cel)]) == 0
    assert main(["export", str(cel), "-o", str(tmp_path / "out")]) == 0
    assert "wrote " + str(tmp_path / "out" / "libnet.so") in capsys.readouterr().out
    lib = Library(tmp_path / "out" / "libnet.so")
    x = np.random.default_rng(9).normal(size=(2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(lib.run(x)[0], CpuModel.load(cel).run({"x": x})["probs"])


def _float_ops_model():
    """Float32 operators the CPU build may run as numpy steps: reductions, Softmax on a
    middle axis, broadcasting binaries, transcendental unaries."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("Softmax", ["centred"], ["sm"], axis=1),
        helper.make_node("Tanh", ["x"], ["t"]),
        helper.make_node("Mul", ["t", "scale"], ["ts"]),
        helper.make_node("Erf", ["ts"], ["e"]),
        helper.make_node("Max", ["e", "sm"], ["mx"]),
        helper.make_node("ReduceMax", ["mx", "axes2"], ["rmax"], keepdims=0),
        helper.make_node("ReduceSum", ["x", "axes2"], ["rsum"], keepdims=0),
        helper.make_node("Div", ["rmax", "rsum"], ["ratio"]),
        helper.make_node("Sigmoid", ["ratio"], ["out"]),
    ]
    inits = [numpy_helper.from_array(np.array([2], np.int64), "axes"),
             numpy_helper.from_array(np.array([0, 2], np.int64), "axes2"),
             numpy_helper.from_array(rng.normal(size=(1, 5)).astype(np.float32), "scale")]
    graph = helper.make_graph(
        nodes, "float_ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("sm", TensorProto.FLOAT, [2, 3, 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_float_numpy_steps_within_float_rounding(tmp_path):
    """Float32 numpy steps run in C (libm, double sums): equal to onnxruntime within float
    rounding, not bit for bit with numpy."""
    model = _float_ops_model()
    cpu = CpuModel.build(model)
    lib = Library(export_library(cpu, tmp_path, "f")["library"])
    session = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(6)
    for _ in range(3):
        x = rng.normal(size=(2, 3, 5)).astype(np.float32)
        for (name, _, _), y, w in zip(lib.outputs, lib.run(x), session.run(None, {"x": x})):
            assert _relative(y, w) < 1e-5, name


def test_zoo_bert_exports(tmp_path):
    """The BERT encoder: Gather (embeddings), Cast, Tanh (pooler) in C, the rest kernels."""
    pytest.importorskip("torch")
    entry = ZOO["bert"]
    feeds = entry.make_feeds("small", seed=4)
    model = entry.model("small")
    cpu = CpuModel.build(model, {k: v.shape for k, v in feeds.items()})
    assert {"Gather", "Cast", "Tanh"} <= {s["op"] for s in cpu.program.steps
                                          if s["kind"] == "numpy"}
    lib = Library(export_library(cpu, tmp_path, "bert")["library"])
    outs = lib.run(*[feeds[n] for n, _, _ in lib.inputs])
    session = ort.InferenceSession(model.SerializeToString())
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    for (name, _, _), y in zip(lib.outputs, outs):
        assert _relative(y, want[name]) < entry.tolerance, name


def test_broadcasting_numpy_steps(tmp_path):
    """Binary and unary float32 numpy steps with numpy broadcasting (a program written
    directly: the lowering compiles these as kernels when it can)."""
    from celosia.compiler.cpu.lowering import CpuProgram

    f32 = "float32"
    values = {"a": {"dtype": f32, "shape": [2, 3, 4]}, "b": {"dtype": f32, "shape": [3, 1]},
              "d": {"dtype": f32, "shape": [2, 3, 4]}, "p": {"dtype": f32, "shape": [2, 3, 4]},
              "m": {"dtype": f32, "shape": [2, 3, 4]}, "y": {"dtype": f32, "shape": [2, 3, 4]}}
    c = np.linspace(0.5, 2.0, 4, dtype=np.float32)

    def step(op, ins, out):
        return {"kind": "numpy", "node": f"{op}_{out}", "op": op, "inputs": ins,
                "outputs": [out], "attrs": {}}
    steps = [step("Sub", ["a", "b"], "d"), step("Abs", ["d"], "p"),
             step("Pow", ["p", "c"], "m"), step("Min", ["m", "b"], "y")]
    program = CpuProgram("direct", ["a", "b"], ["y", "d"], values, {"c": c}, steps, {})
    cpu = CpuModel(program)
    lib = Library(export_library(cpu, tmp_path, "direct")["library"])
    rng = np.random.default_rng(8)
    a = rng.normal(size=(2, 3, 4)).astype(np.float32)
    b = rng.normal(size=(3, 1)).astype(np.float32)
    want = cpu.run({"a": a, "b": b})
    y, d = lib.run(a, b)
    np.testing.assert_array_equal(d, want["d"])  # + - * / are exact in float32 as in numpy
    np.testing.assert_allclose(y, want["y"], rtol=1e-6)


def test_odd_value_names(tmp_path):
    """Value names are data in the library (strings, comments), whatever they hold."""
    odd_in, odd_out = 'x:0/é "q"', "y*/z\\n??/"
    graph = helper.make_graph(
        [helper.make_node("Relu", [odd_in], [odd_out])], "odd",
        [helper.make_tensor_value_info(odd_in, TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info(odd_out, TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    export_library(CpuModel.build(model), tmp_path, "odd")
    _compile_program(tmp_path, "odd", tmp_path / "run")  # the header compiles
    lib = Library(tmp_path / "libodd.so")
    assert lib.inputs == [(odd_in, "float32", (3,))] and lib.outputs[0][0] == odd_out
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    np.testing.assert_array_equal(lib.run(x)[0], np.maximum(x, 0))
    assert lib.call([np.zeros(4, np.float32)], [np.empty(3, np.float32)]) != 0
    assert f"input 0 ({odd_in}) has shape [4]" in lib.last_error


def test_accelerator_build_is_refused(tmp_path):
    from celosia.runtime.accel import AccelModel

    entry = ZOO["small_cnn"]
    onnx.save(entry.model("small"), tmp_path / "m.onnx")
    cal = {"image": np.random.default_rng(1).normal(size=(2, 4, 1, 8, 8)).astype(np.float32)}
    accel = AccelModel.from_onnx(tmp_path / "m.onnx", calibration=cal, target="fsim")
    assert accel.programs  # layers on the accelerator
    accel.save(tmp_path / "m.cel")
    with pytest.raises(ExportError, match="is an accelerator build: a library holds CPU code "
                                          "only"):
        export_model(tmp_path / "m.cel", tmp_path / "out")
    accel.cpu_build().save(tmp_path / "cpu.cel")  # the all-CPU int8 build exports
    info = export_model(tmp_path / "cpu.cel", tmp_path / "out", "q")
    x = np.random.default_rng(2).normal(size=(4, 1, 8, 8)).astype(np.float32)
    (y,) = Library(info["library"]).run(x)
    np.testing.assert_array_equal(y, accel.run({"image": x}, target="fsim")[accel.graph.outputs[0]])


_THREADED_RUN = r"""
import sys, threading
import numpy as np
from celosia.runtime.cabi import Library
import os
lib = Library(sys.argv[1])
x, want = np.load(sys.argv[2]), np.load(sys.argv[3])
before = len(os.listdir("/proc/self/task"))
lib.run(x)
workers = len(os.listdir("/proc/self/task")) - before
bad = []
def work():
    for _ in range(10):
        if not np.array_equal(lib.run(x)[0], want):
            bad.append(1)
threads = [threading.Thread(target=work) for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
print(f"ok {workers}" if not bad else f"{len(bad)} runs differ")
"""


def test_parallel_loops_in_the_library(tmp_path):
    """A convolution big enough to split runs its parallel loops on the library's worker
    threads ($CELOSIA_NUM_THREADS); results equal the Python build's for any thread count,
    with callers on several threads, and the process exits cleanly (the workers are
    joined when the library is unloaded). In a subprocess, under a timeout."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(32, 16, 3, 3)).astype(np.float32) * 0.1
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "big_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 64, 64])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    cpu = CpuModel.build(model)
    info = export_library(cpu, tmp_path, "big")
    x = rng.normal(size=(1, 16, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", cpu.run({"x": x})["y"])
    (tmp_path / "run.py").write_text(_THREADED_RUN)
    import os
    import sys
    for threads, workers in (("1", 0), ("3", 2)):
        r = subprocess.run([sys.executable, str(tmp_path / "run.py"), info["library"],
                            str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "CELOSIA_NUM_THREADS": threads})
        assert r.returncode == 0 and r.stdout.strip() == f"ok {workers}", \
            (threads, r.stdout, r.stderr)
