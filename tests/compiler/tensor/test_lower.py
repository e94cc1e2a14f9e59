"""Tensor expressions, schedules and lowering: printed IR (before/expected) and the IR
interpreter against numpy."""

import textwrap

import numpy as np
import pytest

from celosia.compiler.tensor import te
from celosia.errors import CompilerError
from celosia.compiler.tensor.expr import max_expr, min_expr, select
from celosia.compiler.tensor.lower import lower
from celosia.compiler.tensor.schedule import create_schedule
from celosia.compiler.tensor.tir import interpret, verify


def _matmul(m=8, k=12, n=6):
    a = te.placeholder((m, k), "int8", "A")
    w = te.placeholder((n, k), "int8", "W")
    r = te.reduce_axis(k, "r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype("int32") * w[j, r].astype("int32"),
                                               axis=[r]), "C")
    return a, w, c


def test_lower_matmul_with_split_and_cache_read_prints_expected_ir():
    a, w, c = _matmul()
    s = create_schedule(c)
    i, j = s[c].axes
    io, ii = s[c].split(i, 4)
    ro, ri = s[c].split(s[c].reduce_axes[0], 3)
    s[c].reorder(io, ro, j, ii, ri)
    al = s.cache_read(a, "inp", [c])
    s[al].compute_at(s[c], ro)
    f = lower(s, [a, w, c])
    expected = textwrap.dedent("""\
        def main(A: int8[8, 12], W: int8[6, 12], C: int32[8, 6]):
          # stage C
          for i.outer in range(2):
            for j in range(6):
              for i.inner in range(4):
                C[i.outer * 4 + i.inner, j] = 0
            for r.outer in range(4):
              A.inp = alloc(4, 3; int8, inp)
              # stage A.inp
              for ax0 in range(4):
                for ax1 in range(3):
                  A.inp[ax0, ax1] = A[i.outer * 4 + ax0, r.outer * 3 + ax1]
              for j in range(6):
                for i.inner in range(4):
                  for r.inner in range(3):
                    C[i.outer * 4 + i.inner, j] = C[i.outer * 4 + i.inner, j] + int32(A.inp[i.inner, r.inner]) * int32(W[j, r.outer * 3 + r.inner])
        """)
    assert str(f) == expected


@pytest.mark.parametrize("seed", range(3))
def test_interpreted_matmul_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    a, w, c = _matmul()
    s = create_schedule(c)
    i, j = s[c].axes
    io, ii = s[c].split(i, [1, 2, 4][seed])
    jo, ji = s[c].split(j, [3, 2, 1][seed])
    s[c].reorder(jo, io, ii, ji)
    f = lower(s, [a, w, c])
    verify(f)
    av = rng.integers(-128, 128, (8, 12), dtype=np.int8)
    wv = rng.integers(-128, 128, (6, 12), dtype=np.int8)
    cv = np.zeros((8, 6), np.int32)
    interpret(f, av, wv, cv)
    np.testing.assert_array_equal(cv, av.astype(np.int32) @ wv.astype(np.int32).T)


def test_init_in_reduce_loop_runs_on_the_first_iteration():
    a, w, c = _matmul()
    s = create_schedule(c)
    i, j = s[c].axes
    io, ii = s[c].split(i, 4)
    ro, ri = s[c].split(s[c].reduce_axes[0], 3)
    s[c].reorder(io, ro, j, ii, ri)
    s[c].init_in_reduce_loop()
    f = lower(s, [a, w, c])
    expected = textwrap.dedent("""\
        def main(A: int8[8, 12], W: int8[6, 12], C: int32[8, 6]):
          # stage C
          for i.outer in range(2):
            for r.outer in range(4):
              if r.outer == 0:
                for j in range(6):
                  for i.inner in range(4):
                    C[i.outer * 4 + i.inner, j] = 0
              for j in range(6):
                for i.inner in range(4):
                  for r.inner in range(3):
                    C[i.outer * 4 + i.inner, j] = C[i.outer * 4 + i.inner, j] + int32(A[i.outer * 4 + i.inner, r.outer * 3 + r.inner]) * int32(W[j, r.outer * 3 + r.inner])
        """)
    assert str(f) == expected
    rng = np.random.default_rng(7)
    av = rng.integers(-128, 128, (8, 12), dtype=np.int8)
    wv = rng.integers(-128, 128, (6, 12), dtype=np.int8)
    cv = np.full((8, 6), 99, np.int32)
    interpret(f, av, wv, cv)
    np.testing.assert_array_equal(cv, av.astype(np.int32) @ wv.astype(np.int32).T)
    x = te.placeholder((2,), "int32", "X")
    y = te.compute((2,), lambda v: x[v] + 1, "Y")
    with pytest.raises(CompilerError, match="not a reduction"):
        create_schedule(y)[y].init_in_reduce_loop()


def test_padded_conv_through_an_attached_stage_matches_numpy():
    h, pad = 6, 1
    x = te.placeholder((h, h), "int8", "X")
    k = te.placeholder((3, 3), "int8", "K")
    p = te.compute((h + 2, h + 2), lambda y, z: select(
        (y >= pad) & (y < h + pad) & (z >= pad) & (z < h + pad), x[y - pad, z - pad], 0), "P")
    dy, dx = te.reduce_axis(3, "dy"), te.reduce_axis(3, "dx")
    out = te.compute((h, h), lambda y, z: te.sum(p[y + dy, z + dx].astype("int32")
                                                 * k[dy, dx].astype("int32"), axis=[dy, dx]), "O")
    clip = te.compute((h, h), lambda y, z: min_expr(max_expr(out[y, z], -50), 50), "R")
    s = create_schedule(clip)
    y, z = s[clip].axes
    yo, yi = s[clip].split(y, 2)
    s[out].compute_at(s[clip], yo)
    s[out].set_scope("acc")
    s[p].set_scope("inp")
    s[p].compute_at(s[out], s[out].axes[0])
    f = lower(s, [x, k, clip])
    # Per output row, the padded stage computes only the 3 input rows it needs.
    assert "P = alloc(3, 8; int8, inp)" in str(f)
    assert "y_1 in range(" in str(f)  # P's y and O's y are printed apart
    rng = np.random.default_rng(1)
    xv = rng.integers(-128, 128, (h, h), dtype=np.int8)
    kv = rng.integers(-3, 4, (3, 3), dtype=np.int8)
    rv = np.zeros((h, h), np.int32)
    interpret(f, xv, kv, rv)
    xp = np.pad(xv.astype(np.int64), pad)
    want = sum(xp[a:a + h, b:b + h] * int(kv[a, b]) for a in range(3) for b in range(3))
    np.testing.assert_array_equal(rv, np.clip(want, -50, 50))


def test_schedule_errors_say_what_to_do():
    a, w, c = _matmul()
    s = create_schedule(c)
    with pytest.raises(CompilerError, match=r"factor 5 does not divide the extent 8; use one of \[1, 2, 4, 8\]"):
        s[c].split(s[c].axes[0], 5)
    with pytest.raises(CompilerError, match="is not a loop of stage C"):
        s[c].split(te.reduce_axis(3, "q"), 1)
    with pytest.raises(CompilerError, match="unknown scope"):
        s[c].set_scope("sram")
    with pytest.raises(CompilerError, match="different types"):
        a[0, 0] + w[0, 0].astype("int32")
    with pytest.raises(CompilerError, match="no truth value"):
        bool(a[0, 0] < 3)
    with pytest.raises(CompilerError, match="input A is read but not an argument"):
        lower(create_schedule(c), [w, c])
