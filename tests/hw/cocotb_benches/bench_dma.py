"""The 2D DMA engines against their naive models, with a DRAM slave that has random read
and write-response latency and random stalls on ARREADY, RVALID, AWREADY, WREADY and
BVALID (tests/hw/axi_model.py):

- TensorLoad (LOAD with zero padding, several element sizes per engine): the set of
  (SRAM row, bytes) written must equal test_hw_blocks.load_model, each row written once;
- TensorStore (STORE rows with a stride): DRAM afterwards must equal the naive byte copy,
  every other byte untouched.
"""

from __future__ import annotations

import cocotb
import numpy as np

from axi_model import AxiSlaveModel
from test_hw_blocks import load_model

from .common import Block, Ctx, drive, get, put, rng_for, settle, start
from .top import LOADS, STORE_DEPTH, STORES

DRAM_BYTES = 1 << 15
LATENCIES = [cocotb.Param(lat, name=f"{lat[0]}to{lat[1]}") for lat in [(1, 2), (1, 8), (10, 40)]]


@cocotb.test()
@cocotb.parametrize(name=list(LOADS), latency=LATENCIES)
async def tensor_load(dut, name, latency):
    elems, bus = LOADS[name]
    ld = Block(dut, name)
    rng = rng_for("load", name, latency)
    dram = np.frombuffer(np.random.default_rng(rng.getrandbits(32)).bytes(DRAM_BYTES), np.uint8)
    slave = AxiSlaveModel(dram.copy(), bus, rng=rng, latency=latency, stall=rng.choice([0.0, 0.3, 0.6]))
    await start(dut)
    for n in range(16):
        sel = rng.randrange(len(elems))
        eb = elems[sel]
        cmd = dict(sram_base=rng.randrange(64), y_size=rng.randint(0, 4),
                   x_size=rng.choice([0, 1, 2, 3, 5, 9, 300 // eb, 600 // eb]),
                   y_pad_0=rng.randint(0, 2), y_pad_1=rng.randint(0, 2),
                   x_pad_0=rng.randint(0, 3), x_pad_1=rng.randint(0, 3))
        cmd["x_stride"] = cmd["x_size"] + rng.randint(0, 5)
        top = DRAM_BYTES // eb - (cmd["y_size"] + 1) * (cmd["x_stride"] + 1)
        cmd["dram_base"] = rng.randrange(max(1, top))
        want = load_model(0, eb, dram, cmd)
        await drive()
        put(ld.cmd.valid, 1)
        put(ld.cmd.sel, sel)
        for k, v in cmd.items():
            put(getattr(ld.cmd, k), v)
        await settle()
        assert get(ld.cmd.ready), "engine not ready for a new command"
        got = {}
        for _cycle in range(40_000):
            await drive()
            put(ld.cmd.valid, 0)
            slave.drive(Ctx, rd=ld.bus)
            await settle()
            if get(ld.w_en):
                addr = get(ld.w_addr)
                assert addr not in got, f"row {addr} written twice"
                got[addr] = get(ld.w_data).to_bytes(max(elems), "little")[:eb]
                assert get(ld.w_zero) == _is_pad(addr, cmd), (addr, cmd)
            done = get(ld.done)
            slave.sample(Ctx, rd=ld.bus)
            if done:
                break
        else:
            raise AssertionError(f"TensorLoad {name} did not finish {cmd}")
        assert got.keys() == want.keys(), (n, cmd)
        bad = [a for a in want if got[a] != want[a]]
        assert not bad, (n, cmd, bad[:5])


def _is_pad(addr, cmd):
    """Whether destination row ``addr`` is a padding element of the LOAD ``cmd``."""
    w = cmd["x_pad_0"] + cmd["x_size"] + cmd["x_pad_1"]
    r, c = divmod(addr - cmd["sram_base"], w)
    return not (cmd["y_pad_0"] <= r < cmd["y_pad_0"] + cmd["y_size"]
                and cmd["x_pad_0"] <= c < cmd["x_pad_0"] + cmd["x_size"])


@cocotb.test()
@cocotb.parametrize(name=list(STORES), latency=LATENCIES)
async def tensor_store(dut, name, latency):
    elem, bus = STORES[name]
    st = Block(dut, name)
    rng = rng_for("store", name, latency)
    sram = [rng.getrandbits(8 * elem) for _ in range(STORE_DEPTH)]
    dram = np.zeros(DRAM_BYTES, np.uint8)
    want = dram.copy()
    slave = AxiSlaveModel(dram, bus, rng=rng, latency=latency, stall=rng.choice([0.0, 0.3, 0.6]))
    await start(dut)
    for n in range(12):
        y, x = rng.randint(0, 4), rng.choice([0, 1, 2, 3, 7, 40, 64])
        stride = x + rng.randint(0, 6)
        sram_base = rng.randrange(STORE_DEPTH - y * x + 1)
        dram_base = rng.randrange(DRAM_BYTES // elem - (y + 1) * (stride + 1))
        for r in range(y):  # the naive model
            for c in range(x):
                e = dram_base + r * stride + c
                want[e * elem:(e + 1) * elem] = np.frombuffer(
                    sram[sram_base + r * x + c].to_bytes(elem, "little"), np.uint8)
        await drive()
        for k, v in dict(sram_base=sram_base, dram_base=dram_base, y_size=y, x_size=x,
                         x_stride=stride).items():
            put(getattr(st.cmd, k), v)
        put(st.cmd.valid, 1)
        await settle()
        assert get(st.cmd.ready), "engine not ready for a new command"
        r_data = 0
        sent = 0
        for _cycle in range(40_000):
            await drive()
            put(st.cmd.valid, 0)
            put(st.r_data, r_data)  # synchronous SRAM: row addressed in the previous cycle
            slave.drive(Ctx, wr=st.bus)
            await settle()
            done = get(st.done)
            sent += get(st.elems)
            r_data = sram[get(st.r_addr)]
            slave.sample(Ctx, wr=st.bus)
            if done:
                break
        else:
            raise AssertionError(f"TensorStore {name} did not finish")
        assert np.array_equal(dram, want), (n, y, x, stride, np.flatnonzero(dram != want)[:8])
        assert sent == x * y, (sent, x, y)
