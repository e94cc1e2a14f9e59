"""The GEMM fast path (grouped im2col products) against the general path and a naive loop."""

import numpy as np
import pytest

from celosia import HwConfig
from celosia.isa import GemmInsn, Uop, encode_uops
from celosia.sim.datapath import Datapath

CONFIGS = [HwConfig(), HwConfig.preset("small"),
           HwConfig(log_batch=1, log_block=3, log_inp_buff_size=12, log_wgt_buff_size=13,
                    log_acc_buff_size=13, log_uop_buff_size=10)]


def _naive(dp: Datapath, insn: GemmInsn, uops: list[Uop]):
    """(ACC, OUT) after the instruction, one micro-op at a time."""
    acc = dp.acc.astype(np.int64).copy()
    out = dp.out.copy()
    touched = set()
    for i in range(insn.iter_out):
        for j in range(insn.iter_in):
            for u in uops:
                a = u.dst + i * insn.dst_factor_out + j * insn.dst_factor_in
                s = u.src + i * insn.src_factor_out + j * insn.src_factor_in
                w = u.wgt + i * insn.wgt_factor_out + j * insn.wgt_factor_in
                acc[a] += dp.inp[s].astype(np.int64) @ dp.wgt[w].astype(np.int64).T
                touched.add(a)
    acc = ((acc + 2**31) % 2**32 - 2**31).astype(np.int32)
    rows = sorted(touched)
    out[rows] = acc[rows].astype(np.int8)
    return acc, out


def _random_case(cfg, rng, grid: bool):
    dp = Datapath(cfg, np.zeros(64, np.uint8))
    dp.inp[:] = rng.integers(-128, 128, dp.inp.shape)
    dp.wgt[:] = rng.integers(-128, 128, dp.wgt.shape)
    dp.acc[:] = rng.integers(-2**31, 2**31, dp.acc.shape)
    io, ii = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    groups, per = int(rng.integers(1, 4)), int(rng.integers(1, 80))
    if grid:  # equal groups, distinct dst rows per group, weights fixed across loops
        uops = [Uop(g * io * ii, int(rng.integers(0, cfg.inp_depth - 8)),
                    int(rng.integers(0, cfg.wgt_depth))) for g in range(groups) for _ in range(per)]
        rng.shuffle(uops)
        insn = GemmInsn(uop_bgn=0, uop_end=len(uops), iter_out=io, iter_in=ii,
                        dst_factor_out=ii, dst_factor_in=1, src_factor_out=int(rng.integers(0, 3)),
                        src_factor_in=int(rng.integers(0, 3)))
    else:  # arbitrary: colliding rows, moving weights
        uops = [Uop(int(rng.integers(0, 8)), int(rng.integers(0, cfg.inp_depth - 8)),
                    int(rng.integers(0, cfg.wgt_depth - 8))) for _ in range(per)]
        insn = GemmInsn(uop_bgn=0, uop_end=len(uops), iter_out=io, iter_in=ii,
                        dst_factor_out=int(rng.integers(0, 2)), dst_factor_in=int(rng.integers(0, 2)),
                        src_factor_out=1, src_factor_in=2, wgt_factor_out=int(rng.integers(0, 2)),
                        wgt_factor_in=1)
    dp.uop[:len(uops)] = encode_uops(uops, cfg)
    return dp, insn, uops


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "small", "batch2_block8"])
@pytest.mark.parametrize("grid", [True, False], ids=["grid", "general"])
def test_gemm_matches_naive(cfg, grid):
    rng = np.random.default_rng(7)
    for _ in range(6):
        dp, insn, uops = _random_case(cfg, rng, grid)
        want_acc, want_out = _naive(dp, insn, uops)
        dp.gemm(0, insn)
        np.testing.assert_array_equal(dp.acc, want_acc)
        np.testing.assert_array_equal(dp.out, want_out)


def test_grid_path_is_taken_for_tensorized_loops():
    cfg = HwConfig()
    rng = np.random.default_rng(1)
    dp, insn, uops = _random_case(cfg, rng, grid=True)
    fields = tuple(np.array(v) for v in zip(*[(u.dst, u.src, u.wgt) for u in uops]))
    assert dp._gemm_grid(insn, *fields)
