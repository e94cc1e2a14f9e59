"""A 2D STORE: OUT rows to DRAM as AXI4 write bursts, one burst in flight.

For each of y_size rows: x_size OUT elements from sram_base + row * x_size go to DRAM
element dram_base + row * x_stride. A row is split into bursts that never cross a
``burst_bytes(bus)`` boundary; each burst is AW, then its W beats, then B, before the
next AW. Elements at least as wide as the bus take ``elem_bytes / bus_bytes`` beats each,
back to back (the OUT read port is addressed one cycle ahead). Narrower elements are
packed into a beat one per cycle (FILL), and the beat is then sent with byte strobes (SEND).
Cycle counts are in docs/microarchitecture.md ("STORE").
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from celosia.config import MEM_DRAM_BITS, MEM_SIZE_BITS, MEM_SRAM_BITS

from .axi import ADDR_WIDTH, WriteClientSignature, burst_bytes

__all__ = ["TensorStore", "StoreCommandSignature"]


def _log2(x: int) -> int:
    return x.bit_length() - 1


class StoreCommandSignature(wiring.Signature):
    def __init__(self):
        super().__init__({
            "valid": Out(1), "ready": In(1),
            "sram_base": Out(MEM_SRAM_BITS), "dram_base": Out(MEM_DRAM_BITS),
            "y_size": Out(MEM_SIZE_BITS), "x_size": Out(MEM_SIZE_BITS),
            "x_stride": Out(MEM_SIZE_BITS),
        })


class TensorStore(wiring.Component):
    def __init__(self, *, elem_bytes: int, bus_bytes: int, sram_depth: int):
        self.eb, self.bus_bytes = elem_bytes, bus_bytes
        self.sram_depth = sram_depth
        super().__init__({
            "cmd": In(StoreCommandSignature()),
            "done": Out(1),
            "elems": Out(1),  # one pulse per element sent (for the byte counter)
            "r_addr": Out(range(sram_depth)), "r_data": In(8 * elem_bytes),
            "bus": Out(WriteClientSignature(8 * bus_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        eb, bus = self.eb, self.bus_bytes
        lb, le = _log2(bus), _log2(eb)
        burst = burst_bytes(bus)
        cmd = self.cmd

        rows_left = Signal(MEM_SIZE_BITS)
        x_size = Signal(MEM_SIZE_BITS)
        x_stride = Signal(MEM_SIZE_BITS)
        row_sram = Signal(MEM_SRAM_BITS + MEM_SIZE_BITS + 1)
        row_dram = Signal(MEM_DRAM_BITS + MEM_SIZE_BITS + 2)
        cur = Signal(ADDR_WIDTH)  # byte address of the next element to send
        lburst = _log2(burst)
        # Short register-to-register paths (FPGA timing): the bytes of the row not yet in a
        # burst, the distance to the next burst boundary and the elements left in the burst
        # are registers; a burst's size is one narrow comparison of two of them.
        row_left = Signal(MEM_SIZE_BITS + le + 1)
        to_boundary = Signal(lburst + 1)
        burst_elems = Signal(lburst + 1)  # elements of the burst still to be packed
        ptr = Signal(MEM_SRAM_BITS + MEM_SIZE_BITS + 1)
        ptr_next = Signal.like(ptr)
        m.d.comb += ptr_next.eq(ptr)
        m.d.sync += ptr.eq(ptr_next)
        # The read port is addressed with the pointer's next value, so r_data is OUT[ptr].
        m.d.comb += self.r_addr.eq(ptr_next)

        aligned = cur >> lb << lb
        fits = (row_left[lburst + 1:] == 0) & (row_left[:lburst + 1] < to_boundary)
        b_len = Mux(fits, row_left[:lburst + 1], to_boundary)  # bytes of this burst
        awlen = (b_len + cur[:lb] - 1) >> lb  # beats - 1
        beats_left = Signal(9)

        if eb >= bus:
            k = eb // bus
            sub = Signal(range(k))
            m.d.comb += self.bus.wdata.eq(self.r_data.word_select(sub, 8 * bus) if k > 1
                                          else self.r_data)
            m.d.comb += self.bus.wstrb.eq((1 << bus) - 1)
        else:
            slots = bus // eb
            beat = Signal(8 * bus)
            strb = Signal(bus)
            m.d.comb += [self.bus.wdata.eq(beat), self.bus.wstrb.eq(strb)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += cmd.ready.eq(1)
                with m.If(cmd.valid):
                    m.d.sync += [
                        rows_left.eq(Mux(cmd.x_size == 0, 0, cmd.y_size)),
                        x_size.eq(cmd.x_size), x_stride.eq(cmd.x_stride),
                        row_sram.eq(cmd.sram_base), row_dram.eq(cmd.dram_base),
                    ]
                    m.next = "ROW"
            with m.State("ROW"):
                with m.If(rows_left == 0):
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += ptr_next.eq(row_sram)
                    row_start = row_dram << le
                    m.d.sync += [
                        cur.eq(row_start), row_left.eq(x_size << le),
                        to_boundary.eq(burst - row_start[:lburst]),
                        row_sram.eq(row_sram + x_size), row_dram.eq(row_dram + x_stride),
                        rows_left.eq(rows_left - 1),
                    ]
                    m.next = "AW"
            with m.State("AW"):
                m.d.comb += [self.bus.awvalid.eq(1), self.bus.awaddr.eq(aligned),
                             self.bus.awlen.eq(awlen)]
                with m.If(self.bus.awready):
                    # the next burst of the row (if any) starts at a boundary
                    m.d.sync += [beats_left.eq(awlen + 1), row_left.eq(row_left - b_len),
                                 to_boundary.eq(burst), burst_elems.eq(b_len >> le)]
                    if eb >= bus:
                        m.d.sync += sub.eq(0)
                        m.next = "SEND"
                    else:
                        m.d.sync += strb.eq(0)
                        m.next = "FILL"
            if eb >= bus:
                with m.State("SEND"):
                    m.d.comb += [self.bus.wvalid.eq(1), self.bus.wlast.eq(beats_left == 1)]
                    with m.If(self.bus.wready):
                        m.d.sync += [beats_left.eq(beats_left - 1), sub.eq(sub + 1)]
                        with m.If(sub == k - 1):
                            m.d.comb += [ptr_next.eq(ptr + 1), self.elems.eq(1)]
                            m.d.sync += cur.eq(cur + eb)
                        with m.If(beats_left == 1):
                            m.next = "B"
            else:
                with m.State("FILL"):
                    slot = cur[le:lb]
                    for s in range(slots):
                        with m.If(slot == s):
                            m.d.sync += [beat.word_select(s, 8 * eb).eq(self.r_data),
                                         strb[s * eb:(s + 1) * eb].eq((1 << eb) - 1)]
                    m.d.comb += [ptr_next.eq(ptr + 1), self.elems.eq(1)]
                    m.d.sync += [cur.eq(cur + eb), burst_elems.eq(burst_elems - 1)]
                    with m.If((slot == slots - 1) | (burst_elems == 1)):
                        m.next = "SEND"
                with m.State("SEND"):
                    m.d.comb += [self.bus.wvalid.eq(1), self.bus.wlast.eq(beats_left == 1)]
                    with m.If(self.bus.wready):
                        m.d.sync += [beats_left.eq(beats_left - 1), strb.eq(0)]
                        with m.If(beats_left == 1):
                            m.next = "B"
                        with m.Else():
                            m.next = "FILL"
            with m.State("B"):
                m.d.comb += self.bus.bready.eq(1)
                with m.If(self.bus.bvalid):
                    with m.If(row_left == 0):
                        m.next = "ROW"
                    with m.Else():
                        m.next = "AW"
        return m
