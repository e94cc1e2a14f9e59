"""The GEMM core (combinational) against a numpy model, for both ways of building its
products (hw/gemm.py: "native" and "dsp_pair", the FPGA export's two-products-per-DSP
packing): random int8 data, corner values (-128, 127, 0, -1) and random int32
accumulators including ones that wrap."""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import Timer

from .common import Block, get, put, rng_for
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
    cfg = GEMM_CONFIGS[GEMMS[name][0]]
    b, n = cfg.batch, cfg.block
    core = Block(dut, name)
    rng = rng_for("gemm", name)
    npr = np.random.default_rng(rng.getrandbits(32))
    corners = np.array([-128, 127, 0, -1, 1, -127], np.int64)
    for k in range(VECTORS):
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
        acc = npr.integers(-2**31, 2**31, (b, n))
        if k % 7 == 0:
            acc[:] = np.int64(2**31 - 1)
        want = (acc + inp.astype(np.int64) @ wgt.astype(np.int64).T) & 0xFFFFFFFF
        put(core.inp, _pack(inp, 8))
        put(core.wgt, _pack(wgt, 8))
        put(core.acc, _pack(acc, 32))
        await Timer(1, unit="ns")
        out = get(core.out)
        got = np.array([(out >> (32 * i)) & 0xFFFFFFFF for i in range(b * n)], np.int64)
        assert np.array_equal(got, want.ravel()), (k, name, np.flatnonzero(got != want.ravel()))
