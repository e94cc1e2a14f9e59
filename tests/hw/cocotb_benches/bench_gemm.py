"""The GEMM core (pipelined) against a numpy model, for the three ways of building its products
(hw/gemm.py: "native", "dsp_pair", the FPGA export's two-products-per-DSP packing, and
"wide", the 32-bit form the rtl target simulates): a
new operand pair every cycle (random int8 data, corner values -128, 127, 0, -1 and the
packing's worst case), each lane's sum checked ``latency`` cycles later. "wide" computes
only the operands presented with ``en`` high: it is driven high in a random three cycles of
four, and exactly those sums are checked (the others are not defined)."""

from __future__ import annotations

import cocotb
import numpy as np

from celosia.hw.gemm import GemmCore

from .common import Block, drive, get, put, rng_for, settle, start
from .top import GEMM_CONFIGS, GEMMS

VECTORS = 300


def _pack(values: np.ndarray, bits: int) -> int:
    out = 0
    for i, v in enumerate(values.ravel().tolist()):
        out |= (int(v) & ((1 << bits) - 1)) << (bits * i)
    return out


@cocotb.test()
@cocotb.parametrize(name=[cocotb.Param(g, name=g.removeprefix("gemm_")) for g in GEMMS])
async def gemm_core(dut, name):
    cfg_name, products = GEMMS[name]
    cfg = GEMM_CONFIGS[cfg_name]
    b, n = cfg.batch, cfg.block
    latency = GemmCore(cfg, products=products).latency
    core = Block(dut, name)
    rng = rng_for("gemm", name)
    npr = np.random.default_rng(rng.getrandbits(32))
    corners = np.array([-128, 127, 0, -1, 1, -127], np.int64)
    await start(dut)
    gated = products == "wide"  # has an ``en`` input
    expected, enabled = [], []  # sums of the operands presented in each cycle, en then
    checked = 0
    for k in range(VECTORS + latency):
        await drive()
        if k >= latency and enabled[k - latency]:
            out = get(core.sum)
            got = np.array([(out >> (32 * i)) & 0xFFFFFFFF for i in range(b * n)], np.int64)
            want = expected[k - latency]
            assert np.array_equal(got, want), (k, name, np.flatnonzero(got != want))
            checked += 1
        mode = k % 4
        if mode == 0:
            inp = npr.integers(-128, 128, (b, n))
            wgt = npr.integers(-128, 128, (n, n))
        elif mode == 1:
            inp = npr.choice(corners, (b, n))
            wgt = npr.choice(corners, (n, n))
        elif mode == 2:  # worst case for the packing: every product -128 * -128
            inp = np.full((b, n), -128)
            wgt = npr.choice([-128, 127], (n, n))
        else:
            inp = npr.choice(corners, (b, n))
            wgt = npr.integers(-128, 128, (n, n))
        expected.append(((inp.astype(np.int64) @ wgt.astype(np.int64).T) & 0xFFFFFFFF).ravel())
        enabled.append(not gated or npr.random() < 0.75)
        put(core.inp, _pack(inp, 8))
        put(core.wgt, _pack(wgt, 8))
        if gated:
            put(core.en, int(enabled[-1]))
        await settle()
    assert checked >= (VECTORS if not gated else VECTORS // 2), checked
