"""Why a node of a quantized model runs on the CPU: every reason is named by what is missing,
and a layer the quantizer kept in float carries the quantizer's own reason (its
``float_reason`` attribute), never "Conv has no accelerator kernel".

Small models written node by node, quantized with calibration and partitioned for the
default configuration."""

import numpy as np
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia import HwConfig
from celosia.compiler.accel.partition import annotate
from celosia.compiler.pipeline import quantize_model

LUT_REASON = ("QLut (int8 lookup table): the ALU has no table lookup (its operations are "
              "MIN, MAX, ADD, SHR and MUL)")


def _placed(nodes, inputs, outputs, weights, opset=17):
    """{node name: (op, target, reason)} of the quantized model, and the quantized graph."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.normal(size=s) * 0.2).astype(np.float32), n)
             for n, s in weights.items()]
    model = make_model(nodes, [vi(n, s) for n, s in inputs.items()],
                       [vi(n, s) for n, s in outputs.items()], inits, opset=opset)
    calib = [{n: rng.normal(size=s).astype(np.float32) for n, s in inputs.items()}
             for _ in range(3)]
    q = quantize_model(model, calib)
    places = annotate(q, HwConfig())
    return {n.name: (n.op, places[n.name].target, places[n.name].reason) for n in q.nodes}, q


def _every_cpu_reason_is_specific(placed):
    for name, (op, target, reason) in placed.items():
        if target == "cpu":
            assert reason and reason != f"{op} has no accelerator kernel", (name, reason)
            assert "is a float operator" not in reason, (name, reason)  # the quantizer said why


def _gelu(x, out, k):
    """GELU as torch exports it: x * 0.5 * (1 + erf(x / sqrt 2)), which optimize fuses into
    the producer's epilogue as one Gelu step."""
    c = helper.make_node
    def const(name, v):
        return c("Constant", [], [name], value=numpy_helper.from_array(np.float32(v), name))

    return [const(f"s{k}", 1.4142135), const(f"one{k}", 1.0), const(f"half{k}", 0.5),
            c("Div", [x, f"s{k}"], [f"d{k}"]), c("Erf", [f"d{k}"], [f"e{k}"]),
            c("Add", [f"e{k}", f"one{k}"], [f"p{k}"]),
            c("Mul", [x, f"p{k}"], [f"m{k}"]), c("Mul", [f"m{k}", f"half{k}"], [out])]


def test_conv_with_a_table_activation_is_an_accelerator_conv_and_a_cpu_lut():
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("HardSwish", ["a"], ["y"], name="hswish")]
    placed, _ = _placed(nodes, {"x": [1, 4, 6, 6]}, {"y": [1, 8, 6, 6]}, {"w": (8, 4, 3, 3)})
    assert placed["conv"][:2] == ("QConv", "accel")
    lut = [r for r in placed.values() if r[0] == "QLut"]
    assert lut == [("QLut", "cpu", LUT_REASON)]
    _every_cpu_reason_is_specific(placed)


def test_an_add_after_silu_is_a_qadd_after_the_table_and_the_conv_is_accelerated():
    """YOLO's bottleneck: x + silu(conv(...)) is QConv (accelerator), QLut, QAdd."""
    c = helper.make_node
    nodes = [c("Conv", ["x", "w1"], ["r"], pads=[1, 1, 1, 1], name="conv_r"),
             c("Conv", ["r", "w2"], ["a"], pads=[1, 1, 1, 1], name="conv_silu"),
             c("Sigmoid", ["a"], ["s"]), c("Mul", ["a", "s"], ["t"]),
             c("Add", ["t", "r"], ["y"])]
    placed, q = _placed(nodes, {"x": [1, 8, 6, 6]}, {"y": [1, 8, 6, 6]},
                        {"w1": (8, 8, 3, 3), "w2": (8, 8, 3, 3)})
    assert placed["conv_silu"][:2] == ("QConv", "accel")
    assert placed["conv_r"][:2] == ("QConv", "accel")
    assert [n.op for n in q.nodes] == ["Quantize", "QConv", "QConv", "QLut", "QAdd",
                                       "Dequantize"]
    _every_cpu_reason_is_specific(placed)


def test_conv_kept_float_by_a_run_time_mul_and_a_broadcast_gate():
    """A Mul by a run-time float value after a convolution is a float node of its own (the
    convolution keeps the rest of its epilogue: a QConv); squeeze-excitation's
    gate [N, C, 1, 1] times the features is a QMul that broadcasts, on the ALU: its gate's
    table (a QLut, on the CPU) is computed in place in DRAM."""
    c = helper.make_node
    nodes = [c("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv_mul"),
             c("Mul", ["a", "gate"], ["m"], name="mul"),
             c("Conv", ["m", "w2"], ["b"], pads=[1, 1, 1, 1], name="conv_b"),
             c("Relu", ["b"], ["r"], name="relu"),
             c("MaxPool", ["r"], ["f"], kernel_shape=[1, 1], name="pool"),
             c("GlobalAveragePool", ["f"], ["g"], name="squeeze"),
             c("Sigmoid", ["g"], ["s"], name="gate_fn"),
             c("Mul", ["f", "s"], ["y"], name="se_mul")]
    placed, _ = _placed(nodes, {"x": [1, 4, 6, 6], "gate": [1, 8, 6, 6]},
                        {"y": [1, 8, 6, 6]}, {"w1": (8, 4, 3, 3), "w2": (8, 8, 3, 3)})
    assert placed["conv_mul"][:2] == ("QConv", "accel")
    assert placed["conv_mul/mul"] == ("Mul", "cpu", "Mul left in float: its input 'gate' is "
                                      "float (Mul is int8 only on int8 inputs)")
    assert placed["conv_b"][:2] == ("QConv", "accel")
    # the pool and the squeeze read values made on the accelerator: they run on its ALU
    assert placed["pool"] == ("MaxPool", "accel", "max pooling on the ALU")
    assert placed["squeeze"] == ("QGlobalAveragePool", "accel",
                                 "global average pooling on the ALU")
    assert placed["gate_fn"] == ("QLut", "cpu", LUT_REASON)
    assert placed["se_mul"] == ("QMul", "accel", "element-wise int8 Mul on the ALU")
    _every_cpu_reason_is_specific(placed)


def test_transformer_linears_and_attention():
    """A Linear on [B, S, D] becomes a QGemm on the accelerator (with GELU, a QLut after it);
    one whose epilogue adds a broadcast run-time value too, that Add float after it, saying
    so; Q x K^T and
    P x V are QMatMuls on the accelerator; Softmax has no int8 form."""
    c = helper.make_node
    nodes = [c("MatMul", ["x", "wq"], ["q"], name="proj_q"),
             c("MatMul", ["x", "wk"], ["k"], name="proj_k"),
             c("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
             c("MatMul", ["q", "kt"], ["s"], name="scores"),
             c("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
             c("MatMul", ["p", "x"], ["ctx"], name="context"),
             c("MatMul", ["ctx", "w1"], ["h"], name="fc1"),
             *_gelu("h", "g", 0),
             c("MatMul", ["g", "w2"], ["f"], name="fc2"),
             c("Add", ["f", "shift"], ["y"], name="add_shift")]
    placed, _ = _placed(nodes, {"x": [1, 8, 32], "shift": [1, 1, 16]}, {"y": [1, 8, 16]},
                        {"wq": (32, 32), "wk": (32, 32), "w1": (32, 64), "w2": (64, 16)})
    assert placed["proj_q"][:2] == ("QGemm", "accel")
    assert placed["fc1"][:2] == ("QGemm", "accel")
    assert [r for r in placed.values() if r[0] == "QLut"] == [
        ("QLut", "cpu", LUT_REASON)]
    for name in ("scores", "context"):
        assert placed[name][:2] == ("QMatMul", "accel")
        assert placed[name][2].startswith("matmul: a dense product per matrix")
    assert placed["softmax"] == ("Softmax", "cpu", "Softmax left in float: the quantizer has "
                                 "no int8 form of Softmax")
    # the layer without the Add its int8 form cannot take (graph/matmul_epilogue.py), and
    # that Add float after it, saying why
    assert placed["fc2"][:2] == ("QGemm", "accel")
    adds = [r for r in placed.values() if r[0] == "Add"]
    assert adds == [("Add", "cpu", "Add left in float: its input 'shift' is float (Add is "
                     "int8 only on int8 inputs)")], adds
    _every_cpu_reason_is_specific(placed)


def test_every_float_node_of_a_quantized_graph_carries_the_quantizers_reason():
    c = helper.make_node
    nodes = [c("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1], name="conv"),
             c("Relu", ["a"], ["r"], name="relu"),
             # (a spatial ReduceMean is a GlobalAveragePool on the quantizer's path: qforms.py)
             c("ReduceMax", ["r"], ["m"], keepdims=1, axes=[2, 3], name="mean"),
             c("Flatten", ["m"], ["y"], name="flat")]
    placed, q = _placed(nodes, {"x": [1, 4, 6, 6]}, {"y": [1, 8]}, {"w": (8, 4, 3, 3)})
    floats = [n for n in q.nodes if not n.op.startswith("Q") and n.op not in
              ("Quantize", "Dequantize") and q.types[n.outputs[0]].dtype == "float32"]
    assert floats and all(n.attrs.get("float_reason") for n in floats)
    assert placed["mean"][2] == ("ReduceMax left in float: the quantizer has no int8 form "
                                 "of ReduceMax")
    assert placed["flat"][2] == ("Flatten left in float: its input 'm' is float (Flatten is "
                                 "int8 only on int8 inputs)")
    _every_cpu_reason_is_specific(placed)


def test_a_qdq_models_float_nodes_say_the_qdq_model_left_them():
    """onnxruntime's QDQ form: the Conv between DequantizeLinear and QuantizeLinear becomes a
    QConv; the Softmax after it is float in the QDQ model, and the reason says so."""
    rng = np.random.default_rng(1)
    c = helper.make_node
    inits = [numpy_helper.from_array(np.float32(0.05), "xs"),
             numpy_helper.from_array(np.float32(0.1), "ys"),
             numpy_helper.from_array(np.int8(0), "zp"),
             numpy_helper.from_array(rng.integers(-100, 100, (8, 4, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(8, np.int8), "wzp")]
    nodes = [c("QuantizeLinear", ["x", "xs", "zp"], ["xq"]),
             c("DequantizeLinear", ["xq", "xs", "zp"], ["xf"]),
             c("DequantizeLinear", ["wq", "ws", "wzp"], ["wf"], axis=0),
             c("Conv", ["xf", "wf"], ["a"], pads=[1, 1, 1, 1], name="conv"),
             c("QuantizeLinear", ["a", "ys", "zp"], ["aq"]),
             c("DequantizeLinear", ["aq", "ys", "zp"], ["af"]),
             c("Softmax", ["af"], ["y"], axis=1, name="softmax")]
    model = make_model(nodes, [vi("x", [1, 4, 6, 6])], [vi("y", [1, 8, 6, 6])], inits)
    q = quantize_model(model)
    places = annotate(q, HwConfig())
    where = {n.name: (n.op, places[n.name].target, places[n.name].reason) for n in q.nodes}
    assert where["conv"][:2] == ("QConv", "accel")
    op, target, reason = where["softmax"]
    assert (op, target) == ("Softmax", "cpu")
    assert reason.startswith("Softmax left in float: the QDQ model's Softmax is not one celosia "
                             "turns into an integer operator"), reason
    _every_cpu_reason_is_specific(where)
