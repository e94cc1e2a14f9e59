"""One ALU lane: a 32-bit two's-complement operation of ISA.md section 4 (ALU).

Purely combinational; the compute pipeline instantiates BATCH x BLOCK lanes in its last
stage. SHR shifts right arithmetically by min(y, 31) when y >= 0, else left by
min(-y, 31); MUL keeps the low 32 bits.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .isa import AluOp

__all__ = ["AluLane", "alu_lane_model"]


class AluLane(wiring.Component):
    def __init__(self, *, width: int = 32):
        self.w = width
        super().__init__({"op": In(AluOp), "x": In(signed(width)), "y": In(signed(width)),
                          "r": Out(signed(width))})

    def elaborate(self, platform):
        m = Module()
        w = self.w
        x, y = self.x, self.y
        cap = w - 1
        right = Signal(range(w))
        left = Signal(range(w))
        neg = Signal(w + 1)
        m.d.comb += [
            right.eq(Mux(y > cap, cap, y[:right.shape().width])),
            neg.eq(-y),
            left.eq(Mux(neg > cap, cap, neg[:left.shape().width])),
        ]
        with m.Switch(self.op):
            with m.Case(AluOp.MIN):
                m.d.comb += self.r.eq(Mux(x < y, x, y))
            with m.Case(AluOp.MAX):
                m.d.comb += self.r.eq(Mux(x > y, x, y))
            with m.Case(AluOp.ADD):
                m.d.comb += self.r.eq(x + y)
            with m.Case(AluOp.SHR):
                m.d.comb += self.r.eq(Mux(y >= 0, x >> right, x << left))
            with m.Case(AluOp.MUL):
                m.d.comb += self.r.eq(x * y)
        return m


def alu_lane_model(op: int, x: int, y: int, width: int = 32) -> int:
    """The deliberately naive reference: Python integers, then wrap to ``width`` bits."""
    cap = width - 1
    if op == 0:
        r = min(x, y)
    elif op == 1:
        r = max(x, y)
    elif op == 2:
        r = x + y
    elif op == 3:
        r = x >> min(y, cap) if y >= 0 else x << min(-y, cap)
    elif op == 4:
        r = x * y
    else:
        raise ValueError(f"ALU op must be 0-4, not {op}")
    r &= (1 << width) - 1
    return r - (1 << width) if r >> (width - 1) else r
