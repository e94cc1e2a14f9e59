"""The cycle model (sim/cycle.py): fsim's values, the closed forms of docs/cycle_model.md, the
schedule's rules checked naively on its timeline, limits, statistics and the trace.
(Agreement with the RTL, cycle for cycle, is tests/hw/test_cycle_vs_rtl.py.)"""

import dataclasses
import json

import numpy as np
import pytest
from programs import ProgramBuilder, random_program

from celosia import HwConfig
from celosia.errors import CelosiaError, DeadlockError, ProgramError, SimulationLimitError
from celosia.isa import (
    AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop, elem_bytes, module_of,
)
from celosia.sim.base import run_image
from celosia.sim.cycle import CycleSimulator, Timing, plot_timeline
from celosia.sim.cycle_timing import ReadPlan
from celosia.sim.fsim import TOKEN_QUEUES, pops_of, pushes_of

DEFAULT, SMALL = HwConfig(), HwConfig.preset("small")
MODULES = ("load", "compute", "store")


def load(mt, sram, dram, x, y=1, stride=None, **kw):
    return MemInsn(opcode=Opcode.LOAD, mem_type=mt, sram_base=sram, dram_base=dram, y_size=y,
                   x_size=x, x_stride=x if stride is None else stride, **kw)


def store(sram, dram, x, y=1, **kw):
    return MemInsn(opcode=Opcode.STORE, mem_type=MemType.OUT, sram_base=sram, dram_base=dram,
                   y_size=y, x_size=x, x_stride=x, **kw)


def run_cycle(image, cfg=DEFAULT, **options):
    sim = CycleSimulator(cfg, image.dram.size, **options)
    sim.write_dram(0, image.dram)
    stats = sim.run(image.insn_addr, image.insn_count)
    return sim, stats


def both(image, cfg=DEFAULT):
    """Run on fsim and on the cycle model; the DRAM and fsim's counters must agree."""
    ref, ref_stats = run_image(image, "fsim", cfg)
    sim, stats = run_cycle(image, cfg)
    assert np.array_equal(sim.read_dram(0, image.dram.size), ref)
    assert {k: stats[k] for k in ref_stats} == ref_stats
    return sim, stats


def gemm_program(cfg=DEFAULT, m=4, tiles=2):
    """A small GEMM with a shift epilogue (the shape of /tmp/smoke.py), race-free."""
    rng = np.random.default_rng(1)
    b = ProgramBuilder(cfg)
    blk = cfg.block
    k_blocks, n_blocks = 2, 2
    a = rng.integers(-128, 128, (m, k_blocks * blk), dtype=np.int8)
    w = rng.integers(-128, 128, (n_blocks * blk, k_blocks * blk), dtype=np.int8)
    inp = b.data(a, cfg.inp_elem_bytes) // cfg.inp_elem_bytes
    wb = w.reshape(n_blocks, blk, k_blocks, blk).transpose(0, 2, 1, 3)
    wgt = b.data(np.ascontiguousarray(wb), cfg.wgt_elem_bytes) // cfg.wgt_elem_bytes
    uops = [Uop(no, ko, no * k_blocks + ko) for no in range(n_blocks) for ko in range(k_blocks)]
    ng = len(uops)
    uops += [Uop(no, 0) for no in range(n_blocks)]
    uop = b.uops(uops)
    out = b.alloc(m * n_blocks * cfg.out_elem_bytes) // cfg.out_elem_bytes
    b.emit(load(MemType.UOP, 0, uop, len(uops)))
    b.emit(GemmInsn(reset=True, uop_bgn=0, uop_end=ng, iter_out=m, dst_factor_out=n_blocks))
    b.emit(load(MemType.INP, 0, inp, m * k_blocks))
    b.emit(load(MemType.WGT, 0, wgt, n_blocks * k_blocks, push_next=True))
    b.emit(GemmInsn(uop_bgn=0, uop_end=ng, iter_out=m, dst_factor_out=n_blocks,
                    src_factor_out=k_blocks, pop_prev=True))
    b.emit(AluInsn(alu_op=AluOp.SHR, use_imm=True, imm=3, uop_bgn=ng, uop_end=len(uops),
                   iter_out=m, dst_factor_out=n_blocks, push_next=True))
    b.emit(store(0, out, m * n_blocks, pop_prev=True, push_prev=True))
    b.emit(FinishInsn(pop_next=True))
    return b.image()


# ---- values: identical to fsim ----------------------------------------------------------------


def test_hand_built_program_matches_fsim():
    sim, stats = both(gemm_program())
    assert stats["cycles"] > 0 and stats["gemm_uops"] == 16


@pytest.mark.parametrize("cfg", [DEFAULT, SMALL], ids=["default", "small"])
def test_random_programs_match_fsim(cfg):
    for seed in range(30):
        prog = random_program(cfg, seed)
        sim, stats = both(prog.image, cfg)
        check_schedule_rules(sim.timeline, cfg)
        check_stat_sums(stats)


def test_racy_program_values_follow_fsim():
    """A GEMM that does not wait for its WGT load: time lets it run first, values do not."""
    cfg = DEFAULT
    b = ProgramBuilder(cfg)
    wgt = b.data(np.ones(cfg.wgt_elem_bytes, np.int8), cfg.wgt_elem_bytes) // cfg.wgt_elem_bytes
    inp = b.data(np.ones(cfg.inp_elem_bytes, np.int8), 16) // 16
    uop = b.uops([Uop(0, 0, 0)])
    out = b.alloc(16) // 16
    b.emit(load(MemType.UOP, 0, uop, 1))
    b.emit(load(MemType.INP, 0, inp, 1, push_next=True))
    b.emit(load(MemType.WGT, 0, wgt, 1))
    b.emit(GemmInsn(uop_bgn=0, uop_end=1, pop_prev=True, push_next=True))
    b.emit(store(0, out, 1, pop_prev=True, push_prev=True))
    b.emit(FinishInsn(pop_next=True))
    sim, _ = both(b.image())
    tl = sim.timeline
    assert tl.start[3] < tl.done[2]  # in time, the GEMM started before the WGT arrived


# ---- closed forms ------------------------------------------------------------------------------


def single_load_image(cfg, mt, x, y=1, stride=None, **pads):
    b = ProgramBuilder(cfg)
    eb = elem_bytes(cfg, mt)
    base = b.data(np.arange(eb * (x + 4) * y, dtype=np.int64).astype(np.uint8), eb) // eb
    b.emit(load(mt, 0, base, x, y, stride, **pads))
    b.emit(FinishInsn())
    return b.image()


@pytest.mark.parametrize("mt,x", [(MemType.INP, 1), (MemType.INP, 37), (MemType.WGT, 3),
                                  (MemType.ACC, 5), (MemType.UOP, 7)])
def test_single_load_closed_form(mt, x):
    """A lone LOAD (one burst): from its start to its push, 2 cycles to reach the walker,
    the request, grant, AR and latency (L + 2), the beats (narrow elements: one per cycle),
    the last element's write, the end of the walk, DONE and PUSH."""
    cfg = DEFAULT
    image = single_load_image(cfg, mt, x)
    sim, stats = both(image)
    t, tl = sim.timing, sim.timeline
    L, eb = t.read_latency, elem_bytes(cfg, mt)
    beats = -(-x * eb // cfg.bus_bytes)
    per_elem = x if eb < cfg.bus_bytes else beats
    assert tl.push[0] - tl.start[0] == per_elem + L + 7
    # fetch: batch requested in cycle 2, granted in 3, first beat 4 + L; instruction 0 is
    # readable after its 16 / bus beats + 1 and the check stages, dispatched then; its module
    # starts a cycle later.
    assert tl.dispatch[0] == L + 5 + 16 // cfg.bus_bytes + t.check_stages
    assert tl.start[0] == tl.dispatch[0] + 1
    on_compute = mt not in (MemType.INP, MemType.WGT)  # then FINISH runs after it
    assert stats["cycles"] == tl.push[0] + 1 + (2 if on_compute else 0)
    assert stats["load_stall_dram_cycles" if mt in (MemType.INP, MemType.WGT)
                 else "compute_stall_dram_cycles"] == L + 1


def test_load_padding_and_strided_rows():
    """Each data row costs its x pads, the request-to-last-element time and one cycle;
    padding rows one cycle per element."""
    cfg = DEFAULT
    image = single_load_image(cfg, MemType.INP, 3, y=4, stride=5, y_pad_0=1, x_pad_1=2)
    sim, _ = both(image)
    t, tl = sim.timing, sim.timeline
    W = 3 + 2
    row = t.read_latency + 3 + 3 * 16 // cfg.bus_bytes + 2
    assert tl.push[0] - tl.start[0] == 2 + W + 4 * row + 2


def test_unaligned_rows_count_every_touched_beat():
    t = Timing.from_config(DEFAULT)
    insn = load(MemType.UOP, 0, 1, 1, y=3, stride=3)  # rows at bytes 4, 16, 28
    assert t.load_plan(insn, 4).beats == 3
    insn = load(MemType.UOP, 0, 1, 2, y=3, stride=3)  # bytes 4-12, 16-24, 28-36
    assert t.load_plan(insn, 4).beats == 2 + 1 + 2
    # a WGT row of 9 elements (2304 bytes) crosses the 2048-byte burst boundary
    plan = t.load_plan(load(MemType.WGT, 0, 0, 9), 256)
    assert isinstance(plan, ReadPlan) and plan.n == 2 and plan.burst_beats == [256, 32]


def test_load_plans_row_by_row_and_vectorised_agree():
    """Timing.load_plan and store_plan have a per-row Python path (few rows) and a numpy path
    (many rows)."""
    import random

    import celosia.sim.cycle_timing as ct

    rng = random.Random(1)
    for cfg in (DEFAULT, SMALL, HwConfig(bus_bytes=64, dram_latency=1), HwConfig(bus_bytes=1)):
        t = Timing.from_config(cfg)
        for _ in range(150):
            mt = rng.choice([MemType.UOP, MemType.INP, MemType.WGT, MemType.ACC,
                             MemType.ACC_8BIT])
            insn = MemInsn(opcode=Opcode.LOAD, mem_type=mt, dram_base=rng.randrange(5000),
                           y_size=rng.randrange(1, 6), x_size=rng.randrange(1, 300),
                           x_stride=rng.randrange(400), y_pad_0=rng.randrange(3),
                           y_pad_1=rng.randrange(3), x_pad_0=rng.randrange(3),
                           x_pad_1=rng.randrange(3))
            eb = elem_bytes(cfg, mt)
            rows = t._load_plan_rows(insn, eb)
            saved, ct._PY_ROWS = ct._PY_ROWS, -1
            try:
                vec = t.load_plan(insn, eb)
            finally:
                ct._PY_ROWS = saved
            for name in ("req", "buf", "first", "span", "push", "beats", "burst_beats",
                         "lat_after"):
                assert getattr(rows, name) == getattr(vec, name), (name, insn)
            # the same for a STORE of those rows (no padding): row by row and vectorised
            store = dataclasses.replace(insn, opcode=Opcode.STORE, mem_type=MemType.OUT,
                                        y_pad_0=0, y_pad_1=0, x_pad_0=0, x_pad_1=0)
            eb = elem_bytes(cfg, MemType.OUT)
            rows = t.store_plan(store, eb)
            saved, ct._PY_ROWS = ct._PY_ROWS, -1
            try:
                assert rows == t.store_plan(store, eb), store
            finally:
                ct._PY_ROWS = saved




def test_narrow_one_row_load_plans_agree_with_the_rows():
    """One row of narrow elements (a micro-op load) in one burst is planned in closed form
    (Timing._load_plan_narrow_row): it must be _load_plan_rows's plan."""
    import random

    rng = random.Random(4)
    for cfg in (DEFAULT, SMALL, HwConfig(bus_bytes=64, dram_latency=1),
                HwConfig(bus_bytes=32, dram_latency=7)):
        t = Timing.from_config(cfg)
        narrow = [mt for mt in (MemType.UOP, MemType.INP, MemType.WGT, MemType.ACC,
                                MemType.ACC_8BIT) if elem_bytes(cfg, mt) < t.bus_bytes]
        for _ in range(400):
            mt = rng.choice(narrow)
            eb = elem_bytes(cfg, mt)
            insn = MemInsn(opcode=Opcode.LOAD, mem_type=mt, dram_base=rng.randrange(5000),
                           y_size=1, x_size=rng.randrange(1, 600), x_stride=rng.randrange(600),
                           y_pad_0=rng.randrange(3), y_pad_1=rng.randrange(3),
                           x_pad_0=rng.randrange(3), x_pad_1=rng.randrange(3))
            a, b = t.load_plan(insn, eb), t._load_plan_rows(insn, eb)
            for name in ("req", "buf", "first", "span", "push", "beats", "burst_beats",
                         "lat_after", "n", "req0", "buf0", "first0", "span0", "lat0", "end"):
                assert getattr(a, name) == getattr(b, name), (name, insn)


def test_wide_load_plans_in_closed_form_agree_with_the_rows():
    """A LOAD of wide elements gets its plan's scalars in closed form per row
    (Timing._load_plan_wide) and its per-burst lists only when read; both must be
    _load_plan_rows's, whose scalars (first burst, last RLAST, latencies) are read off its
    lists."""
    import random

    rng = random.Random(3)
    for cfg in (DEFAULT, SMALL, HwConfig(bus_bytes=64, dram_latency=1), HwConfig(bus_bytes=1),
                HwConfig(bus_bytes=32, dram_latency=7)):
        t = Timing.from_config(cfg)
        wide = [mt for mt in (MemType.UOP, MemType.INP, MemType.WGT, MemType.ACC,
                              MemType.ACC_8BIT) if elem_bytes(cfg, mt) >= t.bus_bytes]
        for _ in range(300):
            mt = rng.choice(wide)
            eb = elem_bytes(cfg, mt)
            # up to _PY_ROWS rows; strides of whole bursts (every row alike) or not
            stride = (rng.randrange(4) * t.burst_bytes // eb if rng.random() < 0.3
                      else rng.randrange(400))
            insn = MemInsn(opcode=Opcode.LOAD, mem_type=mt, dram_base=rng.randrange(5000),
                           y_size=rng.choice((rng.randrange(1, 9), rng.randrange(1, 33))),
                           x_size=rng.randrange(1, 300),
                           x_stride=stride, y_pad_0=rng.randrange(3),
                           y_pad_1=rng.randrange(3), x_pad_0=rng.randrange(3),
                           x_pad_1=rng.randrange(3))
            rows = t._load_plan_rows(insn, eb)
            lazy = t.load_plan(insn, eb)
            assert lazy._lists is None  # nothing per burst made yet
            for i in range(rows.n):  # any burst, in closed form for one row
                assert lazy.burst(i) == (rows.req[i], rows.buf[i], rows.first[i],
                                         rows.span[i]), (i, insn)
                assert lazy.lat_after_at(i) == rows.lat_after[i]
            assert lazy._lists is None or insn.y_size > 1 or rows.n == 1
            scalars = ("n", "push", "beats", "req0", "buf0", "first0", "span0", "lat0", "end")
            assert [getattr(lazy, k) for k in scalars] == [getattr(rows, k) for k in scalars]
            assert (rows.n, rows.req0, rows.buf0, rows.first0, rows.span0, rows.lat0,
                    rows.end) == (len(rows.req), rows.req[0], rows.buf[0], rows.first[0],
                                  rows.span[0], rows.lat_after[0],
                                  rows.first[-1] + rows.span[-1])
            for name in ("req", "buf", "first", "span", "burst_beats", "lat_after"):
                assert getattr(lazy, name) == getattr(rows, name), (name, insn)


def test_fetch_batches_in_one_burst_need_no_split():
    """A batch of whole beats inside one burst window is built without splitting its
    request (Timing._fetch_batch); it must equal the general split."""
    for cfg in (DEFAULT, SMALL, HwConfig(bus_bytes=16), HwConfig(bus_bytes=4),
                HwConfig(bus_bytes=1), HwConfig(bus_bytes=64)):
        t = Timing.from_config(cfg)
        for addr in range(0, 2 * t.burst_bytes, 16):
            for count in range(1, t.fetch_insns + 1):
                a = t._fetch_batch(addr % t.burst_bytes, count)
                b = t._fetch_batch_general(addr % t.burst_bytes, count)
                assert dataclasses.astuple(a) == dataclasses.astuple(b), (cfg, addr, count)

def test_program_fetch_batches_are_each_batchs_own():
    """_Static.fetch_batches shares one batch between the batches of whole beats inside one
    burst with the same count, whatever their address; every batch must be the one
    Timing._fetch_batch makes for its own address and count."""
    from celosia.isa import FinishInsn
    from celosia.sim.cycle import _Static
    from celosia.sim.fsim import Program

    for cfg in (DEFAULT, SMALL, HwConfig(bus_bytes=32), HwConfig(bus_bytes=4)):
        t = Timing.from_config(cfg)
        for n in (1, 7, 8, 9, 37, 300):
            insns = Program([FinishInsn()] * n)
            for insn_addr in (0, 16, 48, 640, t.burst_bytes - 64, t.burst_bytes - 16,
                              2 * t.burst_bytes, 3 * t.burst_bytes + 80):
                got = _Static(insns, t, cfg).fetch_batches(t, insn_addr)
                assert len(got) == -(-n // t.fetch_insns)
                for b, batch in enumerate(got):
                    first = b * t.fetch_insns
                    want = t._fetch_batch((insn_addr + first * 16) % t.burst_bytes,
                                          min(t.fetch_insns, n - first))
                    assert dataclasses.astuple(batch) == dataclasses.astuple(want), \
                        (cfg, n, insn_addr, b)


def test_one_row_in_one_burst_has_one_plan_per_beat_offset():
    """_Static shares a plan between one-row LOADs/STOREs inside one burst window that
    start at the same offset within a beat: their plans are equal wherever they are."""
    import random

    rng = random.Random(7)
    for cfg in (DEFAULT, SMALL, HwConfig(bus_bytes=64), HwConfig(bus_bytes=1)):
        t = Timing.from_config(cfg)
        for _ in range(200):
            store_ = rng.random() < 0.3
            mt = MemType.OUT if store_ else rng.choice([MemType.UOP, MemType.INP, MemType.WGT,
                                                        MemType.ACC, MemType.ACC_8BIT])
            eb = elem_bytes(cfg, mt)
            x = rng.randrange(1, max(2, t.burst_bytes // eb // 2))
            plans = []
            for _ in range(2):
                while True:  # a start inside a burst window with the row's end in it too
                    base = rng.randrange(0, 1 << 16)
                    a = base * eb
                    if a // t.burst_bytes == (a + x * eb - 1) // t.burst_bytes:
                        break
                plans.append((a % t.bus_bytes, MemInsn(
                    opcode=Opcode.STORE if store_ else Opcode.LOAD, mem_type=mt,
                    dram_base=base, y_size=1, x_size=x, x_stride=x)))
            (o1, i1), (o2, i2) = plans
            if o1 != o2:
                continue
            a, b = ((t.store_plan(i, eb) if store_ else t.load_plan(i, eb)) for i in (i1, i2))
            if store_:
                assert a == b, (i1, i2)
            else:
                for name in ("req", "buf", "first", "span", "push", "beats", "burst_beats",
                             "lat_after"):
                    assert getattr(a, name) == getattr(b, name), (name, i1, i2)


def test_one_request_splits_into_the_same_bursts_in_python():
    """Fetch batches split their one request in Python (cycle_timing._request_bursts); the
    numpy split of many rows (_bursts) is the reference."""
    import random

    import celosia.sim.cycle_timing as ct

    rng = random.Random(4)
    for bus, burst, eb in ((8, 2048, 16), (1, 256, 16), (64, 4096, 16), (8, 2048, 4),
                           (64, 4096, 1)):
        for _ in range(300):
            a = rng.randrange(20000) // eb * eb
            e = a + rng.randrange(1, 600) * eb
            want = ct._bursts(np.array([a]), np.array([e]), eb, bus, burst)
            assert ct._request_bursts(a, e, eb, bus, burst) == \
                tuple(want[k].tolist() for k in (3, 4, 5)), (a, e, eb, bus, burst)


def test_mem_plans_repeat_a_window_further_on():
    """The cycle model memoises LOAD/STORE plans by dram_base's byte address within a
    window of whole bursts and beats (cycle._Static): a plan is the same a whole number of
    windows further on, on both load_plan paths and for stores."""
    import dataclasses
    import math
    import random

    import celosia.sim.cycle_timing as ct

    rng = random.Random(2)
    for cfg in (DEFAULT, SMALL, HwConfig(bus_bytes=64, dram_latency=1), HwConfig(bus_bytes=1)):
        t = Timing.from_config(cfg)
        window = math.lcm(t.burst_bytes, t.bus_bytes)
        for _ in range(120):
            store_ = rng.random() < 0.25
            mt = MemType.OUT if store_ else rng.choice(
                [MemType.UOP, MemType.INP, MemType.WGT, MemType.ACC, MemType.ACC_8BIT])
            pads = {} if store_ else dict(y_pad_0=rng.randrange(3), y_pad_1=rng.randrange(3),
                                          x_pad_0=rng.randrange(3), x_pad_1=rng.randrange(3))
            insn = MemInsn(opcode=Opcode.STORE if store_ else Opcode.LOAD, mem_type=mt,
                           dram_base=rng.randrange(5000), y_size=rng.randrange(1, 50),
                           x_size=rng.randrange(1, 300), x_stride=rng.randrange(400), **pads)
            eb = elem_bytes(cfg, mt)
            step = window // math.gcd(window, eb)  # elements: a whole number of windows
            moved = dataclasses.replace(insn, dram_base=insn.dram_base
                                        + step * rng.randrange(1, 40))
            assert moved.dram_base * eb % window == insn.dram_base * eb % window
            for py_rows in (ct._PY_ROWS, -1):
                saved, ct._PY_ROWS = ct._PY_ROWS, py_rows
                try:
                    a, b = (t.store_plan(i, eb) if store_ else t.load_plan(i, eb)
                            for i in (insn, moved))
                finally:
                    ct._PY_ROWS = saved
                if store_:
                    assert a == b, insn
                else:
                    for name in ("req", "buf", "first", "span", "push", "beats",
                                 "burst_beats", "lat_after"):
                        assert getattr(a, name) == getattr(b, name), (name, insn)


def test_mem_plans_shared_by_configurations_of_one_timing():
    """Configurations with equal timings (bus, latencies, queues) but other element sizes
    share the plan memo: each program still gets the plans of its own element bytes."""
    from celosia.sim.cycle import _Static
    from celosia.sim.fsim import Program

    a = HwConfig()
    b = HwConfig(log_block=3, log_inp_buff_size=12, log_wgt_buff_size=13, log_acc_buff_size=13)
    assert Timing.from_config(a) == Timing.from_config(b)
    assert elem_bytes(a, MemType.INP) != elem_bytes(b, MemType.INP)
    insns = [load(mt, 0, 0, 7, y=3, stride=9, x_pad_0=1) for mt in  # dram_base 0: keys meet
             (MemType.INP, MemType.WGT, MemType.ACC, MemType.UOP)] + [store(0, 0, 5, y=2),
                                                                      FinishInsn()]
    for cfg in (a, b, a):
        t = Timing.from_config(cfg)
        static = _Static(Program(insns), t, cfg)
        for j, insn in enumerate(insns[:-1]):
            eb = elem_bytes(cfg, insn.mem_type)
            if insn.opcode == Opcode.STORE:
                assert (static.plans[j], *static.writes[j]) == t.store_plan(insn, eb)
            else:
                want = t.load_plan(insn, eb)
                assert [getattr(static.plans[j], f) for f in ("req", "first", "span", "push")] \
                    == [getattr(want, f) for f in ("req", "first", "span", "push")]

def gemm_only_image(cfg, uops, **loop):
    b = ProgramBuilder(cfg)
    base = b.uops(uops)
    b.emit(load(MemType.UOP, 0, base, len(uops)))
    b.emit(GemmInsn(uop_bgn=0, uop_end=len(uops), **loop))
    b.emit(FinishInsn())
    return b.image()


@pytest.mark.parametrize("cfg", [DEFAULT, SMALL], ids=["default", "small"])
@pytest.mark.parametrize("n", [1, 5, 64])
def test_gemm_pushes_n_plus_the_pipeline_after_its_start(n, cfg):
    """A GEMM of n micro-ops pushes n + exec_stage + 2 cycles after its start: issue in
    t0 + 1 .. t0 + n, the last write exec_stage + 1 later, PUSH the cycle after."""
    sim, stats = both(gemm_only_image(cfg, [Uop(i, i, 0) for i in range(n)]), cfg)
    X = sim.timing.exec_stage
    assert X == 6 + {16: 2, 4: 1}[cfg.block]
    assert sim.timeline.push[1] - sim.timeline.start[1] == n + X + 2
    assert stats["compute_stall_pipeline_cycles"] == X + 1
    assert stats["compute_stall_hazard_cycles"] == 0


def test_dependent_micro_ops_do_not_stall_but_shr_and_mul_do():
    """Forwarding: GEMM accumulation into one row and MIN/MAX/ADD chains run at one
    micro-op per cycle; a SHR or MUL micro-op reading the row of the one right before it
    waits a cycle (hw/compute.py)."""
    cfg = DEFAULT
    n = 10
    sim, _ = both(gemm_only_image(cfg, [Uop(0, i, 0) for i in range(n)]))
    X = sim.timing.exec_stage
    assert sim.timeline.push[1] - sim.timeline.start[1] == n + X + 2
    for op, stalls in ((AluOp.ADD, 0), (AluOp.MAX, 0), (AluOp.SHR, 8), (AluOp.MUL, 8)):
        b = ProgramBuilder(cfg)
        base = b.uops([Uop(1, 0), Uop(2, 1), Uop(3, 2)])  # each reads the row the previous wrote
        b.emit(load(MemType.UOP, 0, base, 3))
        b.emit(AluInsn(alu_op=op, uop_bgn=0, uop_end=3, iter_out=4))
        b.emit(FinishInsn())
        sim, stats = both(b.image())
        # per pass, micro-ops 1 and 2 read the previous one's dst (3 -> 1 across passes
        # does not): 2 x 4 stalls
        assert sim.timeline.push[1] - sim.timeline.start[1] == 12 + stalls + X + 2, op
        assert stats["compute_stall_hazard_cycles"] == stalls


def test_unpipelined_timing_is_the_earlier_rtl():
    """Timing.unpipelined (the before side of `celosia bench fpga`): GEMM/ALU push in
    t0 + N + 3 with no stalls, instructions readable the cycle after the DMA delivers them."""
    from celosia.sim.cycle import CycleSimulator
    from celosia.sim.cycle_timing import Timing

    cfg = DEFAULT
    t = Timing.unpipelined(cfg)
    b = ProgramBuilder(cfg)
    base = b.uops([Uop(1, 0), Uop(2, 1), Uop(3, 2)])
    b.emit(load(MemType.UOP, 0, base, 3))
    b.emit(AluInsn(alu_op=AluOp.MUL, uop_bgn=0, uop_end=3, iter_out=4))
    b.emit(FinishInsn())
    image = b.image()
    sim = CycleSimulator(cfg, image.dram.size, timing=t)
    sim.write_dram(0, image.dram)
    stats = sim.run(image.insn_addr, image.insn_count)
    tl = sim.timeline
    assert tl.push[1] - tl.start[1] == 12 + 3 and stats["compute_stall_hazard_cycles"] == 0
    assert tl.dispatch[0] == t.read_latency + 5 + 16 // cfg.bus_bytes


def _hazards_by_enumeration(insn, dst, src) -> int:
    """The naive count: every execution in order against the one before it."""
    rows = [(d + i * insn.dst_factor_out + j * insn.dst_factor_in,
             s + i * insn.src_factor_out + j * insn.src_factor_in)
            for i in range(insn.iter_out) for j in range(insn.iter_in)
            for d, s in zip(dst, src)]
    return sum(1 for (d0, _), (d1, s1) in zip(rows, rows[1:])
               if d1 == d0 or (not insn.use_imm and s1 == d0))


def test_alu_hazard_count_matches_enumeration():
    """cycle_timing.alu_hazards (closed form over the loops) against enumerating every pair
    of consecutive executions, on small random loops where rows often meet."""
    import random

    from celosia.sim.cycle_timing import alu_hazards

    rng = random.Random(5)
    for _ in range(3000):
        u = rng.randint(1, 5)
        dst = [rng.randrange(4) for _ in range(u)]
        src = [rng.randrange(4) for _ in range(u)]
        insn = AluInsn(alu_op=rng.choice(list(AluOp)), use_imm=rng.random() < 0.3,
                       uop_bgn=0, uop_end=u, iter_out=rng.randint(1, 5),
                       iter_in=rng.randint(1, 5),
                       dst_factor_out=rng.randint(0, 3), dst_factor_in=rng.randint(0, 3),
                       src_factor_out=rng.randint(0, 3), src_factor_in=rng.randint(0, 3))
        want = (_hazards_by_enumeration(insn, dst, src)
                if insn.alu_op in (AluOp.SHR, AluOp.MUL) else 0)
        assert alu_hazards(insn, np.array(dst), np.array(src)) == want, (insn, dst, src)



def test_one_uop_hazards_need_no_micro_op():
    """A SHR/MUL of one micro-op with an immediate stalls as alu_hazards and the enumeration
    say, whatever its micro-op's rows (cycle._Static counts it once per program, from the
    fields alone: cycle_timing.one_uop_hazards)."""
    import random

    from celosia.sim.cycle_timing import alu_hazards, one_uop_hazards

    rng = random.Random(9)
    for _ in range(2000):
        insn = AluInsn(alu_op=rng.choice((AluOp.SHR, AluOp.MUL)), use_imm=True,
                       uop_bgn=0, uop_end=1, iter_out=rng.randint(1, 6),
                       iter_in=rng.randint(1, 6), dst_factor_out=rng.randint(0, 6),
                       dst_factor_in=rng.randint(0, 3), src_factor_out=rng.randint(0, 3),
                       src_factor_in=rng.randint(0, 3))
        dst, src = [rng.randrange(50)], [rng.randrange(50)]
        want = _hazards_by_enumeration(insn, dst, src)
        assert one_uop_hazards(insn) == want == alu_hazards(insn, np.array(dst),
                                                              np.array(src)), insn
    with pytest.raises(ValueError):
        one_uop_hazards(AluInsn(alu_op=AluOp.ADD, use_imm=True, uop_bgn=0, uop_end=1))

def test_token_wait_serializes():
    """compute starts the cycle after load's token becomes visible, not earlier."""
    sim, stats = both(gemm_program())
    tl = sim.timeline
    assert tl.start[4] == max(tl.push[3] + 1, tl.free[4], tl.dispatch[4] + 1)
    assert tl.start[4] >= tl.push[3] + 1
    assert tl.start[6] >= tl.push[5] + 1  # store after the ALU's push
    assert stats["store_stall_token_compute_cycles"] > 0


def tiles_image(cfg, tiles, overlap):
    """Per tile: LOAD INP -> GEMM -> STORE. Without overlap, load waits for compute and
    compute for store (one tile in flight); with overlap, double-buffered tiles (the token
    queues let load run one tile ahead), as VTA's virtual threads do."""
    b = ProgramBuilder(cfg)
    inp = b.data(np.ones((tiles, 8 * cfg.inp_elem_bytes), np.int8), 16) // 16
    uop = b.uops([Uop(i, i, 0) for i in range(8)])
    out = b.alloc(tiles * 8 * 16) // 16
    b.emit(load(MemType.UOP, 0, uop, 8))
    b.emit(load(MemType.WGT, 0, b.data(np.ones(cfg.wgt_elem_bytes, np.int8), 256) // 256, 1))
    slots = 2 if overlap else 1
    # Initial room tokens: compute->load (buffers free) and store->compute (out rows free).
    for _ in range(slots):
        b.emit(GemmInsn(uop_bgn=0, uop_end=0, push_prev=True))
    for _ in range(slots):
        b.emit(store(0, 0, 0, push_prev=True))
    for tile in range(tiles):
        s = tile % slots
        b.emit(load(MemType.INP, 8 * s, inp + 8 * tile, 8, pop_next=True, push_next=True))
        b.emit(GemmInsn(uop_bgn=0, uop_end=8, dst_factor_out=0, src_factor_out=0,
                        iter_out=1, pop_prev=True, pop_next=True, push_prev=True,
                        push_next=True) if s == 0 else
               GemmInsn(uop_bgn=0, uop_end=8, iter_out=1, iter_in=1, dst_factor_in=8,
                        src_factor_in=8, pop_prev=True, pop_next=True, push_prev=True,
                        push_next=True))
        b.emit(store(0, out + 8 * tile, 8, pop_prev=True, push_prev=True))
    for _ in range(slots):  # drain the tokens left in store->compute and compute->load
        b.emit(GemmInsn(uop_bgn=0, uop_end=0, pop_next=True))
    b.emit(FinishInsn())
    return b.image()


def test_overlap_beats_serialized():
    cfg = DEFAULT
    _, serial = both(tiles_image(cfg, 6, overlap=False))
    _, overlap = both(tiles_image(cfg, 6, overlap=True))
    assert overlap["cycles"] < serial["cycles"]
    assert overlap["gemm_utilization"] > serial["gemm_utilization"]


def test_command_queue_full_stalls_fetch():
    cfg = HwConfig(cmd_queue_depth=1)
    b = ProgramBuilder(cfg)
    base = b.uops([Uop(0, 0, 0)] * 40)
    b.emit(load(MemType.UOP, 0, base, 40))
    for _ in range(6):
        b.emit(GemmInsn(uop_bgn=0, uop_end=40, reset=True))
    b.emit(FinishInsn())
    sim, stats = both(b.image(), cfg)
    assert stats["fetch_stall_cmdq_full_compute_cycles"] > 0
    check_schedule_rules(sim.timeline, cfg)


def test_token_queue_full_stalls_the_pusher():
    cfg = HwConfig(token_queue_depth=1)
    b = ProgramBuilder(cfg)
    inp = b.data(np.ones(16 * 4, np.int8), 16) // 16
    base = b.uops([Uop(0, 0, 0)])
    b.emit(load(MemType.UOP, 0, base, 1))
    b.emit(GemmInsn(uop_bgn=0, uop_end=1, iter_out=500, reset=True))  # keeps compute busy
    b.emit(load(MemType.INP, 0, inp, 1, push_next=True))
    b.emit(load(MemType.INP, 1, inp, 1, push_next=True))  # waits for the GEMM's pop
    b.emit(GemmInsn(uop_bgn=0, uop_end=0, pop_prev=True))
    b.emit(GemmInsn(uop_bgn=0, uop_end=0, pop_prev=True))
    b.emit(FinishInsn())
    sim, stats = both(b.image(), cfg)
    assert stats["load_stall_push_compute_cycles"] > 0
    check_schedule_rules(sim.timeline, cfg)


# ---- errors and limits -------------------------------------------------------------------------


def same_error(image, cfg=DEFAULT):
    with pytest.raises(ProgramError) as want:
        run_image(image, "fsim", cfg)
    with pytest.raises(type(want.value)) as got:
        run_image(image, "cycle", cfg)
    assert str(got.value) == str(want.value)
    return got.value


def test_deadlock_is_fsims():
    b = ProgramBuilder(DEFAULT)
    b.emit(GemmInsn(uop_bgn=0, uop_end=0, pop_prev=True))
    b.emit(FinishInsn())
    err = same_error(b.image())
    assert isinstance(err, DeadlockError)


def test_illegal_programs_are_fsims():
    b = ProgramBuilder(DEFAULT)
    b.emit(store(0, 0, 1, x_pad_0=1))
    b.emit(FinishInsn())
    same_error(b.image())
    b = ProgramBuilder(DEFAULT)  # a micro-op out of range, found when the GEMM executes
    base = b.uops([Uop(DEFAULT.acc_depth - 1, 0, 0)])
    b.emit(load(MemType.UOP, 0, base, 1))
    b.emit(GemmInsn(uop_bgn=0, uop_end=1, iter_out=2, dst_factor_out=1))
    b.emit(FinishInsn())
    same_error(b.image())


def test_max_cycles():
    image = gemm_program()
    _, stats = run_cycle(image)
    run_cycle(image, max_cycles=stats["cycles"])
    with pytest.raises(SimulationLimitError, match="max_cycles"):
        run_cycle(image, max_cycles=stats["cycles"] - 1)
    with pytest.raises(CelosiaError, match="max_cycles must be"):
        CycleSimulator(DEFAULT, 64, max_cycles=0)


def test_max_cycles_stops_before_a_huge_gemm_runs():
    b = ProgramBuilder(DEFAULT)
    base = b.uops([Uop(0, 0, 0)])
    b.emit(load(MemType.UOP, 0, base, 1))
    b.emit(GemmInsn(uop_bgn=0, uop_end=1, iter_out=16383, iter_in=16383))
    b.emit(FinishInsn())
    with pytest.raises(SimulationLimitError, match="instruction 1"):
        run_cycle(b.image(), max_cycles=10_000)


# ---- statistics and trace ----------------------------------------------------------------------


def check_stat_sums(stats):
    cycles = stats["cycles"]
    for unit in ("fetch",) + MODULES:
        parts = [v for k, v in stats.items() if k.startswith(unit + "_") and k.endswith("_cycles")]
        assert all(p >= 0 for p in parts), unit
        assert sum(parts) == cycles, unit


def test_statistics():
    _, stats = both(gemm_program())
    check_stat_sums(stats)
    assert 0 < stats["gemm_utilization"] < 1
    assert stats["gemm_utilization"] == stats["macs"] / (stats["cycles"] * 256)
    assert stats["wgt_load_bytes_per_cycle"] <= DEFAULT.bus_bytes
    assert stats["dram_read_bytes"] == stats["fetch_bytes"] + sum(
        stats[f"{k}_load_bytes"] for k in ("uop", "inp", "wgt", "acc", "acc8"))
    assert all(isinstance(v, (int, float)) for v in stats.values())
    json.dumps(stats)


def test_trace(tmp_path):
    path = tmp_path / "t.json"
    image = gemm_program()
    _, dram_stats = run_image(image, "cycle", DEFAULT, trace=str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"fetch", "load", "compute", "store"} <= set(names.values())
    insn_events = [e for e in events if e["ph"] == "X" and e.get("cat") == "insn"
                   and e["tid"] in (1, 2, 3)]
    assert sorted(e["args"]["index"] for e in insn_events) == list(range(image.insn_count))
    for e in insn_events:
        assert names[e["tid"]] in MODULES and e["dur"] > 0 and e["args"]["insn"]
        assert e["ts"] + e["dur"] <= dram_stats["cycles"]
    assert any(e.get("cat") == "stall" for e in events)


def test_plot_timeline(tmp_path):
    sim, _ = run_cycle(gemm_program())
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(CelosiaError, match="matplotlib"):
            plot_timeline(sim, tmp_path / "t.png")
        return
    plot_timeline(sim, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


# ---- the schedule's rules, checked naively on a timeline ---------------------------------------


def check_schedule_rules(tl, cfg):
    """Every rule of docs/cycle_model.md as an inequality, and every start as tight as the
    rules allow (it equals the latest of its constraints)."""
    t = tl.timing
    n = len(tl.insns)
    assert np.all(np.diff(tl.dispatch) >= 1)
    assert np.all(tl.dispatch >= tl.avail)
    pushes = {q: [] for q in range(4)}
    pops = {q: [] for q in range(4)}
    by_module = {m: [j for j in range(n) if tl.module[j] == m] for m in range(3)}
    qid = {q: k for k, q in enumerate(TOKEN_QUEUES)}
    for j in range(n):  # in program order, so per-module order too
        m = module_of(tl.insns[j])
        for q in pops_of(m, tl.insns[j]):
            pops[qid[q]].append(j)
        for q in pushes_of(m, tl.insns[j]):
            pushes[qid[q]].append(j)
    token_ready = {}
    room_ready = {}
    for q in range(4):
        for k, j in enumerate(pops[q]):
            token_ready.setdefault(j, []).append(tl.push[pushes[q][k]] + 1)
        for k, j in enumerate(pushes[q]):
            if k >= t.token_queue_depth:
                room_ready.setdefault(j, []).append(tl.start[pops[q][k - t.token_queue_depth]]
                                                    + 1)
    for m, seq in by_module.items():
        free = 0
        for k, j in enumerate(seq):
            assert tl.free[j] == free
            want = max([free, tl.dispatch[j] + 1] + token_ready.get(j, []))
            assert tl.start[j] == want, j
            assert tl.push[j] == max([tl.done[j]] + room_ready.get(j, [])), j
            plan = tl.plans[j]
            assert tl.done[j] - tl.start[j] >= (plan if isinstance(plan, int) else plan.push)
            if k >= t.cmd_queue_depth:  # command queue: room once `depth` ahead started
                assert tl.dispatch[j] >= tl.start[seq[k - t.cmd_queue_depth]] + 1
            free = tl.push[j] + 1
    # The read channel: one burst at a time, granted after its request, data after latency.
    bursts = tl.read_bursts()
    client, r, g, f, x = bursts[:, 0], bursts[:, 2], bursts[:, 3], bursts[:, 4], bursts[:, 5]
    assert np.all(g >= r) and np.all(f >= g + 1 + t.read_latency) and np.all(x >= f)
    order = np.argsort(g)
    assert np.all(g[order][1:] > x[order][:-1])
    assert set(client.tolist()) <= {0, 1, 2}
