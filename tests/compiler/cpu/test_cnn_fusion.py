"""The CNN side of the CPU build's speed work: the vectorised exp (cpu/fastmath.py), SiLU
fused into the producing convolution's epilogue (graph/passes.py) and squeeze-excitation's
per-image, per-channel scale as an element-wise kernel operand (cpu/lowering.py), each
checked against its numpy definition or a float64 evaluation on seeded random inputs."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from celosia.compiler.cpu.codegen import compile_cpu
from celosia.compiler.cpu.kernels import compile_spec
from celosia.compiler.cpu.schedules import schedule_elementwise
from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import fuse_epilogues, optimize
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.tensor import te
from celosia.compiler.tensor.expr import exp
from celosia.compiler.tensor.lower import lower
from celosia.compiler.tensor.schedule import create_schedule

ort = pytest.importorskip("onnxruntime")

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _ulps(got, x):
    """|got - exp(x)| in units of the float32 spacing at exp(x) (computed in float64)."""
    exact = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        spacing = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


def test_fast_exp_against_float64():
    """The inline exp (vector and scalar paths) is within 1 ulp of the exact value over
    the whole float32 range of results, subnormal results included, and gives inf, 0 and
    NaN where numpy's float32 exp does."""
    x = te.placeholder((37, 64), "float32", "x")  # 64 lanes: the vector path
    y = te.compute(x.shape, lambda i, j: exp(x[i, j]), "y")
    kernel = compile_cpu(lower(schedule_elementwise(y), [x, y]))
    rng = np.random.default_rng(0)
    a = rng.uniform(-110, 95, x.shape).astype(np.float32)
    a[0, :12] = [np.nan, np.inf, -np.inf, 0, 88.72, 88.7228, 88.73, -87.4, -103.9, -104.5,
                 1e-8, -1e-8]
    out = np.empty_like(a)
    kernel(a, out)
    with np.errstate(over="ignore"):
        want = np.exp(a)
    normal = np.isfinite(want) & (want >= np.finfo(np.float32).tiny)
    assert normal.sum() > 1500
    assert _ulps(out[normal], a[normal]).max() <= 1.0
    subnormal = np.isfinite(want) & (want < np.finfo(np.float32).tiny)
    assert subnormal.sum() > 50
    tiny = np.finfo(np.float32).smallest_subnormal
    assert np.abs(out[subnormal] - want[subnormal]).max() <= 2 * tiny
    special = ~np.isfinite(want)
    np.testing.assert_array_equal(out[special], want[special])  # inf and nan alike
    scalar = te.compute((1,), lambda i: exp(x[0, 3]), "s")  # a scalar (no vector loop)
    k1 = compile_cpu(lower(create_schedule(scalar), [x, scalar]))
    one = np.empty(1, np.float32)
    k1(a, one)
    assert _ulps(one, a[0, 3:4]).max() <= 1.0


@pytest.mark.parametrize("fn", ["Sigmoid", "Exp", "HardSwish"])
def test_eltwise_unary_against_numpy(fn):
    """Standalone element-wise kernels (blocked) against the graph's numpy operators."""
    from celosia.compiler.graph.ops import KERNELS

    shape = [2, 3, 5, 7, 16]
    x = np.random.default_rng(1).normal(scale=8, size=shape).astype(np.float32)
    k = compile_spec({"op": "eltwise", "fn": fn, "params": [], "layout": "blocked",
                      "shape": shape, "operands": ["full"], "dtype": "float32"})
    out = np.empty_like(x)
    k(x, out)
    want = KERNELS[fn]({}, x)
    want = want[0] if isinstance(want, (tuple, list)) else want
    np.testing.assert_allclose(out, want, rtol=4e-7, atol=1e-7)


def _model(nodes, inits, x_shape, opset=17):
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info(
        "image", TensorProto.FLOAT, x_shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _se_block(channels=24, batch=1, size=9, seed=0):
    """Conv -> SiLU; squeeze-excitation (GAP -> Conv -> SiLU -> Conv -> Sigmoid -> Mul);
    Conv -> SiLU with the Mul's operands the other way round: EfficientNet's block."""
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.normal(size=s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)  # noqa: E731
    c = channels
    nodes = [
        helper.make_node("Conv", ["image", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c0"], ["s0"]),
        helper.make_node("Mul", ["c0", "s0"], ["a0"]),
        helper.make_node("GlobalAveragePool", ["a0"], ["g"]),
        helper.make_node("Conv", ["g", "w1", "b1"], ["c1"]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["s1", "c1"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"]),
        helper.make_node("Sigmoid", ["c2"], ["gate"]),
        helper.make_node("Mul", ["a0", "gate"], ["scaled"]),
        helper.make_node("Conv", ["scaled", "w3"], ["c3"]),
        helper.make_node("Sigmoid", ["c3"], ["s3"]),
        helper.make_node("Mul", ["s3", "c3"], ["y"]),
    ]
    inits = {"w0": w(c, 3, 3, 3), "b0": w(c), "w1": w(8, c, 1, 1), "b1": w(8),
             "w2": w(c, 8, 1, 1), "b2": w(c), "w3": w(16, c, 1, 1)}
    return _model(nodes, inits, [batch, 3, size, size])


def test_silu_fuses_into_the_convolution():
    g = fuse_epilogues(import_onnx(_se_block()))
    ops = [n.op for n in g.nodes]
    assert "Sigmoid" not in ops
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert [n.attrs.get("epilogue") for n in convs] == [(("SiLU",),), (("SiLU",),),
                                                       (("Sigmoid",),), (("SiLU",),)]
    assert ops.count("Mul") == 1  # the excitation's scale stays a node
    before = import_onnx(_se_block())
    feeds = {"image": np.random.default_rng(2).normal(size=(1, 3, 9, 9)).astype(np.float32)}
    np.testing.assert_allclose(run_graph(g, feeds)["y"], run_graph(before, feeds)["y"],
                               rtol=1e-5, atol=1e-6)


def test_no_silu_when_the_sigmoid_has_other_readers():
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Add", ["m", "s"], ["y"])]
    g = fuse_epilogues(import_onnx(_model(nodes, {"w": rng.normal(size=(4, 3, 1, 1)).astype(
        np.float32)}, [1, 3, 4, 4])))
    assert [n.op for n in g.nodes] == ["Conv", "Sigmoid", "Mul", "Add"]


@pytest.mark.parametrize("batch", [1, 2])
def test_se_block_build_against_float64(batch):
    """The CPU build of the block: every step a kernel or a view (no Sigmoid kernel, no
    numpy step), and its error against a float64 evaluation at most 1.5x onnxruntime's
    (tests/runtime/test_cpu_accuracy.py's rule)."""
    from celosia.runtime.cpu import CpuModel

    model = _se_block(batch=batch)
    x = np.random.default_rng(4).normal(size=(batch, 3, 9, 9)).astype(np.float32)
    built = CpuModel.build(model, {"image": x.shape})
    kinds = {(s["op"], s["kind"]) for s in built.program.steps}
    assert ("Mul", "kernel") in kinds and {k for _, k in kinds} <= {"kernel", "view"}
    assert not any(op == "Sigmoid" for op, _ in kinds)
    specs = [s for s in built.program.specs.values() if s["op"] == "eltwise"]
    assert [s["operands"] for s in specs] == [["full", "image_channel"]]
    ours = built.run({"image": x})["y"].astype(np.float64)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"image": x})[0].astype(np.float64)
    exact = _float64(model, x)
    scale = np.abs(exact).max()
    err, ort_err = (np.abs(r - exact).max() / scale for r in (ours, theirs))
    assert err <= max(1.5 * ort_err, 4 * np.finfo(np.float32).eps), (err, ort_err)


def _float64(model, x):
    """The model evaluated by the numpy reference in float64 (test_cpu_accuracy's
    yardstick): initializers, input and output widened."""
    import onnx

    from celosia.runtime.reference import ReferenceModel

    m = onnx.ModelProto.FromString(model.SerializeToString())
    for k, t in enumerate(m.graph.initializer):
        m.graph.initializer[k].CopyFrom(numpy_helper.from_array(
            numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in (*m.graph.input, *m.graph.output):
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    ref = ReferenceModel.load(m, {"image": x.shape}, optimize=False)
    return ref.run({"image": x.astype(np.float64)})["y"]


def test_se_scale_plain_layout():
    """The per-image, per-channel operand on a plain (unblocked) 4-D output."""
    shape = [2, 5, 3, 4]
    rng = np.random.default_rng(5)
    a = rng.normal(size=shape).astype(np.float32)
    s = rng.normal(size=shape[:2]).astype(np.float32)
    k = compile_spec({"op": "eltwise", "fn": "Mul", "params": [], "layout": "plain",
                      "shape": shape, "operands": ["full", "image_channel"], "dtype": "float32"})
    out = np.empty_like(a)
    k(a, s, out)
    np.testing.assert_array_equal(out, a * s[:, :, None, None])


def test_optimize_keeps_silu_for_the_reference():
    """optimize() output with SiLU steps runs on the numpy reference (apply_epilogue)."""
    g = optimize(import_onnx(_se_block(channels=16, size=5)))
    x = np.random.default_rng(6).normal(size=(1, 3, 5, 5)).astype(np.float32)
    got = run_graph(g, {"image": x})["y"]
    session = ort.InferenceSession(_se_block(channels=16, size=5).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, {"image": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("order", ["mul_then_div", "div_then_mul", "mul_sixth"])
def test_spelt_out_hard_swish_fuses(order):
    """x * clip(x + 3, 0, 6) / 6 (Paddle's export) after a Conv becomes its HardSwish step,
    then the scalar Mul and Add after it join the epilogue; the CPU build matches
    onnxruntime."""
    from celosia.runtime.cpu import CpuModel

    rng = np.random.default_rng(10)
    nodes = [helper.make_node("Conv", ["image", "w"], ["x"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["x", "three"], ["a"]),
             helper.make_node("Clip", ["a", "zero", "six"], ["c"])]
    if order == "div_then_mul":
        nodes += [helper.make_node("Div", ["c", "six"], ["d"]),
                  helper.make_node("Mul", ["x", "d"], ["h"])]
    else:
        nodes += [helper.make_node("Mul", ["c", "x"], ["m"]),
                  helper.make_node("Div", ["m", "six"], ["h"]) if order == "mul_then_div"
                  else helper.make_node("Mul", ["sixth", "m"], ["h"])]
    nodes += [helper.make_node("Mul", ["h", "scale"], ["s"]),
              helper.make_node("Add", ["s", "shift"], ["y"])]
    inits = {"w": rng.normal(size=(16, 3, 3, 3)).astype(np.float32),
             "three": np.float32(3), "zero": np.float32(0), "six": np.float32(6),
             "sixth": np.float32(1 / 6), "scale": np.float32(0.4), "shift": np.float32(-0.2)}
    model = _model(nodes, inits, [1, 3, 6, 6])
    g = optimize(import_onnx(model))
    assert [n.op for n in g.nodes] == ["Conv"]
    assert [s[0] for s in g.nodes[0].attrs["epilogue"]] == ["HardSwish", "Mul", "Add"]
    x = rng.normal(scale=3, size=(1, 3, 6, 6)).astype(np.float32)
    got = CpuModel.build(model).run({"image": x})["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"image": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_hard_swish_not_fused_with_other_constants():
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Conv", ["image", "w"], ["x"]),
             helper.make_node("Add", ["x", "three"], ["a"]),
             helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
             helper.make_node("Mul", ["c", "x"], ["m"]),
             helper.make_node("Div", ["m", "five"], ["y"])]
    inits = {"w": rng.normal(size=(4, 3, 1, 1)).astype(np.float32), "three": np.float32(3),
             "zero": np.float32(0), "six": np.float32(6), "five": np.float32(5)}
    g = fuse_epilogues(import_onnx(_model(nodes, inits, [1, 3, 4, 4])))
    assert [n.op for n in g.nodes] == ["Conv", "Add", "Clip", "Mul", "Div"]
