"""The read arbiter: three clients with random queues of bursts against a DRAM slave with
random read latency and random ARREADY/RVALID stalls; the clients drop RREADY at random.
Checks routing (every beat reaches the granted client with the right data and RLAST, no
other client sees RVALID), one burst at a time, and round-robin order when all request."""

from __future__ import annotations

from collections import deque

import cocotb
import numpy as np

from axi_model import AxiSlaveModel

from .common import Block, Ctx, drive, get, put, rng_for, settle, start
from .top import ARBITER


@cocotb.test()
@cocotb.parametrize(latency=[cocotb.Param((1, 3), name="1to3"), cocotb.Param((1, 20), name="1to20")],
                    stall=[0.0, 0.4])
async def arbiter(dut, latency, stall):
    name, n, bus = ARBITER
    arb = Block(dut, name)
    rng = rng_for("arb", latency, stall)
    dram = np.frombuffer(np.random.default_rng(rng.getrandbits(32)).bytes(1 << 14), np.uint8)
    slave = AxiSlaveModel(dram.copy(), bus, rng=rng, latency=latency, stall=stall)
    todo = [deque((rng.randrange(0, 1 << 11) * bus, rng.randint(1, 8)) for _ in range(25))
            for _ in range(n)]
    cur = [None] * n  # [addr, beats, beat] of the burst each client is receiving
    grants = []
    await start(dut)
    cycles = 0
    while any(todo) or any(c is not None for c in cur):
        cycles += 1
        assert cycles < 50_000, "arbiter bench did not finish"
        await drive()
        slave.drive(Ctx, rd=arb.bus)
        for i in range(n):
            client = arb.clients[i]
            put(client.arvalid, bool(todo[i]) and cur[i] is None)
            if todo[i]:
                put(client.araddr, todo[i][0][0])
                put(client.arlen, todo[i][0][1] - 1)
            put(client.rready, rng.random() < 0.7)
        await settle()
        for i in range(n):
            client = arb.clients[i]
            if get(client.arvalid) and get(client.arready):
                assert all(c is None for c in cur), "a second burst was granted"
                addr, beats = todo[i].popleft()
                cur[i] = [addr, beats, 0]
                grants.append(i)
            if get(client.rvalid):
                assert cur[i] is not None, f"client {i} sees RVALID without a burst"
                if get(client.rready):
                    addr, beats, beat = cur[i]
                    a = addr + bus * beat
                    want = int.from_bytes(dram[a:a + bus].tobytes(), "little")
                    assert get(client.rdata) == want, (i, addr, beat)
                    assert get(client.rlast) == (beat + 1 == beats)
                    cur[i][2] += 1
                    if beat + 1 == beats:
                        cur[i] = None
        assert sum(get(arb.clients[i].rvalid) for i in range(n)) <= 1
        slave.sample(Ctx, rd=arb.bus)
    # every client had a queue of requests from the start: grants rotate 0, 1, 2, 0, ...
    assert grants[:3 * 20] == [0, 1, 2] * 20, grants[:60]
    assert len(grants) == 3 * 25
