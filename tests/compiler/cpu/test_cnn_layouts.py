"""Channel splits and concatenations of blocked (NCHW{c}c) values in the CPU build
(cpu/lowering.py): a Slice or Split along whole channel blocks stays blocked, a Concat
whose inputs are blocked in different ways converts the odd ones instead of unpacking
all; each model against the numpy reference and onnxruntime on seeded random inputs, at
odd sizes, batch > 1, channel counts that are not a multiple of the block."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

ort = pytest.importorskip("onnxruntime")

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _weights(rng, **shapes):
    return [numpy_helper.from_array(
        (rng.normal(size=s) / np.sqrt(np.prod(s[1:]))).astype(np.float32), k)
        for k, s in shapes.items()]


def _c2f(channels, split_op, opset=17):
    """YOLOv8's C2f: Conv -> SiLU, split in two halves along the channels, one half through
    a 3x3 Conv, Concat of the halves and that Conv's output -> 1x1 Conv; plus a Slice at
    block boundaries with a negative start; a Concat of a blocked and a plain value (a
    numpy Softmax's) and one of 2 channels with a blocked value (numpy: no common block)."""
    c, h = channels, channels // 2
    rng = np.random.default_rng(channels)
    if split_op == "Split":
        split = [helper.make_node("Split", ["a", "sizes"], ["s0", "s1"], axis=1)]
        extra = [numpy_helper.from_array(np.array([h, h], np.int64), "sizes")]
    else:
        ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
        split = [helper.make_node("Slice", ["a", "zero", "half", "one"], ["s0"]),
                 helper.make_node("Slice", ["a", "minus_half", "big", "one"], ["s1"])]
        extra = [ints("zero", [0]), ints("half", [h]), ints("one", [1]),
                 ints("minus_half", [-h]), ints("big", [2 ** 62])]
    nodes = [
        helper.make_node("Conv", ["image", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Sigmoid", ["c0"], ["g0"]),
        helper.make_node("Mul", ["c0", "g0"], ["a"]),
        *split,
        helper.make_node("Conv", ["s1", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Concat", ["s0", "s1", "r1"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w2"], ["c2"]),
        helper.make_node("Slice", ["c2", "three", "five", "one_axis"], ["odd"]),
        helper.make_node("Softmax", ["c2"], ["sm"], axis=1),
        helper.make_node("Concat", ["c2", "sm"], ["cat2"], axis=1),
        helper.make_node("Concat", ["odd", "cat2"], ["y"], axis=1),
    ]
    inits = _weights(rng, w0=(c, 3, 3, 3), b0=(c,), w1=(h, h, 3, 3), w2=(c, c + h, 1, 1))
    inits += extra + [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
                      (("three", [3]), ("five", [5]), ("one_axis", [1]))]
    return make_model(nodes, [vi("image", None)], [vi("y", None)], inits, opset)


def _check(model, shape, seed=0):
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    built = CpuModel.build(model, {"image": shape})
    got = built.run({"image": x})["y"]
    ref = ReferenceModel.load(model, {"image": shape}).run({"image": x})["y"]
    (want,) = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"image": x})
    assert got.shape == want.shape == ref.shape
    for other in (ref, want):
        np.testing.assert_allclose(got, other, rtol=1e-4, atol=1e-5 * np.abs(other).max())
    return built


@pytest.mark.parametrize("channels, split_op, shape", [
    (32, "Split", (1, 3, 17, 29)),   # halves of one block (16) each
    (64, "Slice", (2, 3, 11, 1)),    # width 1 after stride 2: block 32, batch 2
    (96, "Split", (3, 3, 5, 29)),    # three blocks per half, batch 3
])
def test_block_aligned_split_stays_blocked(channels, split_op, shape):
    built = _check(_c2f(channels, split_op), shape)
    steps = built.program.steps
    # The halves are numpy slices of the blocked array; nothing unpacks before the Concat.
    halves = [s for s in steps if s["inputs"][:1] == [f"a@nchw{channels // 2}c"]
              or s["inputs"][:1] == ["a@nchw16c"]]
    assert [(s["op"], s["kind"]) for s in halves if s["op"] != "Conv"] == [("Slice", "numpy")] * 2
    concats = [s for s in steps if s["op"] == "Concat"]
    assert [s["kind"] for s in concats] == ["concat", "concat", "numpy"]
    unpacked = {s["node"] for s in steps if s["op"] == "unpack"}
    assert unpacked == {"c2", "cat2"}  # read by numpy steps (Slice, Softmax; Concat)


def test_split_off_block_boundaries_stays_numpy():
    """Halves of 24 channels (block 16 for 48): not whole blocks, the plain numpy Split."""
    built = _check(_c2f(48, "Split"), (1, 3, 9, 31))
    split = next(s for s in built.program.steps if s["op"] == "Split")
    assert "@nchw" not in split["inputs"][0]


# ---- in place: slices in their source, Concat inputs in the Concat (runtime/executor.py) ----


def _no_overlap_but_in_place(program):
    """Every kernel step's arrays are disjoint bytes; values share bytes only through
    views or in_place."""
    from celosia.runtime.executor import plan_memory

    offsets, total, _ = plan_memory(program)
    size = {v: int(np.prod(program.values[v]["shape"])) * np.dtype(
        program.values[v]["dtype"]).itemsize for v in offsets}
    for s in program.steps:
        if s["kind"] != "kernel":
            continue
        live = [v for v in dict.fromkeys(s["inputs"] + s["outputs"]) if v in offsets]
        for i, a in enumerate(live):
            for b in live[:i]:
                assert offsets[a] + size[a] <= offsets[b] or offsets[b] + size[b] <= offsets[a]
    assert all(offsets[v] + size[v] <= total for v in offsets)
    return offsets


def test_batch_one_splits_and_concats_copy_nothing():
    """Batch 1: the C2f's Slices are views of the Conv output, which with the bottleneck's
    output is written straight into the Concat; the Concat with the converted Softmax
    output copies only that input; results as the reference's, and the same run again."""
    from celosia.runtime.executor import in_place

    model = _c2f(32, "Slice")
    built = _check(model, (1, 3, 17, 29))
    program, ex = built.program, built.executor
    place = in_place(program)
    offsets = _no_overlap_but_in_place(program)
    calls = {s["outputs"][0].split("@")[0]: (s, c) for s, c in zip(program.steps, ex._calls)}
    for value in ("s0", "s1", "cat"):  # the halves and the C2f concat: no copy
        assert calls[value][0]["op"] in ("Slice", "Concat") and calls[value][1] is None, value
    cat = calls["cat"][0]["outputs"][0]
    assert place["a@nchw16c"] == (cat, 0) and offsets["a@nchw16c"] == offsets[cat]
    assert calls["cat2"][1] is not None  # the packed Softmax output is copied
    _check(model, (1, 3, 17, 29), seed=1)
    x = np.random.default_rng(7).normal(size=(1, 3, 17, 29)).astype(np.float32)
    np.testing.assert_array_equal(built.run({"image": x})["y"], built.run({"image": x})["y"])


def test_plain_concat_and_slice_in_place():
    """Plain values (no convolution): a Slice of axis 1 at batch 1 is a view, and a Concat
    of axis 1 takes its inputs in place unless one is read twice or is a graph input."""
    from celosia.runtime.executor import in_place

    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Exp", ["image"], ["e"]),
             helper.make_node("Slice", ["e", "one", "four", "one"], ["s"]),
             helper.make_node("Neg", ["s"], ["n"]),
             helper.make_node("Sin", ["e"], ["m"]),  # a numpy step
             helper.make_node("Concat", ["n", "m", "n", "image"], ["y"], axis=1)]
    model = make_model(nodes, [vi("image", None)], [vi("y", None)],
                       [ints("one", [1]), ints("four", [4])])
    for shape in [(1, 5, 3, 2), (2, 5, 3, 2)]:
        built = _check(model, shape)
        place = in_place(built.program)
        _no_overlap_but_in_place(built.program)
        if shape[0] == 1:
            assert set(place) == {"s", "m"}  # n twice and the graph input keep their own
        else:
            assert place == {}



# ---- NCHW <-> NHWC next to blocked values (ConvNeXt) -------------------------------------------


def _convnext_block(c):
    """A depthwise 7x7 Conv, Transpose to NHWC, LayerNorm, a MatMul, Transpose back, the
    residual Add; and a Transpose of another permutation (numpy as before)."""
    rng = np.random.default_rng(c)
    inits = _weights(rng, w0=(c, 3, 1, 1), wd=(c, 1, 7, 7), wm=(c, c))
    inits += [numpy_helper.from_array(np.ones(c, np.float32), "gamma"),
              numpy_helper.from_array(np.zeros(c, np.float32), "beta")]
    nodes = [helper.make_node("Conv", ["image", "w0"], ["x"]),
             helper.make_node("Conv", ["x", "wd"], ["d"], group=c, pads=[3, 3, 3, 3]),
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "gamma", "beta"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "wm"], ["m"]),
             helper.make_node("Transpose", ["m"], ["back"], perm=[0, 3, 1, 2]),
             helper.make_node("Add", ["x", "back"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])]
    return make_model(nodes, [vi("image", None)], [vi("y", None)], inits)


@pytest.mark.parametrize("channels, shape", [
    (32, (1, 3, 9, 15)),   # block 16
    (24, (2, 3, 5, 4)),    # block 8, batch 2
    (64, (1, 3, 1, 5)),    # width 5: the 1x1 Conv's block is 32; height 1
])
def test_nhwc_transposes_of_blocked_values(channels, shape):
    built = _check(_convnext_block(channels), shape)
    steps = built.program.steps
    ops = [(s["op"], s["kind"]) for s in steps]
    # Only the output's permutation unpacks; both NHWC transposes read or write blocks.
    assert [s["node"] for s in steps if s["op"] == "unpack"] == ["r"]
    assert ("pack", "kernel") not in ops[1:]
    to_nhwc, back = [s for s in steps if s["op"] == "Transpose" and s["kind"] == "numpy"]
    assert to_nhwc["attrs"]["perm"] == [0, 2, 3, 1, 4] and "@nchw" in to_nhwc["inputs"][0]
    assert back["attrs"]["perm"] == [0, 3, 1, 2, 4] and "@nchw" in back["outputs"][0]
    # the other permutation, of a plain value, is a compiled strided copy (lowering_nn), or a
    # view when it only moves an axis of size 1
    other = [s for s in steps if s["op"] == "Transpose"][-1]
    assert other["kind"] == "view" or built.program.specs[other["kernel"]]["op"] == "copy"


def test_in_place_ignores_malformed_steps():
    """A program from a file may carry any attributes and shapes on a numpy step: such a
    Slice or Concat places nothing (the step reports it when it runs), nothing raises."""
    import copy
    from types import SimpleNamespace

    from celosia.runtime.executor import in_place, plan_memory

    built = _check(_c2f(32, "Slice"), (1, 3, 17, 29)).program
    program = SimpleNamespace(**{k: copy.deepcopy(getattr(built, k))
                                 for k in ("inputs", "outputs", "values", "steps")})
    slices = [s for s in program.steps if s["op"] == "Slice"]
    good = in_place(program)
    assert slices[0]["outputs"][0] in good
    for attrs in ({"starts": "x"}, {"starts": [0], "ends": [1], "axes": ["a"], "steps": [1]},
                  {"starts": [], "ends": [], "axes": [1], "steps": [1]},
                  {"starts": [0], "ends": [2 ** 70], "axes": [1], "steps": [1]}):
        slices[0]["attrs"] = attrs
        # (not in its source; it may go into the Concat as any other input)
        got = in_place(program).get(slices[0]["outputs"][0], ("",))[0]
        assert got != slices[0]["inputs"][0]
        plan_memory(program)
    concat = next(s for s in program.steps if s["op"] == "Concat" and s["kind"] == "numpy")
    concat["inputs"] = concat["inputs"][:1]  # no longer adds up to the output
    assert all(place[0] != concat["outputs"][0] for place in in_place(program).values())
