"""QDQ models with onnxruntime's defaults (asymmetric activations with nonzero zero points,
int8 or uint8, per-channel symmetric int8 weights, int32 biases) through ``from_qdq``: the
integer graph against the QDQ model's own float meaning (within one output step), the CPU
build against the reference executor (bit for bit, every int8 kernel form this CPU runs),
and onnxruntime's ``quantize_static`` models against onnxruntime."""


import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import onnxruntime_qdq

from celosia.compiler.cpu.int8_forms import FORMS, runs_here
from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph import ops, qops
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.quantize import from_qdq, is_qdq
from celosia.compiler.graph.reference import infer_node, run_graph
from celosia.compiler.pipeline import quantize_model
from celosia.models import zoo as models
from celosia.runtime.cpu import CpuModel

pytestmark = pytest.mark.usefixtures("private_cache")  # tests/conftest.py


FORMS_HERE = [n for n in FORMS if runs_here(n)] + ["none"]


def _check_types(graph):
    for node in graph.nodes:
        ins = [graph.types[i] if i else None for i in node.inputs]
        vals = [graph.initializers.get(i) for i in node.inputs]
        assert infer_node(node, ins, vals) == [graph.types[o] for o in node.outputs], node


class _Model:
    """A QDQ model written as onnxruntime writes one: every activation between a
    QuantizeLinear and a DequantizeLinear (random scales and zero points of ``dtype``),
    weights DequantizeLinear(int8 per output channel), biases DequantizeLinear(int32)."""

    def __init__(self, rng, dtype: str):
        self.rng, self.dtype = rng, dtype
        self.nodes, self.inits, self.k = [], [], 0
        self.scales: dict = {}

    def name(self, base):
        self.k += 1
        return f"{base}{self.k}"

    def const(self, array, base="c"):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(array), n))
        return n

    def qdq(self, x, scale=None, zero=None):
        """Q -> DQ of ``x``: (the DequantizeLinear's output, its scale, the integer value)."""
        rng = self.rng
        scale = float(np.float32(rng.uniform(0.01, 0.05))) if scale is None else scale
        low, high = (-128, 128) if self.dtype == "int8" else (0, 256)
        zero = int(rng.integers(low + 40, high - 40)) if zero is None else zero
        s = self.const(np.array(scale, np.float32), "s")
        z = self.const(np.array(zero, self.dtype), "z")
        q, d = self.name("q"), self.name("d")
        self.nodes += [helper.make_node("QuantizeLinear", [x, s, z], [q]),
                       helper.make_node("DequantizeLinear", [q, s, z], [d])]
        self.scales[d] = (scale, zero)
        return d

    def weight(self, shape, axis=0):
        """DequantizeLinear of random int8 weights, one scale per index of ``axis``."""
        w = self.rng.integers(-127, 128, shape).astype(np.int8)
        s = self.rng.uniform(0.002, 0.02, shape[axis]).astype(np.float32)
        out = self.name("w")
        self.nodes.append(helper.make_node("DequantizeLinear", [self.const(w), self.const(s)],
                                           [out], axis=axis))
        return out, s

    def bias(self, s_x, s_w):
        s = (np.float32(s_x) * s_w).astype(np.float32)
        b = self.rng.integers(-3000, 3000, len(s_w)).astype(np.int32)
        out = self.name("b")
        self.nodes.append(helper.make_node("DequantizeLinear", [self.const(b), self.const(s)],
                                           [out], axis=0))
        return out

    def node(self, op, inputs, **attrs):
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv(self, x, cin, cout, group=1, **attrs):
        w, s_w = self.weight((cout, cin // group, 3, 3))
        return self.node("Conv", [x, w, self.bias(self.scales[x][0], s_w)], group=group,
                         **attrs)

    def model(self, x_shape, outputs):
        graph = helper.make_graph(
            self.nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              x_shape)],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = models.IR_VERSION
        return onnx.shape_inference.infer_shapes(model)


def _network(seed: int, dtype: str):
    """Conv (padded) -> Conv (grouped, strided, Relu) + residual Add -> MaxPool ->
    GlobalAveragePool -> Flatten -> Gemm, and a Sigmoid (no integer form) on the pool."""
    m = _Model(np.random.default_rng(seed), dtype)
    a = m.qdq("x")
    c1 = m.qdq(m.conv(a, 4, 8, pads=[1, 1, 1, 1]))
    c2 = m.node("Relu", [m.conv(c1, 8, 8, group=2, pads=[1, 1, 1, 1])])
    c2 = m.qdq(c2, zero=-128 if dtype == "int8" else 0)  # the Relu is redundant
    s = m.qdq(m.node("Add", [c2, c1]))
    p = m.qdq(m.node("MaxPool", [s], kernel_shape=[2, 2], strides=[2, 2]), *m.scales[s])
    g = m.qdq(m.node("GlobalAveragePool", [p]))
    f = m.qdq(m.node("Flatten", [g], axis=1), *m.scales[g])
    w, s_w = m.weight((10, 8))
    y = m.qdq(m.node("Gemm", [f, w, m.bias(m.scales[f][0], s_w)], transB=1))
    y2 = m.qdq(m.node("Sigmoid", [g]))
    return m.model([1, 4, 9, 9], [y, y2]), m.scales, (y, y2)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_network_of_zero_points(seed, dtype):
    """Every layer becomes integer (the Sigmoid stays float between Quantize and
    Dequantize), and the result is the QDQ model's within one step of each output: the
    integer requantization rounds as the float one up to ``multiplier / 2**(shift+1)`` of a
    step (quantize.py), so each layer's int8 output is the float one's or one step off
    (measured: the differences do not grow along this chain)."""
    model, scales, outs = _network(seed, dtype)
    graph = import_onnx(model)
    assert is_qdq(graph)
    q = from_qdq(graph)
    _check_types(q)
    ops_ = [n.op for n in q.nodes]
    for op in ("QConv", "QAdd", "QGlobalAveragePool", "QGemm", "Quantize", "Dequantize"):
        assert op in ops_, op
    assert ops_.count("QConv") == 2 and "Conv" not in ops_ and "Gemm" not in ops_
    assert not any(n.op in ("QuantizeLinear", "DequantizeLinear") for n in q.nodes)
    assert [n.op for n in q.nodes if "float_reason" in n.attrs] == ["Sigmoid"]
    pads = [n.attrs.get("pad_value") for n in q.nodes if n.op == "QConv"]
    assert all(p is not None for p in pads)  # both padded layers read their zero point
    rng = np.random.default_rng(100 + seed)
    for _ in range(4):
        feeds = {"x": rng.normal(0, 1.5, (1, 4, 9, 9)).astype(np.float32)}
        got, want = run_graph(q, feeds), run_graph(graph, feeds)
        for o in outs:
            steps = np.abs(got[o] - want[o]) / scales[o][0]
            assert steps.max() <= 1 + 1e-3, (o, steps.max())


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_network_cpu_build_every_form(dtype, tmp_path):
    """The rewritten graph's CPU build equals the reference executor bit for bit with each
    int8 kernel form this CPU runs (and the float-FMA kernels: "none"); CpuModel.build of
    the QDQ model takes the same path, says so in build_info, and saves and loads."""
    model, _, outs = _network(7, dtype)
    q = quantize_model(model.SerializeToString())
    rng = np.random.default_rng(8)
    feeds = [{"x": rng.normal(0, 1.5, (1, 4, 9, 9)).astype(np.float32)} for _ in range(3)]
    want = [run_graph(q, f) for f in feeds]
    for name in FORMS_HERE:
        built = CpuModel.from_graph(q, int8_form=name)
        for f, w in zip(feeds, want):
            got = built.run(f)
            for o in outs:
                np.testing.assert_array_equal(got[o], w[o], err_msg=f"{name} {o}")
    lines = []
    built = CpuModel.build(model.SerializeToString(), progress=lines.append)
    info = built.build_info["qdq"]
    assert info["integer_ops"] == {"QConv": 2, "QAdd": 1, "QGlobalAveragePool": 1,
                                   "QGemm": 1}
    assert info["float_ops"] == ["Sigmoid"] and any("QDQ model" in s for s in lines)
    built.save(tmp_path / "qdq.cel")
    loaded = CpuModel.load(tmp_path / "qdq.cel")
    assert loaded.build_info["qdq"] == info
    for f, w in zip(feeds, want):
        for got in (built.run(f), loaded.run(f)):
            for o in outs:
                np.testing.assert_array_equal(got[o], w[o], err_msg=o)


@pytest.mark.parametrize("seed", range(4))
def test_single_layers_within_one_step(seed):
    """One DQ -> Conv/Gemm/MatMul -> Q with random zero points on both sides: the
    QConv/QGemm's output is the float QDQ layer's, or one step off, and mostly identical;
    a MatMul on a 3-D input (a transformer's dense layers) is a QGemm on its rows."""
    rng = np.random.default_rng(seed)
    for op in ("Conv", "Gemm", "MatMul"):
        m = _Model(rng, "int8")
        x = m.qdq("x")
        if op == "Conv":
            y = m.qdq(m.conv(x, 6, 16, pads=[1, 2, 0, 1], strides=[2, 1]))
            shape = [2, 6, 7, 8]
        elif op == "Gemm":
            w, s_w = m.weight((16, 24))
            y = m.qdq(m.node("Gemm", [x, w, m.bias(m.scales[x][0], s_w)], transB=1))
            shape = [5, 24]
        else:
            w, _ = m.weight((24, 16), axis=1)  # [K, O]: a scale per column
            y = m.qdq(m.node("MatMul", [x, w]))
            shape = [2, 5, 24]
        graph = import_onnx(m.model(shape, [y]))
        q = from_qdq(graph)
        assert [n.op for n in q.nodes].count("QConv" if op == "Conv" else "QGemm") == 1
        feeds = {"x": rng.normal(0, 1.5, shape).astype(np.float32)}
        got = run_graph(q, feeds)[y]
        d = np.abs(got - run_graph(graph, feeds)[y]) / m.scales[y][0]
        assert d.max() <= 1 + 1e-3 and (d < 0.5).mean() > 0.9, (op, d.max(), (d < .5).mean())
        np.testing.assert_array_equal(CpuModel.from_graph(optimize(q)).run(feeds)[y], got)


@pytest.mark.parametrize("zero", [0, -128, 37, 127])
@pytest.mark.parametrize("scale", [0.0123, 1 / 255, 0.5])
def test_quantize_is_quantize_linear(scale, zero):
    """The Quantize/Dequantize the leftover QuantizeLinear/DequantizeLinear nodes become
    compute what ONNX's do, bit for bit: halves round to even, values saturate."""
    rng = np.random.default_rng(3)
    s = np.float32(scale)
    x = np.concatenate([rng.normal(0, 200 * s, 4000).astype(np.float32),
                        (np.arange(-300, 300, dtype=np.float32) + np.float32(0.5)) * s,
                        np.array([1e30, -1e30, 0.0], np.float32)])
    attrs = {"axis": 1, "block_size": 0, "output_dtype": "int8", "precision": "float32",
             "saturate": 1}
    want = ops.quantize_linear(attrs, x, np.array(s), np.array(zero, np.int8))
    got = qops.quantize({"scale": float(s), "zero_point": zero}, x)
    np.testing.assert_array_equal(got, want)
    back = ops.dequantize_linear({"axis": 1, "block_size": 0, "output_dtype": "float32"},
                                 want, np.array(s), np.array(zero, np.int8))
    np.testing.assert_array_equal(qops.dequantize({"scale": float(s), "zero_point": zero},
                                                  want), back)


def test_uint8_values_as_int8_are_exact():
    """A uint8 QDQ model whose layers cannot become integer (a Sigmoid) still has its
    uint8 values mapped to int8 (128 lower, zero points too), and computes exactly what the
    uint8 model does; a uint8 graph output stays uint8."""
    m = _Model(np.random.default_rng(4), "uint8")
    d = m.qdq(m.node("Sigmoid", [m.qdq("x")]))
    s = m.const(np.array(0.02, np.float32))
    z = m.const(np.array(200, np.uint8))
    m.nodes.append(helper.make_node("QuantizeLinear", [d, s, z], ["raw"]))
    model = m.model([3, 50], [d])
    model.graph.output.append(helper.make_tensor_value_info("raw", TensorProto.UINT8, None))
    graph = import_onnx(model)
    q = from_qdq(graph)
    assert q.types["raw"].dtype == "uint8"
    assert sum(n.op == "Quantize" for n in q.nodes) == 2  # the two internal ones, int8
    feeds = {"x": np.random.default_rng(5).normal(0, 3, (3, 50)).astype(np.float32)}
    got, want = run_graph(q, feeds), run_graph(graph, feeds)
    for o in (d, "raw"):
        np.testing.assert_array_equal(got[o], want[o], err_msg=o)
    np.testing.assert_array_equal(CpuModel.from_graph(optimize(q)).run(feeds)[d], want[d])


def test_unmatched_patterns_stay_float_and_correct():
    """A Conv whose output QuantizeLinear has a per-channel scale and a MatMul of two
    activations have no integer form here: they stay float between their conversions, and
    the graph computes what the QDQ model does."""
    m = _Model(np.random.default_rng(6), "int8")
    a = m.qdq("x")
    c = m.conv(a, 3, 4, pads=[1, 1, 1, 1])
    s = m.const(np.linspace(0.01, 0.04, 4).astype(np.float32))
    z = m.const(np.zeros(4, np.int8))
    m.nodes += [helper.make_node("QuantizeLinear", [c, s, z], ["cq"], axis=1),
                helper.make_node("DequantizeLinear", ["cq", s, z], ["cd"], axis=1)]
    r = m.qdq(m.node("Reshape", ["cd", m.const(np.array([4, 64], np.int64))]))
    t = m.qdq(m.node("Transpose", [r], perm=[1, 0]), *m.scales[r])
    y = m.qdq(m.node("MatMul", [r, t]))
    graph = import_onnx(m.model([1, 3, 8, 8], [y]))
    q = from_qdq(graph)
    kept = {n.op for n in q.nodes if "float_reason" in n.attrs}
    assert {"Conv", "MatMul"} <= kept
    assert any(n.op == "Transpose" and q.types[n.outputs[0]].dtype == "int8"
               for n in q.nodes)
    feeds = {"x": np.random.default_rng(7).normal(size=(1, 3, 8, 8)).astype(np.float32)}
    np.testing.assert_array_equal(run_graph(q, feeds)[y], run_graph(graph, feeds)[y])
    np.testing.assert_array_equal(CpuModel.build(m.model([1, 3, 8, 8], [y])).run(feeds)[y],
                                  run_graph(optimize(q), feeds)[y])


# ---- onnxruntime's quantize_static with its defaults -----------------------------------------


@pytest.mark.parametrize("activation_type", ["QInt8", "QUInt8"])
def test_onnxruntime_defaults_small_cnn(tmp_path, activation_type):
    """The zoo's small CNN quantized by onnxruntime with its defaults (asymmetric
    activations): every Conv/Gemm integer, within one output step of onnxruntime's own run
    of the QDQ model (it requantizes in float), and the CPU build bit for bit the reference
    executor's."""
    import onnxruntime as ort

    rng = np.random.default_rng(8)
    data = [{"image": rng.normal(size=(1, 1, 8, 8)).astype(np.float32)} for _ in range(16)]
    path = onnxruntime_qdq(tmp_path, models.small_cnn(), data, activation_type)
    q = quantize_model(path)
    ops_ = [n.op for n in q.nodes]
    assert ops_.count("QConv") == 2 and ops_.count("QGemm") == 1 and "Conv" not in ops_
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    built = CpuModel.build(str(path))
    assert built.build_info["qdq"]["integer_ops"] == {"QConv": 2, "QGemm": 1}
    out = q.outputs[0]
    step = float(onnx.numpy_helper.to_array(next(
        i for i in onnx.load(path).graph.initializer
        if i.name == next(n for n in onnx.load(path).graph.node
                          if n.output[0] == out).input[1])))
    held = [{"image": rng.normal(size=(1, 1, 8, 8)).astype(np.float32)} for _ in range(32)]
    diffs = []
    for x in held:
        got = run_graph(q, x)[out]
        np.testing.assert_array_equal(built.run(x)[out], got)
        diffs.append(np.abs(got - session.run(None, x)[0]) / step)
    d = np.concatenate(diffs)
    assert d.max() <= 1 + 1e-3 and (np.rint(d) == 0).mean() > 0.6, (d.max(), (d < .5).mean())


def test_symmetric_matmul_of_activations():
    """DQ(a) @ DQ(b) -> Q with every zero point 0 (``ActivationSymmetric``: attention's
    products) is a QMatMul within one step of the float QDQ product, the CPU build bit for
    bit the reference executor's; with a zero point it stays float (the test above)."""
    m = _Model(np.random.default_rng(9), "int8")
    a = m.qdq("x", zero=0)
    t = m.qdq(m.node("Transpose", [a], perm=[0, 2, 1]), *m.scales[a])
    y = m.qdq(m.node("MatMul", [a, t]), zero=0)
    graph = import_onnx(m.model([2, 6, 40], [y]))
    q = from_qdq(graph)
    assert [n.op for n in q.nodes if n.op in ("QMatMul", "MatMul")] == ["QMatMul"]
    rng = np.random.default_rng(10)
    for _ in range(3):
        feeds = {"x": rng.normal(0, 0.2, (2, 6, 40)).astype(np.float32)}
        got = run_graph(q, feeds)[y]
        d = np.abs(got - run_graph(graph, feeds)[y]) / m.scales[y][0]
        assert d.max() <= 1 + 1e-3, d.max()
        np.testing.assert_array_equal(CpuModel.from_graph(optimize(q)).run(feeds)[y], got)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_bias_add_after_matmul(dtype):
    """A transformer's dense layer as onnxruntime writes it: DQ -> MatMul -> Q -> DQ ->
    Add(DQ(bias constant [O], int8 or uint8)) -> Q. The MatMul is a QGemm on rows, the Add a
    QAdd of the constant broadcast (a compiled kernel, not a numpy step), each within one
    step of the float QDQ graph; the CPU build bit for bit the reference executor's."""
    m = _Model(np.random.default_rng(11), dtype)
    x = m.qdq("x")
    w, _ = m.weight((24, 16), axis=1)
    mm = m.qdq(m.node("MatMul", [x, w]))
    low, high = (-128, 128) if dtype == "int8" else (0, 256)
    c = m.const(m.rng.integers(low, high, 16).astype(dtype))
    bias = m.name("bias")
    m.nodes.append(helper.make_node("DequantizeLinear", [c, m.const(np.array(0.01, np.float32)),
                                                         m.const(np.array(5, dtype))], [bias]))
    y = m.qdq(m.node("Add", [mm, bias]))
    graph = import_onnx(m.model([2, 5, 24], [y]))
    q = optimize(from_qdq(graph))
    assert sorted(n.op for n in q.nodes if n.op in ("QAdd", "QGemm", "Add", "MatMul")) == \
        ["QAdd", "QGemm"]
    rng = np.random.default_rng(12)
    built = CpuModel.from_graph(q)
    (step,) = [s for s in built.program.steps if s["node"] == next(
        n.name for n in q.nodes if n.op == "QAdd")]
    assert step["kind"] == "kernel"
    for _ in range(3):
        feeds = {"x": rng.normal(0, 1.5, (2, 5, 24)).astype(np.float32)}
        got = run_graph(q, feeds)[y]
        d = np.abs(got - run_graph(graph, feeds)[y]) / m.scales[y][0]
        assert d.max() <= 1 + 1e-3, d.max()
        np.testing.assert_array_equal(built.run(feeds)[y], got)
