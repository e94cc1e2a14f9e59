"""The host register file (ISA.md section 5), an AXI4-Lite slave with 32-bit registers.

The register map is declared once here (``REGISTERS``); sim/rtl.py and the C++ harness
read offsets from it. 64-bit quantities take two words, low word first.

CONTROL (0x00): write bit 0 = 1 to start a run (ignored while running). Read: bit 0
running, bit 1 done (set when the run ends, cleared by the next start), bit 2 error.
A start also clears the token queues, command queues, counters and error registers.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi import AxiLiteSignature

__all__ = ["Register", "REGISTERS", "REG_ADDR_WIDTH", "RegisterFile", "COUNTERS", "reg"]

REG_ADDR_WIDTH = 8

#: hardware event counters, in register order (each 64 bits); *_elems count elements moved
#: without padding, which sim/rtl.py turns into fsim's *_bytes counters
COUNTERS = (
    "load_insns", "compute_insns", "store_insns", "gemm_insns", "alu_insns",
    "gemm_uops", "alu_uops",
    "uop_load_elems", "inp_load_elems", "wgt_load_elems", "acc_load_elems", "acc8_load_elems",
    "out_store_elems",
)


@dataclass(frozen=True)
class Register:
    name: str
    offset: int
    width: int  # 32 or 64
    access: str  # "rw" (host writes, hardware reads), "ro" (hardware drives), "ctrl"
    doc: str


def _build() -> tuple[Register, ...]:
    regs = [
        Register("control", 0x00, 32, "ctrl", "bit 0 start (write) / running (read), bit 1 done, bit 2 error"),
        Register("insn_count", 0x04, 32, "rw", "instructions in the program"),
        Register("insn_addr", 0x08, 64, "rw", "DRAM byte address of the first instruction"),
        Register("dram_size", 0x10, 64, "rw", "bytes of DRAM the program may touch (range checks)"),
        Register("error_code", 0x18, 32, "ro", "hw.isa.ErrorCode of the rule broken, 0 if none"),
        Register("error_index", 0x1C, 32, "ro", "index of the offending instruction (all ones: none)"),
        Register("cycles", 0x20, 64, "ro", "cycles from start to done"),
        Register("fetch_status", 0x28, 32, "ro", "bit 0 stalled on a full command queue, "
                 "bits 2:1 its target (0 load, 1 compute, 2 store), bit 3 all dispatched"),
        Register("fetch_pc", 0x2C, 32, "ro", "index of the next instruction to dispatch"),
    ]
    off = 0x30
    for mod in ("load", "compute", "store"):
        regs.append(Register(f"{mod}_status", off, 32, "ro",
                             "bits 1:0 state (0 idle, 1 busy, 2 push), bits 5:2 flags "
                             "(pop_prev, pop_next, push_prev, push_next), bit 6 has an instruction"))
        regs.append(Register(f"{mod}_index", off + 4, 32, "ro", "index of that instruction"))
        off += 8
    for q in ("l2c", "c2l", "c2s", "s2c"):
        regs.append(Register(f"tokens_{q}", off, 32, "ro", f"tokens in the {q} queue"))
        off += 4
    for name in COUNTERS:
        regs.append(Register(name, off, 64, "ro", "event counter"))
        off += 8
    assert off <= 1 << REG_ADDR_WIDTH
    return tuple(regs)


REGISTERS = _build()
_BY_NAME = {r.name: r for r in REGISTERS}


def reg(name: str) -> Register:
    return _BY_NAME[name]


class RegisterFile(wiring.Component):
    """``rw`` registers are outputs, ``ro`` registers inputs; ``start`` pulses for one cycle,
    the cycle after a write of CONTROL bit 0."""

    def __init__(self):
        members = {"bus": In(AxiLiteSignature(REG_ADDR_WIDTH)), "start": Out(1),
                   "running": In(1), "done": In(1), "error": In(1)}
        for r in REGISTERS:
            if r.access == "rw":
                members[r.name] = Out(r.width)
            elif r.access == "ro":
                members[r.name] = In(r.width)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        # `start` is a register, set the cycle after the write is taken: it resets every
        # engine, and the address decode and the running test in front of that fanout were
        # the critical path on the FPGA (docs/fpga.md). Runs count cycles from it.
        m.d.sync += self.start.eq(0)
        # Writes: take AW and W together, answer B the next cycle.
        accept_w = bus.awvalid & bus.wvalid & ~bus.bvalid
        m.d.comb += [bus.awready.eq(accept_w), bus.wready.eq(accept_w)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        with m.If(accept_w):
            m.d.sync += bus.bvalid.eq(1)
            word = bus.awaddr >> 2
            for r in REGISTERS:
                for half in range(r.width // 32):
                    with m.If(word == r.offset // 4 + half):
                        if r.access == "rw":
                            sig = getattr(self, r.name)
                            m.d.sync += sig[32 * half:32 * (half + 1)].eq(bus.wdata)
                        elif r.access == "ctrl":
                            m.d.sync += self.start.eq(bus.wdata[0] & ~self.running)
        # Reads: AR in, R the next cycle.
        m.d.comb += bus.arready.eq(~bus.rvalid)
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        with m.If(bus.arvalid & ~bus.rvalid):
            m.d.sync += [bus.rvalid.eq(1), bus.rdata.eq(0)]
            word = bus.araddr >> 2
            for r in REGISTERS:
                if r.access == "ctrl":
                    value = self.running | (self.done << 1) | (self.error << 2)
                else:
                    value = getattr(self, r.name)
                for half in range(r.width // 32):
                    with m.If(word == r.offset // 4 + half):
                        m.d.sync += bus.rdata.eq(value[32 * half:32 * (half + 1)]
                                                 if r.width > 32 or half else value)
        return m
