"""A dependency-token queue: tokens carry no data, so the queue is a saturating counter.

A push in cycle t is visible to the popper in cycle t+1 (the count is a register). Push and
pop may happen in the same cycle. The owner only pushes when ``can_push`` and pops when
``can_pop``; out-of-rule requests are ignored so that a bug cannot wrap the count.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["TokenQueue"]


class TokenQueue(wiring.Component):
    def __init__(self, *, depth: int):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.depth = depth
        super().__init__({
            "push": In(1), "pop": In(1),
            "count": Out(range(depth + 1)), "can_push": Out(1), "can_pop": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        push = self.push & (self.count != self.depth)
        pop = self.pop & (self.count != 0)
        with m.If(push & ~pop):
            m.d.sync += self.count.eq(self.count + 1)
        with m.Elif(pop & ~push):
            m.d.sync += self.count.eq(self.count - 1)
        m.d.comb += [self.can_push.eq(self.count != self.depth), self.can_pop.eq(self.count != 0)]
        return m
