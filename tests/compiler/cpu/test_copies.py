"""Strided copies (compiler/cpu/copies.py): Transpose and Slice nodes as compiled kernels,
bit-exact with numpy on seeded random inputs; the clamped padding the dense and batched
products use."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.cpu.copies import copy_spec
from celosia.compiler.cpu.kernels import compile_spec
from celosia.errors import CompilerError
from celosia.runtime.cpu import CpuModel

_ELEM = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64,
         np.int32: TensorProto.INT32}


def _random(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == np.float32:
        return rng.normal(size=shape).astype(np.float32)
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def _kinds(built, op):
    return [s["kind"] for s in built.program.steps if s["op"] == op]


@pytest.mark.parametrize("shape,perm,dtype", [
    ((2, 197, 12, 16), (0, 2, 1, 3), np.float32),   # heads split, batch 2, odd sequence
    ((1, 7, 3, 5), (0, 2, 3, 1), np.float32),       # K^T
    ((3, 5, 7), None, np.int64),                    # reversed axes (no perm), int64
    ((4, 1, 6), (1, 0, 2), np.int32),               # only a size-1 axis moves: a view
    ((2, 16, 3, 24), (0, 2, 3, 1), np.float32),     # the last axis moves: 8x8 tiles
    ((16, 40), (1, 0), np.float32),                 # a matrix: tiles, no outer axes
    ((1, 14, 14, 40), (0, 3, 1, 2), np.float32),    # NHWC -> NCHW (ConvNeXt's permute)
])
def test_transpose_node_is_a_compiled_copy(shape, perm, dtype):
    x = _random(shape, dtype, sum(shape))
    attrs = {} if perm is None else {"perm": list(perm)}
    m = make_model([helper.make_node("Transpose", ["x"], ["y"], **attrs)],
                   [vi("x", list(shape), _ELEM[dtype])], [vi("y", None, _ELEM[dtype])])
    built = CpuModel.build(m, {"x": shape})
    want_kind = "view" if shape == (4, 1, 6) else "kernel"
    assert _kinds(built, "Transpose") == [want_kind]
    got = built.run({"x": x})["y"]
    np.testing.assert_array_equal(got, np.transpose(x, perm))


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0], [768], [2], [1]),              # ViT's Q of the fused QKV projection
    ([1536], [2304], [-1], [1]),         # its V, a negative axis
    ([1, -1], [-1, 0], [1, 2], [2, -3]),  # steps, a negative step, negative ends
    ([0], [1], [1], [1]),                # the class token (sequence 1)
])
def test_slice_node_is_a_compiled_copy(starts, ends, axes, steps):
    x = _random((2, 9, 2304), np.float32, 7)
    inits = [numpy_helper.from_array(np.array(v, np.int64), name)
             for name, v in (("s", starts), ("e", ends), ("a", axes), ("t", steps))]
    m = make_model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])],
                   [vi("x", [2, 9, 2304])], [vi("y", None)], inits)
    built = CpuModel.build(m, {"x": x.shape})
    assert _kinds(built, "Slice") == ["kernel"]
    index = [slice(None)] * 3
    for s, e, a, t in zip(starts, ends, axes, steps):
        index[a] = slice(s, e, t)
    np.testing.assert_array_equal(built.run({"x": x})["y"], x[tuple(index)])


def test_padding_copy_repeats_the_last_row_and_crops():
    x = _random((3, 197, 10), np.float32, 1)
    pad = np.empty((3, 200, 13), np.float32)
    compile_spec(copy_spec("float32", x.shape, pad.shape))(x, pad)
    np.testing.assert_array_equal(pad[:, :197, :10], x)
    np.testing.assert_array_equal(pad[:, 197:, :10], np.repeat(x[:, -1:], 3, axis=1))
    np.testing.assert_array_equal(pad[:, :197, 10:], np.repeat(x[:, :, -1:], 3, axis=2))
    back = np.empty_like(x)
    compile_spec(copy_spec("float32", pad.shape, x.shape))(pad, back)
    np.testing.assert_array_equal(back, x)


def test_copy_spec_errors():
    with pytest.raises(CompilerError, match="reads input axis 0"):
        compile_spec(copy_spec("float32", (4,), (2,), starts=[4]))
    with pytest.raises(CompilerError, match="do not fit"):
        compile_spec(copy_spec("float32", (4, 2), (2, 4), perm=[0, 0]))


def test_chained_dense_layers_reuse_the_padded_rows():
    """Two projections on 13 rows (no register tile divides 13; ViT's MLP on 197 tokens): the
    first one's output rows, padded to 16, feed the second as they are (its crop is kept
    for other readers), instead of cropping and padding again; the result as onnxruntime's."""
    import onnxruntime as ort

    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array((rng.normal(size=s) / 4).astype(np.float32), name)
             for name, s in (("w1", (24, 40)), ("b1", (40,)), ("w2", (40, 16)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["t"]),
             helper.make_node("Add", ["t", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    m = make_model(nodes, [vi("x", [1, 13, 24])], [vi("y", None)], inits)
    x = rng.normal(size=(1, 13, 24)).astype(np.float32)
    built = CpuModel.build(m, {"x": x.shape})
    specs = [built.program.specs[s["kernel"]] for s in built.program.steps
             if s["kind"] == "kernel"]
    assert [s["op"] for s in specs] == ["copy", "dense", "copy", "dense", "copy"]
    assert specs[3]["data"] == [16, 40]
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = built.run({"x": x})["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
