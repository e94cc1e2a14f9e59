"""Compiled If/Loop/Scan bodies on the CPU build (compiler/cpu/control.py, runtime/control.py,
runtime/schema_control.py): each case against onnxruntime and the numpy reference on seeded
random inputs of several shapes, the path each node took, and the .cel round trip."""

from __future__ import annotations

import numpy as np
import pytest
from accel_helpers import edit_manifest
from onnx_builders import make_model as model, onnxruntime_run, vi
from onnx import TensorProto, helper, numpy_helper

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.reference import run_graph
from celosia.models import recurrent
from celosia.runtime.artifact import ArtifactError
from celosia.runtime.cpu import CpuModel

F, I64, I32, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")



def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)



def check(m, feeds_list, tmp_path, compiled=("Loop", "Scan", "If")):
    """The CPU build and its .cel round trip against the numpy reference (integer outputs
    bit for bit, float ones to float32 rounding) and onnxruntime, on every feed; the nodes
    of ``compiled`` ops took the compiled path. Returns the build."""
    graph = optimize(import_onnx(m))
    built = CpuModel.from_graph(graph)
    paths = {c["op"]: c["path"] for c in built.build_info.get("control_flow", [])}
    for op in compiled:
        if op in paths:
            assert paths[op] == "compiled", built.build_info["control_flow"]
    assert any(s["kind"] == "control" for s in built.program.steps)
    built.save(tmp_path / "m.cel")
    loaded = CpuModel.load(tmp_path / "m.cel")
    for feeds in feeds_list:
        want = run_graph(graph, feeds)
        theirs = onnxruntime_run(m, feeds)
        for got in (built.run(feeds), loaded.run(feeds)):
            for k, w in want.items():
                assert got[k].shape == w.shape and got[k].dtype == w.dtype, k
                if w.dtype.kind in "iub":
                    np.testing.assert_array_equal(got[k], w, err_msg=k)
                    np.testing.assert_array_equal(got[k], theirs[k], err_msg=k)
                else:
                    np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-5, err_msg=k)
                    np.testing.assert_allclose(got[k], theirs[k], rtol=1e-4, atol=1e-5,
                                               err_msg=k)
    return built


# ---- Loop ------------------------------------------------------------------------------------


def rnn_loop(batch, feat, hidden, steps, *, trip=True, cond=False, scans=True, limit=None):
    """An RNN cell over a run-time sequence ``xs`` (outer run-time value, Gather by the
    iteration number) with weights from the outer scope (constants), carrying float32 h,
    int64 k (the count), int32 acc (a sum of iteration numbers) and a bool flag (flipped
    each iteration); scan outputs h and k. With ``limit`` the body stops when k reaches
    it (its condition computed)."""
    rng = np.random.default_rng(batch * 100 + hidden)
    w = rng.normal(0, 1 / np.sqrt(feat), (feat, hidden)).astype(np.float32)
    u = rng.normal(0, 0.5 / np.sqrt(hidden), (hidden, hidden)).astype(np.float32)
    b = rng.normal(0, 0.1, hidden).astype(np.float32)
    nodes = [helper.make_node("Gather", ["xs", "i"], ["x_t"], axis=0),
             helper.make_node("MatMul", ["x_t", "W"], ["xw"]),
             helper.make_node("MatMul", ["h", "U"], ["hu"]),
             helper.make_node("Add", ["xw", "hu"], ["s"]),
             helper.make_node("Add", ["s", "b"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["h_out"]),
             helper.make_node("Add", ["k", "one"], ["k_out"]),
             helper.make_node("Cast", ["i"], ["i32"], to=I32),
             helper.make_node("Add", ["acc", "i32"], ["acc_out"]),
             helper.make_node("Not", ["flag"], ["flag_out"]),
             helper.make_node("Identity", ["h_out"], ["h_scan"]),
             helper.make_node("Identity", ["k_out"], ["k_scan"])]
    if limit is not None:
        nodes.append(helper.make_node("Less", ["k_out", "limit"], ["go"]))
    else:
        nodes.append(helper.make_node("Identity", ["c"], ["go"]))
    outs = [vi("go", [], B), vi("h_out", [batch, hidden]), vi("k_out", [], I64),
            vi("acc_out", [1], I32), vi("flag_out", [2], B)]
    if scans:
        outs += [vi("h_scan", [batch, hidden]), vi("k_scan", [], I64)]
    body = helper.make_graph(
        nodes, "body", [vi("i", [], I64), vi("c", [], B), vi("h", [batch, hidden]),
                        vi("k", [], I64), vi("acc", [1], I32), vi("flag", [2], B)], outs,
        [const("one", np.int64(1))])
    loop_outs = ["h_last", "k_last", "acc_last", "flag_last"] + (["hs", "ks"] if scans else [])
    loop = helper.make_node("Loop", ["T" if trip else "", "c0" if cond else "", "h0", "k0",
                                     "acc0", "flag0"], loop_outs, name="loop", body=body)
    inits = [const("W", w), const("U", u), const("b", b), const("T", np.int64(steps)),
             const("c0", np.array(True)), const("k0", np.int64(0)),
             const("acc0", np.array([7], np.int32)), const("flag0", np.array([True, False]))]
    if limit is not None:
        inits.append(const("limit", np.int64(limit)))
    outputs = [vi("h_last", [batch, hidden]), vi("k_last", [], I64), vi("acc_last", [1], I32),
               vi("flag_last", [2], B)]
    if scans:
        outputs += [vi("hs", [steps, batch, hidden]), vi("ks", [steps], I64)]
    return model([loop], [vi("xs", [steps + 2, batch, feat]), vi("h0", [batch, hidden])],
                 outputs, inits)


def rnn_feeds(batch, feat, hidden, steps, n=2, seed=0):
    rng = np.random.default_rng(seed)
    return [{"xs": rng.normal(size=(steps + 2, batch, feat)).astype(np.float32),
             "h0": rng.normal(size=(batch, hidden)).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("batch, feat, hidden, steps", [(1, 8, 16, 5), (3, 5, 7, 9)])
def test_loop_trip_count_with_scan_outputs_and_carried_dtypes(batch, feat, hidden, steps,
                                                             tmp_path):
    built = check(rnn_loop(batch, feat, hidden, steps), rnn_feeds(batch, feat, hidden, steps),
                  tmp_path)
    body = next(s for s in built.program.steps if s["kind"] == "control")["bodies"]["body"]
    # x_t @ W hoisted out of the loop (one product over the sequence, control_hoist.py),
    # the recurrent MatMul compiled with the projected row and bias added in its epilogue
    assert [s["op"] for s in body["steps"] if s["kind"] == "kernel"].count("MatMul") == 1
    assert any(s["node"] == "loop/proj0" and s["kind"] == "kernel"
               for s in built.program.steps)


def test_loop_condition_only_and_both(tmp_path):
    feeds = rnn_feeds(2, 4, 8, 6)
    check(rnn_loop(2, 4, 8, 6, trip=False, cond=True, scans=False, limit=4), feeds, tmp_path)
    check(rnn_loop(2, 4, 8, 6, trip=True, cond=True, scans=False, limit=4), feeds, tmp_path)
    check(rnn_loop(2, 4, 8, 6, trip=True, cond=True, scans=False, limit=40), feeds, tmp_path)


def test_loop_zero_iterations(tmp_path):
    """Without scan outputs compiled (the carried values come back unchanged); with them
    the outputs have no rows, and the node stays numpy, saying so."""
    check(rnn_loop(1, 4, 8, 0, scans=False), rnn_feeds(1, 4, 8, 0), tmp_path)
    graph = optimize(import_onnx(rnn_loop(1, 4, 8, 0)))
    built = CpuModel.from_graph(graph)
    (path,) = built.build_info["control_flow"]
    assert path["path"] == "numpy" and "no elements" in path["why"]
    feeds = rnn_feeds(1, 4, 8, 0)[0]
    got, want = built.run(feeds), onnxruntime_run(rnn_loop(1, 4, 8, 0), feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


# ---- Scan ------------------------------------------------------------------------------------


def scan_model(n, m, length, directions, in_axes, out_axes, out_directions):
    """Two states (float32 sum and int64 count), two sequences sliced along ``in_axes``;
    scan outputs the running sum and the product of the slices."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["a", "b"], ["ab"]),
         helper.make_node("Add", ["s", "ab"], ["s_out"]),
         helper.make_node("Add", ["cnt", "one"], ["cnt_out"]),
         helper.make_node("Identity", ["s_out"], ["y1"]),
         helper.make_node("Relu", ["ab"], ["y2"])],
        "scan_body", [vi("s", [n, m]), vi("cnt", [], I64), vi("a", [n, m]), vi("b", [n, m])],
        [vi("s_out", [n, m]), vi("cnt_out", [], I64), vi("y1", [n, m]), vi("y2", [n, m])],
        [const("one", np.int64(1))])

    def seq_shape(axis):
        shape = [n, m]
        shape.insert(axis % 3, length)
        return shape
    node = helper.make_node("Scan", ["s0", "c0", "xa", "xb"], ["s_T", "c_T", "ys1", "ys2"],
                            name="scan", body=body, num_scan_inputs=2,
                            scan_input_directions=directions, scan_input_axes=in_axes,
                            scan_output_axes=out_axes, scan_output_directions=out_directions)
    return model([node], [vi("s0", [n, m]), vi("xa", seq_shape(in_axes[0])),
                          vi("xb", seq_shape(in_axes[1]))],
                 [vi("s_T", [n, m]), vi("c_T", [], I64), vi("ys1", None), vi("ys2", None)],
                 [const("c0", np.int64(3))]), (seq_shape(in_axes[0]), seq_shape(in_axes[1]))


@pytest.mark.parametrize("n, m, length, directions, in_axes, out_axes, out_directions", [
    (2, 3, 4, [0, 0], [0, 0], [0, 0], [0, 0]),
    (3, 5, 6, [1, 0], [1, -1], [2, -3], [0, 1]),
    (1, 7, 3, [1, 1], [2, 0], [1, 0], [1, 1]),
])
def test_scan_forward_reverse_and_axes(n, m, length, directions, in_axes, out_axes,
                                       out_directions, tmp_path):
    mdl, (sa, sb) = scan_model(n, m, length, directions, in_axes, out_axes, out_directions)
    rng = np.random.default_rng(n * m)
    feeds = [{"s0": rng.normal(size=(n, m)).astype(np.float32),
              "xa": rng.normal(size=sa).astype(np.float32),
              "xb": rng.normal(size=sb).astype(np.float32)} for _ in range(2)]
    check(mdl, feeds, tmp_path)


# ---- If, nesting -----------------------------------------------------------------------------


def if_in_loop_in_if(hidden):
    """An If (on a run-time ``mode``) whose then-branch holds a Loop whose body holds an If
    (on the sign of the running sum) reading a value of the outer graph and one of the
    loop body."""
    inner_if = helper.make_node(
        "If", ["pos"], ["v_out"],
        then_branch=helper.make_graph([helper.make_node("Mul", ["v", "scale"], ["t"])],
                                      "inner_then", [], [vi("t", [hidden])]),
        else_branch=helper.make_graph([helper.make_node("Sub", ["v", "x"], ["e"])],
                                      "inner_else", [], [vi("e", [hidden])]))
    loop_body = helper.make_graph(
        [helper.make_node("ReduceSum", ["v"], ["total"], keepdims=0),
         helper.make_node("Greater", ["total", "zero"], ["pos"]), inner_if,
         helper.make_node("Identity", ["c"], ["c_out"])],
        "loop_body", [vi("i", [], I64), vi("c", [], B), vi("v", [hidden])],
        [vi("c_out", [], B), vi("v_out", [hidden])], [const("zero", np.float32(0))])
    loop = helper.make_node("Loop", ["T", "", "x"], ["looped"], body=loop_body)
    outer_if = helper.make_node(
        "If", ["use_loop"], ["y"],
        then_branch=helper.make_graph([loop], "then", [], [vi("looped", [hidden])]),
        else_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["neg"])], "else", [],
                                      [vi("neg", [hidden])]))
    return model([helper.make_node("Equal", ["mode", "zero64"], ["use_loop"]), outer_if],
                 [vi("x", [hidden]), vi("mode", [], I64)], [vi("y", [hidden])],
                 [const("T", np.int64(5)), const("scale", np.float32(0.5)),
                  const("zero64", np.int64(0))])


@pytest.mark.parametrize("hidden", [1, 13])
def test_nested_loop_in_if_and_if_in_loop(hidden, tmp_path):
    rng = np.random.default_rng(hidden)
    feeds = [{"x": rng.normal(size=hidden).astype(np.float32) + shift,
              "mode": np.array(mode, np.int64)} for mode in (0, 1) for shift in (-1, 1)]
    built = check(if_in_loop_in_if(hidden), feeds, tmp_path)
    paths = [(c["op"], c["path"]) for c in built.build_info["control_flow"]]
    assert sorted(paths) == [("If", "compiled"), ("If", "compiled"), ("Loop", "compiled")]


def test_control_flow_zoo_model_against_onnxruntime(tmp_path):
    for batch, time in ((1, 7), (2, 4)):
        m = recurrent.control_flow(features=12, hidden=20, classes=5, time=time, batch=batch)
        rng = np.random.default_rng(batch)
        x = rng.normal(size=(batch, time, 12)).astype(np.float32)
        built = CpuModel.build(m, {"x": (batch, time, 12)})
        assert [c["path"] for c in built.build_info["control_flow"]] == ["compiled"] * 2
        built.save(tmp_path / "cf.cel")
        loaded = CpuModel.load(tmp_path / "cf.cel")
        for mode in (0, 3):
            feeds = {"x": x, "mode": np.array(mode, np.int64)}
            want = onnxruntime_run(m, feeds)
            for got in (built.run(feeds), loaded.run(feeds)):
                for k in want:
                    np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_changing_shape_stays_numpy_and_says_why(tmp_path):
    """A Loop whose trip count is a run-time input and whose body has a run-time-shaped
    value (a Range to the iteration number) stays a numpy step."""
    body = helper.make_graph(
        [helper.make_node("Range", ["zero", "i", "one"], ["r"]),
         helper.make_node("ReduceSum", ["r"], ["rs"], keepdims=0),
         helper.make_node("Add", ["acc", "rs"], ["acc_out"]),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "body", [vi("i", [], I64), vi("c", [], B), vi("acc", [], I64)],
        [vi("c_out", [], B), vi("acc_out", [], I64)],
        [const("zero", np.int64(0)), const("one", np.int64(1))])
    m = model([helper.make_node("Loop", ["n", "", "a0"], ["acc"], body=body)],
              [vi("n", [], I64)], [vi("acc", [], I64)], [const("a0", np.int64(0))])
    built = CpuModel.from_graph(optimize(import_onnx(m)))
    (path,) = built.build_info["control_flow"]
    assert path["path"] == "numpy" and "run time" in path["why"]
    for n in (0, 1, 6):
        feeds = {"n": np.array(n, np.int64)}
        assert built.run(feeds)["acc"] == onnxruntime_run(m, feeds)["acc"] == \
            sum(k * (k - 1) // 2 for k in range(n))


# ---- the .cel --------------------------------------------------------------------------------


def _control(doc):
    return next(s for s in doc["program"]["steps"] if s["kind"] == "control")


@pytest.mark.parametrize("edit, message", [
    (lambda s: s["bodies"]["body"]["steps"][0]["inputs"].__setitem__(0, "h0"),
     r"'h0' is neither a value nor a constant"),
    (lambda s: s["attrs"].__setitem__("scan_input_axes", [5, 0]),
     r"scan input 0's axis 5 is outside its rank 3"),
    (lambda s: s["bodies"].pop("body"), r"a Scan has \['body'\]"),
    (lambda s: s["bodies"]["body"]["outer"].append("s"), r"names an input or outer value twice|"
                                                          r"bound to"),
])
def test_edited_control_step_is_one_error_naming_the_field(edit, message, tmp_path):
    mdl, _ = scan_model(2, 3, 4, [0, 0], [0, 0], [0, 0], [0, 0])
    path = tmp_path / "s.cel"
    CpuModel.from_graph(optimize(import_onnx(mdl))).save(path)
    edit_manifest(path, lambda doc: edit(_control(doc)))
    with pytest.raises(ArtifactError, match=message) as e:
        CpuModel.load(path)
    assert "\n" not in str(e.value) and "program.steps[0]" in str(e.value)


def _mutate(step: dict, rng) -> None:
    """One random edit somewhere inside a control step: a value replaced or a list item
    dropped."""
    paths = []

    def walk(x, p):
        paths.append(p)
        for k, y in (x.items() if isinstance(x, dict) else
                     enumerate(x) if isinstance(x, list) else ()):
            walk(y, p + [k])
    walk(step, [])
    path = paths[1 + int(rng.integers(len(paths) - 1))]
    parent = step
    for k in path[:-1]:
        parent = parent[k]
    values = [None, 0, -1, 7, 2 ** 40, True, "", "x", "h0", "s", "float32", [], {}, [1, 2]]
    if isinstance(parent, list) and rng.random() < 0.2:
        del parent[path[-1]]
    else:
        parent[path[-1]] = values[int(rng.integers(len(values)))]


def test_mutated_control_steps_are_errors_not_tracebacks(tmp_path):
    """Seeded random edits of a Loop's control step (resealed, as a deliberate edit would
    be): loading and running give a CelosiaError or work, never another exception."""
    from celosia.errors import CelosiaError

    path = tmp_path / "l.cel"
    CpuModel.from_graph(optimize(import_onnx(rnn_loop(2, 4, 8, 3)))).save(path)
    original = path.read_bytes()
    feeds = rnn_feeds(2, 4, 8, 3)[0]
    rng = np.random.default_rng(7)
    for _ in range(120):
        path.write_bytes(original)
        edit_manifest(path, lambda doc: [_mutate(_control(doc), rng)
                                         for _ in range(int(rng.integers(1, 3)))])
        try:
            CpuModel.load(path).run(feeds)
        except CelosiaError:
            pass


def test_loop_carried_values_passed_on_and_crossed(tmp_path):
    """Carried values the body passes on unchanged or exchanges (a' = b, b' = a + b: a
    Fibonacci pair, and c' = c) are copied, not swapped; the results stay exact."""
    body = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["ab"]),
         helper.make_node("Identity", ["b"], ["b_on"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [vi("i", [], I64), vi("cond", [], B), vi("a", [3], I64), vi("b", [3], I64),
                 vi("c", [2, 2])],
        [vi("cond_out", [], B), vi("b_on", [3], I64), vi("ab", [3], I64), vi("c", [2, 2]),
         vi("ab", [3], I64)])
    m = model([helper.make_node("Loop", ["T", "", "a0", "b0", "c0"],
                                ["a_T", "b_T", "c_T", "abs"], body=body)],
              [vi("a0", [3], I64), vi("b0", [3], I64), vi("c0", [2, 2])],
              [vi("a_T", [3], I64), vi("b_T", [3], I64), vi("c_T", [2, 2]),
               vi("abs", [9, 3], I64)], [const("T", np.int64(9))])
    rng = np.random.default_rng(3)
    feeds = [{"a0": rng.integers(-5, 5, 3), "b0": rng.integers(-5, 5, 3),
              "c0": rng.normal(size=(2, 2)).astype(np.float32)} for _ in range(2)]
    check(m, feeds, tmp_path)


@pytest.mark.parametrize("x_shape, axis, hoisted", [
    ((6, 5), 0, True),        # rank 2: x_t is a vector
    ((3, 6, 5), 1, True),     # the time axis in the middle (batch first)
    ((2, 5, 6), -1, False),   # the last axis: x_t's columns are not a MatMul's rows
])
def test_projection_hoisting_axes(x_shape, axis, hoisted, tmp_path):
    """MatMul(Gather(x, i, axis), W) with an Add epilogue: hoisted when the axis is not the
    last one; the results agree either way."""
    rank = len(x_shape)
    t_axis = axis % rank
    feat = x_shape[-1] if hoisted else x_shape[-2]
    step_shape = x_shape[:t_axis] + x_shape[t_axis + 1:]
    out_shape = (*step_shape[:-1], 4)
    rng = np.random.default_rng(rank)
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["x_t"], axis=axis),
         helper.make_node("MatMul", ["x_t", "W"], ["p"]),
         helper.make_node("Add", ["p", "acc"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [vi("i", [], I64), vi("cond", [], B), vi("acc", list(out_shape))],
        [vi("cond_out", [], B), vi("acc_out", list(out_shape))])
    m = model([helper.make_node("Loop", ["T", "", "acc0"], ["acc_T"], name="loop", body=body)],
              [vi("x", list(x_shape))], [vi("acc_T", list(out_shape))],
              [const("T", np.int64(x_shape[t_axis])),
               const("W", rng.normal(size=(feat, 4)).astype(np.float32)),
               const("acc0", np.zeros(out_shape, np.float32))])
    feeds = [{"x": rng.normal(size=x_shape).astype(np.float32)} for _ in range(2)]
    built = check(m, feeds, tmp_path)
    assert any(s["node"] == "loop/proj0" for s in built.program.steps) == hoisted


def test_cel_with_numpy_control_steps_still_loads(tmp_path, monkeypatch):
    """A .cel written before bodies were compiled (the Loop a numpy step with its body in
    the attributes) loads and runs as before."""
    import celosia.compiler.cpu.lowering as lowering

    monkeypatch.setattr(lowering, "lower_control", lambda self, node: False)
    m = rnn_loop(1, 4, 8, 3)
    old = CpuModel.from_graph(optimize(import_onnx(m)))
    assert [s["kind"] for s in old.program.steps] == ["numpy"]
    old.save(tmp_path / "old.cel")
    monkeypatch.undo()
    feeds = rnn_feeds(1, 4, 8, 3)[0]
    got, want = CpuModel.load(tmp_path / "old.cel").run(feeds), onnxruntime_run(m, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_loop_with_a_convolution_body(tmp_path):
    """A 4-D carried value through a Conv + Relu + residual body (batch 2, odd H and W):
    the body's layouts (packed for the convolution, plain between iterations) compiled."""
    rng = np.random.default_rng(0)
    shape = [2, 8, 9, 7]
    body = helper.make_graph(
        [helper.make_node("Conv", ["h", "W", "bias"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Add", ["r", "x"], ["h_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [vi("i", [], I64), vi("cond", [], B), vi("h", shape)],
        [vi("cond_out", [], B), vi("h_out", shape), vi("r", shape)])
    m = model([helper.make_node("Loop", ["T", "", "x"], ["h_T", "rs"], name="loop",
                                body=body)],
              [vi("x", shape)], [vi("h_T", shape), vi("rs", [4, *shape])],
              [const("T", np.int64(4)),
               const("W", (rng.normal(size=(8, 8, 3, 3)) * 0.1).astype(np.float32)),
               const("bias", rng.normal(size=8).astype(np.float32))])
    built = check(m, [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(2)],
                  tmp_path)
    body_steps = next(s for s in built.program.steps if s["kind"] == "control")["bodies"]
    assert "Conv" in [s["op"] for s in body_steps["body"]["steps"] if s["kind"] == "kernel"]
