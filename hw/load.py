"""The load module: LOAD of INP and WGT, in program order, under the token protocol.

Per instruction: IDLE (start when the head of the command queue has its compute->load token,
if pop_next) -> LOAD (hand the instruction to the TensorLoad engine) -> LOAD_WAIT -> PUSH
(wait for room in load->compute, if push_next) -> IDLE.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from celosia.config import HwConfig

from .axi import ReadClientSignature
from .isa import CmdLayout, InsnLayouts, MemType
from .sram import SramWriteSignature
from .status import ModuleState, ModuleStatus
from .tensor_load import TensorLoad

__all__ = ["Load", "LOAD_EVENTS"]

LOAD_EVENTS = ("load_insns", "inp_load_elems", "wgt_load_elems")


class Load(wiring.Component):
    def __init__(self, cfg: HwConfig):
        self.cfg = cfg
        super().__init__({
            "cmd_data": In(CmdLayout()), "cmd_rdy": In(1), "cmd_en": Out(1),
            "c2l_can_pop": In(1), "c2l_pop": Out(1),
            "l2c_can_push": In(1), "l2c_push": Out(1),
            "halt": In(1),
            "bus": Out(ReadClientSignature(8 * cfg.bus_bytes)),
            "inp_w": Out(SramWriteSignature(cfg.inp_depth, 8 * cfg.inp_elem_bytes)),
            "wgt_w": Out(SramWriteSignature(cfg.wgt_depth, 8 * cfg.wgt_elem_bytes)),
            "status": Out(ModuleStatus),
            "events": Out(data.StructLayout({name: 1 for name in LOAD_EVENTS})),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = InsnLayouts(cfg)
        insn = Signal(lay.mem)
        index = Signal.like(self.cmd_data.index)
        head = data.View(lay.mem, self.cmd_data.insn)

        m.submodules.loader = loader = TensorLoad(
            elem_bytes=[cfg.inp_elem_bytes, cfg.wgt_elem_bytes], bus_bytes=cfg.bus_bytes)
        wiring.connect(m, wiring.flipped(self.bus), loader.bus)
        c = loader.cmd
        m.d.comb += [
            c.sel.eq(Mux(insn.mem_type == MemType.INP, 0, 1)),
            c.sram_base.eq(insn.sram_base), c.dram_base.eq(insn.dram_base),
            c.y_size.eq(insn.y_size), c.x_size.eq(insn.x_size), c.x_stride.eq(insn.x_stride),
            c.y_pad_0.eq(insn.y_pad_0), c.y_pad_1.eq(insn.y_pad_1),
            c.x_pad_0.eq(insn.x_pad_0), c.x_pad_1.eq(insn.x_pad_1),
        ]
        with m.If(loader.w_en):
            with m.If(c.sel == 0):
                m.d.comb += [self.inp_w.en.eq(1), self.inp_w.addr.eq(loader.w_addr),
                             self.inp_w.data.eq(loader.w_data),
                             self.events.inp_load_elems.eq(~loader.w_zero)]
            with m.Else():
                m.d.comb += [self.wgt_w.en.eq(1), self.wgt_w.addr.eq(loader.w_addr),
                             self.wgt_w.data.eq(loader.w_data),
                             self.events.wgt_load_elems.eq(~loader.w_zero)]

        st = self.status
        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += [st.state.eq(ModuleState.IDLE), st.valid.eq(self.cmd_rdy),
                             st.index.eq(self.cmd_data.index), st.flags.eq(self.cmd_data.insn[3:7])]
                # the head is copied in every IDLE cycle (the copy in the start cycle is the
                # one kept): its registers load on the state, not on the start decision, whose
                # fanout would otherwise lengthen the path from the queue to the tokens
                m.d.sync += [insn.eq(self.cmd_data.insn), index.eq(self.cmd_data.index)]
                with m.If(self.cmd_rdy & (~head.pop_next | self.c2l_can_pop) & ~self.halt):
                    m.d.comb += [self.cmd_en.eq(1), self.c2l_pop.eq(head.pop_next),
                                 self.events.load_insns.eq(1)]
                    m.next = "LOAD"
            with m.State("LOAD"):
                m.d.comb += [c.valid.eq(1), st.state.eq(ModuleState.BUSY)]
                m.next = "LOAD_WAIT"
            with m.State("LOAD_WAIT"):
                m.d.comb += st.state.eq(ModuleState.BUSY)
                with m.If(loader.done):
                    m.next = "PUSH"
            with m.State("PUSH"):
                m.d.comb += st.state.eq(ModuleState.PUSH)
                with m.If((~insn.push_next | self.l2c_can_push) & ~self.halt):
                    m.d.comb += self.l2c_push.eq(insn.push_next)
                    m.next = "IDLE"
        with m.If(~fsm.ongoing("IDLE")):
            m.d.comb += [st.valid.eq(1), st.index.eq(index), st.flags.eq(insn.as_value()[3:7])]
        return m
