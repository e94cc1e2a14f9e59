"""The compute module: LOAD of UOP/ACC/ACC_8BIT, GEMM, ALU and FINISH, in program order.

Per instruction: IDLE (start when the head of the command queue has its tokens) -> work
-> PUSH (wait for room, push) -> IDLE; each of IDLE and PUSH takes at least one cycle.

GEMM and ALU run a three-stage pipeline, one micro-op per cycle:
  A  loop counters (i, j, k) address the UOP buffer;
  B  micro-op fields + loop offsets give the ACC/INP/WGT rows, checked against their
     buffers, and address the buffers' read ports;
  C  the GEMM core or the ALU lanes compute; ACC[dst] and OUT[dst] are written.
A micro-op in B reads ACC in the same cycle the previous one writes it in C; the ACC read
ports are transparent to the write port, so the read sees the new row (forwarding) and the
in-order rule of ISA.md holds without stalls.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from celosia.config import LOOP_ITER_BITS, HwConfig

from .alu import AluLane
from .axi import ReadClientSignature
from .gemm import GemmCore
from .isa import CmdLayout, ErrorCode, InsnLayouts, MemType, Opcode
from .sram import SramReadSignature, SramWriteSignature
from .status import ErrorReport, ModuleState, ModuleStatus
from .tensor_load import TensorLoad

__all__ = ["Compute", "COMPUTE_EVENTS"]

COMPUTE_EVENTS = ("compute_insns", "gemm_insns", "alu_insns", "gemm_uops", "alu_uops",
                  "uop_load_elems", "acc_load_elems", "acc8_load_elems")
_OFF = 32  # loop offsets: 14-bit counts times 16-bit factors stay far below 2^32


class Compute(wiring.Component):
    def __init__(self, cfg: HwConfig, *, gemm_products: str = "native"):
        self.cfg = cfg
        self.gemm_products = gemm_products  # GemmCore's ``products`` (same function and timing)
        acc_bits = 8 * cfg.acc_elem_bytes
        super().__init__({
            "cmd_data": In(CmdLayout()), "cmd_rdy": In(1), "cmd_en": Out(1),
            "l2c_can_pop": In(1), "l2c_pop": Out(1), "s2c_can_pop": In(1), "s2c_pop": Out(1),
            "c2l_can_push": In(1), "c2l_push": Out(1), "c2s_can_push": In(1), "c2s_push": Out(1),
            "halt": In(1),
            "bus": Out(ReadClientSignature(8 * cfg.bus_bytes)),
            "uop_w": Out(SramWriteSignature(cfg.uop_depth, 32)),
            "uop_r": Out(SramReadSignature(cfg.uop_depth, 32)),
            "acc_w": Out(SramWriteSignature(cfg.acc_depth, acc_bits)),
            "acc_r": Out(SramReadSignature(cfg.acc_depth, acc_bits)).array(2),
            "out_w": Out(SramWriteSignature(cfg.acc_depth, 8 * cfg.out_elem_bytes)),
            "inp_r": Out(SramReadSignature(cfg.inp_depth, 8 * cfg.inp_elem_bytes)),
            "wgt_r": Out(SramReadSignature(cfg.wgt_depth, 8 * cfg.wgt_elem_bytes)),
            "finished": Out(1),  # FINISH has executed (and pushed its tokens)
            "status": Out(ModuleStatus),
            "error": Out(ErrorReport),
            "events": Out(data.StructLayout({name: 1 for name in COMPUTE_EVENTS})),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = InsnLayouts(cfg)
        lanes = cfg.batch * cfg.block
        ev = self.events

        insn = Signal(128)
        index = Signal.like(self.cmd_data.index)
        gemm = data.View(lay.gemm, insn)
        alu = data.View(lay.alu, insn)
        mem = data.View(lay.mem, insn)
        head = data.View(lay.gemm, self.cmd_data.insn)
        is_alu = Signal()

        # ---- LOAD of UOP / ACC / ACC_8BIT -------------------------------------------------
        m.submodules.loader = loader = TensorLoad(
            elem_bytes=[4, cfg.acc_elem_bytes, cfg.out_elem_bytes], bus_bytes=cfg.bus_bytes)
        wiring.connect(m, wiring.flipped(self.bus), loader.bus)
        m.d.comb += [
            loader.cmd.sel.eq(Mux(mem.mem_type == MemType.UOP, 0,
                                  Mux(mem.mem_type == MemType.ACC, 1, 2))),
            loader.cmd.sram_base.eq(mem.sram_base), loader.cmd.dram_base.eq(mem.dram_base),
            loader.cmd.y_size.eq(mem.y_size), loader.cmd.x_size.eq(mem.x_size),
            loader.cmd.x_stride.eq(mem.x_stride),
            loader.cmd.y_pad_0.eq(mem.y_pad_0), loader.cmd.y_pad_1.eq(mem.y_pad_1),
            loader.cmd.x_pad_0.eq(mem.x_pad_0), loader.cmd.x_pad_1.eq(mem.x_pad_1),
        ]
        acc8 = Cat(*(_sext8(loader.w_data.word_select(x, 8)) for x in range(lanes)))
        load_sel = loader.cmd.sel
        loading = Signal()
        with m.If(loading & loader.w_en):
            with m.If(load_sel == 0):
                m.d.comb += [self.uop_w.en.eq(1), self.uop_w.addr.eq(loader.w_addr),
                             self.uop_w.data.eq(loader.w_data[:32]),
                             ev.uop_load_elems.eq(~loader.w_zero)]
            with m.Else():
                m.d.comb += [self.acc_w.en.eq(1), self.acc_w.addr.eq(loader.w_addr),
                             self.acc_w.data.eq(Mux(load_sel == 1, loader.w_data, acc8))]
                with m.If(load_sel == 1):
                    m.d.comb += ev.acc_load_elems.eq(~loader.w_zero)
                with m.Else():
                    m.d.comb += ev.acc8_load_elems.eq(~loader.w_zero)

        # ---- micro-op loop generator (stage A) -----------------------------------------
        k = Signal(cfg.log_uop_depth + 1)
        i = Signal(LOOP_ITER_BITS)
        j = Signal(LOOP_ITER_BITS)
        dst_o, src_o, wgt_o = Signal(_OFF), Signal(_OFF), Signal(_OFF)  # outer offsets
        dst_i, src_i, wgt_i = Signal(_OFF), Signal(_OFF), Signal(_OFF)  # outer + inner
        gen_done = Signal()
        # stage B registers
        b_valid = Signal()
        b_dst, b_src, b_wgt = Signal(_OFF), Signal(_OFF), Signal(_OFF)
        # stage C registers
        c_valid = Signal()
        c_row = Signal(range(cfg.acc_depth))

        wgt_fo = Mux(is_alu, 0, gemm.wgt_factor_out)
        wgt_fi = Mux(is_alu, 0, gemm.wgt_factor_in)
        src_fo = Mux(is_alu, alu.src_factor_out, gemm.src_factor_out)
        src_fi = Mux(is_alu, alu.src_factor_in, gemm.src_factor_in)
        executing = Signal()
        m.d.comb += self.uop_r.addr.eq(k)
        m.d.sync += b_valid.eq(0)
        with m.If(executing & ~gen_done):
            m.d.sync += [b_valid.eq(1), b_dst.eq(dst_i), b_src.eq(src_i), b_wgt.eq(wgt_i)]
            with m.If(k != gemm.uop_end - 1):
                m.d.sync += k.eq(k + 1)
            with m.Else():
                m.d.sync += k.eq(gemm.uop_bgn)
                with m.If(j != gemm.iter_in - 1):
                    m.d.sync += [j.eq(j + 1), dst_i.eq(dst_i + gemm.dst_factor_in),
                                 src_i.eq(src_i + src_fi), wgt_i.eq(wgt_i + wgt_fi)]
                with m.Else():
                    m.d.sync += [j.eq(0), i.eq(i + 1),
                                 dst_o.eq(dst_o + gemm.dst_factor_out),
                                 src_o.eq(src_o + src_fo), wgt_o.eq(wgt_o + wgt_fo),
                                 dst_i.eq(dst_o + gemm.dst_factor_out),
                                 src_i.eq(src_o + src_fo), wgt_i.eq(wgt_o + wgt_fo)]
                    with m.If(i == gemm.iter_out - 1):
                        m.d.sync += gen_done.eq(1)

        # ---- stage B: row indices, range checks, buffer reads ---------------------------
        uop = data.View(lay.uop, self.uop_r.data)
        row_dst = Signal(_OFF + 1)
        row_src = Signal(_OFF + 1)
        row_wgt = Signal(_OFF + 1)
        m.d.comb += [row_dst.eq(uop.dst + b_dst), row_src.eq(uop.src + b_src),
                     row_wgt.eq(uop.wgt + b_wgt)]
        reads_inp = ~is_alu & ~gemm.reset
        reads_src = is_alu & ~alu.use_imm
        bad_dst = row_dst >= cfg.acc_depth
        bad_src = (reads_inp & (row_src >= cfg.inp_depth)) | (reads_src & (row_src >= cfg.acc_depth))
        bad_wgt = reads_inp & (row_wgt >= cfg.wgt_depth)
        m.d.comb += [
            self.acc_r[0].addr.eq(row_dst), self.acc_r[1].addr.eq(row_src),
            self.inp_r.addr.eq(row_src), self.wgt_r.addr.eq(row_wgt),
        ]
        bad = bad_dst | bad_src | bad_wgt
        m.d.sync += [c_valid.eq(b_valid & ~bad & ~self.halt), c_row.eq(row_dst)]
        with m.If(b_valid & bad):
            m.d.comb += [self.error.valid.eq(1), self.error.index.eq(index),
                         self.error.code.eq(Mux(bad_dst, ErrorCode.UOP_DST,
                                                Mux(bad_src, ErrorCode.UOP_SRC, ErrorCode.UOP_WGT)))]

        # ---- stage C: compute and write ---------------------------------------------------
        m.submodules.gemm = core = GemmCore(cfg, products=self.gemm_products)
        m.d.comb += [core.inp.eq(self.inp_r.data), core.wgt.eq(self.wgt_r.data),
                     core.acc.eq(self.acc_r[0].data)]
        alu_out = Signal(8 * cfg.acc_elem_bytes)
        imm = Signal(signed(32))
        m.d.comb += imm.eq(alu.imm)
        for lane in range(lanes):
            unit = AluLane()
            m.submodules[f"alu{lane}"] = unit
            m.d.comb += [
                unit.op.eq(alu.alu_op),
                unit.x.eq(self.acc_r[0].data.word_select(lane, 32)),
                unit.y.eq(Mux(alu.use_imm, imm, self.acc_r[1].data.word_select(lane, 32))),
                alu_out.word_select(lane, 32).eq(unit.r),
            ]
        result = Mux(is_alu, alu_out, Mux(gemm.reset, 0, core.out))
        with m.If(c_valid & ~loading):
            m.d.comb += [
                self.acc_w.en.eq(1), self.acc_w.addr.eq(c_row), self.acc_w.data.eq(result),
                self.out_w.en.eq(1), self.out_w.addr.eq(c_row),
                self.out_w.data.eq(Cat(*(result.word_select(x, 32)[:8] for x in range(lanes)))),
                ev.gemm_uops.eq(~is_alu & ~gemm.reset), ev.alu_uops.eq(is_alu),
            ]

        # ---- instruction sequencing and tokens -------------------------------------------
        pops_ok = (~head.pop_prev | self.l2c_can_pop) & (~head.pop_next | self.s2c_can_pop)
        room = (~gemm.push_prev | self.c2l_can_push) & (~gemm.push_next | self.c2s_can_push)
        st = self.status
        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += [st.state.eq(ModuleState.IDLE), st.valid.eq(self.cmd_rdy),
                             st.index.eq(self.cmd_data.index),
                             st.flags.eq(self.cmd_data.insn[3:7])]
                with m.If(self.cmd_rdy & pops_ok & ~self.halt):
                    m.d.comb += [self.cmd_en.eq(1), self.l2c_pop.eq(head.pop_prev),
                                 self.s2c_pop.eq(head.pop_next), ev.compute_insns.eq(1)]
                    m.d.sync += [insn.eq(self.cmd_data.insn), index.eq(self.cmd_data.index),
                                 is_alu.eq(head.opcode == Opcode.ALU),
                                 k.eq(head.uop_bgn), i.eq(0), j.eq(0),
                                 dst_o.eq(0), src_o.eq(0), wgt_o.eq(0),
                                 dst_i.eq(0), src_i.eq(0), wgt_i.eq(0),
                                 gen_done.eq((head.uop_bgn == head.uop_end) |
                                             (head.iter_out == 0) | (head.iter_in == 0))]
                    with m.Switch(head.opcode):
                        with m.Case(Opcode.LOAD):
                            m.next = "LOAD"
                        with m.Case(Opcode.GEMM):
                            m.d.comb += ev.gemm_insns.eq(1)
                            m.next = "EXEC"
                        with m.Case(Opcode.ALU):
                            m.d.comb += ev.alu_insns.eq(1)
                            m.next = "EXEC"
                        with m.Default():  # FINISH (fetch routes nothing else here)
                            m.next = "PUSH"
            with m.State("LOAD"):
                m.d.comb += [loader.cmd.valid.eq(1), loading.eq(1), st.state.eq(ModuleState.BUSY)]
                m.next = "LOAD_WAIT"
            with m.State("LOAD_WAIT"):
                m.d.comb += [loading.eq(1), st.state.eq(ModuleState.BUSY)]
                with m.If(loader.done):
                    m.next = "PUSH"
            with m.State("EXEC"):
                m.d.comb += [executing.eq(1), st.state.eq(ModuleState.BUSY)]
                with m.If(gen_done & ~b_valid):
                    m.next = "PUSH"
            with m.State("PUSH"):
                m.d.comb += st.state.eq(ModuleState.PUSH)
                with m.If(room & ~self.halt):
                    m.d.comb += [self.c2l_push.eq(gemm.push_prev), self.c2s_push.eq(gemm.push_next)]
                    with m.If(gemm.opcode == Opcode.FINISH):
                        m.d.sync += self.finished.eq(1)
                    m.next = "IDLE"
        with m.If(~fsm.ongoing("IDLE")):
            m.d.comb += [st.valid.eq(1), st.index.eq(index), st.flags.eq(insn[3:7])]
        return m


def _sext8(byte):
    """An 8-bit lane sign-extended to 32 bits."""
    return Cat(byte, *([byte[7]] * 24))
