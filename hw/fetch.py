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

from celosia.config import MEM_SIZE_BITS, HwConfig
from celosia.isa import INSN_BYTES

from .axi import ADDR_WIDTH, ReadClientSignature
from .dma_read import ReadDma
from .isa import INDEX_BITS, INSN_BITS, AluOp, CmdLayout, ErrorCode, InsnLayouts, MemType, Opcode
from .status import ErrorReport

__all__ = ["Fetch", "FETCH_INSNS", "CmdWriteSignature"]

#: instructions fetched per batch (and the size of fetch's buffer)
FETCH_INSNS = 8
_SIZE_BITS = MEM_SIZE_BITS + 2  # a padded row or column count: size + 2 x (2^4 - 1) pads


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
        # an entry: the instruction, its verdict (ErrorCode) and its command queue
        code_bits = ErrorCode.as_shape().width
        m.submodules.buf = buf = fifo.SyncFIFO(width=INSN_BITS + code_bits + 2,
                                               depth=FETCH_INSNS)
        wiring.connect(m, wiring.flipped(self.bus), dma.bus)
        fetched = Signal(INDEX_BITS)
        pc = self.pc
        checked = Signal()
        finished = Signal()
        # registers, not sums, feed the DMA request (FPGA timing): the instructions not yet
        # requested and the next batch's first instruction (in 16-byte elements)
        left = Signal(INDEX_BITS)
        next_insn = Signal(ADDR_WIDTH - 4)
        m.d.comb += self.dispatched_all.eq(finished | (checked & (pc == self.insn_count)))

        # ---- program range (once per run) ---------------------------------------------
        prog_end = Signal(ADDR_WIDTH + INDEX_BITS + 5)
        # registered: the host sets the program's registers before it starts the core
        m.d.sync += prog_end.eq(self.insn_addr + self.insn_count * INSN_BYTES)
        with m.If(self.run & ~checked & ~self.halt):
            m.d.sync += [checked.eq(1), left.eq(self.insn_count),
                         next_insn.eq(self.insn_addr >> 4)]
            with m.If((self.insn_addr[:4] != 0) | (self.insn_count == 0) |
                      (prog_end > self.dram_size)):
                m.d.comb += [self.error.valid.eq(1), self.error.code.eq(ErrorCode.PROGRAM_RANGE),
                             self.error.index.eq(Const(-1, INDEX_BITS))]

        # ---- batch requests --------------------------------------------------------------
        with m.If(checked & ~self.halt & dma.req_ready & (pc == fetched) & (left != 0)):
            n = Mux(left > FETCH_INSNS, FETCH_INSNS, left)
            m.d.comb += [dma.req_valid.eq(1), dma.req_addr.eq(next_insn), dma.req_count.eq(n)]
            m.d.sync += [fetched.eq(fetched + n), left.eq(left - n),
                         next_insn.eq(next_insn + n)]

        # ---- check (three stages between the DMA and the buffer) --------------------------
        # Every rule decided by an instruction's own fields, its index and the run's
        # registers is checked before it enters the buffer, so that the head's verdict is a
        # register read: C1 registers the instruction, C2 the products of its sizes, C3 the
        # ends of its SRAM and DRAM ranges; the verdict is written with it into the buffer.
        c1_valid, c1_word, c1_index = Signal(), Signal(INSN_BITS), Signal(INDEX_BITS)
        arrived = Signal(INDEX_BITS)  # instructions out of the DMA so far
        m.d.sync += [c1_valid.eq(dma.e_valid), c1_word.eq(dma.e_data), c1_index.eq(arrived)]
        # the multipliers' operands, from the DMA's word as C1 registers it
        arriving = data.View(lay.mem, dma.e_data)
        a_load = dma.e_data[:3] == Opcode.LOAD.value
        rows, cols = Signal(_SIZE_BITS, name="c1_rows"), Signal(_SIZE_BITS, name="c1_cols")
        y_less = Signal(MEM_SIZE_BITS, name="c1_y_less")  # y_size - 1 (y_size > 0 if used)
        m.d.sync += [
            rows.eq(Mux(a_load, arriving.y_pad_0 + arriving.y_size + arriving.y_pad_1,
                        arriving.y_size)),
            cols.eq(Mux(a_load, arriving.x_pad_0 + arriving.x_size + arriving.x_pad_1,
                        arriving.x_size)),
            y_less.eq(arriving.y_size - 1),
        ]
        with m.If(dma.e_valid):
            m.d.sync += arrived.eq(arrived + 1)
        mem = data.View(lay.mem, c1_word)
        gemm = data.View(lay.gemm, c1_word)
        alu = data.View(lay.alu, c1_word)
        op = c1_word[:3]
        mt = mem.mem_type.as_value()
        is_load, is_store = op == Opcode.LOAD.value, op == Opcode.STORE.value
        is_mem = is_load | is_store
        is_loop = (op == Opcode.GEMM.value) | (op == Opcode.ALU.value)
        to_load = is_load & ((mt == MemType.INP.value) | (mt == MemType.WGT.value))
        pads = Cat(mem.y_pad_0, mem.y_pad_1, mem.x_pad_0, mem.x_pad_1) != 0
        last = c1_index == self.insn_count - 1
        # the rules that need no arithmetic, in ISA.md's order, resolved in C1
        early = Signal(ErrorCode)
        with m.If(op > Opcode.ALU.value):
            m.d.comb += early.eq(ErrorCode.BAD_OPCODE)
        with m.Elif(is_mem & (mt > MemType.ACC_8BIT.value)):
            m.d.comb += early.eq(ErrorCode.BAD_MEM_TYPE)
        with m.Elif((op == Opcode.ALU.value) & (alu.alu_op.as_value() > AluOp.MUL.value)):
            m.d.comb += early.eq(ErrorCode.BAD_ALU_OP)
        with m.Elif((to_load & (mem.pop_prev | mem.push_prev)) |
                    (is_store & (mem.pop_next | mem.push_next))):
            m.d.comb += early.eq(ErrorCode.BAD_FLAGS)
        with m.Elif(is_load & (mt == MemType.OUT.value)):
            m.d.comb += early.eq(ErrorCode.LOAD_OUT)
        with m.Elif(is_store & (mt != MemType.OUT.value)):
            m.d.comb += early.eq(ErrorCode.STORE_TYPE)
        with m.Elif(is_store & pads):
            m.d.comb += early.eq(ErrorCode.STORE_PADS)
        # the rules after the range checks, in order (used if both ranges are fine)
        late = Signal(ErrorCode)
        with m.If(is_loop & ((gemm.uop_end > cfg.uop_depth) | (gemm.uop_bgn > gemm.uop_end))):
            m.d.comb += late.eq(ErrorCode.UOP_RANGE)
        with m.Elif(last & (op != Opcode.FINISH.value)):
            m.d.comb += late.eq(ErrorCode.NO_FINISH)
        with m.Elif((op == Opcode.FINISH.value) & ~last):
            m.d.comb += late.eq(ErrorCode.AFTER_FINISH)  # reported at the next index
        target = Signal(2)
        m.d.comb += target.eq(Mux(to_load, 0, Mux(is_store, 2, 1)))
        depths = {MemType.UOP: cfg.uop_depth, MemType.WGT: cfg.wgt_depth,
                  MemType.INP: cfg.inp_depth, MemType.ACC: cfg.acc_depth,
                  MemType.OUT: cfg.acc_depth, MemType.ACC_8BIT: cfg.acc_depth}
        log_eb = {MemType.UOP: 2, MemType.WGT: cfg.wgt_elem_bytes.bit_length() - 1,
                  MemType.INP: cfg.inp_elem_bytes.bit_length() - 1,
                  MemType.ACC: cfg.acc_elem_bytes.bit_length() - 1,
                  MemType.OUT: cfg.out_elem_bytes.bit_length() - 1,
                  MemType.ACC_8BIT: cfg.out_elem_bytes.bit_length() - 1}
        # log2 of an element's bytes (WGT on the default core: 256 bytes, 8 needs 4 bits)
        shift_shape = range(max(log_eb.values()) + 1)
        depth, shift = Signal(32), Signal(shift_shape)
        with m.Switch(mt):
            for t, d in depths.items():
                with m.Case(t.value):
                    m.d.comb += [depth.eq(d), shift.eq(log_eb[t])]
        # C2: the products
        def stage(name, **fields):
            return {k: Signal(shape, name=f"{name}_{k}") for k, shape in fields.items()}

        common = dict(valid=1, word=INSN_BITS, early=ErrorCode, late=ErrorCode, target=2,
                      depth=32, shift=shift_shape, checks=1, dram=1)
        c2 = stage("c2", **common, count=48, span=48)
        m.d.sync += [c2["valid"].eq(c1_valid), c2["word"].eq(c1_word), c2["early"].eq(early),
                     c2["late"].eq(late), c2["target"].eq(target), c2["depth"].eq(depth),
                     c2["shift"].eq(shift), c2["checks"].eq(is_mem & (mem.x_size != 0)),
                     c2["dram"].eq(mem.y_size != 0),
                     c2["count"].eq(rows * cols), c2["span"].eq(y_less * mem.x_stride)]
        mem2 = data.View(lay.mem, c2["word"])
        # C3: the ends of the ranges
        c3 = stage("c3", **common, sram_end=49, dram_last=50)  # dram_last: last element + 1
        m.d.sync += [c3[k].eq(c2[k]) for k in ("valid", "word", "early", "late", "target",
                                               "depth", "shift", "checks", "dram")]
        m.d.sync += [c3["sram_end"].eq(mem2.sram_base + c2["count"]),
                     c3["dram_last"].eq(mem2.dram_base + c2["span"] + mem2.x_size)]
        dram_bytes = Signal(ADDR_WIDTH + 8)
        with m.Switch(c3["shift"]):
            for sh in sorted(set(log_eb.values())):
                with m.Case(sh):
                    m.d.comb += dram_bytes.eq(c3["dram_last"] << sh)
        code = Signal(ErrorCode)
        with m.If(c3["early"] != ErrorCode.NONE):
            m.d.comb += code.eq(c3["early"])
        with m.Elif(c3["checks"] & (c3["sram_end"] > c3["depth"])):
            m.d.comb += code.eq(ErrorCode.SRAM_RANGE)
        with m.Elif(c3["checks"] & c3["dram"] & (dram_bytes > self.dram_size)):
            m.d.comb += code.eq(ErrorCode.DRAM_RANGE)
        with m.Else():
            m.d.comb += code.eq(c3["late"])
        m.d.comb += [buf.w_data.eq(Cat(c3["word"], code, c3["target"])),
                     buf.w_en.eq(c3["valid"])]

        # ---- the head ----------------------------------------------------------------------
        word = buf.r_data[:INSN_BITS]
        head_code = buf.r_data[INSN_BITS:INSN_BITS + code_bits]
        target = buf.r_data[INSN_BITS + code_bits:]
        op = word[:3]
        m.d.comb += self.target.eq(target)

        # ---- dispatch ------------------------------------------------------------------
        pc_next = Signal(INDEX_BITS, init=1)  # pc + 1, as a register
        queues = [self.load_q, self.compute_q, self.store_q]
        room = Signal()
        for t, q in enumerate(queues):
            m.d.comb += [q.w_data.insn.eq(word), q.w_data.index.eq(pc)]
            with m.If(target == t):
                m.d.comb += room.eq(q.w_rdy)
        with m.If(buf.r_rdy & ~self.halt & ~finished):
            with m.If(head_code != ErrorCode.NONE.value):
                after = head_code == ErrorCode.AFTER_FINISH.value
                m.d.comb += [self.error.valid.eq(1), self.error.code.eq(head_code),
                             self.error.index.eq(Mux(after, pc_next, pc))]
            with m.Elif(room):
                for t, q in enumerate(queues):
                    m.d.comb += q.w_en.eq(target == t)
                m.d.comb += buf.r_en.eq(1)
                m.d.sync += [pc.eq(pc_next), pc_next.eq(pc_next + 1)]
                with m.If(op == Opcode.FINISH.value):
                    m.d.sync += finished.eq(1)
            with m.Else():
                m.d.comb += self.stalled.eq(1)
        return m
