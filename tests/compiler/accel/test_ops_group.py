"""group_conv2d (compiler/accel/ops_group.py): grouped and depthwise convolutions with
per-side padding and per-axis strides, on fsim and the cycle model, bit-exact against the
operator's definition (compiler/graph/qops.py's QConv) and with identical DRAM results on
both simulators."""

import numpy as np
import pytest

from celosia import HwConfig
from celosia.compiler.accel.ops import Epilogue, pack_bias, pack_nchw, pad_channels, unpack_nchw
from celosia.compiler.accel.ops_group import (GroupConvKnobs, GroupConvSpec, group_conv2d,
                                              group_conv2d_reference, group_conv_candidates,
                                              group_conv_knobs, group_layout_problem,
                                              pack_group_kernel)
from celosia.compiler.graph.qops import qconv
from celosia.driver import Device
from celosia.errors import CompilerError


def _operands(spec, rng):
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c // spec.groups, spec.kh, spec.kw), dtype=np.int8)
    bias = rng.integers(-3000, 3000, spec.o).astype(np.int32)
    scale = rng.integers(-900, 900, spec.o).astype(np.int32)
    resid = rng.integers(-128, 128, (spec.n, spec.o, spec.oh, spec.ow), dtype=np.int8)
    return x, w, bias, scale, resid


def run_group_conv(cfg, spec, knobs=None, target="fsim", seed=0):
    """Compile and run one layer; (output NCHW, the numpy reference, counters, raw packed
    output)."""
    rng = np.random.default_rng(seed)
    b, k = cfg.batch, cfg.block
    x, w, bias, scale, resid = _operands(spec, rng)
    fn = group_conv2d(cfg, spec, knobs or group_conv_knobs(cfg, spec, use_cache=False))
    S, cpb, opb = spec.supers, spec.cpb, spec.opb

    def act(a, blocks):  # conv2d's packed layout, its channel block axis split
        p = pack_nchw(pad_channels(a, 1, k), b, k)
        return p.reshape(p.shape[0], S, blocks, *p.shape[2:])

    e = spec.epilogue
    args = [act(x, cpb), pack_group_kernel(w, spec)]
    if e.bias:
        args.append(pack_bias(pad_channels(bias, 0, k), b, k).reshape(S, opb, b, k))
    if e.scale:
        args.append(pack_bias(pad_channels(scale, 0, k), b, k).reshape(S, opb, b, k))
    if e.residual:
        args.append(act(resid, opb))
    out = np.zeros((spec.n // b, S, opb, spec.oh, spec.ow, b, k), np.int8)
    stats = fn(Device(cfg, target=target, dram_size=16 << 20), *args, out)
    got = unpack_nchw(out.reshape(out.shape[0], S * opb, *out.shape[3:]))[:, :spec.o]
    ref = group_conv2d_reference(x, w, spec, bias if e.bias else None,
                                 resid if e.residual else None, scale if e.scale else None)
    return got, ref, stats, out


REQUANT = Epilogue(bias=True, scale=True, shift=14, lo=-128, hi=127)
FULL = Epilogue(bias=True, scale=True, shift=14, residual=True, lo=-5, hi=90)

CASES = [
    # depthwise 3x3 / 5x5 / 7x7, stride 1 and 2, channels not multiples of 16
    dict(c=32, h=8, w=8, o=32, kh=3, kw=3, groups=32, pads=(1, 1, 1, 1), epilogue=FULL),
    dict(c=24, h=9, w=9, o=24, kh=3, kw=3, groups=24, strides=(2, 2), pads=(1, 1, 1, 1),
         epilogue=REQUANT),
    dict(c=40, h=10, w=10, o=40, kh=5, kw=5, groups=40, strides=(2, 2), pads=(2, 2, 2, 2),
         epilogue=REQUANT),
    dict(c=8, h=7, w=7, o=8, kh=7, kw=7, groups=8, pads=(3, 3, 3, 3),
         epilogue=Epilogue(bias=True, scale=True, shift=12, relu=True)),
    # depth multiplier 2
    dict(c=16, h=6, w=6, o=32, kh=3, kw=3, groups=16, pads=(1, 1, 1, 1), epilogue=REQUANT),
    # grouped: 2, 4, 8, 16, 32 channels per group
    dict(c=32, h=6, w=6, o=32, kh=3, kw=3, groups=16, pads=(1, 1, 1, 1), epilogue=FULL),
    dict(c=64, h=6, w=6, o=32, kh=3, kw=3, groups=16, strides=(2, 2), pads=(1, 1, 1, 1),
         epilogue=REQUANT),
    # groups that do not tile blocks (3 channels per group): one block-sparse super-group
    dict(c=48, h=6, w=6, o=48, kh=3, kw=3, groups=16, pads=(1, 1, 1, 1), epilogue=REQUANT),
    dict(c=48, h=5, w=5, o=24, kh=3, kw=3, groups=12, strides=(2, 2), pads=(1, 1, 1, 1),
         epilogue=REQUANT),
    dict(c=24, h=5, w=5, o=24, kh=1, kw=1, groups=3, epilogue=REQUANT),
    dict(c=64, h=6, w=6, o=64, kh=3, kw=3, groups=4, pads=(0, 1, 0, 1), epilogue=REQUANT),
    dict(c=64, h=5, w=5, o=96, kh=3, kw=3, groups=2, pads=(1, 1, 1, 1), epilogue=FULL),
    # groups=1 with asymmetric padding and per-axis strides; a 1-D convolution (one row)
    dict(c=20, h=7, w=9, o=24, kh=2, kw=3, groups=1, strides=(2, 1), pads=(0, 1, 1, 0),
         epilogue=REQUANT),
    dict(c=32, h=1, w=19, o=16, kh=1, kw=3, groups=2, strides=(1, 2), pads=(0, 1, 0, 2),
         epilogue=REQUANT),
]


def _spec(dims):
    return GroupConvSpec(n=1, **dims)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_group_conv2d_on_fsim_and_the_cycle_model(case):
    cfg = HwConfig()
    spec = _spec(CASES[case])
    got, want, stats, raw_f = run_group_conv(cfg, spec, seed=case)
    np.testing.assert_array_equal(got, want)
    assert stats["macs"] == spec.gemm_macs >= spec.macs
    got_c, _, cycle_stats, raw_c = run_group_conv(cfg, spec, target="cycle", seed=case)
    np.testing.assert_array_equal(raw_c, raw_f)  # the same DRAM, padding channels included
    assert cycle_stats["cycles"] > 0 and cycle_stats["macs"] == stats["macs"]


@pytest.mark.parametrize("knobs", [GroupConvKnobs(2, 8, 4, 1, 1), GroupConvKnobs(8, 8, 2, 1, 1, 2),
                                   GroupConvKnobs(4, 8, 1, 1, 1, 2)])
def test_depthwise_tiles_and_threads(knobs):
    cfg = HwConfig()
    spec = GroupConvSpec(n=1, c=64, h=8, w=8, o=64, kh=3, kw=3, groups=64, pads=(1, 1, 1, 1),
                         epilogue=FULL)
    got, want, _, _ = run_group_conv(cfg, spec, knobs, target="cycle")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("knobs", [GroupConvKnobs(2, 6, 2, 2, 1), GroupConvKnobs(3, 6, 1, 2, 2, 2),
                                   GroupConvKnobs(6, 6, 2, 4, 1),
                                   GroupConvKnobs(3, 6, 1, 2, 2, 2, vthread_axis="co"),
                                   GroupConvKnobs(6, 6, 1, 1, 1, 2, vthread_axis="co")])
def test_grouped_tiles_with_three_outer_gemm_loops(knobs):
    """Rows, super-groups and output blocks all > 1: the third is unrolled into micro-ops."""
    cfg = HwConfig()
    spec = GroupConvSpec(n=1, c=64, h=6, w=6, o=128, kh=3, kw=3, groups=2, pads=(1, 1, 1, 1),
                         epilogue=FULL)
    got, want, _, _ = run_group_conv(cfg, spec, knobs)
    np.testing.assert_array_equal(got, want)


def test_small_config_and_batch():
    cfg = HwConfig.preset("small")
    spec = GroupConvSpec(n=2 * cfg.batch, c=12, h=5, w=6, o=12, kh=3, kw=3, groups=12,
                         strides=(1, 2), pads=(1, 0, 1, 2), block=cfg.block, epilogue=FULL)
    got, want, _, _ = run_group_conv(cfg, spec, target="cycle")
    np.testing.assert_array_equal(got, want)


def test_random_shapes_against_the_qconv_definition():
    """Seeded random layers: the reference equals QConv's definition (qops.qconv), and the
    accelerator the reference."""
    cfg = HwConfig()
    rng = np.random.default_rng(11)
    for _ in range(8):
        cpg = int(rng.choice([1, 2, 4, 8, 16, 32]))
        groups = int(rng.integers(1, 5)) * (16 // min(cpg, 16))
        mult = int(rng.choice([1, 1, 2]))
        kh, kw = (int(v) for v in rng.choice([1, 3, 5, 7], 2))
        h, w = int(rng.integers(kh, kh + 6)), int(rng.integers(kw, kw + 6))
        pads = tuple(int(v) for v in rng.integers(0, 3, 4))
        strides = tuple(int(v) for v in rng.integers(1, 3, 2))
        spec = GroupConvSpec(n=1, c=cpg * groups, h=h, w=w, o=cpg * groups * mult, kh=kh,
                             kw=kw, groups=groups, strides=strides, pads=pads,
                             epilogue=Epilogue(bias=True, scale=True, shift=13, lo=-100, hi=120))
        x, wt, bias, scale, _ = _operands(spec, np.random.default_rng(int(rng.integers(1000))))
        attrs = dict(strides=list(strides), pads=list(pads), group=groups, dilations=[1, 1],
                     kernel_shape=[kh, kw], shift=13, lo=-100, hi=120)
        np.testing.assert_array_equal(group_conv2d_reference(x, wt, spec, bias, None, scale),
                                      qconv(attrs, x, wt, bias, scale), err_msg=str(spec))
        got, want, _, _ = run_group_conv(cfg, spec, seed=int(rng.integers(1000)))
        np.testing.assert_array_equal(got, want, err_msg=str(spec))


def test_kernel_packing_is_block_diagonal_for_depthwise():
    spec = GroupConvSpec(n=1, c=24, h=4, w=4, o=24, kh=3, kw=3, groups=24)
    w = np.arange(1, 24 * 9 + 1).reshape(24, 1, 3, 3).astype(np.int32)
    p = pack_group_kernel(w, spec)
    assert p.shape == (2, 1, 1, 3, 3, 16, 16)
    for s in range(2):
        for i in range(16):
            c = s * 16 + i
            want = w[c, 0] if c < 24 else np.zeros((3, 3))
            np.testing.assert_array_equal(p[s, 0, 0, :, :, i, i], want)
    off = p.copy()
    idx = np.arange(16)
    off[..., idx, idx] = 0
    assert not off.any()


def test_groupings_that_do_not_tile_blocks_are_refused_with_the_reason():
    assert group_layout_problem(32, 32, 32, 16) is None
    assert group_layout_problem(6, 6, 2, 16) is None  # less than one super-group: one block
    # 3 channels per group: 24 groups fill 1.5 super-groups of 16, and as one block-sparse
    # layer of 5 x 5 blocks the core would do 5 x 16 / 3 = 27x the multiply-adds
    problem = group_layout_problem(72, 72, 24, 16)
    assert "do not tile BLOCK=16" in problem and "27x" in problem
    spec = GroupConvSpec(n=1, c=24, h=4, w=4, o=24, kh=3, kw=3, groups=8)  # 2 x 2 blocks
    assert (spec.supers, spec.cpb, spec.opb) == (1, 2, 2)
    assert "must divide" in group_layout_problem(10, 10, 4, 16)
    with pytest.raises(CompilerError, match="do not tile"):
        GroupConvSpec(n=1, c=72, h=4, w=4, o=72, kh=3, kw=3, groups=24)


def test_knob_candidates_fit_the_buffers():
    cfg = HwConfig()
    spec = GroupConvSpec(n=1, c=96, h=28, w=28, o=96, kh=7, kw=7, groups=96,
                         pads=(3, 3, 3, 3), epilogue=REQUANT)
    cands = group_conv_candidates(cfg, spec)
    assert cands and group_conv_knobs(cfg, spec, top=2, use_cache=False) in cands
    for kb in cands:
        in_h, in_w = kb.tile_h + 6, kb.tile_w + 6
        assert kb.vthreads * kb.tile_g * in_h * in_w <= cfg.inp_depth


@pytest.mark.parametrize("dims", [
    dict(h=1, w=1, kh=3, kw=3, pads=(1, 1, 1, 1)),          # the centre tap only
    dict(h=2, w=1, kh=5, kw=3, pads=(2, 1, 2, 1)),          # 3 of 5 rows, 1 of 3 columns
    dict(h=1, w=9, kh=3, kw=3, strides=(1, 2), pads=(1, 0, 1, 2)),  # a 1-D layer's rows
    dict(h=3, w=3, kh=7, kw=7, strides=(2, 2), pads=(3, 3, 3, 3)),
])
def test_taps_that_only_meet_padding_are_dropped(dims):
    from celosia.compiler.accel.ops_group import crop_taps

    spec = GroupConvSpec(n=1, c=32, o=32, groups=32, epilogue=REQUANT, **dims)
    rng = np.random.default_rng(4)
    x, w, bias, scale, _ = _operands(spec, rng)
    small, w2 = crop_taps(spec, w)
    assert small.kh * small.kw < spec.kh * spec.kw
    assert (small.oh, small.ow) == (spec.oh, spec.ow) and min(small.pads) >= 0
    np.testing.assert_array_equal(group_conv2d_reference(x, w2, small, bias, None, scale),
                                  group_conv2d_reference(x, w, spec, bias, None, scale))


@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 0, 0, 0), (0, 1, 2, 1)])
@pytest.mark.parametrize("knobs", [GroupConvKnobs(0, 0, 2, 2, 2), GroupConvKnobs(0, 0, 2, 1, 2, 2, "co")])
def test_tiles_of_several_super_groups_and_input_blocks(pads, knobs):
    """Tiles of 2 super-groups with both input blocks of each loaded at once: inject_dma
    merges the super-group and block loops of the input copy into one host loop (these
    tiles were not offered while it left the super-group variable in the address)."""
    from dataclasses import replace

    cfg = HwConfig()
    spec = GroupConvSpec(n=1, c=64, h=6, w=6, o=128, kh=3, kw=3, groups=2, pads=pads,
                         epilogue=FULL)
    assert (spec.supers, spec.cpb, spec.opb) == (2, 2, 4)
    knobs = replace(knobs, tile_h=spec.oh // (2 if knobs.vthreads > 1 else 1), tile_w=spec.ow)
    assert knobs in group_conv_candidates(cfg, spec)
    got, want, stats, raw_f = run_group_conv(cfg, spec, knobs)
    np.testing.assert_array_equal(got, want)
    _, _, cycle_stats, raw_c = run_group_conv(cfg, spec, knobs, target="cycle")
    np.testing.assert_array_equal(raw_c, raw_f)
    assert cycle_stats["macs"] == stats["macs"] == spec.gemm_macs
