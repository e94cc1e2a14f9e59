"""Signed activations (compiler/graph/quantize.py): the "mse" range of a signed value clips
at most 1e-4 of its samples (``_signed_range``); a signed value with no exact lower end
takes its calibrated [min, max] with a zero point when, judged sample by sample on ranges
the other samples give, that rounds it better (``_zero_point_pays``: a choice per value);
Slice, Concat and Add carry the lower ends of lookup tables (SiLU) and zero points, so
YOLO's C2f concatenations of SiLU outputs use all 256 steps. Synthetic data with a known
better choice, and a C2f-like graph checked against the symmetric scheme and bit for bit
on the CPU build."""

import numpy as np
from onnx import helper
from onnx_builders import float_graph

from celosia.compiler.graph import quantize
from celosia.compiler.graph.quantize import quantize_graph
from celosia.compiler.graph.reference import run_graph
from celosia.runtime.cpu import CpuModel


def _sym_mse(v, t):
    s = float(np.float32(t / 127))
    return float(((np.clip(np.rint(v / s), -128, 127) * s - v) ** 2).mean())


def test_signed_range_clips_at_most_its_share_and_rounds_better():
    rng = np.random.default_rng(0)
    v = rng.laplace(0, 1, 200000).astype(np.float32)  # heavy tails: the max is an outlier
    top = float(np.abs(v).max())
    t = quantize._signed_range(v, top)
    assert t < top
    assert np.mean(np.abs(v) > t) <= quantize._SIGNED_CLIP + 1e-6
    assert _sym_mse(v, t) < _sym_mse(v, top)
    # no tail: the maximum (nothing to clip within the share)
    u = rng.uniform(-1, 1, 200000).astype(np.float32)
    assert quantize._signed_range(u, float(np.abs(u).max())) > 0.999 * np.abs(u).max()


def _samples(make, n=6, seed=1):
    rng = np.random.default_rng(seed)
    return {k: [make(rng, k).astype(np.float32)] for k in range(n)}


def test_zero_point_pays_is_chosen_per_value():
    # lopsided and stable from sample to sample ([-1, 4]): 256 steps on [min, max] round it
    # about 1.6 times finer than 256 on [-4, 4]
    assert quantize._zero_point_pays(_samples(lambda r, k: r.uniform(-1, 4, 20000)))
    # symmetric: nothing to gain, the symmetric range is as fine and clips its tail
    assert not quantize._zero_point_pays(_samples(lambda r, k: r.normal(0, 1, 20000)))

    # lopsided, but one sample reaches far below the others' minimum: held out, its
    # values below the others' [min, max] are clipped, which costs more than the finer steps
    def moving(r, k):
        v = r.uniform(-0.1, 4, 20000)
        if k == 0:
            v[:400] = -3.9
        return v
    assert not quantize._zero_point_pays(_samples(moving))
    assert not quantize._zero_point_pays(_samples(lambda r, k: r.uniform(-1, 4, 100), n=1))


def _c2f(seed=3):
    """Conv + SiLU, its two channel halves (Slice), a Conv + SiLU on the second, the three
    concatenated (YOLO's C2f), a padded 3x3 Conv reading the concatenation."""
    rng = np.random.default_rng(seed)
    c = helper.make_node
    inits = {"w1": rng.normal(0, 0.4, (16, 4, 3, 3)).astype(np.float32),
             "b1": rng.normal(0.5, 0.3, 16).astype(np.float32),
             "w2": rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32),
             "w3": rng.normal(0, 0.2, (8, 24, 3, 3)).astype(np.float32),
             "s0": np.array([0], np.int64), "s8": np.array([8], np.int64),
             "s16": np.array([16], np.int64), "ax": np.array([1], np.int64)}
    nodes = [c("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             c("Sigmoid", ["c1"], ["g1"]), c("Mul", ["c1", "g1"], ["a1"]),
             c("Slice", ["a1", "s0", "s8", "ax"], ["h0"]),
             c("Slice", ["a1", "s8", "s16", "ax"], ["h1"]),
             c("Conv", ["h1", "w2"], ["c2"], pads=[1] * 4),
             c("Sigmoid", ["c2"], ["g2"]), c("Mul", ["c2", "g2"], ["a2"]),
             c("Concat", ["h0", "h1", "a2"], ["cat"], axis=1),
             c("Conv", ["cat", "w3"], ["y"], pads=[1] * 4)]
    return float_graph(nodes, {"x": (1, 4, 8, 8)}, inits)


def test_concatenated_silu_outputs_take_a_zero_point():
    graph = _c2f()
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.normal(size=(1, 4, 8, 8)).astype(np.float32)} for _ in range(10)]
    calib, test = feeds[:6], feeds[6:]
    errors = []
    for zero_points in (False, True):
        q = quantize_graph(graph, calib, zero_points=zero_points, bias_correction=False)
        last = [n for n in q.nodes if n.op == "QConv"][-1]
        # the padded reader of the concatenation pads with its zero point
        assert (last.attrs.get("pad_value", 0) != 0) == zero_points
        cpu = CpuModel.from_graph(q)
        err = []
        for f in test:
            ref = run_graph(q, f)["y"]
            np.testing.assert_array_equal(cpu.run(f)["y"], ref)
            want = run_graph(graph, f)["y"]
            err.append(np.sqrt(((want - ref) ** 2).mean() / (want ** 2).mean()))
        errors.append(float(np.mean(err)))
    assert errors[1] < 0.9 * errors[0], errors
