"""Zero points for non-negative activations (compiler/graph/qzero.py): a Relu output read by
a 1x1 convolution or a Gemm spends all 256 int8 steps on [0, max] instead of 128, folded
into the integer operators' own constants. Checked: the error to the float graph shrinks
against the symmetric scheme on seeded data, the zero point is where it is exact (a
padded convolution's padding reads it), and the CPU build computes the numpy definitions'
bits."""

import numpy as np
import pytest
from onnx_builders import float_graph as _graph
from onnx import helper

from celosia.compiler.graph import quantize
from celosia.compiler.graph.quantize import quantize_graph
from celosia.compiler.graph.reference import run_graph
from celosia.runtime.cpu import CpuModel



def _feeds(shape, n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(n)]


def _rms(want, got):
    return float(np.sqrt(((want - got) ** 2).mean() / (want ** 2).mean()))


def _errors(graph, seed):
    """RMS relative error to the float graph on held-out samples, symmetric and with zero
    points, after checking each quantized graph's CPU build against the numpy one."""
    shape = graph.types["x"].shape
    calib, test = _feeds(shape, 6, seed), _feeds(shape, 4, seed + 100)
    out = []
    for zero_points in (False, True):
        # (without bias correction, which takes off part of both errors: the zero points'
        # own gain is what is measured)
        q = quantize_graph(graph, calib, zero_points=zero_points, bias_correction=False)
        cpu = CpuModel.from_graph(q)
        err = []
        for feeds in test:
            ref = run_graph(q, feeds)["y"]
            np.testing.assert_array_equal(cpu.run(feeds)["y"], ref)
            err.append(_rms(run_graph(graph, feeds)["y"], ref))
        out.append((q, float(np.mean(err))))
    return out


def _chain(pads):
    """Conv 3x3 + Relu, then a Conv of kernel 1 (pads 0) or 3 (pads 1) reading the Relu
    output, then Flatten and a Gemm."""
    rng = np.random.default_rng(7)
    k = 1 if pads == 0 else 3
    inits = {"w1": rng.normal(0, 0.3, (16, 4, 3, 3)).astype(np.float32),
             "b1": rng.normal(0, 0.1, 16).astype(np.float32),
             "w2": rng.normal(0, 0.2, (8, 16, k, k)).astype(np.float32),
             "b2": rng.normal(0, 0.1, 8).astype(np.float32),
             "w3": rng.normal(0, 0.1, (10, 8 * 8 * 8)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[pads] * 4),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "w3"], ["y"], transB=1)]
    return _graph(nodes, {"x": (1, 4, 8, 8)}, inits)


def _relu_scales(q):
    """{QConv/QGemm name: (its int32 bias, lo)} to tell where a zero point went."""
    return {n.name: (q.initializers[n.inputs[2]], n.attrs["lo"]) for n in q.nodes
            if n.op in ("QConv", "QGemm")}


def test_zero_points_shrink_the_error_of_relu_outputs_read_by_1x1_convs():
    ratios = []
    for seed in (1, 2, 3):
        (q_sym, e_sym), (q_zp, e_zp) = _errors(_chain(pads=0), seed)
        # Both Relu outputs take the zero point -128 (their clamp at 0 becomes lo = -128):
        # r1 read by the 1x1 conv, r2 by Flatten then the Gemm.
        los = [n.attrs["lo"] for n in q_zp.nodes if n.op == "QConv"]
        assert los == [-128, -128], los
        assert [n.attrs["lo"] for n in q_sym.nodes if n.op == "QConv"] == [0, 0]
        assert e_zp < e_sym, (seed, e_zp, e_sym)
        ratios.append(e_zp / e_sym)
    # Measured 0.81, 0.97, 0.75 (the input's and the Gemm output's symmetric steps and the
    # weights' rounding are in both).
    assert np.mean(ratios) < 0.9, ratios


def test_zero_point_on_a_silu_output_read_by_a_1x1_conv():
    """The QLut's table reads and writes zero points; on a signed value too (the scheme
    allows one, quantize.py gives it only to non-negative values by default)."""
    rng = np.random.default_rng(7)
    inits = {"w1": rng.normal(0, 0.3, (16, 4, 3, 3)).astype(np.float32),
             "w2": rng.normal(0, 0.2, (8, 16, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4),
             helper.make_node("Sigmoid", ["c1"], ["s1"]),
             helper.make_node("Mul", ["c1", "s1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("Relu", ["c2"], ["y"])]
    graph = _graph(nodes, {"x": (1, 4, 8, 8)}, inits)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(quantize, "_SIGNED_ZERO_POINTS", 1.0)
        (q_sym, e_sym), (q_zp, e_zp) = _errors(graph, 1)
    assert [n.op for n in q_zp.nodes] == ["Quantize", "QConv", "QLut", "QConv", "Dequantize"]
    tables = [q.initializers[n.inputs[1]] for q in (q_sym, q_zp) for n in q.nodes
              if n.op == "QLut"]
    assert not np.array_equal(*tables)
    assert e_zp < 0.95 * e_sym, (e_zp, e_sym)  # measured 0.0208 vs 0.0232


@pytest.mark.parametrize("seed", [4, 5])
def test_zero_point_before_a_padded_conv(seed):
    """A padded 3x3 convolution reads its padding as the zero point (QConv's pad_value): r1
    takes one as r2 does, its reader's pad_value is it, and the error shrinks."""
    (q_sym, e_sym), (q_zp, e_zp) = _errors(_chain(pads=1), seed)
    convs = [n for n in q_zp.nodes if n.op == "QConv"]
    assert [n.attrs["lo"] for n in convs] == [-128, -128]
    assert "pad_value" not in convs[0].attrs  # x is symmetric
    assert convs[1].attrs["pad_value"] == -128
    assert all("pad_value" not in n.attrs for n in q_sym.nodes)
    assert e_zp < e_sym, (e_zp, e_sym)


def test_signed_values_and_graph_outputs_stay_symmetric():
    """A value with negative samples, a Quantize'd input and a graph output keep zero
    points 0: the layers' clamps are the symmetric ones, the graphs identical."""
    rng = np.random.default_rng(5)
    inits = {"w1": rng.normal(0, 0.3, (8, 4, 1, 1)).astype(np.float32),
             "w2": rng.normal(0, 0.3, (6, 8, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"]),
             helper.make_node("Conv", ["c1", "w2"], ["y"])]
    graph = _graph(nodes, {"x": (1, 4, 5, 5)}, inits)
    (q_sym, e_sym), (q_zp, e_zp) = _errors(graph, 6)
    assert e_zp == e_sym
    for a, b in zip(q_sym.nodes, q_zp.nodes):
        assert a.op == b.op and a.attrs == b.attrs


def test_zero_point_through_a_fused_residual():
    """Relu(conv(r1) + r1): the residual shares the output's class and brings its zero
    point (the layer adds none of its own), so both Relu outputs take -128; the CPU build
    is the numpy one's bits (``_errors``) and the error shrinks."""
    rng = np.random.default_rng(9)
    inits = {"w1": rng.normal(0, 0.3, (16, 4, 3, 3)).astype(np.float32),
             "w2": rng.normal(0, 0.1, (16, 16, 3, 3)).astype(np.float32),
             "w3": rng.normal(0, 0.2, (8, 16, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["y"])]
    graph = _graph(nodes, {"x": (1, 4, 8, 8)}, inits)
    (q_sym, e_sym), (q_zp, e_zp) = _errors(graph, 3)
    convs = [n for n in q_zp.nodes if n.op == "QConv"]
    assert len(convs[1].inputs) == 5  # the residual fused
    assert [n.attrs["lo"] for n in convs[:2]] == [-128, -128]
    assert convs[1].attrs["pad_value"] == -128
    assert e_zp < e_sym, (e_zp, e_sym)
