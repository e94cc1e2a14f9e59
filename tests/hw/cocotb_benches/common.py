"""Helpers shared by the benches: port access by block name, the clock, one cycle's
phases, and an adapter that lets tests/hw/axi_model.py's AXI slave (random read latency
and random stalls on every ready/valid it drives) run under cocotb.

Cycle discipline (all benches): inputs change 1 ns after the falling edge
(``await bench.drive()``), combinational outputs are read after they settle
(``await bench.settle()``), registers update on the rising edge. So whatever a bench reads
after ``settle`` is what the block sees at the next rising edge.
"""

from __future__ import annotations

import os
import random

from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge, Timer

PERIOD_NS = 10
_clock = [None]  # the top's clk, set by start()


def seed() -> int:
    """The bench seed (CELOSIA_BENCH_SEED, set by the pytest driver), for reproducible runs."""
    return int(os.environ.get("CELOSIA_BENCH_SEED", "1"))


def rng_for(*salt) -> random.Random:
    return random.Random(f"{seed()}:{':'.join(map(str, salt))}")


class Block:
    """The ports of one block instance in the bench top: ``blk.cmd.valid`` is the handle
    ``<name>__cmd__valid``, ``blk.clients[1].arvalid`` is ``<name>__clients__1__arvalid``."""

    def __init__(self, dut, prefix: str):
        self._dut, self._prefix = dut, prefix

    def __getattr__(self, name):
        full = f"{self._prefix}__{name}"
        handle = getattr(self._dut, full, None) if not name.startswith("_") else None
        return handle if handle is not None else Block(self._dut, full)

    def __getitem__(self, index: int):
        return Block(self._dut, f"{self._prefix}__{index}")


def get(handle) -> int:
    return int(handle.value)


def get_signed(handle) -> int:
    return handle.value.to_signed()


def put(handle, value: int) -> None:
    width = len(handle)
    handle.value = int(value) & ((1 << width) - 1)


class Ctx:
    """Amaranth-testbench-style ``get``/``set`` over cocotb handles (for AxiSlaveModel)."""

    @staticmethod
    def get(handle) -> int:
        return get(handle)

    @staticmethod
    def set(handle, value) -> None:
        put(handle, value)


async def start(dut, *, reset: bool = True) -> None:
    """Start the clock and give the whole top one reset cycle."""
    _clock[0] = dut.clk
    Clock(dut.clk, PERIOD_NS, unit="ns").start(start_high=False)
    if reset:
        dut.rst.value = 1
        await RisingEdge(dut.clk)
        await FallingEdge(dut.clk)
        dut.rst.value = 0


async def drive() -> None:
    """Wait for the next input-change point of the cycle (just after the falling edge)."""
    await FallingEdge(_clock[0])
    await Timer(1, unit="ns")


async def settle() -> None:
    """Let combinational logic settle after inputs changed (still before the rising edge)."""
    await Timer(1, unit="ns")

