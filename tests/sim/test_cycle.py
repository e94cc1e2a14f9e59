"""The cycle model (sim/cycle.py): fsim's values, the closed forms of docs/cycle_model.md, the
schedule's rules checked naively on its timeline, limits, statistics and the trace."""

import json

import numpy as np
import pytest
from programs import ProgramBuilder, random_program

from celosia import HwConfig
from celosia.errors import CelosiaError, DeadlockError, ProgramError, SimulationLimitError
from celosia.isa import (
    AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop, module_of,
)
from celosia.sim.base import run_image
from celosia.sim.cycle import CycleSimulator, Timing, plot_timeline
from celosia.sim.cycle_timing import _gemm_stalls_by_blocks, _stall_array
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
    eb = cfg.elem_bytes(mt)
    base = b.data(np.arange(eb * (x + 4) * y, dtype=np.int64).astype(np.uint8), eb) // eb
    b.emit(load(mt, 0, base, x, y, stride, **pads))
    b.emit(FinishInsn())
    return b.image()


@pytest.mark.parametrize("mt,x", [(MemType.INP, 1), (MemType.INP, 37), (MemType.WGT, 3),
                                  (MemType.ACC, 5), (MemType.UOP, 7)])
def test_single_load_closed_form(mt, x):
    """A lone LOAD: issue + latency + ceil(bytes / bus) cycles; the run adds one fetch burst."""
    cfg = DEFAULT
    image = single_load_image(cfg, mt, x)
    sim, stats = both(image)
    t = sim.timing
    nbytes = x * cfg.elem_bytes(mt)
    beats = -(-nbytes // cfg.bus_bytes)
    tl = sim.timeline
    assert tl.done[0] - tl.start[0] == t.issue_cycles + t.dram_latency + beats
    # fetch: first beat at latency, instruction 0 usable after 16 / bus beats, dispatch,
    # then the module sees it one cycle later.
    insn_beats = 16 // cfg.bus_bytes
    assert tl.start[0] == t.dram_latency + insn_beats + t.dispatch_latency
    on_compute = mt not in (MemType.INP, MemType.WGT)  # then FINISH runs after it
    assert stats["cycles"] == tl.done[0] + (t.issue_cycles if on_compute else 0)
    assert stats["load_stall_dram_cycles" if mt in (MemType.INP, MemType.WGT)
                 else "compute_stall_dram_cycles"] == t.dram_latency


def test_load_padding_and_strided_rows():
    cfg = DEFAULT
    image = single_load_image(cfg, MemType.INP, 3, y=4, stride=5, y_pad_0=1, x_pad_1=2)
    sim, _ = both(image)
    t, tl = sim.timing, sim.timeline
    pad = (1 + 4) * (3 + 2) - 4 * 3
    beats = 4 * (3 * 16 // cfg.bus_bytes)
    assert tl.done[0] - tl.start[0] == t.issue_cycles + t.dram_latency + beats + pad


def test_unaligned_rows_count_every_touched_beat():
    t = Timing.from_config(DEFAULT)
    assert t.beats(4, 4) == 1 and t.beats(4, 8) == 2 and t.beats(0, 8) == 1
    assert t.rows_beats(4, 12, 4, 3) == 3  # rows at bytes 4, 16, 28
    assert t.rows_beats(4, 12, 8, 3) == 2 + 1 + 2


def gemm_only_image(cfg, uops, **loop):
    b = ProgramBuilder(cfg)
    base = b.uops(uops)
    b.emit(load(MemType.UOP, 0, base, len(uops)))
    b.emit(GemmInsn(uop_bgn=0, uop_end=len(uops), **loop))
    b.emit(FinishInsn())
    return b.image()


@pytest.mark.parametrize("n", [1, 5, 64])
def test_gemm_without_hazards_is_n_plus_fill(n):
    cfg = DEFAULT
    sim, stats = both(gemm_only_image(cfg, [Uop(i, i, 0) for i in range(n)]))
    t = sim.timing
    assert sim.timeline.done[1] - sim.timeline.start[1] == t.issue_cycles + n + t.gemm_depth
    assert stats["compute_stall_hazard_cycles"] == 0


def test_gemm_hazard_stalls_closed_form():
    """All micro-ops on one ACC row: every one after the first waits depth - 1 cycles."""
    cfg = DEFAULT
    n = 10
    sim, stats = both(gemm_only_image(cfg, [Uop(0, i, 0) for i in range(n)]))
    t = sim.timing
    stall = (n - 1) * (t.gemm_depth - 1)
    assert stats["compute_stall_hazard_cycles"] == stall
    assert sim.timeline.done[1] - sim.timeline.start[1] == t.issue_cycles + n + stall + t.gemm_depth
    # A reset GEMM reads nothing, so it never stalls.
    sim, stats = both(gemm_only_image(cfg, [Uop(0, 0, 0)] * n, reset=True))
    assert stats["compute_stall_hazard_cycles"] == 0


def naive_stalls(reads, writes, depth, ii):
    """The hazard rule one execution at a time."""
    total = 0
    for e in range(len(writes)):
        for d in range(1, e + 1):
            if any(r[e] == writes[e - d] for r in reads):
                total += max(0, depth - d * ii)
                break
    return total


def test_hazard_closed_forms_match_a_naive_loop():
    rng = np.random.default_rng(5)
    for trial in range(60):
        nu = int(rng.integers(1, 7))
        dst0 = rng.integers(0, 4, nu).astype(np.int64)
        io, ii_ = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        fo, fi = int(rng.integers(0, 3)), int(rng.integers(0, 3))
        depth, ii = int(rng.integers(2, 6)), int(rng.integers(1, 3))
        window = -(-depth // ii) - 1
        dst = np.array([dst0[k] + i * fo + j * fi for i in range(io) for j in range(ii_)
                        for k in range(nu)], np.int64)
        want = naive_stalls([dst], dst, depth, ii)
        if window >= 1:
            assert int(_stall_array([dst], dst, window, depth, ii).sum()) == want
        if window >= 1 and nu >= window:
            insn = GemmInsn(uop_bgn=0, uop_end=nu, iter_out=io, iter_in=ii_,
                            dst_factor_out=fo, dst_factor_in=fi)
            assert _gemm_stalls_by_blocks(insn, dst0, window, depth, ii) == want, trial
        src = rng.integers(0, 4, dst.size).astype(np.int64)
        if window >= 1:
            assert int(_stall_array([dst, src], dst, window, depth, ii).sum()) == \
                naive_stalls([dst, src], dst, depth, ii)


def test_alu_hazards_count_tensor_sources():
    cfg = DEFAULT
    b = ProgramBuilder(cfg)
    base = b.uops([Uop(1, 0), Uop(2, 1), Uop(3, 2)])  # each reads the row the previous wrote
    b.emit(load(MemType.UOP, 0, base, 3))
    b.emit(AluInsn(alu_op=AluOp.ADD, uop_bgn=0, uop_end=3))
    b.emit(AluInsn(alu_op=AluOp.ADD, use_imm=True, imm=1, uop_bgn=0, uop_end=3))
    b.emit(FinishInsn())
    sim, _ = both(b.image())
    t = sim.timing
    assert sim.timeline.plans[1].stall == 2 * (t.alu_depth - t.alu_ii)
    assert sim.timeline.plans[2].stall == 0


def test_token_wait_serializes():
    """compute starts the cycle after load's token becomes visible, not earlier."""
    cfg = DEFAULT
    sim, stats = both(gemm_program())
    tl, t = sim.timeline, sim.timing
    assert tl.start[4] == max(tl.push[3] + t.token_latency, tl.free[4],
                              tl.dispatch[4] + t.dispatch_latency)
    assert tl.start[4] >= tl.push[3] + t.token_latency
    assert tl.start[6] >= tl.push[5] + t.token_latency  # store after the ALU's push
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
            token_ready.setdefault(j, []).append(tl.push[pushes[q][k]] + t.token_latency)
        for k, j in enumerate(pushes[q]):
            if k >= t.token_queue_depth:
                room_ready.setdefault(j, []).append(tl.start[pops[q][k - t.token_queue_depth]]
                                                    + t.token_latency)
    for m, seq in by_module.items():
        free = 0
        for k, j in enumerate(seq):
            assert tl.free[j] == free
            want = max([free, tl.dispatch[j] + t.dispatch_latency] + token_ready.get(j, []))
            assert tl.start[j] == want, j
            assert tl.push[j] == max([tl.done[j]] + room_ready.get(j, [])), j
            assert tl.done[j] - tl.start[j] >= tl.plans[j].min_cycles(t.dram_latency)
            if k >= t.cmd_queue_depth:  # command queue: room once `depth` ahead started
                assert tl.dispatch[j] >= tl.start[seq[k - t.cmd_queue_depth]] + t.cmd_slot_latency
            free = tl.push[j]
    # The read channel: transfers never overlap and never beat the latency.
    reads = [(tl.req[j], tl.data[j], tl.plans[j].beats) for j in range(n) if tl.req[j] >= 0]
    reads += [(r, f, b) for r, f, b, _, _ in tl.bursts.tolist()]
    reads.sort(key=lambda x: x[1])
    for (r0, f0, b0), (r1, f1, b1) in zip(reads, reads[1:]):
        assert f1 >= f0 + b0
    for r, f, _ in reads:
        assert f >= r + t.dram_latency
        # work-conserving in request order: a transfer waits only behind earlier requests
        if f > r + t.dram_latency:
            assert any(f == f0 + b0 and r0 <= r for r0, f0, b0 in reads)
