"""Grouped, depthwise and 1-D convolutions, per-side padding and per-axis strides in whole
quantized ONNX models on the accelerator (compiler/accel/ops_group.py): the nodes placed on
the accelerator, and the outputs on fsim and the cycle model bit-exact with the all-CPU int8
build of the same graph."""

import numpy as np
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel


def _quantized(nodes, inputs, outputs, weights, seed=0):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.normal(size=s) * 0.3).astype(np.float32), n)
             for n, s in weights.items()]
    model = make_model(nodes, [vi(n, s) for n, s in inputs.items()],
                       [vi(n, s) for n, s in outputs.items()], inits)
    calib = [{n: rng.normal(size=s).astype(np.float32) for n, s in inputs.items()}
             for _ in range(4)]
    feeds = {n: rng.normal(size=s).astype(np.float32) for n, s in inputs.items()}
    return quantize_model(model, calib), feeds


def _check(q, feeds, accel_ops: dict, tmp_path=None):
    """Build on the accelerator; the named QConv nodes are there; fsim and the cycle model
    give the all-CPU build's outputs exactly (and, with ``tmp_path``, the build saved and
    loaded again does on fsim)."""
    model = AccelModel.build(q, "default")
    for name, kind in accel_ops.items():
        assert model.placements[name].target == "accel", model.placements[name]
        assert model.programs[name]["kind"] == kind
    cpu = model.cpu_build()
    q_in = {n: feeds[n] for n in q.inputs}
    want = cpu.run(q_in)
    for target in ("fsim", "cycle"):
        got = model.run(q_in, target=target)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{target} {name}")
    if tmp_path is not None:
        model.save(tmp_path / "m.cel")
        loaded = AccelModel.load(tmp_path / "m.cel")
        assert {k: (p["kind"], p["insn_count"]) for k, p in loaded.programs.items()} == \
            {k: (p["kind"], p["insn_count"]) for k, p in model.programs.items()}
        got = loaded.run(q_in)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"loaded {name}")
    return model


def test_mobilenet_block_depthwise_on_the_accelerator():
    """1x1 expand (relu6) -> depthwise 3x3 stride 2 (relu6) -> 1x1 project + residual-free;
    24 channels (not a multiple of 16) and a 5x5 depthwise with stride 1 after it."""
    c = helper.make_node
    nodes = [c("Conv", ["x", "w1"], ["a"], name="expand"),
             c("Clip", ["a", "lo", "hi"], ["a6"], name="relu6a"),
             c("Conv", ["a6", "wd"], ["d"], group=24, strides=[2, 2], pads=[1, 1, 1, 1],
               name="dw3"),
             c("Clip", ["d", "lo", "hi"], ["d6"], name="relu6d"),
             c("Conv", ["d6", "wd5"], ["e"], group=24, pads=[2, 2, 2, 2], name="dw5"),
             c("Conv", ["e", "w2"], ["y"], name="project")]
    weights = {"w1": (24, 8, 1, 1), "wd": (24, 1, 3, 3), "wd5": (24, 1, 5, 5),
               "w2": (16, 24, 1, 1)}
    rng_consts = [numpy_helper.from_array(np.float32(0), "lo"),
                  numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [c("Constant", [], ["lo"], value=rng_consts[0]),
             c("Constant", [], ["hi"], value=rng_consts[1])] + nodes
    q, feeds = _quantized(nodes, {"x": [1, 8, 10, 10]}, {"y": [1, 16, 5, 5]}, weights)
    model = _check(q, feeds, {"dw3": "group_conv2d", "dw5": "group_conv2d",
                              "expand": "conv2d", "project": "conv2d"})
    assert model.build_info["regions"] == 1  # no value crosses around the depthwise layers


def test_grouped_1d_and_asymmetric_convolutions(tmp_path):
    c = helper.make_node
    nodes = [c("Conv", ["x", "wg"], ["a"], group=4, pads=[1, 1, 1, 1], name="grouped"),
             c("Conv", ["a", "wa"], ["b"], pads=[0, 1, 0, 1], strides=[2, 1], name="asym"),
             c("Reshape", ["b", "shape"], ["r"], name="to1d"),
             c("Conv", ["r", "w1d"], ["y"], pads=[1, 2], strides=[2], group=2, name="conv1d")]
    weights = {"wg": (32, 8, 3, 3), "wa": (16, 32, 2, 2)}
    shape = numpy_helper.from_array(np.array([1, 16, -1], np.int64), "shape")
    w1d = numpy_helper.from_array(
        (np.random.default_rng(5).normal(size=(8, 8, 3)) * 0.3).astype(np.float32), "w1d")
    model = make_model(nodes, [vi("x", [1, 32, 8, 8])], [vi("y", [1, 8, 19])],
                       [shape, w1d] + [numpy_helper.from_array(
                           (np.random.default_rng(1).normal(size=s) * 0.3).astype(np.float32), n)
                           for n, s in weights.items()])
    rng = np.random.default_rng(2)
    calib = [{"x": rng.normal(size=(1, 32, 8, 8)).astype(np.float32)} for _ in range(4)]
    q = quantize_model(model, calib)
    feeds = {"x": rng.normal(size=(1, 32, 8, 8)).astype(np.float32)}
    # groups = 1 with per-side padding and a stride per axis: conv2d's searched schedules
    _check(q, feeds, {"grouped": "group_conv2d", "asym": "conv2d",
                       "conv1d": "group_conv2d"}, tmp_path)


def test_1d_qconvs_of_a_quantized_graph_on_the_accelerator(tmp_path):
    """3-D QConvs (a graph quantized without the 1-D -> 2-D rewrite, or imported so): their
    [N, C, L] values packed as NCHW with one row, also where the CPU reads them."""
    from celosia.compiler.graph.ir import Graph, Node, TensorType, constant

    rng = np.random.default_rng(7)
    inits, types = {}, {"x": TensorType("int8", (2, 24, 20))}
    nodes = []

    def qconv(name, x, y, w_shape, out_shape, **attrs):
        o = w_shape[0]
        for suffix, a in (("w", rng.integers(-128, 128, w_shape, dtype=np.int8)),
                          ("b", rng.integers(-4000, 4000, o).astype(np.int32)),
                          ("m", rng.integers(1, 400, o).astype(np.int32))):
            inits[f"{name}_{suffix}"] = constant(a)
            types[f"{name}_{suffix}"] = TensorType(str(a.dtype), a.shape)
        a = dict(kernel_shape=[w_shape[2]], strides=[1], pads=[0, 0], dilations=[1], group=1,
                 shift=11, lo=-128, hi=127, scale=0.05)
        a.update(attrs)
        nodes.append(Node("QConv", (x, f"{name}_w", f"{name}_b", f"{name}_m"), (y,), a, name))
        types[y] = TensorType("int8", out_shape)

    qconv("dw", "x", "a", (24, 1, 3), (2, 24, 10), group=24, strides=[2], pads=[1, 0])
    nodes.append(Node("Relu", ("a",), ("r",), {}, "relu"))  # the CPU reads a 3-D value
    types["r"] = TensorType("int8", (2, 24, 10))
    qconv("pw", "r", "y", (16, 24, 1), (2, 16, 10))
    g = Graph("g", ("x",), ("a", "y"), tuple(nodes), inits, types)
    model = AccelModel.build(g, "default")
    assert model.programs["dw"]["kind"] == "group_conv2d"
    assert model.programs["pw"]["kind"] == "conv2d"  # groups = 1: a 1-D conv2d of one row
    x = rng.integers(-128, 128, (2, 24, 20), dtype=np.int8)
    want = model.cpu_build().run({"x": x})
    for target in ("fsim", "cycle"):
        got = model.run({"x": x}, target=target)
        for name in ("a", "y"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{target} {name}")
    model.save(tmp_path / "m.cel")
    got = AccelModel.load(tmp_path / "m.cel").run({"x": x})
    np.testing.assert_array_equal(got["y"], want["y"])


def test_groups_1_convs_with_per_side_padding_run_conv2d_with_their_taps_cropped(tmp_path):
    """groups = 1 with per-side padding, a stride per axis, 1-D: conv2d's searched schedules;
    a 3x3 kernel on a 1x1 input keeps only its centre tap (crop_taps), as group_conv2d does."""
    c = helper.make_node
    nodes = [c("Conv", ["x", "wa"], ["a"], pads=[1, 0, 2, 1], strides=[2, 1], name="asym"),
             c("Conv", ["a", "wp"], ["p"], strides=[4, 8], name="pool"),
             c("Conv", ["p", "wc"], ["q"], pads=[1, 1, 1, 1], name="centre"),
             c("Reshape", ["q", "shape"], ["r"], name="to1d"),
             c("Conv", ["r", "w1d"], ["y"], pads=[2, 1], strides=[2], name="conv1d")]
    # (the 1-D layer reads the CPU's Reshape with 16 channels: its windows, 16 x 5 channels,
    # would take as many blocks as its taps, so it stays a 1-D conv2d; compiler/accel/im2col.py)
    weights = {"wa": (24, 16, 3, 2), "wp": (32, 24, 4, 8), "wc": (80, 32, 3, 3),
               "w1d": (16, 16, 5)}
    shape = numpy_helper.from_array(np.array([1, 16, -1], np.int64), "shape")
    rng = np.random.default_rng(3)
    model = make_model(nodes, [vi("x", [1, 16, 7, 8])], [vi("y", [1, 16, 2])],
                       [shape] + [numpy_helper.from_array(
                           (rng.normal(size=s) * 0.3).astype(np.float32), n)
                           for n, s in weights.items()])
    calib = [{"x": rng.normal(size=(1, 16, 7, 8)).astype(np.float32)} for _ in range(4)]
    q = quantize_model(model, calib)
    feeds = {"x": rng.normal(size=(1, 16, 7, 8)).astype(np.float32)}
    built = _check(q, feeds, {"asym": "conv2d", "pool": "conv2d", "centre": "conv2d",
                              "conv1d": "conv2d"}, tmp_path)
    spec = built.programs["asym"]["spec"]
    assert (tuple(spec["stride"]), tuple(spec["pad"])) == ((2, 1), (1, 0, 2, 1))
    assert (built.programs["centre"]["spec"]["kh"], built.programs["centre"]["spec"]["kw"]) == (1, 1)
    spec = built.programs["conv1d"]["spec"]
    assert (spec["h"], spec["kh"], spec["kw"], tuple(spec["stride"]), tuple(spec["pad"])) == \
        (1, 1, 5, (1, 2), (0, 2, 0, 1))
