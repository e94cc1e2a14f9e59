"""Models with dynamic input dims on the CPU: built per input shape from the arrays given
(CpuModel.open, `celosia run`), and every hint a wrong shape prints followed to success:
the command that rebuilds a .cel, the shape a static model takes, the --input-shape a
compile needs."""

import re
import shlex

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from celosia.cli import main
from celosia.compiler.graph.ir import InputShapeError
from celosia.runtime.accel import AccelModel
from celosia.runtime.cpu import CpuModel
from celosia.runtime.specialize import DynamicCpuModel

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def conv_model(shape):
    """Conv 3x3 (3 -> 8 channels, padded) then Relu; ``shape`` as the model declares x."""
    w = numpy_helper.from_array(
        np.random.default_rng(1).normal(size=(8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dyn")
    onnx.save(conv_model([-1, 3, -1, -1]), d / "paddle.onnx")   # as Paddle exports them
    onnx.save(conv_model([1, 3, 8, 8]), d / "static.onnx")
    rng = np.random.default_rng(0)
    for name, shape in (("a", (1, 3, 8, 12)), ("b", (2, 3, 8, 12)), ("c", (1, 3, 5, 7)),
                        ("s9", (1, 3, 9, 9))):
        np.save(d / f"{name}.npy", rng.normal(size=shape).astype(np.float32))
    np.savez(d / "a.npz", x=np.load(d / "a.npy"))
    return d


def onnxruntime_y(path, x):
    return ort.InferenceSession(str(path)).run(None, {"x": x})[0]


def command(message: str) -> list[str]:
    """The `celosia ...` command a message prints, as argv for main()."""
    return shlex.split(re.search(r"`celosia ([^`]*)`", message).group(1))


def one_line_error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---- a build per input shape ---------------------------------------------------------------


def test_open_builds_per_input_shape_and_keeps_a_bounded_cache(files):
    model = CpuModel.open(files / "paddle.onnx", max_builds=2)
    assert isinstance(model, DynamicCpuModel)
    assert model.input_types == {"x": ("float32", (None, 3, None, None))}
    a, b, c = (np.load(files / f"{n}.npy") for n in "abc")
    for x in (a, b, a, c, b):
        y = model.run({"x": x})["y"]
        np.testing.assert_allclose(y, onnxruntime_y(files / "paddle.onnx", x), rtol=1e-4,
                                   atol=1e-5)
    # a, b, (a cached), c drops b, b again: 4 builds made, the 2 latest kept.
    assert model.built == 4 and len(model.builds) == 2
    assert [dict(k)["x"] for k in model.builds] == [(1, 3, 5, 7), (2, 3, 8, 12)]
    report = model.report()
    assert report["builds"]["input_shapes"] == {"x": [2, 3, 8, 12]}
    # An array that contradicts a fixed dim says so and what fits.
    with pytest.raises(InputShapeError, match=r"the given shape \[1,4,8,8\] has 4 at dim 1 "
                                              r"where the model fixes 3"):
        model.run({"x": np.zeros((1, 4, 8, 8), np.float32)})


def test_run_takes_the_shape_from_the_arrays(files, capsys):
    out = files / "out.npz"
    assert main(["run", str(files / "paddle.onnx"), "--target", "cpu", "--input",
                 str(files / "a.npz"), "--output", str(out), "--compare", "onnxruntime"]) == 0
    text = capsys.readouterr().out
    assert "built " in text and "x: float32[1,3,8,12]" in text and "vs onnxruntime" in text and "OUTSIDE" not in text
    # The case: --input-shape for a [-1,3,?,?] input is taken, not refused.
    assert main(["compile", str(files / "paddle.onnx"), "--input-shape", "x=1,3,48,192",
                 "-o", str(files / "p48.cel")]) == 0


# ---- hints, followed ---------------------------------------------------------------------------


def test_compile_without_shapes_prints_a_shape_that_compiles(files, capsys):
    argv = ["compile", str(files / "paddle.onnx"), "-o", str(files / "p.cel")]
    err = one_line_error(argv, capsys)
    flags = re.findall(r"--input-shape \S+", err)
    assert flags and "'x' is [-1,3,-1,-1]" in err
    assert main(argv + shlex.split(" ".join(flags))) == 0


def test_a_cel_run_with_another_batch_prints_the_command_that_rebuilds_it(files, capsys):
    cel = files / "p8.cel"
    assert main(["compile", str(files / "paddle.onnx"), "--input-shape", "x=1,3,8,12", "-o",
                 str(cel)]) == 0
    assert CpuModel.load(cel).origin["inputs"] == {"x": ["-1", 3, "-1", "-1"]}
    run = ["run", str(cel), "--input", f"x={files / 'b.npy'}", "--output",
           str(files / "b_out.npz")]
    err = one_line_error(run, capsys)
    assert "'x' is [2,3,8,12], built for [1,3,8,12], declared [-1,3,-1,-1]" in err
    assert command(err) == ["compile", str(cel), "--input-shape", "x=2,3,8,12", "-o", str(cel)]
    assert main(command(err)) == 0          # the command, followed
    assert main(run) == 0                   # and the run it was for
    np.testing.assert_allclose(np.load(files / "b_out.npz")["y"],
                               onnxruntime_y(files / "paddle.onnx", np.load(files / "b.npy")),
                               rtol=1e-4, atol=1e-5)


def test_the_python_hint_rebuilds_the_model(files):
    model = CpuModel.build(files / "paddle.onnx", {"x": (1, 3, 8, 12)})
    c = np.load(files / "c.npy")
    with pytest.raises(InputShapeError, match=r"model\.rebuild\(\{'x': \(1, 3, 5, 7\)\}\)") as e:
        model.run({"x": c})
    assert f"`celosia compile {files / 'paddle.onnx'} --input-shape x=1,3,5,7" in str(e.value)
    shapes = eval(re.search(r"model\.rebuild\((\{.*?\})\)", str(e.value)).group(1))
    y = model.rebuild(shapes).run({"x": c})["y"]
    np.testing.assert_allclose(y, onnxruntime_y(files / "paddle.onnx", c), rtol=1e-4,
                               atol=1e-5)


def test_a_static_model_asks_for_its_shape_not_a_rebuild(files, capsys):
    err = one_line_error(["run", str(files / "static.onnx"), "--input",
                          str(files / "s9.npy")], capsys)
    assert "rebuild" not in err and "--input-shape" not in err
    shape = re.search(r"pass an array of shape \[([\d,]+)\]", err).group(1)
    np.save(files / "fits.npy", np.zeros([int(d) for d in shape.split(",")], np.float32))
    assert main(["run", str(files / "static.onnx"), "--input", str(files / "fits.npy")]) == 0
    # and a compile for another shape is refused with the one it takes
    err = one_line_error(["compile", str(files / "static.onnx"), "--input-shape",
                          "x=1,3,9,9", "-o", str(files / "s.cel")], capsys)
    flags = re.findall(r"--input-shape \S+", err)
    assert flags == ["--input-shape x=1,3,8,8"]
    assert main(["compile", str(files / "static.onnx"), *shlex.split(flags[0]), "-o",
                 str(files / "s.cel")]) == 0


def test_a_wrong_dtype_says_which(files):
    model = CpuModel.build(files / "static.onnx")
    with pytest.raises(InputShapeError, match=r"pass a float32 array \(numpy: "
                                              r"a\.astype\('float32'\)\)"):
        model.run({"x": np.zeros((1, 3, 8, 8), np.float64)})


def test_input_npz_names_its_arrays(files, capsys):
    np.savez(files / "bad.npz", x=np.load(files / "a.npy"), image=np.load(files / "a.npy"))
    err = one_line_error(["run", str(files / "paddle.onnx"), "--input",
                          str(files / "bad.npz")], capsys)
    assert "holds 'image', not inputs of the model (x)" in err


def test_accelerator_builds_take_shapes_from_the_data_and_hint_a_rebuild(files, capsys):
    np.savez(files / "calib.npz", x=np.random.default_rng(5).normal(
        size=(4, 3, 8, 12)).astype(np.float32))
    build = ["--target", "fsim", "--quantize", "int8", "--calibration", str(files / "calib.npz")]
    # No --input-shape: the [-1,3,-1,-1] model is built for the array given.
    assert main(["run", str(files / "paddle.onnx"), *build, "--input", str(files / "a.npy"),
                 "--compare", "cpu"]) == 0
    assert "identical" in capsys.readouterr().out
    cel = files / "acc.cel"
    compile_ = ["compile", str(files / "paddle.onnx"), *build, "-o", str(cel)]
    assert main(compile_) == 0  # shapes from the calibration samples: batch 1
    assert AccelModel.load(cel).graph.types["x"].shape == (1, 3, 8, 12)
    run = ["run", str(cel), "--target", "fsim", "--input", str(files / "b.npy")]
    err = one_line_error(run, capsys)
    flags = re.search(r"add (--input-shape \S+) to the `celosia compile` that built it",
                      err).group(1)
    assert flags == "--input-shape x=2,3,8,12"
    assert main(compile_ + shlex.split(flags)) == 0 and main(run) == 0


def test_a_cel_run_with_other_input_shapes_prints_the_command(files, capsys):
    cel = files / "p8b.cel"
    assert main(["compile", str(files / "paddle.onnx"), "--input-shape", "x=1,3,8,12", "-o",
                 str(cel)]) == 0
    same = ["run", str(cel), "--input-shape", "x=1,3,8,12", "--input", str(files / "a.npy")]
    assert main(same) == 0  # the shapes it was built for: nothing to do
    other = ["run", str(cel), "--input-shape", "x=1,3,5,7", "--input", str(files / "c.npy")]
    err = one_line_error(other, capsys)
    assert "built for other input shapes (x: float32[1,3,8,12])" in err
    assert main(command(err)) == 0 and main(other) == 0


# ---- a DynamicCpuModel as one .cel ---------------------------------------------------------


def test_a_dynamic_model_saves_as_one_cel_with_its_builds(files, capsys):
    model = CpuModel.open(files / "paddle.onnx", max_builds=3)
    a, b, c = (np.load(files / f"{n}.npy") for n in "abc")
    want = {n: model.run({"x": x})["y"] for n, x in (("a", a), ("b", b))}
    model.save(files / "dyn.cel")
    loaded = CpuModel.open(files / "dyn.cel")
    assert isinstance(loaded, DynamicCpuModel) and loaded.max_builds == 3
    assert [dict(k)["x"] for k in loaded.builds] == [(1, 3, 8, 12), (2, 3, 8, 12)]
    assert loaded.input_types == model.input_types
    for name, x in (("a", a), ("b", b)):  # the saved builds: nothing compiles
        np.testing.assert_array_equal(loaded.run({"x": x})["y"], want[name])
    assert loaded.built == 0
    # Another shape is built from the model the file keeps.
    np.testing.assert_allclose(loaded.run({"x": c})["y"], onnxruntime_y(files / "paddle.onnx", c),
                               rtol=1e-4, atol=1e-5)
    assert loaded.built == 1 and len(loaded.builds) == 3
    # Saved again (three builds) and run from the command line, another shape again.
    loaded.save(files / "dyn.cel")
    assert len(CpuModel.open(files / "dyn.cel").builds) == 3
    assert main(["run", str(files / "dyn.cel"), "--input", f"x={files / 's9.npy'}",
                 "--output", str(files / "s9_out.npz")]) == 0
    assert "built " in capsys.readouterr().out
    np.testing.assert_allclose(np.load(files / "s9_out.npz")["y"],
                               onnxruntime_y(files / "paddle.onnx", np.load(files / "s9.npy")),
                               rtol=1e-4, atol=1e-5)
    # Opened with a shape fixed: the build for it is kept, the others left out.
    fixed = CpuModel.open(files / "dyn.cel", {"x": (2, 3, 8, 12)})
    assert [dict(k)["x"] for k in fixed.builds] == [(2, 3, 8, 12)]
    np.testing.assert_array_equal(fixed.run({"x": b})["y"], want["b"])


def test_a_saved_build_the_model_does_not_take_is_an_artifact_error(files, tmp_path):
    from celosia.runtime.artifact import ArtifactError, write_artifact
    from celosia.runtime.specialize import FORMAT, VERSION

    def relu(shape):
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 10
        return m
    other = CpuModel.build(relu([2, 5]))  # the model says [-1, 4]
    manifest = {"format": FORMAT, "version": VERSION, "max_builds": 2, "fixed": {},
                "builds": ["builds/0.cel"]}
    write_artifact(tmp_path / "bad.cel", manifest, {
        "model.onnx": relu([-1, 4]).SerializeToString(), "builds/0.cel": other.to_bytes()})
    with pytest.raises(ArtifactError, match=r"bad\.cel: builds/0\.cel: built for 'x' "
                                            r"float32\[2,5\], which the model's "
                                            r"float32\[-1,4\] does not take"):
        CpuModel.open(tmp_path / "bad.cel")
    manifest["builds"] = ["kernels/x.o"]
    write_artifact(tmp_path / "bad.cel", manifest, {
        "model.onnx": relu([-1, 4]).SerializeToString(), "kernels/x.o": b""})
    with pytest.raises(ArtifactError, match=r"builds\[0\].* not 'builds/0\.cel'"):
        CpuModel.open(tmp_path / "bad.cel")
