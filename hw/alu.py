"""One ALU lane: a 32-bit two's-complement operation of ISA.md section 4 (ALU), in two
pipeline stages.

SHR shifts right arithmetically by min(y, 31) when y >= 0, else left by min(-y, 31); MUL
keeps the low 32 bits.

Stage E (the cycle ``op``, ``x``, ``y`` are presented) ends in registers: MIN, MAX and ADD
are complete there (``early``, one cycle later); SHR registers x, the direction and the
amount; MUL registers three 16x16 products (``x_lo*y_lo``, and the low halves of
``x_lo*y_hi`` and ``x_hi*y_lo``: three 18x18 FPGA multipliers, each straight into fabric
registers of its own). Stage X (the next cycle) shifts, or adds the products, combinationally: ``result``
is the operation's value in the cycle after the operands; compute registers it.

Compute forwards ``early`` to a micro-op right behind one doing MIN/MAX/ADD (hw/compute.py);
SHR and MUL results are known only in X, so a micro-op reading the row one of them writes
waits a cycle (``TWO_STAGE_OPS``).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .isa import AluOp

__all__ = ["AluLane", "alu_lane_model", "TWO_STAGE_OPS"]

#: operations whose result is known only in stage X (the others are in ``early``)
TWO_STAGE_OPS = (AluOp.SHR, AluOp.MUL)


class AluLane(wiring.Component):
    """``early``: the E-stage register (the result for MIN/MAX/ADD), one cycle after the
    operands; ``result``: combinational in the cycle after the operands, every op."""

    WIDTH = 32

    def __init__(self):
        w = self.WIDTH
        super().__init__({"op": In(AluOp), "x": In(signed(w)), "y": In(signed(w)),
                          "early": Out(signed(w)), "result": Out(signed(w))})

    def elaborate(self, platform):
        m = Module()
        w = self.WIDTH
        x, y = self.x, self.y
        # ---- stage E -------------------------------------------------------------------
        # data registers without reset (compute's valid bits say when they hold a micro-op;
        # as in hw/gemm.py)
        op = Signal(AluOp, reset_less=True)
        value = Signal(signed(w), reset_less=True)  # MIN/MAX/ADD: the result; SHR: x
        m.d.comb += self.early.eq(value)
        shift = Signal(6, reset_less=True)  # SHR: amount (bits 0-4), direction (bit 5: right)
        # MUL: x_lo * y_lo and the low halves of x_lo * y_hi and x_hi * y_lo, in registers of
        # their own (a multiplier's output goes straight into a register)
        p0, p1, p2 = (Signal(w, reset_less=True), Signal(16, reset_less=True),
                      Signal(16, reset_less=True))
        x_lo, x_hi = x.as_unsigned()[:16], x.as_unsigned()[16:]
        y_lo, y_hi = y.as_unsigned()[:16], y.as_unsigned()[16:]
        # shift amounts: right min(y, 31) for y >= 0, left min(-y, 31) for y < 0
        neg = y[w - 1]
        high_zero = y[5:w - 1] == 0
        high_ones = y[5:] == (1 << (w - 5)) - 1
        right = Mux(high_zero, y[:5], 31)
        left = Mux(high_ones & (y[:5] != 0), (-y)[:5], 31)
        m.d.sync += [op.eq(self.op), p0.eq(x_lo * y_lo), p1.eq(x_lo * y_hi),
                     p2.eq(x_hi * y_lo), shift.eq(Cat(Mux(neg, left, right), ~neg))]
        # one comparator for MIN and MAX (x == y picks either), few levels after it
        take_x = Mux(self.op == AluOp.MAX, ~(x < y), x < y) | (self.op == AluOp.SHR)
        m.d.sync += value.eq(Mux(self.op == AluOp.ADD, x + y, Mux(take_x, x, y)))
        # ---- stage X -------------------------------------------------------------------
        amount = shift[:5]
        shifted = Mux(shift[5], value >> amount, value << amount)
        product = p0 + Cat(Signal(16), p1 + p2)
        with m.Switch(op):
            with m.Case(AluOp.SHR):
                m.d.comb += self.result.eq(shifted)
            with m.Case(AluOp.MUL):
                m.d.comb += self.result.eq(product)
            with m.Default():
                m.d.comb += self.result.eq(value)
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
