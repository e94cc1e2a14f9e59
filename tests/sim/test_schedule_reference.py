"""The cycle model's schedule against its reference (schedule_reference.py: the event loop
as it was before it was made cheaper): on random programs of three configurations (one
with single-entry command and token queues), random programs whose fetch batches cross
burst windows, and programs whose LOADs contend for the read channel beside SHR/MUL
instructions with hazard stalls, every Timeline row, read burst, fetch batch, statistics
sum, statistic and trace is the same, and so is every max_cycles error."""

import random

import numpy as np
import pytest
from programs import ProgramBuilder, random_program
from schedule_reference import ReferenceSchedule

from celosia import HwConfig
from celosia.errors import SimulationLimitError
from celosia.image import ProgramImage
from celosia.isa import (AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop,
                         elem_bytes)
from celosia.sim.cycle import CycleSimulator, _Schedule
from celosia.sim.cycle_report import timeline_stats

DEFAULT, SMALL = HwConfig(), HwConfig.preset("small")
TIGHT = HwConfig(log_batch=1, log_block=3, log_inp_buff_size=12, log_wgt_buff_size=13,
                 log_acc_buff_size=13, log_uop_buff_size=10, cmd_queue_depth=1,
                 token_queue_depth=1)
CONFIGS = {"small": SMALL, "default": DEFAULT, "tight": TIGHT}


def _outcome(make, limit):
    """A schedule's timeline under ``limit``, or its error's type and text."""
    try:
        return make().run(limit)
    except SimulationLimitError as exc:
        return type(exc), str(exc)


def compare(image, cfg, **options) -> dict:
    """Run ``image`` on the cycle model, schedule its program again with the reference, and
    check that both give the same everything; also under max_cycles limits around the run's
    length and its read grants. Returns what the run had (for the coverage checks)."""
    sim = CycleSimulator(cfg, image.dram.size, **options)
    sim.write_dram(0, image.dram)
    stats = sim.run(image.insn_addr, image.insn_count)
    tl = sim.timeline
    args = (tl.insns, tl.static, sim.timing, image.insn_addr, dict(tl.stalls))
    ref = ReferenceSchedule(*args).run(sim.max_cycles)
    assert tl.rows == ref.rows
    assert tl.reads == ref.reads
    assert tl._batches == ref._batches
    assert tl._fetch_reads == ref._fetch_reads
    assert tl.sums == ref.sums
    assert tl.stalls == ref.stalls and tl.plans == ref.plans
    again = sim._counters()
    again.update(timeline_stats(ref, cfg, again))
    assert again == stats and list(again) == list(stats)
    assert np.array_equal(tl.read_bursts(), ref.read_bursts())
    assert tl.trace() == ref.trace()
    ref.sums = None  # the statistics from the timeline alone: the same, in the same order
    again = sim._counters()
    again.update(timeline_stats(ref, cfg, again))
    assert again == stats and list(again) == list(stats)
    cycles = stats["cycles"]
    grants = sorted({g for _, _, _, _, g, *_ in tl.reads})
    for limit in {cycles - 1, cycles, max(1, grants[len(grants) // 2] - 1), grants[-1],
                  max(1, grants[0])}:
        got = _outcome(lambda: _Schedule(*args), limit)
        want = _outcome(lambda: ReferenceSchedule(*args), limit)
        if isinstance(want, tuple):
            assert got == want, limit
        else:
            assert got.rows == want.rows and got.reads == want.reads and got.sums == want.sums
    return {"contended": any(not bulk for client, *_, bulk in tl.reads if client),
            "cmdq_full": any(stats[f"fetch_stall_cmdq_full_{m}_cycles"]
                             for m in ("load", "compute", "store")),
            "room": any(v for k, v in stats.items() if "_stall_push_" in k and v),
            "hazard": stats["compute_stall_hazard_cycles"] > 0,
            "multi_burst_fetch": any(len(batch.span) > 1 for batch in
                                     tl.static.fetch_batches(sim.timing, image.insn_addr))}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_random_programs_schedule_as_the_reference(name):
    cfg = CONFIGS[name]
    seen = set()
    for seed in range(40):
        prog = random_program(cfg, 500 + seed, n_body=10 + seed % 4 * 15)
        try:
            had = compare(prog.image, cfg)
        except AssertionError as exc:
            exc.add_note(f"config {name}, random_program seed {500 + seed}")
            raise
        seen |= {k for k, v in had.items() if v}
    # the programs exercise contention, full command queues and hazard stalls (and the
    # tight configuration, full token queues)
    assert {"contended", "cmdq_full", "hazard"} <= seen
    if name == "tight":
        assert "room" in seen


def _load(mt, sram, dram, x, y=1, stride=None, **flags):
    return MemInsn(opcode=Opcode.LOAD, mem_type=mt, sram_base=sram, dram_base=dram, y_size=y,
                   x_size=x, x_stride=x if stride is None else stride, **flags)


@pytest.mark.parametrize("seed", range(6))
def test_contending_readers_and_hazards_schedule_as_the_reference(seed):
    """Load and compute LOADs of random sizes, pads and strides (wide, narrow, several
    bursts per row) racing fetch for the read channel, between SHR/MUL instructions whose
    hazard stalls depend on their micro-ops, under several DRAM latencies."""
    rng = random.Random(seed)
    cfg = DEFAULT
    b = ProgramBuilder(cfg)
    data = b.data(np.arange(1 << 16, dtype=np.uint8).view(np.int8), 64)
    uops = b.uops([Uop(rng.randrange(4), rng.randrange(4), 0) for _ in range(8)])
    b.emit(_load(MemType.UOP, 0, uops, 8))
    for _ in range(rng.randrange(6, 14)):
        mt = rng.choice([MemType.INP, MemType.WGT, MemType.ACC, MemType.UOP])
        eb = elem_bytes(cfg, mt)
        x = rng.randrange(1, 6) if mt == MemType.WGT else rng.randrange(1, 40)
        y = rng.randrange(1, 4)
        stride = x + rng.randrange(0, 3)
        dram = data // eb + rng.randrange(0, 16)
        pads = {k: rng.randrange(2) for k in ("x_pad_0", "x_pad_1", "y_pad_0", "y_pad_1")}
        if mt in (MemType.UOP, MemType.WGT):
            pads = {}
        sram = 8 if mt == MemType.UOP else 0
        b.emit(_load(mt, sram, dram, x, y, stride, **pads))
        if mt == MemType.ACC or rng.random() < 0.5:  # a compute-side LOAD next to it
            b.emit(_load(MemType.ACC, 0, data // 64, rng.randrange(1, 30)))
        op = rng.choice([AluOp.SHR, AluOp.MUL, AluOp.ADD])
        b.emit(AluInsn(alu_op=op, use_imm=rng.random() < 0.5, imm=1, uop_bgn=0,
                       uop_end=rng.randrange(1, 9), iter_out=rng.randrange(1, 4),
                       iter_in=rng.randrange(1, 4), dst_factor_out=rng.randrange(2),
                       dst_factor_in=rng.randrange(2), src_factor_out=rng.randrange(2),
                       src_factor_in=rng.randrange(2)))
    b.emit(GemmInsn(uop_bgn=0, uop_end=0))
    b.emit(FinishInsn())
    image = b.image()
    had = {}
    for latency in (1, 5, 32):
        for k, v in compare(image, cfg, read_latency=latency, write_latency=latency).items():
            had[k] = had.get(k) or v
    assert had["contended"] and had["hazard"]


def _moved(image: ProgramImage, insn_addr: int) -> ProgramImage:
    """``image`` with its instructions copied to ``insn_addr`` (past its end; a program's
    words do not depend on their address)."""
    end = insn_addr + image.insn_count * 16
    dram = np.zeros(max(end, image.dram.size), np.uint8)
    dram[:image.dram.size] = image.dram
    dram[insn_addr:end] = image.program_bytes
    return ProgramImage(dram, insn_addr, image.insn_count)


@pytest.mark.parametrize("bus", [4, 8, 32])
def test_fetch_batches_across_burst_windows_schedule_as_the_reference(bus):
    """Programs whose fetch batches cross burst windows (several bursts per batch: fetch's
    waits for the arbiter then come from the gaps), and with a 32-byte bus, narrow fetch."""
    cfg = HwConfig(bus_bytes=bus)
    burst = min(4096, 256 * bus)
    seen_multi = False
    for seed in range(8):
        image = random_program(cfg, 900 + seed, n_body=30).image
        base = -(-image.dram.size // burst) * burst
        for offset in (burst - 48, burst - 16, 2 * burst - 112, 0):
            seen_multi |= compare(_moved(image, base + offset), cfg)["multi_burst_fetch"]
    assert seen_multi
