"""Token queues (a saturating counter model) and command queues (a deque model), with
random pushes and pops, including requests the block must ignore (push when full, pop
when empty for tokens) and random consumer back-pressure."""

from __future__ import annotations

from collections import deque

import cocotb

from celosia.hw.isa import CmdLayout

from .common import Block, drive, get, put, rng_for, settle, start
from .top import CMD_QUEUES, TOKEN_QUEUES

CYCLES = 1500


@cocotb.test()
@cocotb.parametrize(name=list(TOKEN_QUEUES))
async def token_queue(dut, name):
    depth = TOKEN_QUEUES[name]
    q = Block(dut, name)
    rng = rng_for("tq", name)
    await start(dut)
    count = 0  # the model
    for cycle in range(CYCLES):
        await drive()
        # bursts of pushes or pops reach the full and empty states often
        bias = 0.8 if (cycle // 64) % 2 else 0.2
        push, pop = rng.random() < bias, rng.random() < 1 - bias
        put(q.push, push)
        put(q.pop, pop)
        await settle()
        assert get(q.count) == count, (cycle, count)
        assert get(q.can_push) == (count < depth)
        assert get(q.can_pop) == (count > 0)
        count += (push and count < depth) - (pop and count > 0)


@cocotb.test()
@cocotb.parametrize(name=list(CMD_QUEUES))
async def command_queue(dut, name):
    depth = CMD_QUEUES[name]
    q = Block(dut, name)
    layout = CmdLayout()
    insn_at, index_at = layout["insn"].offset, layout["index"].offset
    index_bits = layout["index"].width
    rng = rng_for("cq", name)
    await start(dut)
    model = deque()
    for cycle in range(CYCLES):
        await drive()
        bias = 0.75 if (cycle // 50) % 2 else 0.3  # producer faster, then consumer faster
        value, index = rng.getrandbits(128), rng.getrandbits(index_bits)
        put(q.w_data, value << insn_at | index << index_at)
        await settle()
        assert get(q.w_rdy) == (len(model) < depth), cycle
        assert get(q.r_rdy) == (len(model) > 0), cycle
        assert get(q.level) == len(model), cycle
        if model:
            word = get(q.r_data)
            got = (word >> insn_at & ((1 << 128) - 1), word >> index_at & ((1 << index_bits) - 1))
            assert got == model[0], (cycle, got, model[0])
        # the producer writes only into room and the consumer reads only when ready (the
        # protocol of fetch and the modules); back-pressure is the random consumer
        do_w = rng.random() < bias and len(model) < depth
        do_r = rng.random() < 1 - bias and len(model) > 0
        put(q.w_en, do_w)
        put(q.r_en, do_r)
        if do_r:
            model.popleft()
        if do_w:
            model.append((value, index))
    await drive()
    put(q.w_en, 0)
    put(q.r_en, 0)
