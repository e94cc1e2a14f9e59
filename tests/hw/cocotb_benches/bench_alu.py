"""The ALU lane (combinational) against hw/alu.py's naive model: random operations on
corner values (0, +-1, shift amounts around 31/32, INT32_MIN/MAX) and random words."""

from __future__ import annotations

import cocotb
from cocotb.triggers import Timer

from celosia.hw.alu import alu_lane_model

from .common import Block, get_signed, put, rng_for

VECTORS = 4000


def _interesting(rng):
    return rng.choice([0, 1, -1, 31, 32, 33, -31, -32, -33, 2**31 - 1, -2**31, 2**16,
                       rng.randint(-40, 40), rng.randint(-2**31, 2**31 - 1),
                       rng.randint(-2**31, 2**31 - 1)])


@cocotb.test()
async def alu_lane(dut):
    alu = Block(dut, "alu")
    rng = rng_for("alu")
    for n in range(VECTORS):
        op, x, y = rng.randrange(5), _interesting(rng), _interesting(rng)
        put(alu.op, op)
        put(alu.x, x)
        put(alu.y, y)
        await Timer(1, unit="ns")
        got = get_signed(alu.r)
        assert got == alu_lane_model(op, x, y), (n, op, x, y, got)
