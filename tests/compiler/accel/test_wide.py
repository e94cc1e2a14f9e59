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


@pytest.mark.parametrize("mode", ["int32", "exact", "carry"])
def test_the_rtl_agrees_with_the_cycle_model(mode):
    """The small configuration: the same wide programs on the RTL (Verilator) give the
    definition's products and the cycle model's cycle counts."""
    from celosia.compiler.accel.wide import (carry_correction, carry_plan, combine_exact,
                                             exact_correction, unpack_int64)
    from celosia.compiler.graph.qops import wide_matmul_exact

    exact, carry = mode != "int32", mode == "carry"
    cfg = HwConfig.load("small")
    b, k = cfg.batch, cfg.block
    rng = np.random.default_rng(8)
    a = _operand(rng, 16, (2, 10))
    w = _operand(rng, 16 if exact else 8, (6, 10), WEIGHT16_MAX)
    init = carry_plan(w)[0] if carry else 1
    spec = WideSpec(2, -(-10 // k) * k, -(-6 // k) * k, 2, 2 if exact else 1, exact=exact,
                    carry=carry, carry_init=init)
    fn = wide_dense(cfg, spec)
    args = [pack_wide_activation(a, cfg), pack_wide_weight(w, cfg)]
    if carry:
        args.append(carry_correction(w, cfg, init))
    elif not exact:
        args.append(wide_correction(w, cfg))
    planes = 8 if carry else (spec.accumulators if exact else 1) * 4
    cycles = {}
    for target in ("rtl", "cycle"):
        out = np.zeros((planes, spec.m // b, spec.o // k, b, k), np.int8)
        stats = fn(Device(cfg, target, dram_size=1 << 20), *args, out)
        cycles[target] = stats["cycles"]
        if carry:
            got, want = unpack_int64(out, 2, 6), wide_matmul_exact(a, w)
        elif exact:
            got, want = combine_exact(out, 2, 6, exact_correction(w)), wide_matmul_exact(a, w)
        else:
            got, want = unpack_acc32(out, 2, 6), wide_matmul(a, w)
        np.testing.assert_array_equal(got, want, err_msg=target)
    assert cycles["rtl"] == cycles["cycle"] > 0


def _carry_run(cfg, a, w, target, init=None):
    """A carry program's product: the int64 read straight from its eight byte planes."""
    from celosia.compiler.accel.wide import carry_correction, carry_plan, unpack_int64

    b, k = cfg.batch, cfg.block
    (m, kd), o = a.shape, w.shape[0]
    na = 1 if a.dtype == np.int8 else 2
    count, problem = carry_plan(w, na)
    assert problem is None
    count = count if init is None else init
    spec = WideSpec(-(-m // b) * b, -(-kd // k) * k, -(-o // k) * k, na,
                    1 if w.dtype == np.int8 else 2, exact=True, carry=True, carry_init=count)
    args = [pack_wide_activation(a, cfg), pack_wide_weight(w, cfg)]
    if count:
        args.append(carry_correction(w, cfg, count, na))
    out = np.zeros((8, spec.m // b, spec.o // k, b, k), np.int8)
    stats = wide_dense(cfg, spec)(Device(cfg, target, dram_size=16 << 20), *args, out)
    return unpack_int64(out, m, o), stats


@pytest.mark.parametrize("preset,m,kd,o,abits,wbits,init", [
    ("default", 1, 256, 256, 16, 16, None),   # a body's step: 32 bits would wrap
    ("default", 1, 256, 256, 16, 16, 2),      # the correction split per weight digit
    ("default", 3, 387, 40, 16, 16, None),    # ragged K, several rows
    ("default", 2, 70, 300, 16, 8, None),     # int8 weights, a result of 600 elements
    ("default", 2, 33, 20, 8, 16, None),      # int8 activations: no correction
    ("small", 5, 19, 10, 16, 16, None),
    ("small", 3, 8, 12, 16, 8, None)])
def test_carry_products_are_exact(preset, m, kd, o, abits, wbits, init):
    """Carry programs (the ALU puts the accumulators together) give the exact int64 product
    on fsim and the cycle model, extremes included; with int16 weights in about as many
    cycles as storing every accumulator (the host's work is what they save)."""
    from celosia.compiler.accel.wide import combine_exact, exact_correction
    from celosia.compiler.graph.qops import wide_matmul_exact

    cfg = HwConfig.load(preset)
    b, k = cfg.batch, cfg.block
    rng = np.random.default_rng(kd + o)
    a = _operand(rng, abits, (m, kd))
    w = _operand(rng, wbits, (o, kd), WEIGHT16_MAX)
    a[0, :] = -32768 if abits == 16 else -128
    w[0, :] = WEIGHT16_MAX if wbits == 16 else 127
    w[-1, :] = -32768 if wbits == 16 else -128
    if m > 1:
        a[1, :] = 32767 if abits == 16 else 127
    want = wide_matmul_exact(a, w)
    for target in ("fsim", "cycle"):
        got, stats = _carry_run(cfg, a, w, target, init)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want, err_msg=target)
    spec = WideSpec(-(-m // b) * b, -(-kd // k) * k, -(-o // k) * k, abits // 8, wbits // 8,
                    exact=True)
    out = np.zeros((4 * spec.accumulators, spec.m // b, spec.o // k, b, k), np.int8)
    plain = wide_dense(cfg, spec)(Device(cfg, "cycle", dram_size=16 << 20),
                                  pack_wide_activation(a, cfg), pack_wide_weight(w, cfg), out)
    np.testing.assert_array_equal(
        combine_exact(out, m, o, exact_correction(w) if abits == 16 else None), want)
    if init is None and wbits == 16:
        # an ACC load of the correction and the carries' ALU steps for four fewer stores:
        # measured +0.2% on a [1, 256] x [256, 256] step, +5% on the small preset's tiny one
        assert stats["cycles"] <= 1.1 * plain["cycles"], (stats["cycles"], plain["cycles"])


def test_carry_plan_bounds():
    """The correction goes to the last accumulator while every accumulator stays inside
    int32, one per weight digit past that, and no carry program at all when even that
    could overflow (then the product is stored exactly, accumulator by accumulator)."""
    from celosia.compiler.accel.wide import carry_plan

    assert carry_plan(np.full((4, 256), WEIGHT16_MAX, np.int16)) == (1, None)
    assert carry_plan(np.full((4, 256), 127, np.int8)) == (1, None)
    assert carry_plan(np.full((4, 256), 127, np.int8), a_digits=1) == (0, None)
    # 128 * sum(w) in the last accumulator passes int32 from about 500 inputs: split
    assert carry_plan(np.full((2, 4096), WEIGHT16_MAX, np.int16)) == (2, None)
    count, problem = carry_plan(np.full((1, 60000), WEIGHT16_MAX, np.int16))
    assert count == 0 and "past int32" in problem and "K=60000" in problem
    with pytest.raises(CompilerError, match="exact=True"):
        wide_dense(HwConfig.load("default"), WideSpec(16, 16, 16, carry=True))


def test_exact_in_int32():
    """An exact product whose every sum fits int32 (|a| <= 32768 times the row's sum of
    |w|) is the 32-bit program's result: no carries, four byte planes."""
    from celosia.compiler.accel.wide import exact_in_int32
    from celosia.compiler.graph.qops import wide_matmul_exact

    w = np.full((3, 516), 127, np.int8)
    assert exact_in_int32(w) and not exact_in_int32(np.full((3, 517), 127, np.int8))
    assert exact_in_int32(np.full((3, 2), 32639, np.int16))
    assert not exact_in_int32(np.full((3, 3), 32639, np.int16))
    cfg = HwConfig.load("default")
    a = np.full((2, 516), -32768, np.int16)
    a[1] = 32767
    w[1] = -127
    w[2, ::2] = -128
    w[2, 1::2] = 126
    assert exact_in_int32(w)
    got, _ = _run(cfg, a, w, "cycle")
    np.testing.assert_array_equal(got, wide_matmul_exact(a, w))
