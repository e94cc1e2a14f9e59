"""Shapes that depend on values only known at run time (graph/dynamic.py): the nodes that
make them keep ONNX's form, the sizes downstream are None in the graph's types, and the
CPU build runs that part as numpy steps of run-time size while the rest stays compiled.
Each model runs on several random draws of its shape-deciding values, against onnxruntime."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.ir import Node, NodeError, TensorType, verify_graph
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.reference import infer_node, run_graph
from celosia.errors import CelosiaError
from celosia.runtime.cpu import CpuModel
from onnx_builders import make_model, vi

I64 = TensorProto.INT64


@pytest.fixture(autouse=True, scope="module")
def _private_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CELOSIA_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


# ---- the models: (model, [feeds, ...]) --------------------------------------------------------


def reshape_from_values(rng):
    # The target's last size is the largest value of an int64 input: [-1, max(v)].
    nodes = [node("ReduceMax", ["v"], ["m"], keepdims=1),
             node("Concat", ["minus1", "m"], ["s"], axis=0),
             node("Reshape", ["x", "s"], ["r"]),
             node("Relu", ["r"], ["y"])]
    m = make_model(nodes, [vi("x", [24]), vi("v", [3], I64)], [vi("y", None)],
                   [const("minus1", np.array([-1], np.int64))])
    feeds = [{"x": rng.normal(size=24).astype(np.float32),
              "v": rng.permutation(np.array([1, 1, k], np.int64))} for k in (2, 3, 4, 6, 24)]
    return m, feeds


def range_expand_tile(rng):
    # Range(0, n) -> Expand to [k, n] -> Tile by run-time repeats -> float, ReduceSum.
    nodes = [node("Range", ["zero", "n", "one"], ["r"]),
             node("Unsqueeze", ["n", "axis0"], ["n1"]),
             node("Concat", ["k", "n1"], ["shape"], axis=0),
             node("Expand", ["r", "shape"], ["e"]),
             node("Tile", ["e", "reps"], ["t"]),
             node("Cast", ["t"], ["f"], to=TensorProto.FLOAT),
             node("ReduceSum", ["f", "axis0"], ["y"], keepdims=0)]
    m = make_model(nodes, [vi("n", [], I64), vi("k", [1], I64), vi("reps", [2], I64)],
                   [vi("t", None, I64), vi("y", None)],
                   [const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64)),
                    const("axis0", np.array([0], np.int64))])
    feeds = [{"n": np.array(n, np.int64), "k": np.array([k], np.int64),
              "reps": np.array(reps, np.int64)}
             for n, k, reps in ((5, 2, (1, 3)), (1, 4, (2, 1)), (7, 1, (2, 2)), (0, 3, (1, 1)))]
    return m, feeds


def constant_of_shape_slice_pad(rng):
    # ConstantOfShape of a run-time shape, sliced to run-time ends, padded by run-time pads.
    value = helper.make_tensor("value", TensorProto.FLOAT, [1], [1.5])
    nodes = [node("ConstantOfShape", ["shape"], ["c"], value=value),
             node("Add", ["c", "x"], ["a"]),
             node("Slice", ["a", "starts", "ends", "axes"], ["s"]),
             node("Pad", ["s", "pads"], ["y"])]
    m = make_model(nodes, [vi("shape", [2], I64), vi("x", [1, 4]), vi("ends", [1], I64),
                           vi("pads", [4], I64)], [vi("y", None)],
                   [const("starts", np.array([1], np.int64)),
                    const("axes", np.array([0], np.int64))])
    feeds = [{"shape": np.array([r, 4], np.int64), "x": rng.normal(size=(1, 4)).astype(
        np.float32), "ends": np.array([e], np.int64), "pads": np.array(p, np.int64)}
             for r, e, p in ((5, 4, (0, 1, 2, 0)), (3, -1, (1, 0, 0, 2)), (8, 100, (0, 0, 0, 0)))]
    return m, feeds


def split_squeeze_reduce(rng):
    # Split by run-time sizes, Unsqueeze/ReduceMean/Squeeze by run-time axes.
    nodes = [node("Split", ["x", "sizes"], ["a", "b"], axis=1),
             node("Unsqueeze", ["a", "uaxes"], ["u"]),
             node("ReduceMean", ["u", "raxes"], ["m"], keepdims=1),
             node("Squeeze", ["m", "saxes"], ["y"]),
             node("Sigmoid", ["b"], ["z"])]
    m = make_model(nodes, [vi("x", [2, 6, 3]), vi("sizes", [2], I64), vi("uaxes", [1], I64),
                           vi("raxes", [2], I64), vi("saxes", [1], I64)],
                   [vi("y", None), vi("z", None)], opset=18)
    feeds = [{"x": rng.normal(size=(2, 6, 3)).astype(np.float32),
              "sizes": np.array(s, np.int64), "uaxes": np.array([u], np.int64),
              "raxes": np.array(r, np.int64), "saxes": np.array([q], np.int64)}
             for s, u, r, q in (((2, 4), 0, (1, 3), -1), ((5, 1), -1, (0, 2), 2),
                                ((0, 6), 1, (-1, 0), 0))]
    return m, feeds


def compiled_around_a_segment(rng):
    # Conv (compiled) -> Flatten -> Slice to run-time ends (numpy) -> ReduceMean over the
    # run-time axis back to a static [1, 64] -> MatMul and Relu (compiled again).
    w = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    wd = rng.normal(size=(64, 5)).astype(np.float32)
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             node("Relu", ["c"], ["r"]),
             node("Reshape", ["r", "rows"], ["f"]),
             node("Slice", ["f", "starts", "ends", "axes"], ["s"]),
             node("ReduceMean", ["s", "axes"], ["p"], keepdims=1),
             node("MatMul", ["p", "wd"], ["d"]),
             node("Relu", ["d"], ["y"])]
    m = make_model(nodes, [vi("x", [1, 3, 8, 4]), vi("ends", [1], I64)], [vi("y", None)],
                   [const("w", w), const("wd", wd), const("rows", np.array([2, 64], np.int64)),
                    const("starts", np.array([0], np.int64)),
                    const("axes", np.array([0], np.int64))], opset=18)
    feeds = [{"x": rng.normal(size=(1, 3, 8, 4)).astype(np.float32),
              "ends": np.array([e], np.int64)} for e in (1, 2, -1)]
    return m, feeds


def squeeze_without_axes(rng):
    # The first rows of x up to a run-time end, [?, 1, 5, 1], then Squeeze without axes
    # (as AffineGrid's function body does): the static 1s go, ? is taken as not 1.
    nodes = [node("Slice", ["x", "zero", "ends", "zero"], ["s"]),
             node("Squeeze", ["s"], ["q"]),
             node("Relu", ["q"], ["y"])]
    m = make_model(nodes, [vi("x", [8, 1, 5, 1]), vi("ends", [1], I64)], [vi("y", None)],
                   [const("zero", np.array([0], np.int64))])
    feeds = [{"x": rng.normal(size=(8, 1, 5, 1)).astype(np.float32),
              "ends": np.array([e], np.int64)} for e in (2, 3, 7)]
    return m, feeds


MODELS = [reshape_from_values, range_expand_tile, constant_of_shape_slice_pad,
          split_squeeze_reduce, compiled_around_a_segment, squeeze_without_axes]


def _close(ours: dict, model, feeds):
    theirs = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for (name, a), b in zip(ours.items(), theirs):
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("make", MODELS, ids=[f.__name__ for f in MODELS])
def test_run_time_shapes_against_onnxruntime(make):
    model, draws = make(np.random.default_rng(0))
    graph = import_onnx(model)
    assert any(n.attrs.get("runtime_shape") for n in graph.nodes)
    assert any(not t.static for t in graph.types.values())
    opt = optimize(graph)  # the passes keep the graph valid and the types honest
    verify_graph(opt)
    cpu = CpuModel.build(model)
    for feeds in draws:
        _close(run_graph(graph, feeds), model, feeds)
        _close(run_graph(opt, feeds), model, feeds)
        _close(cpu.run(feeds), model, feeds)


def test_the_static_part_stays_compiled(tmp_path):
    model, draws = compiled_around_a_segment(np.random.default_rng(1))
    graph = optimize(import_onnx(model))
    assert str(graph.types["f"]) == "float32[2,64]"      # before the run-time Slice
    assert str(graph.types["s"]) == "float32[?,64]"      # its rows: only known at run time
    assert str(graph.types["p"]) == "float32[1,64]"      # static again after the mean
    cpu = CpuModel.build(model)
    cpu.run(draws[0], profile=True)
    kinds = cpu.report()["summary"]["kinds"]
    assert kinds["kernel"]["Conv"] == 1 and kinds["kernel"]["MatMul"] == 1
    assert set(kinds["numpy"]) == {"Slice", "ReduceMean"}
    shapes = {p["node"]: p["shape"] for p in cpu.profile}
    assert shapes["s"] == [1, 64]  # the run's own size (its ends: 1) in the profile
    # The .cel keeps the run-time-shaped steps: loaded, it runs every draw alike.
    cpu.save(tmp_path / "m.cel")
    loaded = CpuModel.load(tmp_path / "m.cel")
    for feeds in draws:
        np.testing.assert_array_equal(loaded.run(feeds)["y"], cpu.run(feeds)["y"])


def test_types_promise_only_sizes_every_run_has():
    t = TensorType("float32", (None, 4))
    i64 = TensorType("int64", (1,))

    def out(op, types, values=None, **attrs):
        (r,) = infer_node(Node(op, tuple(f"i{k}" for k in range(len(types))), ("o",), attrs,
                               "n"), types, values or [None] * len(types))
        return str(r)
    # A slice [0:1] of a run-time number of rows has 0 or 1 of them: not promised.
    assert out("Slice", [t], starts=[0], ends=[1], axes=[0], steps=[1]) == "float32[?,4]"
    assert out("Concat", [t, t], axis=1) == "float32[?,8]"
    assert out("Gather", [t, i64], [None, np.array([0])], axis=0) == "float32[1,4]"
    assert out("MatMul", [t, TensorType("float32", (4, 6))]) == "float32[?,6]"
    assert out("Conv", [TensorType("float32", (1, 3, None, 8)),
                        TensorType("float32", (5, 3, 3, 3))], kernel_shape=[3, 3],
               strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1) == \
        "float32[1,5,?,6]"
    assert out("Reshape", [t, TensorType("int64", (3,))], [None, np.array([0, 2, -1])],
               runtime_shape=1) == "float32[?,2,?]"


def test_bad_run_time_values_are_node_errors():
    model, draws = reshape_from_values(np.random.default_rng(2))
    feeds = dict(draws[0], v=np.array([5, 1, 1], np.int64))  # 24 elements into [-1, 5]
    with pytest.raises(NodeError, match=r"node 'r' \(Reshape\): failed at run time: cannot "
                                        r"reshape") as e:
        run_graph(import_onnx(model), feeds)
    assert isinstance(e.value, CelosiaError)
    with pytest.raises(NodeError, match=r"node 'r' \(Reshape\): failed at run time"):
        CpuModel.build(model).run(feeds)


def test_squeeze_without_axes_keeps_a_run_time_size_that_is_1_as_an_error():
    """Typed [?,5]: when the run-time size is 1 after all, ONNX's Squeeze would drop it too
    and the rank would change; celosia says so instead of giving another shape."""
    model, draws = squeeze_without_axes(np.random.default_rng(3))
    graph = import_onnx(model)
    assert str(graph.types["q"]) == "float32[?,5]"
    feeds = dict(draws[0], ends=np.array([1], np.int64))
    message = (r"node 'q' \(Squeeze\): failed at run time: .*without axes it removes every "
               r"dim of size 1: dims \[0, 1, 3\] of \[1,1,5,1\] here, where the model was "
               r"built to remove dims \[1, 3\] .* give the Squeeze its axes in the model")
    with pytest.raises(NodeError, match=message):
        run_graph(graph, feeds)
    with pytest.raises(NodeError, match=message):
        CpuModel.build(model).run(feeds)


def test_an_operator_added_elsewhere_runs_by_its_registered_types(monkeypatch):
    """The machinery other operators rely on: NonZero (listed in dynamic.VALUE_SHAPED with
    its type rule) needs only a kernel on ONNX's inputs; its output and what reads it run
    as a run-time-shaped segment of the CPU build, and If's branches join their types."""
    from celosia.compiler.graph import ops
    from celosia.compiler.graph.dynamic import join_types
    from celosia.compiler.graph.ir import Graph

    monkeypatch.setitem(ops.KERNELS, "NonZero", lambda a, x: np.array(np.nonzero(x)))
    x_t = TensorType("float32", (3, 4))
    nz = Node("NonZero", ("x",), ("idx",), {"runtime_shape": 1}, "nz")
    (idx_t,) = infer_node(nz, [x_t], [None])
    assert str(idx_t) == "int64[2,?]"
    tr = Node("Transpose", ("idx",), ("pairs",), {"perm": [1, 0]}, "tr")
    (pairs_t,) = infer_node(tr, [idx_t], [None])
    cast = Node("Cast", ("pairs",), ("f",), {"to": "float32"}, "cast")
    (f_t,) = infer_node(cast, [pairs_t], [None])
    total = Node("ReduceSum", ("f",), ("y",), {"axes": None, "keepdims": 0}, "sum")
    (y_t,) = infer_node(total, [f_t], [None])
    assert (str(pairs_t), str(y_t)) == ("int64[?,2]", "float32[]")
    graph = Graph("g", ("x",), ("pairs", "y"), (nz, tr, cast, total), {},
                  {"x": x_t, "idx": idx_t, "pairs": pairs_t, "f": f_t, "y": y_t})
    verify_graph(graph)
    cpu = CpuModel.from_graph(graph)
    rng = np.random.default_rng(3)
    for density in (0.0, 0.3, 1.0):
        x = (rng.random((3, 4)) < density).astype(np.float32)
        want = np.argwhere(x)
        for got in (run_graph(graph, {"x": x}), cpu.run({"x": x})):
            np.testing.assert_array_equal(got["pairs"], want)
            assert got["y"] == np.float32(want.sum())
    a, b = TensorType("float32", (1, 4, 3)), TensorType("float32", (1, 5, 3))
    assert str(join_types(a, b)) == "float32[1,?,3]"


def test_a_run_time_sized_value_crosses_an_accelerator_region():
    """Partitioned int8 build: the run-time Reshape stays on the CPU, the Conv runs on the
    accelerator (fsim), and the CPU segment after it takes the run-time-sized value as an
    input of its own (outside its arena); bit-exact with the all-CPU build."""
    from celosia.runtime.accel import AccelModel

    rng = np.random.default_rng(4)
    w = rng.normal(size=(16, 16, 3, 3)).astype(np.float32)
    nodes = [node("Reshape", ["x", "s"], ["r"]),
             node("Conv", ["x2", "w"], ["c"], pads=[1, 1, 1, 1]),
             node("Add", ["c", "r"], ["y"])]
    model = make_model(nodes, [vi("x", [1, 1024]), vi("s", [4], I64), vi("x2", [1, 16, 8, 8])],
                       [vi("y", None)], [const("w", w)])
    calibration = {"x": rng.normal(size=(2, 1024)).astype(np.float32),
                   "s": np.array([[1, 16, 8, 8]] * 2), "x2": rng.normal(size=(2, 16, 8, 8))
                   .astype(np.float32)}
    accel = AccelModel.from_onnx(model, "default", calibration=calibration, target="fsim")
    assert accel.placements["c"].target == "accel" and accel.placements["r"].target == "cpu"
    cpu = accel.cpu_build()
    for s in ([1, 16, 8, 8], [16, 1, 8, 8]):  # r broadcast onto c: y is [1|16,16,8,8]
        feeds = {"x": rng.normal(size=(1, 1024)).astype(np.float32),
                 "s": np.array(s, np.int64), "x2": rng.normal(size=(1, 16, 8, 8))
                 .astype(np.float32)}
        ours = accel.run(feeds, target="fsim")["y"]
        assert ours.shape == (s[0], 16, 8, 8)
        np.testing.assert_array_equal(ours, cpu.run(feeds, target="fsim")["y"])
