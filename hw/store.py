"""The store module: STORE of OUT, in program order, under the token protocol.

Per instruction: IDLE (start when the head has its compute->store token, if pop_prev) ->
STORE (hand it to the TensorStore engine) -> STORE_WAIT -> PUSH (wait for room in
store->compute, if push_prev) -> IDLE.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from celosia.config import HwConfig

from .axi import WriteClientSignature
from .isa import CmdLayout, InsnLayouts
from .sram import SramReadSignature
from .status import ModuleState, ModuleStatus
from .tensor_store import TensorStore

__all__ = ["Store", "STORE_EVENTS"]

STORE_EVENTS = ("store_insns", "out_store_elems")


class Store(wiring.Component):
    def __init__(self, cfg: HwConfig):
        self.cfg = cfg
        super().__init__({
            "cmd_data": In(CmdLayout()), "cmd_rdy": In(1), "cmd_en": Out(1),
            "c2s_can_pop": In(1), "c2s_pop": Out(1),
            "s2c_can_push": In(1), "s2c_push": Out(1),
            "halt": In(1),
            "bus": Out(WriteClientSignature(8 * cfg.bus_bytes)),
            "out_r": Out(SramReadSignature(cfg.acc_depth, 8 * cfg.out_elem_bytes)),
            "status": Out(ModuleStatus),
            "events": Out(data.StructLayout({name: 1 for name in STORE_EVENTS})),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = InsnLayouts(cfg)
        insn = Signal(lay.mem)
        index = Signal.like(self.cmd_data.index)
        head = data.View(lay.mem, self.cmd_data.insn)

        m.submodules.engine = eng = TensorStore(
            elem_bytes=cfg.out_elem_bytes, bus_bytes=cfg.bus_bytes, sram_depth=cfg.acc_depth)
        wiring.connect(m, wiring.flipped(self.bus), eng.bus)
        m.d.comb += [
            self.out_r.addr.eq(eng.r_addr), eng.r_data.eq(self.out_r.data),
            eng.cmd.sram_base.eq(insn.sram_base), eng.cmd.dram_base.eq(insn.dram_base),
            eng.cmd.y_size.eq(insn.y_size), eng.cmd.x_size.eq(insn.x_size),
            eng.cmd.x_stride.eq(insn.x_stride),
            self.events.out_store_elems.eq(eng.elems),
        ]
        st = self.status
        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += [st.state.eq(ModuleState.IDLE), st.valid.eq(self.cmd_rdy),
                             st.index.eq(self.cmd_data.index), st.flags.eq(self.cmd_data.insn[3:7])]
                # the head is copied in every IDLE cycle (the copy in the start cycle is the
                # one kept): its registers load on the state, not on the start decision, whose
                # fanout would otherwise lengthen the path from the queue to the tokens
                m.d.sync += [insn.eq(self.cmd_data.insn), index.eq(self.cmd_data.index)]
                with m.If(self.cmd_rdy & (~head.pop_prev | self.c2s_can_pop) & ~self.halt):
                    m.d.comb += [self.cmd_en.eq(1), self.c2s_pop.eq(head.pop_prev),
                                 self.events.store_insns.eq(1)]
                    m.next = "STORE"
            with m.State("STORE"):
                m.d.comb += [eng.cmd.valid.eq(1), st.state.eq(ModuleState.BUSY)]
                m.next = "STORE_WAIT"
            with m.State("STORE_WAIT"):
                m.d.comb += st.state.eq(ModuleState.BUSY)
                with m.If(eng.done):
                    m.next = "PUSH"
            with m.State("PUSH"):
                m.d.comb += st.state.eq(ModuleState.PUSH)
                with m.If((~insn.push_prev | self.s2c_can_push) & ~self.halt):
                    m.d.comb += self.s2c_push.eq(insn.push_prev)
                    m.next = "IDLE"
        with m.If(~fsm.ongoing("IDLE")):
            m.d.comb += [st.valid.eq(1), st.index.eq(index), st.flags.eq(insn.as_value()[3:7])]
        return m
