"""An on-chip buffer: one write port and N synchronous read ports.

Read data appears the cycle after the address. Read ports built with ``transparent=True``
see a write to the same row in the same cycle; by default a read in the cycle of a write
to its row returns the old row (compute forwards such rows itself, hw/compute.py).
With ``registered_write=True`` a write lands the cycle after it is presented: a register in
front of the write port keeps the path from the writer to block RAMs spread over an FPGA
short; only for buffers no reader touches within a cycle of a write (every buffer but
ACC, whose writes compute forwards by their exact cycle).
Wide rows are left to synthesis to split across block RAMs.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Sram", "SramWriteSignature", "SramReadSignature"]


class SramWriteSignature(wiring.Signature):
    """A write port as seen from the writer."""

    def __init__(self, depth: int, width: int):
        super().__init__({"en": Out(1), "addr": Out(range(depth)), "data": Out(width)})


class SramReadSignature(wiring.Signature):
    """A read port as seen from the reader: data is row ``addr`` of the previous cycle."""

    def __init__(self, depth: int, width: int):
        super().__init__({"addr": Out(range(depth)), "data": In(width)})


class Sram(wiring.Component):
    def __init__(self, *, depth: int, width: int, read_ports: int = 1, transparent: bool = False,
                 registered_write: bool = False):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"width must be a positive integer, not {width!r}")
        self.depth, self.width, self.transparent = depth, width, transparent
        self.registered_write = registered_write
        super().__init__({
            "write": In(SramWriteSignature(depth, width)),
            "read": In(SramReadSignature(depth, width)).array(read_ports),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = memory.Memory(shape=self.width, depth=self.depth, init=[])
        wp = mem.write_port()
        domain = m.d.sync if self.registered_write else m.d.comb
        domain += [wp.en.eq(self.write.en), wp.addr.eq(self.write.addr),
                   wp.data.eq(self.write.data)]
        for port in self.read:
            rp = mem.read_port(transparent_for=(wp,) if self.transparent else ())
            m.d.comb += [rp.addr.eq(port.addr), port.data.eq(rp.data)]
        return m
