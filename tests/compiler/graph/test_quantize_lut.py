"""int8 for what real models compute: transformer Linears (MatMul on [B, S, D] by a constant)
as QGemm over B*S rows, and activations with no exact int8 form (SiLU, HardSwish, GELU,
Sigmoid, Tanh, ...) as QLut tables, after a layer or on their own. Each quantized graph is
checked against its float graph (accuracy), its integer layers against integer references,
and the all-CPU int8 build against the numpy definitions (bit for bit)."""

import numpy as np
import pytest
from onnx_builders import float_graph as _graph
from onnx import helper

from celosia.compiler.graph.qops import QUANTIZED_KERNELS
from celosia.compiler.graph.quantize import quantize_graph
from celosia.compiler.graph.reference import evaluate_node, infer_node, run_graph
from celosia.runtime.cpu import CpuModel



def _feeds(shape, n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(n)]


def _rms(want, got):
    return float(np.sqrt(((want - got) ** 2).mean() / (want ** 2).mean()))


def _check(graph, q, test, tolerance):
    """Types as shape inference gives them, the CPU build bit for bit with the numpy
    definitions, and the int8 result close to the float one."""
    for node in q.nodes:
        ins = [q.types[i] if i else None for i in node.inputs]
        vals = [q.initializers.get(i) for i in node.inputs]
        assert infer_node(node, ins, vals) == [q.types[o] for o in node.outputs], node
    want = run_graph(graph, test)["y"]
    ref = run_graph(q, test)["y"]
    got = CpuModel.from_graph(q).run(test)["y"]
    np.testing.assert_array_equal(got, ref)
    assert _rms(want, ref) < tolerance, _rms(want, ref)


def test_qlut_is_a_table_lookup():
    rng = np.random.default_rng(1)
    table = rng.integers(-128, 128, 256).astype(np.int8)
    x = rng.integers(-128, 128, (3, 7)).astype(np.int8)
    y = QUANTIZED_KERNELS["QLut"]({"scale": 0.1}, x, table)
    assert y.dtype == np.int8
    for idx in np.ndindex(x.shape):
        assert y[idx] == table[int(x[idx]) + 128]
    with pytest.raises(ValueError, match=r"table must be int8\[256\]"):
        QUANTIZED_KERNELS["QLut"]({}, x, table[:10])


@pytest.mark.parametrize("activation", ["SiLU", "HardSwish", "Sigmoid", "LeakyRelu",
                                        "HardSigmoid"])
def test_conv_with_an_activation_becomes_qconv_and_qlut(activation):
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, 8).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4)]
    if activation == "SiLU":  # as torch exports it: x * sigmoid(x)
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]),
                  helper.make_node("Mul", ["c", "s"], ["y"])]
    else:
        nodes += [helper.make_node(activation, ["c"], ["y"])]
    graph = _graph(nodes, {"x": (1, 4, 8, 8)}, {"w": w, "b": b})
    activation_graph = _graph(nodes[1:], {"c": (256,)}, {})

    def exact_table(s_in, z_in, s_out, z_out):
        x = (np.arange(-128, 128) - z_in).astype(np.float32) * np.float32(s_in)
        f = run_graph(activation_graph, {"c": x})["y"]
        return np.clip(np.rint(f / np.float32(s_out)) + z_out, -128, 127).astype(np.int8)

    for zero_points in (False, True):
        q = quantize_graph(graph, _feeds((1, 4, 8, 8), 4, 3), zero_points=zero_points)
        ops = [n.op for n in q.nodes]
        assert ops == ["Quantize", "QConv", "QLut", "Dequantize"], ops
        # The table is the float activation between the two scales, exactly (with zero
        # points: the table's input takes one, qtable.py, which the QConv adds through its
        # bias: some z_in gives the table exactly).
        conv, lut, deq = q.nodes[1:]
        table = q.initializers[lut.inputs[1]]
        s_in, s_out = conv.attrs["scale"], lut.attrs["scale"]
        z_out = int(deq.attrs.get("zero_point", 0))
        if not zero_points:
            np.testing.assert_array_equal(table, exact_table(s_in, 0, s_out, z_out))
        else:
            assert any(np.array_equal(table, exact_table(s_in, z, s_out, z_out))
                       for z in range(-128, 128))
    _check(graph, q, _feeds((1, 4, 8, 8), 1, 9)[0], 0.05)


@pytest.mark.parametrize("op", ["Tanh", "Gelu", "Softplus"])
def test_standalone_activation_on_int8_becomes_qlut(op):
    rng = np.random.default_rng(4)
    w = rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node(op, ["p"], ["y"])]
    graph = _graph(nodes, {"x": (1, 4, 8, 8)}, {"w": w}, opset=20 if op == "Gelu" else 17)
    q = quantize_graph(graph, _feeds((1, 4, 8, 8), 4, 5))
    assert "QLut" in [n.op for n in q.nodes] and op not in [n.op for n in q.nodes]
    _check(graph, q, _feeds((1, 4, 8, 8), 1, 10)[0], 0.05)


def test_transformer_linear_becomes_qgemm_over_rows():
    """[B, S, D] x [D, E] + bias, a GELU-free Linear then a SiLU one with a residual Add:
    Reshape -> QGemm -> Reshape, the residual reshaped with it; integer rows exact."""
    rng = np.random.default_rng(6)
    w1 = rng.normal(0, 0.3, (16, 16)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (16, 16)).astype(np.float32)
    b1 = rng.normal(0, 0.1, 16).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]),
             helper.make_node("Add", ["m", "b1"], ["h"]),
             helper.make_node("MatMul", ["h", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "h"], ["r"]),
             helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Mul", ["r", "s"], ["y"])]
    graph = _graph(nodes, {"x": (2, 5, 16)}, {"w1": w1, "w2": w2, "b1": b1})
    q = quantize_graph(graph, _feeds((2, 5, 16), 4, 7))
    ops = [n.op for n in q.nodes]
    assert ops.count("QGemm") == 2 and "MatMul" not in ops and ops.count("QLut") == 1, ops
    gemms = [n for n in q.nodes if n.op == "QGemm"]
    assert all(q.types[n.inputs[0]].shape == (10, 16) for n in gemms)
    assert len(gemms[1].inputs) == 5  # the residual, as [rows, E]
    test = _feeds((2, 5, 16), 1, 11)[0]
    env = dict(q.initializers, **test)
    for node in q.nodes:  # each QGemm against int64 arithmetic on its real inputs
        ins = [env[i] if i else None for i in node.inputs]
        (env[node.outputs[0]],) = evaluate_node(node, ins)
        if node.op == "QGemm":
            x, w, bias, mult, *res = ins
            t = (x.astype(np.int64) @ w.astype(np.int64).T + bias) * mult >> node.attrs["shift"]
            t = t + (res[0].astype(np.int64) if res else 0)
            want = np.clip(t, node.attrs["lo"], node.attrs["hi"]).astype(np.int8)
            np.testing.assert_array_equal(env[node.outputs[0]], want)
    _check(graph, q, test, 0.05)


def test_the_mse_range_is_the_least_error_candidate_bit_for_bit():
    """_mse_range (computed in one buffer) picks exactly the candidate the plain expression
    ((clip(rint(v / s), -128, 127) * s - v) ** 2).mean() picks, on seeded heavy-tailed
    values of several sizes and lower bounds."""
    import math

    from celosia.compiler.graph.quantize import _mse_range

    def reference(v, top, lowest):
        v = v.astype(np.float64)
        best, best_err = top, math.inf
        for t in np.linspace(lowest, 1.0, 57) * top:
            s = float(np.float32(t / 127))
            err = float(((np.clip(np.rint(v / s), -128, 127) * s - v) ** 2).mean())
            if err < best_err:
                best, best_err = t, err
        return best

    rng = np.random.default_rng(31)
    for k in range(40):
        n = int(rng.integers(1, 40000 if k % 8 == 0 else 3000))
        v = (rng.standard_t(3, size=n) * rng.uniform(0.01, 10)).astype(np.float32)
        top, lowest = float(np.abs(v).max()), float(rng.uniform(0.05, 0.9))
        assert _mse_range(v, top, lowest) == reference(v, top, lowest), k


def test_calibration_methods():
    """"mse" narrows the range of a non-negative value with outliers (never beyond the
    maximum) and keeps the maximum for a graph output; "minmax" keeps every maximum; an
    unknown method is a CalibrationError naming the choices."""
    from celosia.compiler.graph.quantize import CalibrationError, _mse_range

    rng = np.random.default_rng(8)
    heavy = rng.exponential(1, 50000).astype(np.float32)
    top = float(heavy.max())

    def mse(t):
        s = float(np.float32(t / 127))
        return float(((np.clip(np.rint(heavy / s), -128, 127) * s - heavy) ** 2).mean())

    chosen = _mse_range(heavy, top)
    assert 0.3 * top <= chosen < 0.95 * top and mse(chosen) < 0.9 * mse(top)
    uniform = rng.uniform(0, 1, 50000).astype(np.float32)
    assert _mse_range(uniform, 1.0) > 0.95
    w = rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1] * 4)]
    w2 = rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32)
    graph = _graph(nodes, {"x": (1, 4, 8, 8)}, {"w": w, "w2": w2})
    data = _feeds((1, 4, 8, 8), 4, 12)
    scales = {m: {n.name: n.attrs["scale"] for n in quantize_graph(graph, data, method=m).nodes
                  if n.op == "QConv"} for m in ("minmax", "mse")}
    first, last = sorted(scales["mse"])[0], sorted(scales["mse"])[-1]
    assert scales["mse"][first] <= scales["minmax"][first]  # relu output: may narrow
    assert scales["mse"][last] == scales["minmax"][last]  # a graph output keeps its max
    with pytest.raises(CalibrationError, match="unknown calibration method 'kl'.*mse, minmax"):
        quantize_graph(graph, data, method="kl")


def test_layer_scale_is_folded_into_the_weights():
    """ConvNeXt's block end: Linear, bias, a per-channel layer scale (Mul by a constant
    gamma), then the residual Add: one QGemm (gamma in its weights and bias)."""
    rng = np.random.default_rng(13)
    w = rng.normal(0, 0.3, (16, 16)).astype(np.float32)
    b = rng.normal(0, 0.1, 16).astype(np.float32)
    gamma = rng.uniform(-1, 1, 16).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["h"]),
             helper.make_node("Mul", ["h", "gamma"], ["g"]),
             helper.make_node("Add", ["g", "x"], ["y"])]
    graph = _graph(nodes, {"x": (1, 3, 3, 16)}, {"w": w, "b": b, "gamma": gamma})
    q = quantize_graph(graph, _feeds((1, 3, 3, 16), 4, 14))
    ops = [n.op for n in q.nodes]
    assert ops.count("QGemm") == 1 and "MatMul" not in ops and "Mul" not in ops, ops
    _check(graph, q, _feeds((1, 3, 3, 16), 1, 15)[0], 0.05)


def test_qmatmul_against_int64():
    rng = np.random.default_rng(16)
    a = rng.integers(-128, 128, (2, 3, 5, 64)).astype(np.int8)
    b = rng.integers(-128, 128, (2, 3, 64, 7)).astype(np.int8)
    attrs = {"multiplier": 12345, "shift": 24, "scale": 0.1}
    got = QUANTIZED_KERNELS["QMatMul"](attrs, a, b)
    acc = np.einsum("...mk,...kn->...mn", a.astype(np.int64), b.astype(np.int64))
    want = np.clip((acc * 12345 + 2**23) >> 24, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="shift 0 must be in"):
        QUANTIZED_KERNELS["QMatMul"](dict(attrs, shift=0), a, b)


def test_attention_matmuls_become_qmatmul():
    """Self-attention on [B, H, S, D]: Q x K^T, Softmax (float), P x V. Both products of
    two run-time values become QMatMul; the CPU build is bit-exact with numpy."""
    rng = np.random.default_rng(17)
    wq, wk, wv = (rng.normal(0, 0.3, (16, 16)).astype(np.float32) for _ in range(3))
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = _graph(nodes, {"x": (2, 6, 16)}, {"wq": wq, "wk": wk, "wv": wv})
    q = quantize_graph(graph, _feeds((2, 6, 16), 4, 18))
    ops = [n.op for n in q.nodes]
    assert ops.count("QMatMul") == 2 and ops.count("QGemm") == 3 and "MatMul" not in ops, ops
    _check(graph, q, _feeds((2, 6, 16), 1, 19)[0], 0.08)


@pytest.mark.parametrize("factor", [0.25, -0.5])
def test_attention_scores_scaled_by_a_constant(factor):
    """(Q x K^T) * d**-0.5 (the scale fused into the MatMul as its epilogue): a positive
    scalar goes into the QMatMul's requantization; any other epilogue is split off the
    product as float nodes of its own."""
    from celosia.compiler.accel.partition import annotate
    from celosia import HwConfig

    rng = np.random.default_rng(23)
    wq, wk, wv = (rng.normal(0, 0.3, (16, 16)).astype(np.float32) for _ in range(3))
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "d"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = _graph(nodes, {"x": (2, 6, 16)}, {"wq": wq, "wk": wk, "wv": wv,
                                              "d": np.array(factor, np.float32)})
    assert [n for n in graph.nodes if n.op == "MatMul" and n.attrs.get("epilogue")]
    q = quantize_graph(graph, _feeds((2, 6, 16), 4, 24))
    ops = [n.op for n in q.nodes]
    if factor > 0:
        assert ops.count("QMatMul") == 2 and "MatMul" not in ops, ops
        _check(graph, q, _feeds((2, 6, 16), 1, 25)[0], 0.08)
        places = annotate(q, HwConfig())
        assert all(places[n.name].target == "accel" for n in q.nodes if n.op == "QMatMul")
    else:  # the product is a QMatMul all the same; the Mul by a negative scalar is float
        # after it (graph/matmul_epilogue.py)
        assert ops.count("QMatMul") == 2 and "MatMul" not in ops, ops
        muls = [n for n in q.nodes if n.op == "Mul"]
        assert len(muls) == 1 and "Mul of a constant" in muls[0].attrs["float_reason"]
        _check(graph, q, _feeds((2, 6, 16), 1, 25)[0], 0.08)
        _check(graph, q, _feeds((2, 6, 16), 1, 25)[0], 0.08)


def test_qadd_qmul_against_int64():
    rng = np.random.default_rng(20)
    a, b = (rng.integers(-128, 128, (2, 3, 4, 5)).astype(np.int8) for _ in range(2))
    got = QUANTIZED_KERNELS["QAdd"]({"multipliers": [3000, 5000], "shift": 12}, a, b)
    t = a.astype(np.int64) * 3000 + b.astype(np.int64) * 5000
    np.testing.assert_array_equal(got, np.clip((t + 2**11) >> 12, -128, 127))
    got = QUANTIZED_KERNELS["QMul"]({"multipliers": [777], "shift": 15}, a, b)
    t = a.astype(np.int64) * b.astype(np.int64) * 777
    np.testing.assert_array_equal(got, np.clip((t + 2**14) >> 15, -128, 127))
    with pytest.raises(ValueError, match="multipliers"):
        QUANTIZED_KERNELS["QMul"]({"multipliers": [1, 2], "shift": 3}, a, b)


def test_squeeze_excitation_gate_and_int8_add():
    """x * sigmoid(conv(g)) (SE's gate, in a layer's epilogue) becomes QConv, QLut, QMul;
    the Add of two int8 values (two pooled branches) becomes a QAdd."""
    rng = np.random.default_rng(21)
    w1, w2, w3 = (rng.normal(0, 0.3, (8, 8, 1, 1)).astype(np.float32) for _ in range(3))
    b1 = rng.normal(0, 0.1, 8).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b1"], ["g"]),
             helper.make_node("Sigmoid", ["g"], ["s"]),
             helper.make_node("Mul", ["r", "s"], ["m"]),
             helper.make_node("MaxPool", ["m"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["x", "w3"], ["c"]),
             helper.make_node("MaxPool", ["c"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Add", ["p1", "p2"], ["y"])]
    graph = _graph(nodes, {"x": (1, 8, 6, 6)}, {"w1": w1, "w2": w2, "w3": w3, "b1": b1})
    q = quantize_graph(graph, _feeds((1, 8, 6, 6), 4, 22))
    ops = [n.op for n in q.nodes]
    assert ops.count("QMul") == 1 and ops.count("QAdd") == 1 and ops.count("QLut") == 1, ops
    assert "Conv" not in ops and "Add" not in ops and "Mul" not in ops, ops
    _check(graph, q, _feeds((1, 8, 6, 6), 1, 23)[0], 0.08)
