"""Graph passes: each on a small model, the IR expected after it, and the same outputs."""

import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from celosia.compiler.graph.ir import print_node
from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.graph.passes import (PIPELINE, eliminate_identities, fold_batch_norm,
                                           fold_constants, fold_pads, fuse_epilogues,
                                           fuse_layer_norms, optimize, remove_dead_code)
from celosia.models import zoo as models

RNG = np.random.default_rng(0)


def make_model(nodes, inputs, outputs, inits=None, opset=17):
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def body(graph) -> str:
    """The nodes of a graph as printed, one per line."""
    return "\n".join(print_node(n, graph.types) for n in graph.nodes)


def random_feeds(graph):
    return {i: RNG.normal(size=graph.types[i].shape).astype(graph.types[i].dtype)
            for i in graph.inputs}


def assert_same_outputs(before, after, rtol=1e-5, atol=1e-6):
    feeds = random_feeds(before)
    want, got = run_graph(before, feeds), run_graph(after, feeds)
    assert list(want) == list(got)
    for k in want:
        assert want[k].dtype == got[k].dtype and want[k].shape == got[k].shape
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol)


def f32(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def bn_params(c, prefix="bn"):
    return {f"{prefix}_s": RNG.uniform(0.5, 1.5, c).astype(np.float32),
            f"{prefix}_b": f32(c), f"{prefix}_m": f32(c),
            f"{prefix}_v": RNG.uniform(0.5, 1.5, c).astype(np.float32)}


# ---- constant folding ------------------------------------------------------------------------


def test_fold_constants_removes_shape_arithmetic():
    before = import_onnx(models.small_cnn())
    after = fold_constants(before)
    ops = [n.op for n in after.nodes]
    assert not {"Shape", "Gather", "Unsqueeze", "Concat"} & set(ops)
    assert after.initializers["concat16"].tolist() == [1, -1]
    assert_same_outputs(before, after, rtol=0, atol=0)


def test_fold_constants_cast_reshape_chain():
    nodes = [helper.make_node("Cast", ["c"], ["c32"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Reshape", ["c32", "s"], ["r"], name="reshape"),
             helper.make_node("Add", ["x", "r"], ["y"], name="add")]
    m = make_model(nodes, [vi("x", [2, 3])], [vi("y", None)],
                   {"c": np.arange(6, dtype=np.int64)})
    before = import_onnx(m)
    after = remove_dead_code(fold_constants(before))
    assert body(after) == "%y = Add(%x, %r) : float32[2,3]"
    assert after.initializers["r"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert set(after.initializers) == {"r"}
    assert_same_outputs(before, after, rtol=0, atol=0)


# ---- identities and dead code ----------------------------------------------------------------


def test_a_cast_to_its_own_type_is_a_copy_and_pow_by_two_a_product():
    """Exporters write both (Silero VAD's STFT magnitude): canonical forms make them an
    Identity (eliminated) and a Mul (a compiled element-wise kernel), with onnxruntime's
    results bit for bit; Pow by 3 (GPT-2's tanh GELU) two Muls, bit for bit too; other
    exponents, and a 2 that would broadcast, stay Pow."""
    import onnxruntime as ort

    from celosia.runtime.cpu import CpuModel

    nodes = [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("CastLike", ["c", "x"], ["cl"], name="castlike"),
             helper.make_node("Pow", ["cl", "two"], ["sq"], name="pow2"),
             helper.make_node("Pow", ["x", "three"], ["cube"], name="pow3"),
             helper.make_node("Pow", ["s", "two_2d"], ["wide"], name="pow_wide"),
             helper.make_node("Pow", ["x", "half"], ["root"], name="pow_half"),
             helper.make_node("Add", ["sq", "cube"], ["y"], name="add")]
    m = make_model(nodes, [vi("x", [3, 7]), vi("s", [5])],
                   [vi("y", None), vi("sq", None), vi("wide", None), vi("cube", None),
                    vi("root", None)],
                   {"two": np.array([2.0], np.float32), "three": np.float32(3),
                    "two_2d": np.full((2, 1), 2, np.float32), "half": np.float32(0.5)})
    graph = optimize(import_onnx(m))
    assert [n.op for n in graph.nodes] == ["Mul", "Mul", "Mul", "Pow", "Pow", "Add"]
    assert graph.nodes[0].inputs == ("x", "x")
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    built = CpuModel.from_graph(graph)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        feeds = {"x": rng.normal(size=(3, 7)).astype(np.float32) * 1e3,
                 "s": rng.normal(size=5).astype(np.float32)}
        want = dict(zip(["y", "sq", "wide", "cube", "root"], session.run(None, feeds)))
        got = built.run(feeds)
        for name in ("sq", "wide", "cube"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        np.testing.assert_array_equal(got["sq"], feeds["x"] * feeds["x"])
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6)
        np.testing.assert_allclose(got["root"], want["root"], rtol=1e-6)


def test_eliminate_identities_keeps_graph_outputs():
    nodes = [helper.make_node("Identity", ["x"], ["a"], name="id0"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Identity", ["b"], ["y"], name="id1")]
    before = import_onnx(make_model(nodes, [vi("x", [4])], [vi("y", None)]))
    after = eliminate_identities(before)
    assert body(after) == "%b = Relu(%x) : float32[4]\n%y = Identity(%b) : float32[4]"
    assert_same_outputs(before, after, rtol=0, atol=0)


def test_remove_dead_code_drops_unused_nodes_outputs_and_constants():
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "idx"], kernel_shape=[2, 2], name="pool"),
             helper.make_node("Mul", ["p", "k"], ["unused"], name="dead"),
             helper.make_node("Relu", ["p"], ["y"], name="relu")]
    before = import_onnx(make_model(nodes, [vi("x", [1, 1, 4, 4])], [vi("y", None)],
                                    {"k": f32(1)}))
    after = remove_dead_code(before)
    assert [n.name for n in after.nodes] == ["pool", "relu"]
    assert after.nodes[0].outputs == ("p",) and not after.initializers
    assert set(after.types) == {"x", "p", "y"}
    assert_same_outputs(before, after, rtol=0, atol=0)


# ---- BatchNorm folding -----------------------------------------------------------------------


def test_fold_batch_norm_into_conv():
    p = bn_params(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", *p], ["y"], epsilon=1e-3, name="bn")]
    before = import_onnx(make_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", None)],
                                    {"w": f32(4, 3, 3, 3), **p}))
    after = remove_dead_code(fold_batch_norm(before))
    assert body(after) == ("%y = Conv(%x, %w/bn, %bn/bias) {kernel_shape=[3,3], strides=[1,1], "
                           "pads=[1,1,1,1], dilations=[1,1], group=1} : float32[1,4,6,6]")
    assert_same_outputs(before, after)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_fold_batch_norm_into_gemm(trans_b):
    p = bn_params(5)
    w = f32(5, 3) if trans_b else f32(3, 5)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=trans_b, alpha=0.5,
                              beta=2.0, name="gemm"),
             helper.make_node("BatchNormalization", ["g", *p], ["y"], name="bn")]
    before = import_onnx(make_model(nodes, [vi("x", [2, 3])], [vi("y", None)],
                                    {"w": w, "b": f32(5), **p}))
    after = remove_dead_code(fold_batch_norm(before))
    assert [n.op for n in after.nodes] == ["Gemm"]
    assert after.nodes[0].attrs["alpha"] == 1.0 and after.nodes[0].attrs["beta"] == 1.0
    assert_same_outputs(before, after)


def test_standalone_batch_norm_becomes_scale_and_shift():
    p = bn_params(3)
    nodes = [helper.make_node("BatchNormalization", ["x", *p], ["y"], name="bn")]
    before = import_onnx(make_model(nodes, [vi("x", [2, 3, 4, 4])], [vi("y", None)], p))
    after = remove_dead_code(fold_batch_norm(before))
    assert body(after) == ("%bn/scaled = Mul(%x, %bn/scale) : float32[2,3,4,4]\n"
                           "%y = Add(%bn/scaled, %bn/shift) : float32[2,3,4,4]")
    assert after.initializers["bn/scale"].shape == (3, 1, 1)
    assert_same_outputs(before, after)


def test_batch_norm_not_folded_into_a_conv_with_other_readers():
    p = bn_params(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("BatchNormalization", ["c", *p], ["b"], name="bn"),
             helper.make_node("Add", ["b", "c"], ["y"], name="add")]
    before = import_onnx(make_model(nodes, [vi("x", [1, 3, 5, 5])], [vi("y", None)],
                                    {"w": f32(4, 3, 3, 3), **p}))
    after = fold_batch_norm(before)
    assert [n.op for n in after.nodes] == ["Conv", "Mul", "Add", "Add"]
    assert_same_outputs(before, after)


# ---- epilogue fusion -------------------------------------------------------------------------


def test_fuse_conv_bias_add_and_relu6():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "bias"], ["a"], name="add"),
             helper.make_node("Clip", ["a", "lo", "hi"], ["y"], name="relu6")]
    before = import_onnx(make_model(
        nodes, [vi("x", [1, 2, 5, 5])], [vi("y", None)],
        {"w": f32(4, 2, 3, 3), "bias": f32(4, 1, 1), "lo": np.float32(0), "hi": np.float32(6)}))
    after = remove_dead_code(fuse_epilogues(before))
    assert body(after) == ("%y = Conv(%x, %w, %bias/bias) {kernel_shape=[3,3], strides=[1,1], "
                           "pads=[0,0,0,0], dilations=[1,1], group=1, epilogue=[Clip(0.0,6.0)]} "
                           ": float32[1,4,3,3]")
    assert_same_outputs(before, after)


def test_fuse_residual_add_and_relu_into_the_later_conv():
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    before = import_onnx(make_model(nodes, [vi("x", [1, 2, 4, 4])], [vi("y", None)],
                                    {"w1": f32(2, 2, 3, 3), "w2": f32(2, 2, 3, 3)}))
    after = fuse_epilogues(before)
    assert [n.name for n in after.nodes] == ["conv2", "conv1"]
    assert after.nodes[1].inputs == ("x", "w1", "", "b")
    assert after.nodes[1].attrs["epilogue"] == (("Add", 3), ("Relu",))
    assert_same_outputs(before, after)


def test_fuse_matmul_bias_and_activations():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["bias", "m"], ["a"], name="add"),
             helper.make_node("LeakyRelu", ["a"], ["l"], alpha=0.2, name="lrelu"),
             helper.make_node("HardSwish", ["l"], ["h"], name="hswish"),
             helper.make_node("Sigmoid", ["h"], ["y"], name="sig")]
    before = import_onnx(make_model(nodes, [vi("x", [3, 4])], [vi("y", None)],
                                    {"w": f32(4, 5), "bias": f32(5)}))
    after = fuse_epilogues(before)
    assert body(after) == ("%y = MatMul(%x, %w, %bias) {epilogue=[Add(%bias), LeakyRelu(0.2), "
                           "HardSwish, Sigmoid]} : float32[3,5]")
    assert_same_outputs(before, after)


def test_no_fusion_when_the_output_is_read_twice_or_an_output():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("Add", ["m", "r"], ["y"], name="add")]
    before = import_onnx(make_model(nodes, [vi("x", [3, 4])], [vi("y", None)], {"w": f32(4, 5)}))
    assert body(fuse_epilogues(before)) == body(before)


# ---- fold_pads -------------------------------------------------------------------------------


def _pad_conv(pads, *, mode="constant", value=None, kernel=(3, 3), conv_pads=None,
              dilations=None, readers=1, x_shape=(1, 4, 9, 11), extra_reader=None):
    """Pad -> ``readers`` Convs (-> Add when two), optionally another reader of the Pad."""
    nd = len(x_shape) - 2
    inits = {"pads": np.array(pads, np.int64)}
    pad_in = ["x", "pads"]
    if value is not None:
        inits["v"] = np.array(value, np.float32)
        pad_in.append("v")
    nodes = [helper.make_node("Pad", pad_in, ["p"], mode=mode)]
    outs = []
    for k in range(readers):
        inits[f"w{k}"] = RNG.normal(size=(3, x_shape[1], *kernel)).astype(np.float32)
        nodes.append(helper.make_node("Conv", ["p", f"w{k}"], [f"c{k}"],
                                      pads=conv_pads or [0] * (2 * nd),
                                      dilations=dilations or [1] * nd))
        outs.append(f"c{k}")
    if readers == 2:
        nodes.append(helper.make_node("Add", outs, ["y"]))
    else:
        nodes.append(helper.make_node("Identity", outs, ["y"]))
    outputs = [vi("y", None)]
    if extra_reader:
        nodes.append(helper.make_node(extra_reader, ["p"], ["z"]))
        outputs.append(vi("z", None))
    return import_onnx(make_model(nodes, [vi("x", list(x_shape))], outputs, inits))


@pytest.mark.parametrize("pads, kw", [
    ([0, 0, 1, 0, 0, 0, 1, 2], {}),                                   # TF "same", stride 1
    ([0, 0, 2, 1, 0, 0, 0, 1], {"conv_pads": [0, 1, 0, 0]}),          # added to its own
    ([0, 0, 4, 0, 0, 0], {"kernel": (3,), "dilations": [2],           # causal 1-D
                          "x_shape": (1, 4, 20)}),
    ([0, 0, 1, 1, 0, 0, 1, 1], {"readers": 2}),                       # two Convs read it
])
def test_fold_pads(pads, kw):
    before = _pad_conv(pads, **kw)
    after = fold_pads(before)
    assert "Pad" not in [n.op for n in after.nodes]
    convs = [n for n in after.nodes if n.op == "Conv"]
    assert convs and all(n.inputs[0] == "x" for n in convs)
    assert_same_outputs(before, after)


@pytest.mark.parametrize("pads, kw", [
    ([0, 0, 1, 1, 0, 0, 1, 1], {"value": 0.5}),                       # not zero
    ([0, 0, 1, 1, 0, 0, 1, 1], {"mode": "reflect"}),
    ([1, 0, 1, 1, 0, 0, 1, 1], {}),                                   # a batch pad
    ([0, 0, 3, 0, 0, 0, 0, 0], {}),                                   # beyond the kernel
    ([0, 0, 1, 1, 0, 0, 1, 1], {"extra_reader": "Relu"}),             # another reader
])
def test_fold_pads_keeps(pads, kw):
    before = _pad_conv(pads, **kw)
    after = fold_pads(before)
    assert "Pad" in [n.op for n in after.nodes]
    assert_same_outputs(before, after)


# ---- fuse_layer_norms ------------------------------------------------------------------------


def _spelt_layer_norm(shape=(2, 5, 8), axes=(-1,), square="Pow", scale=(8,), bias=(8,),
                      eps_first=False, power=2.0, extra_reader=False):
    """LayerNorm as exporters before opset 17 write it, over ``axes``."""
    inits = {"two": np.array(power, np.float32), "eps": np.array(1e-5, np.float32)}
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=list(axes), keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]) if square == "Pow"
             else helper.make_node("Mul", ["d", "d"], ["p"]),
             helper.make_node("ReduceMean", ["p"], ["v"], axes=list(axes), keepdims=1),
             helper.make_node("Add", ["eps", "v"] if eps_first else ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n"])]
    last = "n"
    if scale is not None:
        inits["g"] = RNG.normal(size=scale).astype(np.float32)
        nodes.append(helper.make_node("Mul", ["n", "g"], ["ng"]))
        last = "ng"
    if bias is not None:
        inits["b"] = RNG.normal(size=bias).astype(np.float32)
        nodes.append(helper.make_node("Add", [last, "b"], ["nb"]))
        last = "nb"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    outputs = [vi("y", None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["d"], ["z"]))
        outputs.append(vi("z", None))
    return import_onnx(make_model(nodes, [vi("x", list(shape))], outputs, inits, opset=13))


@pytest.mark.parametrize("kw, absorbed", [
    ({}, 9),
    ({"square": "Mul", "eps_first": True}, 9),
    ({"scale": None, "bias": None}, 7),
    ({"scale": (1, 1, 8), "bias": None}, 8),
    ({"axes": (-2, -1), "scale": (5, 8), "bias": (8,)}, 9),    # two trailing axes
    ({"scale": (2, 1, 8)}, 7),                                 # scale varies along the batch
])
def test_fuse_layer_norms(kw, absorbed):
    before = _spelt_layer_norm(**kw)
    after = fuse_layer_norms(before)
    ops = [n.op for n in after.nodes]
    assert ops.count("LayerNormalization") == 1 and "ReduceMean" not in ops
    assert len(before.nodes) - len(after.nodes) == absorbed - 1
    assert_same_outputs(before, after, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [{"axes": (1,)}, {"power": 3.0}, {"extra_reader": True}])
def test_fuse_layer_norms_keeps(kw):
    before = _spelt_layer_norm(**kw)
    assert fuse_layer_norms(before).nodes == before.nodes


# ---- the pipeline ----------------------------------------------------------------------------


def test_pipeline_order():
    assert [name for name, _ in PIPELINE] == ["fold_constants", "eliminate_identities",
                                              "fold_pads", "fold_batch_norm",
                                              "fuse_layer_norms", "fuse_mish", "fuse_epilogues",
                                              "remove_dead_code"]


def test_optimize_small_cnn():
    before = import_onnx(models.small_cnn())
    after = optimize(before)
    assert textwrap.dedent(body(after)).splitlines()[0].startswith(
        "%relu5 = Conv(%image, %conv1.weight/bn, %bn4/bias)")
    assert [n.op for n in after.nodes] == ["Conv", "MaxPool", "Conv", "Reshape", "Gemm",
                                           "Softmax"]
    assert_same_outputs(before, after)


@pytest.mark.parametrize("build", [models.resnet18, models.mobilenet_v2])
def test_optimize_whole_models(build):
    before = import_onnx(build(image_size=32))
    after = optimize(before)
    assert not {"BatchNormalization", "Relu", "Clip", "Add"} & {n.op for n in after.nodes}
    assert_same_outputs(before, after, rtol=1e-4, atol=1e-4)
