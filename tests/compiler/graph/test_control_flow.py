"""If, Loop and Scan: import with bodies (outer scope visible), numpy reference, passes and
the CPU build (numpy steps, .cel round trip), against onnxruntime on seeded random inputs."""

from dataclasses import replace

import numpy as np
import pytest
from onnx_builders import make_model as model, onnxruntime_run, vi
from onnx import TensorProto, helper, numpy_helper

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.ir import (DynamicShapeError, GraphError, Node, NodeError,
                                       captured_inputs, print_graph, subgraphs, verify_graph)
from celosia.compiler.graph.passes import (eliminate_identities, fold_constants, optimize,
                                           remove_dead_code)
from celosia.compiler.graph.reference import run_graph
from celosia.runtime.cpu import CpuModel

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")



def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)



def body(nodes, inputs, outputs, inits=(), name="body"):
    return helper.make_graph(nodes, name, inputs, outputs, list(inits))



def assert_same(got: dict, want: dict, exact=False):
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, k
        if exact:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def check_everywhere(m, feeds, tmp_path, exact=False):
    """The imported graph, the optimized graph, the CPU build and its .cel round trip give
    onnxruntime's outputs; returns the optimized graph."""
    want = onnxruntime_run(m, feeds)
    graph = import_onnx(m)
    assert_same(run_graph(graph, feeds), want, exact)
    opt = optimize(graph)
    assert_same(run_graph(opt, feeds), want, exact)
    built = CpuModel.from_graph(opt)
    assert_same(built.run(feeds), want, exact)
    built.save(tmp_path / "m.cel")
    assert_same(CpuModel.load(tmp_path / "m.cel").run(feeds), want, exact)
    return opt


# ---- If ----------------------------------------------------------------------------------------


def if_model(cond_node):
    """y = x + w then relu, or x * x - w; z = a copy of the outer x, or 2 (a branch
    constant)."""
    then_b = body([helper.make_node("Add", ["x", "w"], ["t0"]),
                   helper.make_node("Relu", ["t0"], ["t1"]),
                   helper.make_node("Identity", ["x"], ["xc"])],
                  [], [vi("t1", [3, 4]), vi("xc", [3, 4])], name="then")
    else_b = body([helper.make_node("Mul", ["x", "x"], ["e0"]),
                   helper.make_node("Sub", ["e0", "w"], ["e1"]),
                   helper.make_node("Constant", [], ["two"],
                                    value=const("v", np.full((3, 4), 2, np.float32)))],
                  [], [vi("e1", [3, 4]), vi("two", [3, 4])], name="else")
    nodes = [cond_node, helper.make_node("If", ["c"], ["y", "z"], name="if",
                                         then_branch=then_b, else_branch=else_b)]
    w = np.random.default_rng(5).normal(size=(3, 4)).astype(np.float32)
    return model(nodes, [vi("x", [3, 4])], [vi("y", None), vi("z", None)],
                 [const("w", w), const("zero", np.float32(0))])


def run_time_if_model():
    m = if_model(helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0))
    m.graph.node.insert(1, helper.make_node("Greater", ["s", "zero"], ["c"]))
    return m


def test_if_run_time_condition(tmp_path):
    m = run_time_if_model()
    rng = np.random.default_rng(0)
    taken = set()
    for _ in range(6):
        x = rng.normal(size=(3, 4)).astype(np.float32)
        taken.add(bool(x.sum() > 0))
        opt = check_everywhere(m, {"x": x}, tmp_path)
    assert taken == {True, False}
    (node,) = [n for n in opt.nodes if n.op == "If"]
    assert captured_inputs(node) == ("x", "w")
    assert [k for k, _ in subgraphs(node)] == ["then_branch", "else_branch"]


@pytest.mark.parametrize("value", [True, False])
def test_if_compile_time_condition_inlines_the_branch(value, tmp_path):
    """At import (only the taken branch is imported) and in fold_constants (a condition
    that folding makes constant)."""
    m = if_model(helper.make_node("Constant", [], ["c"], value=const("c", np.array(value))))
    x = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    assert not any(n.op == "If" for n in import_onnx(m).nodes)
    opt = check_everywhere(m, {"x": x}, tmp_path)
    assert not any(n.op == "If" for n in opt.nodes)
    # A graph made elsewhere whose condition is a constant: fold_constants inlines.
    g = import_onnx(run_time_if_model())
    nodes = [n for n in g.nodes if n.op == "If"]
    inits = {**g.initializers, "c": np.array(value)}
    g = g.with_nodes(nodes, initializers=inits)
    folded = remove_dead_code(fold_constants(g))
    assert not any(n.op == "If" for n in folded.nodes)
    verify_graph(folded)
    assert_same(run_graph(folded, {"x": x}), run_graph(optimize(import_onnx(m)), {"x": x}))
    ops = [n.op for n in opt.nodes]
    # then: Add+Relu fused into nothing (no Conv/MatMul), x passed through an Identity;
    # else: Mul, Sub, and the constant 2 folded into the output.
    assert ops == (["Add", "Relu", "Identity"] if value else ["Mul", "Sub"])
    if not value:
        np.testing.assert_array_equal(opt.initializers["z"], np.full((3, 4), 2, np.float32))


def test_if_branches_of_different_shapes():
    then_b = body([helper.make_node("Identity", ["x"], ["t"])], [], [vi("t", None)])
    else_b = body([helper.make_node("Concat", ["x", "x"], ["e"], axis=0)], [], [vi("e", None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_b,
                              else_branch=else_b)]
    m = model(nodes, [vi("x", [2, 3])], [vi("y", None)], [const("zero", np.float32(0))])
    with pytest.raises(DynamicShapeError, match=r"node 'if' \(If\): output 0 is "
                       r"float32\[2,3\] in then_branch but float32\[4,3\] in else_branch.*"
                       r"run-time shaped") as e:
        import_onnx(m)
    assert e.value.inputs == ["x"]  # what the condition depends on: bind_inputs takes them
    # A constant condition: only the taken branch's shape matters.
    nodes[:2] = [helper.make_node("Constant", [], ["c"], value=const("c", np.array(False)))]
    m = model(nodes, [vi("x", [2, 3])], [vi("y", None)])
    g = import_onnx(m)
    assert g.types["y"].shape == (4, 3)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_graph(optimize(g), {"x": x})["y"], np.concatenate([x, x]))


def test_printer_shows_bodies_and_verifier_checks_them():
    g = import_onnx(run_time_if_model())
    text = print_graph(g).splitlines()
    assert text[5] == "  %y, %z = If(%c, %x, %w) : float32[3,4], float32[3,4]"
    assert text[6] == "    then_branch = graph if/then_branch(outer %x: float32[3,4], " \
                      "%w: float32[3,4]) {"
    assert text[7] == "      %t0 = Add(%x, %w) : float32[3,4]"
    assert "    else_branch = graph if/else_branch(outer %x: float32[3,4], " \
           "%w: float32[3,4]) {" in text
    verify_graph(g)
    (node,) = [n for n in g.nodes if n.op == "If"]
    bad = node.with_attrs(then_branch=subgraphs(node)[0][1].with_nodes([]))
    with pytest.raises(GraphError, match="output 't1' is never defined"):
        verify_graph(g.with_nodes([bad if n is node else n for n in g.nodes]))
    else_b = subgraphs(node)[1][1]
    extra = replace(else_b, outer=else_b.outer + ("extra",),
                    types={**else_b.types, "extra": else_b.types["x"]})
    short = node.with_attrs(else_branch=extra)
    with pytest.raises(GraphError, match="its else_branch reads 3 outer values, the node "
                                         "passes 2"):
        verify_graph(g.with_nodes([short if n is node else n for n in g.nodes]))


# ---- Loop --------------------------------------------------------------------------------------


def counted_loop(trip=("M", 5), scan=True):
    """acc = acc * 0.5 + x * i (x from the enclosing graph) for i < M; scans acc and i."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Mul", ["x", "fi"], ["xi"]),
             helper.make_node("Mul", ["acc", "half"], ["a0"]),
             helper.make_node("Add", ["a0", "xi"], ["acc_out"]),
             helper.make_node("Identity", ["cond"], ["cond_out"]),
             helper.make_node("Identity", ["acc_out"], ["scan_acc"]),
             helper.make_node("Identity", ["i"], ["scan_i"])]
    outs = [vi("cond_out", [], B), vi("acc_out", [2, 3])]
    if scan:
        outs += [vi("scan_acc", [2, 3]), vi("scan_i", [], I64)]
    b = body(nodes, [vi("i", [], I64), vi("cond", [], B), vi("acc", [2, 3])], outs,
             [const("half", np.float32(0.5))])
    name, value = trip
    inits = [const(name, np.int64(value))] if value is not None else []
    inputs = [vi("x", [2, 3])] + ([vi(name, [], I64)] if value is None else [])
    loop_outs = [vi("acc_final", None)] + ([vi("accs", None), vi("iters", None, I64)]
                                           if scan else [])
    loop = helper.make_node("Loop", [name, "", "acc0"], [o.name for o in loop_outs],
                            name="loop", body=b)
    return model([loop], inputs, loop_outs,
                 inits + [const("acc0", np.ones((2, 3), np.float32))])


def test_loop_counted_with_scan_outputs(tmp_path):
    x = np.random.default_rng(2).normal(size=(2, 3)).astype(np.float32)
    opt = check_everywhere(counted_loop(), {"x": x}, tmp_path)
    assert opt.types["accs"].shape == (5, 2, 3) and opt.types["iters"].shape == (5,)
    # The body's Identity copies are gone, except those that are its outputs.
    (loop,) = opt.nodes
    ops = [n.op for n in loop.attrs["body"].nodes]
    assert ops.count("Identity") == 3 and captured_inputs(loop) == ("x",)


def test_loop_zero_iterations(tmp_path):
    x = np.ones((2, 3), np.float32)
    opt = check_everywhere(counted_loop(("M", 0)), {"x": x}, tmp_path)
    assert opt.types["accs"].shape == (0, 2, 3)


def test_loop_run_time_trip_count(tmp_path):
    """Carried values only: any trip count at run time. Scan outputs need it at compile time."""
    m = counted_loop(("n", None), scan=False)
    x = np.random.default_rng(3).normal(size=(2, 3)).astype(np.float32)
    for n in (0, 1, 7):
        check_everywhere(m, {"x": x, "n": np.array(n, np.int64)}, tmp_path)
    with pytest.raises(DynamicShapeError, match=r"node 'loop' \(Loop\): its trip count 'n' is "
                       r"only known at run time \(it depends on the inputs \['n'\]\)"):
        import_onnx(counted_loop(("n", None), scan=True))
    g = import_onnx(counted_loop(("n", None), scan=True), bind_inputs={"n": np.int64(4)})
    assert g.types["accs"].shape == (4, 2, 3)


def while_loop(with_trip):
    """v = v * 0.9 + b until sum(v) < limit (the condition computed in the body), at most M
    times; counts the iterations."""
    nodes = [helper.make_node("Mul", ["v", "decay"], ["v0"]),
             helper.make_node("Add", ["v0", "b"], ["v_out"]),
             helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
             helper.make_node("Less", ["limit", "s"], ["go"]),
             helper.make_node("Add", ["k", "one"], ["k_out"])]
    b = body(nodes, [vi("i", [], I64), vi("cond", [], B), vi("v", [4]), vi("k", [], I64)],
             [vi("go", [], B), vi("v_out", [4]), vi("k_out", [], I64)],
             [const("decay", np.float32(0.9)), const("one", np.int64(1))])
    loop = helper.make_node("Loop", ["M" if with_trip else "", "c0", "v0_in", "k0"],
                            ["v_final", "k_final"], name="loop", body=b)
    return model([loop], [vi("v0_in", [4]), vi("b", [4]), vi("limit", [])],
                 [vi("v_final", None), vi("k_final", None, I64)],
                 [const("M", np.int64(20)), const("c0", np.array(True)),
                  const("k0", np.int64(0))])


@pytest.mark.parametrize("with_trip", [True, False])
def test_loop_with_a_condition(with_trip, tmp_path):
    rng = np.random.default_rng(4)
    counts = set()
    for limit in (100.0, 10.0, 8.5):
        feeds = {"v0_in": rng.uniform(2, 4, size=4).astype(np.float32),
                 "b": np.full(4, 0.2, np.float32), "limit": np.array(limit, np.float32)}
        check_everywhere(while_loop(with_trip), feeds, tmp_path, exact=True)
        counts.add(int(run_graph(import_onnx(while_loop(with_trip)), feeds)["k_final"]))
    assert len(counts) == 3  # the condition ended the loop after different counts


def test_loop_whose_carried_value_grows_is_an_error():
    b = body([helper.make_node("Concat", ["v", "v"], ["v2"], axis=0),
              helper.make_node("Identity", ["cond"], ["c"])],
             [vi("i", [], I64), vi("cond", [], B), vi("v", None)],
             [vi("c", [], B), vi("v2", None)])
    m = model([helper.make_node("Loop", ["M", "", "x"], ["y"], name="loop", body=b)],
              [vi("x", [2])], [vi("y", None)], [const("M", np.int64(3))])
    with pytest.raises(DynamicShapeError, match=r"carried value 0 \('x'\) is float32\[2\] "
                       r"before the loop but the body makes it float32\[4\]"):
        import_onnx(m)


def test_loop_with_a_computed_condition_cannot_have_scan_outputs():
    b = body([helper.make_node("Less", ["i", "three"], ["c"]),
              helper.make_node("Identity", ["v"], ["v_out"]),
              helper.make_node("Identity", ["v"], ["s"])],
             [vi("i", [], I64), vi("cond", [], B), vi("v", [2])],
             [vi("c", [], B), vi("v_out", [2]), vi("s", [2])], [const("three", np.int64(3))])
    m = model([helper.make_node("Loop", ["M", "", "x"], ["y", "ys"], name="loop", body=b)],
              [vi("x", [2])], [vi("y", None), vi("ys", None)], [const("M", np.int64(9))])
    with pytest.raises(DynamicShapeError, match="one row per iteration"):
        import_onnx(m)


# ---- Scan --------------------------------------------------------------------------------------


def scan_model():
    """Two states (a running sum and a running max), two scan inputs (one read backwards,
    along axis 1), two scan outputs (one stacked along axis 1 in reverse)."""
    nodes = [helper.make_node("Add", ["sum_in", "a_t"], ["sum_out"]),
             helper.make_node("Max", ["max_in", "b_t"], ["max_out"]),
             helper.make_node("Mul", ["sum_out", "w"], ["y_t"]),
             helper.make_node("Sub", ["max_out", "a_t"], ["z_t"])]
    b = body(nodes, [vi("sum_in", [3]), vi("max_in", [3]), vi("a_t", [3]), vi("b_t", [3])],
             [vi("sum_out", [3]), vi("max_out", [3]), vi("y_t", [3]), vi("z_t", [3])])
    scan = helper.make_node("Scan", ["s0", "m0", "a", "b"], ["s", "m", "y", "z"], name="scan",
                            body=b, num_scan_inputs=2, scan_input_axes=[0, -1],
                            scan_input_directions=[0, 1], scan_output_axes=[0, -1],
                            scan_output_directions=[0, 1])
    return model([scan], [vi("a", [5, 3]), vi("b", [3, 5])],
                 [vi(o, None) for o in ("s", "m", "y", "z")],
                 [const("s0", np.zeros(3, np.float32)), const("m0", np.full(3, -9, np.float32)),
                  const("w", np.float32(0.5) * np.arange(3, dtype=np.float32))])


def test_scan_axes_and_directions(tmp_path):
    rng = np.random.default_rng(6)
    feeds = {"a": rng.normal(size=(5, 3)).astype(np.float32),
             "b": rng.normal(size=(3, 5)).astype(np.float32)}
    opt = check_everywhere(scan_model(), feeds, tmp_path)
    (node,) = opt.nodes
    assert node.attrs["scan_input_axes"] == [0, 1] and node.attrs["scan_output_axes"] == [0, 1]
    assert opt.types["z"].shape == (3, 5)


# ---- nested control flow -----------------------------------------------------------------------


def nested_model():
    """A Loop whose body holds an If (on the iteration's parity) whose branches read the
    loop's carried value and a value two scopes out; the loop scans the If's result."""
    then_b = body([helper.make_node("Add", ["h", "w"], ["t"])], [], [vi("t", [4])], name="th")
    else_b = body([helper.make_node("Mul", ["h", "w"], ["e"])], [], [vi("e", [4])], name="el")
    loop_body = body(
        [helper.make_node("Div", ["i", "two"], ["half_i"]),
         helper.make_node("Mul", ["half_i", "two"], ["even_i"]),
         helper.make_node("Equal", ["even_i", "i"], ["even"]),
         helper.make_node("If", ["even"], ["h_out"], name="pick", then_branch=then_b,
                          else_branch=else_b),
         helper.make_node("Tanh", ["h_out"], ["h_next"]),
         helper.make_node("Identity", ["cond"], ["c"]),
         helper.make_node("Identity", ["h_next"], ["h_scan"])],
        [vi("i", [], I64), vi("cond", [], B), vi("h", [4])],
        [vi("c", [], B), vi("h_next", [4]), vi("h_scan", [4])],
        [const("two", np.int64(2))])
    loop = helper.make_node("Loop", ["M", "", "x"], ["h_final", "hs"], name="loop",
                            body=loop_body)
    w = np.random.default_rng(7).normal(size=4).astype(np.float32)
    return model([loop], [vi("x", [4])], [vi("h_final", None), vi("hs", None)],
                 [const("M", np.int64(6)), const("w", w)])


def test_nested_loop_and_if(tmp_path):
    x = np.random.default_rng(8).normal(size=4).astype(np.float32)
    opt = check_everywhere(nested_model(), {"x": x}, tmp_path)
    (loop,) = opt.nodes
    assert captured_inputs(loop) == ("w",)  # read by the If inside, passed through the body
    (pick,) = [n for n in loop.attrs["body"].nodes if n.op == "If"]
    assert pick.name == "loop/body/pick" and captured_inputs(pick) == ("h", "w")


def test_passes_treat_values_read_in_bodies_as_live():
    """A value only a body reads survives dead code elimination; an Identity whose output
    a body reads is bypassed (the node passes its input instead); an outer value no body
    reads any more after a pass stops being passed."""
    then_b = body([helper.make_node("Add", ["xi", "w"], ["t"])], [], [vi("t", [3])])
    else_b = body([helper.make_node("Neg", ["xi"], ["e"])], [], [vi("e", [3])])
    nodes = [helper.make_node("Identity", ["x"], ["xi"]),
             helper.make_node("Exp", ["x"], ["unused"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_b,
                              else_branch=else_b)]
    m = model(nodes, [vi("x", [3])], [vi("y", None)],
              [const("zero", np.float32(0)), const("w", np.ones(3, np.float32))])
    g = import_onnx(m)
    g2 = remove_dead_code(eliminate_identities(g))
    assert [n.op for n in g2.nodes] == ["ReduceSum", "Greater", "If"]
    (node,) = [n for n in g2.nodes if n.op == "If"]
    assert node.inputs == ("c", "x", "w") and "w" in g2.initializers
    # Drop the then branch's use of w: w is no longer passed, nor kept.
    then2 = subgraphs(node)[0][1]
    then2 = then2.with_nodes([Node("Identity", ("xi",), ("t",), {}, "copy")])
    g3 = remove_dead_code(g2.with_nodes([n.with_attrs(then_branch=then2) if n is node else n
                                         for n in g2.nodes]))
    (node,) = [n for n in g3.nodes if n.op == "If"]
    assert node.inputs == ("c", "x") and "w" not in g3.initializers
    assert all(b.outer == ("xi",) for _, b in subgraphs(node))
    verify_graph(g3)
    for x in (np.array([1, 2, 3], np.float32), np.array([-1, -2, 0], np.float32)):
        np.testing.assert_array_equal(run_graph(g3, {"x": x})["y"], x if x.sum() > 0 else -x)


def test_fold_constants_runs_a_constant_loop():
    m = counted_loop(("M", 3))
    m.graph.input.pop()
    m.graph.initializer.append(const("x", np.ones((2, 3), np.float32)))
    g = fold_constants(import_onnx(m))
    assert not g.nodes and g.initializers["accs"].shape == (3, 2, 3)


def test_unsupported_operator_inside_a_body_is_named():
    b = body([helper.make_node("StringNormalizer", ["x"], ["d"]),
              helper.make_node("Identity", ["cond"], ["c"])],
             [vi("i", [], I64), vi("cond", [], B)], [vi("c", [], B)])
    m = model([helper.make_node("Loop", ["M", ""], [], name="loop", body=b)],
              [vi("x", [2, 2])], [], [const("M", np.int64(1))])
    with pytest.raises(GraphError, match=r"StringNormalizer: 1 node \('loop/body/StringNormalizer_0'\)"):
        import_onnx(m)


def test_run_time_failure_inside_a_body_names_the_body_node():
    b = body([helper.make_node("Gather", ["x", "i"], ["g"], axis=0),
              helper.make_node("Identity", ["cond"], ["c"])],
             [vi("i", [], I64), vi("cond", [], B)], [vi("c", [], B), vi("g", [])])
    m = model([helper.make_node("Loop", ["n", ""], ["gs"], name="loop", body=b)],
              [vi("x", [3]), vi("n", [], I64)], [vi("gs", None)])
    g = import_onnx(m, bind_inputs={"n": np.int64(5)})
    with pytest.raises(NodeError, match=r"node 'loop/body/Gather_0' \(Gather\): failed at run"):
        run_graph(g, {"x": np.zeros(3, np.float32)})


def test_passes_run_inside_bodies(tmp_path):
    """A Scan body with its own weights: shape arithmetic folded, the MatMul's bias and Relu
    fused into it, the Identity bypassed, all inside the body."""
    rng = np.random.default_rng(9)
    w = rng.normal(size=(4, 4)).astype(np.float32)
    b = rng.normal(size=4).astype(np.float32)
    nodes = [helper.make_node("Shape", ["x_t"], ["shp"]),
             helper.make_node("Reshape", ["x_t", "shp"], ["x_r"]),
             helper.make_node("Identity", ["x_r"], ["x_i"]),
             helper.make_node("Add", ["h", "x_i"], ["hx"]),
             helper.make_node("MatMul", ["hx", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["mb"]),
             helper.make_node("Relu", ["mb"], ["h_next"]),
             helper.make_node("Identity", ["h_next"], ["y_t"])]
    sb = body(nodes, [vi("h", [2, 4]), vi("x_t", [2, 4])], [vi("h_next", [2, 4]),
                                                             vi("y_t", [2, 4])],
              [const("w", w), const("b", b)])
    scan = helper.make_node("Scan", ["h0", "xs"], ["h", "ys"], name="scan", body=sb,
                            num_scan_inputs=1)
    m = model([scan], [vi("h0", [2, 4]), vi("xs", [5, 2, 4])], [vi("h", None), vi("ys", None)])
    feeds = {"h0": rng.normal(size=(2, 4)).astype(np.float32),
             "xs": rng.normal(size=(5, 2, 4)).astype(np.float32)}
    opt = check_everywhere(m, feeds, tmp_path)
    (node,) = opt.nodes
    inner = node.attrs["body"]
    assert [n.op for n in inner.nodes] == ["Reshape", "Add", "MatMul", "Identity"]
    (matmul,) = [n for n in inner.nodes if n.op == "MatMul"]
    assert [s[0] for s in matmul.attrs["epilogue"]] == ["Add", "Relu"]
    assert set(inner.initializers) == {"w", "b"}
    verify_graph(opt)


def test_if_on_a_shape_imports_only_the_taken_branch():
    """Exporters test shapes with If; the branch not taken may be invalid for the shapes
    given (here a Squeeze of an axis of size 2): it is not imported."""
    then_b = body([helper.make_node("Squeeze", ["x", "axis0"], ["t"])], [], [vi("t", None)])
    else_b = body([helper.make_node("Relu", ["x"], ["e"])], [], [vi("e", None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["d0"], axis=0),
             helper.make_node("Equal", ["d0", "one"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_b,
                              else_branch=else_b)]
    m = model(nodes, [vi("x", ["n", 3])], [vi("y", None)],
              [const("zero", np.int64(0)), const("one", np.int64(1)),
               const("axis0", np.array([0], np.int64))])
    g = import_onnx(m, {"x": (2, 3)})
    assert [n.op for n in g.nodes] == ["Shape", "Gather", "Equal", "Relu"]
    g = import_onnx(m, {"x": (1, 3)})
    assert g.types["y"].shape == (3,)
    x = np.random.default_rng(10).normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_array_equal(run_graph(optimize(import_onnx(m, {"x": (2, 3)})),
                                            {"x": x})["y"], np.maximum(x, 0))


def test_malformed_control_flow_nodes_are_node_errors():
    b = body([helper.make_node("Identity", ["cond"], ["c_out"])],
             [vi("i", [], I64), vi("cond", [], B)], [vi("c_out", [], B)])
    cases = [
        (helper.make_node("If", ["c"], ["y"], name="bad", then_branch=b),
         r"If\): .*'else_branch' is (required but )?missing"),
        (helper.make_node("Loop", ["M", "", "x"], ["y"], name="bad", body=b),
         r"Loop\): (its body takes 2 inputs .* the node passes 3|Graph has 2 inputs but 3 "
         r"were provided)"),
        (helper.make_node("Scan", ["x"], ["y"], name="bad", body=b),
         r"Scan\): .*'num_scan_inputs' is (required but )?missing"),
    ]
    for node, message in cases:
        m = model([node], [vi("x", [2]), vi("c", [], B)], [vi("y", None)],
                  [const("M", np.int64(2))])
        with pytest.raises(GraphError, match=r"node 'bad' \(" + message):
            import_onnx(m)


def test_inlined_branch_values_get_fresh_names():
    """A branch value named like the If's own output (or any enclosing value) is renamed
    when the branch is inlined at import."""
    then_b = body([helper.make_node("Neg", ["x"], ["y"]),
                   helper.make_node("Exp", ["y"], ["x2"])], [], [vi("x2", None)])
    nodes = [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_b,
                              else_branch=then_b)]
    m = model(nodes, [vi("x", [3])], [vi("y", None)], [const("c", np.array(True))])
    g = import_onnx(m)
    verify_graph(g)
    assert [n.outputs for n in g.nodes] == [("y_1",), ("y",)]
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], np.exp(-x))
