"""``@celosia.op(target="accel")``: one definition built for the CPU and the accelerator
(compiler/accel/te_op.py, celosia/op_accel.py), bit-exact against numpy on random shapes,
from numpy and torch, and the errors for computes that do not map."""

from dataclasses import replace

import numpy as np
import pytest

import celosia
from celosia import HwConfig
from celosia.op import AccelMappingError, OpError, maximum, minimum, select, te

SMALL = HwConfig.preset("small")            # BATCH 1, BLOCK 4
BATCH2 = replace(SMALL, log_batch=1)        # BATCH 2: rows padded too


def _wrap(x):
    return ((np.asarray(x, np.int64) + 2**31) % 2**32 - 2**31)


def _i8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def _bias_scale(rng, n):
    """A requantized dense layer's int32 bias and per-channel scale, n of each."""
    return (rng.integers(-5000, 5000, n).astype(np.int32),
            rng.integers(-700, 700, n).astype(np.int32))


def _matmul(a, b):
    k = te.reduce_axis(a.shape[1], "k")
    return te.compute((a.shape[0], b.shape[1]), lambda i, j: te.sum(
        a[i, k].astype("int32") * b[k, j].astype("int32"), axis=[k]), "c")


def matmul(a, b):
    """int8 x int8 -> int32."""
    return _matmul(a, b)


def qdense(x, w, bias, scale, shift=9, lo=-128, hi=127):
    """x [M, K] times w [N, K] (transposed weight), + bias[j], * scale[j], >> shift, clip,
    int8."""
    k = te.reduce_axis(x.shape[1], "k")
    acc = te.compute((x.shape[0], w.shape[0]), lambda i, j: te.sum(
        x[i, k].astype("int32") * w[j, k].astype("int32"), axis=[k]), "acc")
    y = te.compute(acc.shape, lambda i, j: (acc[i, j] + bias[j]) * scale[j] >> shift, "y")
    return te.compute(acc.shape, lambda i, j: minimum(maximum(y[i, j], lo), hi).astype("int8"),
                      "out")


def qdense_reference(x, w, bias, scale, shift=9, lo=-128, hi=127):
    acc = _wrap(x.astype(np.int64) @ w.astype(np.int64).T)
    y = _wrap(_wrap(acc + bias) * scale) >> shift
    return np.clip(y, lo, hi).astype(np.int8)


def mixed(at, b, rowv, resid, s, jv):
    """at [K, M] (transposed), the output transposed ([N, M]), a row operand, an int8
    residual read transposed, tensor subtraction, c - x, a constant too wide for the
    immediate, << and a scalar tensor."""
    k = te.reduce_axis(at.shape[0], "k")
    c = te.compute((b.shape[1], at.shape[1]), lambda j, i: te.sum(
        at[k, i].astype("int32") * b[k, j].astype("int32"), axis=[k]), "c")

    def epi(j, i):
        x = (c[j, i] - rowv[i]) * 3 + resid[i, j].astype("int32") + jv[j].astype("int32")
        x = 100000 - x
        x = (x << 2) + s[0]
        return (x >> 7).astype("int8")          # no clip: the low byte, wrapped
    return te.compute(c.shape, epi, "out")


def mixed_reference(at, b, rowv, resid, s, jv):
    c = _wrap(at.T.astype(np.int64) @ b.astype(np.int64))                  # [M, N]
    x = _wrap(_wrap(_wrap(c - rowv[:, None]) * 3 + resid) + jv[None, :])
    x = _wrap(100000 - x)
    x = _wrap(_wrap(x << 2) + s[0])
    return (x >> 7).astype(np.int8).T


def scaled(a, b, bias, m=3):
    """An int32 result with an epilogue (no cast): every byte plane of the chain."""
    c = _matmul(a, b)
    return te.compute(c.shape, lambda i, j: c[i, j] * m - bias[j], "s")


def chain(a, b, col, row, full, sc, recipe=""):
    """A product followed by the operations of ``recipe`` ("op:operand" items separated by
    commas; operands: a number, col, row, full (int8), sc, and the expressions ex1, ex2
    computed on the host; "rsub" is operand - x; a final "int8" casts)."""
    c = _matmul(a, b)
    items = [it.split(":") for it in recipe.split(",") if it]

    def epi(i, j):
        x = c[i, j]
        for op, *arg in items:
            if op == "int8":
                return x.astype("int8")
            v = {"col": lambda: col[j], "row": lambda: row[i],
                 "full": lambda: full[i, j].astype("int32"),
                 "sc": lambda: sc[0],
                 "ex1": lambda: (col[j] >> 3) * row[i] + 5,
                 "ex2": lambda: select(full[i, j] > 0, col[j], sc[0] // 7 - (row[i] % 5)),
                 }.get(arg[0], lambda: int(arg[0]))()
            x = {"+": lambda: x + v, "-": lambda: x - v, "*": lambda: x * v,
                 "min": lambda: minimum(x, v), "max": lambda: maximum(x, v),
                 ">>": lambda: x >> v, "<<": lambda: x << v, "rsub": lambda: v - x}[op]()
        return x
    return te.compute(c.shape, epi, "out")


def chain_reference(a, b, col, row, full, sc, recipe):
    x = _wrap(a.astype(np.int64) @ b.astype(np.int64))
    for op, *arg in (it.split(":") for it in recipe.split(",") if it):
        if op == "int8":
            return x.astype(np.int8)
        c64, r64, s64 = col[None, :].astype(np.int64), row[:, None].astype(np.int64), \
            np.int64(sc[0])
        v = {"col": c64, "row": r64, "full": full.astype(np.int64), "sc": s64,
             "ex1": _wrap(_wrap((c64 >> 3) * r64) + 5),
             "ex2": np.where(full > 0, c64, _wrap(s64 // 7 - r64 % 5)),
             }.get(arg[0])
        v = np.int64(int(arg[0])) if v is None else v
        x = _wrap({"+": lambda: x + v, "-": lambda: x - v, "*": lambda: x * v,
                   "min": lambda: np.minimum(x, v), "max": lambda: np.maximum(x, v),
                   ">>": lambda: x >> v, "<<": lambda: x << v, "rsub": lambda: v - x}[op]())
    return x.astype(np.int32)


def _recipe(rng) -> str:
    items = []
    for _ in range(int(rng.integers(1, 6))):
        op = str(rng.choice(["+", "-", "*", "min", "max", ">>", "<<", "rsub"]))
        if op in (">>", "<<"):
            arg = str(int(rng.integers(0, 12)))
        else:
            arg = str(rng.choice(["col", "row", "full", "sc", "num", "big", "ex1", "ex2"]))
            arg = {"num": str(int(rng.integers(-300, 300))),
                   "big": str(int(rng.integers(-2**31, 2**31)))}.get(arg, arg)
        items.append(f"{op}:{arg}")
    if rng.random() < 0.6:
        items.append("int8")
    return ",".join(items)


@pytest.mark.parametrize("seed", range(4))
def test_random_epilogue_chains(seed):
    """Random chains of every ALU operation and operand kind, int8 or int32 results, on
    random shapes: the accelerator build equals the CPU build and numpy."""
    rng = np.random.default_rng(100 + seed)
    cfg = BATCH2 if seed % 3 == 0 else SMALL
    acc = celosia.op(target="accel", config=cfg, name=f"chain_acc_{seed}")(chain)
    cpu = celosia.op(target="cpu", name=f"chain_cpu_{seed}")(chain)
    for _ in range(3):
        m, k, n = _shape(rng, cfg)
        recipe = _recipe(rng)
        a, b = _i8(rng, (m, k)), _i8(rng, (k, n))
        col = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
        row = rng.integers(-5000, 5000, m).astype(np.int32)
        full = _i8(rng, (m, n))
        sc = rng.integers(-2**31, 2**31, 1, dtype=np.int64).astype(np.int32)
        args = (a, b, col, row, full, sc)
        want = chain_reference(*args, recipe)
        np.testing.assert_array_equal(cpu(*args, recipe=recipe), want, err_msg=recipe)
        np.testing.assert_array_equal(acc(*args, recipe=recipe), want, err_msg=recipe)


def _shape(rng, cfg):
    return tuple(int(v) for v in rng.integers(1, 3 * cfg.block + 2, 3))


@pytest.mark.parametrize("seed", range(4))
def test_matmul_int32_random_shapes(seed):
    rng = np.random.default_rng(seed)
    cfg = BATCH2 if seed % 2 else SMALL
    cpu = celosia.op(target="cpu", name=f"mm_cpu_{seed}")(matmul)
    acc = celosia.op(target="accel", config=cfg, name=f"mm_acc_{seed}")(matmul)
    for _ in range(3):
        m, k, n = _shape(rng, cfg)
        a, b = _i8(rng, (m, k)), _i8(rng, (k, n))
        want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
        got = acc(a, b)
        assert got.dtype == np.int32 and got.shape == (m, n)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(cpu(a, b), want)
    # extreme values: every byte plane of the int32 result is exercised
    a, b = np.full((3, 9), -128, np.int8), np.full((9, 5), -128, np.int8)
    np.testing.assert_array_equal(acc(a, b), np.full((3, 5), 9 * 16384, np.int32))


def test_int32_epilogue_with_virtual_threads():
    rng = np.random.default_rng(4)
    acc = celosia.op(target="accel", config="small", name="scaled_acc")(scaled)
    cpu = celosia.op(target="cpu", name="scaled_cpu")(scaled)
    for m, k, n in ((3, 40, 32), (10, 7, 9)):
        a, b = _i8(rng, (m, k)), _i8(rng, (k, n))
        bias = rng.integers(-2**31, 2**31 - 1, n, dtype=np.int64).astype(np.int32)
        want = _wrap(_wrap(a.astype(np.int64) @ b * 1000) - bias).astype(np.int32)
        np.testing.assert_array_equal(acc(a, b, bias, m=1000), want)
        np.testing.assert_array_equal(cpu(a, b, bias, m=1000), want)
    assert any(kern.knobs.vthreads == 2 for kern, _ in acc._builds.values())


@pytest.mark.parametrize("seed", range(3))
def test_requantized_dense_cpu_and_accel_bit_exact(seed):
    rng = np.random.default_rng(10 + seed)
    cfg = BATCH2 if seed == 1 else SMALL
    cpu = celosia.op(target="cpu", name=f"qd_cpu_{seed}")(qdense)
    acc = celosia.op(target="accel", config=cfg, name=f"qd_acc_{seed}")(qdense)
    for _ in range(2):
        m, k, n = _shape(rng, cfg)
        x, w = _i8(rng, (m, k)), _i8(rng, (n, k))
        bias, scale = _bias_scale(rng, n)
        kw = dict(shift=int(rng.integers(4, 14)), lo=int(rng.integers(-128, 0)),
                  hi=int(rng.integers(0, 128)))
        want = qdense_reference(x, w, bias, scale, **kw)
        np.testing.assert_array_equal(acc(x, w, bias, scale, **kw), want)
        np.testing.assert_array_equal(cpu(x, w, bias, scale, **kw), want)


def test_mixed_epilogue_operands_and_layouts():
    rng = np.random.default_rng(5)
    cpu = celosia.op(target="cpu", name="mixed_cpu")(mixed)
    acc = celosia.op(target="accel", config=BATCH2, name="mixed_acc")(mixed)
    for m, k, n in ((5, 7, 6), (8, 4, 12)):
        at, b = _i8(rng, (k, m)), _i8(rng, (k, n))
        rowv = rng.integers(-2**31, 2**31 - 1, m, dtype=np.int64).astype(np.int32)
        resid = _i8(rng, (m, n))
        s = rng.integers(-2**20, 2**20, 1).astype(np.int32)
        jv = rng.integers(-30000, 30000, n).astype(np.int16)
        want = mixed_reference(at, b, rowv, resid, s, jv)
        np.testing.assert_array_equal(cpu(at, b, rowv, resid, s, jv), want)
        np.testing.assert_array_equal(acc(at, b, rowv, resid, s, jv), want)
    kernel = next(iter(acc._builds.values()))[0]
    # the product's rows are the output's first axis (j: b's columns)
    kinds = sorted((o.kind, o.int8, o.negate) for o in kernel.match.operands)
    assert kinds == [("col", False, True), ("full", True, False), ("row", False, False),
                     ("scalar", False, False), ("scalar", False, False)]


def test_cache_stats_and_cycle_model():
    rng = np.random.default_rng(3)
    acc = celosia.op(target="accel", config="small", executor="cycle", name="qd_cycle")(qdense)
    x, w = _i8(rng, (8, 16)), _i8(rng, (12, 16))
    bias, scale = _bias_scale(rng, 12)
    want = qdense_reference(x, w, bias, scale)
    np.testing.assert_array_equal(acc(x, w, bias, scale), want)
    first = dict(acc.last_stats)
    np.testing.assert_array_equal(acc(x, w, bias, scale), want)   # same build, resident
    assert acc.builds == 1
    assert acc.last_stats["cycles"] == first["cycles"] > 0
    assert acc.last_stats["useful_macs"] == 8 * 16 * 12 == acc.last_stats["macs"]
    assert 0 < acc.last_stats["useful_utilization"] <= 1
    acc(x, w, bias, scale, shift=5)                                 # a constant: new build
    assert acc.builds == 2
    # tune=4: the four best-estimated tilings measured, the fastest kept
    tuned = celosia.op(target="accel", config="small", executor="cycle", tune=4,
                       name="qd_tuned")(qdense)
    np.testing.assert_array_equal(tuned(x, w, bias, scale), want)
    measured = tuned.last_build.tuning
    assert len(measured) == 4 and measured[0][1] == acc.last_build.knobs
    assert tuned.last_stats["cycles"] == min(c for c, _ in measured) <= first["cycles"]


def test_rtl_agrees_with_the_cycle_model():
    """The same builds on the Verilated RTL (small configuration): identical outputs, and
    the cycle model's cycle count."""
    rng = np.random.default_rng(12)
    x, w = _i8(rng, (6, 10)), _i8(rng, (7, 10))
    bias, scale = _bias_scale(rng, 7)
    q, kt = _i8(rng, (2, 3, 5)), _i8(rng, (2, 4, 5))
    cycles = {}
    for ex in ("cycle", "rtl"):
        qd = celosia.op(target="accel", config="small", executor=ex, name=f"qd_{ex}")(qdense)
        np.testing.assert_array_equal(qd(x, w, bias, scale),
                                      qdense_reference(x, w, bias, scale))
        cycles[ex] = qd.last_stats["cycles"]
        bm = celosia.op(target="accel", config="small", executor=ex, name=f"bm_{ex}")(
            _batched_matmul)
        np.testing.assert_array_equal(bm(q, kt), np.einsum(
            "bik,bjk->bij", q.astype(np.int32), kt.astype(np.int32)))
        cycles[ex, "bm"] = bm.last_stats["cycles"]
    assert cycles["rtl"] == cycles["cycle"] > 0
    assert cycles["rtl", "bm"] == cycles["cycle", "bm"] > 0


def _batched_matmul(q, kt):
    d = te.reduce_axis(q.shape[2], "d")
    return te.compute((q.shape[0], q.shape[1], kt.shape[1]), lambda bb, i, j: te.sum(
        q[bb, i, d].astype("int32") * kt[bb, j, d].astype("int32"), axis=[d]), "s")


def test_numpy_out_and_torch_custom_op():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    acc = celosia.op(target="accel", config="small", name="qd_torch")(qdense)
    x, w = _i8(rng, (6, 10)), _i8(rng, (7, 10))
    bias, scale = _bias_scale(rng, 7)
    want = qdense_reference(x, w, bias, scale, shift=8)
    out = np.empty((6, 7), np.int8)
    acc(x, w, bias, scale, out=out, shift=8)
    np.testing.assert_array_equal(out, want)
    tx, tw, tb, ts = (torch.from_numpy(v) for v in (x, w, bias, scale))
    got = acc(tx, tw, tb, ts, shift=8)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int8
    np.testing.assert_array_equal(got.numpy(), want)
    got = torch.ops.celosia.qd_torch(tx, tw, tb, ts, shift=8)
    np.testing.assert_array_equal(got.numpy(), want)


def test_inside_torch_compile():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    acc = celosia.op(target="accel", config="small", name="qd_compiled")(qdense)
    x, w = _i8(rng, (5, 9)), _i8(rng, (6, 9))
    bias, scale = _bias_scale(rng, 6)
    want = qdense_reference(x, w, bias, scale, shift=8)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(a, b, c, d):
        return acc(a, b, c, d, shift=8).to(torch.int32) + 1
    got = f(*(torch.from_numpy(v) for v in (x, w, bias, scale)))
    np.testing.assert_array_equal(got.numpy(), want.astype(np.int32) + 1)


def _err(fn, *arrays, **kw):
    o = celosia.op(target="accel", config="small", name=f"bad_{fn.__name__}")(fn)
    with pytest.raises(AccelMappingError) as e:
        o(*arrays, **kw)
    assert 'target="cpu"' in str(e.value) and isinstance(e.value, OpError)
    return str(e.value)


def test_unmappable_computes_say_what_and_suggest_cpu():
    rng = np.random.default_rng(0)
    a, b = _i8(rng, (4, 4)), _i8(rng, (4, 4))
    f = rng.random((4, 4)).astype(np.float32)

    def add(x, y):
        return te.compute(x.shape, lambda i, j: x[i, j] + y[i, j], "z")
    assert "no reduction" in _err(add, a, b)
    assert "float32" in _err(matmul, f, f)
    assert "int16" in _err(matmul, a.astype(np.int16), b)

    def relu_select(x, y):
        c = _matmul(x, y)
        return te.compute(c.shape, lambda i, j: select(c[i, j] > 0, c[i, j], 0), "r")
    assert "select" in _err(relu_select, a, b)

    def divide(x, y):
        c = _matmul(x, y)
        return te.compute(c.shape, lambda i, j: (c[i, j] // 3).astype("int8"), "d")
    assert "no //" in _err(divide, a, b)

    def square(x, y):
        c = _matmul(x, y)
        return te.compute(c.shape, lambda i, j: (c[i, j] * c[i, j]).astype("int8"), "s")
    assert "both operands" in _err(square, a, b)

    def middle_cast(x, y):
        c = _matmul(x, y)
        return te.compute(c.shape, lambda i, j: c[i, j].astype("int8").astype("int32") + 1, "m")
    assert "in the middle" in _err(middle_cast, a, b)

    def shifted_read(x, y):
        c = _matmul(x, y)
        return te.compute((3, 4), lambda i, j: c[i + 1, j], "s")
    assert "element-wise" in _err(shifted_read, a, b)

    def wide_out(x, y):
        c = _matmul(x, y)
        return te.compute(c.shape, lambda i, j: c[i, j].astype("int16"), "w")
    assert "int16" in _err(wide_out, a, b)

    def two_reductions(x, y):
        k = te.reduce_axis(4, "k")
        r = te.reduce_axis(4, "r")
        return te.compute((4,), lambda i: te.sum(x[i, k].astype("int32") * y[r, k].astype(
            "int32"), axis=[k, r]), "c")
    assert "at least two dimensions" in _err(two_reductions, a, b)

    def two_reduction_axes(x, y):
        k = te.reduce_axis(4, "k")
        r = te.reduce_axis(4, "r")
        return te.compute((4, 4), lambda i, j: te.sum(x[i, k].astype("int32") * y[r, j].astype(
            "int32"), axis=[k, r]), "c")
    assert "2 reduction axes" in _err(two_reduction_axes, a, b)

    def outer(x, y):
        k = te.reduce_axis(4, "k")
        return te.compute((4, 4), lambda i, j: te.sum(x[i, k].astype("int32") * y[i, k].astype(
            "int32"), axis=[k]), "c")
    assert "the rows and the columns" in _err(outer, a, b)

    def float_operand(x, y, f):
        c = _matmul(x, y)
        return te.compute(c.shape, lambda i, j: c[i, j] + (f[j].astype("float32") * 2.0
                                                            ).astype("int32"), "o")
    assert "integer arithmetic" in _err(float_operand, a, b, np.arange(4, dtype=np.int32))

    def too_far(x, y):
        k = te.reduce_axis(6, "k")
        return te.compute((4, 4), lambda i, j: te.sum(
            x[i, k].astype("int32") * y[k, j].astype("int32"), axis=[k]), "c")
    assert "outside x's dimension of 4" in _err(too_far, a, b)


def test_product_of_sub_ranges():
    """A product over part of its inputs (extents smaller than the arrays) packs only the
    part it reads."""
    def part(x, y):
        k = te.reduce_axis(5, "k")
        return te.compute((3, 6), lambda i, j: te.sum(
            x[i, k].astype("int32") * y[j, k].astype("int32"), axis=[k]), "c")
    rng = np.random.default_rng(2)
    x, y = _i8(rng, (7, 9)), _i8(rng, (8, 9))
    want = x[:3, :5].astype(np.int32) @ y[:6, :5].astype(np.int32).T
    acc = celosia.op(target="accel", config="small", name="part_acc")(part)
    np.testing.assert_array_equal(acc(x, y), want)
    np.testing.assert_array_equal(celosia.op(target="cpu", name="part_cpu")(part)(x, y), want)


def test_unused_input_on_both_targets():
    """An argument the compute does not read (here ``row`` and ``full``) is accepted."""
    rng = np.random.default_rng(1)
    a, b = _i8(rng, (3, 5)), _i8(rng, (5, 2))
    col, row, full = np.arange(2, dtype=np.int32), np.zeros(3, np.int32), _i8(rng, (3, 2))
    sc = np.array([7], np.int32)
    want = chain_reference(a, b, col, row, full, sc, "+:col,*:sc")
    for target in ("cpu", "accel"):
        o = celosia.op(target=target, name=f"unused_{target}")(chain)
        np.testing.assert_array_equal(o(a, b, col, row, full, sc, recipe="+:col,*:sc"), want)


def attention_scores(q, kt, scale, bias, shift=7):
    """Per batch and head: q [B, H, M, D] times kt [B, H, N, D]^T, * scale[h] + bias[j],
    >> shift, clipped to int8: a product with two batch axes."""
    d = te.reduce_axis(q.shape[3], "d")
    s = te.compute((q.shape[0], q.shape[1], q.shape[2], kt.shape[2]),
                   lambda bb, h, i, j: te.sum(q[bb, h, i, d].astype("int32")
                                              * kt[bb, h, j, d].astype("int32"), axis=[d]), "s")
    return te.compute(s.shape, lambda bb, h, i, j: minimum(maximum(
        (s[bb, h, i, j] * scale[h] + bias[j]) >> shift, -128), 127).astype("int8"), "y")


def shared_weight(x, w):
    """x [B, M, K] times one w [K, N] (not batched), read from slice 1 of x's first axis:
    an int32 [M, B, N] result (the batch axis in the middle)."""
    k = te.reduce_axis(w.shape[0], "k")
    return te.compute((x.shape[2], x.shape[1], w.shape[1]), lambda i, bb, j: te.sum(
        x[1, bb, i, k].astype("int32") * w[k, j].astype("int32"), axis=[k]), "c")


def shared_requant(x, w, sc, r, shift=3):
    """x [B, M, K] times one w [N, K]: the batch folds into the rows; a per-batch scale and
    a residual [M, B, N] (the output's layout) read in the epilogue."""
    k = te.reduce_axis(w.shape[1], "k")
    c = te.compute((x.shape[1], x.shape[0], w.shape[0]), lambda i, bb, j: te.sum(
        x[bb, i, k].astype("int32") * w[j, k].astype("int32"), axis=[k]), "c")
    return te.compute(c.shape, lambda i, bb, j: minimum(maximum(
        (c[i, bb, j] * sc[bb] + r[i, bb, j].astype("int32")) >> shift, -128), 127
    ).astype("int8"), "y")


def test_batched_products():
    rng = np.random.default_rng(6)
    q, kt = _i8(rng, (2, 3, 5, 6)), _i8(rng, (2, 3, 7, 6))
    scale = rng.integers(1, 300, 3).astype(np.int32)
    bias = rng.integers(-3000, 3000, 7).astype(np.int32)
    acc = _wrap(np.einsum("bhid,bhjd->bhij", q.astype(np.int64), kt.astype(np.int64)))
    want = np.clip((_wrap(acc * scale[None, :, None, None]) + bias) >> 7, -128, 127
                   ).astype(np.int8)
    on_accel = celosia.op(target="accel", config=BATCH2, name="att_acc")(attention_scores)
    on_cpu = celosia.op(target="cpu", name="att_cpu")(attention_scores)
    np.testing.assert_array_equal(on_accel(q, kt, scale, bias), want)
    np.testing.assert_array_equal(on_cpu(q, kt, scale, bias), want)
    assert on_accel.last_build.match.lead == (2, 3)
    assert on_accel.last_stats["useful_macs"] == 6 * 5 * 6 * 7

    x, w = _i8(rng, (3, 4, 5, 9)), _i8(rng, (9, 6))
    want = np.einsum("bik,kj->ibj", x[1].astype(np.int64), w.astype(np.int64)).astype(np.int32)
    on_accel = celosia.op(target="accel", config="small", name="shared_acc")(shared_weight)
    np.testing.assert_array_equal(on_accel(x, w), want)
    np.testing.assert_array_equal(celosia.op(target="cpu", name="shared_cpu")(shared_weight)(
        x, w), want)
    assert not on_accel.last_build.match.b.batched and on_accel.last_build.match.a.batched
    assert on_accel.last_build.match.fold

    x, w = _i8(rng, (3, 5, 7)), _i8(rng, (6, 7))
    sc, r = rng.integers(-40, 40, 3).astype(np.int32), _i8(rng, (5, 3, 6))
    c = np.einsum("bik,jk->ibj", x.astype(np.int64), w.astype(np.int64))
    want = np.clip((c * sc[None, :, None] + r) >> 3, -128, 127).astype(np.int8)
    for cfg in (SMALL, BATCH2):
        on_accel = celosia.op(target="accel", config=cfg, name=f"sr_{cfg.batch}")(shared_requant)
        np.testing.assert_array_equal(on_accel(x, w, sc, r), want)
        assert on_accel.last_build.match.fold and on_accel.last_build.match.rows == 15


def test_fallback_to_cpu_and_dram_reuse():
    """target=("accel", "cpu"): a build the accelerator cannot take runs on the CPU and
    says why; a full DRAM drops the older accelerator builds instead of failing."""
    from celosia.driver import Device

    def maybe(x, y, div=1):
        c = _matmul(x, y)
        return te.compute(c.shape, lambda i, j: (c[i, j] // div if div > 1 else c[i, j] >> 2
                                                 ).astype("int8"), "d")
    o = celosia.op(target=("accel", "cpu"), config="small", name="maybe")(maybe)
    o._device = Device(SMALL, target="fsim", dram_size=24 << 10)
    rng = np.random.default_rng(7)
    a, b = _i8(rng, (20, 24)), _i8(rng, (24, 20))
    prod = a.astype(np.int32) @ b
    np.testing.assert_array_equal(o(a, b), (prod >> 2).astype(np.int8))
    assert o.last_target == "accel" and o.last_fallback is None and o.last_stats["macs"]
    np.testing.assert_array_equal(o(a, b, div=3), (prod // 3).astype(np.int8))
    assert o.last_target == "cpu" and "no //" in o.last_fallback and o.last_stats == {}
    # each of these builds fills most of the 24 KiB: the next one drops the older ones
    for n in (40, 44, 48):
        x, y = _i8(rng, (n, 48)), _i8(rng, (48, n))
        np.testing.assert_array_equal(o(x, y), ((x.astype(np.int32) @ y) >> 2).astype(np.int8))
    assert o.builds == 5 and len(o._builds) < 5 and o.last_target == "accel"
    tiny = celosia.op(target="accel", config="small", name="tiny")(matmul)
    tiny._device = Device(SMALL, target="fsim", dram_size=4 << 10)
    with pytest.raises(OpError, match="does not fit the device's 4096 bytes"):
        tiny(_i8(rng, (40, 40)), _i8(rng, (40, 40)))
    with pytest.raises(OpError, match="name each target once"):
        celosia.op(target=("cpu", "cpu"))(matmul)


def _layout_case(rng):
    """A random batched product: batch axes (0-2), factor layouts, which factor has batch
    axes, the output's axis order, and an epilogue operand varying along random axes."""
    nl = int(rng.integers(0, 3))
    names = [f"l{p}" for p in range(nl)] + ["i", "j"]
    ext = {n: int(rng.integers(1, 4)) for n in names[:nl]}
    ext.update(i=int(rng.integers(1, 9)), j=int(rng.integers(1, 11)), k=int(rng.integers(1, 11)))
    a_ax = [n for n in names[:nl] if rng.random() < 0.7] + ["i", "k"]
    b_ax = [n for n in names[:nl] if rng.random() < 0.5] + ["j", "k"]
    rng.shuffle(a_ax)
    rng.shuffle(b_ax)
    out_ax = list(names)
    rng.shuffle(out_ax)
    op_ax = [n for n in names if rng.random() < 0.5]
    rng.shuffle(op_ax)
    return ext, a_ax, b_ax, out_ax, op_ax, bool(rng.random() < 0.5)


def _layout_op(ext, a_ax, b_ax, out_ax, op_ax, to_int8):
    def f(a, b, t):
        k = te.reduce_axis(ext["k"], "k")

        def prod(*v):
            env = dict(zip(out_ax, v), k=k)
            return te.sum(a[tuple(env[n] for n in a_ax)].astype("int32")
                          * b[tuple(env[n] for n in b_ax)].astype("int32"), axis=[k])
        c = te.compute(tuple(ext[n] for n in out_ax), prod, "c")

        def epi(*v):
            env = dict(zip(out_ax, v))
            x = (c[v] * 3 - t[tuple(env[n] for n in op_ax) or (0,)]) >> 1
            return minimum(maximum(x, -128), 127).astype("int8") if to_int8 else x
        return te.compute(c.shape, epi, "y")
    return f


@pytest.mark.parametrize("seed", range(3))
def test_random_layouts(seed):
    """Random batch axes, factor layouts, output axis orders and operand shapes: the
    accelerator build equals numpy (einsum) and the CPU build."""
    rng = np.random.default_rng(200 + seed)
    for case in range(4):
        ext, a_ax, b_ax, out_ax, op_ax, to_int8 = _layout_case(rng)
        a = _i8(rng, tuple(ext[n] for n in a_ax))
        b = _i8(rng, tuple(ext[n] for n in b_ax))
        t = rng.integers(-2**31, 2**31, tuple(ext[n] for n in op_ax) or (1,),
                         dtype=np.int64).astype(np.int32)
        letter = {n: chr(ord("a") + q) for q, n in enumerate(sorted(ext))}
        sub = ",".join("".join(letter[n] for n in ax) for ax in (a_ax, b_ax))
        sub += "->" + "".join(letter[n] for n in out_ax)
        c = _wrap(np.einsum(sub, a.astype(np.int64), b.astype(np.int64)))
        tt = t.astype(np.int64) if op_ax else np.int64(t[0])
        if op_ax:  # t's axes -> the output's, broadcast over the others
            perm = sorted(range(len(op_ax)), key=lambda q: out_ax.index(op_ax[q]))
            tt = np.transpose(tt, perm).reshape(tuple(ext[n] if n in op_ax else 1
                                                      for n in out_ax))
        want = _wrap(_wrap(c * 3) - tt) >> 1
        want = np.clip(want, -128, 127).astype(np.int8) if to_int8 else want.astype(np.int32)
        f = _layout_op(ext, a_ax, b_ax, out_ax, op_ax, to_int8)
        cfg = BATCH2 if case % 2 else SMALL
        what = f"{a_ax} x {b_ax} -> {out_ax}, operand over {op_ax}"
        got = celosia.op(target="accel", config=cfg, name=f"lay_{seed}_{case}")(f)(a, b, t)
        np.testing.assert_array_equal(got, want, err_msg=what)
        cpu = celosia.op(target="cpu", name=f"lay_cpu_{seed}_{case}")(f)(a, b, t)
        np.testing.assert_array_equal(cpu, want, err_msg=what)


def test_a_registered_intrinsic(monkeypatch):
    """intrinsic=: the product is tensorized with a user-registered intrinsic (an equal
    declaration of the GEMM micro-op); one computing something else is refused."""
    from celosia.compiler.accel import intrin
    from celosia.errors import CompilerError

    monkeypatch.setattr(intrin, "_factories", {})
    monkeypatch.setattr(intrin, "_origin", {})
    monkeypatch.setattr(intrin, "_entry_points_read", False)

    def declared(cfg, transposed=False):
        acts = te.placeholder((cfg.batch, cfg.block), "int8", "acts")
        filt = te.placeholder((cfg.block, cfg.block), "int8", "filt")
        r = te.reduce_axis(cfg.block, "r")
        out = te.compute((cfg.batch, cfg.block), lambda row, col: te.sum(
            (filt[r, col] if transposed else filt[col, r]).astype("int32")
            * acts[row, r].astype("int32"), axis=[r]), "mine")
        return intrin.TensorIntrinsic("mine", out, {acts: "inp", filt: "wgt", out: "acc"},
                                      "uop_gemm")
    intrin.register_intrinsic("my_gemm", declared)
    intrin.register_intrinsic("wrong_gemm", lambda cfg: declared(cfg, transposed=True))
    rng = np.random.default_rng(13)
    x, w = _i8(rng, (5, 9)), _i8(rng, (6, 9))
    bias, scale = np.arange(6, dtype=np.int32) * 100, np.full(6, 3, np.int32)
    o = celosia.op(target="accel", config="small", intrinsic="my_gemm", name="mine")(qdense)
    np.testing.assert_array_equal(o(x, w, bias, scale), qdense_reference(x, w, bias, scale))
    bad = celosia.op(target="accel", config="small", intrinsic="wrong_gemm", name="wrong")(qdense)
    with pytest.raises(CompilerError, match="wrong_gemm"):
        bad(x, w, bias, scale)


def test_rebuilds_on_one_device():
    """Builds evicted and made again on one Device (max_builds=1, alternating shapes): the
    device's micro-op kernel cache must not confuse a new build's kernels with a collected
    one's. (Its key was id() of the kernel statement, which a new statement can reuse; a
    script doing this failed about one build in twenty, though not reliably under pytest.)"""
    o = celosia.op(target="accel", config="small", max_builds=1, name="rebuilt")(matmul)
    rng = np.random.default_rng(15)
    for it in range(60):
        m = 3 + it % 4
        a, b = _i8(rng, (m, 6)), _i8(rng, (6, 5))
        np.testing.assert_array_equal(o(a, b), a.astype(np.int32) @ b)
    assert o.builds == 60


def test_threads_share_an_op_with_evictions():
    """Calls from several threads on one accelerator op keeping one build: every result is
    right although each call may evict another's build."""
    import threading

    o = celosia.op(target="accel", config="small", max_builds=1, name="threaded")(matmul)
    rng = np.random.default_rng(14)
    cases = [(_i8(rng, (m, 6)), _i8(rng, (6, 5))) for m in (3, 4, 5, 6)]
    errors = []

    def work(a, b):
        try:
            for _ in range(3):
                np.testing.assert_array_equal(o(a, b), a.astype(np.int32) @ b)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=c) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(o._builds) == 1


def test_decorator_errors():
    with pytest.raises(OpError, match="executor"):
        celosia.op(target="accel", executor="board")(matmul)
    with pytest.raises(OpError, match="options of"):
        celosia.op(target="cpu", config="small")(matmul)
    with pytest.raises(OpError, match="how many tilings"):
        celosia.op(target="accel", tune=-1)(matmul)
    with pytest.raises(celosia.CelosiaError, match="preset"):
        celosia.op(target="accel", config="no-such-config")(matmul)
