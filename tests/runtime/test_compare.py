"""`celosia run --compare`: each output's largest difference measured against the output's
scale (max |reference|), with the tolerance stated; a correct deep network passes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from celosia.cli import COMPARE_TOLERANCE, compare_to_scale, main
from celosia.models import zoo


def test_small_values_do_not_fail_a_correct_output():
    """Rounding noise of 1e-6 of the scale everywhere, on an output with elements near
    zero: an element-wise rtol of 1e-4 fails it, the measure against the scale does not."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 1000)).astype(np.float32)
    ref[0, :10] = 1e-7  # a few logits near zero
    ours = (ref + 1e-6 * np.abs(ref).max() * rng.choice([-1, 1], ref.shape)).astype(np.float32)
    assert not np.all(np.abs(ours - ref) <= 1e-4 * np.abs(ref))  # the old rule's verdict
    ok, rows = compare_to_scale({"y": ours}, {"y": ref}, COMPARE_TOLERANCE)
    row = rows["y"]
    assert ok and row["within_tolerance"]
    assert row["scale"] == pytest.approx(float(np.abs(ref).max()))
    assert row["max_diff_vs_scale"] == pytest.approx(row["max_abs_diff"] / row["scale"])
    assert 0.5e-6 < row["max_diff_vs_scale"] < 2e-6


def test_a_wrong_element_fails_and_is_shown():
    ref = np.linspace(-3, 5, 24, dtype=np.float32).reshape(2, 3, 4)
    ours = ref.copy()
    ours[1, 2, 3] += 0.01  # 0.2% of the scale
    ok, rows = compare_to_scale({"y": ours}, {"y": ref}, COMPARE_TOLERANCE)
    assert not ok
    assert rows["y"]["largest"][0]["index"] == [1, 2, 3]
    assert rows["y"]["differing"] == 1
    shapes_ok, shapes = compare_to_scale({"y": ours}, {"y": ref[0]}, COMPARE_TOLERANCE)
    assert not shapes_ok and shapes["y"]["reference_shape"] == [3, 4]


def test_nan_agrees_only_with_nan():
    ref = np.array([1.0, np.nan, -2.0, np.inf], np.float32)
    assert compare_to_scale({"y": ref.copy()}, {"y": ref}, COMPARE_TOLERANCE)[0]
    ours = ref.copy()
    ours[0] = np.nan
    ok, rows = compare_to_scale({"y": ours}, {"y": ref}, COMPARE_TOLERANCE)
    assert not ok and rows["y"]["largest"][0]["index"] == [0] and rows["y"]["scale"] == 2.0


def test_bit_for_bit_tolerance():
    a = np.arange(6, dtype=np.int8)
    assert compare_to_scale({"y": a}, {"y": a.copy()}, 0)[0]
    b = a.copy()
    b[0] = 1
    ok, rows = compare_to_scale({"y": b}, {"y": a}, 0)
    assert not ok and rows["y"]["max_diff_vs_scale"] == pytest.approx(1 / 5)


def test_resnet50_passes_the_command_line_comparison(tmp_path, capsys):
    """ResNet-50 (random weights) at 32x32: `celosia run --compare onnxruntime` exits 0
    and prints the error against each output's scale and the tolerance."""
    model = tmp_path / "r50.onnx"
    onnx.save(zoo.resnet50(image_size=32), model)
    x = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model), "--target", "cpu", "--input", str(tmp_path / "x.npy"),
                 "--compare", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("fc") and "vs onnxruntime" in l)
    assert "of its scale" in line and "within (tolerance 0.0001 of the scale)" in line
