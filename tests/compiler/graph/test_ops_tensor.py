"""Gathers, scatters, Trilu, NonZero, DepthToSpace, SpaceToDepth, OneHot
(compiler/graph/ops_tensor.py) and batched MatMul: each against onnxruntime over its
attributes, opset versions and dtypes, through import + reference executor and the
compiled CpuModel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_nodes import check_node


def _normal(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _ints(*shape, lo, hi, seed=0, dtype=np.int64):
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(dtype)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_elements(axis, opset, index_dtype):
    data = _normal(4, 5, 6)
    shape = [3, 4, 5]  # smaller than the data on every axis
    shape[axis] = 7  # repeated picks along the axis
    n = data.shape[axis]
    idx = _ints(*shape, lo=-n, hi=n, seed=1, dtype=index_dtype)  # negative: from the end
    check_node("GatherElements", ["data", "idx"], {"data": data}, consts={"idx": idx},
               attrs={"axis": axis}, opset=opset)


def test_gather_elements_runtime_indices():
    data, idx = _normal(3, 4), _ints(3, 4, lo=0, hi=3, seed=2)
    check_node("GatherElements", ["data", "idx"], {"data": data, "idx": idx}, opset=13)


@pytest.mark.parametrize("reduction, opset", [("none", 11), ("none", 13), ("add", 16),
                                              ("mul", 16), ("max", 18), ("min", 18)])
@pytest.mark.parametrize("axis", [0, 2, -2])
def test_scatter_elements(reduction, opset, axis):
    data = _normal(4, 5, 6)
    shape = [3, 4, 5]
    n = data.shape[axis]
    updates = _normal(*shape, seed=1)
    # Distinct positions per line without a reduction (a repeated one has no single
    # answer); repeats with one.
    rng = np.random.default_rng(2)
    if reduction == "none":
        idx = np.moveaxis(np.argsort(rng.random(np.moveaxis(np.empty(shape), axis, -1).shape[:-1]
                                                + (n,)), axis=-1)[..., :shape[axis]], -1, axis)
    else:
        idx = rng.integers(-n, n, shape)
    attrs = {"axis": axis, **({"reduction": reduction} if reduction != "none" else {})}
    check_node("ScatterElements", ["data", "idx", "updates"], {"data": data, "updates": updates},
               consts={"idx": idx.astype(np.int64)}, attrs=attrs, opset=opset,
               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("data_shape, idx_shape, batch_dims", [
    ((4, 5), (3, 2), 0), ((4, 5, 6), (2, 3, 1), 0), ((4, 5, 6), (2, 2), 0),
    ((2, 5, 6), (2, 3, 1), 1), ((2, 3, 5, 6), (2, 3, 4, 2), 2), ((2, 5, 6), (2, 2), 1)])
@pytest.mark.parametrize("opset", [12, 13])
def test_gather_nd(data_shape, idx_shape, batch_dims, opset):
    data = _normal(*data_shape)
    k = idx_shape[-1]
    dims = np.array(data_shape[batch_dims:batch_dims + k])
    idx = np.floor(np.random.default_rng(3).random(idx_shape) * 2 * dims - dims).astype(np.int64)
    check_node("GatherND", ["data", "idx"], {"data": data}, consts={"idx": idx},
               attrs={"batch_dims": batch_dims}, opset=opset)


def test_gather_nd_opset_11():
    data, idx = _ints(3, 4, lo=-9, hi=9, seed=4, dtype=np.int32), np.array([[2, 1], [0, 3]])
    check_node("GatherND", ["data", "idx"], {"data": data}, consts={"idx": idx}, opset=11)


@pytest.mark.parametrize("reduction, opset", [("none", 11), ("none", 13), ("add", 16),
                                              ("mul", 16), ("max", 18), ("min", 18)])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_scatter_nd(reduction, opset, k):
    data = _normal(4, 5, 6)
    rng = np.random.default_rng(5)
    if reduction == "none":  # distinct positions (repeats have no single answer)
        flat = rng.permutation(int(np.prod(data.shape[:k])))[:3]
        idx = np.stack(np.unravel_index(flat, data.shape[:k]), axis=-1)
    else:  # repeated positions: the reduction combines them
        idx = rng.integers(0, 2, (6, k)) - np.array(data.shape[:k]) * rng.integers(0, 2, (6, k))
    updates = _normal(*idx.shape[:-1], *data.shape[k:], seed=6)
    attrs = {"reduction": reduction} if reduction != "none" else {}
    check_node("ScatterND", ["data", "idx", "updates"], {"data": data, "updates": updates},
               consts={"idx": idx.astype(np.int64)}, attrs=attrs, opset=opset, rtol=1e-5)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -2, 0, 1, 7])
@pytest.mark.parametrize("shape", [(5, 5), (3, 4, 6), (2, 6, 3)])
def test_trilu(upper, k, shape):
    x = _ints(*shape, lo=-9, hi=9, seed=7, dtype=np.int64)
    consts = {} if k is None else {"k": np.array(k, np.int64)}
    check_node("Trilu", ["x", *consts], {"x": x}, consts=consts, attrs={"upper": upper},
               opset=14)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
@pytest.mark.parametrize("opset", [11, 13])
def test_non_zero_of_a_constant(dtype, opset):
    """The output size is the number of nonzero values: known when the input is, which a
    static graph needs. The positions select values of a run-time input (a mask applied
    with GatherND, NonZero's common use), so the CPU build has a node to run."""
    from onnx import helper, numpy_helper
    from onnx_nodes import oracle

    from celosia.runtime.cpu import CpuModel
    from celosia.runtime.reference import ReferenceModel

    mask = _ints(3, 4, 5, lo=-1, hi=2, seed=8)
    mask = (mask != 0) if dtype == np.bool_ else mask.astype(dtype)
    x = _normal(3, 4, 5, 2)
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["mask"], ["nz"]),
         helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
         helper.make_node("GatherND", ["x", "idx"], ["y"])], "masked",
        [helper.make_tensor_value_info("x", 1, x.shape)],
        [helper.make_tensor_value_info("y", 1, None)],
        [numpy_helper.from_array(mask, "mask")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    want = oracle(model, {"x": x})[0]
    assert want.shape == (np.count_nonzero(mask), 2)
    np.testing.assert_array_equal(ReferenceModel.load(model).run({"x": x})["y"], want)
    np.testing.assert_array_equal(CpuModel.build(model).run({"x": x})["y"], want)


def test_non_zero_of_an_input_runs_or_is_bound():
    """Of a run-time input, NonZero runs in ONNX's form (its count known when it runs);
    bound, it is a constant of static shape."""
    from celosia.compiler.frontend.onnx import import_onnx
    from onnx_nodes import node_model

    x = np.array([[1, 0], [0, 3]], np.float32)
    check_node("NonZero", ["x"], {"x": x}, opset=13)
    model = node_model("NonZero", ["x"], {"x": x}, opset=13)
    assert import_onnx(model).types["y0"].shape == (2, None)
    graph = import_onnx(model, bind_inputs={"x": x})
    assert graph.types["y0"].shape == (2, 2)


@pytest.mark.parametrize("mode", [None, "DCR", "CRD"])
@pytest.mark.parametrize("blocksize, shape", [(2, (1, 8, 3, 4)), (3, (2, 9, 2, 2)),
                                              (1, (1, 3, 2, 2))])
@pytest.mark.parametrize("opset", [11, 13])
def test_depth_to_space(mode, blocksize, shape, opset):
    attrs = {"blocksize": blocksize, **({"mode": mode} if mode else {})}
    check_node("DepthToSpace", ["x"], {"x": _normal(*shape)}, attrs=attrs, opset=opset)


@pytest.mark.parametrize("blocksize, shape", [(2, (1, 3, 4, 6)), (3, (2, 2, 6, 3))])
@pytest.mark.parametrize("opset", [11, 13])
def test_space_to_depth(blocksize, shape, opset):
    check_node("SpaceToDepth", ["x"], {"x": _normal(*shape)}, attrs={"blocksize": blocksize},
               opset=opset)


@pytest.mark.parametrize("axis", [None, 0, 1, -1, -3])
@pytest.mark.parametrize("types, which", [
    # (indices, values, depth): the combinations onnxruntime implements, and one it lacks
    ((np.int64, np.float32, np.int64), "onnxruntime"),
    ((np.int32, np.float32, np.int32), "onnxruntime"),
    ((np.float32, np.int64, np.int64), "onnxruntime"),
    ((np.int64, np.int32, np.float32), "onnxruntime"),
    ((np.int32, np.int64, np.int64), "onnx")])
def test_one_hot(axis, types, which):
    depth = 6
    idx = _ints(3, 4, lo=-depth - 2, hi=depth + 2, seed=9).astype(types[0])  # some outside
    consts = {"depth": np.array(depth, types[2]), "values": np.array([-2, 5], types[1])}
    attrs = {} if axis is None else {"axis": axis}
    check_node("OneHot", ["idx", "depth", "values"], {"idx": idx}, consts=consts, attrs=attrs,
               opset=11, which=which)


@pytest.mark.parametrize("a_shape, b_shape, b_const", [
    ((2, 3, 4, 5), (2, 3, 5, 6), False), ((2, 1, 4, 5), (3, 5, 6), False),
    ((4,), (2, 4, 3), False), ((2, 3, 4), (4,), False), ((5, 2, 3, 4), (4, 6), True),
    ((2, 3, 4), (2, 4, 5), True), ((4,), (4,), False)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_batched_matmul(a_shape, b_shape, b_const, dtype):
    """N-d MatMul with broadcast batches and 1-d operands; a constant 2-d B takes the
    compiled dense kernel in the CPU build (float32), the others a numpy step."""
    def make(shape, seed):
        return _normal(*shape, seed=seed, dtype=dtype) if dtype in (np.float32, np.float64) \
            else _ints(*shape, lo=-9, hi=9, seed=seed, dtype=dtype)
    a, b = make(a_shape, 10), make(b_shape, 11)
    feeds, consts = ({"a": a}, {"b": b}) if b_const else ({"a": a, "b": b}, {})
    check_node("MatMul", ["a", "b"], feeds, consts=consts, opset=13, rtol=1e-5, atol=1e-5)


def test_range_takes_one_element_tensors():
    """onnxruntime takes a 1-element tensor where Range wants a scalar (AffineGrid's
    function body computes a 1-D limit; onnx's checker rejects constant ones)."""
    values = {"start": np.array(1, np.int64), "limit": np.array([10], np.int64),
              "delta": np.array([3], np.int64)}
    check_node("Range", list(values), values, opset=17)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_by_slices_is_numpys_pad(mode):
    """ops.pad fills bands by slice copies (np.pad's fixed cost is most of a small pad);
    bit for bit np.pad's result over ranks, odd sizes, sizes of 1, negative pads (crops)
    and bands wider than the input (np.pad itself then)."""
    from celosia.compiler.graph.ops import pad

    rng = np.random.default_rng(11)
    checked = 0
    for shape in [(5,), (1, 7), (3, 4, 5), (2, 1, 3, 6), (4, 1), (1,)]:
        for _ in range(25):
            x = rng.normal(size=shape).astype(np.float32)
            nd = len(shape)
            pads = [int(v) for v in rng.integers(-2, 7, 2 * nd)]
            widths = [(max(pads[i], 0), max(pads[i + nd], 0)) for i in range(nd)]
            try:
                want = np.pad(x, widths, mode=mode, **(
                    {"constant_values": 1.5} if mode == "constant" else {}))
            except ValueError:  # (np.pad: reflect or wrap of an empty axis)
                continue
            want = want[tuple(slice(-min(pads[i], 0), want.shape[i] + min(pads[i + nd], 0))
                              for i in range(nd))]
            got = pad({"pads": pads, "mode": mode, "value": 1.5}, x)
            assert got.shape == want.shape, (shape, pads)
            np.testing.assert_array_equal(got, want, err_msg=f"{shape} {pads}")
            checked += 1
    assert checked > 100
