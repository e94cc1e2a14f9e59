"""`celosia compile` / `celosia run` for the accelerator targets and int8 builds, and the demo."""

import json

import numpy as np
import pytest

from celosia.cli import main
from celosia.models import digits

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("digits")
    split = digits.load_split()
    calib, _ = split["calibration"]
    x, y = split["test"]
    np.savez(d / "calib.npz", image=calib)
    np.save(d / "x.npy", x[:8])
    np.save(d / "y.npy", y[:8])
    return d


def test_compile_then_run_on_the_cycle_model_with_everything(files, capsys):
    cel = files / "digits.cel"
    assert main(["compile", str(digits.model_path()), "--target", "fsim", "--quantize", "int8",
                 "--calibration", str(files / "calib.npz"), "--input-shape", "image=8,1,8,8",
                 "-o", str(cel)]) == 0
    out = capsys.readouterr().out
    # three convolutions, the Flatten (a view of the third's packed output) and the dense
    assert "5 on the accelerator in 1 regions" in out
    report, timeline, outputs = files / "r.json", files / "t.png", files / "o.npz"
    assert main(["run", str(cel), "--target", "cycle", "--input", f"image={files / 'x.npy'}",
                 "--compare", "cpu,onnxruntime", "--report", str(report), "--timeline",
                 str(timeline), "--output", str(outputs), "--progress"]) == 0
    captured = capsys.readouterr()
    assert "vs the all-CPU build of the same quantized graph: identical" in captured.out
    assert "vs onnxruntime (float): probs: max |diff|" in captured.out
    assert "Softmax left in float: the quantizer has no int8 form" in captured.out  # the table says why
    assert "[5/8]" in captured.err  # one progress line per node
    r = json.loads(report.read_text())
    assert r["summary"]["cycles"] > 0 and r["compare"]["cpu"]["outputs"]["probs"]["differing"] == 0
    # --report: the table and the summary are the warm (second) run's; the cold one, the
    # process's first inference, is reported beside it, and the line says which is which
    runs = r["runs"]
    assert runs["timed"] == "warm" and runs["warm"]["latency_ms"] == r["summary"]["latency_ms"]
    assert runs["cold"]["wall_s"] > 0 and runs["cold"]["latency_ms"] > 0
    assert runs["cold"]["accel_ms"] == runs["warm"]["accel_ms"]  # the same cycles
    assert (f"the table is the warm run (the second): latency "
            f"{runs['warm']['latency_ms']:.3f} ms") in captured.out
    assert f"cold (the process's first run): latency {runs['cold']['latency_ms']:.3f} ms" \
        in captured.out
    # utilisation counts the model's own multiply-adds: conv1 reads 1 channel, its 3x3
    # windows packed by the runtime as 9 channels of one block of 16 (compiler/accel/im2col.py)
    c1 = next(n for n in r["nodes"] if n["node"] == "conv1")
    assert c1["macs"] == 8 * 16 * 8 * 8 * 9 and c1["gemm_macs"] == 16 * c1["macs"] // 9
    assert c1["padding_overhead"] == pytest.approx(c1["gemm_macs"] / c1["macs"] - 1)
    assert c1["utilization"] == pytest.approx(c1["macs"] / (c1["cycles"] * 256))
    assert {n["target"] for n in r["nodes"]} == {"accel", "cpu"}
    assert timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.load(outputs)["probs"].shape == (8, 10)


def test_run_onnx_directly_on_fsim_and_all_cpu_int8(files, capsys):
    args = ["--quantize", "int8", "--calibration", str(files / "calib.npz"),
            "--input-shape", "image=8,1,8,8", "--input", f"image={files / 'x.npy'}"]
    assert main(["run", str(digits.model_path()), "--target", "fsim", *args,
                 "--output", str(files / "a.npz")]) == 0
    assert main(["run", str(digits.model_path()), "--target", "cpu", *args,
                 "--output", str(files / "c.npz")]) == 0
    a, c = np.load(files / "a.npz"), np.load(files / "c.npz")
    np.testing.assert_array_equal(a["probs"], c["probs"])
    out = capsys.readouterr().out
    assert "all-CPU build" in out  # the int8 CPU build's table gives the reason


def test_accelerator_targets_need_an_int8_model(files, capsys):
    assert main(["run", str(digits.model_path()), "--target", "cycle", "--input-shape",
                 "image=8,1,8,8", "--input", f"image={files / 'x.npy'}"]) == 2
    err = capsys.readouterr().err
    assert "calibration" in err and "Traceback" not in err


def test_wrong_calibration_file_is_one_line(files, capsys):
    bad = files / "bad.npz"
    np.savez(bad, pixels=np.zeros((4, 64), np.float32))
    assert main(["compile", str(digits.model_path()), "--target", "fsim", "--quantize", "int8",
                 "--calibration", str(bad), "--input-shape", "image=8,1,8,8",
                 "-o", str(files / "x.cel")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pixels" in err and "image" in err


def test_option_mistakes_are_clear(files, capsys):
    with pytest.raises(SystemExit):  # argparse: invalid choice, with the list of targets
        main(["run", str(digits.model_path()), "--target", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err
    assert main(["compile", str(digits.model_path()), "--calibration", str(files / "calib.npz"),
                 "-o", str(files / "y.cel")]) == 2
    assert "--calibration goes with --quantize int8" in capsys.readouterr().err
    assert main(["compile", str(digits.model_path()), "--quantize", "int4",
                 "-o", str(files / "y.cel")]) == 2
    assert "only int8" in capsys.readouterr().err
