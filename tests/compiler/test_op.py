"""@celosia.op: Python-defined operators in celosia's tensor expressions, compiled once per
(shapes, dtypes), called on numpy and PyTorch tensors without copies, and a torch.library
custom op inside torch.compile (celosia/op.py, docs/op.md)."""

from __future__ import annotations

import numpy as np
import pytest

try:  # imported first, so each operator's torch custom op is registered at its definition
    import torch  # noqa: F401
except ImportError:
    pass

import celosia
from celosia.errors import CompilerError
from celosia.op import OpError, broadcast, broadcast_shape, create_schedule, select, te


@celosia.op(target="cpu", name="test_axpy")
def axpy(x, y, alpha=2.0):
    """x * alpha + y, the innermost loop vectorised by the op's own schedule."""
    z = te.compute(x.shape, lambda *i: x[i] * alpha + y[i], "z")
    s = create_schedule(z)
    s[z].vectorize(s[z].leaves[-1])
    return z, s


@celosia.op(target="cpu", name="test_matmul")
def matmul(a, b):
    k = te.reduce_axis(a.shape[1], "k")
    return te.compute((a.shape[0], b.shape[1]),
                      lambda i, j: te.sum(a[i, k] * b[k, j], axis=[k]), "c")


@celosia.op(name="test_badd")
def badd(x, y):
    """Broadcasting, written in the compute."""
    return te.compute(broadcast_shape(x, y), lambda *i: broadcast(x, i) + broadcast(y, i), "s")


@celosia.op(name="test_minmax", outputs=2)
def minmax(x, y):
    lo = te.compute(x.shape, lambda *i: select(x[i] < y[i], x[i], y[i]), "lo")
    hi = te.compute(x.shape, lambda *i: select(x[i] < y[i], y[i], x[i]), "hi")
    return lo, hi


def _rand(shape, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.normal(size=shape).astype(dtype)
    return rng.integers(-50, 50, size=shape).astype(dtype)


def test_numpy_against_reference_and_cache():
    before = axpy.builds
    for seed in range(3):
        x, y = _rand((3, 40), seed), _rand((3, 40), seed + 10)
        np.testing.assert_allclose(axpy(x, y), x * np.float32(2.0) + y, rtol=1e-6)
    assert axpy.builds == before + 1  # one build for one (shapes, dtypes, constants)
    x, y = _rand((7,), 5), _rand((7,), 6)
    np.testing.assert_allclose(axpy(x, y, alpha=0.5), x * np.float32(0.5) + y, rtol=1e-6)
    assert axpy.builds == before + 2
    a, b = _rand((9, 17), 1), _rand((17, 5), 2)
    np.testing.assert_allclose(matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_dtype_polymorphism_and_broadcasting():
    a, b = _rand((4, 6), 1, np.int32), _rand((6,), 2, np.int32)
    r = badd(a, b)
    assert r.dtype == np.int32
    np.testing.assert_array_equal(r, a + b)
    f, g = _rand((5, 1, 3), 3), _rand((4, 1), 4)
    np.testing.assert_allclose(badd(f, g), f + g, rtol=1e-6)
    i8 = _rand((8,), 5, np.int8)
    np.testing.assert_array_equal(badd(i8, i8), (i8 + i8).astype(np.int8))  # wraps as numpy


def test_out_and_no_copies_numpy():
    x, y = _rand((2, 64), 7), _rand((2, 64), 8)
    out = np.empty_like(x)
    r = axpy(x, y, out=out)
    assert r is out
    assert axpy.last_pointers == [x.ctypes.data, y.ctypes.data, out.ctypes.data]
    np.testing.assert_allclose(out, 2 * x + y, rtol=1e-6)
    lo, hi = np.empty(5, np.float32), np.empty(5, np.float32)
    p, q = _rand((5,), 1), _rand((5,), 2)
    assert minmax(p, q, out=[lo, hi]) == (lo, hi)
    np.testing.assert_array_equal(lo, np.minimum(p, q))
    np.testing.assert_array_equal(hi, np.maximum(p, q))


def test_errors():
    x = _rand((4,), 1)
    with pytest.raises(CompilerError, match="dtype float64 is not supported; .* float32"):
        axpy(x.astype(np.float64), x)
    with pytest.raises(CompilerError, match="dtype float16 is not supported"):
        badd(x.astype(np.float16), x.astype(np.float16))
    with pytest.raises(OpError, match="takes 2 tensors \\(x, y\\), given 1"):
        axpy(x)
    with pytest.raises(OpError, match="unknown argument 'beta'; its constants are alpha"):
        axpy(x, x, beta=1.0)
    with pytest.raises(OpError, match=r"out\[0\] is float32\[5\]; output 0 is float32\[4\]"):
        axpy(x, x, out=np.empty(5, np.float32))
    with pytest.raises(OpError, match="argument y is a list"):
        axpy(x, [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(OpError, match="target 'gpu' is not supported; targets: cpu, accel"):
        celosia.op(target="gpu")
    with pytest.raises(CompilerError, match="buffer a is float64"):  # the emitter's guard
        from celosia.compiler.cpu.codegen import compile_cpu
        from celosia.compiler.tensor.tir import Buffer, PrimFunc, Seq
        compile_cpu(PrimFunc("f", (Buffer("a", (4,), "float64"),), Seq(())))


def test_torch_no_copies_and_custom_op():
    torch = pytest.importorskip("torch")
    x, y = torch.randn(3, 32), torch.randn(3, 32)
    r = axpy(x, y)  # through torch.ops.celosia.test_axpy
    assert isinstance(r, torch.Tensor)
    torch.testing.assert_close(r, 2 * x + y)
    assert axpy.last_pointers == [x.data_ptr(), y.data_ptr(), r.data_ptr()]
    out = torch.empty(3, 32)
    axpy(x, y, out=out, alpha=3.0)
    assert axpy.last_pointers[-1] == out.data_ptr()
    torch.testing.assert_close(out, 3 * x + y)
    torch.testing.assert_close(torch.ops.celosia.test_axpy(x, y, 0.5), 0.5 * x + y)
    a, b = torch.randn(6, 8), torch.randn(8, 3)
    torch.testing.assert_close(matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)
    lo, hi = minmax(x, y)
    torch.testing.assert_close(lo, torch.minimum(x, y))
    torch.testing.assert_close(hi, torch.maximum(x, y))


def test_inside_torch_compile():
    torch = pytest.importorskip("torch")

    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, y):
        return torch.relu(axpy(x, y, alpha=0.5)) + matmul(x, y.t()).sum()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    torch.testing.assert_close(compiled(x, y), torch.relu(0.5 * x + y) + (x @ y.t()).sum(),
                               rtol=1e-5, atol=1e-4)
    [gm] = graphs
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "celosia.test_axpy.default" in targets and "celosia.test_matmul.default" in targets
    # through AOTAutograd too (fake tensors: register_fake gives the output shapes)
    g = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(g(x, y), compiled(x, y))
    torch._dynamo.reset()
