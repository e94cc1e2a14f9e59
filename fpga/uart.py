"""A UART (8 data bits, no parity, one stop bit) for the board top's host link.

``divisor`` is the number of clocks per bit: 217 for 115200 baud at the ULX3S's 25 MHz,
4 under Verilator (tests), the smallest that samples reliably (a bit is sampled in its
middle, two clocks after the edge the receiver saw through its two-register synchroniser).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["UartRx", "UartTx", "MIN_DIVISOR"]

MIN_DIVISOR = 4


def _check(divisor):
    if not isinstance(divisor, int) or divisor < MIN_DIVISOR:
        raise ValueError(f"the UART divisor (clocks per bit) must be an integer >= "
                         f"{MIN_DIVISOR}, not {divisor!r}")


class UartRx(wiring.Component):
    """``data`` holds the last byte received; ``valid`` pulses for one cycle with it.
    ``error`` pulses when a stop bit is 0 (the byte is dropped)."""

    def __init__(self, divisor: int):
        _check(divisor)
        self.divisor = divisor
        super().__init__({"rx": In(1, init=1), "data": Out(8), "valid": Out(1),
                          "error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        d = self.divisor
        sync1 = Signal(init=1)
        line = Signal(init=1)
        m.d.sync += [sync1.eq(self.rx), line.eq(sync1)]
        timer = Signal(range(d + 1))
        bit = Signal(range(10))
        shift = Signal(8)
        m.d.sync += [self.valid.eq(0), self.error.eq(0)]
        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += timer.eq(d // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(line):  # a glitch, not a start bit
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [timer.eq(d - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [shift.eq(shift[1:] | (line << 7)), timer.eq(d - 1),
                                 bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    with m.If(line):
                        m.d.sync += [self.data.eq(shift), self.valid.eq(1)]
                    with m.Else():
                        m.d.sync += self.error.eq(1)
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """Sends ``data`` when ``valid`` and ``ready`` are both high."""

    def __init__(self, divisor: int):
        _check(divisor)
        self.divisor = divisor
        super().__init__({"tx": Out(1, init=1), "data": In(8), "valid": In(1),
                          "ready": Out(1)})

    def elaborate(self, platform):
        m = Module()
        d = self.divisor
        timer = Signal(range(d))
        bits = Signal(range(11))
        shift = Signal(10, init=0x3FF)
        m.d.comb += [self.ready.eq(bits == 0), self.tx.eq(shift[0])]
        with m.If(bits == 0):
            with m.If(self.valid):
                m.d.sync += [shift.eq(0b1_0000_0000_0 | (self.data << 1)), bits.eq(10),
                             timer.eq(d - 1)]
        with m.Elif(timer != 0):
            m.d.sync += timer.eq(timer - 1)
        with m.Else():
            m.d.sync += [shift.eq((shift >> 1) | (1 << 9)), bits.eq(bits - 1), timer.eq(d - 1)]
        return m
