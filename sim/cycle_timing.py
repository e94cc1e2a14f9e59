"""Every timing rule of the cycle model, as closed forms (docs/cycle_model.md).

The cycle model (:mod:`celosia.sim.cycle`) schedules instructions on fetch, load, compute,
store and the DRAM port; it takes every duration and latency from a :class:`Timing`. This
file is therefore the one place to change when the model and the RTL disagree: each rule is
one method or one constant with its own docstring, and none of them looks at values other
than an instruction's fields and, for GEMM/ALU, its micro-ops.

Conventions: time is in cycles from the start of the run (cycle 0). An instruction started
at cycle ``s`` with duration ``d`` is complete at cycle ``s + d``; a DRAM read requested at
cycle ``r`` gets its first beat in cycle ``max(r + dram_latency, read channel free)`` and one
beat per cycle after that, its data usable the cycle after each beat.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError
from celosia.isa import (
    INSN_BYTES, AluInsn, FinishInsn, GemmInsn, Insn, MemInsn, Opcode, decode_uops,
)

from .datapath import Datapath

__all__ = ["Timing", "Plan", "FIXED", "READ", "WRITE"]

# GEMM/ALU instructions with at most this many micro-op executions get their hazards from one
# array; longer ones in the datapath's chunks.
_DIRECT = 1 << 16
# How an instruction uses the DRAM port: not at all, one read transfer, one write transfer.
FIXED, READ, WRITE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Plan:
    """The timing of one instruction apart from waits for tokens, queues and the bus.

    FIXED: busy ``issue + work`` cycles. READ: ``issue`` cycles, then a read of ``beats``
    beats (latency and bus waits come from the schedule), then ``work`` cycles (padding).
    WRITE: ``issue`` cycles, ``beats`` write beats, then ``work`` cycles (write response).
    ``stall`` is the part of ``work`` that is hazard stalls (GEMM/ALU), reported apart.
    """

    kind: int
    issue: int
    beats: int = 0
    work: int = 0
    stall: int = 0

    def min_cycles(self, dram_latency: int) -> int:
        """A lower bound of the instruction's duration (no bus contention)."""
        return self.issue + self.beats + self.work + (dram_latency if self.kind == READ else 0)


@dataclass(frozen=True, kw_only=True)
class Timing:
    """The timing parameters of one configuration and the closed forms built on them."""

    #: DRAM bus width, bytes per beat (one beat per cycle on each AXI channel)
    bus_bytes: int
    #: cycles from a read request to its first data beat; also from the last write beat to
    #: the write response that completes a STORE
    dram_latency: int
    cmd_queue_depth: int
    token_queue_depth: int
    #: instructions fetch reads in one DRAM burst (it requests the next burst once it has
    #: dispatched every instruction of the previous one)
    fetch_burst_insns: int = 16
    #: cycles a module spends taking an instruction (decode, address set-up) before its work
    issue_cycles: int = 1
    #: cycles from fetch dispatching an instruction to its module seeing it
    dispatch_latency: int = 1
    #: cycles from a module starting an instruction to fetch seeing the freed command slot
    cmd_slot_latency: int = 1
    #: cycles from a push (pop) to the other module seeing the token (the freed room)
    token_latency: int = 1
    #: cycles between issuing two GEMM micro-ops; cycles from issue to the ACC write
    gemm_ii: int = 1
    gemm_depth: int = 4
    #: the same for ALU micro-ops
    alu_ii: int = 1
    alu_depth: int = 3
    #: zero padding elements a LOAD writes per cycle (after its data)
    pad_elems_per_cycle: int = 1

    def __post_init__(self):
        for name in ("fetch_burst_insns", "issue_cycles", "dispatch_latency", "cmd_slot_latency",
                     "token_latency", "gemm_ii", "alu_ii", "pad_elems_per_cycle"):
            if getattr(self, name) < 1:
                # Latencies of at least one cycle between units are what lets the scheduler
                # grant the DRAM port in request order (see cycle.py, _Schedule).
                raise CelosiaError(f"Timing.{name} must be at least 1, not {getattr(self, name)}")

    @classmethod
    def from_config(cls, cfg: HwConfig, **overrides) -> "Timing":
        return cls(bus_bytes=cfg.bus_bytes, dram_latency=cfg.dram_latency,
                   cmd_queue_depth=cfg.cmd_queue_depth, token_queue_depth=cfg.token_queue_depth,
                   **overrides)

    # ---- DRAM transfers ----------------------------------------------------------------

    def beats(self, byte_addr: int, nbytes: int) -> int:
        """Bus beats of one contiguous transfer: every bus word it touches, aligned."""
        if nbytes <= 0:
            return 0
        bus = self.bus_bytes
        return (byte_addr % bus + nbytes + bus - 1) // bus

    def rows_beats(self, base: int, stride: int, row_bytes: int, rows: int) -> int:
        """Beats of ``rows`` transfers of ``row_bytes`` at byte ``base + r * stride``; each row
        is its own burst (a row never shares a beat with the next)."""
        if rows <= 0 or row_bytes <= 0:
            return 0
        bus = self.bus_bytes
        if stride % bus == 0:
            return rows * self.beats(base, row_bytes)
        offsets = (base + stride * np.arange(rows, dtype=np.int64)) % bus
        return int(((offsets + row_bytes + bus - 1) // bus).sum())

    def fetch_beats(self, insn_addr: int, first: int, count: int) -> int:
        """Beats of the burst that reads instructions [first, first + count)."""
        return self.beats(insn_addr + first * INSN_BYTES, count * INSN_BYTES)

    def fetch_arrival(self, insn_addr: int, first: int, k: int) -> int:
        """Cycles after a fetch burst's first beat at which its k-th instruction is usable."""
        start = insn_addr + first * INSN_BYTES
        return self.beats(start, (k + 1) * INSN_BYTES)

    # ---- per-instruction plans ---------------------------------------------------------

    def mem_plan(self, insn: MemInsn, elem_bytes: int) -> Plan:
        """LOAD: issue, read every row of data (one burst per row), write the padding.
        STORE: issue, write every row, wait for the write response. x_size = 0 is issue only.
        ``elem_bytes`` is the size of one element of the instruction's memory type."""
        if insn.x_size == 0:
            return Plan(FIXED, self.issue_cycles)
        eb = elem_bytes
        beats = self.rows_beats(insn.dram_base * eb, insn.x_stride * eb, insn.x_size * eb,
                                insn.y_size)
        if insn.opcode == Opcode.STORE:
            if beats == 0:
                return Plan(FIXED, self.issue_cycles)
            return Plan(WRITE, self.issue_cycles, beats, self.dram_latency)
        total = ((insn.y_pad_0 + insn.y_size + insn.y_pad_1)
                 * (insn.x_pad_0 + insn.x_size + insn.x_pad_1))
        pad = total - insn.y_size * insn.x_size
        pad_cycles = -(-pad // self.pad_elems_per_cycle)
        if beats == 0:
            return Plan(FIXED, self.issue_cycles, 0, pad_cycles)
        return Plan(READ, self.issue_cycles, beats, pad_cycles)

    def loop_plan(self, insn, datapath: Datapath) -> Plan:
        """GEMM/ALU: issue, one micro-op every ``ii`` cycles plus hazard stalls, then the
        pipeline drains (``depth`` cycles). Reads the micro-ops from the UOP buffer as they
        are when the instruction executes."""
        n = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        if n == 0:
            return Plan(FIXED, self.issue_cycles)
        gemm = isinstance(insn, GemmInsn)
        ii, depth = (self.gemm_ii, self.gemm_depth) if gemm else (self.alu_ii, self.alu_depth)
        stall = 0
        if not (gemm and insn.reset):
            stall = self.hazard_stalls(insn, datapath)
        return Plan(FIXED, self.issue_cycles, 0, n * ii + stall + depth, stall)

    def loop_min_cycles(self, insn) -> int:
        """GEMM/ALU duration without hazard stalls (checked against the cycle limit before
        the datapath runs the instruction)."""
        n = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        if n == 0:
            return self.issue_cycles
        if isinstance(insn, GemmInsn):
            return self.issue_cycles + n * self.gemm_ii + self.gemm_depth
        return self.issue_cycles + n * self.alu_ii + self.alu_depth

    def plan(self, insn: Insn, cfg: HwConfig, datapath: Datapath) -> Plan:
        """The plan of any instruction (GEMM/ALU: with the UOP buffer as it is now)."""
        if isinstance(insn, MemInsn):
            return self.mem_plan(insn, cfg.elem_bytes(insn.mem_type))
        if isinstance(insn, (GemmInsn, AluInsn)):
            return self.loop_plan(insn, datapath)
        assert isinstance(insn, FinishInsn)
        return Plan(FIXED, self.issue_cycles)

    # ---- read-after-write hazards of the GEMM/ALU pipeline -----------------------------

    def hazard_stalls(self, insn, datapath: Datapath) -> int:
        """Stall cycles of one GEMM/ALU instruction.

        Micro-op executions issue in loop order (i, j, k). Execution e reads ACC rows (GEMM:
        its dst; ALU: its dst and, without use_imm, its src) and writes its dst row
        ``depth`` cycles after it issues. If the nearest earlier execution of the same
        instruction that writes a row e reads is d executions before it, and d * ii < depth,
        e is held for ``depth - d * ii`` extra cycles. The distance d counts executions in
        program order, not cycles, so stalls never depend on earlier stalls (a closed form;
        the RTL keeps the dst rows of the last executions in a shift register that moves
        only when an execution issues). The pipeline is empty when an instruction starts.
        """
        gemm = isinstance(insn, GemmInsn)
        ii, depth = (self.gemm_ii, self.gemm_depth) if gemm else (self.alu_ii, self.alu_depth)
        window = -(-depth // ii) - 1  # distances d with d * ii < depth
        if window <= 0:
            return 0
        fields = decode_uops(datapath.uop[insn.uop_bgn:insn.uop_end], datapath.cfg)
        dst0, src0 = fields[0], fields[1]
        if gemm and dst0.size >= window:
            return _gemm_stalls_by_blocks(insn, dst0, window, depth, ii)
        use_src = not gemm and not insn.use_imm
        if insn.iter_out * insn.iter_in * dst0.size <= _DIRECT:  # one array, no chunks
            i = np.arange(insn.iter_out, dtype=np.int64)[:, None, None]
            j = np.arange(insn.iter_in, dtype=np.int64)[None, :, None]
            dst = (dst0 + i * insn.dst_factor_out + j * insn.dst_factor_in).reshape(-1)
            reads = [dst]
            if use_src:
                reads.append((src0 + i * insn.src_factor_out + j * insn.src_factor_in).reshape(-1))
            return int(_stall_array(reads, dst, window, depth, ii).sum())
        total = 0
        tail_w = tail_s = np.empty(0, np.int64)
        for dst, src, _ in Datapath._chunks(insn, *fields):
            lead = tail_w.size
            w = np.concatenate((tail_w, dst))
            reads = [w] if not use_src else [w, np.concatenate((tail_s, src))]
            total += int(_stall_array(reads, w, window, depth, ii)[lead:].sum())
            tail_w = w[-window:]
            if use_src:
                tail_s = reads[1][-window:]
        return total


def _stall_array(reads: list[np.ndarray], writes: np.ndarray, window: int, depth: int,
                 ii: int) -> np.ndarray:
    """Per execution, the stall cycles the hazard rule gives (see Timing.hazard_stalls)."""
    n = writes.size
    stall = np.zeros(n, np.int64)
    found = np.zeros(n, bool)
    for d in range(1, min(window, n - 1) + 1):
        hit = reads[0][d:] == writes[:-d]
        for r in reads[1:]:
            hit |= r[d:] == writes[:-d]
        new = hit & ~found[d:]
        stall[d:][new] = depth - d * ii
        found[d:] |= hit
    return stall


def _gemm_stalls_by_blocks(insn: GemmInsn, dst0: np.ndarray, window: int, depth: int,
                           ii: int) -> int:
    """Hazard stalls of a GEMM from its micro-ops alone, when there are at least ``window``
    of them: every (i, j) block adds the same offset to all dst rows, so stalls inside a
    block are the same in every block, and only the first ``window`` executions of a block
    can also hit the end of the previous block, whose offset differs by dst_factor_in (next
    j) or dst_factor_out - (iter_in - 1) * dst_factor_in (next i)."""
    within = _stall_array([dst0], dst0, window, depth, ii)
    blocks = insn.iter_out * insn.iter_in
    total = blocks * int(within.sum())
    head = int(within[:window].sum())
    steps = ((insn.dst_factor_in, insn.iter_out * (insn.iter_in - 1)),
             (insn.dst_factor_out - (insn.iter_in - 1) * insn.dst_factor_in, insn.iter_out - 1))
    for delta, count in steps:
        if count:
            seq = np.concatenate((dst0[-window:], dst0[:window] + delta))
            edge = _stall_array([seq], seq, window, depth, ii)[window:]
            total += count * (int(edge.sum()) - head)
    return total
