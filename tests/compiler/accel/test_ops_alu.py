"""Max pooling on the accelerator's ALU (compiler/accel/ops_alu.py) against the numpy
definition (compiler/graph/ops.py max_pool, -128 padding), on fsim and the cycle model:
random shapes, kernels, strides, dilations, paddings (also ceil mode's extra trailing
window), both presets; fsim and the cycle model leave identical DRAM."""

import zlib

import numpy as np
import pytest

from celosia.compiler.accel import ops_alu
from celosia.compiler.accel.ops import pack_nchw, pad_channels, unpack_nchw
from celosia.compiler.accel.ops_alu import (PoolKnobs, PoolSpec, maxpool, maxpool_reference,
                                            pool_knobs)
from celosia.compiler.graph.ops import pool_output_shape
from celosia.config import HwConfig
from celosia.driver import Device
from celosia.errors import CompilerError


def _spec(cfg, n, c, h, w, k, s, d, p, ceil):
    oh, ow = pool_output_shape((h, w), k, s, d, (*p, *p), ceil)
    return PoolSpec(n=n, c=-(-c // cfg.block) * cfg.block, h=h, w=w, oh=oh, ow=ow, kh=k[0],
                    kw=k[1], stride_h=s[0], stride_w=s[1], dil_h=d[0], dil_w=d[1],
                    pad_top=p[0], pad_left=p[1])


def _run(cfg, spec, x, knobs=None, target="fsim"):
    b, k = cfg.batch, cfg.block
    fn = maxpool(cfg, spec, knobs or pool_knobs(cfg, spec))
    xp = pack_nchw(pad_channels(x, 1, k), b, k)
    out = np.zeros((spec.n // b, spec.c // k, spec.oh, spec.ow, b, k), np.int8)
    dev = Device(cfg, target, dram_size=8 << 20)
    stats = fn(dev, xp, out)
    return unpack_nchw(out)[:, :x.shape[1]], stats


CASES = [  # (preset, n, c, h, w, kernel, stride, dilation, pads, ceil_mode)
    ("default", 1, 16, 12, 12, (3, 3), (2, 2), (1, 1), (1, 1), 0),   # ResNet's stem pool
    ("default", 1, 20, 9, 7, (2, 2), (2, 2), (1, 1), (0, 0), 1),     # ceil: a half window
    ("default", 1, 8, 6, 10, (3, 2), (1, 2), (2, 1), (2, 1), 0),     # dilated, uneven
    ("default", 1, 32, 13, 13, (5, 5), (1, 1), (1, 1), (2, 2), 0),   # SPPF's pool
    ("small", 1, 6, 8, 8, (3, 3), (2, 2), (1, 1), (1, 1), 0),
    ("small", 1, 4, 7, 5, (2, 3), (1, 1), (1, 1), (0, 1), 1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:5])))
def test_maxpool_matches_the_definition_on_fsim_and_cycle(case):
    preset, n, c, h, w, k, s, d, p, ceil = case
    cfg = HwConfig.load(preset)
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    x[:, :, 0, :] = -100  # windows of only negative values at the border: padding must lose
    spec = _spec(cfg, n, c, h, w, k, s, d, p, ceil)
    want = maxpool_reference(x, spec)
    got, _ = _run(cfg, spec, x)
    np.testing.assert_array_equal(got, want)
    got_cycle, stats = _run(cfg, spec, x, target="cycle")
    np.testing.assert_array_equal(got_cycle, want)
    assert stats["cycles"] > 0



@pytest.mark.parametrize("how", ["direct", "rows", "columns"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:5])))
def test_every_reduction_order_matches_the_definition(case, how, monkeypatch):
    """The window maxima taken directly, or separably (each input row's, or column's,
    windows first, in place) give the definition's result on every case, whichever the
    micro-op count would choose; tiles of several rows and columns included."""
    preset, n, c, h, w, k, s, d, p, ceil = case
    cfg = HwConfig.load(preset)
    rng = np.random.default_rng(zlib.crc32(repr((case, how)).encode()))
    x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    x[:, :, -1, :] = -128  # ties with the padding at the border
    spec = _spec(cfg, n, c, h, w, k, s, d, p, ceil)
    monkeypatch.setattr(ops_alu, "pool_passes", lambda *a: (how, 0))
    want = maxpool_reference(x, spec)
    for knobs in (None, PoolKnobs(max(1, spec.oh // 2), max(1, spec.ow // 3))):
        got, _ = _run(cfg, spec, x, knobs)
        np.testing.assert_array_equal(got, want, err_msg=str(knobs))


def test_separable_passes_take_fewer_micro_ops():
    """ResNet's stem pool (3x3, stride 2) and SPPF's (5x5, stride 1) are reduced in two
    passes, a 2x2 stride-2 pool directly; the separable form is fewer cycles on the cycle
    model than the direct one for the stem pool's shape."""
    cfg = HwConfig.load("default")
    stem = _spec(cfg, 1, 16, 112, 112, (3, 3), (2, 2), (1, 1), (1, 1), 0)
    sppf = _spec(cfg, 1, 16, 20, 20, (5, 5), (1, 1), (1, 1), (2, 2), 0)
    half = _spec(cfg, 1, 16, 20, 20, (2, 2), (2, 2), (1, 1), (0, 0), 0)
    assert ops_alu.pool_passes(stem, 5, 56, 11, 113)[0] != "direct"
    assert ops_alu.pool_passes(sppf, 16, 20, 20, 24)[0] != "direct"
    assert ops_alu.pool_passes(half, 10, 10, 20, 20)[0] == "direct"
    x = np.random.default_rng(7).integers(-128, 128, (1, 16, 112, 112), dtype=np.int8)
    got, fast = _run(cfg, stem, x, target="cycle")
    np.testing.assert_array_equal(got, maxpool_reference(x, stem))
    direct = ops_alu.pool_passes
    try:
        ops_alu.pool_passes = lambda *a: ("direct", 0)
        _, slow = _run(cfg, stem, x, target="cycle")
    finally:
        ops_alu.pool_passes = direct
    assert fast["cycles"] < 0.95 * slow["cycles"]

def test_small_tiles_cover_the_image():
    """Tiles of a few rows and columns (several O buffers in flight, border and inner
    tiles) give the same result as one tile."""
    cfg = HwConfig.load("default")
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 16, 11, 9), dtype=np.int8)
    spec = _spec(cfg, 1, 16, 11, 9, (3, 3), (2, 2), (1, 1), (1, 1), 1)
    want = maxpool_reference(x, spec)
    for knobs in (PoolKnobs(1, 1), PoolKnobs(2, 3), PoolKnobs(spec.oh, 2)):
        got, _ = _run(cfg, spec, x, knobs)
        np.testing.assert_array_equal(got, want, err_msg=str(knobs))


def test_large_image_is_tiled_to_fit_the_accumulator():
    cfg = HwConfig.load("small")
    spec = _spec(cfg, 1, 4, 64, 64, (3, 3), (2, 2), (1, 1), (1, 1), 0)
    knobs = pool_knobs(cfg, spec)
    ih = (knobs.tile_h - 1) * 2 + 3
    iw = (knobs.tile_w - 1) * 2 + 3
    assert ih * iw + 2 * knobs.tile_h * knobs.tile_w <= cfg.acc_depth
    x = np.random.default_rng(5).integers(-128, 128, (1, 4, 64, 64), dtype=np.int8)
    got, _ = _run(cfg, spec, x, knobs)
    np.testing.assert_array_equal(got, maxpool_reference(x, spec))


def test_padding_beyond_the_dma_is_declined():
    cfg = HwConfig.load("default")
    spec = PoolSpec(n=1, c=16, h=40, w=40, oh=40, ow=40, kh=33, kw=33, pad_top=16,
                    pad_left=16)
    with pytest.raises(CompilerError, match="more than the DMA's padding of 15"):
        pool_knobs(cfg, spec)


GAP_CASES = [  # (preset, n, c, h, w, multiplier, shift[, offset])
    ("default", 1, 40, 7, 7, 1 << 20, 26),       # multiplier and rounding past 16 bits
    ("default", 1, 512, 2, 2, 12345, 17),         # many channel blocks, groups of them
    ("default", 1, 16, 50, 50, 3, 12),           # one plane larger than the accumulator
    ("small", 1, 10, 5, 3, -7000, 9),
    ("small", 1, 4, 40, 40, 9, 14),              # small preset: pixels in chunks
    ("default", 1, 40, 7, 7, 1 << 20, 26, -(1 << 30) - 12345),  # zero points' offset
    ("small", 1, 10, 5, 3, 7000, 9, 128 << 9),
]


@pytest.mark.parametrize("case", GAP_CASES, ids=lambda c: "-".join(map(str, c[:5])))
def test_global_average_pool_matches_qops(case):
    from celosia.compiler.accel.ops_alu import GapSpec, gap_constants, global_average_pool
    from celosia.compiler.graph.qops import qglobal_average_pool

    preset, n, c, h, w, mult, shift, *offset = case
    offset = offset[0] if offset else 0
    cfg = HwConfig.load(preset)
    b, k = cfg.batch, cfg.block
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    x[:, :1] = 127  # a channel that saturates
    want = qglobal_average_pool({"shift": shift, "multiplier": mult, "offset": offset}, x)
    spec = GapSpec(n=n, c=-(-c // k) * k, h=h, w=w, multiplier=mult, shift=shift,
                   offset=offset)
    fn = global_average_pool(cfg, spec)
    xp = pack_nchw(pad_channels(x, 1, k), b, k)
    outs = []
    for target in ("fsim", "cycle"):
        out = np.zeros((n // b, spec.c // k, 1, 1, b, k), np.int8)
        fn(Device(cfg, target, dram_size=8 << 20), xp, gap_constants(cfg, spec), out)
        outs.append(unpack_nchw(out)[:, :c])
        np.testing.assert_array_equal(outs[-1], want, err_msg=target)


ELT_CASES = [  # (preset, op, shape, multipliers, shift[, zero points])
    ("default", "add", (1, 40, 7, 9), (1 << 19, -(1 << 18) + 5), 24),  # past 16 bits
    ("default", "add", (2, 16, 40, 40), (3, 5), 3),                    # many chunks
    ("small", "add", (3, 10), (700, 1200), 11),                        # a 2-D value
    # zero points (za, zb, zo): folded into the rounding row, zo added after the shift
    ("default", "add", (1, 40, 7, 9), (1 << 19, -(1 << 18) + 5), 24, (-128, 17, -110)),
    ("small", "add", (2, 6, 5, 5), (700, 1200), 11, (3, -128, 127)),
    ("small", "add", (3, 10), (2**31 - 1, 2**30), 31, (127, -128, 5)),  # wraps in int32
    ("default", "relu", (1, 20, 5, 5), (), 0),
    ("small", "relu", (1, 6, 30, 30), (), 0),
]


@pytest.mark.parametrize("case", ELT_CASES,
                         ids=lambda c: f"{c[0]}-{c[1]}-{len(c[2])}d" + ("-zp" if c[5:] else ""))
def test_elementwise_matches_qops(case):
    from celosia.compiler.accel.ops_alu import EltSpec, elementwise, elt_constants
    from celosia.compiler.accel.partition import pack_value, packed_shape, unpack_value
    from celosia.compiler.graph.ops import KERNELS
    from celosia.compiler.graph.qops import qadd

    preset, op, shape, mults, shift = case[:5]
    zeros = case[5] if len(case) > 5 else (0, 0, 0)
    cfg = HwConfig.load(preset)
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    a, b = (rng.integers(-128, 128, shape, dtype=np.int8) for _ in range(2))
    a.flat[0], b.flat[0], a.flat[-1], b.flat[-1] = -128, -128, 127, 127
    if op == "add":
        want = qadd({"shift": shift, "multipliers": list(mults), "zero_points": zeros}, a, b)
    else:
        want = KERNELS["Relu"]({}, a)
    spec = EltSpec(op, packed_shape(shape, cfg), mults, shift, zero_points=zeros)
    fn = elementwise(cfg, spec)
    for target in ("fsim", "cycle"):
        out = np.zeros(spec.shape, np.int8)
        args = [pack_value(a, cfg)]
        if op == "add":
            args += [pack_value(b, cfg), elt_constants(cfg, spec)]
        fn(Device(cfg, target, dram_size=8 << 20), *args, out)
        np.testing.assert_array_equal(unpack_value(out, shape), want, err_msg=target)


QMUL_CASES = [  # (preset, a shape, b shape, multiplier, shift)
    ("default", (1, 40, 7, 9), (1, 40, 7, 9), 1 << 17, 24),     # one shape, past 16 bits
    ("default", (1, 40, 7, 9), (1, 40, 1, 1), 77777, 21),       # squeeze-excitation's gate
    ("default", (2, 24, 50, 50), (2, 24, 1, 1), 3000, 16),      # a run longer than a chunk
    ("default", (1, 48, 1, 1), (1, 48, 1, 1), 555, 12),         # gates of one pixel
    ("small", (3, 10), (3, 10), 700, 11),                       # a 2-D value
    ("small", (2, 12, 1, 13), (2, 12, 1, 1), 9, 5),             # a 1-D image's gate
]


@pytest.mark.parametrize("zero_points", [(0, 0, 0), (-128, 5, -128), (17, -128, 3)])
@pytest.mark.parametrize("gate_first", [False, True])
@pytest.mark.parametrize("case", QMUL_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_qmul_matches_qops(case, gate_first, zero_points):
    """QMul on the ALU, of one shape or by a per-channel gate (either operand), with and
    without zero points (za, zb, zo), against qops.qmul on random int8 values, on fsim and
    the cycle model."""
    from celosia.compiler.accel.ops_alu import EltSpec, elementwise, elt_constants
    from celosia.compiler.accel.partition import pack_value, packed_shape, unpack_value
    from celosia.compiler.graph.qops import qmul

    preset, a_shape, b_shape, mult, shift = case
    cfg = HwConfig.load(preset)
    rng = np.random.default_rng(zlib.crc32(repr((case, gate_first, zero_points)).encode()))
    a = rng.integers(-128, 128, a_shape, dtype=np.int8)
    b = rng.integers(-128, 128, b_shape, dtype=np.int8)
    a[..., 0] = -128  # the extremes: -128 * -128 * m is the largest product
    b.flat[0] = -128
    first, second = (b, a) if gate_first else (a, b)
    want = qmul({"shift": shift, "multipliers": [mult], "zero_points": zero_points},
                first, second)
    gate = int(np.prod(a_shape[2:])) if b_shape != a_shape else 1
    spec = EltSpec("mul", packed_shape(a_shape, cfg), (mult,), shift, gate_rows=gate,
                   gate_first=gate_first, zero_points=zero_points)
    fn = elementwise(cfg, spec)
    for target in ("fsim", "cycle"):
        out = np.zeros(spec.shape, np.int8)
        args = [pack_value(first, cfg), pack_value(second, cfg), elt_constants(cfg, spec)]
        fn(Device(cfg, target, dram_size=8 << 20), *args, out)
        np.testing.assert_array_equal(unpack_value(out, a_shape), want, err_msg=target)


@pytest.mark.parametrize("how", ["rows", "columns"])
def test_separable_passes_on_the_rtl(how, monkeypatch):
    """The in-place first pass relies on the ALU's in-order micro-ops (ISA: a later one
    sees an earlier one's result): the RTL (small preset) gives the definition's result and
    the cycle model's cycle count."""
    cfg = HwConfig.load("small")
    spec = _spec(cfg, 1, 6, 8, 8, (3, 3), (2, 2), (1, 1), (1, 1), 0)
    x = np.random.default_rng(11).integers(-128, 128, (1, 6, 8, 8), dtype=np.int8)
    monkeypatch.setattr(ops_alu, "pool_passes", lambda *a: (how, 0))
    cycles = {}
    for target in ("rtl", "cycle"):
        got, stats = _run(cfg, spec, x, PoolKnobs(2, 4), target=target)
        np.testing.assert_array_equal(got, maxpool_reference(x, spec), err_msg=target)
        cycles[target] = stats["cycles"]
    assert cycles["rtl"] == cycles["cycle"] > 0
