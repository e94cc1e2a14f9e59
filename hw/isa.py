"""The ISA as Amaranth shapes: enum mirrors of celosia.isa and instruction field layouts.

Values come from celosia.isa and bit positions from ``celosia.isa.insn_layout``, so the RTL cannot
drift from the encoder: nothing here restates a number from ISA.md.
"""

from __future__ import annotations

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum

import celosia.isa as isa
from celosia.config import UOP_BITS, HwConfig

__all__ = ["Opcode", "MemType", "AluOp", "ErrorCode", "InsnLayouts", "INSN_BITS",
           "CmdLayout", "INDEX_BITS"]

INSN_BITS = 8 * isa.INSN_BYTES
#: width of an instruction index (the insn_count register is 32 bits)
INDEX_BITS = 32


class Opcode(enum.Enum, shape=3):
    LOAD = isa.Opcode.LOAD.value
    STORE = isa.Opcode.STORE.value
    GEMM = isa.Opcode.GEMM.value
    FINISH = isa.Opcode.FINISH.value
    ALU = isa.Opcode.ALU.value


class MemType(enum.Enum, shape=3):
    UOP = isa.MemType.UOP.value
    WGT = isa.MemType.WGT.value
    INP = isa.MemType.INP.value
    ACC = isa.MemType.ACC.value
    OUT = isa.MemType.OUT.value
    ACC_8BIT = isa.MemType.ACC_8BIT.value


class AluOp(enum.Enum, shape=3):
    MIN = isa.AluOp.MIN.value
    MAX = isa.AluOp.MAX.value
    ADD = isa.AluOp.ADD.value
    SHR = isa.AluOp.SHR.value
    MUL = isa.AluOp.MUL.value


# The mirrors must list every member of the Python enums (a new opcode needs RTL too).
for _hw, _py in ((Opcode, isa.Opcode), (MemType, isa.MemType), (AluOp, isa.AluOp)):
    assert {m.name: m.value for m in _hw} == {m.name: m.value for m in _py}, _hw


class ErrorCode(enum.Enum, shape=8):
    """Why the core stopped; read from the ERROR_CODE register (0 = no error)."""

    NONE = 0
    BAD_OPCODE = 1  # opcode 5-7
    BAD_MEM_TYPE = 2  # memory type 6-7
    LOAD_OUT = 3  # LOAD of memory type OUT
    STORE_TYPE = 4  # STORE of a memory type other than OUT
    STORE_PADS = 5  # STORE with nonzero padding
    BAD_FLAGS = 6  # prev flags on a load-module insn, next flags on a store
    SRAM_RANGE = 7  # LOAD/STORE rows past the end of their buffer
    DRAM_RANGE = 8  # LOAD/STORE past the end of DRAM
    UOP_RANGE = 9  # uop_end > UOP depth or uop_bgn > uop_end
    BAD_ALU_OP = 10  # ALU opcode 5-7
    UOP_DST = 11  # a micro-op's ACC row (dst) outside ACC
    UOP_SRC = 12  # a micro-op's source row outside INP (GEMM) or ACC (ALU)
    UOP_WGT = 13  # a micro-op's WGT row outside WGT
    AFTER_FINISH = 14  # an instruction after FINISH
    NO_FINISH = 15  # the last instruction is not FINISH
    PROGRAM_RANGE = 16  # the program is empty, unaligned or outside DRAM
    DEADLOCK = 17  # every module waits on a token or a full queue


def _flexible(spec: dict, shapes: dict, size: int = INSN_BITS) -> data.FlexibleLayout:
    return data.FlexibleLayout(size, {
        name: data.Field(shapes.get(name, unsigned(width)), pos)
        for name, (pos, width) in spec.items()
    })


class InsnLayouts:
    """View layouts of a 128-bit instruction as LOAD/STORE, GEMM or ALU, and of a micro-op."""

    def __init__(self, cfg: HwConfig):
        lay = isa.insn_layout(cfg)
        common = {"opcode": Opcode}
        self.mem = _flexible(lay.mem, common | {"mem_type": MemType})
        self.gemm = _flexible(lay.gemm, common)
        self.alu = _flexible(lay.alu, common | {"alu_op": AluOp, "imm": signed(16)})
        self.uop = _flexible(lay.uop, {}, size=UOP_BITS)


def CmdLayout() -> data.StructLayout:
    """One command-queue entry: the instruction and its index in the program."""
    return data.StructLayout({"insn": INSN_BITS, "index": INDEX_BITS})
