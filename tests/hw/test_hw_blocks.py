"""Small blocks against deliberately naive models, on random inputs with random bus timing.

These run in Amaranth's simulator (no compile step, seconds in total); the whole core runs
under Verilator in test_hw_core.py.
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest
from amaranth.sim import Simulator

from axi_model import AxiSlaveModel
from celosia.config import HwConfig
from celosia.hw.alu import AluLane, alu_lane_model
from celosia.hw.arbiter import ReadArbiter
from celosia.hw.cmd_queue import CommandQueue
from celosia.hw.tensor_load import TensorLoad
from celosia.hw.tensor_store import TensorStore
from celosia.hw.token_queue import TokenQueue


def _run(dut, bench, *, deadline=200_000):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run_until(deadline * 1e-8)


# ---- token queue ----------------------------------------------------------------------

@pytest.mark.parametrize("depth", [1, 3, 8])
def test_token_queue_matches_counter_model(depth):
    rng = random.Random(depth)
    dut = TokenQueue(depth=depth)

    async def bench(ctx):
        count = 0
        for _ in range(500):
            push, pop = rng.random() < 0.5, rng.random() < 0.5
            ctx.set(dut.push, push)
            ctx.set(dut.pop, pop)
            assert ctx.get(dut.count) == count
            assert ctx.get(dut.can_push) == (count < depth)
            assert ctx.get(dut.can_pop) == (count > 0)
            count += (push and count < depth) - (pop and count > 0)
            await ctx.tick()

    _run(dut, bench)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_token_queue_rejects_bad_depth():
    with pytest.raises(ValueError, match="depth must be a positive integer, not 0"):
        TokenQueue(depth=0)


# ---- command queue --------------------------------------------------------------------

def test_command_queue_matches_deque_model():
    rng = random.Random(1)
    depth = 4
    dut = CommandQueue(depth=depth)

    async def bench(ctx):
        model = deque()
        for n in range(600):
            w = rng.random() < 0.5
            r = rng.random() < 0.5
            value = rng.getrandbits(128)
            assert ctx.get(dut.w_rdy) == (len(model) < depth)
            assert ctx.get(dut.r_rdy) == (len(model) > 0)
            if model:
                assert ctx.get(dut.r_data.insn) == model[0][0]
                assert ctx.get(dut.r_data.index) == model[0][1]
            do_w, do_r = w and len(model) < depth, r and len(model) > 0
            ctx.set(dut.w_en, do_w)
            ctx.set(dut.r_en, do_r)
            ctx.set(dut.w_data.insn, value)
            ctx.set(dut.w_data.index, n)
            if do_r:
                model.popleft()
            if do_w:
                model.append((value, n))
            await ctx.tick()

    _run(dut, bench)


# ---- ALU lane -------------------------------------------------------------------------

def _interesting(rng):
    return rng.choice([0, 1, -1, 31, 32, -31, -32, 2**31 - 1, -2**31, rng.randint(-40, 40),
                       rng.randint(-2**31, 2**31 - 1)])


def test_alu_lane_matches_model():
    """The two-stage lane, fed a new operation every cycle: ``result`` in the next cycle is
    the model's for every op, ``early`` (the E register) for MIN/MAX/ADD."""
    rng = random.Random(2)
    dut = AluLane()

    async def bench(ctx):
        for _ in range(3000):
            op, x, y = rng.randrange(5), _interesting(rng), _interesting(rng)
            ctx.set(dut.op, op)
            ctx.set(dut.x, x)
            ctx.set(dut.y, y)
            await ctx.tick()
            want = alu_lane_model(op, x, y)
            assert ctx.get(dut.result) == want, (op, x, y)
            if op in (0, 1, 2):
                assert ctx.get(dut.early) == want, (op, x, y)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_gemm_tree_stages_match_the_cycle_model():
    """hw/gemm.py's adder tree and hw/compute.py's stages against the cycle model's rule,
    for every BLOCK a configuration may have."""
    from celosia.hw.compute import Compute
    from celosia.hw.gemm import GemmCore, tree_stages
    from celosia.sim.cycle_timing import Timing, gemm_tree_stages

    for log_block in range(1, 7):
        cfg = HwConfig(log_block=log_block, log_inp_buff_size=9 + log_block,  # 512 rows each
                       log_wgt_buff_size=9 + 2 * log_block, log_acc_buff_size=11 + log_block)
        assert tree_stages(cfg.block) == gemm_tree_stages(cfg.block) == -(-log_block // 2)
        assert GemmCore(cfg).latency == 1 + tree_stages(cfg.block)
        assert Compute(cfg).exec_stage == Timing.from_config(cfg).exec_stage


# ---- arbiter --------------------------------------------------------------------------

def test_arbiter_round_robin_and_routing():
    rng = random.Random(3)
    n = 3
    dut = ReadArbiter(clients=n, data_width=64)
    dram = np.frombuffer(np.random.default_rng(3).bytes(1 << 14), np.uint8).copy()
    slave = AxiSlaveModel(dram, 8, rng=rng, latency=(1, 5), stall=0.3)

    async def bench(ctx):
        # each client: a queue of bursts (addr, beats) to read; it holds ARVALID until taken
        todo = [deque((rng.randrange(0, 1 << 11) * 8, rng.randint(1, 8)) for _ in range(20))
                for _ in range(n)]
        cur = [None] * n  # (addr, beats, beat) of the burst being received
        grants = []
        while any(todo) or any(c is not None for c in cur):
            slave.drive(ctx, rd=dut.bus)
            for i, client in enumerate(dut.clients):
                ctx.set(client.arvalid, bool(todo[i]) and cur[i] is None)
                if todo[i]:
                    ctx.set(client.araddr, todo[i][0][0])
                    ctx.set(client.arlen, todo[i][0][1] - 1)
                ctx.set(client.rready, rng.random() < 0.7)
            for i, client in enumerate(dut.clients):
                if ctx.get(client.arvalid) and ctx.get(client.arready):
                    addr, beats = todo[i].popleft()
                    cur[i] = [addr, beats, 0]
                    grants.append(i)
                if ctx.get(client.rvalid) and ctx.get(client.rready):
                    addr, beats, beat = cur[i]
                    a = addr + 8 * beat
                    assert ctx.get(client.rdata) == int.from_bytes(dram[a:a + 8].tobytes(), "little")
                    assert ctx.get(client.rlast) == (beat + 1 == beats)
                    cur[i][2] += 1
                    if beat + 1 == beats:
                        cur[i] = None
                # only the granted client sees R beats
            assert sum(bool(ctx.get(c.rvalid)) for c in dut.clients) <= 1
            slave.sample(ctx, rd=dut.bus)
            await ctx.tick()
        # with every client always requesting, grants rotate 0, 1, 2, 0, ...
        assert grants[:30] == [0, 1, 2] * 10

    _run(dut, bench)


# ---- TensorLoad (2D address generator with padding + read DMA) -----------------------

def load_model(depth, elem, dram, cmd):
    """Naive ISA.md LOAD: {sram row: bytes} written (padding included)."""
    sram, y0, y, y1, x0, x, x1 = (cmd[k] for k in ("sram_base", "y_pad_0", "y_size", "y_pad_1",
                                                  "x_pad_0", "x_size", "x_pad_1"))
    out = {}
    if x == 0:
        return out
    ptr = sram
    for r in range(y0 + y + y1):
        for c in range(x0 + x + x1):
            if y0 <= r < y0 + y and x0 <= c < x0 + x:
                e = cmd["dram_base"] + (r - y0) * cmd["x_stride"] + (c - x0)
                out[ptr] = bytes(dram[e * elem:(e + 1) * elem])
            else:
                out[ptr] = bytes(elem)
            ptr += 1
    return out


@pytest.mark.parametrize("elems,bus", [([4, 16], 8), ([16, 64, 4], 8), ([2, 8], 4), ([32], 16)])
def test_tensor_load_matches_model(elems, bus):
    rng = random.Random(sum(elems) * bus)
    dram = np.frombuffer(np.random.default_rng(bus).bytes(1 << 15), np.uint8).copy()
    dut = TensorLoad(elem_bytes=elems, bus_bytes=bus)
    slave = AxiSlaveModel(dram, bus, rng=rng, latency=(1, 6), stall=0.3)

    async def bench(ctx):
        for _ in range(12):
            sel = rng.randrange(len(elems))
            eb = elems[sel]
            cmd = dict(sram_base=rng.randrange(64), y_size=rng.randint(0, 4),
                       x_size=rng.choice([0, 1, 2, 3, 5, 9, 300 // eb]),
                       y_pad_0=rng.randint(0, 2), y_pad_1=rng.randint(0, 2),
                       x_pad_0=rng.randint(0, 2), x_pad_1=rng.randint(0, 2))
            cmd["x_stride"] = cmd["x_size"] + rng.randint(0, 5)
            top = (1 << 15) // eb - (cmd["y_size"] + 1) * (cmd["x_stride"] + 1)
            cmd["dram_base"] = rng.randrange(max(1, top))
            want = load_model(0, eb, dram, cmd)
            got = {}
            ctx.set(dut.cmd.valid, 1)
            ctx.set(dut.cmd.sel, sel)
            for k, v in cmd.items():
                ctx.set(getattr(dut.cmd, k), v)
            assert ctx.get(dut.cmd.ready)
            await ctx.tick()
            ctx.set(dut.cmd.valid, 0)
            for _cycle in range(20_000):
                slave.drive(ctx, rd=dut.bus)
                if ctx.get(dut.w_en):
                    addr = ctx.get(dut.w_addr)
                    assert addr not in got, "row written twice"
                    got[addr] = ctx.get(dut.w_data).to_bytes(max(elems), "little")[:eb]
                done = ctx.get(dut.done)
                slave.sample(ctx, rd=dut.bus)
                await ctx.tick()
                if done:
                    break
            else:
                raise AssertionError("TensorLoad did not finish")
            assert got == want, cmd

    _run(dut, bench, deadline=2_000_000)


# ---- TensorStore --------------------------------------------------------------------

@pytest.mark.parametrize("elem,bus", [(4, 8), (16, 8), (16, 16), (64, 8)])
def test_tensor_store_matches_model(elem, bus):
    rng = random.Random(elem * 100 + bus)
    depth = 256
    sram = [rng.getrandbits(8 * elem) for _ in range(depth)]
    dram = np.zeros(1 << 15, np.uint8)
    want = dram.copy()
    dut = TensorStore(elem_bytes=elem, bus_bytes=bus, sram_depth=depth)
    slave = AxiSlaveModel(dram, bus, rng=rng, latency=(1, 6), stall=0.3)

    async def bench(ctx):
        for _ in range(10):
            y, x = rng.randint(0, 4), rng.choice([0, 1, 2, 3, 7, 40])
            stride = x + rng.randint(0, 6)
            sram_base = rng.randrange(depth - y * x + 1)
            dram_base = rng.randrange((1 << 15) // elem - (y + 1) * (stride + 1))
            for r in range(y):  # the naive model
                for c in range(x):
                    e = dram_base + r * stride + c
                    want[e * elem:(e + 1) * elem] = np.frombuffer(
                        sram[sram_base + r * x + c].to_bytes(elem, "little"), np.uint8)
            for k, v in dict(sram_base=sram_base, dram_base=dram_base, y_size=y, x_size=x,
                             x_stride=stride).items():
                ctx.set(getattr(dut.cmd, k), v)
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick()
            ctx.set(dut.cmd.valid, 0)
            r_data = 0
            for _cycle in range(20_000):
                ctx.set(dut.r_data, r_data)
                slave.drive(ctx, wr=dut.bus)
                done = ctx.get(dut.done)
                r_data = sram[ctx.get(dut.r_addr)]  # synchronous read: next cycle
                slave.sample(ctx, wr=dut.bus)
                await ctx.tick()
                if done:
                    break
            else:
                raise AssertionError("TensorStore did not finish")
            assert np.array_equal(dram, want)

    _run(dut, bench, deadline=2_000_000)
