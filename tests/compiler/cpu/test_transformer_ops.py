"""Operators of the transformer and recurrent models (issue #12) through the CPU build,
against onnxruntime on seeded random inputs."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from celosia.runtime.cpu import CpuModel


def _model(nodes, inputs, outputs, opset, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _both(m, feeds):
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    got = CpuModel.build(m, {k: v.shape for k, v in feeds.items()}).run(feeds)
    return list(got.values()), want


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceL1", "ReduceSumSquare", "ReduceLogSumExp"])
def test_reduce_with_axes_attribute_before_opset_18(op):
    """Before opset 18 these reductions take ``axes`` as an attribute (all-MiniLM's
    ReduceL2 at opset 14); the importer refused it ("has no attribute 'axes'")."""
    x = np.random.default_rng(0).normal(size=(2, 5, 7)).astype(np.float32)
    node = helper.make_node(op, ["x"], ["y"], axes=[-1], keepdims=1)
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], opset=14)
    (got,), (want,) = _both(m, {"x": x})
    assert got.shape == want.shape == (2, 5, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


@pytest.mark.parametrize("extra", ["bias", "bias_scale", "bias_residual", "full_const"])
def test_batched_matmul_epilogue_is_one_dense_kernel(extra):
    """A transformer's projection, x[B,S,K] @ W + b (then a scale or a residual add), is
    fused into one node with an epilogue; the dense kernel takes it on the (B*S, N) view
    instead of handing the whole node to numpy. Float32 sums in another order than
    onnxruntime's: within 1e-5 of the output's scale (K = 48 unit-size terms)."""
    rng = np.random.default_rng(1)
    b, s, k, n = 2, 5, 48, 32
    inits = {"w": rng.normal(size=(k, n)), "bias": rng.normal(size=(n,)),
             "scale": np.array(0.125), "full": rng.normal(size=(s, n))}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t0"])]
    tail = {"bias": [("Add", "bias")], "bias_scale": [("Add", "bias"), ("Mul", "scale")],
            "bias_residual": [("Add", "bias"), ("Add", "r")],
            "full_const": [("Add", "full")]}[extra]
    for i, (op, operand) in enumerate(tail):
        out = "y" if i == len(tail) - 1 else f"t{i + 1}"
        nodes.append(helper.make_node(op, [f"t{i}", operand], [out]))
    inputs = [_vi("x", [b, s, k])] + ([_vi("r", [b, s, n])] if extra == "bias_residual" else [])
    m = _model(nodes, inputs, [_vi("y", None)], 17,
               [numpy_helper.from_array(v.astype(np.float32), name) for name, v in inits.items()])
    feeds = {"x": rng.normal(size=(b, s, k)).astype(np.float32)}
    if extra == "bias_residual":
        feeds["r"] = rng.normal(size=(b, s, n)).astype(np.float32)
    built = CpuModel.build(m, {k_: v.shape for k_, v in feeds.items()})
    assert [st["kind"] for st in built.program.steps if st["op"] == "MatMul"] == ["kernel", "view"]
    assert not [st for st in built.program.steps if st["kind"] == "numpy"]
    got = built.run(feeds)["y"]
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.shape == want.shape == (b, s, n)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def _unary_model(op, shape, **attrs):
    opset = {"Gelu": 20, "Mish": 18}.get(op, 17)
    return _model([helper.make_node(op, ["x"], ["y"], **attrs)], [_vi("x", list(shape))],
                  [_vi("y", None)], opset)


def _wide_inputs(shape, seed):
    """Normal values at several scales, plus the clamp points and beyond."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=shape) * rng.choice([0.01, 1.0, 3.0, 10.0], size=shape))
    x.reshape(-1)[:6] = [0.0, -4.0, 4.0, 3.2, -50.0, 1e-6]
    return x.astype(np.float32)


def test_erf_kernel_against_float64():
    """The compiled Erf (a float32 rational approximation, activations_nn.py) is within
    5e-7 of float64 erf: its measured worst case is 4.5e-7 (7.5 ulp near |x| = 3.2); the
    numpy reference (scipy's erf rounded to float32) is within 3e-8."""
    import math
    x = _wide_inputs((4, 33, 17), 2)
    built = CpuModel.build(_unary_model("Erf", x.shape), {"x": x.shape})
    assert [st["kind"] for st in built.program.steps] == ["kernel"]
    got = built.run({"x": x})["y"]
    exact = np.vectorize(math.erf)(x.astype(np.float64))
    assert got.dtype == np.float32 and np.abs(got - exact).max() <= 5e-7
    assert got.reshape(-1)[0] == 0.0 and np.all(np.abs(got) <= 1.0)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_kernel_against_float64(approximate):
    """Gelu = 0.5 x (1 + erf(x/sqrt2)) or its tanh form: the float32 kernel is within
    6e-7 * max(1, |x|) of float64 (the Erf/tanh error, up to 4.5e-7, times 0.5|x|, plus
    the rounding of the products)."""
    import math
    x = _wide_inputs((3, 50, 21), 3)
    built = CpuModel.build(_unary_model("Gelu", x.shape, approximate=approximate),
                           {"x": x.shape})
    assert [st["kind"] for st in built.program.steps] == ["kernel"]
    got = built.run({"x": x})["y"]
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        exact = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    else:
        exact = 0.5 * x64 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
    assert np.all(np.abs(got - exact) <= 6e-7 * np.maximum(1.0, np.abs(x64)))


def test_mish_kernel_against_float64():
    """Mish = x tanh(softplus(x)) as the kernel's x n / (n + 2), n = e^x (e^x + 2)
    (activations_nn.py): within a few float32 ulp of float64 at every scale, x itself
    from 20 up, x e^x far below 0."""
    x = _wide_inputs((3, 40, 19), 5)
    x.reshape(-1)[6:12] = [20.0, 25.0, 1e4, -90.0, -1e4, 0.5]
    built = CpuModel.build(_unary_model("Mish", x.shape), {"x": x.shape})
    assert [st["kind"] for st in built.program.steps] == ["kernel"]
    got = built.run({"x": x})["y"]
    x64 = x.astype(np.float64)
    exact = x64 * np.tanh(np.logaddexp(0, x64))
    assert np.all(np.abs(got - exact) <= 4 * np.spacing(np.abs(exact).astype(np.float32))
                  + 1e-37)


@pytest.mark.parametrize("opset", [13, 17])
def test_mish_spelt_out_is_one_kernel(opset):
    """PyTorch writes F.mish as Softplus -> Tanh -> Mul before opset 18; the graph's
    fuse_mish makes it one Mish node, an element-wise kernel (on the blocked layout
    between two convolutions) instead of two numpy steps between an unpack and a pack."""
    rng = np.random.default_rng(opset)
    w = [numpy_helper.from_array((rng.normal(size=(16, 16, 3, 3)) / 12).astype(np.float32),
                                 f"w{k}") for k in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1] * 4),
             helper.make_node("Softplus", ["c"], ["s"]),
             helper.make_node("Tanh", ["s"], ["t"]),
             helper.make_node("Mul", ["c", "t"], ["m"]),
             helper.make_node("Conv", ["m", "w1"], ["y"], pads=[1] * 4)]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], opset, w)
    x = (rng.normal(size=(1, 16, 12, 12)) * 3).astype(np.float32)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": x})
    built = CpuModel.build(m, {"x": x.shape})
    np.testing.assert_allclose(built.run({"x": x})["y"], want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())
    steps = [(st["op"], st["kind"]) for st in built.program.steps]
    assert ("Mish", "kernel") in steps and not any(k == "numpy" for _, k in steps)
    assert [op for op, _ in steps].count("unpack") == 1  # only the output's


@pytest.mark.parametrize("rows, residual", [(197, True), (13, False), (1, True)])
def test_dense_rows_without_a_good_tile_are_padded(rows, residual):
    """A dense layer tiles rows by a divisor of M up to 8; an M like ViT's 197 tokens
    (prime) is computed on padded rows (a multiple of 8; compiled copies repeating the last
    row) and cropped by another compiled copy, the residual operand padded alike: no numpy
    step. Same tolerance as above (K = 40 unit-size terms)."""
    rng = np.random.default_rng(4)
    k, n = 40, 24
    inits = [numpy_helper.from_array(rng.normal(size=(k, n)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(n,)).astype(np.float32), "bias")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]),
             helper.make_node("Add", ["t", "bias"], ["u" if residual else "y"])]
    inputs = [_vi("x", [rows, k])]
    feeds = {"x": rng.normal(size=(rows, k)).astype(np.float32)}
    if residual:
        nodes.append(helper.make_node("Add", ["u", "r"], ["y"]))
        inputs.append(_vi("r", [rows, n]))
        feeds["r"] = rng.normal(size=(rows, n)).astype(np.float32)
    m = _model(nodes, inputs, [_vi("y", None)], 17, inits)
    built = CpuModel.build(m, {k_: v.shape for k_, v in feeds.items()})
    dense = [st for st in built.program.steps if st["kind"] == "kernel"
             and built.program.specs[st["kernel"]]["op"] == "dense"]
    assert len(dense) == 1
    assert not [st for st in built.program.steps if st["kind"] == "numpy"]
    padded = rows if rows in (1,) else -(-rows // 8) * 8
    assert built.program.specs[dense[0]["kernel"]]["data"] == [padded, k]
    got = built.run(feeds)["y"]
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.shape == want.shape == (rows, n)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("a_shape, b_shape, kernel", [
    ((2, 3, 16, 8), (2, 3, 8, 16), True),     # scores: [B, H, S, D] @ [B, H, D, S]
    ((1, 4, 12, 24), (1, 4, 24, 8), True),    # P @ V, rows 12 (tile 6), N 8
    ((3, 7, 5), (3, 5, 24), True),            # rank 3, M = 7 (tile 7)
    ((2, 3, 16, 8), (2, 3, 8, 12), True),     # N = 12: padded to 16, cropped
    ((2, 3, 16, 8), (1, 3, 8, 16), False),    # broadcast batch: numpy
    ((1, 2, 197, 8), (1, 2, 8, 16), True),    # M = 197 (prime): padded to 198 (tile 6)
    ((2, 12, 197, 16), (2, 12, 16, 197), True),  # ViT's scores, batch 2: M and N padded
    ((2, 3, 1, 9), (2, 3, 9, 1), True),       # a sequence of 1: M 1 -> 4, N 1 -> 8
])
def test_batched_matmul_of_runtime_operands(a_shape, b_shape, kernel):
    """Attention's products (both operands computed) as one kernel over the batches,
    against float64: a float32 sum of K terms, within 1e-6 of the sum of |products|
    (K <= 24 here; each addition's rounding is 2^-24 of the running magnitude)."""
    rng = np.random.default_rng(5)
    m = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
               [_vi("a", list(a_shape)), _vi("b", list(b_shape))], [_vi("y", None)], 17)
    feeds = {"a": rng.normal(size=a_shape).astype(np.float32),
             "b": rng.normal(size=b_shape).astype(np.float32)}
    built = CpuModel.build(m, {k: v.shape for k, v in feeds.items()})
    kinds = {st["kind"] for st in built.program.steps if st["op"] == "MatMul"}
    assert ("kernel" in kinds) == kernel and ("numpy" in kinds) != kernel
    assert kernel == (not [st for st in built.program.steps if st["kind"] == "numpy"])
    got = built.run(feeds)["y"]
    a64, b64 = feeds["a"].astype(np.float64), feeds["b"].astype(np.float64)
    exact, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    assert got.shape == exact.shape
    assert np.all(np.abs(got - exact) <= 1e-6 * scale + 1e-30)
