"""QMatMul (a product of two run-time int8 values) on the accelerator: the operator against
qops.qmatmul on random shapes (2-D, batched, broadcast; M, K, N not multiples of BLOCK) on
fsim and the cycle model, and a small attention model end to end (quantized, partitioned,
bit-exact with the all-CPU build, its .cel round trip)."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from accel_helpers import edit_manifest
from onnx_builders import make_model, vi

from celosia import HwConfig
from celosia.compiler.accel.matmul import (pack_matrices, pack_weights, unpack_matrices,
                                           weights_shape)
from celosia.compiler.graph.ir import Graph, Node, TensorType
from celosia.compiler.graph.qops import qmatmul
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel

# (a shape, b shape, config): 2-D, 3-D and 4-D batched, broadcast leading axes
SHAPES = [((7, 19), (19, 21), "default"),
          ((3, 5, 33), (3, 33, 9), "default"),
          ((2, 3, 6, 20), (2, 3, 20, 17), "default"),
          ((2, 3, 6, 20), (3, 20, 17), "default"),
          ((4, 18), (2, 1, 18, 5), "default"),
          ((2, 5, 7), (2, 7, 6), "small"),
          ((2, 2, 3, 9), (1, 2, 9, 10), "small")]


def _matmul_graph(a_shape, b_shape, multiplier, shift, produced=False):
    """A graph computing one QMatMul on inputs a, b; with ``produced``, b is made by a
    QGemm on the accelerator first (so the runtime reads it back to repack it)."""
    out = np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1])
    types = {"a": TensorType("int8", a_shape), "y": TensorType("int8", out)}
    nodes, inits, inputs = [], {}, ["a"]
    attrs = {"multiplier": multiplier, "shift": shift, "scale": 0.1}
    if produced:
        rng = np.random.default_rng(5)
        kdim, n = b_shape
        inits = {"w": rng.integers(-128, 128, (n, 11), dtype=np.int8),
                 "bias": rng.integers(-500, 500, n).astype(np.int32),
                 "m": rng.integers(1, 300, n).astype(np.int32)}
        types.update({k: TensorType(str(v.dtype), v.shape) for k, v in inits.items()})
        types.update(x=TensorType("int8", (kdim, 11)), b=TensorType("int8", b_shape))
        nodes.append(Node("QGemm", ("x", "w", "bias", "m"), ("b",),
                          {"shift": 10, "lo": -128, "hi": 127, "scale": 0.1}, "gemm"))
        inputs.append("x")
    else:
        types["b"] = TensorType("int8", b_shape)
        inputs.append("b")
    nodes.append(Node("QMatMul", ("a", "b"), ("y",), attrs, "mm"))
    return Graph("g", tuple(inputs), ("y",), tuple(nodes), inits, types)


def test_packing_round_trips_and_weight_layout():
    cfg = HwConfig()
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (2, 3, 5, 19), dtype=np.int8)
    p = pack_matrices(x, cfg)
    assert p.shape == (6, 5 * 32 + 32)  # 160 bytes rounded up to the 64-byte alignment
    np.testing.assert_array_equal(unpack_matrices(p, x.shape, cfg), x)
    b = rng.integers(-128, 128, (3, 19, 21), dtype=np.int8)
    w = pack_weights(b, cfg)
    assert w.shape == weights_shape(b.shape, cfg) == (3, 32 * 32)
    # weight[g, j, ko, oo, ki] = b[g, ko*16 + ki, j*16 + oo] (b^T in blocks), zero-padded
    w5 = w.reshape(3, 2, 2, 16, 16)
    assert w5[1, 1, 0, 2, 3] == b[1, 3, 18] and w5[2, 0, 1, 4, 2] == b[2, 18, 4]
    assert not w5[:, 1, :, 5:].any() and not w5[:, :, 1, :, 3:].any()


@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_qmatmul_on_the_accelerator_is_qmatmul(case):
    a_shape, b_shape, config = SHAPES[case]
    rng = np.random.default_rng(case)
    # large multipliers: the product and its rounding term wrap around int32 as in qmatmul
    multiplier, shift = int(rng.integers(1, 2**20)), int(rng.integers(8, 28))
    g = _matmul_graph(a_shape, b_shape, multiplier, shift)
    model = AccelModel.build(g, config)
    assert model.placements["mm"].target == "accel", model.placements["mm"].reason
    for seed, target in enumerate(("fsim", "cycle")):
        feeds = {k: np.random.default_rng(seed).integers(-128, 128, g.types[k].shape,
                                                         dtype=np.int8) for k in ("a", "b")}
        y = model.run(feeds, target=target)["y"]
        np.testing.assert_array_equal(y, qmatmul(g.nodes[0].attrs, feeds["a"], feeds["b"]))
        row = model.report[0]
        assert row["target"] == "accel" and row["layout_ms"] > 0
        assert (row["cycles"] > 0) if target == "cycle" else row["cycles"] is None
        assert model.crossings == {"to_accel": 2, "to_cpu": 1}


def test_an_operand_made_on_the_accelerator_is_read_back_and_repacked():
    g = _matmul_graph((3, 6, 13), (13, 20), 777, 14, produced=True)
    model = AccelModel.build(g)
    assert [model.placements[n].target for n in ("gemm", "mm")] == ["accel", "accel"]
    rng = np.random.default_rng(2)
    feeds = {"a": rng.integers(-128, 128, (3, 6, 13), dtype=np.int8),
             "x": rng.integers(-128, 128, (13, 11), dtype=np.int8)}
    cpu = model.cpu_build().run(feeds)["y"]
    np.testing.assert_array_equal(model.run(feeds, target="cycle")["y"], cpu)
    # x and a packed in, b read back and packed as weights, y read back
    assert model.crossings == {"to_accel": 3, "to_cpu": 2}


def _attention_model(seq=10, dim=24, heads=3, seed=0):
    """One self-attention block: projections, heads split with Reshape/Transpose,
    Q x K^T (1/sqrt(d) folded into Q's weights), Softmax, P x V, heads merged, output
    projection."""
    c = helper.make_node
    rng = np.random.default_rng(seed)
    hd = dim // heads
    w = {n: (rng.normal(size=(dim, dim)) / np.sqrt(dim)).astype(np.float32)
         for n in ("wq", "wk", "wv", "wo")}
    w["wq"] /= np.float32(np.sqrt(hd))
    consts = {"split": np.array([1, seq, heads, hd], np.int64),
              "merge": np.array([1, seq, dim], np.int64)}
    nodes = [c("MatMul", ["x", "wq"], ["q0"], name="proj_q"),
             c("MatMul", ["x", "wk"], ["k0"], name="proj_k"),
             c("MatMul", ["x", "wv"], ["v0"], name="proj_v"),
             c("Reshape", ["q0", "split"], ["q1"]), c("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
             c("Reshape", ["k0", "split"], ["k1"]), c("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
             c("Reshape", ["v0", "split"], ["v1"]), c("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
             c("MatMul", ["q", "kt"], ["s"], name="scores"),
             c("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
             c("MatMul", ["p", "v"], ["ctx0"], name="context"),
             c("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]),
             c("Reshape", ["ctx1", "merge"], ["ctx"]),
             c("MatMul", ["ctx", "wo"], ["y"], name="proj_o")]
    inits = [numpy_helper.from_array(v, k) for k, v in {**w, **consts}.items()]
    model = make_model(nodes, [vi("x", [1, seq, dim])], [vi("y", [1, seq, dim])], inits)
    calib = [{"x": rng.normal(size=(1, seq, dim)).astype(np.float32)} for _ in range(4)]
    return model, calib


def test_attention_model_end_to_end(tmp_path):
    model, calib = _attention_model()
    q = quantize_model(model, calib)
    built = AccelModel.build(q)
    mms = [n.name for n in q.nodes if n.op == "QMatMul"]
    assert len(mms) == 2 and all(built.placements[n].target == "accel" for n in mms), \
        {n: built.placements[n] for n in mms}
    assert all("QMatMul" not in p.reason for p in built.placements.values() if p.target == "cpu")
    cpu = built.cpu_build()
    path = tmp_path / "attn.cel"
    built.save(path)
    loaded = AccelModel.load(path)
    for seed in range(2):
        x = {"x": np.random.default_rng(10 + seed).normal(size=(1, 10, 24)).astype(np.float32)}
        want = cpu.run(x)["y"]
        for m, target in ((built, "fsim"), (built, "cycle"), (loaded, "cycle")):
            np.testing.assert_array_equal(m.run(x, target=target)["y"], want)
    rows = {r["node"]: r for r in loaded.report}
    assert all(rows[n]["target"] == "accel" and rows[n]["cycles"] > 0 for n in mms)
    # 3 heads of [10, 8] x [8, 10] and [10, 10] x [10, 8]: the model's own MACs, and the
    # GEMM core's (counters), the products padded to BLOCK columns
    assert [rows[n]["macs"] for n in mms] == [3 * 10 * 8 * 10, 3 * 10 * 10 * 8]
    assert [rows[n]["gemm_macs"] for n in mms] == [3 * 10 * 16 * 16] * 2
    assert [rows[n]["padding_overhead"] for n in mms] == [pytest.approx(256 / 80 - 1)] * 2
    assert rows[mms[0]]["utilization"] == pytest.approx(800 * 3 / (rows[mms[0]]["cycles"] * 256))


def test_a_value_in_another_layout_keeps_the_qmatmul_on_the_cpu():
    """A QConv's NCHW output read as a 4-D QMatMul operand: a value has one DRAM layout, so
    the QMatMul stays on the CPU and says why; the results still match."""
    rng = np.random.default_rng(3)
    inits = {"w": rng.integers(-128, 128, (16, 3, 3, 3), dtype=np.int8),
             "bias": rng.integers(-500, 500, 16).astype(np.int32),
             "m": rng.integers(1, 300, 16).astype(np.int32)}
    types = {k: TensorType(str(v.dtype), v.shape) for k, v in inits.items()}
    types.update(x=TensorType("int8", (1, 3, 4, 4)), c=TensorType("int8", (1, 16, 4, 4)),
                 b=TensorType("int8", (1, 16, 4, 5)), y=TensorType("int8", (1, 16, 4, 5)))
    nodes = (Node("QConv", ("x", "w", "bias", "m"), ("c",),
                  dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1],
                       group=1, shift=12, lo=-128, hi=127, scale=0.1), "conv"),
             Node("QMatMul", ("c", "b"), ("y",), {"multiplier": 99, "shift": 12, "scale": 0.1},
                  "mm"))
    g = Graph("g", ("x", "b"), ("y",), nodes, inits, types)
    model = AccelModel.build(g)
    assert model.placements["conv"].target == "accel"
    p = model.placements["mm"]
    assert (p.target, p.reason) == ("cpu", "QMatMul operand 'c' is also used by accelerator "
                                      "node 'conv' in the nchw layout (a value has one layout "
                                      "in DRAM)")
    feeds = {"x": rng.integers(-128, 128, (1, 3, 4, 4), dtype=np.int8),
             "b": rng.integers(-128, 128, (1, 16, 4, 5), dtype=np.int8)}
    np.testing.assert_array_equal(model.run(feeds, target="cycle")["y"],
                                  model.cpu_build().run(feeds)["y"])


def test_edited_staged_operands_are_refused(tmp_path):
    from celosia.runtime.cpu import ArtifactError

    g = _matmul_graph((2, 5, 7), (2, 7, 6), 5, 3)
    path = tmp_path / "mm.cel"
    AccelModel.build(g).save(path)

    def staged(doc):
        return doc["programs"]["mm"]["staged"][0]

    for edit, message in [
            (lambda d: staged(d).update(value="a"), r"staged\[0\].value: is not the second "
                                                    r"input of QMatMul node 'mm'"),
            (lambda d: staged(d).update(shape=[2, 64]), r"staged\[0\].shape: is \[2, 64\], "
                                                        r"'b''s weight layout is \[2, 256\]"),
            (lambda d: staged(d).update(addr=1 << 40), r"outside the \d+-byte DRAM image"),
            (lambda d: d["programs"]["mm"].pop("staged"), r"QMatMul program without the weight"),
            # without its layout, a 3-D value is read as a 1-D convolution's NCHW value
            (lambda d: d["values"]["y"].pop("layout"),
             r'values\["y"\].shape: is \[2, 128\], the packed shape of \'y\' is \[2, 1, 1, 6'),
            (lambda d: d["values"]["a"].update(shape=[2, 64]),
             r'values\["a"\].shape: is \[2, 64\], the packed shape of .a. is \[2, 128\]')]:
        with pytest.raises(ArtifactError, match=message):
            AccelModel.load(edit_manifest(path, edit, tmp_path / "edited.cel"))


def test_qmatmul_on_the_rtl_agrees_with_the_cycle_model():
    """The small configuration: the same program on the RTL gives qmatmul's results and the
    cycle model's cycle count."""
    g = _matmul_graph((2, 3, 9), (2, 9, 6), 77777, 21)
    model = AccelModel.build(g, "small")
    rng = np.random.default_rng(1)
    feeds = {k: rng.integers(-128, 128, g.types[k].shape, dtype=np.int8) for k in ("a", "b")}
    want = qmatmul(g.nodes[0].attrs, feeds["a"], feeds["b"])
    np.testing.assert_array_equal(model.run(feeds, target="rtl")["y"], want)
    rtl_cycles = model.report[0]["cycles"]
    np.testing.assert_array_equal(model.run(feeds, target="cycle")["y"], want)
    assert model.report[0]["cycles"] == rtl_cycles > 0


@pytest.mark.parametrize("seed", range(6))
def test_random_shapes_and_requantizations(seed):
    """Seeded random M, K, N (1..40), 0-2 leading axes of which some broadcast, random
    multiplier and shift, on fsim (both configurations) against qmatmul."""
    rng = np.random.default_rng(100 + seed)
    lead = tuple(int(d) for d in rng.integers(2, 5, rng.integers(0, 3)))
    a_lead = tuple(1 if rng.random() < 0.3 else d for d in lead)
    b_lead = tuple(1 if rng.random() < 0.3 else d for d in lead)[int(rng.integers(0, 2)):]
    m, k, n = (int(v) for v in rng.integers(1, 41, 3))
    # outputs mostly inside int8 (|acc| ~ 5500 sqrt(K)); large shifts wrap around int32
    shift = int(rng.integers(4, 32))
    mult = max(1, round(40 / (5500 * np.sqrt(k)) * 2**shift))
    g = _matmul_graph(a_lead + (m, k), b_lead + (k, n), mult, shift)
    for config in ("default", "small"):
        model = AccelModel.build(g, config)
        assert model.placements["mm"].target == "accel"
        feeds = {v: rng.integers(-128, 128, g.types[v].shape, dtype=np.int8) for v in ("a", "b")}
        np.testing.assert_array_equal(model.run(feeds)["y"],
                                      qmatmul(g.nodes[0].attrs, feeds["a"], feeds["b"]))


def test_a_constant_second_operand_is_packed_once_at_build_time(tmp_path):
    rng = np.random.default_rng(8)
    b = rng.integers(-128, 128, (3, 11, 18), dtype=np.int8)
    g = _matmul_graph((3, 4, 11), b.shape, 1234, 17)
    g = Graph("g", ("a",), g.outputs, g.nodes, {"b": b}, g.types)
    model = AccelModel.build(g)
    assert model.placements["mm"].target == "accel" and model.programs["mm"]["staged"] == []
    path = tmp_path / "c.cel"
    model.save(path)
    a = rng.integers(-128, 128, (3, 4, 11), dtype=np.int8)
    y = AccelModel.load(path).run({"a": a}, target="cycle")["y"]
    np.testing.assert_array_equal(y, qmatmul(g.nodes[0].attrs, a, b))
