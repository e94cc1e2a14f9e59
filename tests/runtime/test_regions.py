"""Regions that grow across max pooling (on the ALU) and views (Reshape, Flatten, ...:
no program, the packed bytes of their input): small ONNX models quantized to int8 and
built with AccelModel.build are bit-exact with the all-CPU build of the same graph on fsim
and the cycle model, the nodes are on the accelerator, and only the model's own input and
output cross between CPU and accelerator."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from accel_helpers import crossings as count_crossings
from onnx_builders import make_model, vi

from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel, compare_outputs

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _conv(rng, name, x, y, cin, cout, k=3, pad=1, relu=True):
    w = rng.normal(0, 1 / np.sqrt(cin * k * k), (cout, cin, k, k)).astype(np.float32)
    b = rng.normal(0, 0.1, cout).astype(np.float32)
    nodes = [helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_c" if relu else y],
                              kernel_shape=[k, k], pads=[pad] * 4)]
    if relu:
        nodes.append(helper.make_node("Relu", [f"{name}_c"], [y]))
    return nodes, [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]


def _gemm(rng, name, x, y, k, o):
    w = rng.normal(0, 1 / np.sqrt(k), (o, k)).astype(np.float32)
    b = rng.normal(0, 0.1, o).astype(np.float32)
    return ([helper.make_node("Gemm", [x, f"{name}_w", f"{name}_b"], [y], transB=1)],
            [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")])


def _quantized(nodes, inits, shape, seed):
    m = make_model(nodes, [vi("x", list(shape))], [vi("y", None)], inits)
    rng = np.random.default_rng(seed)
    calib = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(3)]
    return quantize_model(m, calib, input_shapes={"x": shape})


def _check(q, feeds, *, accel_ops, crossings, targets=("fsim", "cycle"), config=None):
    model = AccelModel.build(q, config)
    placed = {n.op: [] for n in q.nodes}
    for n in q.nodes:
        placed[n.op].append(model.placements[n.name].target)
    for op in accel_ops:
        assert placed[op] and set(placed[op]) == {"accel"}, (op, placed[op], [
            model.placements[n.name].reason for n in q.nodes if n.op == op])
    want = model.cpu_build().run(feeds)
    for target in targets:
        got = model.run(feeds, target=target)
        same, detail = compare_outputs(got, want, exact=True)
        assert same, f"{target}: {detail['summary']}"
        assert model.summary()["crossings"] == crossings == count_crossings(q, model.placements)
    return model


@pytest.mark.parametrize("cin,c1,c2,n", [(3, 20, 24, 2), (1, 16, 8, 1)])
def test_conv_pool_flatten_dense_is_one_region(cin, c1, c2, n):
    """small_cnn's shape: conv, MaxPool, conv, Flatten, Gemm, with channel counts that
    are not multiples of BLOCK: the Gemm reads the conv's packed bytes through weight
    columns permuted at build time; only the input and the output cross."""
    rng = np.random.default_rng(cin * 100 + c1)
    a, ia = _conv(rng, "c1", "x", "a", cin, c1)
    b = [helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                          pads=[1, 1, 1, 1])]
    c, ic = _conv(rng, "c2", "p", "c", c1, c2)
    f = [helper.make_node("Flatten", ["c"], ["f"], axis=1)]
    g, ig = _gemm(rng, "fc", "f", "y", c2 * 5 * 5, 10)
    q = _quantized(a + b + c + f + g, ia + ic + ig, (n, cin, 9, 9), seed=cin)
    model = _check(q, {"x": rng.normal(0, 1, (n, cin, 9, 9)).astype(np.float32)},
                   accel_ops=("QConv", "MaxPool", "Flatten", "QGemm"), crossings=2)
    assert len({p["region"] for p in model.programs.values()}) == 1
    views = [v for v in model.values.values() if "of" in v]
    assert len(views) == 1


def test_pool_variants_and_a_view_read_by_the_cpu(tmp_path):
    """Ceil mode, asymmetric padding and a 2x2 pool; a Reshape that keeps the packed bytes
    ([N, C, H, W] -> [N, C, H*W, 1]) feeding a 1x1 conv; the model's output a view the CPU
    reads (its root unpacked once, reshaped). The .cel file keeps all of it."""
    rng = np.random.default_rng(7)
    a, ia = _conv(rng, "c1", "x", "a", 4, 12)
    p = [helper.make_node("MaxPool", ["a"], ["p1"], kernel_shape=[3, 2], strides=[2, 1],
                          pads=[1, 0, 0, 1], ceil_mode=1),
         helper.make_node("MaxPool", ["p1"], ["p2"], kernel_shape=[2, 2], strides=[2, 2])]
    shape = numpy_helper.from_array(np.array([0, 12, -1, 1], np.int64), "shape")
    r = [helper.make_node("Reshape", ["p2", "shape"], ["r"])]
    c, ic = _conv(rng, "c2", "r", "c", 12, 8, k=1, pad=0)
    f = [helper.make_node("Flatten", ["c"], ["y"], axis=1)]
    q = _quantized(a + p + r + c + f, ia + [shape] + ic, (1, 4, 11, 10), seed=3)
    feeds = {"x": rng.normal(0, 1, (1, 4, 11, 10)).astype(np.float32)}
    model = _check(q, feeds, accel_ops=("QConv", "MaxPool", "Reshape", "Flatten"),
                   crossings=2)
    model.save(tmp_path / "m.cel")
    loaded = AccelModel.load(tmp_path / "m.cel")
    same, detail = compare_outputs(loaded.run(feeds, target="fsim"),
                                   model.cpu_build().run(feeds), exact=True)
    assert same, detail["summary"]
    assert loaded.summary()["crossings"] == 2


def test_pool_and_view_stay_on_the_cpu_with_the_reason():
    """A MaxPool the quantizer leaves in float (before the input's Quantize) and a Reshape
    that reorders the packed bytes stay on the CPU, each with its reason; the model is
    still bit-exact."""
    rng = np.random.default_rng(11)
    p = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]
    a, ia = _conv(rng, "c1", "p", "a", 16, 16)
    shape = numpy_helper.from_array(np.array([1, 32, 2, 4], np.int64), "shape")
    r = [helper.make_node("Reshape", ["a", "shape"], ["r"])]
    c, ic = _conv(rng, "c2", "r", "y", 32, 8)
    q = _quantized(p + a + r + c, ia + [shape] + ic, (1, 16, 8, 8), seed=5)
    model = _check(q, {"x": rng.normal(0, 1, (1, 16, 8, 8)).astype(np.float32)},
                   accel_ops=("QConv",), crossings=4, targets=("fsim",))
    why = {n.op: model.placements[n.name].reason for n in q.nodes
           if n.op in ("MaxPool", "Reshape")}
    assert why["MaxPool"].startswith("MaxPool left in float: its input 'x' is float")
    assert why["Reshape"] == "Reshape [1, 16, 4, 4] -> [1, 32, 2, 4] reorders the packed bytes " \
        "(not a view)"


@pytest.mark.parametrize("c,hw", [(40, 5), (16, 1)])
def test_resnet_head_global_average_pool_flatten_dense(c, hw):
    """ResNet's head: conv, GlobalAveragePool (on the ALU, int32 multiplier and rounding
    rows), Flatten ([N, C, 1, 1] -> [N, C]: the same packed bytes), Gemm: one region."""
    rng = np.random.default_rng(c + hw)
    a, ia = _conv(rng, "c1", "x", "a", 3, c)
    p = [helper.make_node("GlobalAveragePool", ["a"], ["p"]),
         helper.make_node("Flatten", ["p"], ["f"], axis=1)]
    g, ig = _gemm(rng, "fc", "f", "y", c, 7)
    q = _quantized(a + p + g, ia + ig, (2, 3, hw, hw), seed=c)
    model = _check(q, {"x": rng.normal(0, 1, (2, 3, hw, hw)).astype(np.float32)},
                   accel_ops=("QConv", "QGlobalAveragePool", "Flatten", "QGemm"), crossings=2)
    assert len({p["region"] for p in model.programs.values()}) == 1


def test_add_of_two_branches_and_an_int8_relu():
    """Two branches (conv, MaxPool) added (a QAdd: its operands come from MaxPools, so no
    conv's residual epilogue takes it), an int8 Relu, a conv: all on the accelerator."""
    rng = np.random.default_rng(21)
    a, ia = _conv(rng, "c1", "x", "a", 3, 24, relu=False)
    b, ib = _conv(rng, "c2", "x", "b", 3, 24, relu=False)
    p = [helper.make_node("MaxPool", ["a"], ["pa"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("MaxPool", ["b"], ["pb"], kernel_shape=[3, 3], strides=[2, 2],
                          pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["pa", "pb"], ["s"]),
         helper.make_node("Relu", ["s"], ["r"])]
    c, ic = _conv(rng, "c3", "r", "y", 24, 8)
    q = _quantized(a + b + p + c, ia + ib + ic, (2, 3, 12, 12), seed=9)
    model = _check(q, {"x": rng.normal(0, 1, (2, 3, 12, 12)).astype(np.float32)},
                   accel_ops=("QConv", "MaxPool", "QAdd", "Relu"), crossings=2)
    assert len({p["region"] for p in model.programs.values()}) == 1


@pytest.mark.slow
def test_alu_programs_on_the_rtl_agree_with_the_cycle_model():
    """The small configuration (1x4x4): MaxPool, QAdd, Relu, QGlobalAveragePool and a view
    give the same outputs and per-node cycles on the RTL as on the cycle model, and the
    same outputs as the all-CPU build."""
    rng = np.random.default_rng(31)
    a, ia = _conv(rng, "c1", "x", "a", 3, 8, relu=False)
    b, ib = _conv(rng, "c2", "x", "b", 3, 8, relu=False)
    p = [helper.make_node("MaxPool", ["a"], ["pa"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("MaxPool", ["b"], ["pb"], kernel_shape=[3, 3], strides=[2, 2],
                          pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["pa", "pb"], ["s"]),
         helper.make_node("Relu", ["s"], ["r"]),
         helper.make_node("GlobalAveragePool", ["r"], ["g"]),
         helper.make_node("Flatten", ["g"], ["f"], axis=1)]
    g, ig = _gemm(rng, "fc", "f", "y", 8, 4)
    q = _quantized(a + b + p + g, ia + ib + ig, (1, 3, 6, 6), seed=4)
    feeds = {"x": rng.normal(0, 1, (1, 3, 6, 6)).astype(np.float32)}
    model = _check(q, feeds, accel_ops=("QConv", "MaxPool", "QAdd", "Relu",
                                        "QGlobalAveragePool", "Flatten", "QGemm"),
                   crossings=2, targets=("rtl",), config="small")
    rtl = model.run(feeds, target="rtl")
    rtl_cycles = [r["cycles"] for r in model.report if r["target"] == "accel"]
    cyc = model.run(feeds, target="cycle")
    assert [r["cycles"] for r in model.report if r["target"] == "accel"] == rtl_cycles
    for name in rtl:
        np.testing.assert_array_equal(rtl[name], cyc[name])


def test_flatten_of_few_channels_stays_on_the_cpu():
    """A flattened 3-channel value read by a QGemm would pad 3 channels to 16 (5.3x the
    dense's weights and work): the CPU flattens it, and says so; still bit-exact."""
    rng = np.random.default_rng(41)
    a, ia = _conv(rng, "c1", "x", "a", 2, 3)
    f = [helper.make_node("Flatten", ["a"], ["f"], axis=1)]
    g, ig = _gemm(rng, "fc", "f", "y", 3 * 6 * 6, 5)
    q = _quantized(a + f + g, ia + ig, (1, 2, 6, 6), seed=6)
    model = _check(q, {"x": rng.normal(0, 1, (1, 2, 6, 6)).astype(np.float32)},
                   accel_ops=("QConv", "QGemm"), crossings=4, targets=("fsim",))
    flat = next(n for n in q.nodes if n.op == "Flatten")
    assert model.placements[flat.name].target == "cpu"
    assert "would pad 3 channels to 16 (5.3x its work and weights)" in \
        model.placements[flat.name].reason


def _sppf(rng, c, n, seed, size=8):
    """YOLO's SPPF with ReLU: conv, two 5x5 MaxPools in a row, a Concat of the three (int8:
    MaxPool keeps its input's scale), a 1x1 conv."""
    a, ia = _conv(rng, "c1", "x", "a", 3, c)
    p = [helper.make_node("MaxPool", ["a"], ["m1"], kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
         helper.make_node("MaxPool", ["m1"], ["m2"], kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
         helper.make_node("Concat", ["a", "m1", "m2"], ["cat"], axis=1)]
    c2, ic = _conv(rng, "c2", "cat", "y", 3 * c, 8, k=1, pad=0)
    return _quantized(a + p + c2, ia + ic, (n, 3, size, size), seed=seed)


def test_concat_inputs_are_written_into_their_slices(tmp_path):
    """SPPF at batch 1: the conv and the MaxPools write straight into their channel slices
    of the Concat's output (no program, no copy); one region, two crossings; the .cel
    file keeps the placement."""
    rng = np.random.default_rng(51)
    q = _sppf(rng, 16, 1, seed=7)
    assert [n.op for n in q.nodes].count("Concat") == 1
    feeds = {"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)}
    model = _check(q, feeds, accel_ops=("QConv", "MaxPool", "Concat"), crossings=2)
    cat = next(n for n in q.nodes if n.op == "Concat")
    base = model.values[cat.outputs[0]]["addr"]
    assert [model.values[v]["addr"] - base for v in cat.inputs] == [0, 16 * 64, 2 * 16 * 64]
    model.save(tmp_path / "m.cel")
    loaded = AccelModel.load(tmp_path / "m.cel")
    same, detail = compare_outputs(loaded.run(feeds, target="cycle"),
                                   model.cpu_build().run(feeds), exact=True)
    assert same, detail["summary"]


@pytest.mark.parametrize("c,n,size,reason", [
    (16, 2, 8, "Concat of a batch of 2: a channel slice is contiguous in the packed layout "
               "for one batch block (N = BATCH = 1) only"),
    (8, 1, 8, "starts at channel 8, not at a BLOCK (16) boundary"),
    (16, 1, 7, "starts at byte 784 of the packed output, not a multiple of the 64-byte "
               "alignment of accelerator buffers")])
def test_concat_that_cannot_be_placed_stays_on_the_cpu(c, n, size, reason):
    rng = np.random.default_rng(52)
    q = _sppf(rng, c, n, seed=8, size=size)
    model = _check(q, {"x": rng.normal(0, 1, (n, 3, size, size)).astype(np.float32)},
                   accel_ops=("QConv", "MaxPool"), crossings=6, targets=("fsim",))
    cat = next(n for n in q.nodes if n.op == "Concat")
    assert model.placements[cat.name].target == "cpu"
    assert reason in model.placements[cat.name].reason
