"""Compress, Unique, Scatter, TensorScatter, Det and BitCast (compiler/graph/ops_data.py,
Scatter rewritten to ScatterElements at import): each against onnxruntime (onnx's
reference evaluator for BitCast's opset 26) on seeded random inputs over its attributes,
through import + reference executor and the compiled CpuModel; run-time output sizes;
bad inputs named by node; a torch-exported model with unique and scatter_."""

from __future__ import annotations

import io

import numpy as np
import pytest
from onnx_nodes import check_node, node_model

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.ir import GraphError, NodeError
from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel


def _normal(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _small_ints(*shape, seed=0, hi=4, dtype=np.int64):
    """Values with many repeats (Unique's work)."""
    return np.random.default_rng(seed).integers(0, hi, shape).astype(dtype)


# ---- Compress --------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [None, 0, 1, -1, -3])
@pytest.mark.parametrize("length", ["full", "short", "long"])
@pytest.mark.parametrize("when", ["import", "run"])
def test_compress(axis, length, when):
    x = _normal(3, 4, 5, seed=1)
    size = x.size if axis is None else x.shape[axis]
    # a shorter condition selects among the first slices; a longer one's values past the
    # axis are dropped (true ones too: onnxruntime's reading)
    n = {"full": size, "short": size - 2, "long": size + 3}[length]
    cond = np.random.default_rng(2).random(n) > 0.4
    feeds, consts = {"x": x}, {}
    (feeds if when == "run" else consts)["c"] = cond
    attrs = {} if axis is None else {"axis": axis}
    check_node("Compress", ["x", "c"], feeds, consts=consts, attrs=attrs, opset=11)


@pytest.mark.parametrize("dtype", [np.int64, np.int8, np.float64, np.bool_])
def test_compress_dtypes(dtype):
    x = np.random.default_rng(3).integers(-3, 3, (4, 6)).astype(dtype)
    cond = np.array([True, False, False, True, True, False])
    check_node("Compress", ["x", "c"], {"x": x, "c": cond}, attrs={"axis": 1}, opset=11)


def test_compress_size_is_known_at_run_time():
    """A condition only known at run time: the selected axis is unknown in the graph, and
    each run gives its own size."""
    x = _normal(4, 3, seed=4)
    model = node_model("Compress", ["x", "c"], {"x": x, "c": np.ones(4, bool)},
                       attrs={"axis": 0})
    g = import_onnx(model)
    assert g.types[g.outputs[0]].shape == (None, 3)
    ref, cpu = ReferenceModel.load(model), CpuModel.build(model)
    for k in range(5):
        cond = np.arange(4) < k
        for m in (ref, cpu):
            np.testing.assert_array_equal(m.run({"x": x, "c": cond})["y0"], x[:k])


def test_compress_opset_9_is_upgraded():
    x, cond = _normal(3, 4, seed=5), np.array([False, True, True])
    check_node("Compress", ["x", "c"], {"x": x, "c": cond}, attrs={"axis": 0}, opset=9)


def test_compress_bad_axis():
    model = node_model("Compress", ["x", "c"], {"x": _normal(3, 4), "c": np.ones(3, bool)},
                       attrs={"axis": 2}, infer=False)
    with pytest.raises(GraphError, match=r"node 'Compress_0' \(Compress\): 'axis' must be in "
                                         r"\[-rank\(indices\), rank\(indices\)-1\]"):
        import_onnx(model)


# ---- Unique ----------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("outputs", [1, 4])
def test_unique(axis, sorted_, outputs):
    # Rows and columns that repeat whole (along an axis) and values that repeat.
    x = _small_ints(4, 6, seed=7, hi=3).astype(np.float32)
    x[2] = x[0]
    x[:, 4] = x[:, 1]
    attrs = {"sorted": sorted_, **({} if axis is None else {"axis": axis})}
    check_node("Unique", ["x"], {"x": x}, attrs=attrs, opset=11, outputs=outputs)


@pytest.mark.parametrize("dtype", [np.int64, np.int8, np.float64])
@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_dtypes_and_a_3d_axis(dtype, sorted_):
    x = _small_ints(3, 4, 2, seed=8, hi=2, dtype=dtype)
    check_node("Unique", ["x"], {"x": x}, attrs={"sorted": sorted_}, opset=11, outputs=4)
    check_node("Unique", ["x"], {"x": x}, attrs={"sorted": sorted_, "axis": 1}, opset=11,
               outputs=4)


def test_unique_sizes_are_known_at_run_time():
    model = node_model("Unique", ["x"], {"x": np.zeros(6, np.int64)}, outputs=4)
    g = import_onnx(model)
    assert [g.types[o].shape for o in g.outputs] == [(None,), (None,), (6,), (None,)]
    cpu = CpuModel.build(model)
    for k in range(1, 6):
        x = np.arange(6, dtype=np.int64) % k
        y, first, inverse, counts = cpu.run({"x": x}).values()
        np.testing.assert_array_equal(y, np.arange(k))
        np.testing.assert_array_equal(y[inverse], x)
        assert counts.sum() == 6 and np.all(x[first] == y)


def test_unique_of_a_constant_is_folded():
    """Values known at import: the outputs are constants of their sizes."""
    model = node_model("Unique", ["x"], {}, consts={"x": np.array([3, 1, 3, 2], np.int64)},
                       attrs={"sorted": 0}, outputs=2)
    ref = ReferenceModel.load(model)
    np.testing.assert_array_equal(ref.run({})["y0"], [3, 1, 2])
    np.testing.assert_array_equal(ref.run({})["y1"], [0, 1, 3])


# ---- Scatter (opsets 9-10; deprecated at 11) --------------------------------------------------


@pytest.mark.parametrize("opset", [9, 10, 11])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter(opset, axis):
    data = _normal(4, 5, seed=9)
    n = data.shape[axis]
    shape = [3, 3]
    rng = np.random.default_rng(10)
    # distinct positions along the axis in each line (a repeat has no single answer)
    idx = np.moveaxis(np.argsort(rng.random((3, n)), axis=-1)[:, :3], -1, axis)
    if opset >= 11:
        idx = np.where(rng.random(idx.shape) < 0.5, idx - n, idx)  # negative: from the end
    feeds, consts = {"d": data, "u": _normal(*shape, seed=11)}, {"i": idx.astype(np.int64)}
    if opset < 11:
        check_node("Scatter", ["d", "i", "u"], feeds, consts=consts, attrs={"axis": axis},
                   opset=opset)
        return
    # Deprecated at 11: onnx's checker and onnxruntime refuse it there, and so does celosia.
    model = node_model("Scatter", ["d", "i", "u"], feeds, consts=consts, attrs={"axis": axis},
                       opset=11)
    with pytest.raises(GraphError, match=r"node 'Scatter_0' \(Scatter\): Op registered for "
                                         r"Scatter is deprecated in domain_version of 11"):
        import_onnx(model)


def test_scatter_is_imported_as_scatter_elements():
    model = node_model("Scatter", ["d", "i", "u"], {"d": _normal(2, 3), "u": _normal(2, 1)},
                       consts={"i": np.array([[2], [0]], np.int64)}, attrs={"axis": -1},
                       opset=10)
    (node,) = import_onnx(model).nodes
    assert node.op == "ScatterElements" and node.attrs == {"axis": 1, "reduction": "none"}


# ---- TensorScatter (opset 24) -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("shape, axis, steps", [
    ((2, 3, 8, 4), None, 3),     # [batch, heads, sequence, head size], axis -2
    ((2, 8, 6), 1, 2),           # [batch, sequence, hidden]
    ((3, 2, 5, 4), 2, 5),        # the whole sequence rewritten
    ((2, 6, 2, 3), -3, 1),       # decode: one step
])
@pytest.mark.parametrize("indices", ["given", "absent"])
def test_tensor_scatter(mode, shape, axis, steps, indices):
    past = _normal(*shape, seed=12)
    ax = -2 if axis is None else axis
    update_shape = list(shape)
    update_shape[ax] = steps
    update = _normal(*update_shape, seed=13)
    length = shape[ax]
    rng = np.random.default_rng(14)
    hi = length if mode == "circular" else length - steps + 1
    feeds = {"p": past, "u": update}
    inputs = ["p", "u"]
    if indices == "given":
        feeds["w"] = rng.integers(0, hi, shape[0]).astype(np.int64)
        inputs.append("w")
    attrs = {"mode": mode, **({} if axis is None else {"axis": axis})}
    check_node("TensorScatter", inputs, feeds, attrs=attrs, opset=24)


def test_tensor_scatter_write_out_of_range():
    past, update = _normal(2, 3, 6, 4), _normal(2, 3, 2, 4, seed=1)
    w = np.array([1, 5], np.int64)  # 5 + 2 steps > 6 slots: linear mode cannot
    model = node_model("TensorScatter", ["p", "u", "w"], {"p": past, "u": update, "w": w},
                       opset=24)
    for build in (ReferenceModel.load, CpuModel.build):
        with pytest.raises(NodeError, match=r"TensorScatter_0.*failed at run time: .*write "
                                            r"index 5 of batch entry 1 puts the 2 updates "
                                            r"outside the sequence axis of size 6"):
            build(model).run({"p": past, "u": update, "w": w})
    circular = node_model("TensorScatter", ["p", "u", "w"], {"p": past, "u": update, "w": w},
                          attrs={"mode": "circular"}, opset=24)
    got = ReferenceModel.load(circular).run({"p": past, "u": update, "w": w})["y0"]
    np.testing.assert_array_equal(got[1, :, [5, 0]], update[1, :, [0, 1]])
    # Circular starts near 2^63 (a sum would wrap) and negative ones, as onnxruntime.
    huge = np.array([2**63 - 1, 2**63 - 6], np.int64)
    check_node("TensorScatter", ["p", "u", "w"], {"p": past, "u": update, "w": huge},
               attrs={"mode": "circular"}, opset=24)
    linear = node_model("TensorScatter", ["p", "u", "w"], {"p": past, "u": update, "w": huge},
                        opset=24)
    with pytest.raises(NodeError, match=r"write index 9223372036854775807 of batch entry 0"):
        ReferenceModel.load(linear).run({"p": past, "u": update, "w": huge})
    with pytest.raises(NodeError, match=r"write_indices \[-1, 2\] must not be negative"):
        ReferenceModel.load(circular).run({"p": past, "u": update, "w": np.array([-1, 2])})


@pytest.mark.parametrize("update, message", [
    ((2, 2, 2, 4), "Dimension mismatch in unification between 2 and 3"),  # onnx's inference
    ((2, 3, 7, 4), r"update float32\[2,3,7,4\] must have the shape of the cache "
                   r"float32\[2,3,6,4\] but along axis 2, at most as long there")])
def test_tensor_scatter_bad_update_shape(update, message):
    model = node_model("TensorScatter", ["p", "u"], {"p": _normal(2, 3, 6, 4),
                                                     "u": _normal(*update)},
                       opset=24, infer=False)
    with pytest.raises(GraphError, match=rf"node 'TensorScatter_0' \(TensorScatter\): "
                                         rf"{message}"):
        import_onnx(model)


# ---- Det, BitCast -----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 3), (4, 2, 2), (2, 3, 5, 5), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_det(shape, dtype):
    # onnxruntime's Det is float32 only: onnx's reference decides float64
    check_node("Det", ["x"], {"x": _normal(*shape, seed=15, dtype=dtype)}, opset=11,
               rtol=1e-4, atol=1e-5, which="onnxruntime" if dtype == np.float32 else "onnx")


@pytest.mark.parametrize("source, to", [
    (np.float32, 6), (np.int32, 1), (np.float64, 7), (np.int64, 11), (np.uint32, 6),
    (np.int8, 2), (np.uint16, 10), (np.float16, 5), (np.bool_, 2), (np.uint64, 7)])
def test_bit_cast(source, to):
    x = np.random.default_rng(16).integers(0, 255, (3, 4)).astype(np.uint8)
    x = np.frombuffer(np.random.default_rng(17).bytes(12 * np.dtype(source).itemsize),
                      np.uint8).view(source).reshape(3, 4).copy() if source != np.bool_ \
        else x > 100
    if np.dtype(source).kind == "f":  # NaN payloads compare unequal: finite patterns only
        x = np.where(np.isfinite(x), x, 0).astype(source)
    check_node("BitCast", ["x"], {"x": x}, attrs={"to": to}, opset=26, which="onnx")


def test_bit_cast_of_another_size_is_refused():
    model = node_model("BitCast", ["x"], {"x": _normal(2, 2)}, attrs={"to": 7}, opset=26,
                       infer=False)
    with pytest.raises(GraphError, match=r"node 'BitCast_0' \(BitCast\): BitCast requires "
                                         r"input and output types to have the same bit-width"):
        import_onnx(model)


# ---- an exported model ------------------------------------------------------------------------


def test_torch_export_with_unique_masking_and_scatter():
    """torch.unique (Unique), a boolean mask (NonZero + GatherND) and scatter_
    (ScatterElements), as torch's exporter writes them, against onnxruntime."""
    torch = pytest.importorskip("torch")
    import onnx
    import onnxruntime

    class Net(torch.nn.Module):
        def forward(self, x, idx):
            u, inverse, counts = torch.unique(x, sorted=True, return_inverse=True,
                                              return_counts=True)
            picked = x[x > 0.5]
            y = torch.zeros(3, 5).scatter_(1, idx, torch.ones(3, 2) * x[:, :2].sum())
            return u, inverse, counts, picked, y

    x = np.round(np.random.default_rng(18).random((3, 4)), 1).astype(np.float32)
    idx = np.array([[0, 2], [1, 4], [3, 0]], np.int64)
    f = io.BytesIO()
    with pytest.warns(UserWarning):  # the exporter's note on removing scatter_'s mutation
        torch.onnx.export(Net(), (torch.from_numpy(x), torch.from_numpy(idx)), f,
                          dynamo=False, opset_version=17, input_names=["x", "idx"])
    model = onnx.load_from_string(f.getvalue())
    assert {"Unique", "ScatterElements"} <= {n.op_type for n in model.graph.node}
    feeds = {"x": x, "idx": idx}
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    for m in (ReferenceModel.load(model), CpuModel.build(model)):
        for got, w in zip(m.run(feeds).values(), want):
            assert got.dtype == w.dtype
            np.testing.assert_array_equal(got, w)
        x2 = np.round(np.random.default_rng(19).random((3, 4)), 1).astype(np.float32)
        for got, w in zip(m.run({"x": x2, "idx": idx}).values(),
                          session.run(None, {"x": x2, "idx": idx})):
            np.testing.assert_array_equal(got, w)
