"""Small operators of an If body as the main graph's (Silero VAD's then_branch): numpy steps
bound as copies between views or one numpy call (runtime/fast_steps.py), Sqrt as an
element-wise kernel, 1-D convolutions rewritten onto the 2-D kernels inside bodies, and a
body's consecutive kernels as one native call. Each operator on seeded random inputs of odd
sizes, in the main graph and inside an If's branch, bit for bit against the numpy
reference (and onnxruntime); a small model of Silero's structure against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import make_model, vi, onnxruntime_run as _onnxruntime

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.reference import run_graph
from celosia.runtime import executor
from celosia.runtime.cpu import CpuModel

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _const(name, a):
    return numpy_helper.from_array(np.asarray(a), name)



def _no_generic_numpy(monkeypatch, ops):
    """Fail if a numpy step of ``ops`` runs through evaluate_node (the generic path)."""
    real = executor.evaluate_node

    def guarded(node, inputs):
        assert node.op not in ops, f"{node.op} ran as a generic numpy step"
        return real(node, inputs)
    monkeypatch.setattr(executor, "evaluate_node", guarded)


def _in_if(nodes, inputs, out, out_shape, out_elem, inits):
    """The same nodes in the then_branch of an If on a bool input (else: their copy with
    renamed values), inputs read from the outer scope."""
    def branch(suffix):
        ren = {v.name: v.name for v in inputs} | {i.name: i.name for i in inits}
        body = []
        for n in nodes:
            outs = [o + suffix for o in n.output]
            ren.update(zip(n.output, outs))
            body.append(helper.make_node(n.op_type, [ren.get(i, i) for i in n.input], outs,
                                         name=n.name + suffix if n.name else "",
                                         **{a.name: helper.get_attribute_value(a)
                                            for a in n.attribute}))
        return helper.make_graph(body, "b" + suffix, [],
                                 [vi(out + suffix, out_shape, out_elem)])
    node = helper.make_node("If", ["cond"], [out], then_branch=branch("_t"),
                            else_branch=branch("_e"))
    return make_model([node], [vi("cond", [], B), *inputs], [vi(out, out_shape, out_elem)],
                      inits)


def _check(m, feeds, compiled_if=False):
    """The build against the numpy reference, bit for bit, and onnxruntime."""
    graph = optimize(import_onnx(m))
    built = CpuModel.from_graph(graph)
    if compiled_if:
        paths = {c["op"]: c["path"] for c in built.build_info["control_flow"]}
        assert paths == {"If": "compiled"}, built.build_info["control_flow"]
    got, want, theirs = built.run(feeds), run_graph(graph, feeds), _onnxruntime(m, feeds)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        np.testing.assert_array_equal(got[k], w, err_msg=k)
        assert got[k].tobytes() == w.tobytes(), k  # (bit for bit: signed zeros too)
        np.testing.assert_allclose(got[k], theirs[k], rtol=1e-6, atol=1e-6, err_msg=k)
    return built


def _both(monkeypatch, nodes, inputs, out, out_shape, feeds, inits=(), out_elem=F,
          generic=()):
    """One operator's nodes in the main graph and in an If (both branches taken)."""
    _no_generic_numpy(monkeypatch, generic)
    _check(make_model(nodes, inputs, [vi(out, out_shape, out_elem)], inits), feeds)
    m = _in_if(nodes, inputs, out, out_shape, out_elem, inits)
    for cond in (True, False):
        _check(m, {**feeds, "cond": np.array(cond)}, compiled_if=True)


RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 5, 7)).astype(np.float32)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1], [4], [1], [1]),           # one axis, a band
    ([0], [2**63 - 1], [2], [1]),   # the whole axis (Silero's no-op Slices)
    ([-5], [7], [2], [2]),          # negative start, a stride
    ([6], [-8], [2], [-2]),         # backwards
    ([0, 1], [2, 5], [0, 2], [1, 3]),
])
def test_slice(monkeypatch, starts, ends, axes, steps):
    inits = [_const("s", np.array(starts)), _const("e", np.array(ends)),
             _const("a", np.array(axes)), _const("st", np.array(steps))]
    want = X[tuple(slice(*next(((s, e, st) for s, e, a, st in zip(starts, ends, axes, steps)
                                if a == ax), (None, None, None))) for ax in range(3))]
    _both(monkeypatch, [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])],
          [vi("x", list(X.shape))], "y", list(want.shape), {"x": X}, inits,
          generic=("Slice",))


@pytest.mark.parametrize("mode, pads", [
    ("reflect", [0, 0, 0, 0, 0, 5]),   # Silero's STFT padding: the end of the last axis
    ("reflect", [1, 2, 3, 1, 0, 6]),
    ("edge", [2, 0, 1, 0, 3, 4]),
    ("constant", [0, 1, 2, 1, 0, 3]),
])
def test_pad(monkeypatch, mode, pads):
    inits = [_const("p", np.array(pads)), _const("v", np.array(1.5, np.float32))]
    shape = [d + pads[i] + pads[i + 3] for i, d in enumerate(X.shape)]
    ins = ["x", "p", "v"] if mode == "constant" else ["x", "p"]
    _both(monkeypatch, [helper.make_node("Pad", ins, ["y"], mode=mode)],
          [vi("x", list(X.shape))], "y", shape, {"x": X}, inits, generic=("Pad",))


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat(monkeypatch, axis):
    z = RNG.standard_normal(tuple(d + 2 if k == axis % 3 else d
                                  for k, d in enumerate(X.shape))).astype(np.float32)
    want = np.concatenate([X, z, X], axis=axis)
    _both(monkeypatch, [helper.make_node("Concat", ["x", "z", "x"], ["y"], axis=axis)],
          [vi("x", list(X.shape)), vi("z", list(z.shape))], "y", list(want.shape),
          {"x": X, "z": z}, generic=("Concat",))


@pytest.mark.parametrize("axis, index", [(0, 2), (1, -2), (2, 6)])
def test_gather_of_a_constant_index(monkeypatch, axis, index):
    shape = [d for k, d in enumerate(X.shape) if k != axis]
    _both(monkeypatch, [helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)],
          [vi("x", list(X.shape))], "y", shape, {"x": X}, [_const("i", np.array(index))],
          generic=("Gather",))


@pytest.mark.parametrize("op, axes, keepdims", [("ReduceMean", [1], 0), ("ReduceMean", [2], 1),
                                                ("ReduceMean", [0, 2], 0),
                                                ("ReduceSum", [1], 1)])
def test_reduce_over_axes(monkeypatch, op, axes, keepdims):
    x = X.copy()
    x[0, :, 0] = -0.0  # a mean of negative zeros is +0 in numpy
    want = np.mean(x, axis=tuple(axes), keepdims=bool(keepdims))
    if op == "ReduceSum":  # (axes an input since opset 13)
        node, inits = helper.make_node(op, ["x", "ax"], ["y"], keepdims=keepdims), \
            [_const("ax", np.array(axes))]
    else:
        node, inits = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims), []
    _both(monkeypatch, [node], [vi("x", list(X.shape))], "y", list(want.shape), {"x": x},
          inits, generic=(op,))


def test_equal_of_a_scalar(monkeypatch):
    for sr in (16000, 8000):
        _both(monkeypatch, [helper.make_node("Equal", ["sr", "k"], ["y"])], [vi("sr", [], I64)],
              "y", [], {"sr": np.array(sr)}, [_const("k", np.array(16000))], out_elem=B,
              generic=("Equal",))


@pytest.mark.parametrize("perm", [[0, 2, 1], [2, 0, 1], [1, 0, 2]])
def test_transpose(monkeypatch, perm):
    shape = [X.shape[p] for p in perm]
    _both(monkeypatch, [helper.make_node("Transpose", ["x"], ["y"], perm=perm)],
          [vi("x", list(X.shape))], "y", shape, {"x": X}, generic=("Transpose",))


def test_sqrt_is_a_kernel(monkeypatch):
    x = np.abs(X) * 3
    _both(monkeypatch, [helper.make_node("Sqrt", ["x"], ["y"])], [vi("x", list(X.shape))],
          "y", list(X.shape), {"x": x}, generic=("Sqrt",))


# ---- a model of Silero VAD's structure -------------------------------------------------------

def _silero_like(hidden=8, length=120):
    """If (sr == 16000) of: reflect Pad, a strided 1-D conv as STFT (a product of windows), Slices into real and
    imaginary parts, Pow/Add/Sqrt magnitude, a 1-D conv + Relu encoder, ReduceMean over time,
    an LSTM step from a Gather of the state, the state's Concat, a 1-D conv + Sigmoid head and
    a ReduceMean; else a copy of the state and zero."""
    r = np.random.default_rng(3)
    w = lambda *s: (r.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    H, E = hidden, 6
    inits = [
        _const("pads", np.array([0, 0, 0, 8])), _const("ax1", np.array([1])),
        _const("ax0", np.array([0])), _const("ax01", np.array([0, 1])),
        _const("w_stft", w(10, 1, 32)), _const("w_enc", w(E, 5, 3)), _const("b_enc", w(E)),
        _const("W", w(1, 4 * H, E)), _const("R", w(1, 4 * H, H)), _const("Bl", w(1, 8 * H)),
        _const("w_head", w(1, H, 1)), _const("b_head", w(1)),
        _const("s0", np.array([0])), _const("s5", np.array([5])),
        _const("s10", np.array([10])), _const("two", np.array(2.0, np.float32)),
        _const("i0", np.array(0)), _const("i1", np.array(1)), _const("k", np.array(16000)),
        _const("zero", np.zeros(1, np.float32)), _const("ax2", np.array([2])),
    ]
    n = helper.make_node
    then = [
        n("Pad", ["x", "pads"], ["p"], mode="reflect"),
        n("Unsqueeze", ["p", "ax1"], ["u"]),
        n("Conv", ["u", "w_stft"], ["c"], strides=[16]),  # 7 windows: a product
        n("Slice", ["c", "s0", "s5", "ax1"], ["re"]),
        n("Slice", ["c", "s5", "s10", "ax1"], ["im"]),
        n("Pow", ["re", "two"], ["re2"]), n("Pow", ["im", "two"], ["im2"]),
        n("Add", ["re2", "im2"], ["m2"]), n("Sqrt", ["m2"], ["mag"]),
        n("Conv", ["mag", "w_enc", "b_enc"], ["ec"], pads=[1, 1], strides=[2]),
        n("Relu", ["ec"], ["e"]),
        n("ReduceMean", ["e"], ["em"], axes=[2], keepdims=0),
        n("Unsqueeze", ["em", "ax0"], ["seq"]),
        n("Gather", ["state", "i0"], ["h0g"]), n("Gather", ["state", "i1"], ["c0g"]),
        n("Unsqueeze", ["h0g", "ax0"], ["h0"]), n("Unsqueeze", ["c0g", "ax0"], ["c0"]),
        n("LSTM", ["seq", "W", "R", "Bl", "", "h0", "c0"], ["Y", "Yh", "Yc"], hidden_size=H),
        n("Concat", ["Yh", "Yc"], ["new_state_t"], axis=0),
        n("Squeeze", ["Y", "ax01"], ["y2"]), n("Unsqueeze", ["y2", "ax2"], ["y3"]),
        n("Conv", ["y3", "w_head", "b_head"], ["hc"]), n("Sigmoid", ["hc"], ["hs"]),
        n("Squeeze", ["hs", "ax2"], ["h2"]),
        n("ReduceMean", ["h2"], ["prob_t"], axes=[1], keepdims=0),
    ]
    outs_t = [vi("prob_t", [1]), vi("new_state_t", [2, 1, H])]
    els = [n("Identity", ["zero"], ["prob_e"]), n("Identity", ["state"], ["new_state_e"])]
    outs_e = [vi("prob_e", [1]), vi("new_state_e", [2, 1, H])]
    nodes = [n("Equal", ["sr", "k"], ["cond"]),
             n("If", ["cond"], ["prob", "new_state"],
               then_branch=helper.make_graph(then, "then", [], outs_t),
               else_branch=helper.make_graph(els, "else", [], outs_e))]
    return make_model(nodes, [vi("x", [1, length]), vi("state", [2, 1, H]), vi("sr", [], I64)],
                      [vi("prob", [1]), vi("new_state", [2, 1, H])], inits)


def test_silero_structure_against_onnxruntime(monkeypatch):
    _no_generic_numpy(monkeypatch, ("Pad", "Slice", "Gather", "Concat", "ReduceMean", "Equal",
                                    "Sqrt", "Conv", "Pow", "Transpose"))
    m = _silero_like()
    graph = optimize(import_onnx(m))
    built = CpuModel.from_graph(graph)
    control = built.program.steps[[s["kind"] for s in built.program.steps].index("control")]
    kinds = {(s["op"], s["kind"]) for s in control["bodies"]["then_branch"]["steps"]}
    assert {("Conv", "kernel"), ("MatMul", "kernel"), ("Sqrt", "kernel"),
            ("LSTM", "kernel")} <= kinds, kinds
    assert not {op for op, kind in kinds if kind == "numpy"} - {
        "Pad", "Slice", "Gather", "Concat", "ReduceMean", "Transpose"}, kinds
    r = np.random.default_rng(11)
    for sr in (16000, 8000, 16000):
        feeds = {"x": r.standard_normal((1, 120)).astype(np.float32),
                 "state": r.standard_normal((2, 1, 8)).astype(np.float32),
                 "sr": np.array(sr)}
        got, theirs, want = built.run(feeds), _onnxruntime(m, feeds), run_graph(graph, feeds)
        for k in ("prob", "new_state"):
            np.testing.assert_allclose(got[k], theirs[k], rtol=1e-5, atol=1e-6, err_msg=k)
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
