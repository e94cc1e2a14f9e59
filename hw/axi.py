"""Bus signatures: AXI4 (master side, INCR bursts, one ID) and AXI4-Lite, plus the internal
read/write client signatures the DMA engines speak (a subset of AXI4 with the same names).

Only the signals celosia uses are present; the top level ties ID/cache/prot off (see
hw/core.py), so the export is still a valid AXI4 master.
"""

from __future__ import annotations

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ADDR_WIDTH", "ReadClientSignature", "WriteClientSignature", "Axi4Signature",
           "AxiLiteSignature", "burst_bytes"]

#: DRAM byte addresses are 64 bits (ISA.md section 5: a 64-bit instruction address)
ADDR_WIDTH = 64


def burst_bytes(bus_bytes: int) -> int:
    """Bursts never cross a boundary of this many bytes: AXI4's 4 KiB rule and 256 beats."""
    return min(4096, 256 * bus_bytes)


class ReadClientSignature(wiring.Signature):
    """A read client as seen from the client (AR out, R in)."""

    def __init__(self, data_width: int):
        super().__init__({
            "araddr": Out(ADDR_WIDTH), "arlen": Out(8), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rlast": In(1), "rvalid": In(1), "rready": Out(1),
        })


class WriteClientSignature(wiring.Signature):
    """A write client as seen from the client (AW/W out, B in)."""

    def __init__(self, data_width: int):
        super().__init__({
            "awaddr": Out(ADDR_WIDTH), "awlen": Out(8), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bvalid": In(1), "bready": Out(1),
        })


class Axi4Signature(wiring.Signature):
    """AXI4 master (as seen from the master)."""

    def __init__(self, data_width: int):
        super().__init__({
            "arid": Out(1), "araddr": Out(ADDR_WIDTH), "arlen": Out(8), "arsize": Out(3),
            "arburst": Out(2), "arcache": Out(4), "arprot": Out(3),
            "arvalid": Out(1), "arready": In(1),
            "rid": In(1), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
            "rvalid": In(1), "rready": Out(1),
            "awid": Out(1), "awaddr": Out(ADDR_WIDTH), "awlen": Out(8), "awsize": Out(3),
            "awburst": Out(2), "awcache": Out(4), "awprot": Out(3),
            "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(1), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        })


class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite slave (as seen from the master; use In(...) on the slave)."""

    def __init__(self, addr_width: int = 8):
        super().__init__({
            "awaddr": Out(addr_width), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(32), "wstrb": Out(4), "wvalid": Out(1), "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arvalid": Out(1), "arready": In(1),
            "rdata": In(32), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })
