"""A QConv over its windows and the MaxPool that alone reads it run as one program
(compiler/accel/fuse_pool.py): whole graphs bit-exact against the all-CPU int8 build on
fsim and the cycle model (and through a .cel round trip), fewer cycles than the two
programs, and left apart when another node reads the convolution's output."""

import numpy as np
import pytest

from celosia import HwConfig
from celosia.compiler.accel import fuse_pool
from celosia.compiler.graph.ir import Graph, Node, TensorType, constant
from celosia.compiler.graph.ops import pool_output_shape
from celosia.runtime.accel import AccelModel

from accel_helpers import after_accel_conv


def _graph(size=24, c=3, o=32, k=7, stride=2, pad=3, pool=(3, 2, 1), lo=0, also_out=False,
           seed=0):
    rng = np.random.default_rng(seed)
    inits = {"w": constant(rng.integers(-128, 128, (o, c, k, k), dtype=np.int8)),
             "b": constant(rng.integers(-3000, 3000, o).astype(np.int32)),
             "m": constant(rng.integers(1, 300, o).astype(np.int32))}
    out = (size + 2 * pad - k) // stride + 1
    pk, ps, pp = pool
    ph, pw = pool_output_shape((out, out), (pk, pk), (ps, ps), (1, 1), (pp,) * 4, 0)
    conv = Node("QConv", ("x", "w", "b", "m"), ("y",),
                dict(kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4,
                     dilations=[1, 1], group=1, shift=12, lo=lo, hi=127, scale=0.05),
                "stem")
    mp = Node("MaxPool", ("y",), ("p",), dict(kernel_shape=[pk, pk], strides=[ps, ps],
                                               pads=[pp] * 4, dilations=[1, 1], ceil_mode=0),
              "pool")
    types = {"x": TensorType("int8", (1, c, size, size)),
             "y": TensorType("int8", (1, o, out, out)),
             "p": TensorType("int8", (1, o, ph, pw)),
             **{n: TensorType(str(a.dtype), a.shape) for n, a in inits.items()}}
    outputs = ("p", "y") if also_out else ("p",)
    return Graph("g", ("x",), outputs, (conv, mp), inits, types)


@pytest.mark.parametrize("kw", [dict(), dict(lo=-128, pool=(2, 2, 0), o=16, size=48),
                                dict(c=2, k=3, stride=1, pad=1, pool=(5, 1, 2), o=24, size=14)])
def test_the_pool_runs_in_the_convolutions_program(tmp_path, kw, monkeypatch):
    g = _graph(**kw)
    model = AccelModel.build(g, "default")
    assert model.programs["stem"]["kind"] == "conv_pool"
    assert model.programs["pool"]["kind"] == "fused" and model.programs["pool"]["insn_count"] == 0
    cpu = model.cpu_build()
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, g.types["x"].shape, dtype=np.int8)
    want = cpu.run({"x": x})["p"]
    assert len(np.unique(want)) > 10
    for target in ("fsim", "cycle"):
        np.testing.assert_array_equal(model.run({"x": x}, target=target)["p"], want)
    fused = sum(r["cycles"] or 0 for r in model.report)
    assert model.report[1]["cycles"] == 0
    path = tmp_path / "m.cel"
    model.save(path)
    np.testing.assert_array_equal(AccelModel.load(path).run({"x": x}, target="cycle")["p"], want)
    monkeypatch.setattr(fuse_pool, "plan", lambda *a, **k: (None, None))
    apart = AccelModel.build(g, "default")
    assert apart.programs["pool"]["kind"] == "maxpool"
    np.testing.assert_array_equal(apart.run({"x": x}, target="cycle")["p"], want)
    assert fused < sum(r["cycles"] or 0 for r in apart.report)


def test_a_convolution_output_read_elsewhere_is_not_fused():
    g = _graph(also_out=True)
    lines = []
    model = AccelModel.build(g, "default", progress=lines.append)
    assert model.programs["pool"]["kind"] == "maxpool"
    said = [line for line in lines if "pool: maxpool" in line]
    assert said and said[0].endswith("not fused with stem: 'y' is also a graph output"), lines
    x = np.random.default_rng(2).integers(-128, 128, g.types["x"].shape, dtype=np.int8)
    got, want = model.run({"x": x}, target="cycle"), model.cpu_build().run({"x": x})
    for v in ("p", "y"):
        np.testing.assert_array_equal(got[v], want[v])


def test_the_rtl_agrees_on_the_small_configuration():
    g = _graph(size=12, c=2, o=8, k=3, stride=1, pad=1)
    model = AccelModel.build(g, HwConfig.load("small"))
    assert model.programs["stem"]["kind"] == "conv_pool"
    x = np.random.default_rng(3).integers(-128, 128, g.types["x"].shape, dtype=np.int8)
    want = model.cpu_build().run({"x": x})["p"]
    np.testing.assert_array_equal(model.run({"x": x}, target="rtl")["p"], want)
    rtl = model.report[0]["cycles"]
    np.testing.assert_array_equal(model.run({"x": x}, target="cycle")["p"], want)
    assert model.report[0]["cycles"] == rtl > 0


def test_a_layer_larger_than_1x1_says_why_it_is_not_fused():
    """A 3x3 layer whose input the accelerator makes (no windows) keeps its conv2d schedule;
    the build log says why its pooling runs apart."""
    g = _graph(size=16, c=16, o=16, k=3, stride=1, pad=1)
    rng = np.random.default_rng(4)
    g2 = after_accel_conv(g, g.nodes, ("p",), 16, rng)
    lines = []
    model = AccelModel.build(g2, "default", progress=lines.append)
    assert model.programs["stem"]["kind"] == "conv2d"
    assert model.programs["pool"]["kind"] == "maxpool"
    assert any("not fused with stem: the convolution is 3x3" in line for line in lines), lines
    x0 = rng.integers(-128, 128, (1, 16, 16, 16), dtype=np.int8)
    np.testing.assert_array_equal(model.run({"x0": x0}, target="cycle")["p"],
                                  model.cpu_build().run({"x0": x0})["p"])
