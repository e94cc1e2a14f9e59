"""An If whose condition is only known at run time, with a branch that does not fit the
input shapes being built for: Silero VAD's structure (an If on the sample rate; in each
branch, exporter shape tests (If on a size, If on the rank) before an LSTM cell whose Y is
not read, then Squeeze/Reshape of its state), written with onnx.helper. onnxruntime runs
the branch that fits and fails only when the other one runs; so must celosia."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import make_model, vi, onnxruntime_run as _onnxruntime

from celosia.compiler.frontend.onnx import SUPPORTED_OPS, import_onnx
from celosia.compiler.graph.ir import InputShapeError, NodeError, subgraphs
from celosia.compiler.graph.ops_control import UNBUILT_BRANCH
from celosia.compiler.graph.passes import optimize, remove_dead_code
from celosia.compiler.graph.reference import run_graph
from celosia.runtime.cpu import CpuModel

I64 = TensorProto.INT64
C, H = 5, 4  # features, hidden size

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _const(name, value):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.asarray(value), name))


def _branch(key, mean_over_time, rng):
    """x [N, C, T] -> (h [N, H], state [2, N, H]). One branch reduces time to 1 frame, the
    other keeps x: then the Squeeze is skipped and the rank test adds a dimension, and
    its LSTM gets a 5-D X, as Silero's 8 kHz branch does on 16 kHz-sized audio."""
    p = f"{key}/"
    n = [_const(p + "minus1", np.array([-1], np.int64)), _const(p + "one", np.int64(1)),
         _const(p + "two", np.int64(2)), _const(p + "axis0", np.array([0], np.int64)),
         _const(p + "i0", np.int64(0)), _const(p + "i1", np.int64(1)),
         _const(p + "hshape", np.array([-1, H], np.int64)),
         _const(p + "W", rng.normal(size=(1, 4 * H, C)).astype(np.float32)),
         _const(p + "R", rng.normal(size=(1, 4 * H, H)).astype(np.float32)),
         _const(p + "B", rng.normal(size=(1, 8 * H)).astype(np.float32))]
    if mean_over_time:
        n.append(helper.make_node("ReduceMean", ["x"], [p + "a"], axes=[2], keepdims=1))
    else:
        n.append(helper.make_node("Identity", ["x"], [p + "a"]))
    squeeze = helper.make_graph(
        [helper.make_node("Squeeze", [p + "a", p + "minus1"], [p + "sq"])], "squeeze", [],
        [vi(p + "sq", None)])
    keep = helper.make_graph([helper.make_node("Identity", [p + "a"], [p + "id"])], "keep",
                             [], [vi(p + "id", None)])
    add_batch = helper.make_graph(
        [helper.make_node("Unsqueeze", [p + "s", p + "axis0"], [p + "us"])], "unsqueeze", [],
        [vi(p + "us", None)])
    as_is = helper.make_graph([helper.make_node("Identity", [p + "s"], [p + "id2"])], "as_is",
                              [], [vi(p + "id2", None)])
    n += [helper.make_node("Shape", [p + "a"], [p + "shape"]),
          helper.make_node("Gather", [p + "shape", p + "minus1"], [p + "last"], axis=0),
          helper.make_node("Equal", [p + "last", p + "one"], [p + "single"]),
          helper.make_node("Squeeze", [p + "single"], [p + "single0"]),
          helper.make_node("If", [p + "single0"], [p + "s"], then_branch=squeeze,
                           else_branch=keep),
          helper.make_node("Shape", [p + "s"], [p + "sshape"]),
          helper.make_node("Size", [p + "sshape"], [p + "rank"]),
          helper.make_node("Equal", [p + "rank", p + "two"], [p + "is2"]),
          helper.make_node("Not", [p + "is2"], [p + "not2"]),
          helper.make_node("If", [p + "not2"], [p + "u"], then_branch=add_batch,
                           else_branch=as_is),
          helper.make_node("Unsqueeze", [p + "u", p + "axis0"], [p + "X"]),
          helper.make_node("Gather", ["state", p + "i0"], [p + "h"], axis=0),
          helper.make_node("Gather", ["state", p + "i1"], [p + "c"], axis=0),
          helper.make_node("Unsqueeze", [p + "h", p + "axis0"], [p + "h0"]),
          helper.make_node("Unsqueeze", [p + "c", p + "axis0"], [p + "c0"]),
          helper.make_node("LSTM", [p + "X", p + "W", p + "R", p + "B", "", p + "h0",
                                    p + "c0"], [p + "Y", p + "Yh", p + "Yc"], hidden_size=H),
          helper.make_node("Squeeze", [p + "Yh", p + "axis0"], [p + "hq"]),
          helper.make_node("Reshape", [p + "hq", p + "hshape"], [p + "out"]),
          helper.make_node("Concat", [p + "Yh", p + "Yc"], [p + "next"], axis=0)]
    return helper.make_graph(n, key, [], [vi(p + "out", None), vi(p + "next", None)])


def vad_like(then_means=True, else_means=False):
    rng = np.random.default_rng(7)
    then_b, else_b = _branch("t", then_means, rng), _branch("e", else_means, rng)
    nodes = [_const("rate", np.int64(16000)),
             helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["h", "next_state"], name="if",
                              then_branch=then_b, else_branch=else_b)]
    return make_model(nodes, [vi("x", ["n", C, "t"]), vi("state", [2, "n", H]),
                              vi("sr", [], I64)],
                      [vi("h", ["n", H]), vi("next_state", [2, "n", H])])


def _feeds(n, t, sr, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, C, t)).astype(np.float32),
            "state": rng.normal(size=(2, n, H)).astype(np.float32),
            "sr": np.array(sr, np.int64)}



def _assert_matches(got, want):
    assert list(got) == list(want)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, k
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


FAILS = (r"node 'if' \(If\): its else_branch, taken when the condition 'is16k' is False, "
         r"does not fit the input shapes this model was built for "
         r"\(node '[^']*LSTM[^']*' \(LSTM\): X float32\[1,1,3,5,2\] .* must be 3-D\); "
         r"feed inputs that select the other branch, or build for input shapes that fit "
         r"this one")


def test_the_branch_that_fits_runs_and_the_other_fails_when_taken(tmp_path):
    m = vad_like()
    shapes = {"x": (3, C, 2), "state": (2, 3, H), "sr": ()}
    built = CpuModel.build(m, shapes)
    for seed in range(3):
        feeds = _feeds(3, 2, 16000, seed)
        _assert_matches(built.run(feeds), _onnxruntime(m, feeds))
    # onnxruntime fails on the other branch at run time; celosia says why, in one line.
    feeds = _feeds(3, 2, 8000)
    with pytest.raises(Exception, match="LSTM"):
        _onnxruntime(m, feeds)
    with pytest.raises(InputShapeError, match=FAILS):
        built.run(feeds)
    # The same from a saved build.
    built.save(tmp_path / "vad.cel")
    loaded = CpuModel.load(tmp_path / "vad.cel")
    _assert_matches(loaded.run(_feeds(3, 2, 16000, 5)), _onnxruntime(m, _feeds(3, 2, 16000, 5)))
    with pytest.raises(InputShapeError, match=FAILS):
        loaded.run(feeds)


@pytest.mark.parametrize("n", [1, 2])
def test_both_branches_fit_one_frame(n):
    """With one frame both branches fit: no stand-in, both agree with onnxruntime."""
    m = vad_like()
    graph = import_onnx(m, {"x": (n, C, 1), "state": (2, n, H), "sr": ()})
    (node,) = [x for x in graph.nodes if x.op == "If"]
    assert not any(y.op == UNBUILT_BRANCH for _, b in subgraphs(node) for y in b.nodes)
    built = CpuModel.from_graph(optimize(graph))
    for sr in (16000, 8000):
        feeds = _feeds(n, 1, sr, seed=sr)
        _assert_matches(built.run(feeds), _onnxruntime(m, feeds))


def test_the_stand_in_is_typed_like_the_other_branch_and_is_no_onnx_operator():
    assert UNBUILT_BRANCH not in SUPPORTED_OPS
    graph = import_onnx(vad_like(), {"x": (3, C, 2), "state": (2, 3, H), "sr": ()})
    (node,) = [x for x in graph.nodes if x.op == "If"]
    then_b, else_b = node.attrs["then_branch"], node.attrs["else_branch"]
    assert [y.op for y in else_b.nodes] == [UNBUILT_BRANCH]
    assert [else_b.types[o] for o in else_b.outputs] == \
        [then_b.types[o] for o in then_b.outputs]
    assert [str(graph.types[o]) for o in node.outputs] == ["float32[3,4]", "float32[2,3,4]"]
    # The reference executor raises the same error.
    with pytest.raises(InputShapeError, match=FAILS):
        run_graph(optimize(graph), _feeds(3, 2, 8000))


def test_a_model_whose_branches_both_do_not_fit_does_not_build():
    m = vad_like(then_means=False, else_means=False)
    with pytest.raises(NodeError, match=r"\(LSTM\): X float32\[1,1,3,5,2\]"):
        import_onnx(m, {"x": (3, C, 2), "state": (2, 3, H), "sr": ()})


def test_an_unread_first_output_keeps_its_type():
    """remove_dead_code keeps a node's first output (LSTM's Y here) even when nobody reads
    it; its type must stay too (the verifier rejected the optimized graph)."""
    graph = import_onnx(vad_like(), {"x": (3, C, 1), "state": (2, 3, H), "sr": ()})
    (node,) = [x for x in remove_dead_code(graph).nodes if x.op == "If"]
    body = node.attrs["then_branch"]
    (lstm,) = [x for x in body.nodes if x.op == "LSTM"]
    assert str(body.types[lstm.outputs[0]]) == "float32[1,1,3,4]"
