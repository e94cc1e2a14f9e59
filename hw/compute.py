"""The compute module: LOAD of UOP/ACC/ACC_8BIT, GEMM, ALU and FINISH, in program order.

Per instruction: IDLE (start when the head of the command queue has its tokens) -> work
-> PUSH (wait for room, push) -> IDLE; each of IDLE and PUSH takes at least one cycle.

GEMM and ALU run a pipeline of ``exec_stage + 2`` stages, one micro-op per cycle, every
register-to-register path short (two or three adder levels, one multiplier, one buffer
read) so that the core closes timing at 100 MHz on an FPGA (docs/fpga.md). With
T = tree_stages(BLOCK) (hw/gemm.py) and X = exec_stage = 6 + T:

  A (0)   loop counters (i, j, k) address the UOP buffer;
  U (1)   the UOP row is read;
  B (2)   the micro-op word (registered) + loop offsets give the ACC/INP/WGT rows and their
          range checks;
  R (3)   rows registered: INP/WGT read; an out-of-range row raises its error; ALU hazard
          stall (below);
  4, 5    INP/WGT read data registered; GEMM products (registered);
  6..X-1  GEMM adder tree, T stages of two adder levels; ACC read in X-2 (GEMM) or X-3
          (ALU: ACC[dst] and ACC[src]), its data registered a cycle later;
  X-1     ALU stage E (hw/alu.py);
  X       GEMM: ACC[dst] + the sum; ALU: stage X; the result is registered in ``res``;
  W = X+1 ``res`` is written to ACC[dst] and OUT[dst].

Hazards: an ACC read samples the buffer before the writes of the micro-ops up to three
ahead of it; those rows are forwarded from ``res`` and its delayed copy (and, to an ALU
micro-op, from the E register of the micro-op right ahead when it does MIN/MAX/ADD), so GEMM accumulation chains and MIN/MAX/ADD chains run at one micro-op per cycle. A SHR or
MUL result exists only in X, too late for the micro-op right behind it: an ALU micro-op of
a SHR/MUL instruction that reads (dst, or src without an immediate) the row the micro-op
before it writes waits one cycle in R (a bubble). The pipeline drains before the
instruction pushes, so instructions never overlap. A GEMM/ALU with N micro-ops and S such
stalls pushes in t0 + N + S + X + 2 (N >= 1; t0 + 2 for N = 0); sim/cycle_timing.py has the
same rule.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from celosia.config import LOOP_ITER_BITS, HwConfig

from .alu import AluLane
from .axi import ReadClientSignature
from .gemm import GemmCore, tree_stages
from .isa import AluOp, CmdLayout, ErrorCode, InsnLayouts, MemType, Opcode
from .sram import SramReadSignature, SramWriteSignature
from .status import ErrorReport, ModuleState, ModuleStatus
from .tensor_load import TensorLoad

__all__ = ["Compute", "COMPUTE_EVENTS"]

COMPUTE_EVENTS = ("compute_insns", "gemm_insns", "alu_insns", "gemm_uops", "alu_uops",
                  "uop_load_elems", "acc_load_elems", "acc8_load_elems")
_OFF = 32  # loop offsets: 14-bit counts times 16-bit factors stay far below 2^32


def log2_depth(depth: int) -> int:
    """Address bits of a buffer of ``depth`` rows (at least 1)."""
    return max(1, (depth - 1).bit_length())


class Compute(wiring.Component):
    def __init__(self, cfg: HwConfig, *, gemm_products: str = "native"):
        self.cfg = cfg
        self.gemm_products = gemm_products  # GemmCore's ``products`` (same function and timing)
        #: the pipeline stage (A = 0) computing a micro-op's result; it writes in the next
        self.exec_stage = 6 + tree_stages(cfg.block)
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

        # ---- the GEMM/ALU pipeline ---------------------------------------------------------
        # Stages, by the cycle a micro-op is in them (A = 0; see the module docstring):
        R = 3  # rows registered: INP/WGT addressed; errors reported; ALU hazard stall
        X = self.exec_stage  # result computed into `res`
        W = X + 1  # `res` written to ACC and OUT
        acc_bits = log2_depth(cfg.acc_depth)
        two_stage = is_alu & ((alu.alu_op == AluOp.SHR) | (alu.alu_op == AluOp.MUL))
        stall = Signal()  # hold stages A..R one cycle (an ALU hazard at R)
        stall_q = Signal()
        m.d.sync += stall_q.eq(stall)

        # ---- stage A: loop counters (i, j, k) address the UOP buffer -------------------
        k = Signal(cfg.log_uop_depth + 1)
        i = Signal(LOOP_ITER_BITS)
        j = Signal(LOOP_ITER_BITS)
        dst_o, src_o, wgt_o = Signal(_OFF), Signal(_OFF), Signal(_OFF)  # outer offsets
        dst_i, src_i, wgt_i = Signal(_OFF), Signal(_OFF), Signal(_OFF)  # outer + inner
        gen_done = Signal()
        wgt_fo = Mux(is_alu, 0, gemm.wgt_factor_out)
        wgt_fi = Mux(is_alu, 0, gemm.wgt_factor_in)
        src_fo = Mux(is_alu, alu.src_factor_out, gemm.src_factor_out)
        src_fi = Mux(is_alu, alu.src_factor_in, gemm.src_factor_in)
        executing = Signal()
        issue = executing & ~gen_done & ~stall
        # stage U registers: the micro-op whose UOP row is being read
        u_valid, u_k = Signal(), Signal.like(k)
        u_dst, u_src, u_wgt = Signal(_OFF), Signal(_OFF), Signal(_OFF)
        m.d.comb += self.uop_r.addr.eq(Mux(stall, u_k, k))  # a stall reads the row again
        with m.If(~stall):
            m.d.sync += [u_valid.eq(issue), u_k.eq(k),
                         u_dst.eq(dst_i), u_src.eq(src_i), u_wgt.eq(wgt_i)]
        # The end tests are registers, found a step ahead (FPGA timing: a test of a counter
        # against the instruction's bound is a carry chain, and it decides the clock enable
        # of every loop register): k_last says k == uop_end - 1, j_last j == iter_in - 1,
        # i_last i == iter_out - 1. Each is set from an equality of the counter with its
        # bound minus two (registered in IDLE) as the counter steps, or from the value the
        # counter restarts at. The cycles do not change.
        k_last, j_last, i_last = Signal(), Signal(), Signal()
        k_end2 = Signal(cfg.log_uop_depth + 2)  # uop_end - 2 (14-bit field, minus 2)
        j_end2, i_end2 = Signal(LOOP_ITER_BITS + 1), Signal(LOOP_ITER_BITS + 1)
        k_wrap_last = Signal()  # uop_end - uop_bgn == 1: k is last right after a restart
        j_one = Signal()  # iter_in == 1: j is last right after a restart
        with m.If(issue):
            with m.If(~k_last):
                m.d.sync += [k.eq(k + 1), k_last.eq(k == k_end2)]
            with m.Else():
                m.d.sync += [k.eq(gemm.uop_bgn), k_last.eq(k_wrap_last)]
                with m.If(~j_last):
                    m.d.sync += [j.eq(j + 1), j_last.eq(j == j_end2),
                                 dst_i.eq(dst_i + gemm.dst_factor_in),
                                 src_i.eq(src_i + src_fi), wgt_i.eq(wgt_i + wgt_fi)]
                with m.Else():
                    m.d.sync += [j.eq(0), j_last.eq(j_one), i.eq(i + 1),
                                 i_last.eq(i == i_end2),
                                 dst_o.eq(dst_o + gemm.dst_factor_out),
                                 src_o.eq(src_o + src_fo), wgt_o.eq(wgt_o + wgt_fo),
                                 dst_i.eq(dst_o + gemm.dst_factor_out),
                                 src_i.eq(src_o + src_fo), wgt_i.eq(wgt_o + wgt_fo)]
                    with m.If(i_last):
                        m.d.sync += gen_done.eq(1)

        # ---- stage B: the micro-op word (registered) + offsets give the rows -----------
        b_valid = Signal()
        b_uop = Signal(32)
        b_dst, b_src, b_wgt = Signal(_OFF), Signal(_OFF), Signal(_OFF)
        with m.If(~stall):
            m.d.sync += [b_valid.eq(u_valid), b_uop.eq(self.uop_r.data),
                         b_dst.eq(u_dst), b_src.eq(u_src), b_wgt.eq(u_wgt)]
        uop = data.View(lay.uop, b_uop)
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

        # ---- stage R: rows registered; INP/WGT read; errors; ALU hazard ----------------
        r_valid, r_bad, r_hazard = Signal(), Signal(), Signal()
        r_code = Signal(ErrorCode)
        r_dst = Signal(acc_bits)
        r_src = Signal(max(acc_bits, log2_depth(cfg.inp_depth)))
        r_wgt = Signal(log2_depth(cfg.wgt_depth))
        # A two-stage ALU op's result is known one stage after the next micro-op would need
        # it: that micro-op waits a cycle if it reads the row (hw/alu.py).
        hazard = two_stage & r_valid & ((row_dst[:acc_bits] == r_dst) |
                                        (~alu.use_imm & (row_src[:acc_bits] == r_dst)))
        with m.If(~stall):
            m.d.sync += [r_valid.eq(b_valid), r_bad.eq(bad_dst | bad_src | bad_wgt),
                         r_code.eq(Mux(bad_dst, ErrorCode.UOP_DST,
                                       Mux(bad_src, ErrorCode.UOP_SRC, ErrorCode.UOP_WGT))),
                         r_dst.eq(row_dst), r_src.eq(row_src), r_wgt.eq(row_wgt),
                         r_hazard.eq(hazard)]
        m.d.comb += [stall.eq(r_valid & r_hazard & ~stall_q),
                     self.inp_r.addr.eq(r_src), self.wgt_r.addr.eq(r_wgt)]
        with m.If(r_valid & r_bad):
            m.d.comb += [self.error.valid.eq(1), self.error.index.eq(index),
                         self.error.code.eq(r_code)]

        # ---- stages after R: no stalls, so rows and valid bits simply shift ------------
        valid = {R: r_valid & ~r_bad & ~stall & ~self.halt}
        dst = {R: r_dst}
        src = {R: r_src[:acc_bits]}
        for s in range(R + 1, W + 1):
            valid[s], dst[s] = Signal(name=f"valid_{s}"), Signal(acc_bits, name=f"dst_{s}")
            m.d.sync += [valid[s].eq(valid[s - 1]), dst[s].eq(dst[s - 1])]
            if s <= X - 2:
                src[s] = Signal(acc_bits, name=f"src_{s}")
                m.d.sync += src[s].eq(src[s - 1])
        in_flight = Signal()
        m.d.comb += in_flight.eq(Cat(u_valid, b_valid, r_valid,
                                     *(valid[s] for s in range(R + 1, W))).any())

        # ---- buffer reads: INP/WGT in R, ACC in X-2 (GEMM) or X-3 (ALU), all registered --
        acc_addr = Mux(is_alu, dst[X - 3], dst[X - 2]), src[X - 3]
        m.d.comb += [self.acc_r[0].addr.eq(acc_addr[0]), self.acc_r[1].addr.eq(acc_addr[1])]
        # (the datapath's registers have no reset: valid bits, reset by start, say when a
        # stage holds a micro-op; hw/gemm.py)
        inp_q = Signal.like(self.inp_r.data, reset_less=True)
        wgt_q = Signal.like(self.wgt_r.data, reset_less=True)
        operands = [inp_q.eq(self.inp_r.data), wgt_q.eq(self.wgt_r.data)]
        # the simulation form of the GEMM core ("wide") computes a stage only when it holds
        # a GEMM micro-op's operands (its ``en``), so its operands need registering only
        # then (same sums whenever they are used; hw/gemm.py)
        gemm_op = ~is_alu & ~gemm.reset  # a GEMM micro-op that adds a sum
        if self.gemm_products == "wide":
            with m.If(valid[R + 1] & gemm_op):
                m.d.sync += operands
        else:
            m.d.sync += operands

        # ---- forwarding: rows written after the ACC read sampled them ------------------
        # `res` is the row being written (W), res_1 the row written the cycle before. An ACC
        # read samples the buffer before the writes of the three micro-ops ahead of its own
        # (non-transparent ports). Two of them are written by the cycle its data leaves the
        # buffer and are merged in from res/res_1 as the data is registered (acc_q, src_q);
        # the third is in `res` when the micro-op uses the data (and for an ALU micro-op the
        # micro-op right ahead is one closer still: its MIN/MAX/ADD result is `early`).
        # Every hit is found a cycle ahead and registered, so each use is a short mux.
        res, res_1 = Signal(lanes * 32, reset_less=True), Signal(lanes * 32, reset_less=True)
        m.d.sync += res_1.eq(res)

        def hit(row, s, name, when=1):
            """Registered: the valid micro-op in stage ``s`` writes ``row`` (and ``when``)."""
            h = Signal(name=f"hit_{name}_{s}")
            m.d.sync += h.eq(valid[s] & (dst[s] == row) & when)
            return h

        def lanes_of(value):
            return [value.word_select(lane, 32) for lane in range(lanes)]

        # data read in cycle c leaves the buffer in c + 1, when the micro-ops now in X and W
        # are in W (res) and W+1 (res_1)
        # (an ALU with an immediate takes it in place of ACC[src], and forwards nothing there)
        acc_q, src_q = Signal(lanes * 32, reset_less=True), Signal(lanes * 32, reset_less=True)
        imm = Signal(signed(32))
        m.d.comb += imm.eq(alu.imm)
        # The block RAM's data is late (an ECP5 DP16KD without its output register: over 4 ns
        # clock to out) and may come from across the chip: it passes one LUT (take it, or
        # take `other`), and `other` (a forwarded row or the immediate) and the choice are
        # made from registers beside it, kept as their own nets (`keep`) so that synthesis
        # does not fold them into the RAM data's path (FPGA timing; same function).
        for port, reg, name, when in ((0, acc_q, "acc", 1), (1, src_q, "src", ~alu.use_imm)):
            near = hit(acc_addr[port], X, name, when)
            far = hit(acc_addr[port], W, name, when)
            take_ram = Signal(name=f"{name}_take_ram", attrs={"keep": 1})
            other = Signal(lanes * 32, name=f"{name}_other", attrs={"keep": 1})
            m.d.comb += take_ram.eq(~near & ~far & (1 if port == 0 else ~alu.use_imm))
            for lane, (raw, a, b) in enumerate(zip(*map(lanes_of, (self.acc_r[port].data, res,
                                                                     res_1)))):
                last = imm if port == 1 else b
                m.d.comb += other.word_select(lane, 32).eq(Mux(near, a, Mux(far, b, last)))
                m.d.sync += reg.word_select(lane, 32).eq(Mux(take_ram, raw,
                                                             other.word_select(lane, 32)))

        # ---- stage X-1 (ALU stage E) and X: compute; W: write -------------------------
        m.submodules.gemm = core = GemmCore(cfg, products=self.gemm_products)
        assert core.latency == X - (R + 2), "GemmCore latency and compute stages disagree"
        m.d.comb += [core.inp.eq(inp_q), core.wgt.eq(wgt_q)]
        if self.gemm_products == "wide":
            m.d.comb += core.en.eq(valid[R + 2] & gemm_op)
        gemm_hit = hit(dst[X - 1], X, "gemm")  # in W when the micro-op is in X
        alu_hits = {name: (hit(row, X - 1, name, when), hit(row, X, name, when))  # X, W at E
                    for name, row, when in (("x", dst[X - 2], 1),
                                            ("y", src[X - 2], ~alu.use_imm))}
        result = Signal(lanes * 32)
        for lane, (written, acc_in, src_in) in enumerate(zip(*map(lanes_of, (res, acc_q,
                                                                            src_q)))):
            unit = AluLane()
            m.submodules[f"alu{lane}"] = unit
            x_near, x_far = alu_hits["x"]
            y_near, y_far = alu_hits["y"]
            m.d.comb += [
                unit.op.eq(alu.alu_op),
                unit.x.eq(Mux(x_near, unit.early, Mux(x_far, written, acc_in))),
                unit.y.eq(Mux(y_near, unit.early, Mux(y_far, written, src_in))),
            ]
            acc_now = Mux(gemm_hit, written, acc_in).as_signed()
            total = core.sum.word_select(lane, 32).as_signed()
            gemm_value = Mux(gemm.reset, 0, acc_now + total)
            m.d.comb += result.word_select(lane, 32).eq(Mux(is_alu, unit.result, gemm_value))
        m.d.sync += res.eq(result)
        with m.If(valid[W] & ~loading):
            m.d.comb += [
                self.acc_w.en.eq(1), self.acc_w.addr.eq(dst[W]), self.acc_w.data.eq(res),
                self.out_w.en.eq(1), self.out_w.addr.eq(dst[W]),
                self.out_w.data.eq(Cat(*(res.word_select(x, 32)[:8] for x in range(lanes)))),
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
                # the head is copied in every IDLE cycle (the copy in the start cycle is the
                # one kept): these registers load on the state, not on the start decision,
                # whose fanout would otherwise lengthen the path from the queue to the tokens
                m.d.sync += [insn.eq(self.cmd_data.insn), index.eq(self.cmd_data.index),
                             is_alu.eq(head.opcode == Opcode.ALU),
                             k.eq(head.uop_bgn), i.eq(0), j.eq(0),
                             k_end2.eq(head.uop_end - 2), j_end2.eq(head.iter_in - 2),
                             i_end2.eq(head.iter_out - 2),
                             k_last.eq(head.uop_end - head.uop_bgn == 1),
                             k_wrap_last.eq(head.uop_end - head.uop_bgn == 1),
                             j_one.eq(head.iter_in == 1), j_last.eq(head.iter_in == 1),
                             i_last.eq(head.iter_out == 1),
                             dst_o.eq(0), src_o.eq(0), wgt_o.eq(0),
                             dst_i.eq(0), src_i.eq(0), wgt_i.eq(0),
                             gen_done.eq((head.uop_bgn == head.uop_end) |
                                         (head.iter_out == 0) | (head.iter_in == 0))]
                with m.If(self.cmd_rdy & pops_ok & ~self.halt):
                    m.d.comb += [self.cmd_en.eq(1), self.l2c_pop.eq(head.pop_prev),
                                 self.s2c_pop.eq(head.pop_next), ev.compute_insns.eq(1)]
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
                with m.If(gen_done & ~in_flight):
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
