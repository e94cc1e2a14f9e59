"""Quantized graphs with QLut, QAdd, QMul and QMatMul built for the CPU: each op a compiled
kernel step (lowering_q.py), the outputs equal to graph.reference.run_graph bit for bit,
in the blocked layout of the QConvs around them and in the plain one, with broadcast
operands; and the zoo's small EfficientNet (QLut, QMul) and BERT (QMatMul, QLut) quantized
from 6 calibration feeds with no q-op left as a numpy step."""

import numpy as np
import pytest
from int8_data import int8s

from celosia.compiler.graph.ir import Graph, Node, NodeError, TensorType, constant
from celosia.compiler.graph.reference import infer_node, run_graph
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.cpu import CpuModel

QOPS = ("QLut", "QAdd", "QMul", "QMatMul")

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")




def graph_of(nodes, inputs: dict, consts: dict, outputs, types=None) -> Graph:
    """A graph of ``nodes``; the output types inferred unless given in ``types`` (a
    broadcast QMul, which qops.py computes but its shape rule does not yet accept)."""
    all_types = dict(inputs)
    all_types.update({k: TensorType(str(v.dtype), tuple(v.shape)) for k, v in consts.items()})
    for node in nodes:
        if types and node.outputs[0] in types:
            all_types[node.outputs[0]] = types[node.outputs[0]]
            continue
        out = infer_node(node, [all_types[i] if i else None for i in node.inputs],
                         [consts.get(i) for i in node.inputs])
        all_types.update(zip(node.outputs, out))
    return Graph("t", tuple(inputs), tuple(outputs), tuple(nodes),
                 {k: constant(v) for k, v in consts.items()}, all_types)


def same_as_numpy(graph: Graph, feeds: dict) -> CpuModel:
    """The CPU build's outputs equal run_graph's bit for bit, every q-op a kernel step (and
a view of its output)."""
    built = CpuModel.from_graph(graph)
    got, want = built.run(feeds), run_graph(graph, feeds)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    kinds = [(s["op"], s["kind"]) for s in built.program.steps if s["op"] in QOPS]
    assert ("kernel" in {k for _, k in kinds} and "numpy" not in {k for _, k in kinds}), kinds
    return built


def _qconv(rng, name, x, c, m, out, kernel=1):
    attrs = {"kernel_shape": [kernel, kernel], "strides": [1, 1],
             "pads": [kernel // 2] * 4, "dilations": [1, 1], "group": 1, "shift": 14,
             "lo": -128, "hi": 127, "scale": 0.1}
    consts = {f"{name}.w": int8s(rng, (m, c, kernel, kernel)),
              f"{name}.b": rng.integers(-2000, 2000, m).astype(np.int32),
              f"{name}.m": rng.integers(100, 400, m).astype(np.int32)}
    return Node("QConv", (x, *consts), (out,), attrs, name), consts


@pytest.mark.parametrize("batch,hw", [(1, (5, 7)), (2, (3, 3))])
def test_blocked_lut_add_and_se_gate_between_qconvs(batch, hw):
    """QConv -> QLut -> QAdd (residual, the block input) -> QMul by a per-image, per-channel
    gate [N, C, 1, 1] (QGlobalAveragePool -> QConv -> QLut): blocked all the way."""
    rng = np.random.default_rng(batch)
    c = 32
    conv1, k1 = _qconv(rng, "conv1", "x", c, c, "y1", 3)
    conv2, k2 = _qconv(rng, "conv2", "pooled", c, c, "g1")
    table = int8s(rng, (256,), 0.0)
    nodes = [conv1,
             Node("QLut", ("y1", "table"), ("y2",), {"scale": 0.1}, "lut"),
             Node("QAdd", ("y2", "x"), ("y3",), {"multipliers": [9000, -7000], "shift": 13,
                                                 "scale": 0.1}, "add"),
             Node("QGlobalAveragePool", ("y3",), ("pooled",),
                  {"multiplier": 1 << 16, "shift": 16 + 3, "scale": 0.1}, "gap"),
             conv2,
             Node("QLut", ("g1", "table"), ("gate",), {"scale": 0.1}, "gate_lut"),
             Node("QMul", ("y3", "gate"), ("y",), {"multipliers": [300000], "shift": 22,
                                                   "scale": 0.1}, "se")]
    shape = (batch, c, *hw)
    g = graph_of(nodes, {"x": TensorType("int8", shape)}, {**k1, **k2, "table": table},
                 ["y", "y2"], types={"y": TensorType("int8", shape)})
    built = same_as_numpy(g, {"x": int8s(rng, shape)})
    specs = {s["op"]: s for s in built.program.specs.values()}
    assert specs["qadd"]["layout"] == specs["qmul"]["layout"] == "blocked"
    assert specs["qmul"]["operands"] == ["full", "image_channel"]
    unpacks = [s for s in built.program.steps if s["op"] == "unpack"]
    assert len(unpacks) == 2  # the two graph outputs only


def test_plain_qops_with_broadcast_operands(tmp_path):
    """Plain layout: QAdd of [2, 1, 5] and [3, 1] ("broadcast" operands both), QMul of
    that by a full value, a QLut of rank 1."""
    rng = np.random.default_rng(7)
    nodes = [Node("QAdd", ("a", "b"), ("s",), {"multipliers": [2**30, -2**29], "shift": 30,
                                               "scale": 1.0}, "add"),
             Node("QMul", ("s", "c"), ("p",), {"multipliers": [2**12], "shift": 9,
                                               "scale": 1.0}, "mul"),
             Node("QLut", ("v", "table"), ("t",), {"scale": 1.0}, "lut")]
    inputs = {"a": TensorType("int8", (2, 1, 5)), "b": TensorType("int8", (3, 1)),
              "c": TensorType("int8", (2, 3, 5)), "v": TensorType("int8", (11,))}
    g = graph_of(nodes, inputs, {"table": int8s(rng, (256,), 0.0)}, ["p", "t"],
                 types={"s": TensorType("int8", (2, 3, 5)), "p": TensorType("int8", (2, 3, 5))})
    built = same_as_numpy(g, {k: int8s(rng, t.shape) for k, t in inputs.items()})
    kinds = [s["operands"] for s in built.program.specs.values() if s["op"] == "qadd"]
    assert kinds == [[["broadcast", [2, 1, 5]], ["broadcast", [1, 3, 1]]]]
    # the .cel round trip: the q-op kernels (lut.py's too) load and compute the same bits
    feeds = {k: int8s(rng, t.shape) for k, t in inputs.items()}
    built.save(tmp_path / "q.cel")
    loaded = CpuModel.load(tmp_path / "q.cel")
    want = run_graph(g, feeds)
    for name, value in loaded.run(feeds).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 7, 16), (2, 3, 16, 9)),
                                             ((5, 33), (33, 1)), ((1, 4, 1, 8), (1, 4, 8, 70))])
def test_qmatmul_of_run_time_values(a_shape, b_shape, tmp_path):
    rng = np.random.default_rng(len(a_shape))
    nodes = [Node("QMatMul", ("a", "b"), ("y",), {"multiplier": 12345, "shift": 19,
                                                  "scale": 0.5}, "mm")]
    inputs = {"a": TensorType("int8", a_shape), "b": TensorType("int8", b_shape)}
    g = graph_of(nodes, inputs, {}, ["y"])
    feeds = {k: int8s(rng, t.shape) for k, t in inputs.items()}
    same_as_numpy(g, feeds).save(tmp_path / "mm.cel")
    np.testing.assert_array_equal(CpuModel.load(tmp_path / "mm.cel").run(feeds)["y"],
                                  run_graph(g, feeds)["y"])


def test_broadcast_batches_and_bad_attributes_stay_numpy():
    """A QMatMul whose batch axes broadcast, and a QAdd with a shift qops refuses: numpy
    steps, the first equal to run_graph, the second failing at run time as there."""
    rng = np.random.default_rng(2)
    g = graph_of([Node("QMatMul", ("a", "b"), ("y",), {"multiplier": 3, "shift": 4,
                                                       "scale": 1.0}, "mm")],
                 {"a": TensorType("int8", (2, 3, 4)), "b": TensorType("int8", (1, 4, 5))},
                 {}, ["y"])
    feeds = {"a": int8s(rng, (2, 3, 4)), "b": int8s(rng, (1, 4, 5))}
    built = CpuModel.from_graph(g)
    assert [s["kind"] for s in built.program.steps if s["op"] == "QMatMul"] == ["numpy"]
    np.testing.assert_array_equal(built.run(feeds)["y"], run_graph(g, feeds)["y"])
    g = graph_of([Node("QAdd", ("a", "a"), ("y",), {"multipliers": [1, 1], "shift": 0,
                                                    "scale": 1.0}, "add")],
                 {"a": TensorType("int8", (2, 3, 4))}, {}, ["y"])
    built = CpuModel.from_graph(g)
    assert [s["kind"] for s in built.program.steps if s["op"] == "QAdd"] == ["numpy"]
    with pytest.raises(NodeError, match="shift 0 must be in"):
        built.run({"a": feeds["a"]})


# ---- the zoo's small models, quantized ------------------------------------------------------


def _quantized_zoo(name):
    from celosia.models.registry import entry

    e = entry(name)
    if e.missing():
        pytest.skip(e.missing())
    feeds = [e.make_feeds("small", seed=s) for s in range(6)]
    calib = {k: np.stack([f[k] for f in feeds]) for k in feeds[0]}
    shapes = {k: list(v.shape) for k, v in feeds[0].items()} if e.dynamic else None
    return quantize_model(e.model("small"), calib, input_shapes=shapes), \
        e.make_feeds("small", seed=99)


def test_efficientnet_int8_equals_run_graph():
    g, feeds = _quantized_zoo("efficientnet")
    assert {"QLut", "QMul"} <= {n.op for n in g.nodes}
    built = same_as_numpy(g, feeds)
    assert not [s for s in built.program.steps if s["kind"] == "numpy"]


def test_bert_int8_q_ops_are_kernels_equal_to_run_graph():
    """BERT's QMatMuls and QLut are kernels; every int8 value they make equals run_graph's
    bit for bit (the outputs go through float LayerNorm and Softmax kernels, which agree
    with numpy to float32 rounding only, so the int8 values are compared: each q-op's
    output made a graph output)."""
    g, feeds = _quantized_zoo("bert")
    assert {"QLut", "QMatMul"} <= {n.op for n in g.nodes}
    q_outputs = tuple(n.outputs[0] for n in g.nodes if n.op in QOPS)
    g = Graph(g.name, g.inputs, g.outputs + q_outputs, g.nodes, g.initializers, g.types)
    built = CpuModel.from_graph(g)
    got, want = built.run(feeds), run_graph(g, feeds)
    for name in q_outputs:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert {s["op"] for s in built.program.steps if s["kind"] == "numpy"} & set(QOPS) == set()


@pytest.mark.slow
def test_bench_cpu_qops_quick():
    """`celosia bench cpu-qops --quick`: both builds agree and the kernels build has no q-op
    numpy step (the speed itself is for the full run on a quiet machine)."""
    from celosia.benchmarks import run_benchmark

    result = run_benchmark("cpu-qops", quick=True)
    for name, d in result["models"].items():
        assert d["same_outputs"], name
        assert not set(d["numpy_steps_after"]) & set(QOPS), name
        assert set(d["numpy_steps_before"]) & set(QOPS), name
        assert d["kernels_ms"] > 0 and d["numpy_ms"] > 0
