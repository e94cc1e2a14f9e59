"""Partitioned models on the accelerator, from hand-built quantized graphs: placement and its
reasons, regions, layouts, bit-exact results on fsim and the cycle model against the numpy
references of compiler/ops.py, the report, and the .cel round trip."""

import numpy as np
import pytest

from celosia import HwConfig
from celosia.compiler.graph.ir import Graph, Node, TensorType, constant
from celosia.compiler.accel.ops import (ConvSpec, DenseSpec, Epilogue, conv2d_reference,
                                  dense_reference)
from celosia.compiler.accel.partition import annotate, pack_value, packed_shape, regions, unpack_value
from celosia.runtime.accel import AccelModel, compare_outputs, is_accel_artifact
from celosia.runtime.cpu import ArtifactError


def _qconv(name, x, out, w_shape, *, res=None, stride=1, pads=(1, 1, 1, 1), group=1,
           dilations=(1, 1), shift=12, lo=0, hi=127):
    inputs = (x, f"{name}_w", f"{name}_b", f"{name}_m") + ((res,) if res else ())
    return Node("QConv", inputs, (out,), dict(
        kernel_shape=list(w_shape[2:]), strides=[stride, stride], pads=list(pads),
        dilations=list(dilations), group=group, shift=shift, lo=lo, hi=hi, scale=0.05), name)


class _Builder:
    """A quantized graph with random int8 weights, int32 biases and multipliers."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.inits, self.types, self.nodes = {}, {}, []

    def consts(self, name, w_shape):
        o = w_shape[0]
        for suffix, a in (("w", self.rng.integers(-128, 128, w_shape, dtype=np.int8)),
                          ("b", self.rng.integers(-4000, 4000, o).astype(np.int32)),
                          ("m", self.rng.integers(1, 400, o).astype(np.int32))):
            self.inits[f"{name}_{suffix}"] = constant(a)
            self.types[f"{name}_{suffix}"] = TensorType(str(a.dtype), a.shape)

    def add(self, node, out_shape, w_shape=None):
        if w_shape is not None:
            self.consts(node.name, w_shape)
        self.nodes.append(node)
        self.types[node.outputs[0]] = TensorType("int8", tuple(out_shape))

    def graph(self, inputs, outputs):
        return Graph("g", tuple(inputs), tuple(outputs), tuple(self.nodes), self.inits, self.types)


def _residual_net(n=2, c=3, o=20):
    """conv (c -> o) ; conv (o -> o) + residual ; Flatten ; dense -> 10."""
    b = _Builder()
    b.types["x"] = TensorType("int8", (n, c, 8, 8))
    b.add(_qconv("c1", "x", "y1", (o, c, 3, 3)), (n, o, 8, 8), (o, c, 3, 3))
    b.add(_qconv("c2", "y1", "y2", (o, o, 3, 3), res="y1", lo=-128), (n, o, 8, 8), (o, o, 3, 3))
    b.add(Node("Flatten", ("y2",), ("f",), {"axis": 1}, "flat"), (n, o * 64))
    b.add(Node("QGemm", ("f", "fc_w", "fc_b", "fc_m"), ("z",),
               dict(shift=16, lo=-128, hi=127, scale=0.1), "fc"), (n, 10), (10, o * 64))
    return b.graph(["x"], ["z"])


def _reference(g, x):
    i = g.initializers
    e1 = Epilogue(bias=True, scale=True, shift=12, lo=0)
    e2 = Epilogue(bias=True, scale=True, shift=12, residual=True, lo=-128)
    n, c = x.shape[:2]
    o = i["c1_w"].shape[0]
    y1 = conv2d_reference(x, i["c1_w"], ConvSpec(n, c, 8, 8, o, 3, 3, 1, 1, e1), i["c1_b"],
                          None, i["c1_m"])
    y2 = conv2d_reference(y1, i["c2_w"], ConvSpec(n, o, 8, 8, o, 3, 3, 1, 1, e2), i["c2_b"],
                          y1, i["c2_m"])
    return dense_reference(y2.reshape(n, -1), i["fc_w"],
                           DenseSpec(n, o * 64, 10, Epilogue(bias=True, scale=True, shift=16)),
                           i["fc_b"], None, i["fc_m"])


@pytest.mark.parametrize("config", ["default", "small"])
def test_layouts_round_trip_with_channel_padding(config):
    cfg = HwConfig.load(config)
    rng = np.random.default_rng(1)
    for shape in [(2, 3, 5, 7), (4, 20, 2, 2), (2, 37), (4, 32, 3, 1), (2, 16), (2, 5, 1, 1),
                  (20, 37), (197, 48), (16, 5)]:
        x = rng.integers(-128, 128, shape, dtype=np.int8)
        p = pack_value(x, cfg)
        assert p.shape == packed_shape(shape, cfg)
        np.testing.assert_array_equal(unpack_value(p, shape), x)
        # Against the layout's definition: out[i, j, ..., bb, kk] = x[i*b + bb, j*k + kk, ...]
        b, k = cfg.batch, cfg.block
        rows = p.shape[0] * b  # [N, C] values: rows padded (dense_rows) with zeros
        assert rows == (shape[0] if len(shape) == 4 or shape[0] // b <= 64 else
                        -(-shape[0] // (8 * b)) * 8 * b)
        xp = np.zeros((rows, -(-shape[1] // k) * k) + shape[2:], np.int8)
        xp[:shape[0], :shape[1]] = x
        nb, cb = rows // b, xp.shape[1] // k
        want = xp.reshape((nb, b, cb, k) + shape[2:])
        want = np.moveaxis(np.moveaxis(want, 1, -1), 2, -1)  # (nb, cb, *spatial, b, k)
        np.testing.assert_array_equal(p, want)


def test_placement_reasons_and_regions():
    b = _Builder()
    b.types["x"] = TensorType("int8", (1, 16, 8, 8))
    b.add(_qconv("dw", "x", "a", (16, 1, 3, 3), group=16), (1, 16, 8, 8), (16, 1, 3, 3))
    # dilation 4: a 9x9 kernel with zeros between the taps, 9x the work (dilation 2 runs)
    b.add(_qconv("dil", "a", "b", (16, 16, 3, 3), dilations=(4, 4), pads=(4, 4, 4, 4)),
          (1, 16, 8, 8), (16, 16, 3, 3))
    b.add(_qconv("asym", "b", "c", (16, 16, 2, 2), pads=(0, 0, 1, 1)), (1, 16, 8, 8),
          (16, 16, 2, 2))
    b.add(_qconv("ok1", "c", "d", (16, 16, 3, 3)), (1, 16, 8, 8), (16, 16, 3, 3))
    b.add(_qconv("ok2", "d", "e", (16, 16, 1, 1), pads=(0, 0, 0, 0)), (1, 16, 8, 8),
          (16, 16, 1, 1))
    b.add(Node("MaxPool", ("e",), ("f",), dict(kernel_shape=[2, 2], strides=[2, 2],
                                                pads=[0, 0, 0, 0], dilations=[1, 1]), "pool"),
          (1, 16, 4, 4))
    b.add(_qconv("ok3", "f", "g", (16, 16, 3, 3)), (1, 16, 4, 4), (16, 16, 3, 3))
    b.add(_qconv("wide", "g", "h", (72, 16, 1, 1), pads=(0, 0, 0, 0)), (1, 72, 4, 4),
          (72, 16, 1, 1))
    b.add(_qconv("g24", "h", "i", (72, 3, 3, 3), group=24), (1, 72, 4, 4), (72, 3, 3, 3))
    g = b.graph(["x"], ["i"])
    places = annotate(g, HwConfig())
    assert places["dw"].reason == "group_conv2d with its fused epilogue"
    assert places["asym"].reason == "conv2d with its fused epilogue"  # per-side pads
    assert places["ok1"].reason == "conv2d with its fused epilogue"
    assert places["dil"].reason.startswith("dilations [4, 4]: run as a kernel with zeros "
                                           "between its taps it would do 9.0x")
    assert places["g24"].reason.startswith("grouped convolution: groups of 3 input / 3 output "
                                           "channels do not tile BLOCK=16")
    assert places["pool"].reason == "max pooling on the ALU"  # its input is made there
    assert [n for n, p in places.items() if p.target == "accel"] == [
        "dw", "asym", "ok1", "ok2", "pool", "ok3", "wide"]
    assert regions(g, places) == {"dw": 0, "asym": 1, "ok1": 1, "ok2": 1, "pool": 1, "ok3": 1,
                                  "wide": 1}
    assert all(p.target == "cpu" for p in annotate(g, HwConfig(), accelerate=False).values())


def test_pool_of_a_value_the_cpu_makes_stays_on_the_cpu():
    """An int8 MaxPool of the model's input would add a crossing on the accelerator (its
    input comes from the CPU), so it stays there, and says so."""
    b = _Builder()
    b.types["x"] = TensorType("int8", (1, 16, 8, 8))
    b.add(Node("MaxPool", ("x",), ("p",), dict(kernel_shape=[2, 2], strides=[2, 2],
                                              pads=[0, 0, 0, 0], dilations=[1, 1]), "pool"),
          (1, 16, 4, 4))
    b.add(_qconv("c", "p", "y", (16, 16, 3, 3)), (1, 16, 4, 4), (16, 16, 3, 3))
    places = annotate(b.graph(["x"], ["y"]), HwConfig())
    assert (places["pool"].target, places["pool"].reason) == (
        "cpu", "MaxPool of a value the CPU makes: on the accelerator it would add a crossing "
        "between CPU and accelerator, not save one")
    assert places["c"].target == "accel"


@pytest.mark.parametrize("target", ["fsim", "cycle"])
def test_residual_network_is_bit_exact_and_reported(target):
    g = _residual_net()
    x = np.random.default_rng(2).integers(-128, 128, (2, 3, 8, 8), dtype=np.int8)
    model = AccelModel.build(g, "default")
    # The Flatten is a view of c2's packed output, which the dense reads directly: one
    # region, and only x and z cross.
    assert model.build_info["accel_nodes"] == 4 and model.build_info["regions"] == 1
    out = model.run({"x": x}, target=target)
    np.testing.assert_array_equal(out["z"], _reference(g, x))
    rows = {r["node"]: r for r in model.report}
    assert rows["flat"]["target"] == "accel" and rows["flat"]["cycles"] == 0
    assert model.values["f"] == {**model.values["y2"], "of": "y2"}
    assert rows["c1"]["target"] == "accel" and rows["c2"]["region"] == rows["c1"]["region"]
    summary = model.summary()
    assert summary["accel_nodes"] == 4 and summary["cpu_nodes"] == 0
    assert summary["crossings"] == 2
    if target == "cycle":
        assert summary["cycles"] == sum(rows[n]["cycles"] for n in ("c1", "c2", "fc")) > 0
        assert 0 < summary["utilization"] <= 1
        assert rows["c2"]["accel_ms"] == pytest.approx(rows["c2"]["cycles"] / 1e5)
    else:
        assert summary["cycles"] is None
    # The same model runs again (DRAM holds the previous run's activations).
    x2 = -x
    np.testing.assert_array_equal(model.run({"x": x2}, target=target)["z"], _reference(g, x2))


def test_small_configuration_and_batch():
    g = _residual_net(n=3, c=5, o=8)
    x = np.random.default_rng(4).integers(-128, 128, (3, 5, 8, 8), dtype=np.int8)
    model = AccelModel.build(g, "small")
    np.testing.assert_array_equal(model.run({"x": x}, target="cycle")["z"], _reference(g, x))


def test_artifact_round_trip(tmp_path):
    g = _residual_net()
    x = np.random.default_rng(3).integers(-128, 128, (2, 3, 8, 8), dtype=np.int8)
    model = AccelModel.build(g, "default")
    path = tmp_path / "m.cel"
    model.save(path)
    assert is_accel_artifact(path)
    loaded = AccelModel.load(path)
    assert loaded.config == model.config and set(loaded.programs) == {"c1", "c2", "flat", "fc"}
    np.testing.assert_array_equal(loaded.run({"x": x}, target="cycle")["z"], _reference(g, x))
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ArtifactError, match="m.cel: not a complete zip archive"):
        AccelModel.load(path)


def test_bad_inputs_are_clear_errors():
    from celosia.compiler.graph.ir import InputShapeError

    model = AccelModel.build(_residual_net(), "default")
    with pytest.raises(InputShapeError, match="was not given"):
        model.run({})
    with pytest.raises(InputShapeError, match=r"is float32\[2,3,8,8\] but the model was built"):
        model.run({"x": np.zeros((2, 3, 8, 8), np.float32)})
    with pytest.raises(InputShapeError, match="unknown inputs"):
        model.run({"x": np.zeros((2, 3, 8, 8), np.int8), "y": np.zeros(1)})


def test_compare_outputs():
    a = {"p": np.array([[0.1, 0.9], [0.8, 0.2]], np.float32)}
    same, d = compare_outputs(a, {"p": a["p"].copy()}, exact=True)
    assert same and d["outputs"]["p"]["differing"] == 0
    same, d = compare_outputs(a, {"p": np.array([[0.2, 0.8], [0.1, 0.9]], np.float32)},
                              exact=False)
    assert not same and d["outputs"]["p"]["argmax_agreement"] == 0.5
    assert "arg-max agrees on 50.0% of rows" in d["summary"]


def test_a_stem_with_three_channels_reports_real_utilisation_and_its_padding():
    """A stem convolution (3 -> 16 channels, 7x7, stride 2, pad 3) fed by the host runs as a
    1x1 layer over its windows (compiler/accel/im2col.py): 147 real input channels of 160
    (10 blocks) instead of 3 of 16 per tap. Utilisation counts the real multiply-adds only,
    and the padded work is reported as padding_overhead."""
    b = _Builder(seed=5)
    b.types["x"] = TensorType("int8", (1, 3, 32, 32))
    b.add(_qconv("stem", "x", "y", (16, 3, 7, 7), stride=2, pads=(3, 3, 3, 3)),
          (1, 16, 16, 16), (16, 3, 7, 7))
    model = AccelModel.build(b.graph(["x"], ["y"]), "default")
    x = np.random.default_rng(6).integers(-128, 128, (1, 3, 32, 32), dtype=np.int8)
    out = model.run({"x": x}, target="cycle")
    np.testing.assert_array_equal(out["y"], model.cpu_build().run({"x": x})["y"])
    row = model.report[0]
    real = 16 * 16 * 16 * 3 * 7 * 7  # Hout x Wout x Cout x Cin x kh x kw
    assert row["macs"] == real and row["gemm_macs"] == 16 * 16 * 16 * 160
    assert row["padding_overhead"] == pytest.approx(160 / 147 - 1)
    assert row["utilization"] == pytest.approx(real / (row["cycles"] * 256))
    s = model.summary()
    assert (s["macs"], s["gemm_macs"]) == (real, row["gemm_macs"])
    assert s["utilization"] == row["utilization"] and s["padding_overhead"] == row["padding_overhead"]
    # the GEMM core's own busy share (the cycle model's gemm_utilization) counts the
    # padding: 160/147 times the utilisation
    assert row["gemm_macs"] / (row["cycles"] * 256) == pytest.approx(row["utilization"] * 160 / 147)
    # fsim has no cycles: no utilisation, the same padding
    model.run({"x": x}, target="fsim")
    assert model.report[0]["utilization"] is None
    assert model.report[0]["padding_overhead"] == pytest.approx(160 / 147 - 1)
