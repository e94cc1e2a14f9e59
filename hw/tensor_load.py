"""A 2D LOAD with zero padding: walks the destination block row by row and writes each
element either as zero (padding) or from DRAM through one ReadDma per element size.

The destination is dense: (y_pad_0 + y_size + y_pad_1) rows of (x_pad_0 + x_size + x_pad_1)
elements from sram_base. Timing (docs/microarchitecture.md, "LOAD"): one cycle per padding
element; at the first data element of a row the walker hands (dram row, x_size) to the DMA
in that same cycle and then writes elements as they arrive; it is back in the walk the
cycle after the row's last element. x_size = 0 makes the whole instruction a no-op.

The engine serves several memory types with different element sizes (INP and WGT for the
load module; UOP, ACC and ACC_8BIT for compute). ``sel`` picks the DMA; the written row is
the element zero-extended to ``width`` bits (the owner sign-extends ACC_8BIT).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from celosia.config import MEM_DRAM_BITS, MEM_PAD_BITS, MEM_SIZE_BITS, MEM_SRAM_BITS

from .axi import ReadClientSignature
from .dma_read import ReadDma

__all__ = ["TensorLoad", "LoadCommandSignature"]

_SIZE = MEM_SIZE_BITS + MEM_PAD_BITS + 1  # a padded row or column count


class LoadCommandSignature(wiring.Signature):
    """The fields of a LOAD the engine needs (as seen from the issuer)."""

    def __init__(self, n_types: int):
        super().__init__({
            "valid": Out(1), "ready": In(1), "sel": Out(range(max(n_types, 2))),
            "sram_base": Out(MEM_SRAM_BITS), "dram_base": Out(MEM_DRAM_BITS),
            "y_size": Out(MEM_SIZE_BITS), "x_size": Out(MEM_SIZE_BITS),
            "x_stride": Out(MEM_SIZE_BITS),
            "y_pad_0": Out(MEM_PAD_BITS), "y_pad_1": Out(MEM_PAD_BITS),
            "x_pad_0": Out(MEM_PAD_BITS), "x_pad_1": Out(MEM_PAD_BITS),
        })


class TensorLoad(wiring.Component):
    """``elem_bytes``: element size of each selectable memory type, in ``sel`` order."""

    def __init__(self, *, elem_bytes: list[int], bus_bytes: int):
        self.elem_bytes = list(elem_bytes)
        self.bus_bytes = bus_bytes
        self.width = 8 * max(self.elem_bytes)
        super().__init__({
            "cmd": In(LoadCommandSignature(len(self.elem_bytes))),
            "done": Out(1),  # one-cycle pulse when the instruction has finished
            "w_en": Out(1), "w_zero": Out(1), "w_addr": Out(MEM_SRAM_BITS + 1),
            "w_data": Out(self.width),
            "bus": Out(ReadClientSignature(8 * bus_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        cmd = self.cmd
        dmas = []
        for i, eb in enumerate(self.elem_bytes):
            dma = ReadDma(elem_bytes=eb, bus_bytes=self.bus_bytes)
            m.submodules[f"dma{i}"] = dma
            dmas.append(dma)

        sel = Signal.like(cmd.sel)
        y0, y_end, rows = Signal(_SIZE), Signal(_SIZE), Signal(_SIZE)
        x0, x_size, width = Signal(_SIZE), Signal(MEM_SIZE_BITS), Signal(_SIZE)
        x_stride = Signal(MEM_SIZE_BITS)
        row, col = Signal(_SIZE), Signal(_SIZE)
        ptr = Signal(MEM_SRAM_BITS + 1)
        row_addr = Signal(MEM_DRAM_BITS + MEM_SIZE_BITS + 1)  # DRAM element of the data row
        got = Signal(MEM_SIZE_BITS)

        # The bus is the selected DMA's; the others are idle while this one runs.
        for i, dma in enumerate(dmas):
            with m.If(sel == i):
                m.d.comb += [
                    self.bus.araddr.eq(dma.bus.araddr), self.bus.arlen.eq(dma.bus.arlen),
                    self.bus.arvalid.eq(dma.bus.arvalid), dma.bus.arready.eq(self.bus.arready),
                    dma.bus.rdata.eq(self.bus.rdata), dma.bus.rlast.eq(self.bus.rlast),
                    dma.bus.rvalid.eq(self.bus.rvalid), self.bus.rready.eq(dma.bus.rready),
                ]
        e_valid = Signal()
        e_data = Signal(self.width)
        for i, dma in enumerate(dmas):
            with m.If(sel == i):
                m.d.comb += [e_valid.eq(dma.e_valid), e_data.eq(dma.e_data)]

        # The walk's decisions come from registers (FPGA timing): whether the position is
        # past the last row, in a data row, at the row's first data column; each is
        # computed with the position it belongs to.
        at_end, in_data, at_x0 = Signal(), Signal(), Signal()
        x_last = Signal(MEM_SIZE_BITS)  # x_size - 1

        def advance(n):
            """Move the walk position n elements forward along the row (n <= width - col)."""
            nxt = col + n
            with m.If(nxt == width):
                m.d.sync += [col.eq(0), row.eq(row + 1), at_x0.eq(x0 == 0),
                             at_end.eq(row + 1 == rows),
                             in_data.eq((row + 1 >= y0) & (row + 1 < y_end))]
            with m.Else():
                m.d.sync += [col.eq(nxt), at_x0.eq(nxt == x0)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += cmd.ready.eq(1)
                with m.If(cmd.valid):
                    c_rows = cmd.y_pad_0 + cmd.y_size + cmd.y_pad_1
                    m.d.sync += [
                        sel.eq(cmd.sel), y0.eq(cmd.y_pad_0), y_end.eq(cmd.y_pad_0 + cmd.y_size),
                        rows.eq(c_rows),
                        x0.eq(cmd.x_pad_0), x_size.eq(cmd.x_size), x_stride.eq(cmd.x_stride),
                        x_last.eq(cmd.x_size - 1),
                        width.eq(cmd.x_pad_0 + cmd.x_size + cmd.x_pad_1),
                        row.eq(0), col.eq(0), ptr.eq(cmd.sram_base), row_addr.eq(cmd.dram_base),
                        at_end.eq(c_rows == 0), in_data.eq((cmd.y_pad_0 == 0) & (cmd.y_size != 0)),
                        at_x0.eq(cmd.x_pad_0 == 0),
                    ]
                    with m.If(cmd.x_size == 0):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "WALK"
            with m.State("WALK"):
                with m.If(at_end):
                    m.next = "DONE"
                with m.Elif(in_data & at_x0):
                    for i, dma in enumerate(dmas):
                        m.d.comb += [dma.req_valid.eq(sel == i), dma.req_addr.eq(row_addr),
                                     dma.req_count.eq(x_size)]
                    m.d.sync += [got.eq(0), row_addr.eq(row_addr + x_stride)]
                    m.next = "DATA"
                with m.Else():
                    m.d.comb += [self.w_en.eq(1), self.w_zero.eq(1), self.w_addr.eq(ptr)]
                    m.d.sync += ptr.eq(ptr + 1)
                    advance(1)
            with m.State("DATA"):
                with m.If(e_valid):
                    m.d.comb += [self.w_en.eq(1), self.w_addr.eq(ptr), self.w_data.eq(e_data)]
                    m.d.sync += [ptr.eq(ptr + 1), got.eq(got + 1)]
                    with m.If(got == x_last):
                        advance(x_size)
                        m.next = "WALK"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"
        return m
