"""The whole accelerator: fetch, load, compute, store, their queues, the on-chip buffers,
the AXI4 master (reads arbitrated round-robin between fetch, load and compute; writes from
store) and the AXI4-Lite register file.

Top-level ports (Verilog names, see hw/export.py): ``clk``, ``rst`` (synchronous, active
high), ``m_axi__*`` (AXI4 master, data width 8 * bus_bytes, 64-bit addresses, ID width 1,
INCR bursts) and ``s_axil__*`` (AXI4-Lite slave, 8-bit addresses, 32-bit data).

A start (CONTROL bit 0) resets every engine, queue and counter (ResetInserter) but not the
buffers, so data loaded by one run is still there for the next, as in fsim.
"""

from __future__ import annotations

from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from celosia.config import HwConfig

from .arbiter import ReadArbiter
from .axi import Axi4Signature, AxiLiteSignature
from .cmd_queue import CommandQueue
from .compute import COMPUTE_EVENTS, Compute
from .counters import EventCounters
from .fetch import Fetch
from .gemm import GEMM_PRODUCTS
from .isa import ErrorCode
from .load import LOAD_EVENTS, Load
from .regs import COUNTERS, REG_ADDR_WIDTH, RegisterFile
from .sram import Sram
from .status import ModuleState
from .store import STORE_EVENTS, Store
from .token_queue import TokenQueue

__all__ = ["Accelerator"]

# Cycles the deadlock condition must hold before it is reported (it is stable once true;
# the margin only guards against a one-cycle hand-over being misread).
_DEADLOCK_CYCLES = 4


class Accelerator(wiring.Component):
    def __init__(self, cfg: HwConfig, *, gemm_products: str = "native"):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"cfg must be an HwConfig, not {cfg!r}")
        if gemm_products not in GEMM_PRODUCTS:
            raise ValueError(f"gemm_products must be one of {GEMM_PRODUCTS}, not {gemm_products!r}")
        self.cfg = cfg
        self.gemm_products = gemm_products
        super().__init__({
            "m_axi": Out(Axi4Signature(8 * cfg.bus_bytes)),
            "s_axil": In(AxiLiteSignature(REG_ADDR_WIDTH)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.regs = regs = RegisterFile()
        wiring.connect(m, wiring.flipped(self.s_axil), regs.bus)
        start = regs.start

        def engine(name, elaboratable):
            """Engines restart from a clean state at every start."""
            m.submodules[name] = ResetInserter(start)(elaboratable)
            return elaboratable

        fetch = engine("fetch", Fetch(cfg))
        load = engine("load", Load(cfg))
        compute = engine("compute", Compute(cfg, gemm_products=self.gemm_products))
        store = engine("store", Store(cfg))
        arb = engine("arbiter", ReadArbiter(clients=3, data_width=8 * cfg.bus_bytes))
        counters = engine("counters", EventCounters(COUNTERS))
        queues = {name: engine(f"cmdq_{name}", CommandQueue(depth=cfg.cmd_queue_depth))
                  for name in ("load", "compute", "store")}
        tokens = {name: engine(f"tokens_{name}", TokenQueue(depth=cfg.token_queue_depth))
                  for name in ("l2c", "c2l", "c2s", "s2c")}

        # ---- buffers ----------------------------------------------------------------------
        # writes to UOP, INP, WGT and OUT are read no earlier than a few cycles later (the
        # writer's DONE and PUSH, a token): they go through a register (FPGA timing)
        uop = Sram(depth=cfg.uop_depth, width=32, registered_write=True)
        inp = Sram(depth=cfg.inp_depth, width=8 * cfg.inp_elem_bytes, registered_write=True)
        wgt = Sram(depth=cfg.wgt_depth, width=8 * cfg.wgt_elem_bytes, registered_write=True)
        # compute forwards the rows its ACC reads miss (hw/compute.py): no transparency
        acc = Sram(depth=cfg.acc_depth, width=8 * cfg.acc_elem_bytes, read_ports=2)
        out = Sram(depth=cfg.acc_depth, width=8 * cfg.out_elem_bytes, registered_write=True)
        m.submodules.uop_buf, m.submodules.inp_buf, m.submodules.wgt_buf = uop, inp, wgt
        m.submodules.acc_buf, m.submodules.out_buf = acc, out
        wiring.connect(m, load.inp_w, inp.write)
        wiring.connect(m, load.wgt_w, wgt.write)
        wiring.connect(m, compute.uop_w, uop.write)
        wiring.connect(m, compute.uop_r, uop.read[0])
        wiring.connect(m, compute.acc_w, acc.write)
        wiring.connect(m, compute.acc_r[0], acc.read[0])
        wiring.connect(m, compute.acc_r[1], acc.read[1])
        wiring.connect(m, compute.out_w, out.write)
        wiring.connect(m, compute.inp_r, inp.read[0])
        wiring.connect(m, compute.wgt_r, wgt.read[0])
        wiring.connect(m, store.out_r, out.read[0])

        # ---- command queues ------------------------------------------------------------
        for name, mod in (("load", load), ("compute", compute), ("store", store)):
            q = queues[name]
            w = getattr(fetch, f"{name}_q")
            m.d.comb += [q.w_data.eq(w.w_data), q.w_en.eq(w.w_en), w.w_rdy.eq(q.w_rdy),
                         mod.cmd_data.eq(q.r_data), mod.cmd_rdy.eq(q.r_rdy), q.r_en.eq(mod.cmd_en)]

        # ---- token queues ----------------------------------------------------------------
        l2c, c2l, c2s, s2c = (tokens[n] for n in ("l2c", "c2l", "c2s", "s2c"))
        m.d.comb += [
            l2c.push.eq(load.l2c_push), load.l2c_can_push.eq(l2c.can_push),
            l2c.pop.eq(compute.l2c_pop), compute.l2c_can_pop.eq(l2c.can_pop),
            c2l.push.eq(compute.c2l_push), compute.c2l_can_push.eq(c2l.can_push),
            c2l.pop.eq(load.c2l_pop), load.c2l_can_pop.eq(c2l.can_pop),
            c2s.push.eq(compute.c2s_push), compute.c2s_can_push.eq(c2s.can_push),
            c2s.pop.eq(store.c2s_pop), store.c2s_can_pop.eq(c2s.can_pop),
            s2c.push.eq(store.s2c_push), store.s2c_can_push.eq(s2c.can_push),
            s2c.pop.eq(compute.s2c_pop), compute.s2c_can_pop.eq(s2c.can_pop),
        ]

        # ---- AXI4 master -----------------------------------------------------------------
        wiring.connect(m, fetch.bus, arb.clients[0])
        wiring.connect(m, load.bus, arb.clients[1])
        wiring.connect(m, compute.bus, arb.clients[2])
        axi = self.m_axi
        size = cfg.bus_bytes.bit_length() - 1
        m.d.comb += [
            axi.araddr.eq(arb.bus.araddr), axi.arlen.eq(arb.bus.arlen),
            axi.arvalid.eq(arb.bus.arvalid), arb.bus.arready.eq(axi.arready),
            arb.bus.rdata.eq(axi.rdata), arb.bus.rlast.eq(axi.rlast),
            arb.bus.rvalid.eq(axi.rvalid), axi.rready.eq(arb.bus.rready),
            axi.arsize.eq(size), axi.arburst.eq(1), axi.arcache.eq(0b0011),
            axi.awaddr.eq(store.bus.awaddr), axi.awlen.eq(store.bus.awlen),
            axi.awvalid.eq(store.bus.awvalid), store.bus.awready.eq(axi.awready),
            axi.wdata.eq(store.bus.wdata), axi.wstrb.eq(store.bus.wstrb),
            axi.wlast.eq(store.bus.wlast), axi.wvalid.eq(store.bus.wvalid),
            store.bus.wready.eq(axi.wready),
            store.bus.bvalid.eq(axi.bvalid), axi.bready.eq(store.bus.bready),
            axi.awsize.eq(size), axi.awburst.eq(1), axi.awcache.eq(0b0011),
        ]

        # ---- run control, errors, deadlock ----------------------------------------------
        running = Signal()
        done = Signal()
        err_code = Signal(ErrorCode)
        err_index = Signal(32)
        cycles = Signal(64)
        halt = ~running
        for mod in (load, compute, store, fetch):
            m.d.comb += mod.halt.eq(halt)
        m.d.comb += [fetch.run.eq(running), fetch.insn_addr.eq(regs.insn_addr),
                     fetch.insn_count.eq(regs.insn_count), fetch.dram_size.eq(regs.dram_size)]

        def blocked(status, pops, pushes):
            f = status.flags
            idle = status.state == ModuleState.IDLE
            push = status.state == ModuleState.PUSH
            starve = 0
            for bit, tq in pops:
                starve = starve | (f[bit] & ~tq.can_pop)
            full = 0
            for bit, tq in pushes:
                full = full | (f[bit] & ~tq.can_push)
            return (idle & (~status.valid | starve)) | (push & full)

        # flags bits: 0 pop_prev, 1 pop_next, 2 push_prev, 3 push_next
        load_blocked = blocked(load.status, [(1, c2l)], [(3, l2c)])
        compute_blocked = blocked(compute.status, [(0, l2c), (1, s2c)], [(2, c2l), (3, c2s)])
        store_blocked = blocked(store.status, [(0, c2s)], [(2, s2c)])
        fetch_blocked = fetch.dispatched_all | fetch.stalled
        idle_empty = lambda st: (st.state == ModuleState.IDLE) & ~st.valid  # noqa: E731
        finished = (compute.finished & fetch.dispatched_all & idle_empty(load.status)
                    & idle_empty(store.status))
        stuck = Signal(range(_DEADLOCK_CYCLES + 1))
        with m.If(running & load_blocked & compute_blocked & store_blocked & fetch_blocked
                  & ~finished):
            m.d.sync += stuck.eq(stuck + 1)
        with m.Else():
            m.d.sync += stuck.eq(0)

        errors = [fetch.error, compute.error]
        with m.If(start):
            m.d.sync += [running.eq(1), done.eq(0), err_code.eq(ErrorCode.NONE),
                         err_index.eq(0), cycles.eq(0), stuck.eq(0)]
        with m.Elif(running):
            m.d.sync += cycles.eq(cycles + 1)
            with m.If(finished):
                m.d.sync += [running.eq(0), done.eq(1)]
            with m.If(stuck == _DEADLOCK_CYCLES):
                m.d.sync += [running.eq(0), done.eq(1), err_code.eq(ErrorCode.DEADLOCK),
                             err_index.eq(-1)]
            for e in reversed(errors):  # fetch wins a tie: its instruction is later
                with m.If(e.valid):
                    m.d.sync += [running.eq(0), done.eq(1), err_code.eq(e.code),
                                 err_index.eq(e.index)]

        # ---- registers -------------------------------------------------------------------
        def status_word(st):
            return st.state.as_value() | (st.flags << 2) | (st.valid << 6)

        m.d.comb += [
            regs.running.eq(running), regs.done.eq(done),
            regs.error.eq(err_code != ErrorCode.NONE),
            regs.error_code.eq(err_code), regs.error_index.eq(err_index), regs.cycles.eq(cycles),
            regs.fetch_status.eq(fetch.stalled | (fetch.target << 1)
                                 | (fetch.dispatched_all << 3)),
            regs.fetch_pc.eq(fetch.pc),
            regs.load_status.eq(status_word(load.status)), regs.load_index.eq(load.status.index),
            regs.compute_status.eq(status_word(compute.status)),
            regs.compute_index.eq(compute.status.index),
            regs.store_status.eq(status_word(store.status)),
            regs.store_index.eq(store.status.index),
            regs.tokens_l2c.eq(l2c.count), regs.tokens_c2l.eq(c2l.count),
            regs.tokens_c2s.eq(c2s.count), regs.tokens_s2c.eq(s2c.count),
        ]
        for mod, names in ((load, LOAD_EVENTS), (compute, COMPUTE_EVENTS), (store, STORE_EVENTS)):
            for name in names:
                m.d.comb += getattr(counters, f"ev_{name}").eq(getattr(mod.events, name))
        for name in COUNTERS:
            m.d.comb += getattr(regs, name).eq(getattr(counters, name))
        return m
