"""Fetch: reads the program in batches, checks each instruction and dispatches it, in
program order, to the command queue of the module that executes it.

Batches: when every instruction fetched so far has been dispatched and the DMA is idle,
fetch requests the next min(FETCH_INSNS, remaining) instructions as one DMA request (the
DMA splits it at burst boundaries); they land in a FETCH_INSNS-entry buffer. The head of
the buffer is checked and dispatched in one cycle when its command queue has room; fetch
stalls on a full queue even if other queues have room (docs/isa.md, choice 1).

Every rule an instruction's own fields decide (ISA.md section 4) is checked here; a broken
rule raises an error with the instruction's index and stops the core before the
instruction reaches a module.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from celosia.config import HwConfig
from celosia.isa import INSN_BYTES

from .axi import ADDR_WIDTH, ReadClientSignature
from .dma_read import ReadDma
from .isa import INDEX_BITS, INSN_BITS, AluOp, CmdLayout, ErrorCode, InsnLayouts, MemType, Opcode
from .status import ErrorReport

__all__ = ["Fetch", "FETCH_INSNS", "CmdWriteSignature"]

#: instructions fetched per batch (and the size of fetch's buffer)
FETCH_INSNS = 8


class CmdWriteSignature(wiring.Signature):
    def __init__(self):
        super().__init__({"w_data": Out(CmdLayout()), "w_en": Out(1), "w_rdy": In(1)})


class Fetch(wiring.Component):
    def __init__(self, cfg: HwConfig):
        self.cfg = cfg
        super().__init__({
            "run": In(1), "halt": In(1),
            "insn_addr": In(ADDR_WIDTH), "insn_count": In(INDEX_BITS), "dram_size": In(ADDR_WIDTH),
            "bus": Out(ReadClientSignature(8 * cfg.bus_bytes)),
            "load_q": Out(CmdWriteSignature()), "compute_q": Out(CmdWriteSignature()),
            "store_q": Out(CmdWriteSignature()),
            "dispatched_all": Out(1),
            "stalled": Out(1), "pc": Out(INDEX_BITS), "target": Out(2),
            "error": Out(ErrorReport),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = InsnLayouts(cfg)

        m.submodules.dma = dma = ReadDma(elem_bytes=INSN_BYTES, bus_bytes=cfg.bus_bytes)
        m.submodules.buf = buf = fifo.SyncFIFO(width=INSN_BITS, depth=FETCH_INSNS)
        wiring.connect(m, wiring.flipped(self.bus), dma.bus)
        m.d.comb += [buf.w_data.eq(dma.e_data), buf.w_en.eq(dma.e_valid)]

        fetched = Signal(INDEX_BITS)
        pc = self.pc
        checked = Signal()
        finished = Signal()
        left = self.insn_count - fetched
        m.d.comb += self.dispatched_all.eq(finished | (checked & (pc == self.insn_count)))

        # ---- program range (once per run) ---------------------------------------------
        prog_end = Signal(ADDR_WIDTH + INDEX_BITS + 5)
        m.d.comb += prog_end.eq(self.insn_addr + self.insn_count * INSN_BYTES)
        with m.If(self.run & ~checked & ~self.halt):
            m.d.sync += checked.eq(1)
            with m.If((self.insn_addr[:4] != 0) | (self.insn_count == 0) |
                      (prog_end > self.dram_size)):
                m.d.comb += [self.error.valid.eq(1), self.error.code.eq(ErrorCode.PROGRAM_RANGE),
                             self.error.index.eq(Const(-1, INDEX_BITS))]

        # ---- batch requests --------------------------------------------------------------
        with m.If(checked & ~self.halt & dma.req_ready & (pc == fetched) & (left != 0)):
            n = Mux(left > FETCH_INSNS, FETCH_INSNS, left)
            m.d.comb += [dma.req_valid.eq(1), dma.req_addr.eq((self.insn_addr >> 4) + fetched),
                         dma.req_count.eq(n)]
            m.d.sync += fetched.eq(fetched + n)

        # ---- decode and check the head --------------------------------------------------
        word = buf.r_data
        mem = data.View(lay.mem, word)
        gemm = data.View(lay.gemm, word)
        alu = data.View(lay.alu, word)
        op = word[:3]
        mt = mem.mem_type.as_value()
        is_load, is_store = op == Opcode.LOAD.value, op == Opcode.STORE.value
        is_mem = is_load | is_store
        is_loop = (op == Opcode.GEMM.value) | (op == Opcode.ALU.value)
        to_load = is_load & ((mt == MemType.INP.value) | (mt == MemType.WGT.value))
        target = Signal(2)
        m.d.comb += target.eq(Mux(to_load, 0, Mux(is_store, 2, 1)))
        m.d.comb += self.target.eq(target)

        depths = {MemType.UOP: cfg.uop_depth, MemType.WGT: cfg.wgt_depth,
                  MemType.INP: cfg.inp_depth, MemType.ACC: cfg.acc_depth,
                  MemType.OUT: cfg.acc_depth, MemType.ACC_8BIT: cfg.acc_depth}
        log_eb = {MemType.UOP: 2, MemType.WGT: cfg.wgt_elem_bytes.bit_length() - 1,
                  MemType.INP: cfg.inp_elem_bytes.bit_length() - 1,
                  MemType.ACC: cfg.acc_elem_bytes.bit_length() - 1,
                  MemType.OUT: cfg.out_elem_bytes.bit_length() - 1,
                  MemType.ACC_8BIT: cfg.out_elem_bytes.bit_length() - 1}
        depth = Signal(32)
        dram_last = Signal(32 + 17)  # last DRAM element + 1
        dram_bytes = Signal(ADDR_WIDTH + 8)
        with m.Switch(mt):
            for t, d in depths.items():
                with m.Case(t.value):
                    m.d.comb += [depth.eq(d), dram_bytes.eq(dram_last << log_eb[t])]
        rows = Mux(is_load, mem.y_pad_0 + mem.y_size + mem.y_pad_1, mem.y_size)
        cols = Mux(is_load, mem.x_pad_0 + mem.x_size + mem.x_pad_1, mem.x_size)
        count = Signal(48)
        m.d.comb += [count.eq(rows * cols),
                     dram_last.eq(mem.dram_base + (mem.y_size - 1) * mem.x_stride + mem.x_size)]
        pads = Cat(mem.y_pad_0, mem.y_pad_1, mem.x_pad_0, mem.x_pad_1) != 0
        last = pc == self.insn_count - 1

        code = Signal(ErrorCode)
        with m.If(op > Opcode.ALU.value):
            m.d.comb += code.eq(ErrorCode.BAD_OPCODE)
        with m.Elif(is_mem & (mt > MemType.ACC_8BIT.value)):
            m.d.comb += code.eq(ErrorCode.BAD_MEM_TYPE)
        with m.Elif((op == Opcode.ALU.value) & (alu.alu_op.as_value() > AluOp.MUL.value)):
            m.d.comb += code.eq(ErrorCode.BAD_ALU_OP)
        with m.Elif((to_load & (mem.pop_prev | mem.push_prev)) |
                    (is_store & (mem.pop_next | mem.push_next))):
            m.d.comb += code.eq(ErrorCode.BAD_FLAGS)
        with m.Elif(is_load & (mt == MemType.OUT.value)):
            m.d.comb += code.eq(ErrorCode.LOAD_OUT)
        with m.Elif(is_store & (mt != MemType.OUT.value)):
            m.d.comb += code.eq(ErrorCode.STORE_TYPE)
        with m.Elif(is_store & pads):
            m.d.comb += code.eq(ErrorCode.STORE_PADS)
        with m.Elif(is_mem & (mem.x_size != 0) & (mem.sram_base + count > depth)):
            m.d.comb += code.eq(ErrorCode.SRAM_RANGE)
        with m.Elif(is_mem & (mem.x_size != 0) & (mem.y_size != 0) & (dram_bytes > self.dram_size)):
            m.d.comb += code.eq(ErrorCode.DRAM_RANGE)
        with m.Elif(is_loop & ((gemm.uop_end > cfg.uop_depth) | (gemm.uop_bgn > gemm.uop_end))):
            m.d.comb += code.eq(ErrorCode.UOP_RANGE)
        with m.Elif(last & (op != Opcode.FINISH.value)):
            m.d.comb += code.eq(ErrorCode.NO_FINISH)

        # ---- dispatch ------------------------------------------------------------------
        queues = [self.load_q, self.compute_q, self.store_q]
        room = Signal()
        for t, q in enumerate(queues):
            m.d.comb += [q.w_data.insn.eq(word), q.w_data.index.eq(pc)]
            with m.If(target == t):
                m.d.comb += room.eq(q.w_rdy)
        with m.If(buf.r_rdy & ~self.halt & ~finished):
            with m.If(code != ErrorCode.NONE):
                m.d.comb += [self.error.valid.eq(1), self.error.code.eq(code),
                             self.error.index.eq(pc)]
            with m.Elif((op == Opcode.FINISH.value) & ~last):
                m.d.comb += [self.error.valid.eq(1), self.error.code.eq(ErrorCode.AFTER_FINISH),
                             self.error.index.eq(pc + 1)]
            with m.Elif(room):
                for t, q in enumerate(queues):
                    m.d.comb += q.w_en.eq(target == t)
                m.d.comb += buf.r_en.eq(1)
                m.d.sync += pc.eq(pc + 1)
                with m.If(op == Opcode.FINISH.value):
                    m.d.sync += finished.eq(1)
            with m.Else():
                m.d.comb += self.stalled.eq(1)
        return m
