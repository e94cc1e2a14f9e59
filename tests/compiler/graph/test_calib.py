"""Calibration methods (compiler/graph/calib.py): "percentile" and "entropy" beside "mse" and
"minmax": the ranges they choose on synthetic distributions against hand-computed ones, the
scales quantize_graph gives with them, and the errors for bad method names or percentiles
(Python API and CLI)."""

import math

import numpy as np
import pytest
from onnx import helper
from onnx_builders import float_graph

from celosia.compiler.graph.calib import (DEFAULT_PERCENTILE, entropy_range, parse_method,
                                          percentile_range)
from celosia.compiler.graph.quantize import CalibrationError, quantize_graph
from celosia.compiler.graph.reference import evaluate_node, run_graph
from celosia.runtime.cpu import CpuModel


def test_parse_method():
    assert parse_method("mse") == ("mse", None)
    assert parse_method(" MinMax ") == ("minmax", None)
    assert parse_method("entropy") == ("entropy", None)
    assert parse_method("percentile") == ("percentile", DEFAULT_PERCENTILE)
    assert parse_method("percentile:99.9") == ("percentile", 99.9)
    assert parse_method("percentile", 95) == ("percentile", 95.0)
    assert parse_method("percentile:100") == ("percentile", 100.0)


@pytest.mark.parametrize("method, percentile, message", [
    ("kl", None, r"unknown calibration method 'kl': choose one of mse, minmax, percentile, "
                 r"entropy"),
    (3, None, r"calibration method 3 is not a string"),
    ("percentile:abc", None, r"percentile 'abc' is not a number"),
    ("percentile:0", None, r"percentile 0 is outside \(0, 100\]"),
    ("percentile", 100.5, r"percentile 100.5 is outside \(0, 100\]"),
    ("percentile:nan", None, r"outside \(0, 100\]"),
    ("percentile:99", 99.9, r"the percentile is given twice"),
    ("mse", 99.0, r"'mse' takes no percentile"),
    ("entropy:5", None, r"'entropy' takes no percentile"),
])
def test_parse_method_errors(method, percentile, message):
    with pytest.raises(CalibrationError, match=message):
        parse_method(method, percentile)


def test_percentile_range_by_hand():
    """numpy's linear-interpolation percentile of |x|: of 0..1000 (signs mixed), the 99.9th
    is 999 and the 50th 500; never above the maximum given; the maximum when it is 0."""
    v = np.arange(1001.0) * np.where(np.arange(1001) % 2, -1, 1)
    assert percentile_range(v, 1000.0, 99.9) == pytest.approx(999.0)
    assert percentile_range(v, 1000.0, 50) == pytest.approx(500.0)
    assert percentile_range(v, 1000.0, 100) == 1000.0
    assert percentile_range(v, 700.0, 99.9) == 700.0
    sparse = np.zeros(10000)
    sparse[0] = 3.0  # 99.99% zeros: a percentile of 0, so the maximum
    assert percentile_range(sparse, 3.0, 99.9) == 3.0
    assert percentile_range(np.zeros(0), 2.0, 99.9) == 2.0


def test_entropy_range_by_hand():
    """TensorRT's search: a uniform distribution loses information with any clipping (the
    full range); one far outlier among uniform [0, 1] values is clipped at the first
    candidate, (128 + 0.5) bins of max/2048; a zero spike (a Relu output) does not pull the
    threshold in; a Gaussian keeps about 4 sigma (not the extreme sample)."""
    rng = np.random.default_rng(3)
    assert entropy_range(rng.uniform(-1, 1, 100000), 1.0) == 1.0
    outlier = np.concatenate([rng.uniform(0, 1, 100000), [100.0]])
    assert entropy_range(outlier, 100.0) == pytest.approx(128.5 * 100 / 2048)
    assert entropy_range(outlier, 100.0, levels=256) == pytest.approx(256.5 * 100 / 2048)
    gauss = rng.normal(0, 1, 200000)
    t = entropy_range(gauss, float(np.abs(gauss).max()))
    assert 3.5 < t < float(np.abs(gauss).max()) - 0.2
    relu = np.maximum(gauss, 0)
    assert entropy_range(relu, float(relu.max())) == pytest.approx(t, rel=0.15)
    assert entropy_range(gauss, 0.0) == 0.0


def _conv_relu_conv():
    rng = np.random.default_rng(21)
    w = rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1] * 4)]
    graph = float_graph(nodes, {"x": (1, 4, 8, 8)}, {"w": w, "w2": w2})
    data = [{"x": rng.standard_t(3, (1, 4, 8, 8)).astype(np.float32)} for _ in range(3)]
    return graph, data


@pytest.mark.parametrize("method", ["percentile:97", "entropy"])
def test_quantize_graph_scales(method):
    """quantize_graph's scales with the method are the method's ranges of the calibrated
    values / 127 (every element kept: the values are small), on the input, the Relu output
    and the output; the int8 build runs bit for bit as its reference and stays close to
    float."""
    graph, data = _conv_relu_conv()
    assert [n.outputs[0] for n in graph.nodes] == ["r", "y"]  # the Relu fused
    env = [_values(graph, d) for d in data]
    # (no bias correction: it would learn the clipping error of the Student-t calibration
    # samples, which the normal test sample below does not have: 0.19 relative RMS error)
    q = quantize_graph(graph, data, method=method, bias_correction=False)
    for name in ("x", "r", "y"):
        arrays = [e[name] for e in env]
        v = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float32)
        top = float(np.abs(v).max())
        # the Relu output, read by a padded convolution, takes the zero point -128 and
        # 256 steps on [0, range] (qzero.py)
        steps = 255 if name == "r" else 127
        want = (percentile_range(v, top, 97) if method.startswith("percentile")
                else entropy_range(v, top, steps + 1))
        assert want < top  # heavy tails: the method clips
        assert _scale_of(q, name) == pytest.approx(float(np.float32(want / steps)), rel=1e-6)
    test = {"x": np.random.default_rng(5).normal(size=(1, 4, 8, 8)).astype(np.float32)}
    ref = run_graph(q, test)["y"]
    np.testing.assert_array_equal(CpuModel.from_graph(q).run(test)["y"], ref)
    want = run_graph(graph, test)["y"]
    assert math.sqrt(((want - ref) ** 2).mean() / (want ** 2).mean()) < 0.1


def _values(graph, feeds):
    """Every value of the float graph on ``feeds``."""
    env = {**graph.initializers, **feeds}
    for node in graph.nodes:
        env.update(zip(node.outputs, evaluate_node(node, [env[i] if i else None
                                                         for i in node.inputs])))
    return env


def _scale_of(q, value):
    """The scale of int8 ``value`` in the quantized graph: of the node writing it (or the
    Quantize of the graph input, or the Dequantize of the graph output)."""
    for node in q.nodes:
        if node.op == "Quantize" and node.inputs[0] == value:
            return node.attrs["scale"]
        if node.op == "Dequantize" and node.outputs[0] == value:
            return node.attrs["scale"]
        if value in node.outputs and "scale" in node.attrs:
            return node.attrs["scale"]
    raise AssertionError(f"no int8 {value!r}")


def test_quantize_graph_method_errors():
    graph, data = _conv_relu_conv()
    with pytest.raises(CalibrationError, match="unknown calibration method 'kl'"):
        quantize_graph(graph, data, method="kl")
    with pytest.raises(CalibrationError, match="outside"):
        quantize_graph(graph, data, method="percentile", percentile=0)


def test_cli_calibration_method(tmp_path, capsys):
    """--calibration-method reaches the quantizer; a bad one is a one-line error before the
    build; without --quantize it is refused."""
    from celosia.cli import main
    from onnx_builders import make_model, vi
    import onnx

    rng = np.random.default_rng(2)
    w = onnx.numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)],
                       [vi("x", [1, 3, 6, 6])], [vi("y", None)], [w])
    path, npz = tmp_path / "m.onnx", tmp_path / "c.npz"
    onnx.save(model, path)
    np.savez(npz, x=rng.normal(size=(4, 1, 3, 6, 6)).astype(np.float32))
    out = tmp_path / "m.cel"
    base = ["compile", str(path), "--quantize", "int8", "--calibration", str(npz),
            "-o", str(out)]
    assert main(base + ["--calibration-method", "percentile:99.5"]) == 0
    assert out.exists()
    assert main(base + ["--calibration-method", "kl"]) != 0
    assert "unknown calibration method 'kl'" in capsys.readouterr().err
    assert main(["compile", str(path), "--calibration-method", "entropy",
                 "-o", str(out)]) != 0
    assert "--calibration-method goes with --quantize int8" in capsys.readouterr().err


def test_bench_calibration_method_errors():
    """`bench zoo --int8 --calibration-method`: refused without --int8 or for another
    benchmark, and a bad method fails before any model is built."""
    from celosia.benchmarks import run_benchmark
    from celosia.errors import CelosiaError

    with pytest.raises(CelosiaError, match="goes with `bench zoo --int8`"):
        run_benchmark("zoo", quick=True, calibration_method="entropy")
    with pytest.raises(CalibrationError, match="unknown calibration method 'kl'"):
        run_benchmark("zoo", quick=True, int8=True, calibration_method="kl")
