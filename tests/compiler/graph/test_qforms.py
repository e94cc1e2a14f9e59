"""quant_forms (compiler/graph/qforms.py): spatial ReduceMean, AveragePool, an unfused
BatchNormalization and a BN after a residual sum take int8 layer forms on the quantizer's
path. The float meaning is onnxruntime's; the int8 graph keeps float only the AveragePool
whose border windows divide by fewer taps (with that reason); its accelerator build runs the
new depthwise layers and pools on the accelerator, bit-exact with the all-CPU int8 build on
fsim and the cycle model."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, onnxruntime_run, vi

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.qforms import quant_forms
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.pipeline import quantize_model

C, HW = 12, 8  # channels not a multiple of BLOCK (16)

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _model(seed=0):
    rng = np.random.default_rng(seed)
    h = helper.make_node
    inits = {}

    def conv(name, x, y, k=3):
        inits[f"{name}_w"] = rng.normal(0, 1 / np.sqrt(C * k * k), (C, C, k, k))
        inits[f"{name}_b"] = rng.normal(0, 0.1, C)
        return h("Conv", [x, f"{name}_w", f"{name}_b"], [y], kernel_shape=[k, k],
                 pads=[k // 2] * 4)

    def bn(name, x, y):
        inits[f"{name}_g"] = rng.uniform(0.5, 1.5, C)
        inits[f"{name}_be"] = rng.normal(0, 0.2, C)
        inits[f"{name}_mu"] = rng.normal(0, 0.2, C)
        inits[f"{name}_var"] = rng.uniform(0.5, 2, C)
        return h("BatchNormalization", [x] + [f"{name}_{s}" for s in ("g", "be", "mu", "var")],
                 [y])

    inits["fc_w"] = rng.normal(0, 0.3, (C, 10))
    nodes = [
        conv("c0", "x", "a"),
        # pre-activation BN: 'a' has two readers, so it does not fold into c0
        bn("bn1", "a", "an"), h("Relu", ["an"], ["ar"]),
        conv("c1", "ar", "b"),
        h("AveragePool", ["b"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        h("AveragePool", ["p1"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
          count_include_pad=1),
        h("AveragePool", ["p1"], ["p3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        conv("c2", "p2", "c"), h("Add", ["c", "p3"], ["s"]),
        bn("bn2", "s", "sb"), h("Relu", ["sb"], ["r"]),  # BN after the residual sum
        h("ReduceMean", ["r"], ["m"], axes=[2, 3], keepdims=0),
        h("Gemm", ["m", "fc_w"], ["y"]),
        h("ReduceMean", ["a"], ["y2"], axes=[2, 3], keepdims=1),
    ]
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()]
    return make_model(nodes, [vi("x", [1, C, HW, HW])], [vi("y", [1, 10]),
                                                         vi("y2", [1, C, 1, 1])], inits)


def _feeds(seed):
    return {"x": np.random.default_rng(seed).normal(size=(1, C, HW, HW)).astype(np.float32)}


def test_rewrites_keep_the_float_meaning():
    model = _model()
    g = quant_forms(optimize(import_onnx(model)))
    ops = [n.op for n in g.nodes]
    assert "ReduceMean" not in ops and "Mul" not in ops and ops.count("AveragePool") == 1
    assert ops.count("GlobalAveragePool") == 2
    depthwise = [n for n in g.nodes if n.op == "Conv" and n.attrs["group"] == C]
    # BN1 (its Relu fused), the two average pools that divide by 9 and 4, BN2's scale
    assert len(depthwise) == 4
    assert any(n.attrs.get("epilogue") == (("Relu",),) for n in depthwise)
    feeds = _feeds(3)
    want, got = onnxruntime_run(model, feeds), run_graph(g, feeds)
    for name in ("y", "y2"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
    assert quant_forms(g) is g  # nothing left to rewrite


def test_int8_graph_and_accelerator_build():
    from celosia.runtime.accel import AccelModel, compare_outputs

    model = _model()
    q = quantize_model(model, [_feeds(s) for s in range(1, 5)])
    floats = [n for n in q.nodes if not n.op.startswith("Q") and
              n.op not in ("Quantize", "Dequantize", "Flatten")]
    # the pool that stays float, and the residual sum that reads it
    assert [n.op for n in floats] == ["AveragePool", "Add"]
    assert "count_include_pad=0 with padding" in floats[0].attrs["float_reason"]
    assert "is float" in floats[1].attrs["float_reason"]
    feeds = _feeds(100)
    want = onnxruntime_run(model, feeds)
    built = AccelModel.build(q)
    cpu = built.cpu_build().run(feeds)
    for name in ("y", "y2"):
        a, b = cpu[name].ravel().astype(np.float64), want[name].ravel().astype(np.float64)
        assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.995
    places = built.placements
    on_accel = {n.op for n in q.nodes if places[n.name].target == "accel"}
    assert {"QConv", "QGlobalAveragePool", "QGemm"} <= on_accel
    assert all(places[n.name].target == "accel" for n in q.nodes
               if n.op == "QConv" and n.attrs.get("group", 1) == C)
    for target in ("fsim", "cycle"):
        same, detail = compare_outputs(built.run(feeds, target=target), cpu, exact=True)
        assert same, f"{target}: {detail['summary']}"


def test_a_prelu_of_one_slope_is_a_leaky_relu_and_a_per_channel_one_stays_float():
    rng = np.random.default_rng(5)
    h = helper.make_node
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (C, C, 1, 1)).astype(np.float32), n)
             for n in ("w1", "w2")]
    inits += [numpy_helper.from_array(np.array([0.25], np.float32), "one"),
              numpy_helper.from_array(rng.uniform(0, 0.5, (C, 1, 1)).astype(np.float32),
                                      "per_channel")]
    model = make_model([h("Conv", ["x", "w1"], ["a"]), h("PRelu", ["a", "one"], ["b"]),
                        h("Conv", ["b", "w2"], ["c"]), h("PRelu", ["c", "per_channel"], ["y"])],
                       [vi("x", [1, C, HW, HW])], [vi("y", None)], inits)
    g = quant_forms(optimize(import_onnx(model)))
    assert [n.op for n in g.nodes] == ["Conv", "Conv", "PRelu"]
    assert g.nodes[0].attrs["epilogue"] == (("LeakyRelu", 0.25),)
    feeds = _feeds(3)
    np.testing.assert_allclose(run_graph(g, feeds)["y"], onnxruntime_run(model, feeds)["y"],
                               rtol=1e-5, atol=1e-6)
    q = quantize_model(model, [_feeds(s) for s in range(1, 4)])
    assert [n.op for n in q.nodes][:3] == ["Quantize", "QConv", "QLut"]
    assert "no int8 form of PRelu" in next(n for n in q.nodes
                                           if n.op == "PRelu").attrs["float_reason"]


def test_constant_after_residual_of_a_dense_layer_names_the_order():
    """A Gemm whose epilogue is scaled after its residual sum: the layer with its residual
    is int8 (the epilogue split where the int8 layer stops), the scale after it a float Mul
    that says why (not 'a run-time value')."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "s")]
    h = helper.make_node
    model = make_model([h("Gemm", ["x", "w"], ["g"]), h("Add", ["g", "x"], ["r"]),
                        h("Mul", ["r", "s"], ["y"])], [vi("x", [2, 8])], [vi("y", [2, 8])],
                       inits)
    calib = [{"x": rng.normal(size=(2, 8)).astype(np.float32)} for _ in range(3)]
    q = quantize_model(model, calib, int8_residuals=True)
    assert [n.op for n in q.nodes] == ["Quantize", "QGemm", "Dequantize", "Mul"]
    assert q.nodes[1].inputs[-1] == "x/int8"  # the residual taken by the int8 layer
    reason = q.nodes[-1].attrs["float_reason"]
    assert "Mul of a constant" in reason and "run-time value" not in reason
