"""The ALU lane (two stages) against hw/alu.py's naive model: a new random operation every
cycle on corner values (0, +-1, shift amounts around 31/32, INT32_MIN/MAX) and random
words; ``result`` one cycle after the operands for every op, ``early`` for MIN/MAX/ADD."""

from __future__ import annotations

import cocotb

from celosia.hw.alu import alu_lane_model

from .common import Block, drive, get_signed, put, rng_for, settle, start

VECTORS = 4000


def _interesting(rng):
    return rng.choice([0, 1, -1, 31, 32, 33, -31, -32, -33, 2**31 - 1, -2**31, 2**16,
                       rng.randint(-40, 40), rng.randint(-2**31, 2**31 - 1),
                       rng.randint(-2**31, 2**31 - 1)])


@cocotb.test()
async def alu_lane(dut):
    alu = Block(dut, "alu")
    rng = rng_for("alu")
    await start(dut)
    prev = None
    for n in range(VECTORS + 1):
        await drive()
        if prev is not None:  # the operation presented in the cycle before
            op, x, y = prev
            want = alu_lane_model(op, x, y)
            got = get_signed(alu.result)
            assert got == want, (n, op, x, y, got)
            if op in (0, 1, 2):
                assert get_signed(alu.early) == want, (n, op, x, y)
        prev = rng.randrange(5), _interesting(rng), _interesting(rng)
        for port, value in zip((alu.op, alu.x, alu.y), prev):
            put(port, value)
        await settle()
