"""Read DMA: one request (first element, element count) becomes AXI4 bursts and a stream of
whole elements, one per cycle at most, for a fixed element size.

Bursts cover the beat-aligned byte range of the request and never cross a
``burst_bytes(bus)`` boundary; the next burst is requested only after the previous one's
RLAST (one burst in flight). Elements at least as wide as the bus arrive as
``elem_bytes / bus_bytes`` beats (first beat = lowest bytes) and come out the cycle after
their last beat. Narrower elements come out of a one-beat buffer one slot per cycle; the
buffer takes a new beat in the cycle its last slot drains (so a beat holding s elements
costs s cycles). There is no back-pressure on elements: the consumer writes an SRAM.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi import ADDR_WIDTH, ReadClientSignature, burst_bytes

__all__ = ["ReadDma"]


def _log2(x: int) -> int:
    return x.bit_length() - 1


class ReadDma(wiring.Component):
    def __init__(self, *, elem_bytes: int, bus_bytes: int):
        for name, v in (("elem_bytes", elem_bytes), ("bus_bytes", bus_bytes)):
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, not {v!r}")
        self.eb, self.bus_bytes = elem_bytes, bus_bytes
        super().__init__({
            "req_valid": In(1), "req_ready": Out(1),
            "req_addr": In(ADDR_WIDTH - _log2(elem_bytes)),  # in elements
            "req_count": In(32),
            "e_valid": Out(1), "e_data": Out(8 * elem_bytes),
            "busy": Out(1),
            "bus": Out(ReadClientSignature(8 * bus_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        eb, bus = self.eb, self.bus_bytes
        lb, le = _log2(bus), _log2(eb)
        burst = burst_bytes(bus)
        lburst = _log2(burst)
        # Short register-to-register paths (FPGA timing): the next burst's byte address, the
        # bytes left in the request and the distance to the next burst boundary are
        # registers; a burst's size is one narrow comparison of two of them.
        ar_addr = Signal(ADDR_WIDTH)  # next burst's beat-aligned byte address
        left = Signal(32 + le + 1)  # beat-aligned bytes of the request not yet requested
        to_boundary = Signal(lburst + 1)  # bytes from ar_addr to the next burst boundary
        fits = (left[lburst + 1:] == 0) & (left[:lburst + 1] < to_boundary)
        chunk = Mux(fits, left[:lburst + 1], to_boundary)  # bytes in this burst
        m.d.comb += [self.bus.araddr.eq(ar_addr), self.bus.arlen.eq((chunk >> lb) - 1)]

        start = Signal(ADDR_WIDTH)
        m.d.comb += start.eq(self.req_addr << le)
        start_low = start[:lb]  # the request's offset in its first beat
        beat = self.bus.rvalid & self.bus.rready
        draining = Signal()  # an element is still to come out of the beat buffer

        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += self.req_ready.eq(~draining)
                with m.If(self.req_valid & ~draining & (self.req_count != 0)):
                    m.d.sync += [
                        ar_addr.eq(start >> lb << lb),
                        left.eq(((self.req_count << le) + start_low + (bus - 1)) >> lb << lb),
                        to_boundary.eq(burst - (start[:lburst] >> lb << lb)),
                    ]
                    m.next = "AR"
            with m.State("AR"):
                m.d.comb += self.bus.arvalid.eq(1)
                with m.If(self.bus.arready):
                    m.d.sync += [ar_addr.eq(ar_addr + chunk), left.eq(left - chunk)]
                    m.next = "R"
            with m.State("R"):
                # the next burst (if any) starts at a boundary: at least two cycles away
                m.d.sync += to_boundary.eq(burst - ar_addr[:lburst])
                with m.If(beat & self.bus.rlast):
                    with m.If(left == 0):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "AR"
        in_r = fsm.ongoing("R")

        if eb >= bus:
            k = eb // bus
            shift = Signal(8 * eb)
            nbeat = Signal(range(k))
            m.d.comb += self.bus.rready.eq(in_r)
            m.d.sync += self.e_valid.eq(0)
            with m.If(beat):
                m.d.sync += shift.eq(self.bus.rdata if k == 1 else
                                     (self.bus.rdata << (8 * bus * (k - 1))) | (shift >> (8 * bus)))
                m.d.sync += nbeat.eq(Mux(nbeat == k - 1, 0, nbeat + 1))
                with m.If(nbeat == k - 1):
                    m.d.sync += self.e_valid.eq(1)
            m.d.comb += [self.e_data.eq(shift), draining.eq(self.e_valid)]
        else:
            slots = bus // eb
            buf = Signal(8 * bus)
            have = Signal()
            slot = Signal(range(slots))
            cur = Signal(max(1, lb))  # offset in its beat of the next element to come out
            remaining = Signal(32)  # elements of the request still to come out
            one_left = Signal()  # remaining == 1, as a register
            with m.If(fsm.ongoing("IDLE") & self.req_valid & self.req_ready):
                m.d.sync += [cur.eq(start_low), remaining.eq(self.req_count),
                             one_left.eq(self.req_count == 1)]
            last_slot = (slot == slots - 1) | one_left
            drain_last = have & last_slot
            m.d.comb += [
                self.e_valid.eq(have),
                self.e_data.eq(buf.word_select(slot, 8 * eb)),
                self.bus.rready.eq(in_r & (~have | drain_last)),
                draining.eq(have),
            ]
            cur_next = Mux(have, cur + eb, cur)
            with m.If(have):
                m.d.sync += [cur.eq(cur + eb), slot.eq(slot + 1), remaining.eq(remaining - 1),
                             one_left.eq(remaining == 2)]
                with m.If(last_slot):
                    m.d.sync += have.eq(0)
            with m.If(beat):
                m.d.sync += [buf.eq(self.bus.rdata), have.eq(1), slot.eq(cur_next[le:lb])]
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | draining)
        return m
