"""A 1x1 convolution with its max pooling fused (compiler/accel/fuse_pool.py) against the
numpy definitions of both (ops.conv2d_reference, then ops_alu.maxpool_reference: -128
padding), on fsim, the cycle model and the RTL (small preset): random shapes, epilogues,
pooling kernels, strides, dilations, paddings and ceil mode; and the unfused pair's cycles
against the fused program's on ResNet's stem shape."""

import zlib

import numpy as np
import pytest

from celosia.compiler.accel.fuse_pool import (conv_pool, conv_pool_knobs, monotone,
                                              why_not_fused)
from celosia.compiler.accel.ops import (ConvSpec, Epilogue, conv2d,
                                        conv2d_reference, pack_bias, pack_nchw, pack_oihw,
                                        unpack_nchw)
from celosia.compiler.accel.tune import tune_conv
from celosia.compiler.accel.ops_alu import PoolSpec, maxpool, maxpool_reference, pool_knobs
from celosia.compiler.graph.ops import pool_output_shape
from celosia.config import HwConfig
from celosia.driver import Device


def _pool(conv, k, s, d, p, ceil):
    oh, ow = pool_output_shape((conv.oh, conv.ow), k, s, d, (*p, *p), ceil)
    return PoolSpec(n=conv.n, c=conv.o, h=conv.oh, w=conv.ow, oh=oh, ow=ow, kh=k[0], kw=k[1],
                    stride_h=s[0], stride_w=s[1], dil_h=d[0], dil_w=d[1], pad_top=p[0],
                    pad_left=p[1])


def _operands(cfg, conv, rng):
    x = rng.integers(-128, 128, (conv.n, conv.c, conv.h, conv.w), dtype=np.int8)
    w = rng.integers(-128, 128, (conv.o, conv.c, 1, 1), dtype=np.int8)
    bias = rng.integers(-3000, 3000, conv.o).astype(np.int32)
    scale = rng.integers(1, 600, conv.o).astype(np.int32)
    return x, w, bias, scale


def _want(conv, pool, x, w, bias, scale):
    y = conv2d_reference(x, w, conv, bias=bias if conv.epilogue.bias else None,
                         scale=scale if conv.epilogue.scale else None)
    return maxpool_reference(y, pool)


def _fused(cfg, conv, pool, x, w, bias, scale, target, whole=False):
    b, k = cfg.batch, cfg.block
    fn = conv_pool(cfg, conv, pool, conv_pool_knobs(cfg, conv, pool), whole=whole)
    args = [pack_nchw(x, b, k), pack_oihw(w, k)]
    if conv.epilogue.bias:
        args.append(pack_bias(bias, b, k))
    if conv.epilogue.scale:
        args.append(pack_bias(scale, b, k))
    out = np.zeros((pool.n // b, pool.c // k, pool.oh, pool.ow, b, k), np.int8)
    stats = fn(Device(cfg, target, dram_size=16 << 20), *args, out)
    return unpack_nchw(out), stats


CASES = [  # (preset, n, c, hw, o, epilogue, kernel, stride, dilation, pads, ceil)
    ("default", 1, 160, (24, 24), 64, dict(scale=True, shift=14, relu=True),
     (3, 3), (2, 2), (1, 1), (1, 1), 0),  # ResNet's stem over its windows, smaller
    ("default", 1, 32, (9, 14), 32, dict(bias=True, scale=True, shift=12),
     (2, 2), (2, 2), (1, 1), (0, 0), 1),  # no ReLU, ceil mode's half window
    ("default", 1, 16, (13, 13), 48, dict(bias=True, multiplier=3, scale=True, shift=19,
                                          lo=-20, hi=90),
     (5, 5), (1, 1), (1, 1), (2, 2), 0),  # SPPF's pool: four shared rows per tile
    ("default", 1, 48, (10, 11), 16, dict(bias=True, bias_last=True, scale=True, shift=21,
                                          relu=True),
     (3, 2), (1, 2), (2, 1), (2, 1), 0),  # dilated, uneven
    ("small", 1, 24, (9, 8), 8, dict(bias=True, scale=True, shift=16, relu=True),
     (3, 3), (2, 2), (1, 1), (1, 1), 0),
    ("default", 3, 16, (7, 12), 32, dict(bias=True, scale=True, shift=14, relu=True),
     (3, 3), (2, 2), (1, 1), (1, 1), 1),  # three images, ceil mode
]


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:5])))
def test_fused_conv_pool_matches_the_definitions(case, whole):
    """The shift and clip after the pooling, or (``whole``, constants that cannot wrap) the
    whole epilogue."""
    preset, n, c, (h, w), o, epi, k, s, d, p, ceil = case
    cfg = HwConfig.load(preset)
    conv = ConvSpec(n, c, h, w, o, 1, 1, epilogue=Epilogue(**epi))
    pool = _pool(conv, k, s, d, p, ceil)
    assert why_not_fused(cfg, conv, pool) is None
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x, wt, bias, scale = _operands(cfg, conv, rng)
    b, kk = cfg.batch, cfg.block
    assert monotone(conv, pack_oihw(wt, kk), pack_bias(bias, b, kk), pack_bias(scale, b, kk))
    want = _want(conv, pool, x, wt, bias, scale)
    assert len(np.unique(want)) > 10  # the epilogue's clip does not flatten everything
    targets = ("fsim", "cycle", "rtl") if preset == "small" else ("fsim", "cycle")
    cycles = {}
    for target in targets:
        got, stats = _fused(cfg, conv, pool, x, wt, bias, scale, target, whole)
        np.testing.assert_array_equal(got, want, err_msg=target)
        if target != "fsim":
            cycles[target] = stats["cycles"]
    if "rtl" in cycles:
        assert cycles["rtl"] == cycles["cycle"] > 0


def test_fused_is_faster_than_the_pair_on_the_stem():
    """ResNet-18's stem over its windows (10 input blocks, 64 channels, 112x112) and its
    3x3 stride-2 pool: the fused program against conv2d's tuned schedule plus the separate
    max pooling, on the cycle model, both exact."""
    cfg = HwConfig.load("default")
    conv = ConvSpec(1, 160, 112, 112, 64, 1, 1, epilogue=Epilogue(scale=True, shift=14,
                                                                   relu=True))
    pool = _pool(conv, (3, 3), (2, 2), (1, 1), (1, 1), 0)
    rng = np.random.default_rng(1)
    x, w, bias, scale = _operands(cfg, conv, rng)
    want = _want(conv, pool, x, w, bias, scale)
    got, fused = _fused(cfg, conv, pool, x, w, bias, scale, "cycle")
    np.testing.assert_array_equal(got, want)
    b, k = cfg.batch, cfg.block
    dev = Device(cfg, "cycle", dram_size=32 << 20)
    y = np.zeros((1, 4, 112, 112, b, k), np.int8)
    conv_stats = conv2d(cfg, conv, tune_conv(cfg, conv)[0])(
        dev, pack_nchw(x, b, k), pack_oihw(w, k), pack_bias(scale, b, k), y)
    out = np.zeros((1, 4, 56, 56, b, k), np.int8)
    pool_stats = maxpool(cfg, pool, pool_knobs(cfg, pool))(dev, y, out)
    np.testing.assert_array_equal(unpack_nchw(out), want)
    pair = conv_stats["cycles"] + pool_stats["cycles"]
    print(f"fused {fused['cycles']} against {conv_stats['cycles']} + {pool_stats['cycles']}")
    assert fused["cycles"] < pair - 200_000, (fused["cycles"], pair)


def test_what_is_not_fused_says_why():
    cfg = HwConfig.load("default")
    three = ConvSpec(1, 16, 8, 8, 16, 3, 3, 1, 1, Epilogue(relu=True))
    pool = _pool(three, (2, 2), (2, 2), (1, 1), (0, 0), 0)
    assert "only a 1x1" in why_not_fused(cfg, three, pool)
    res = ConvSpec(1, 16, 8, 8, 16, 1, 1, epilogue=Epilogue(residual=True))
    assert "residual" in why_not_fused(cfg, res, _pool(res, (2, 2), (2, 2), (1, 1), (0, 0), 0))
    wide = ConvSpec(1, 16, 8, 1500, 512, 1, 1, epilogue=Epilogue(relu=True))
    assert "accumulator rows" in why_not_fused(
        cfg, wide, _pool(wide, (3, 3), (2, 2), (1, 1), (1, 1), 0))


def test_the_whole_epilogue_moves_only_when_it_cannot_wrap():
    """``monotone``: every step's bound within int32 and no negative multiplier."""
    cfg = HwConfig.load("default")
    b, k = cfg.batch, cfg.block
    conv = ConvSpec(1, 32, 4, 4, 16, 1, 1, epilogue=Epilogue(bias=True, scale=True, shift=9))
    w = np.full((16, 32, 1, 1), -128, np.int8)  # |accumulator| <= 128 * 32 * 128 = 524,288
    bias = np.full(16, 1000, np.int32)
    ok = np.full(16, (2**31 - 1) // (524_288 + 1000), np.int32)
    assert monotone(conv, pack_oihw(w, k), pack_bias(bias, b, k), pack_bias(ok, b, k))
    over = ok.copy()
    over[5] += 1  # one channel's product can pass 2^31 - 1
    assert not monotone(conv, pack_oihw(w, k), pack_bias(bias, b, k), pack_bias(over, b, k))
    negative = np.ones(16, np.int32)
    negative[0] = -1
    assert not monotone(conv, pack_oihw(w, k), pack_bias(bias, b, k),
                        pack_bias(negative, b, k))
    neg_imm = ConvSpec(1, 32, 4, 4, 16, 1, 1, epilogue=Epilogue(multiplier=-2, shift=3))
    assert not monotone(neg_imm, pack_oihw(w, k), pack_bias(bias, b, k), None)
