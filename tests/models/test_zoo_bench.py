"""`celosia bench zoo` on a few small entries: its records, totals and progress lines."""

import dataclasses
import json

import pytest

from celosia.cli import main
from celosia.models import registry


_SMALL_CNN = registry.ZOO["small_cnn"].build


def _with_an_unsupported_head(**args):
    """The small CNN with its Softmax replaced by a Cast of the logits to int64 and a
    TfIdfVectorizer counting the values 0 to 9 in them (an operator celosia does not
    import; onnxruntime runs it, float32[1, 10] out as before)."""
    from onnx import TensorProto, helper

    m = _SMALL_CNN(**args)
    for k, node in enumerate(m.graph.node):
        if node.op_type == "Softmax":
            out = list(node.output)
            m.graph.node[k].CopyFrom(helper.make_node(
                "Cast", node.input, ["logits_int"], to=TensorProto.INT64, name="to_int"))
            m.graph.node.insert(k + 1, helper.make_node(
                "TfIdfVectorizer", ["logits_int"], out, name="head", mode="TF",
                min_gram_length=1, max_gram_length=1, max_skip_count=0, ngram_counts=[0],
                ngram_indexes=list(range(10)), pool_int64s=list(range(10))))
            break
    return m


@pytest.fixture
def small_zoo(monkeypatch):
    zoo = registry.ZOO
    entries = {
        "small_cnn": zoo["small_cnn"],
        # The same model with an operator celosia does not import (onnxruntime runs it).
        "unsupported": dataclasses.replace(zoo["small_cnn"], name="unsupported",
                                           build=_with_an_unsupported_head),
        # The same model held to an impossible tolerance: runs, but is not ok_cpu.
        "strict_cnn": dataclasses.replace(zoo["small_cnn"], name="strict_cnn", tolerance=0.0),
        "absent": dataclasses.replace(zoo["silero_vad"], name="absent",
                                      requires=("celosia_no_such_package",)),
    }
    monkeypatch.setattr(registry, "ZOO", entries)
    return entries


def test_bench_zoo_quick(small_zoo, tmp_path, capsys):
    out = tmp_path / "zoo.json"
    assert main(["bench", "zoo", "--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    metrics, models = result["metrics"], result["models"]
    assert metrics["models"] == 3 and metrics["models_ok_cpu"] == 1
    ratio = models["small_cnn"]["cpu_ratio_vs_onnxruntime"]
    assert ratio > 0
    assert metrics["cpu_ratio_vs_onnxruntime_geomean"] == pytest.approx(ratio)
    assert metrics["cpu_ratio_vs_onnxruntime_max"] == pytest.approx(ratio)

    cnn = models["small_cnn"]
    (err,) = cnn["relative_error"].values()  # its one output
    assert cnn["ok_cpu"] and err < 1e-5
    for runtime in ("celosia", "onnxruntime"):
        s = cnn[runtime]
        assert 0 < s["min_ms"] <= s["p25_ms"] <= s["median_ms"] <= s["p75_ms"]
        assert s["iqr_ms"] == pytest.approx(s["p75_ms"] - s["p25_ms"])
        assert s["samples"] == cnn["repetitions"] >= 3
    per = cnn["cpu_ratio_per_block"]
    assert per["blocks"] == cnn["blocks"] == 3 and per["median"] > 0 and per["iqr"] >= 0

    flow = models["unsupported"]
    assert not flow["ok_cpu"] and "celosia" not in flow
    assert flow["error"].startswith("UnsupportedOperatorError: <model>: 1 unsupported node")
    assert flow["onnxruntime"]["median_ms"] > 0  # timed on onnxruntime alone
    strict = models["strict_cnn"]
    assert not strict["ok_cpu"] and "of their scale (tolerance 0)" in strict["error"]
    assert "celosia_no_such_package" in result["missing"]["absent"]

    captured = capsys.readouterr()
    assert "zoo: [1/4] small_cnn (the digits CNN's shape) ..." in captured.err
    assert "zoo: [4/4] absent: missing" in captured.err
    assert "unsupported: onnxruntime" in captured.out
    assert f"{cnn['repetitions']} runs each in 3 blocks" in captured.out


def test_bench_zoo_int8_record(small_zoo, tmp_path):
    """--int8: celosia's int8 CPU build and onnxruntime's quantize_static, both against
    fp32 on the same calibration data; the record's fields and totals on one small model."""
    out = tmp_path / "zoo.json"
    assert main(["bench", "zoo", "--quick", "--int8", "--models", "small_cnn",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    cnn, metrics = result["models"]["small_cnn"], result["metrics"]
    assert 0.99 < cnn["int8_cosine"] <= 1 + 1e-9
    assert 0.99 < cnn["int8_cosine_ort"] <= 1 + 1e-9
    assert cnn["int8_cosine_vs_ort_quantizer"] == pytest.approx(
        cnn["int8_cosine"] - cnn["int8_cosine_ort"])
    assert cnn["int8_mac_share"] == pytest.approx(1.0)  # every Conv/Gemm is integer
    assert cnn["int8_ops"]["QConv"] >= 1
    assert metrics["int8_cosine_vs_ort_quantizer_min"] == pytest.approx(
        cnn["int8_cosine_vs_ort_quantizer"])
    assert metrics["models_ok_int8"] == 1


def test_bench_int8_is_for_the_zoo():
    from celosia.benchmarks import run_benchmark
    from celosia.errors import CelosiaError

    with pytest.raises(CelosiaError, match="--int8 measures zoo models"):
        run_benchmark("fsim", quick=True, int8=True)


@pytest.mark.parametrize("name", ["small_cnn", "bert", "vit", "convnext", "yolo"])
def test_int8_at_least_as_close_to_fp32_as_onnxruntimes_quantizer(name):
    """Issue #13's accuracy target on small zoo models where celosia meets it today: the
    int8 CPU build's cosine to fp32 >= that of onnxruntime's quantize_static QDQ model from
    the same calibration inputs (benchmarks/zoo_int8.py's protocol)."""
    from celosia.benchmarks import zoo_int8

    r = zoo_int8.measure(registry.ZOO[name], "small")
    assert "int8_error" not in r and "int8_ort_error" not in r, r
    assert r["int8_cosine_vs_ort_quantizer"] >= 0, r
    assert r["int8_mac_share"] > 0.9, r


def test_onnxruntime_reference_is_its_dynamic_quantizer_where_static_leaves_float():
    """quantize_static does not enter Loop bodies: control_flow's layers stay float there, so
    the int8 reference is onnxruntime's dynamic quantizer (EnableSubgraph), which quantizes
    the body's MatMuls; integer_nodes counts what each quantized."""
    from celosia.benchmarks import zoo_int8

    r = zoo_int8.measure(registry.ZOO["control_flow"], "small")
    assert "int8_ort_error" not in r, r
    assert r["int8_ort_mode"] == "dynamic", r
    assert 0.99 < r["int8_cosine_ort"] < 1.0  # quantized: not the float model's cosine of 1
    assert r["int8_cosine_vs_ort_quantizer"] == pytest.approx(
        r["int8_cosine"] - r["int8_cosine_ort"])


def test_integer_nodes_counts_quantized_layers_in_bodies():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from celosia.benchmarks.zoo_int8 import integer_nodes

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    float_body = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "b",
                                   [], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                      None)])
    qdq_body = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["wq", "s"], ["wd"]),
         helper.make_node("MatMul", ["x", "wd"], ["y"]),
         helper.make_node("MatMulInteger", ["a", "b"], ["z"])], "q",
        [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])

    def model(body):
        node = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=float_body)
        g = helper.make_graph([node, helper.make_node("MatMul", ["x", "w"], ["t"])], "m",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [w])
        return helper.make_model(g)
    assert integer_nodes(model(float_body)) == 0
    assert integer_nodes(model(qdq_body)) == 2  # the DQ-fed MatMul and the MatMulInteger


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v3", "efficientnet", "yolo", "unet"])
def test_full_size_int8_at_least_as_close_as_onnxruntimes_quantizer(name):
    """Issue #13's target at full size on the models whose residual stages, table
    inputs and bias correction were behind onnxruntime's quantizer (docs/graph.md,
    "Accuracy against onnxruntime's quantizer, continued"): mean cosine to fp32 over the
    six test feeds, 0.97662 vs 0.97452 and 0.97692 vs 0.97491 when written; and YOLO and
    U-Net, behind until signed values took zero points through Slice/Concat/Add and per
    value (docs/graph.md, "Zero points"): 0.999858 vs 0.999765, 0.999952 vs 0.999945."""
    from celosia.benchmarks import zoo_int8

    r = zoo_int8.measure(registry.ZOO[name], "full")
    assert "int8_error" not in r and "int8_ort_error" not in r, r
    assert r["int8_cosine_vs_ort_quantizer"] >= 0, r
    assert r["int8_mac_share"] == 1.0, r
