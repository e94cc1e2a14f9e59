"""Control-flow bodies on the accelerator (compiler/graph/qbody.py, runtime/accel_recurrent.py):
the quantizer gives the MatMul/Gemm layers and recurrent layers inside If, Loop and Scan
bodies (bodies of bodies too) their 16-bit integer forms, calibrated on what each body
sees; the accelerator build runs their products at every iteration and agrees bit for bit
with the int8 CPU build on fsim and the cycle model; the outputs stay within float
rounding of onnxruntime's float model; a branch the calibration never took stays float
and says why; .cel files keep it."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import make_model, onnxruntime_run, vi

from celosia.benchmarks.zoo_accel import placement_record
from celosia.benchmarks.zoo_int8 import cosine
from celosia.compiler.pipeline import quantize_model
from celosia.models import recurrent
from celosia.runtime.accel import AccelModel, compare_outputs

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _check(model, calib, tests, config=None, close=None):
    shapes = {k: v.shape for k, v in tests[0].items()}
    q = quantize_model(model, calib, input_shapes=shapes)
    built = AccelModel.build(q, config)
    for test in tests:
        want = built.cpu_build().run(test)
        for target in ("fsim", "cycle"):
            got = built.run(test, target=target)
            same, detail = compare_outputs(got, want, exact=True)
            assert same, f"{target}: {detail['summary']}"
        ref = onnxruntime_run(model, test)
        for name, value in got.items():
            # a body's 16-bit products are within float rounding; an int8 layer outside not
            assert cosine(value, ref[name]) > (close or {}).get(name, 0.99999), name
    return q, built


def test_loop_of_an_rnn_cell_and_if_heads():
    """The zoo's control_flow model: a Loop over an Elman cell (weights read from the outer
    scope), an If between two Gemm heads; both branches run (mode 0 and 1), the else branch
    was never taken in calibration and stays float with its reason."""
    model = recurrent.control_flow(features=8, hidden=16, classes=5, time=7, batch=2)
    rng = np.random.default_rng(0)
    args = dict(batch=2, time=7, features=8)
    calib = [recurrent.control_flow_feeds(args, rng) for _ in range(3)]
    tests = [recurrent.control_flow_feeds(args, rng) for _ in range(2)]
    tests[1]["mode"] = np.array(1, np.int64)
    q, built = _check(model, calib, tests)
    loop = next(n for n in q.nodes if n.op == "Loop")
    body_ops = [n.op for n in loop.attrs["body"].nodes]
    # h x U per iteration; x_t x W of every iteration hoisted before the loop, one product
    assert body_ops.count("QMatMulWide") == 1 and "Gather" in body_ops, body_ops
    (hoisted,) = [n for n in q.nodes if n.op == "QMatMulWide"]
    assert q.types[hoisted.outputs[0]].shape == (7, 2, 16)
    for n in (loop, hoisted):
        assert built.placements[n.name].target == "accel", built.placements[n.name].reason
    cond = next(n for n in q.nodes if n.op == "If")
    gemm = cond.attrs["else_branch"].nodes[0]
    assert gemm.op == "Gemm" and "never ran on the calibration samples" in \
        gemm.attrs["float_reason"]
    rec = placement_record(built)
    assert rec["accel_mac_share"] == 1.0  # If counts its larger branch: the then branch
    row = {r["node"]: r for r in built.report}[loop.name]
    assert row["launches"] == 7 and row["cycles"] > 0
    # the CPU build runs these nodes node by node, saying why
    cpu = built.cpu_build()
    (segment,) = [m for _, m in cpu.segments]
    why = {c["node"]: c for c in segment.program.control}
    assert why[loop.name]["path"] == "numpy" and "integer products" in why[loop.name]["why"]


def _scan_with_nested_if():
    """Scan over x [T, B, K] with state h [B, H]: h' = tanh(x_t W + h U) when the step's
    first feature is positive (an If inside the body), else h; then a Gemm head outside."""
    rng = np.random.default_rng(1)
    k, h, b = 12, 20, 3
    w = rng.normal(0, 0.4, (k, h)).astype(np.float32)
    u = rng.normal(0, 0.3, (h, h)).astype(np.float32)
    then = helper.make_graph([
        helper.make_node("MatMul", ["xt", "W"], ["xw"]),
        helper.make_node("MatMul", ["hin", "U"], ["hu"]),
        helper.make_node("Add", ["xw", "hu"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["hnew"])], "then", [],
        [helper.make_tensor_value_info("hnew", TensorProto.FLOAT, [b, h])])
    other = helper.make_graph([helper.make_node("Identity", ["hin"], ["hsame"])], "else", [],
                              [helper.make_tensor_value_info("hsame", TensorProto.FLOAT, [b, h])])
    body = helper.make_graph([
        helper.make_node("ReduceSum", ["xt"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["hout"], then_branch=then, else_branch=other),
        helper.make_node("Identity", ["hout"], ["yt"])], "body",
        [helper.make_tensor_value_info("hin", TensorProto.FLOAT, [b, h]),
         helper.make_tensor_value_info("xt", TensorProto.FLOAT, [b, k])],
        [helper.make_tensor_value_info("hout", TensorProto.FLOAT, [b, h]),
         helper.make_tensor_value_info("yt", TensorProto.FLOAT, [b, h])])
    nodes = [helper.make_node("Scan", ["h0", "x"], ["hT", "ys"], body=body, num_scan_inputs=1),
             helper.make_node("Gemm", ["hT", "V"], ["y"])]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(u, "U"),
             numpy_helper.from_array(np.zeros((b, h), np.float32), "h0"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(rng.normal(0, 0.3, (h, 4)).astype(np.float32), "V")]
    return make_model(nodes, [vi("x", [9, b, k])], [vi("y", None), vi("ys", None)], inits)


def test_scan_with_an_if_inside(tmp_path):
    model = _scan_with_nested_if()
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.normal(size=(9, 3, 12)).astype(np.float32)} for _ in range(5)]
    q, built = _check(model, feeds[:3], feeds[3:], close={"y": 0.999})
    scan = next(n for n in q.nodes if n.op == "Scan")
    inner = next(n for n in scan.attrs["body"].nodes if n.op == "If")
    assert [n.op for n in inner.attrs["then_branch"].nodes].count("QMatMulWide") == 2
    assert built.placements[scan.name].target == "accel"
    built.save(tmp_path / "m.cel")
    loaded = AccelModel.load(tmp_path / "m.cel")
    want = built.run(feeds[4], target="cycle")
    assert compare_outputs(loaded.run(feeds[4], target="cycle"), want, exact=True)[0]
    assert loaded.summary()["cycles"] == built.summary()["cycles"]


def test_a_loop_body_without_products_stays_on_the_cpu_with_its_reason():
    body = helper.make_graph([
        helper.make_node("Add", ["s_in", "one"], ["s_out"]),
        helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [4])])
    m = make_model([helper.make_node("Loop", ["n", "t", "x"], ["y"], body=body)],
                   [vi("x", [4])], [vi("y", None)],
                   [numpy_helper.from_array(np.array(3, np.int64), "n"),
                    numpy_helper.from_array(np.array(True), "t"),
                    numpy_helper.from_array(np.ones(4, np.float32), "one")])
    feeds = [{"x": np.arange(4, dtype=np.float32)}]
    q = quantize_model(m, feeds, input_shapes={"x": (4,)})
    built = AccelModel.build(q)
    loop = next(n for n in q.nodes if n.op == "Loop")
    assert built.placements[loop.name].target == "cpu"
    assert "its bodies hold no integer product" in built.placements[loop.name].reason
    np.testing.assert_array_equal(built.run(feeds[0])["y"], feeds[0]["x"] + 3)


def _if_with_conv_and_lstm():
    """Silero's shape in small: an If on a run-time input whose branch runs a 1-D Conv
    (stride 2, padding), Relu, an LSTM step (its state from the input) and a Gemm."""
    rng = np.random.default_rng(3)
    c, h, o = 6, 10, 3
    branch = helper.make_graph([
        helper.make_node("Conv", ["x", "Wc", "Bc"], ["cv"], kernel_shape=[3], strides=[2],
                         pads=[1, 1]),
        helper.make_node("Relu", ["cv"], ["r"]),
        helper.make_node("ReduceMean", ["r"], ["m"], axes=[2], keepdims=0),
        helper.make_node("Unsqueeze", ["m", "ax0"], ["X"]),
        helper.make_node("Gather", ["state", "i0"], ["h0"], axis=0),
        helper.make_node("Gather", ["state", "i1"], ["c0"], axis=0),
        helper.make_node("Unsqueeze", ["h0", "ax0"], ["H0"]),
        helper.make_node("Unsqueeze", ["c0", "ax0"], ["C0"]),
        helper.make_node("LSTM", ["X", "W", "R", "B", "", "H0", "C0"], ["Y", "Yh", "Yc"],
                         hidden_size=h),
        helper.make_node("Squeeze", ["Yh", "ax0"], ["hq"]),
        helper.make_node("Gemm", ["hq", "Wo"], ["y"], transB=1)], "then", [],
        [vi("y", None)])
    other = helper.make_graph([helper.make_node("Gemm", ["zeros", "Wo"], ["y2"], transB=1)],
                              "else", [], [vi("y2", None)])
    nodes = [helper.make_node("Greater", ["sr", "k8"], ["wide"]),
             helper.make_node("If", ["wide"], ["out"], then_branch=branch, else_branch=other)]

    def arr(name, *shape, s=0.4):
        return numpy_helper.from_array((rng.normal(size=shape) * s).astype(np.float32), name)
    inits = [arr("Wc", 8, c, 3), arr("Bc", 8, s=0.1), arr("W", 1, 4 * h, 8), arr("R", 1, 4 * h, h),
             arr("B", 1, 8 * h, s=0.1), arr("Wo", o, h), arr("zeros", 2, h, s=0.0),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array(0, np.int64), "i0"),
             numpy_helper.from_array(np.array(1, np.int64), "i1"),
             numpy_helper.from_array(np.array(8000, np.int64), "k8")]
    return make_model(nodes, [vi("x", [2, c, 9]), vi("state", [2, 2, h]),
                              vi("sr", [], TensorProto.INT64)], [vi("out", None)], inits)


def test_if_branch_with_a_convolution_and_an_lstm():
    model = _if_with_conv_and_lstm()
    rng = np.random.default_rng(4)

    def feeds():
        return {"x": rng.normal(size=(2, 6, 9)).astype(np.float32),
                "state": (0.5 * rng.normal(size=(2, 2, 10))).astype(np.float32),
                "sr": np.array(16000, np.int64)}
    q, built = _check(model, [feeds() for _ in range(3)], [feeds() for _ in range(2)])
    cond = next(n for n in q.nodes if n.op == "If")
    ops = [n.op for n in cond.attrs["then_branch"].nodes]
    assert {"QConvWide", "QLSTM", "QMatMulWide"} <= set(ops), ops
    assert built.placements[cond.name].target == "accel"
    assert placement_record(built)["accel_mac_share"] == 1.0


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1),
    dict(kernel_shape=[1, 4], strides=[1, 2], pads=[0, 1, 0, 2], dilations=[1, 2], group=1)])
def test_the_wide_convolution_is_exact_on_its_16_bit_values(attrs):
    """QConvWide's product (an exact float64 convolution of the int16 values) equals the
    accelerator's way, im2col and an integer product, and stays within the 16-bit steps of
    the float convolution."""
    from celosia.compiler.graph.ops import conv
    from celosia.compiler.graph.qops import wide_matmul_exact
    from celosia.compiler.graph.qrecurrent import quantize16
    from celosia.compiler.graph.qwide import conv_columns, qconv_wide

    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 5, 7, 9)).astype(np.float32)
    w = rng.integers(-32639, 32640, (4, 5, *attrs["kernel_shape"])).astype(np.int16)
    a = {**attrs, "x_scale": float(np.float32(4 / 32767))}
    q = quantize16(x, a["x_scale"])
    exact = conv(a, q.astype(np.float64), w.astype(np.float64)).astype(np.int64)
    cols = wide_matmul_exact(conv_columns(q, a), w.reshape(4, -1))
    np.testing.assert_array_equal(np.moveaxis(cols.reshape(2, *exact.shape[2:], 4), -1, 1),
                                  exact)
    scale = np.full(4, 1e-4, np.float32)
    y = qconv_wide(a, x, w, scale)
    ref = conv(a, x.astype(np.float64), w.astype(np.float64) * 1e-4)
    assert cosine(y, ref) > 0.9999999


def test_hoisting_a_loop_projection_changes_no_bit(monkeypatch):
    """hoist_loop_products gives the same outputs bit for bit as the body's per-iteration
    products (the zoo's control_flow model)."""
    import celosia.compiler.graph.quantize as quantize
    from celosia.compiler.graph.qbody import hoist_loop_products
    from celosia.compiler.graph.reference import run_graph

    model = recurrent.control_flow(features=8, hidden=16, classes=5, time=6, batch=1)
    rng = np.random.default_rng(6)
    args = dict(batch=1, time=6, features=8)
    calib = [recurrent.control_flow_feeds(args, rng) for _ in range(2)]
    monkeypatch.setattr(quantize, "hoist_loop_products", lambda g: g)
    q0 = quantize_model(model, calib, input_shapes={"x": (1, 6, 8), "mode": ()})
    q1 = hoist_loop_products(q0)
    assert sum(n.op == "QMatMulWide" for n in q1.nodes) == 1
    test = recurrent.control_flow_feeds(args, rng)
    a, b = run_graph(q0, test), run_graph(q1, test)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
