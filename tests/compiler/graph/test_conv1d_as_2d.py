"""conv1d_as_2d: 1-D convolutions become 2-D ones of height 1 on the quantizer's path, with
the same float meaning, and quantize to integer QConv layers bit-exact between the numpy
definition and the compiled CPU build."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, onnxruntime_run, vi

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import conv1d_as_2d, optimize
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.pipeline import quantize_model


def _model(seed, *, cin, cout, k, stride, pads, dilation, group, length, residual):
    rng = np.random.default_rng(seed)
    w = (rng.normal(size=(cout, cin // group, k)) / np.sqrt(cin * k)).astype(np.float32)
    b = rng.normal(size=cout).astype(np.float32) * 0.1
    gamma = (1 + 0.1 * rng.normal(size=cout)).astype(np.float32)
    beta = (0.1 * rng.normal(size=cout)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((w, "w"), (b, "b"), (gamma, "g"), (beta, "be"),
              (np.zeros(cout, np.float32), "mu"), (np.ones(cout, np.float32), "var"))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k],
                              strides=[stride], pads=list(pads), dilations=[dilation],
                              group=group),
             helper.make_node("BatchNormalization", ["c", "g", "be", "mu", "var"], ["bn"])]
    out_len = (length + sum(pads) - dilation * (k - 1) - 1) // stride + 1
    if residual:  # a residual read by the fused epilogue: a run-time [N, C, L] operand
        nodes.append(helper.make_node("Add", ["bn", "skip"], ["sum"]))
        inputs = [vi("x", [2, cin, length]), vi("skip", [2, cout, out_len])]
    else:
        nodes.append(helper.make_node("Identity", ["bn"], ["sum"]))
        inputs = [vi("x", [2, cin, length])]
    nodes.append(helper.make_node("Relu", ["sum"], ["y"]))
    return make_model(nodes, inputs, [vi("y", [2, cout, out_len])], inits)


CASES = [
    dict(cin=4, cout=8, k=3, stride=1, pads=(1, 1), dilation=1, group=1, length=20, residual=False),
    dict(cin=6, cout=6, k=5, stride=2, pads=(2, 1), dilation=1, group=6, length=31, residual=False),
    dict(cin=8, cout=12, k=3, stride=1, pads=(2, 2), dilation=2, group=4, length=16, residual=True),
    dict(cin=3, cout=16, k=11, stride=4, pads=(5, 5), dilation=1, group=1, length=64, residual=True),
]


def _feeds(model, seed):
    rng = np.random.default_rng(seed)
    return {i.name: rng.normal(size=[d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in model.graph.input}


@pytest.mark.parametrize("case", range(len(CASES)))
def test_conv1d_as_2d_keeps_the_float_meaning(case):
    model = _model(case, **CASES[case])
    g = optimize(import_onnx(model))
    g2 = conv1d_as_2d(g)
    convs = [n for n in g2.nodes if n.op == "Conv"]
    assert convs and all(len(g2.types[n.inputs[1]].shape) == 4 for n in convs)
    assert all(g2.types[n.inputs[0]].shape[2] == 1 for n in convs)
    feeds = _feeds(model, 7)
    want = onnxruntime_run(model, feeds)
    got = run_graph(g2, feeds)
    np.testing.assert_allclose(got["y"], want[0] if isinstance(want, list) else want["y"],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_conv1d_layers_quantize_to_integer_convolutions(case):
    from celosia.runtime.cpu import CpuModel

    model = _model(case, **CASES[case])
    calib = [_feeds(model, s) for s in range(1, 7)]
    q = quantize_model(model, calib)
    assert [n.op for n in q.nodes].count("QConv") == 1
    assert not any(n.op == "Conv" for n in q.nodes)
    feeds = _feeds(model, 100)
    ref = run_graph(q, feeds)
    cpu = CpuModel.from_graph(q).run(feeds)
    np.testing.assert_array_equal(cpu["y"], ref["y"])  # the integer path, bit for bit
    want = onnxruntime_run(model, feeds)
    want = want[0] if isinstance(want, list) else want["y"]
    a, b = cpu["y"].ravel().astype(np.float64), want.ravel().astype(np.float64)
    assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.99


def test_rewrite_runs_once_and_leaves_2d_convolutions_alone():
    g2 = conv1d_as_2d(optimize(import_onnx(_model(0, **CASES[0]))))
    g3 = conv1d_as_2d(g2)  # only 2-D convolutions left: nothing to do
    assert [(n.op, n.inputs, n.outputs) for n in g3.nodes] == \
        [(n.op, n.inputs, n.outputs) for n in g2.nodes]


def _stack_1d(seed=0, channels=16, length=24):
    """Conv1d -> Relu (fused) -> Conv1d -> Tanh -> Sigmoid (nodes of their own) -> Conv1d with a
    residual read from the first layer's output, then Tanh as the model's last node: the
    shape of Whisper's, wav2vec2's and TCN stacks."""
    rng = np.random.default_rng(seed)
    ws = {f"w{i}": (rng.normal(size=(channels, channels, 3)) / np.sqrt(3 * channels))
          .astype(np.float32) for i in range(3)}
    c = helper.make_node
    conv = dict(kernel_shape=[3], pads=[1, 1])
    nodes = [c("Conv", ["x", "w0"], ["c0"], **conv), c("Relu", ["c0"], ["r0"]),
             c("Conv", ["r0", "w1"], ["c1"], **conv), c("Tanh", ["c1"], ["t1"]),
             c("Sigmoid", ["t1"], ["a1"]),
             c("Conv", ["a1", "w2"], ["c2"], **conv), c("Add", ["c2", "r0"], ["s2"]),
             c("Tanh", ["s2"], ["y"])]
    model = make_model(nodes, [vi("x", [1, channels, length])], [vi("y", [1, channels, length])],
                       [numpy_helper.from_array(v, k) for k, v in ws.items()])
    return model, lambda s: {"x": np.random.default_rng(s).normal(
        size=(1, channels, length)).astype(np.float32)}


def test_a_stack_of_1d_layers_stays_4d_and_on_the_accelerator():
    """Each layer reads the previous one's 4-D output (element-wise nodes between them done
    on it again), not an Unsqueeze of its Squeeze: the float meaning is the same, no
    Squeeze/Unsqueeze is left between the layers, and on the accelerator the stack crosses
    once in and once out, bit-exact with the all-CPU int8 build on fsim and the cycle model."""
    from celosia.runtime.accel import AccelModel

    model, feeds = _stack_1d()
    g = optimize(import_onnx(model))
    lifted = conv1d_as_2d(g)
    ops = [n.op for n in lifted.nodes]
    assert ops == ["Unsqueeze", "Conv", "Conv", "Tanh", "Sigmoid", "Conv", "Squeeze", "Tanh"], ops
    for s in range(2):
        np.testing.assert_allclose(run_graph(lifted, feeds(s))["y"], run_graph(g, feeds(s))["y"],
                                   rtol=1e-5, atol=1e-6)
    q = quantize_model(model, [feeds(s) for s in range(1, 5)])
    built = AccelModel.build(q)
    convs = [n.name for n in q.nodes if n.op == "QConv"]
    assert len(convs) == 3 and all(built.placements[n].target == "accel" for n in convs)
    cpu = built.cpu_build()
    for s in (10, 11):
        want = cpu.run(feeds(s))["y"]
        for target in ("fsim", "cycle"):
            np.testing.assert_array_equal(built.run(feeds(s), target=target)["y"], want)
        # the input packed in, the last layer's output read back; the Tanh/Sigmoid tables
        # between the layers computed in place in DRAM
        assert built.crossings == {"to_accel": 1, "to_cpu": 1}, built.crossings


@pytest.mark.parametrize("kernel,stride,pads,out_pad", [(4, 4, (0, 0), 0), (16, 8, (4, 4), 0),
                                                        (3, 2, (1, 1), 1)])
def test_conv_transpose_1d_is_lifted_too(kernel, stride, pads, out_pad):
    """A 1-D ConvTranspose (Conv-TasNet's and vocoders' decoders) becomes a 2-D one of
    height 1 with the same float meaning, so the quantizer's 2-D int8 forms see it; the
    non-overlapping upsampler (stride = kernel) is a QConv on the accelerator, bit-exact
    with the all-CPU int8 build."""
    from celosia.runtime.accel import AccelModel

    rng = np.random.default_rng(kernel)
    cin, cout, length = 16, 8, 12
    w = (rng.normal(size=(cin, cout, kernel)) / np.sqrt(cin)).astype(np.float32)
    b = (0.1 * rng.normal(size=cout)).astype(np.float32)
    out_len = (length - 1) * stride - sum(pads) + kernel + out_pad
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[kernel],
                              strides=[stride], pads=list(pads), output_padding=[out_pad])]
    model = make_model(nodes, [vi("x", [1, cin, length])], [vi("y", [1, cout, out_len])],
                       [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    g = optimize(import_onnx(model))
    lifted = conv1d_as_2d(g)
    assert [n.op for n in lifted.nodes] == ["Unsqueeze", "ConvTranspose", "Squeeze"]
    feeds = [{"x": np.random.default_rng(s).normal(size=(1, cin, length)).astype(np.float32)}
             for s in range(5)]
    want = onnxruntime_run(model, feeds[0])["y"]
    np.testing.assert_allclose(run_graph(lifted, feeds[0])["y"], want, rtol=1e-5, atol=1e-5)
    q = quantize_model(model, feeds[1:])
    assert not any("-D ConvTranspose" in n.attrs.get("float_reason", "") for n in q.nodes)
    if kernel == stride:
        built = AccelModel.build(q)
        convs = [n.name for n in q.nodes if n.op == "QConv"]
        assert len(convs) == 1 and built.placements[convs[0]].target == "accel"
        expect = built.cpu_build().run(feeds[0])["y"]
        for target in ("fsim", "cycle"):
            np.testing.assert_array_equal(built.run(feeds[0], target=target)["y"], expect)
