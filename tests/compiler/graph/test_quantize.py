"""int8 quantization: the integer kernels against slow references, quantize_graph on whole
models (accuracy and structure), calibration files, and QDQ models from onnxruntime."""

import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import onnxruntime_qdq

from celosia.compiler.graph.ir import (Graph, GraphError, Node, TensorType, UnsupportedOperatorError, verify_graph)
from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.qops import QUANTIZED_KERNELS
from celosia.compiler.graph.ops import KERNELS
from celosia.compiler.graph.reference import evaluate_node, infer_node, run_graph
from celosia.compiler.frontend.onnx import SUPPORTED_OPS
from celosia.compiler.graph.quantize import (CalibrationError, calibration_from_npz, from_qdq, quantize_graph)
from celosia.compiler.pipeline import quantize_model
from celosia.models import zoo as models

RNG = np.random.default_rng(0)


# ---- slow references: loops over kernel taps, int64, wrap by masking ---------------------------


def wrap32(x):
    x = np.asarray(x, dtype=np.int64) & 0xFFFFFFFF
    return (x ^ 0x80000000) - 0x80000000


def slow_conv(x, w, strides, pads, dilations, group, pad_value=0):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.full((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), pad_value, np.int64)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    oh = (xp.shape[2] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
    acc = np.zeros((n, o, oh, ow), np.int64)
    og = o // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dilations[0], j * dilations[1]
                patch = xp[:, g * cg:(g + 1) * cg, r0:r0 + strides[0] * (oh - 1) + 1:strides[0],
                           c0:c0 + strides[1] * (ow - 1) + 1:strides[1]]
                taps = w[g * og:(g + 1) * og, :, i, j].astype(np.int64)
                acc[:, g * og:(g + 1) * og] += np.einsum("nchw,mc->nmhw", patch, taps)
    return acc


def slow_epilogue(acc, bias, mult, shift, lo, hi, residual=None):
    shape = (1, -1) + (1,) * (acc.ndim - 2)
    t = wrap32(wrap32(acc) + bias.astype(np.int64).reshape(shape))
    t = wrap32(t * mult.astype(np.int64).reshape(shape))
    t = np.floor_divide(t, 2**shift)
    if residual is not None:
        t = wrap32(t + residual)
    return np.clip(t, lo, hi).astype(np.int8)


def conv_attrs(k, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, **epi):
    return {"kernel_shape": list(k), "strides": list(strides), "pads": list(pads),
            "dilations": list(dilations), "group": group, "scale": 0.1, **epi}


def int8s(*shape, extreme=None):
    if extreme is not None:
        return np.full(shape, extreme, np.int8)
    return RNG.integers(-128, 128, shape, dtype=np.int8)


def int32s(n, lo=-2**31, hi=2**31):
    return RNG.integers(lo, hi, n, dtype=np.int64).astype(np.int32)


def run_node(op, attrs, *inputs):
    return evaluate_node(Node(op, tuple(f"i{k}" for k in range(len(inputs))), ("y",), attrs,
                              "n"), list(inputs))[0]


# ---- the integer kernels -----------------------------------------------------------------------


CONV_CASES = [  # (x shape, w shape, strides, pads, dilations, group)
    ((2, 8, 9, 9), (16, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 6, 11, 10), (4, 6, 3, 2), (2, 3), (0, 2, 1, 0), (1, 1), 1),    # asymmetric
    ((1, 8, 12, 12), (8, 2, 3, 3), (1, 2), (2, 1, 0, 1), (2, 1), 4),    # groups, dilation
    ((2, 12, 7, 7), (12, 1, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 12),   # depthwise
    ((1, 64, 5, 5), (32, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
@pytest.mark.parametrize("data", ["random", "max", "min", "wrap"])
def test_qconv_matches_slow_reference(case, data):
    xs, ws, strides, pads, dil, group = CONV_CASES[case]
    extreme = {"max": 127, "min": -128}.get(data)
    x = int8s(*xs, extreme=extreme)
    w = int8s(*ws, extreme=-128 if data == "max" else extreme)
    o = ws[0]
    if data == "wrap":  # full-range bias and multipliers: the add and the multiply wrap
        bias, mult, shift = int32s(o), int32s(o), int(RNG.integers(0, 32))
    else:
        bias, mult, shift = int32s(o, -2**20, 2**20), int32s(o, -2**12, 2**12), 13
    lo, hi = (-128, 127) if case % 2 else (-5, 90)
    attrs = conv_attrs(ws[2:], strides, pads, dil, group, shift=shift, lo=lo, hi=hi)
    want_acc = slow_conv(x, w, strides, pads, dil, group)
    got = run_node("QConv", attrs, x, w, bias, mult)
    want = slow_epilogue(want_acc, bias, mult, shift, lo, hi)
    assert got.dtype == np.int8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    residual = int8s(*want.shape, extreme=extreme)
    got = run_node("QConv", attrs, x, w, bias, mult, residual)
    np.testing.assert_array_equal(got, slow_epilogue(want_acc, bias, mult, shift, lo, hi,
                                                     residual))


def test_qconv_wraps_the_accumulator():
    """|acc| > 2**31 is only reachable with huge channel counts: a 1x1 conv over 140,000
    channels of 127 * -128 sums to -2.28e9, which wraps to a positive int32."""
    c = 140_000
    x, w = int8s(1, c, 1, 1, extreme=127), int8s(1, c, 1, 1, extreme=-128)
    attrs = conv_attrs((1, 1), shift=0, lo=-128, hi=127)
    acc = slow_conv(x, w, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert acc.item() == -127 * 128 * c and wrap32(acc).item() > 0
    got = run_node("QConv", attrs, x, w, np.zeros(1, np.int32), np.ones(1, np.int32))
    assert got.item() == 127


@pytest.mark.parametrize("data", ["random", "max", "wrap"])
def test_qgemm_matches_slow_reference(data):
    n, k, o = 5, 300, 17
    extreme = 127 if data == "max" else None
    x, w = int8s(n, k, extreme=extreme), int8s(o, k, extreme=-128 if extreme else None)
    bias, mult = (int32s(o), int32s(o)) if data == "wrap" else (int32s(o, -9999, 9999),
                                                               int32s(o, 1, 2**14))
    shift, residual = 17, int8s(n, o)
    acc = np.einsum("nk,ok->no", x.astype(np.int64), w.astype(np.int64))
    attrs = {"shift": shift, "lo": 0, "hi": 127, "scale": 0.1}
    np.testing.assert_array_equal(run_node("QGemm", attrs, x, w, bias, mult),
                                  slow_epilogue(acc, bias, mult, shift, 0, 127))
    np.testing.assert_array_equal(run_node("QGemm", attrs, x, w, bias, mult, residual),
                                  slow_epilogue(acc, bias, mult, shift, 0, 127, residual))


@pytest.mark.parametrize("hw", [(1, 1), (2, 2), (7, 7), (3, 5), (56, 56)])
def test_qglobal_average_pool_rounds_to_nearest(hw):
    from celosia.compiler.graph.quantize import _pool_params

    m, shift, _ = _pool_params(hw[0] * hw[1])
    x = np.concatenate([int8s(3, 4, *hw), int8s(1, 4, *hw, extreme=127),
                        int8s(1, 4, *hw, extreme=-128)])
    got = run_node("QGlobalAveragePool", {"multiplier": m, "shift": shift, "scale": 0.1}, x)
    total = x.astype(np.int64).sum(axis=(2, 3), keepdims=True)
    want = np.array([(int(t) * m + (1 << (shift - 1))) >> shift for t in total.ravel()])
    np.testing.assert_array_equal(got.ravel(), want)
    mean = total / (hw[0] * hw[1])
    assert np.abs(got - mean).max() <= 0.5 + 1e-6  # a rounded average (half up)
    assert (got[3] == 127).all() and (got[4] == -128).all()


@pytest.mark.parametrize("hw,ratio,z_in,z_out", [((7, 7), 3.7, -128, 0), ((2, 3), 0.4, 0, -128),
                                                   ((56, 56), 1.0, -20, 17), ((1, 1), 9.5, 3, -3)])
def test_qglobal_average_pool_into_its_own_scale_and_zero_point(hw, ratio, z_in, z_out):
    """The output's own scale (s_in / s_out = ratio) and zero points: within one step of
    the exact ``ratio * (mean - z_in) + z_out``, in the numpy kernel and the compiled one."""
    from celosia.compiler.graph.quantize import _pool_params
    from celosia.runtime.cpu import CpuModel
    from celosia.compiler.graph.ir import Graph, Node, TensorType

    m, shift, off = _pool_params(hw[0] * hw[1], ratio, z_out - z_in * ratio)
    x = np.concatenate([int8s(3, 4, *hw), int8s(1, 4, *hw, extreme=127),
                        int8s(1, 4, *hw, extreme=-128)])
    attrs = {"multiplier": m, "shift": shift, "scale": 0.1, "offset": off}
    got = run_node("QGlobalAveragePool", attrs, x)
    exact = ratio * (x.astype(np.float64).mean(axis=(2, 3), keepdims=True) - z_in) + z_out
    assert np.abs(got - np.clip(exact, -128, 127)).max() <= 0.5 + 1e-3 * max(1, ratio)
    g = Graph("g", ("x",), ("y",), (Node("QGlobalAveragePool", ("x",), ("y",), attrs, "gap"),),
              {}, {"x": TensorType("int8", x.shape), "y": TensorType("int8", (*x.shape[:2], 1, 1))})
    np.testing.assert_array_equal(CpuModel.from_graph(g).run({"x": x})["y"], got)


def test_quantize_and_dequantize():
    scale = 0.5
    x = np.array([0.25, 0.75, -0.25, -0.75, 1.25, 63.0, 63.75, 64.0, -64.25, 1e30, -np.inf,
                  *RNG.normal(0, 30, 200)], np.float32)
    got = run_node("Quantize", {"scale": scale}, x)
    want = [round(max(-128.0, min(127.0, float(np.float32(v) / np.float32(scale)))))
            for v in x]  # Python's round: half to even (clipping first: no infinities)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, np.array(want))
    assert got[:5].tolist() == [0, 2, 0, -2, 2]
    s = 0.0123
    for q in (int8s(100), int32s(100)):
        y = run_node("Dequantize", {"scale": s}, q)
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y, np.array([np.float32(v) * np.float32(s) for v in q]))


def test_quantized_ops_are_not_onnx_operators():
    assert not set(QUANTIZED_KERNELS) & set(KERNELS)
    assert not set(QUANTIZED_KERNELS) & set(SUPPORTED_OPS)
    node = helper.make_node("QConv", ["x", "w"], ["y"], name="q")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.INT8, [1, 1, 3, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.INT8, None)], [numpy_helper.from_array(int8s(1, 1, 1, 1), "w")])
    with pytest.raises(UnsupportedOperatorError, match="QConv"):
        import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_shape_inference_of_quantized_ops():
    types = [TensorType("int8", (1, 8, 10, 10)), TensorType("int8", (4, 2, 3, 3)),
             TensorType("int32", (4,)), TensorType("int32", (4,))]
    node = Node("QConv", ("x", "w", "b", "m"), ("y",),
                conv_attrs((3, 3), (2, 2), (1, 1, 1, 1), group=4, shift=3, lo=0, hi=127), "c")
    assert infer_node(node, types, [None] * 4) == [TensorType("int8", (1, 4, 5, 5))]
    with pytest.raises(GraphError, match="multiplier must be int32"):
        infer_node(node, types[:3] + [TensorType("int32", (5,))], [None] * 4)
    pool = Node("QGlobalAveragePool", ("x",), ("y",), {"multiplier": 3, "shift": 4}, "p")
    assert infer_node(pool, types[:1], [None]) == [TensorType("int8", (1, 8, 1, 1))]


def test_int8_max_pool_pads_with_the_minimum():
    x = int8s(1, 2, 4, 4, extreme=-100)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
             "dilations": [1, 1], "ceil_mode": 0, "storage_order": 0}
    y = run_node("MaxPool", attrs, x)
    assert y.dtype == np.int8 and (y == -100).all()


def best_time(fn, repeat=2):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def test_resnet18_at_224_runs_in_about_a_second():
    """1.8 GMACs of integer convolution: 0.15 s measured on 2 cores (float: 0.10 s)."""
    graph = optimize(import_onnx(models.resnet18()))
    sample = {"image": RNG.normal(size=(1, 3, 224, 224)).astype(np.float32)}
    q = quantize_graph(graph, [sample])
    t_int = best_time(lambda: run_graph(q, sample))
    t_float = best_time(lambda: run_graph(graph, sample))
    assert t_int < max(1.0, 5 * t_float), (t_int, t_float)  # other jobs may share the CPU


# ---- quantize_graph on models --------------------------------------------------------------------


def samples(shape, n, seed):
    rng = np.random.default_rng(seed)
    return [{"image": rng.normal(size=shape).astype(np.float32)} for _ in range(n)]


def outputs(graph, data):
    return np.concatenate([run_graph(graph, x)[graph.outputs[0]] for x in data])


def rms_relative_error(want, got):
    return float(np.sqrt(((want - got) ** 2).mean() / (want ** 2).mean()))


def scale_of(graph: Graph, value: str) -> float:
    """The scale of an int8 value: its producer's, through same-scale ops."""
    node = graph.producers()[value]
    while "scale" not in node.attrs:
        node = graph.producers()[node.inputs[0]]
    return node.attrs["scale"]


def check_types(graph: Graph):
    """verify_graph, and every node's output types as shape inference gives them."""
    verify_graph(graph)
    for node in graph.nodes:
        ins = [graph.types[i] if i else None for i in node.inputs]
        vals = [graph.initializers.get(i) for i in node.inputs]
        assert infer_node(node, ins, vals) == [graph.types[o] for o in node.outputs], node


def check_layers_exact(graph: Graph, feeds):
    """Every QConv/QGemm against the slow references on its real inputs."""
    env = dict(graph.initializers, **feeds)
    for node in graph.nodes:
        ins = [env[i] if i else None for i in node.inputs]
        (env[node.outputs[0]],) = evaluate_node(node, ins)
        if node.op in ("QConv", "QGemm"):
            a = node.attrs
            x, w, bias, mult, *res = ins
            acc = slow_conv(x, w, a["strides"], a["pads"], a["dilations"], a["group"],
                            a.get("pad_value", 0)) \
                if node.op == "QConv" else x.astype(np.int64) @ w.astype(np.int64).T
            want = slow_epilogue(acc, bias, mult, a["shift"], a["lo"], a["hi"], *res)
            np.testing.assert_array_equal(env[node.outputs[0]], want)


def test_small_cnn():
    graph = optimize(import_onnx(models.small_cnn()))
    q = quantize_graph(graph, samples((1, 1, 8, 8), 32, 1))
    check_types(q)
    assert [n.op for n in q.nodes] == ["Quantize", "QConv", "MaxPool", "QConv", "Reshape",
                                       "QGemm", "Dequantize", "Softmax"]
    assert q.inputs == graph.inputs and q.outputs == graph.outputs
    assert q.types["softmax20"] == TensorType("float32", (1, 10))
    assert [n.name for n in q.nodes if n.op in ("QConv", "QGemm")] == ["conv2", "conv8", "fc19"]
    conv1, conv2 = (n for n in q.nodes if n.op == "QConv")
    # the fused Relu, its output of zero point -128 (qzero.py: MaxPool carries it, conv2's
    # padding reads it)
    assert (conv1.attrs["lo"], conv1.attrs["hi"]) == (-128, 127)
    assert conv2.attrs["pad_value"] == -128
    assert q.types[conv1.inputs[1]].dtype == "int8" and q.types[conv1.inputs[2]].dtype == "int32"
    # MaxPool keeps its input's scale; the next layer reads it as its input scale.
    assert scale_of(q, conv2.inputs[0]) == conv1.attrs["scale"]
    held_out = samples((1, 1, 8, 8), 16, 2)
    want, got = outputs(graph, held_out), outputs(q, held_out)
    assert np.abs(want - got).max() < 0.05  # probabilities: 0.012 measured
    assert rms_relative_error(want, got) < 0.05  # 0.018 measured
    check_layers_exact(q, held_out[0])


def test_resnet18_residuals_share_scales():
    graph = optimize(import_onnx(models.resnet18(image_size=32, num_classes=10)))
    q = quantize_graph(graph, samples((1, 3, 32, 32), 4, 3))
    check_types(q)
    ops = [n.op for n in q.nodes]
    assert ops.count("QConv") == 20 and ops.count("QGemm") == 1
    assert ops.count("QGlobalAveragePool") == 1 and "Conv" not in ops
    assert ops.count("Quantize") == 1 and ops.count("Dequantize") == 1  # in and out only
    residual = [n for n in q.nodes if n.op == "QConv" and len(n.inputs) == 5]
    assert len(residual) == 8  # one per BasicBlock
    for n in residual:
        assert scale_of(q, n.inputs[4]) == n.attrs["scale"]
    # the Relu after the Add: the first stage's residual class (stem, MaxPool and block
    # outputs, never negative) takes the zero point -128 (qzero.py: the residual brings
    # it); the others hold a downsampling's signed output: symmetric (lo 0) or, where the
    # calibrated [min, max] rounds the samples better (quantize.py _zero_point_pays), a
    # zero point z, the Relu's clamp at z; the two blocks of a stage share one class
    lows = [n.attrs["lo"] for n in residual]
    assert lows[:2] == [-128] * 2 and lows[2::2] == lows[3::2]
    assert q.outputs == graph.outputs and q.types[q.outputs[0]].dtype == "float32"
    held_out = samples((1, 3, 32, 32), 4, 4)
    err = rms_relative_error(outputs(graph, held_out), outputs(q, held_out))
    assert err < 0.15  # 0.10 measured (random weights; onnxruntime's QDQ: 0.11)
    check_layers_exact(q, held_out[0])


def test_per_tensor_weights():
    graph = optimize(import_onnx(models.small_cnn()))
    q = quantize_graph(graph, samples((1, 1, 8, 8), 8, 5), per_channel=False)
    for n in q.nodes:
        if n.op in ("QConv", "QGemm"):  # one weight scale: one multiplier per node
            assert np.unique(q.initializers[n.inputs[3]]).size == 1
    data = samples((1, 1, 8, 8), 8, 5)
    assert np.abs(outputs(graph, data) - outputs(q, data)).max() < 0.05  # 0.010 measured


def test_mobilenet_v2_depthwise_and_relu6():
    graph = optimize(import_onnx(models.mobilenet_v2(image_size=32, num_classes=10)))
    q = quantize_graph(graph, samples((1, 3, 32, 32), 8, 6))
    check_types(q)
    convs = [n for n in q.nodes if n.op == "QConv"]
    assert len(convs) == 52 and not any(n.op == "Conv" for n in q.nodes)
    depthwise = [n for n in convs if n.attrs["group"] > 1]
    assert len(depthwise) == 17
    for n in depthwise:  # Clip(0, 6) with zero point -128 (read by a 1x1 projection):
        # lo = -128, hi = rint(6 / scale) - 128 (<= 127)
        assert n.attrs["group"] == q.types[n.inputs[0]].shape[1]
        assert n.attrs["lo"] == -128
        assert n.attrs["hi"] == min(127, round(6 / n.attrs["scale"]) - 128)
    data = samples((1, 3, 32, 32), 4, 7)
    assert rms_relative_error(outputs(graph, data), outputs(q, data)) < 0.2  # 0.09 measured
    check_layers_exact(q, data[0])


def test_float_nodes_get_dequantize_and_quantize():
    """A Mul by another value (here the float input) after a Conv stays float, a node of
    its own (the Conv keeps the part of its epilogue an int8 layer takes: a QConv); the
    next Conv reads it through a Quantize, and it reads the QConv through a Dequantize.
    (A LeakyRelu epilogue no longer does: it becomes a QLut.)"""
    rng = np.random.default_rng(20)
    w = {k: rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32) for k in ("w1", "w2", "w3")}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4, name="c1"),
             helper.make_node("Relu", ["a"], ["b"], name="r1"),
             helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1] * 4, name="c2"),
             helper.make_node("Mul", ["c", "x"], ["d"], name="l2"),
             helper.make_node("Conv", ["d", "w3"], ["y"], pads=[1] * 4, name="c3")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, 6, 6])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None), helper.make_tensor_value_info(
            "b", TensorProto.FLOAT, None)], [numpy_helper.from_array(v, k) for k, v in w.items()])
    graph = optimize(import_onnx(helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17)])))
    data = [{"x": rng.normal(size=(1, 4, 6, 6)).astype(np.float32)} for _ in range(4)]
    q = quantize_graph(graph, data)
    check_types(q)
    assert [n.op for n in q.nodes] == ["Quantize", "QConv", "QConv", "Dequantize", "Mul",
                                       "Quantize", "QConv", "Dequantize", "Dequantize"]
    assert q.outputs == ("y", "b") and all(q.types[o].dtype == "float32" for o in q.outputs)
    for name in q.outputs:
        want = np.concatenate([run_graph(graph, x)[name] for x in data])
        got = np.concatenate([run_graph(q, x)[name] for x in data])
        assert rms_relative_error(want, got) < 0.04  # 0.020 and 0.011 measured


def onnx_graph(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v)
                                       for k, v in inputs.items()],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                           for o in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return optimize(import_onnx(model))


def test_concat_int8_only_with_one_scale():
    """Concat(a, Relu(a)) shares a's scale and stays int8; a channel Concat with another
    layer's output (another scale) stays int8 too, its inputs given one shared scale (the
    QConv writing b requantizes to it); a Concat along another axis of values of two scales
    is float, after Dequantize nodes."""
    rng = np.random.default_rng(21)
    w = {k: rng.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32) for k in ("w1", "w2")}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Concat", ["a", "r"], ["ar"], axis=1, name="cat1"),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="c2"),
             helper.make_node("Concat", ["ar", "b"], ["y"], axis=1, name="cat2"),
             helper.make_node("Conv", ["x", "w2"], ["d"], name="c3"),
             helper.make_node("Concat", ["a", "d"], ["z"], axis=2, name="cat3")]
    graph = onnx_graph(nodes, {"x": [1, 4, 5, 5]}, ["y", "z"], w)
    data = [{"x": rng.normal(size=(1, 4, 5, 5)).astype(np.float32)} for _ in range(4)]
    q = quantize_graph(graph, data)
    check_types(q)
    kinds = {n.name: (n.op, q.types[n.outputs[0]].dtype) for n in q.nodes}
    assert kinds["cat1"] == kinds["cat2"] == ("Concat", "int8")
    assert kinds["cat3"] == ("Concat", "float32")
    scales = {n.name: n.attrs["scale"] for n in q.nodes if n.op == "QConv"}
    assert scales["c1"] == scales["c2"] != scales["c3"]  # c1 and c2 write cat2's inputs
    got, want = outputs(q, data), outputs(graph, data)
    assert rms_relative_error(want, got) < 0.03


def test_matmul_and_gemm_forms():
    """MatMul by a constant [K,O] with a constant Add and a Relu, then a Gemm with
    transB=0, alpha and beta and a [1,O] C: both QGemm."""
    rng = np.random.default_rng(22)
    inits = {"w": rng.normal(0, 0.3, (16, 8)).astype(np.float32),
             "b": rng.normal(0, 0.3, 8).astype(np.float32),
             "w2": rng.normal(0, 0.3, (8, 4)).astype(np.float32),
             "c": rng.normal(0, 0.3, (1, 4)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["mb"], name="add"),
             helper.make_node("Relu", ["mb"], ["h"], name="relu"),
             helper.make_node("Gemm", ["h", "w2", "c"], ["y"], alpha=0.5, beta=2.0,
                              name="gemm")]
    graph = onnx_graph(nodes, {"x": [3, 16]}, ["y"], inits)
    assert graph.nodes[0].attrs["epilogue"] == (("Add", 2), ("Relu",))
    data = [{"x": rng.normal(size=(3, 16)).astype(np.float32)} for _ in range(4)]
    q = quantize_graph(graph, data)
    check_types(q)
    assert [n.op for n in q.nodes] == ["Quantize", "QGemm", "QGemm", "Dequantize"]
    assert q.nodes[1].attrs["lo"] == -128  # the Relu output's zero point (read by a Gemm)
    assert rms_relative_error(outputs(graph, data), outputs(q, data)) < 0.03  # 0.008 measured
    check_layers_exact(q, data[0])


# ---- calibration data ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_graph():
    return optimize(import_onnx(models.small_cnn()))


def test_calibration_npz_forms(tmp_path, small_graph):
    x = RNG.normal(size=(6, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "flat.npz", image=x)
    np.savez(tmp_path / "lead.npz", image=x[:, None])
    for name in ("flat.npz", "lead.npz"):
        got = calibration_from_npz(tmp_path / name, small_graph)
        assert len(got) == 6 and got[2]["image"].shape == (1, 1, 8, 8)
        np.testing.assert_array_equal(got[2]["image"][0], x[2])
    batch4 = optimize(import_onnx(models.small_cnn(batch=4)))
    groups = calibration_from_npz(tmp_path / "flat.npz", batch4)
    assert len(groups) == 2  # samples 0-3, then 4, 5 and again 0, 1
    np.testing.assert_array_equal(groups[1]["image"], x[[4, 5, 0, 1]])
    q1 = quantize_model(small_graph, tmp_path / "flat.npz")
    q2 = quantize_graph(small_graph, [{"image": a[None]} for a in x])
    q3 = quantize_graph(small_graph, {"image": x})
    for other in (q2, q3):
        for k, v in q1.initializers.items():
            np.testing.assert_array_equal(v, other.initializers[k])


@pytest.mark.parametrize("arrays, match", [
    ({"img": np.zeros((4, 1, 8, 8), np.float32)},
     r"arrays \['img'\] name no input.*no array for the inputs \['image'\]"),
    ({"image": np.zeros((4, 8, 8), np.float32)},
     r"'image' is float32\[4,8,8\], of rank 3.*expected rank 5 or 4"),
    ({"image": np.zeros((4, 1, 8, 8), np.int64)},
     r"'image' is int64 but input 'image' is float32.*preprocessed"),
    ({"image": np.zeros((4, 3, 8, 8), np.float32)},
     r"'image' is float32\[4,3,8,8\] but input 'image' is float32\[1,1,8,8\]: expected "
     r"\[samples,1,1,8,8\] or \[samples,1,8,8\] \(along the batch axis, grouped by 1\)"),
    ({"image": np.zeros((0, 1, 8, 8), np.float32)}, r"holds no samples"),
])
def test_wrong_calibration_file_is_a_clear_error(tmp_path, small_graph, arrays, match):
    path = tmp_path / "cal.npz"
    np.savez(path, **arrays)
    with pytest.raises(CalibrationError, match=match) as e:
        calibration_from_npz(path, small_graph)
    assert isinstance(e.value, GraphError) and str(path) in str(e.value)


def test_unreadable_calibration_and_none(tmp_path, small_graph):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(CalibrationError, match="not a readable .npz file"):
        calibration_from_npz(bad, small_graph)
    with pytest.raises(CalibrationError, match="needs calibration samples"):
        quantize_model(models.small_cnn())


# ---- QDQ models from onnxruntime -----------------------------------------------------------------


def ort_qdq(tmp_path, model, data, activation_type="QInt8", symmetric=True):
    return onnxruntime_qdq(tmp_path, model, data, activation_type, symmetric)


def ort_outputs(path, data):
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, x)[0] for x in data])


def test_qdq_from_onnxruntime(tmp_path):
    data = samples((1, 1, 8, 8), 16, 8)
    path = ort_qdq(tmp_path, models.small_cnn(), data)
    q = quantize_model(path)
    check_types(q)
    ops = [n.op for n in q.nodes]
    assert ops.count("QConv") == 2 and ops.count("QGemm") == 1 and "Conv" not in ops
    assert "MaxPool" in ops and q.types[q.producers()["maxpool6_QuantizeLinear_Output"]
                                         .outputs[0]].dtype == "int8"
    # The same from the optimized graph, whose weight DequantizeLinear nodes were folded.
    q2 = quantize_model(optimize(import_onnx(path)))
    held_out = samples((1, 1, 8, 8), 32, 9)
    got, got2 = outputs(q, held_out), outputs(q2, held_out)
    np.testing.assert_array_equal(got, got2)
    want = ort_outputs(path, held_out)
    # onnxruntime requantizes in float: at most one step of the output (scale 1/127) apart,
    # and identical on 25 of the 32 samples (measured).
    assert np.abs(got - want).max() <= 1 / 127 + 1e-6
    assert (np.abs(got - want).max(axis=1) == 0).mean() > 0.6


def test_qdq_uint8_becomes_integer(tmp_path):
    """uint8 activations (onnxruntime's QUInt8) are int8 ones 128 lower: the layers become
    integer (test_qdq_zero_points.py compares them with onnxruntime)."""
    data = samples((1, 1, 8, 8), 8, 10)
    path = ort_qdq(tmp_path, models.small_cnn(), data, "QUInt8", symmetric=False)
    q = from_qdq(import_onnx(path))
    check_types(q)
    ops = [n.op for n in q.nodes]
    assert ops.count("QConv") == 2 and ops.count("QGemm") == 1


@pytest.mark.parametrize("relu", [False, True])  # with Relu: a zero point on the output
def test_pruned_channels_with_tiny_biases_quantize(relu):
    """A Conv whose folded BatchNorm left channels of weights ~1e-40 with biases ~1e-19
    (PP-OCR's) quantizes: those channels' weight scales are raised until the bias fits
    int32, they compute ~0 as in float, and the other channels are untouched; the int8
    graph's result stays close to float's."""
    from celosia.runtime.cpu import CpuModel

    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.2, (6, 5, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, 6).astype(np.float32)
    w[[1, 4]] = np.float32(3e-40) * rng.choice([-1, 1], (2, 5, 3, 3))
    b[[1, 4]] = [-8.6e-19, 2e-23]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], pads=[1, 1, 1, 1])]
    if relu:  # read by a 1x1 Conv, the Relu's output takes a zero point (qzero.py)
        nodes += [helper.make_node("Relu", ["c"], ["r"]),
                  helper.make_node("Conv", ["r", "w1"], ["y"])]
    graph = helper.make_graph(nodes, "pruned", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 5, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 6, 8, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(np.eye(6, dtype=np.float32).reshape(6, 6, 1, 1), "w1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = models.IR_VERSION
    samples = [{"x": rng.normal(size=(1, 5, 8, 8)).astype(np.float32)} for _ in range(4)]
    q = quantize_model(model, samples)
    assert any(n.op == "QConv" for n in q.nodes)
    x = samples[0]["x"]
    want = run_graph(optimize(import_onnx(model)), {"x": x})["y"]
    got = run_graph(q, {"x": x})["y"]
    assert np.array_equal(CpuModel.from_graph(q).run({"x": x})["y"], got)  # int8 bit for bit
    assert np.abs(got[0, [1, 4]]).max() < 1e-6
    cos = (got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)
    assert cos > 0.999
