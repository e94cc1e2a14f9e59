"""Zero points through Quantize and Dequantize (qops.py's ``zero_point``), and lower bounds
through squeeze-excitation (quantize._table_lows): a SiLU output read by a float ``x *
gate`` and that product, Quantized for the next 1x1 convolution, spend 256 steps on
[SiLU's least value, max] instead of 128 on [-max, max]. Checked: the numpy definitions
and the compiled CPU kernels give the same bits (NaN, clipping, halfway values), the zero
points are where the bound says (on the QMul by the gate, or a float product's Quantize), and
the error to the float graph shrinks on seeded data."""

from dataclasses import replace

import numpy as np
import pytest
from onnx import helper
from onnx_builders import float_graph

from celosia.compiler.graph.ir import Graph, Node, TensorType
from celosia.compiler.graph.quantize import quantize_graph
from celosia.compiler.graph.qzero import quantize_affine
from celosia.compiler.graph.reference import run_graph
from celosia.runtime.cpu import CpuModel

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize("zero", [-128, -117, 0, 5, 127])
def test_quantize_dequantize_zero_point_bits(zero):
    scale = 0.0371
    t = TensorType("float32", (4, 64))
    nodes = (Node("Quantize", ("x",), ("xq",), {"scale": scale, "zero_point": zero}, "q"),
             Node("Dequantize", ("xq",), ("y",), {"scale": scale, "zero_point": zero}, "d"))
    graph = Graph("t", ("x",), ("y",), nodes, {},
                  {"x": t, "xq": TensorType("int8", t.shape), "y": t})
    rng = np.random.default_rng(zero + 1000)
    x = (rng.normal(0, 4, t.shape) * scale * 10).astype(np.float32)
    # halfway points, values clipped at both ends, NaN and infinities
    x[0, :16] = ((np.arange(16) - 8) + 0.5) * np.float32(scale)
    x[1, :6] = [np.nan, np.inf, -np.inf, 1e6, -1e6, 0.0]
    want = run_graph(graph, {"x": x})["y"]
    built = CpuModel.from_graph(graph)
    np.testing.assert_array_equal(built.run({"x": x})["y"], want)
    kinds = {s["op"]: s["kind"] for s in built.program.steps}
    assert kinds.get("Quantize") == kinds.get("Dequantize") == "kernel", kinds
    # the definition: q = clip(rint(x / s) + z), NaN -> z; y = (q - z) * s
    with np.errstate(invalid="ignore"):
        q = np.clip(np.nan_to_num(np.rint(x / np.float32(scale)), nan=0.0, posinf=1e9,
                                  neginf=-1e9) + zero, -128, 127)
    np.testing.assert_array_equal(want, ((q - zero) * np.float32(scale)).astype(np.float32))


def _se_block(seed):
    """Conv 3x3 + SiLU, squeeze-excitation (GlobalAveragePool, 1x1 Conv + Relu, 1x1 Conv
    + Sigmoid, x * gate broadcast over H, W), then a 1x1 projection."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.3, (16, 4, 3, 3)).astype(np.float32),
             "b1": rng.normal(0, 0.3, 16).astype(np.float32),
             "wr": rng.normal(0, 0.3, (4, 16, 1, 1)).astype(np.float32),
             "we": rng.normal(0, 0.5, (16, 4, 1, 1)).astype(np.float32),
             "wp": rng.normal(0, 0.2, (8, 16, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Sigmoid", ["c1"], ["s1"]),
             helper.make_node("Mul", ["c1", "s1"], ["a"]),
             helper.make_node("GlobalAveragePool", ["a"], ["p"]),
             helper.make_node("Conv", ["p", "wr"], ["r0"]),
             helper.make_node("Relu", ["r0"], ["r"]),
             helper.make_node("Conv", ["r", "we"], ["e"]),
             helper.make_node("Sigmoid", ["e"], ["gate"]),
             helper.make_node("Mul", ["a", "gate"], ["m"]),
             helper.make_node("Conv", ["m", "wp"], ["y"])]
    return float_graph(nodes, {"x": (1, 4, 8, 8)}, inits)


def _feeds(n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, 4, 8, 8)).astype(np.float32)} for _ in range(n)]


def _rms(want, got):
    return float(np.sqrt(((want - got) ** 2).mean() / (want ** 2).mean()))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_squeeze_excitation_takes_zero_points(seed):
    graph = _se_block(seed)
    calib, test = _feeds(6, seed), _feeds(4, seed + 100)
    floats = [run_graph(replace(graph, outputs=("y", "m")), feeds) for feeds in test]
    errors, m_errors = [], []
    for zero_points in (False, True):
        q = quantize_graph(graph, calib, zero_points=zero_points, bias_correction=False)
        cpu = CpuModel.from_graph(q)
        err = []
        for feeds, want in zip(test, floats):
            ref = run_graph(q, feeds)["y"]
            np.testing.assert_array_equal(cpu.run(feeds)["y"], ref)
            err.append(_rms(want["y"], ref))
        errors.append(float(np.mean(err)))
        # the rounding error of the product x * gate alone, in the scale and zero point it
        # got: an int8 QMul by the gate (its output zero point), or a float product's
        # Quantize
        made = {n.outputs[0]: n for n in q.nodes}
        prod = made.get("m/int8") or made["m"]
        assert prod.op in ("Quantize", "QMul"), [n.op for n in q.nodes]
        z, s = ((prod.attrs.get("zero_point", 0), prod.attrs["scale"]) if prod.op == "Quantize"
                else (int(prod.attrs.get("zero_points", (0, 0, 0))[2]), prod.attrs["scale"]))
        m_errors.append(float(np.mean([_rms(w["m"], quantize_affine(w["m"], s, z))
                                       for w in floats])))
    # the SiLU output as x * gate reads it and the product: both with the zero point of
    # SiLU's least value (-0.2785) at -128 (within a step)
    if prod.op == "QMul":
        za, _, zo = (int(v) for v in prod.attrs["zero_points"])
        checks = [("a", made["a"].attrs["scale"], za), ("m", prod.attrs["scale"], zo)]
    else:
        deq = [n for n in q.nodes if n.op == "Dequantize" and n.inputs[0] == "a"]
        assert deq, [n.op for n in q.nodes]
        checks = [(n.name, n.attrs["scale"], n.attrs["zero_point"]) for n in (deq[0], prod)]
    for name, s, z in checks:
        assert -0.2785 - s <= s * (-128 - z) <= -0.2785 + s, (name, s, z)
    # the product's own error about halves (measured 0.53-0.56: no test value clipped);
    # the output's, with every other rounding in it too, shrinks (measured 0.74-0.86)
    assert m_errors[1] < 0.6 * m_errors[0], m_errors
    assert errors[1] < 0.9 * errors[0], errors


@pytest.mark.parametrize("zeros", [(-120, -128, -126), (5, 0, -3), (0, 0, 0)])
@pytest.mark.parametrize("gate_shape", [(2, 16, 5, 3), (2, 16, 1, 1)])
def test_qmul_zero_points_bits(zeros, gate_shape):
    """QMul's ``zero_points``: the compiled kernel ("qmulz") equals qops.qmul, which is
    ``clip(((a - za) * (b - zb) * m + 2**(shift-1)) >> shift) + zo``, full and broadcast
    (squeeze-excitation's gate) operands, the multiplier the largest quantize.py allows."""
    rng = np.random.default_rng(abs(sum(zeros)) + gate_shape[-1])
    shape = (2, 16, 5, 3)
    attrs = {"multipliers": [2**31 // (256 * 256) - 1], "shift": 16, "scale": 0.1}
    if any(zeros):
        attrs["zero_points"] = list(zeros)
    t = {"a": TensorType("int8", shape), "b": TensorType("int8", gate_shape),
         "y": TensorType("int8", shape)}
    graph = Graph("t", ("a", "b"), ("y",), (Node("QMul", ("a", "b"), ("y",), attrs, "mul"),),
                  {}, t)
    feeds = {"a": rng.integers(-128, 128, shape).astype(np.int8),
             "b": rng.integers(-128, 128, gate_shape).astype(np.int8)}
    feeds["a"].flat[:2], feeds["b"].flat[:2] = (-128, 127), (-128, 127)
    built = CpuModel.from_graph(graph)
    want = run_graph(graph, feeds)["y"]
    np.testing.assert_array_equal(built.run(feeds)["y"], want)
    assert {s["op"]: s["kind"] for s in built.program.steps}.get("QMul") == "kernel"
    assert [s["op"] for s in built.program.specs.values()] == \
        ["qmulz" if any(zeros) else "qmul"]
    za, zb, zo = zeros
    m, shift = attrs["multipliers"][0], attrs["shift"]
    prod = (feeds["a"].astype(np.int64) - za) * (feeds["b"].astype(np.int64) - zb) * m
    np.testing.assert_array_equal(want, np.clip(((prod + (1 << (shift - 1))) >> shift) + zo,
                                                 -128, 127).astype(np.int8))
