"""A module's command queue: a synchronous FIFO of (instruction, index) entries.

A write in cycle t is readable in cycle t+1; ``w_rdy`` depends only on the fill level (not
on a read in the same cycle), so fetch's dispatch rule is: an instruction enters when the
queue held fewer than ``depth`` entries at the start of the cycle.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from .isa import CmdLayout

__all__ = ["CommandQueue"]


class CommandQueue(wiring.Component):
    def __init__(self, *, depth: int):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.depth = depth
        super().__init__({
            "w_data": In(CmdLayout()), "w_en": In(1), "w_rdy": Out(1),
            "r_data": Out(CmdLayout()), "r_en": In(1), "r_rdy": Out(1),
            "level": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = q = fifo.SyncFIFO(width=len(self.w_data.as_value()), depth=self.depth)
        m.d.comb += [
            q.w_data.eq(self.w_data), q.w_en.eq(self.w_en), self.w_rdy.eq(q.w_rdy),
            self.r_data.eq(q.r_data), q.r_en.eq(self.r_en), self.r_rdy.eq(q.r_rdy),
            self.level.eq(q.level),
        ]
        return m
