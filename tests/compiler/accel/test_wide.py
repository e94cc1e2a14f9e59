"""Wide integer products on the int8 GEMM core (compiler/accel/wide.py) against their
definition (qops.wide_matmul): int8 and int16 activations and weights, shapes that are not
multiples of BLOCK, several rows per batch block, both presets, on fsim and the cycle
model; the operand packing on its own; extreme values (int16's ends, wrap-around)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from celosia.compiler.accel.wide import (WEIGHT16_MAX, WideKnobs, WideSpec, pack_wide_activation,
                                         pack_wide_weight, split_activation, split_weight,
                                         unpack_acc32, wide_correction, wide_dense, wide_knobs)
from celosia.compiler.graph.qops import wide_matmul
from celosia.config import HwConfig
from celosia.driver import Device
from celosia.errors import CompilerError


def _operand(rng, bits, shape, top=None):
    if bits == 8:
        return rng.integers(-128, 128, shape).astype(np.int8)
    return rng.integers(-32768, (top or 32767) + 1, shape).astype(np.int16)


def _run(cfg, a, w, target, knobs=None):
    b, k = cfg.batch, cfg.block
    (m, kd), o = a.shape, w.shape[0]
    spec = WideSpec(-(-m // b) * b, -(-kd // k) * k, -(-o // k) * k,
                    1 if a.dtype == np.int8 else 2, 1 if w.dtype == np.int8 else 2)
    fn = wide_dense(cfg, spec, knobs)
    args = [pack_wide_activation(a, cfg), pack_wide_weight(w, cfg)]
    if spec.a_digits == 2:
        args.append(wide_correction(w, cfg))
    out = np.zeros((4, spec.m // b, spec.o // k, b, k), np.int8)
    stats = fn(Device(cfg, target, dram_size=16 << 20), *args, out)
    return unpack_acc32(out, m, o), stats


CASES = [  # preset, m, k, o, activation bits, weight bits
    ("default", 1, 256, 1024, 16, 8),   # an LSTM step, hidden 256
    ("default", 7, 40, 70, 16, 8),      # ragged K and O
    ("default", 7, 40, 400, 16, 8),     # a result of more than 2048 elements
    ("default", 3, 33, 20, 8, 8),
    ("default", 2, 20, 17, 16, 16),     # 4 passes, 3 accumulators
    ("default", 2, 24, 40, 8, 16),
    ("small", 5, 19, 10, 16, 8),
    ("small", 3, 8, 12, 16, 16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_wide_product_matches_the_definition_on_fsim_and_cycle(case):
    preset, m, kd, o, abits, wbits = case
    cfg = HwConfig.load(preset)
    rng = np.random.default_rng(sum(case[1:]))
    a = _operand(rng, abits, (m, kd))
    w = _operand(rng, wbits, (o, kd), WEIGHT16_MAX)
    want = wide_matmul(a, w)
    for target in ("fsim", "cycle"):
        got, stats = _run(cfg, a, w, target)
        np.testing.assert_array_equal(got, want, err_msg=target)
    assert stats["cycles"] > 0


def test_extremes_and_wraparound():
    """int16's ends (-32768, 32767) and weights at their limits: the int32 sum wraps, and
    the program wraps the same way."""
    cfg = HwConfig.load("default")
    a = np.full((2, 512), 32767, np.int16)
    a[1] = -32768
    w = np.full((16, 512), 127, np.int8)
    w[3] = -128
    want = wide_matmul(a, w)
    assert (want.astype(np.int64) != a.astype(np.int64) @ w.astype(np.int64).T).any()  # wrapped
    np.testing.assert_array_equal(_run(cfg, a, w, "fsim")[0], want)
    w16 = np.full((16, 64), WEIGHT16_MAX, np.int16)
    w16[5] = -32768
    a16 = np.full((1, 64), -32768, np.int16)
    np.testing.assert_array_equal(_run(cfg, a16, w16, "cycle")[0], wide_matmul(a16, w16))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.integers(1, 40), st.sampled_from([8, 16]),
       st.sampled_from([8, 16]), st.integers(0, 2**32 - 1))
def test_random_shapes_on_fsim(m, kd, o, abits, wbits, seed):
    cfg = HwConfig.load("default")
    rng = np.random.default_rng(seed)
    a, w = _operand(rng, abits, (m, kd)), _operand(rng, wbits, (o, kd), WEIGHT16_MAX)
    np.testing.assert_array_equal(_run(cfg, a, w, "fsim")[0], wide_matmul(a, w))


def test_digits_put_back_together():
    rng = np.random.default_rng(1)
    a = rng.integers(-32768, 32768, 1000).astype(np.int16)
    hi, lo = split_activation(a).astype(np.int64)
    np.testing.assert_array_equal(256 * hi + lo + 128, a)
    w = rng.integers(-32768, WEIGHT16_MAX + 1, 1000).astype(np.int16)
    whi, wlo = split_weight(w).astype(np.int64)
    np.testing.assert_array_equal(256 * whi + wlo, w)
    with pytest.raises(CompilerError, match="32639"):
        split_weight(np.array([32700], np.int16))
    # the fast path (BATCH = 1, one row) packs the same bytes as the general one
    cfg = HwConfig.load("default")
    row = rng.integers(-32768, 32768, (1, 64)).astype(np.int16)
    fast = pack_wide_activation(row, cfg)
    np.testing.assert_array_equal(fast.reshape(2, 64), split_activation(row).reshape(2, 64))


def test_tiles_that_do_not_fit_are_refused():
    cfg = HwConfig.load("default")
    spec = WideSpec(16, 512, 1024)
    knobs = wide_knobs(cfg, spec)
    assert 2 * spec.a_digits * knobs.tile_m * knobs.tile_k <= cfg.inp_depth
    with pytest.raises(CompilerError, match="do not fit"):
        wide_dense(cfg, spec, WideKnobs(16, 64, 32))
    with pytest.raises(CompilerError, match="must divide"):
        wide_dense(cfg, spec, WideKnobs(3, 1, 1))


@pytest.mark.parametrize("preset,m,kd,o,abits,wbits", [
    ("default", 1, 256, 256, 16, 16), ("default", 3, 70, 40, 16, 8), ("small", 2, 20, 9, 16, 16),
    ("default", 2, 33, 20, 8, 16), ("default", 9, 30, 300, 16, 16)])
def test_exact_products_do_not_wrap(preset, m, kd, o, abits, wbits):
    """The exact mode stores each accumulator: int16 x int16 products of 256 terms, which
    wrap in 32 bits, come out exactly (int64) on fsim and the cycle model."""
    from celosia.compiler.accel.wide import combine_exact, exact_correction
    from celosia.compiler.graph.qops import wide_matmul_exact

    cfg = HwConfig.load(preset)
    b, k = cfg.batch, cfg.block
    rng = np.random.default_rng(kd)
    a = _operand(rng, abits, (m, kd))
    w = _operand(rng, wbits, (o, kd), WEIGHT16_MAX)
    a[0, :] = -32768 if abits == 16 else -128
    w[0, :] = WEIGHT16_MAX if wbits == 16 else 127
    want = wide_matmul_exact(a, w)
    if abits == wbits == 16:
        assert (want != wide_matmul(a, w)).any()  # 32 bits would wrap
    spec = WideSpec(-(-m // b) * b, -(-kd // k) * k, -(-o // k) * k, abits // 8, wbits // 8,
                    exact=True)
    fn = wide_dense(cfg, spec)
    out = np.zeros((4 * spec.accumulators, spec.m // b, spec.o // k, b, k), np.int8)
    for target in ("fsim", "cycle"):
        out[...] = 0
        fn(Device(cfg, target, dram_size=16 << 20), pack_wide_activation(a, cfg),
           pack_wide_weight(w, cfg), out)
        got = combine_exact(out, m, o, exact_correction(w) if abits == 16 else None)
        np.testing.assert_array_equal(got, want, err_msg=target)


@pytest.mark.parametrize("exact", [False, True])
def test_the_rtl_agrees_with_the_cycle_model(exact):
    """The small configuration: the same wide programs on the RTL (Verilator) give the
    definition's products and the cycle model's cycle counts."""
    from celosia.compiler.accel.wide import combine_exact, exact_correction
    from celosia.compiler.graph.qops import wide_matmul_exact

    cfg = HwConfig.load("small")
    b, k = cfg.batch, cfg.block
    rng = np.random.default_rng(8)
    a = _operand(rng, 16, (2, 10))
    w = _operand(rng, 16 if exact else 8, (6, 10), WEIGHT16_MAX)
    spec = WideSpec(2, -(-10 // k) * k, -(-6 // k) * k, 2, 2 if exact else 1, exact=exact)
    fn = wide_dense(cfg, spec)
    args = [pack_wide_activation(a, cfg), pack_wide_weight(w, cfg)]
    if not exact:
        args.append(wide_correction(w, cfg))
    cycles = {}
    for target in ("rtl", "cycle"):
        out = np.zeros(((spec.accumulators if exact else 1) * 4, spec.m // b, spec.o // k, b, k),
                       np.int8)
        stats = fn(Device(cfg, target, dram_size=1 << 20), *args, out)
        cycles[target] = stats["cycles"]
        if exact:
            got, want = combine_exact(out, 2, 6, exact_correction(w)), wide_matmul_exact(a, w)
        else:
            got, want = unpack_acc32(out, 2, 6), wide_matmul(a, w)
        np.testing.assert_array_equal(got, want, err_msg=target)
    assert cycles["rtl"] == cycles["cycle"] > 0
