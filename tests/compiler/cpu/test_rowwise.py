"""The row-wise kernels of compiler/cpu/rowwise.py (LayerNormalization, Softmax) against the
numpy reference (graph/ops_nn.py, graph/ops.py) on seeded random inputs of odd sizes, alone
and through the CPU build of ONNX models."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.cpu.kernels import compile_spec
from celosia.compiler.cpu.rowwise import compile_rowwise
from celosia.compiler.graph.ops import softmax
from celosia.compiler.graph.ops_nn import layer_norm
from celosia.errors import CompilerError
from celosia.runtime.cpu import CpuModel

# rows x cols: one element, one row, fewer columns than a vector, a vector and a tail,
# ViT's and BERT's rows, a hidden size that is no multiple of the vector width.
SIZES = [(1, 1), (1, 7), (7, 5), (3, 33), (197, 197), (128, 768), (5, 770)]


def _data(rows, cols, seed):
    rng = np.random.default_rng(seed)
    # An offset and a spread that are not 0 and 1: the mean and variance matter.
    return (rng.normal(size=(rows, cols)) * 3 + 2).astype(np.float32)


def _ulps(got, want):
    """The largest difference in float32 ulp of the output's scale."""
    return float(np.abs(got - want).max() / np.spacing(np.float32(np.abs(want).max())))


@pytest.mark.parametrize("rows,cols", SIZES)
def test_softmax_kernel_matches_numpy(rows, cols):
    x = _data(rows, cols, rows * 1000 + cols) * 4
    y = np.empty_like(x)
    compile_spec({"op": "softmax", "rows": rows, "cols": cols})(x, y)
    want = softmax({"axis": 1}, x)
    assert _ulps(y, want) <= 8
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("rows,cols", SIZES)
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_kernel_matches_numpy(rows, cols, bias):
    rng = np.random.default_rng(cols)
    x = _data(rows, cols, rows + cols)
    scale = rng.normal(size=cols).astype(np.float32)
    b = rng.normal(size=cols).astype(np.float32)
    y = np.empty_like(x)
    compile_spec({"op": "layernorm", "rows": rows, "cols": cols, "epsilon": 1e-5,
                  "bias": bias})(x, scale, *([b] if bias else []), y)
    want = layer_norm({"axis": 1, "stash_type": np.dtype(np.float32), "epsilon": 1e-5},
                      x, scale, b if bias else None)[0]
    assert _ulps(y, want) <= 64  # a 770-term float32 mean in another order


@pytest.mark.parametrize("outer,cols,inner", [(1, 256, 64), (3, 9, 37), (2, 5, 6),
                                               (2, 1, 40), (1, 300, 17)])
def test_strided_softmax_kernel_matches_numpy(outer, cols, inner):
    """The strided form (Softmax over the middle axis of [A, C, B]): whole vectors of
    positions, the last B % W one at a time, and both in one parallel loop."""
    x = (np.random.default_rng(outer * cols * inner).normal(size=(outer, cols, inner))
         * 4).astype(np.float32)
    y = np.empty_like(x)
    compile_spec({"op": "softmax", "rows": outer, "cols": cols, "inner": inner})(x, y)
    want = softmax({"axis": 1}, x)
    assert _ulps(y, want) <= 8
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("outer,cols,inner", [(5, 37, 1), (64, 1000, 1), (3, 9, 37),
                                               (1, 21, 40)])
def test_logsoftmax_kernel_matches_numpy(outer, cols, inner):
    """LogSoftmax (rows and the strided form): (x - max) - log(sum(exp(x - max)))."""
    x = (np.random.default_rng(cols + inner).normal(size=(outer, cols, inner))
         * 6).astype(np.float32)
    spec = {"op": "logsoftmax", "rows": outer, "cols": cols}
    if inner > 1:
        spec["inner"] = inner
    y = np.empty_like(x)
    compile_spec(spec)(x if inner > 1 else x.reshape(outer, cols),
                       y if inner > 1 else y.reshape(outer, cols))
    want = softmax({"axis": 1}, x, log=True)
    assert np.abs(y - want).max() <= 8 * np.spacing(np.float32(np.abs(want).max()))
    np.testing.assert_allclose(np.exp(y.astype(np.float64)).sum(axis=1), 1.0, rtol=1e-5)


def test_strided_softmax_special_values_as_numpy():
    """The strided form on the special rows below, as columns: 16 + 4 positions."""
    rows = np.array([[0.0, -np.inf, 1.0, 2.0] * 5,
                     [-np.inf] * 20,
                     [1.0, np.nan] + [0.0] * 18,
                     [80.0, -80.0] * 10], np.float32)
    x = np.ascontiguousarray(np.tile(rows, (5, 1))[:20].T)[None]  # [1, 20 classes, 20]
    y = np.empty_like(x)
    compile_spec({"op": "softmax", "rows": 1, "cols": 20, "inner": 20})(x, y)
    with np.errstate(invalid="ignore"):
        want = softmax({"axis": 1}, x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(y[ok], want[ok], rtol=1e-6, atol=1e-7)


def test_softmax_special_values_as_numpy():
    """-inf (a masked score) gives 0, a row of -inf and a NaN give NaN rows, as numpy."""
    x = np.array([[0.0, -np.inf, 1.0, 2.0] * 5,
                  [-np.inf] * 20,
                  [1.0, np.nan] + [0.0] * 18,
                  [80.0, -80.0] * 10], np.float32)
    y = np.empty_like(x)
    compile_spec({"op": "softmax", "rows": 4, "cols": 20})(x, y)
    with np.errstate(invalid="ignore"):
        want = softmax({"axis": 1}, x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(y[ok], want[ok], rtol=1e-6, atol=1e-7)


def test_rowwise_spec_errors_name_the_field():
    with pytest.raises(CompilerError, match="'cols' must be a positive integer"):
        compile_rowwise({"op": "softmax", "rows": 2, "cols": 0})
    with pytest.raises(CompilerError, match="no row-wise kernel"):
        compile_rowwise({"op": "cumsum", "rows": 2, "cols": 2})


def _build(nodes, inputs, inits, feeds, opset=17):
    m = make_model(nodes, inputs, [vi("y", None)], inits, opset=opset)
    built = CpuModel.build(m, {k: v.shape for k, v in feeds.items()})
    return built, built.run(feeds)["y"]


@pytest.mark.parametrize("shape,axis,with_bias,scale_shape", [
    ((2, 7, 33), -1, True, (33,)),           # batch > 1, sequence 7, odd hidden
    ((1, 1, 16), -1, False, (16,)),          # sequence 1, no bias
    ((2, 197, 24), 2, True, (24,)),          # ViT's sequence
    ((3, 4, 5, 6), 2, True, (5, 6)),         # normalized over two trailing axes
    ((3, 4, 5, 6), 1, False, (6,)),          # over three, a scale broadcast over them
])
def test_layernorm_node_is_a_kernel(shape, axis, with_bias, scale_shape):
    rng = np.random.default_rng(len(shape) * 10 + axis)
    x = (rng.normal(size=shape) * 2 + 1).astype(np.float32)
    scale = rng.normal(size=scale_shape).astype(np.float32)
    bias = rng.normal(size=scale_shape).astype(np.float32)
    inits = [numpy_helper.from_array(scale, "scale")]
    ins = ["x", "scale"]
    if with_bias:
        inits.append(numpy_helper.from_array(bias, "bias"))
        ins.append("bias")
    node = helper.make_node("LayerNormalization", ins, ["y"], axis=axis, epsilon=1e-6)
    built, got = _build([node], [vi("x", list(shape))], inits, {"x": x})
    assert [s["kind"] for s in built.program.steps if s["op"] == "LayerNormalization"][0] \
        == "kernel"
    a = axis % len(shape)
    want = layer_norm({"axis": a, "stash_type": np.dtype(np.float32), "epsilon": 1e-6}, x,
                      np.broadcast_to(scale, shape[a:]),
                      np.broadcast_to(bias, shape[a:]) if with_bias else None)[0]
    assert got.shape == want.shape
    assert _ulps(got, want) <= 64


def test_layernorm_with_runtime_scale_and_mean_output():
    """A run-time scale of the normalized shape is read in place; asking for the Mean
    output leaves the node to numpy (both correct)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 10)).astype(np.float32)
    s = rng.normal(size=(10,)).astype(np.float32)
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"])
    built, got = _build([node], [vi("x", [2, 3, 10]), vi("s", [10])], [], {"x": x, "s": s})
    assert any(st["kind"] == "kernel" and st["op"] == "LayerNormalization"
               for st in built.program.steps)
    want = layer_norm({"axis": 2, "stash_type": np.dtype(np.float32), "epsilon": 1e-5},
                      x, s)[0]
    assert _ulps(got, want) <= 16
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"])
    m = make_model([node], [vi("x", [2, 3, 10]), vi("s", [10])], [vi("y", None),
                                                                  vi("mean", None)])
    built = CpuModel.build(m, {"x": x.shape, "s": s.shape})
    assert [st["kind"] for st in built.program.steps if st["op"] == "LayerNormalization"] \
        == ["numpy"]
    np.testing.assert_allclose(built.run({"x": x, "s": s})["y"], want, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("shape,axis,kernel", [
    ((2, 3, 7, 7), -1, True),       # attention's scores, batch > 1, odd sequence
    ((1, 1, 1, 1), -1, True),       # one element
    ((12, 197), 1, True),
    # not the last axis: the kernel's strided form
    ((2, 5, 6), 1, True),
    ((3, 9, 37), 1, True),          # vector groups and single positions
    ((1, 21, 30, 40), 1, True),     # a segmentation model's class scores
    ((3, 4, 17), 0, True),
    ((2, 7, 9, 1), 2, True),        # only size-1 axes after it: the last axis in effect
])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_node(shape, axis, kernel, op):
    x = (np.random.default_rng(sum(shape)).normal(size=shape) * 5).astype(np.float32)
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    built, got = _build([node], [vi("x", list(shape))], [], {"x": x})
    kinds = [s["kind"] for s in built.program.steps
             if s["op"] == op and s["kind"] != "view"]
    assert kinds == (["kernel"] if kernel else ["numpy"])
    want = softmax({"axis": axis % len(shape)}, x, log=op == "LogSoftmax")
    assert _ulps(got, want) <= 8
