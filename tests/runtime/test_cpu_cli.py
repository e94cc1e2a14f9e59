"""`celosia compile` and `celosia run --target cpu`: end to end, and bad inputs as one-line
errors (exit 2, no traceback)."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from celosia.cli import main
from celosia.models import zoo as models

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    onnx.save(models.mobilenet_v2(image_size=32), d / "m.onnx")
    x = np.random.default_rng(0).normal(size=(1, 3, 32, 32)).astype(np.float32)
    np.save(d / "x.npy", x)
    np.save(d / "small.npy", x[:, :, :16, :16].copy())
    return d


def test_compile_then_run_with_report_and_compare(files, capsys):
    cel, out, report = files / "m.cel", files / "out.npz", files / "r.json"
    assert main(["compile", str(files / "m.onnx"), "--target", "cpu", "-o", str(cel)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["run", str(cel), "--target", "cpu", "--input", f"image={files / 'x.npy'}",
                 "--output", str(out), "--report", str(report), "--compare",
                 "onnxruntime"]) == 0
    text = capsys.readouterr().out
    assert "of its scale" in text and "within (tolerance 0.0001 of the scale)" in text
    outputs = np.load(out)
    onnx_outputs = [o.name for o in onnx.load(files / "m.onnx").graph.output]
    assert list(outputs.keys()) == onnx_outputs  # keyed by the ONNX names
    r = json.loads(report.read_text())
    assert r["compare"]["within_tolerance"]
    # Conv is about 3x the dense layer here; one preemption of a busy machine can swap them
    assert r["summary"]["total_ms"] > 0 \
        and "Conv" in [t["op"] for t in r["summary"]["top_ops"][:2]]
    assert {"node", "op", "kind", "ms", "shape"} <= set(r["nodes"][0])
    # Running the ONNX file directly (built on the fly) gives the same outputs.
    assert main(["run", str(files / "m.onnx"), "--input", str(files / "x.npy"), "--output",
                 str(files / "out2.npz")]) == 0
    np.testing.assert_array_equal(np.load(files / "out2.npz")[onnx_outputs[0]],
                                  outputs[onnx_outputs[0]])


def test_progress_prints_a_line_per_node(files, capsys):
    assert main(["run", str(files / "m.onnx"), "--input", str(files / "x.npy"),
                 "--progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("Conv") >= 52 and "ms" in err


def _error(argv, capsys, match):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert match in err, err
    return err


def test_bad_inputs_are_one_line_errors(files, tmp_path, capsys):
    onnx_path = str(files / "m.onnx")
    x = f"image={files / 'x.npy'}"
    data = (files / "m.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    _error(["run", str(tmp_path / "cut.onnx"), "--input", x], capsys, "cut.onnx")
    _error(["compile", str(tmp_path / "cut.onnx"), "-o", str(tmp_path / "c.cel")], capsys,
           "cut.onnx")
    main(["compile", onnx_path, "-o", str(tmp_path / "m.cel")])
    capsys.readouterr()
    cel = (tmp_path / "m.cel").read_bytes()
    (tmp_path / "cut.cel").write_bytes(cel[: len(cel) // 3])
    _error(["run", str(tmp_path / "cut.cel"), "--input", x], capsys, "truncated or corrupt")
    _error(["run", onnx_path, "--input", f"image={files / 'small.npy'}"], capsys,
           "float32[1,3,16,16] but the model was built for float32[1,3,32,32]")
    _error(["run", onnx_path, "--input", f"picture={files / 'x.npy'}"], capsys,
           "unknown input 'picture'")
    _error(["run", onnx_path], capsys, "input 'image' (float32[1,3,32,32]) was not given")
    _error(["run", onnx_path, "--input", "image=nope.npy"], capsys, "no such file")
    _error(["run", onnx_path, "--target", "fsim", "--input", x], capsys,
           "the accelerator runs int8 models: quantize this float model with --quantize "
           "int8 --calibration DATA.npz")
    _error(["compile", onnx_path, "--input-shape", "image=1,x", "-o", "y.cel"], capsys,
           "--input-shape")
    m = models.small_cnn()
    for k, node in enumerate(m.graph.node):
        if node.op_type == "Softmax":
            m.graph.node[k].CopyFrom(helper.make_node(
                "StringNormalizer", node.input, node.output, name="head"))
    onnx.save(m, tmp_path / "hard.onnx")
    _error(["compile", str(tmp_path / "hard.onnx"), "-o", str(tmp_path / "h.cel")], capsys,
           "StringNormalizer: 1 node ('head')")


def test_the_installed_command_exits_2_without_traceback(files, tmp_path):
    (tmp_path / "cut.cel").write_bytes(b"PK\x03\x04" + bytes(100))
    r = subprocess.run([sys.executable, "-m", "celosia.cli", "run", str(tmp_path / "cut.cel"),
                        "--input", str(files / "x.npy")], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("celosia run: error:") and "cut.cel" in r.stderr
