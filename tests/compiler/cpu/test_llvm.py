"""The LLVM CPU backend: every expression kind and dtype against the loop-IR interpreter,
loop kinds (parallel, vectorize, unroll), the disk cache and the argument checks."""


import numpy as np
import pytest

from celosia.compiler.tensor import te
from celosia.compiler.cpu.codegen import compile_cpu
from celosia.errors import CompilerError
from celosia.compiler.tensor.expr import (Call, Var, all_of, exp, max_expr, min_expr, select, sqrt)
from celosia.compiler.tensor.lower import lower
from celosia.compiler.tensor.schedule import create_schedule
from celosia.compiler.tensor.tir import Buffer, Evaluate, For, PrimFunc, Store, interpret

SHAPE = (4, 16)

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _random(dtype, rng, shape=SHAPE, low=None, high=None):
    if dtype == "float32":
        return (rng.random(shape, dtype=np.float32) * 4 - 2).astype(np.float32)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    info = np.iinfo(dtype)
    lo = info.min if low is None else low
    hi = info.max if high is None else high
    return rng.integers(lo, hi, shape, endpoint=True).astype(dtype)


def _check(fn, inputs, schedule=None, rtol=1e-6):
    """Compile ``fn(*placeholders)`` for the CPU and compare it with the interpreter."""
    ph = [te.placeholder(a.shape, str(a.dtype) if a.dtype != np.bool_ else "bool", f"in{i}")
          for i, a in enumerate(inputs)]
    out = te.compute(inputs[0].shape, lambda *i: fn(*(p[i] for p in ph), *i), "out")
    s = create_schedule(out)
    if schedule is not None:
        schedule(s, out)
    f = lower(s, ph + [out])
    kernel = compile_cpu(f)
    got = np.zeros(out.shape, out.dtype if out.dtype != "bool" else np.bool_)
    want = got.copy()
    kernel(*inputs, got)
    interpret(f, *[a.copy() for a in inputs], want)
    if out.dtype == "float32":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)
    return got


def _vectorized(s, out):
    s[out].vectorize(s[out].leaves[-1])


def _parallel(s, out):
    s[out].parallel(s[out].leaves[0])


SCHEDULES = {"serial": None, "vectorize": _vectorized, "parallel": _parallel}
INT_DTYPES = ["int8", "uint8", "int16", "int32", "int64"]


@pytest.mark.parametrize("sched", SCHEDULES)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_arithmetic_wraps_like_the_interpreter(dtype, sched):
    rng = np.random.default_rng(0)
    a, b = _random(dtype, rng), _random(dtype, rng)
    _check(lambda x, y, i, j: (x + y) * y - x, [a, b], SCHEDULES[sched])
    _check(lambda x, y, i, j: min_expr(x, y) - max_expr(x, y), [a, b], SCHEDULES[sched])


@pytest.mark.parametrize("sched", SCHEDULES)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_floor_division_and_modulo_of_signed_operands(dtype, sched):
    rng = np.random.default_rng(1)
    a = _random(dtype, rng, low=-100 if dtype != "uint8" else 0, high=100)
    b = _random(dtype, rng, low=1, high=9)
    if dtype != "uint8":
        b = np.where(rng.random(SHAPE) < 0.5, -b, b).astype(dtype)
    _check(lambda x, y, i, j: x // y, [a, b], SCHEDULES[sched])
    _check(lambda x, y, i, j: x % y, [a, b], SCHEDULES[sched])


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_shifts_are_arithmetic_for_signed_and_logical_for_unsigned(dtype):
    rng = np.random.default_rng(2)
    a = _random(dtype, rng)
    n = _random(dtype, rng, low=0, high=7)
    _check(lambda x, y, i, j: x >> y, [a, n])
    _check(lambda x, y, i, j: x << y, [a, n])


@pytest.mark.parametrize("sched", SCHEDULES)
@pytest.mark.parametrize("dtype", INT_DTYPES + ["float32"])
def test_comparisons_and_logic_give_bools(dtype, sched):
    rng = np.random.default_rng(3)
    a, b = _random(dtype, rng), _random(dtype, rng)
    b = np.where(rng.random(SHAPE) < 0.3, a, b).astype(dtype)  # some equal pairs
    for op in ("<", "<=", ">", ">="):
        _check(lambda x, y, i, j, op=op: getattr(x, {"<": "__lt__", "<=": "__le__", ">": "__gt__",
                                                      ">=": "__ge__"}[op])(y),
               [a, b], SCHEDULES[sched])
    _check(lambda x, y, i, j: x.equal(y), [a, b], SCHEDULES[sched])
    _check(lambda x, y, i, j: (x < y) & (y > x) | x.equal(y), [a, b], SCHEDULES[sched])


@pytest.mark.parametrize("sched", SCHEDULES)
def test_float_arithmetic_division_min_max_and_math_calls(sched):
    rng = np.random.default_rng(4)
    a, b = _random("float32", rng), _random("float32", rng)
    b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    _check(lambda x, y, i, j: x * y + x - y / x * 2, [a, b], SCHEDULES[sched])
    _check(lambda x, y, i, j: min_expr(x, y) + max_expr(x, 0.5), [a, b], SCHEDULES[sched])
    _check(lambda x, y, i, j: 1.0 / (exp(-x) + 1.0) + sqrt(y * y), [a, b], SCHEDULES[sched],
           rtol=1e-5)


@pytest.mark.parametrize("src,dst", [
    ("int8", "int32"), ("uint8", "int32"), ("int32", "int8"), ("int32", "uint8"),
    ("int16", "int64"), ("int64", "int16"), ("int32", "float32"), ("int8", "float32"),
    ("uint8", "float32"), ("float32", "int32"), ("float32", "int8"), ("bool", "int32"),
    ("int32", "bool"), ("float32", "bool"), ("bool", "float32")])
@pytest.mark.parametrize("sched", ["serial", "vectorize"])
def test_casts_between_dtypes(src, dst, sched):
    rng = np.random.default_rng(5)
    if src == "float32":
        a = (rng.random(SHAPE) * 200 - 100).astype(np.float32)
        if dst in ("int8", "bool"):
            a = np.round(a).astype(np.float32)
            a = np.clip(a, -100, 100) if dst == "int8" else np.where(a > 50, 0.0, a).astype(np.float32)
    else:
        a = _random(src, rng)
    _check(lambda x, i, j: x.astype(dst), [a], SCHEDULES[sched])


@pytest.mark.parametrize("sched", SCHEDULES)
def test_select_of_floats_and_guarded_reads_do_not_touch_out_of_bounds(sched):
    rng = np.random.default_rng(6)
    a, b = _random("float32", rng), _random("float32", rng)
    _check(lambda x, y, i, j: select(x > y, x, y * 2.0), [a, b], SCHEDULES[sched])
    # in0[i, j - 1] is read only where j >= 1: the branch must be evaluated lazily.
    ph = te.placeholder(SHAPE, "float32", "X")
    out = te.compute(SHAPE, lambda i, j: select(all_of(j >= 1, i >= 1), ph[i - 1, j - 1], 0.0), "out")
    s = create_schedule(out)
    if SCHEDULES[sched]:
        SCHEDULES[sched](s, out)
    got = np.zeros(SHAPE, np.float32)
    compile_cpu(lower(s, [ph, out]))(a, got)
    want = np.zeros(SHAPE, np.float32)
    want[1:, 1:] = a[:-1, :-1]
    np.testing.assert_array_equal(got, want)


def test_select_with_uniform_condition_in_a_vectorised_loop():
    rng = np.random.default_rng(7)
    a = _random("float32", rng, shape=(6, 16))
    ph = te.placeholder((6, 16), "float32", "X")
    out = te.compute((6, 16), lambda i, j: select(i >= 1, ph[i - 1, j], -1.0), "out")
    s = create_schedule(out)
    s[out].vectorize(s[out].leaves[-1])
    f = lower(s, [ph, out])
    got = np.zeros((6, 16), np.float32)
    compile_cpu(f)(a, got)
    np.testing.assert_array_equal(got[1:], a[:-1])
    np.testing.assert_array_equal(got[0], -1.0)


def test_reduction_with_split_unroll_vectorize_and_local_accumulator_matches_numpy():
    rng = np.random.default_rng(8)
    m, k, n = 12, 20, 32
    a = te.placeholder((m, k), "float32", "A")
    w = te.placeholder((k, n), "float32", "W")
    r = te.reduce_axis(k, "r")
    acc = te.compute((m, n), lambda i, j: te.sum(a[i, r] * w[r, j], axis=[r]), "acc")
    out = te.compute((m, n), lambda i, j: max_expr(acc[i, j], 0.0), "out")
    s = create_schedule(out)
    i, j = s[out].leaves
    io, ii = s[out].split(i, 4)
    jo, ji = s[out].split(j, 16)
    s[out].reorder(io, jo, ii, ji)
    s[out].parallel(io)
    s[out].vectorize(ji)
    s[acc].set_scope("local")
    s[acc].compute_at(s[out], jo)
    ai, aj, ar = s[acc].leaves
    s[acc].reorder(ar, ai, aj)
    s[acc].unroll(ai)
    s[acc].vectorize(aj)
    f = lower(s, [a, w, out])
    av, wv = _random("float32", rng, (m, k)), _random("float32", rng, (k, n))
    got = np.zeros((m, n), np.float32)
    compile_cpu(f)(av, wv, got)
    np.testing.assert_allclose(got, np.maximum(av @ wv, 0), rtol=1e-5, atol=1e-5)


def test_vectorised_gather_scatter_and_long_loops_fall_back_correctly():
    rng = np.random.default_rng(9)
    a = _random("float32", rng, shape=(8, 100))
    ph = te.placeholder((8, 100), "float32", "X")
    # Transposed read (a gather), and a 100-iteration vectorised loop (chunks of 4 lanes).
    out = te.compute((100, 8), lambda i, j: ph[j, i] * 2.0, "out")
    s = create_schedule(out)
    i, j = s[out].leaves
    s[out].reorder(j, i)
    s[out].vectorize(i)
    got = np.zeros((100, 8), np.float32)
    compile_cpu(lower(s, [ph, out]))(a, got)
    np.testing.assert_array_equal(got, a.T * 2)


def test_parallel_loops_give_identical_results_with_any_thread_count(monkeypatch):
    rng = np.random.default_rng(10)
    m, k = 37, 50
    a = te.placeholder((m, k), "float32", "A")
    r = te.reduce_axis(k, "r")
    total = te.compute((m,), lambda i: te.sum(a[i, r] * a[i, r], axis=[r]), "total")
    out = te.compute((m,), lambda i: total[i] + 1.0, "out")
    s = create_schedule(out)
    s[total].parallel(s[total].leaves[0])
    s[out].parallel(s[out].leaves[0])
    kernel = compile_cpu(lower(s, [a, out]))
    assert [seg.loop is not None for seg in kernel.segments] == [True, True]
    av = _random("float32", rng, (m, k))
    results = []
    for threads in ("1", "2", "5"):
        monkeypatch.setenv("CELOSIA_NUM_THREADS", threads)
        got = np.zeros(m, np.float32)
        kernel(av, got)
        results.append(got)
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])
    np.testing.assert_allclose(results[0], (av * av).sum(1) + 1, rtol=1e-5)


def test_second_compile_is_a_cache_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("CELOSIA_CACHE", str(tmp_path))
    a = te.placeholder((64, 64), "float32", "A")
    r = te.reduce_axis(64, "r")
    out = te.compute((64, 64), lambda i, j: te.sum(a[i, r] * a[r, j], axis=[r]), "out")
    s = create_schedule(out)
    s[out].unroll(s[out].leaves[1])  # a big function: a cold compile takes a while
    f = lower(s, [a, out])
    cold = compile_cpu(f)
    warm = compile_cpu(f)
    assert not cold.from_cache and warm.from_cache
    assert cold.cache_path == warm.cache_path and cold.cache_path.is_file()
    assert cold.cache_path.parent == tmp_path / "llvm"
    # (no wall-clock comparison: a fresh CI machine once took as long for the cache hit as
    # for the compile; the hit itself is asserted above, its speed is a benchmark's matter)
    av = np.random.default_rng(11).random((64, 64), dtype=np.float32)
    x, y = np.zeros((64, 64), np.float32), np.zeros((64, 64), np.float32)
    cold(av, x)
    warm(av, y)
    np.testing.assert_array_equal(x, y)


def _copy_kernel():
    a = te.placeholder((3, 4), "float32", "A")
    out = te.compute((3, 4), lambda i, j: a[i, j] + 1.0, "out")
    return compile_cpu(lower(create_schedule(out), [a, out]))


@pytest.mark.parametrize("args,message", [
    (lambda: (np.zeros((3, 4), np.float32),), "takes 2 arrays"),
    (lambda: (np.zeros((4, 3), np.float32), np.zeros((3, 4), np.float32)),
     r"argument 0 \(A\) must have shape \(3, 4\), not \(4, 3\)"),
    (lambda: (np.zeros((3, 4), np.float64), np.zeros((3, 4), np.float32)),
     "argument 0 .A. must be float32, not float64"),
    (lambda: (np.zeros((4, 3), np.float32).T, np.zeros((3, 4), np.float32)), "C-contiguous"),
    (lambda: ([[0.0] * 4] * 3, np.zeros((3, 4), np.float32)), "must be a numpy array"),
])
def test_wrong_arguments_are_clear_errors(args, message):
    kernel = _copy_kernel()
    with pytest.raises(CompilerError, match=message):
        kernel(*args())


def test_overlapping_arguments_are_rejected():
    kernel = _copy_kernel()
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(CompilerError, match=r"argument 1 \(out\), which the kernel writes, "
                                            r"shares memory with argument 0 \(A\)"):
        kernel(x, x)


def test_read_only_arguments_may_share_memory():
    """A residual block reads one value as the convolution's input and as its residual."""
    a = te.placeholder((3, 4), "float32", "A")
    b = te.placeholder((3, 4), "float32", "B")
    out = te.compute((3, 4), lambda i, j: a[i, j] * b[i, j], "out")
    kernel = compile_cpu(lower(create_schedule(out), [a, b, out]))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.zeros((3, 4), np.float32)
    kernel(x, x, y)
    np.testing.assert_array_equal(y, x * x)


def test_accelerator_operations_and_reduction_loop_kinds_are_rejected():
    buf = Buffer("B", (4,), "int32")
    i = Var("i")
    f = PrimFunc("acc", (buf,), For(i, 4, Evaluate(Call("dep_push", (0, 1)))))
    with pytest.raises(CompilerError, match="accelerator operations"):
        compile_cpu(f)
    g = PrimFunc("odd", (buf,), For(i, 4, Store(buf, (i,), i), "spin"))
    with pytest.raises(CompilerError, match="kind 'spin'"):
        compile_cpu(g)
    a = te.placeholder((4, 4), "float32", "A")
    r = te.reduce_axis(4, "r")
    out = te.compute((4,), lambda x: te.sum(a[x, r], axis=[r]), "out")
    s = create_schedule(out)
    with pytest.raises(CompilerError, match="reduction loop"):
        s[out].parallel(r)


def test_large_local_buffers_are_heap_allocated_per_iteration():
    rng = np.random.default_rng(12)
    n = 70_000  # 280 kB per row: above the stack limit, so malloc'd and freed in the loop
    a = te.placeholder((3, n), "float32", "A")
    tmp = te.compute((3, n), lambda i, j: a[i, j] * 2.0, "tmp")
    out = te.compute((3, n), lambda i, j: tmp[i, j] + 1.0, "out")
    s = create_schedule(out)
    s[tmp].set_scope("local")
    s[tmp].compute_at(s[out], s[out].leaves[0])
    s[out].parallel(s[out].leaves[0])
    kernel = compile_cpu(lower(s, [a, out]))
    assert '@"malloc"' in kernel.llvm_ir and '@"free"' in kernel.llvm_ir
    av = _random("float32", rng, (3, n))
    got = np.zeros((3, n), np.float32)
    kernel(av, got)
    np.testing.assert_array_equal(got, av * 2 + 1)
