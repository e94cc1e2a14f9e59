"""ConvTranspose with overlapping windows, pads and output_padding (DCGAN's kernel 4 stride 2
pads 1, decoders' kernel 3 stride 2 pads 1 output_padding 1): the quantizer writes it as a
convolution of the input with one output channel per phase, a pixel shuffle and a crop
(qtranspose.py). The rewritten float graph computes onnxruntime's outputs; the int8 graph
has a QConv where the ConvTranspose was, which the accelerator runs bit-exact with the
all-CPU int8 build on fsim and the cycle model."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, onnxruntime_run, vi

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.qtranspose import expand_conv_transposes
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.pipeline import quantize_model

CASES = [  # kernel, strides, pads, output_padding, input (H, W)
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (5, 6)),
    ((4, 4), (2, 2), (1, 1, 1, 1), (0, 0), (4, 4)),
    ((3, 3), (1, 1), (1, 1, 1, 1), (0, 0), (5, 5)),
    ((5, 3), (3, 2), (2, 0, 1, 1), (1, 0), (4, 5)),
    ((2, 2), (2, 2), (0, 0, 0, 0), (0, 0), (3, 3)),
    ((3, 3), (2, 2), (0, 0, 0, 0), (0, 0), (3, 4)),
    ((4, 4), (2, 2), (1, 1, 1, 1), (0, 0), (4, 4), 3),  # 3 groups
    ((2, 2), (2, 2), (0, 0, 0, 0), (0, 0), (3, 3), 6),  # depthwise-like: 6 groups
]

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _model(kernel, strides, pads, out_pad, hw, group=1, seed=0, cin=6, cout=6):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (cin, cout // group, *kernel))
                                     .astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.2, cout).astype(np.float32), "b"),
             numpy_helper.from_array(rng.normal(0, 0.3, (cin, 3, 1, 1)).astype(np.float32),
                                     "w0")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("ConvTranspose", ["ar", "w", "b"], ["y"], name="up",
                              kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                              output_padding=list(out_pad), group=group)]
    return make_model(nodes, [vi("x", [1, 3, *hw])], [vi("y", None)], inits)


def _feeds(hw, seed):
    return {"x": np.random.default_rng(seed).normal(size=(1, 3, *hw)).astype(np.float32)}


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_rewrite_computes_the_conv_transpose(case):
    hw = CASES[case][4]
    model = _model(*CASES[case])
    g, shuffles = expand_conv_transposes(optimize(import_onnx(model)))
    assert "ConvTranspose" not in [n.op for n in g.nodes] and len(shuffles) == 1
    feeds = _feeds(hw, 1)
    want = onnxruntime_run(model, feeds)["y"]
    got = run_graph(g, feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [0, 6])
def test_overlapping_upsamplers_run_on_the_accelerator_bit_exact(case):
    from celosia.runtime.accel import AccelModel, compare_outputs

    hw = CASES[case][4]
    model = _model(*CASES[case], cin=48, cout=48) if case == 6 else \
        _model(*CASES[case], cin=16, cout=16)
    q = quantize_model(model, [_feeds(hw, s) for s in range(2, 6)])
    up = next(n for n in q.nodes if n.name == "up")
    assert up.op == "QConv"
    assert all(q.types[n.outputs[0]].dtype == "int8" for n in q.nodes
               if n.op in ("Reshape", "Transpose", "Slice"))
    feeds = _feeds(hw, 100)
    built = AccelModel.build(q)
    assert built.placements["up"].target == "accel"
    want = built.cpu_build().run(feeds)
    ref = onnxruntime_run(model, feeds)["y"].ravel().astype(np.float64)
    got = want["y"].ravel().astype(np.float64)
    assert got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref)) > 0.999
    for target in ("fsim", "cycle"):
        same, detail = compare_outputs(built.run(feeds, target=target), want, exact=True)
        assert same, f"{target}: {detail['summary']}"
