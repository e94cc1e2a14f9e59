"""Whole int8 models split between the accelerator and the CPU: bit-exact against the all-CPU
build of the same quantized graph (digits CNN, ResNet-18, MobileNetV2 on fsim; the digits CNN
on the cycle model and the RTL), int8 accuracy on the held-out digits, and fallbacks."""

import numpy as np
import pytest

from celosia import HwConfig
from celosia.models import digits, zoo as models
from celosia.runtime.accel import AccelModel, compare_outputs

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def split():
    return digits.load_split()


def _digits_model(split, n, config="default", target="fsim"):
    calib, _ = split["calibration"]
    return AccelModel.from_onnx(str(digits.model_path()), config,
                                input_shapes={"image": (n, 1, 8, 8)},
                                calibration={"image": calib}, target=target)


def _bit_exact(model, feeds, target):
    got = model.run(feeds, target=target)
    same, detail = compare_outputs(got, model.cpu_build().run(feeds), exact=True)
    assert same, detail["summary"]
    return got


def test_digits_int8_accuracy_within_a_point_of_fp32_and_bit_exact(split):
    from celosia.runtime.cpu import CpuModel

    x, y = split["test"]
    fp32 = CpuModel.build(str(digits.model_path()), {"image": x.shape}).run({"image": x})
    model = _digits_model(split, len(y))
    ops = {n.name: n.op for n in model.graph.nodes}
    accel = sorted(ops[n] for n, p in model.placements.items() if p.target == "accel")
    # three convolutions and the dense, and the Flatten between them as a view
    assert accel == ["Flatten", "QConv", "QConv", "QConv", "QGemm"], accel
    got = _bit_exact(model, {"image": x}, "fsim")
    acc32, acc8 = digits.accuracy(fp32["probs"], y), digits.accuracy(got["probs"], y)
    assert acc32 >= 0.97
    assert acc8 >= acc32 - 0.01, (acc8, acc32)


def test_digits_on_the_cycle_model(split):
    x, _ = split["test"]
    model = _digits_model(split, 16, target="cycle")
    _bit_exact(model, {"image": x[:16]}, "cycle")
    s = model.summary()
    assert s["cycles"] > 0 and 0 < s["utilization"] < 1 and s["accel_ms"] > 0


def test_digits_on_the_rtl_agrees_with_the_cycle_model(split):
    """The small configuration: the same DRAM programs on the RTL and the cycle model give
    identical outputs (and identical to the CPU build) and identical per-node cycles."""
    x, _ = split["test"]
    model = _digits_model(split, 2, config="small", target="rtl")
    feeds = {"image": x[:2]}
    rtl = _bit_exact(model, feeds, "rtl")
    rtl_cycles = [r["cycles"] for r in model.report if r["target"] == "accel"]
    cyc = model.run(feeds, target="cycle")
    assert [r["cycles"] for r in model.report if r["target"] == "accel"] == rtl_cycles
    for name in rtl:
        np.testing.assert_array_equal(rtl[name], cyc[name])


def _random_image(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_resnet18_small_image_bit_exact_on_fsim():
    onnx_model = models.resnet18(image_size=32, num_classes=10)
    calib = {"image": _random_image((2, 3, 32, 32), 1)}
    model = AccelModel.from_onnx(onnx_model, HwConfig(), calibration=calib, target="fsim")
    places = model.placements
    convs = [n for n in model.graph.nodes if n.op == "QConv"]
    assert len(convs) == 20 and all(places[n.name].target == "accel" for n in convs)
    pools = [n for n in model.graph.nodes if n.op == "MaxPool"]
    assert pools and all(places[n.name].target == "accel" for n in pools)  # on the ALU
    _bit_exact(model, {"image": _random_image((1, 3, 32, 32), 2)}, "fsim")


def test_mobilenet_v2_depthwise_runs_on_the_accelerator_and_is_bit_exact():
    onnx_model = models.mobilenet_v2(image_size=32, num_classes=10)
    calib = {"image": _random_image((2, 3, 32, 32), 3)}
    model = AccelModel.from_onnx(onnx_model, HwConfig(), calibration=calib, target="fsim")
    depthwise = [n for n in model.graph.nodes if n.op == "QConv" and n.attrs["group"] > 1]
    assert depthwise
    for n in depthwise:
        p = model.placements[n.name]
        assert p.target == "accel" and p.reason == "group_conv2d with its fused epilogue"
    _bit_exact(model, {"image": _random_image((1, 3, 32, 32), 4)}, "fsim")
    rows = {r["node"]: r for r in model.report}
    assert all(rows[n.name]["target"] == "accel" and rows[n.name]["cycles"] is None
               for n in depthwise)  # fsim counts no cycles


@pytest.mark.slow
@pytest.mark.parametrize("which", ["resnet18", "mobilenet_v2"])
def test_imagenet_models_224_bit_exact_on_fsim(which):
    onnx_model = getattr(models, which)(image_size=224)
    calib = {"image": _random_image((2, 3, 224, 224), 5)}
    model = AccelModel.from_onnx(onnx_model, HwConfig(), calibration=calib, target="fsim")
    _bit_exact(model, {"image": _random_image((1, 3, 224, 224), 6)}, "fsim")


def test_unsupported_parts_run_on_the_cpu():
    """LeakyRelu cannot be an integer epilogue: its convolution stays a float node on the CPU
    next to int8 layers on the accelerator, and the result is still identical to the CPU
    build."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.normal(size=(16, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(16, 16, 3, 3)).astype(np.float32) * 0.1, "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.1, name="leaky"),
             helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1], name="conv_c"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
                          [w1, w2])
    onnx_model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = models.IR_VERSION
    model = AccelModel.from_onnx(onnx_model, HwConfig(), target="fsim",
                                 calibration={"x": _random_image((4, 3, 8, 8))})
    where = {n.op: model.placements[n.name].target for n in model.graph.nodes}
    assert where.get("QConv") == "accel"
    assert "cpu" in where.values()
    _bit_exact(model, {"x": _random_image((1, 3, 8, 8), 9)}, "fsim")


def test_wrong_calibration_is_a_clear_error(tmp_path):
    from celosia.compiler.graph.ir import GraphError

    path = tmp_path / "calib.npz"
    np.savez(path, image=np.zeros((4, 3, 8, 8), np.float32))
    with pytest.raises(GraphError, match=r"'image'.*input 'image' is float32\[1,1,8,8\]"):
        AccelModel.from_onnx(str(digits.model_path()), HwConfig(),
                             input_shapes={"image": (1, 1, 8, 8)}, calibration=str(path))


def test_qdq_model_from_onnxruntime_needs_no_calibration(tmp_path):
    """onnxruntime's quantizer (QDQ, int8, symmetric): built for the accelerator without
    calibration data, identical to the CPU build and within one output step of onnxruntime
    running the same QDQ model."""
    import logging

    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    rng = np.random.default_rng(11)
    data = [{"image": rng.normal(size=(1, 1, 8, 8)).astype(np.float32)} for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    src, dst = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(models.small_cnn(), src)
    logging.disable(logging.WARNING)
    try:
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        per_channel=True, extra_options={"ActivationSymmetric": True})
    finally:
        logging.disable(logging.NOTSET)
    model = AccelModel.from_onnx(str(dst), HwConfig(), target="cycle")
    ops = {n.name: n.op for n in model.graph.nodes}
    # two convolutions and the dense, and after the second convolution its Relu (the QDQ
    # model keeps it apart; on the ALU) and the Reshape (a view)
    assert sorted(ops[n] for n, p in model.placements.items() if p.target == "accel") == \
        ["QConv", "QConv", "QGemm", "Relu", "Reshape"]
    x = {"image": _random_image((1, 1, 8, 8), 12)}
    got = _bit_exact(model, x, "cycle")
    want = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, x)[0]
    assert np.abs(list(got.values())[0] - want).max() <= 1 / 127 + 1e-6


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_qdq_model_with_zero_points_on_the_accelerator(dtype):
    """A QDQ model as onnxruntime writes one by default (asymmetric int8 or uint8
    activations, nonzero zero points: tests/compiler/graph/test_qdq_zero_points.py): its
    padded and grouped convolutions, residual Add, MaxPool, global average pool and dense
    all run on the accelerator (the zero points are in their biases, ``pad_value`` and
    QAdd's and QGlobalAveragePool's constants), bit for bit the CPU build's on fsim."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "compiler" / "graph"))
    from test_qdq_zero_points import _network

    model, _, _ = _network(7, dtype)
    built = AccelModel.from_onnx(model.SerializeToString(), HwConfig(), target="fsim")
    ops = {n.name: n.op for n in built.graph.nodes}
    assert sorted(ops[n] for n, p in built.placements.items() if p.target == "accel") == \
        ["Flatten", "MaxPool", "QAdd", "QConv", "QConv", "QGemm", "QGlobalAveragePool"]
    x = {"x": np.random.default_rng(1).normal(0, 1.5, (1, 4, 9, 9)).astype(np.float32)}
    _bit_exact(built, x, "fsim")


def test_qdq_bias_add_of_a_constant_stays_on_the_cpu():
    """A QDQ transformer layer's bias Add (a QAdd of a broadcast constant, which the ALU
    program does not take) between two dense layers: the dense layers on the accelerator,
    the QAdd on the CPU, bit for bit the CPU build's on fsim."""
    import sys
    from pathlib import Path

    from onnx import helper

    sys.path.insert(0, str(Path(__file__).parents[1] / "compiler" / "graph"))
    from test_qdq_zero_points import _Model

    m = _Model(np.random.default_rng(11), "int8")
    x = m.qdq("x")
    w, _ = m.weight((24, 16), axis=1)
    mm = m.qdq(m.node("MatMul", [x, w]))
    bias = m.name("bias")
    m.nodes.append(helper.make_node("DequantizeLinear", [
        m.const(m.rng.integers(-128, 128, 16).astype(np.int8)),
        m.const(np.array(0.01, np.float32)), m.const(np.array(5, np.int8))], [bias]))
    w2, _ = m.weight((16, 8), axis=1)
    y = m.qdq(m.node("MatMul", [m.qdq(m.node("Add", [mm, bias])), w2]))
    built = AccelModel.from_onnx(m.model([10, 24], [y]).SerializeToString(), HwConfig(),
                                 target="fsim")
    ops = {n.name: n.op for n in built.graph.nodes}
    placed = sorted((ops[n], p.target) for n, p in built.placements.items()
                    if ops[n] in ("QGemm", "QAdd"))
    assert placed == [("QAdd", "cpu"), ("QGemm", "accel"), ("QGemm", "accel")]
    x = {"x": np.random.default_rng(1).normal(0, 1.5, (10, 24)).astype(np.float32)}
    _bit_exact(built, x, "fsim")
