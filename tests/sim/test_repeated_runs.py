"""What fsim and the cycle model keep between runs of a program (compiled GEMM/ALU/LOAD/STORE
kernels, float32 weights, the cycle model's plans and tables, the static part of its
statistics) never changes a result: adversarial programs against the naive reference
(reference.py), the same simulator running one program on changing data, instructions whose
micro-ops or weights change between executions, the statistics against their previous
implementation, and max_cycles on a program whose plans are kept."""

import numpy as np
import pytest
from programs import ProgramBuilder, random_program
from reference import run_reference

from celosia import HwConfig
from celosia.errors import SimulationLimitError
from celosia.isa import AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop
from celosia.sim import cycle_report
from celosia.sim.cycle import CycleSimulator
from celosia.sim.cycle_report import _LOAD_BYTES, _POPS, _PUSHES, _QUEUE_ENDS, MODULES
from celosia.sim.fsim import FunctionalSimulator

DEFAULT, SMALL = HwConfig(), HwConfig.preset("small")


def _load(mt, sram, dram, x, y=1, stride=None, **flags):
    return MemInsn(opcode=Opcode.LOAD, mem_type=mt, sram_base=sram, dram_base=dram, y_size=y,
                   x_size=x, x_stride=x if stride is None else stride, **flags)


def _store(sram, dram, x, **flags):
    return MemInsn(opcode=Opcode.STORE, mem_type=MemType.OUT, sram_base=sram, dram_base=dram,
                   y_size=1, x_size=x, x_stride=x, **flags)


def _check(sim, image, cfg):
    """Run ``image`` on ``sim`` (fsim or cycle model) and on the reference: same DRAM,
    buffers and counters. Returns the simulator's counters."""
    sim.write_dram(0, image.dram)
    stats = sim.run(image.insn_addr, image.insn_count)
    state = {}
    ref_dram, ref_counters = run_reference(image.dram, image.insn_addr, image.insn_count, cfg,
                                           state=state)
    assert bytes(sim.read_dram(0, image.dram.size)) == ref_dram
    dp = sim.datapath
    for name, raw in (("uop", dp.uop_raw), ("inp", dp.inp_raw), ("wgt", dp.wgt_raw),
                      ("acc", dp.acc_raw), ("out", dp.out_raw)):
        assert raw.tobytes() == state[name], name
    assert {k: stats[k] for k in ref_counters} == ref_counters
    return stats


def _extremes(rng, shape):
    return np.where(rng.random(shape) < 0.5, -128, 127).astype(np.int8)


def long_gemm_program(cfg, seed: int, *, per: int = 150, shift: int = 7):
    """Two groups of ``per`` micro-ops (per x BLOCK products a lane: several exact float32
    slices) over a 2 x 2 loop into 8 ACC rows that start near 2^31 - 1 (sums wrap), then
    SHR, MIN, MAX and a STORE. Data from ``seed``; the program bytes do not depend on it."""
    rng = np.random.default_rng(seed)
    b = ProgramBuilder(cfg)
    lanes = cfg.batch * cfg.block
    inp = _extremes(rng, (per + 4, cfg.batch, cfg.block))
    wgt = _extremes(rng, (2 * per, cfg.block, cfg.block))
    acc = (2**31 - 1 - rng.integers(0, 1 << 20, (8, lanes))).astype("<i4")
    ib = b.data(inp, cfg.inp_elem_bytes) // cfg.inp_elem_bytes
    wb = b.data(wgt, cfg.wgt_elem_bytes) // cfg.wgt_elem_bytes
    ab = b.data(acc, cfg.acc_elem_bytes) // cfg.acc_elem_bytes
    uops = [Uop(4 * g, k, g * per + int(p)) for g in range(2)
            for k, p in enumerate(rng.permutation(per))]
    uops = [uops[k] for k in rng.permutation(len(uops))]
    uops += [Uop(0, 0)]  # the epilogue's
    ub = b.uops(uops)
    out = b.alloc(8 * cfg.out_elem_bytes) // cfg.out_elem_bytes
    n = 2 * per
    b.emit(_load(MemType.INP, 0, ib, per + 4))
    b.emit(_load(MemType.WGT, 0, wb, 2 * per, push_next=True))
    b.emit(_load(MemType.ACC, 0, ab, 8))
    b.emit(_load(MemType.UOP, 0, ub, len(uops)))
    b.emit(GemmInsn(uop_bgn=0, uop_end=n, iter_out=2, iter_in=2, dst_factor_out=2,
                    dst_factor_in=1, src_factor_out=2, src_factor_in=1, pop_prev=True))
    for op, imm in ((AluOp.SHR, shift), (AluOp.MAX, -100), (AluOp.MIN, 100)):
        b.emit(AluInsn(alu_op=op, use_imm=True, imm=imm, uop_bgn=n, uop_end=n + 1, iter_out=8,
                       dst_factor_out=1, push_next=op == AluOp.MIN))
    b.emit(_store(0, out, 8, pop_prev=True, push_prev=True))
    b.emit(FinishInsn(pop_next=True))
    return b.image()


@pytest.mark.parametrize("target", [FunctionalSimulator, CycleSimulator], ids=["fsim", "cycle"])
def test_long_reduction_program_matches_reference(target):
    image = long_gemm_program(DEFAULT, 1)
    sim = target(DEFAULT, image.dram.size)
    _check(sim, image, DEFAULT)
    assert sim.datapath._by_insn  # kernels were kept


@pytest.mark.parametrize("target", [FunctionalSimulator, CycleSimulator], ids=["fsim", "cycle"])
def test_same_program_on_changing_data(target):
    """One simulator, one program, new data on every run (and back): each run matches the
    reference, and the cycle counts do not depend on the data."""
    images = [long_gemm_program(DEFAULT, seed, per=70) for seed in (1, 2, 1, 3)]
    programs = {im.dram[im.insn_addr:].tobytes() for im in images}
    assert len(programs) == 1  # the same program bytes at the same address
    sim = target(DEFAULT, images[0].dram.size)
    cycles = {_check(sim, im, DEFAULT).get("cycles") for im in images}
    assert len(cycles) == 1


def test_instruction_runs_again_with_new_uops_and_weights():
    """The same GEMM and ALU instructions (equal bytes) run three times in one program, with
    new micro-ops and new weights loaded into the same rows in between."""
    cfg = SMALL
    rng = np.random.default_rng(9)
    b = ProgramBuilder(cfg)
    inp = b.data(rng.integers(-128, 128, (16, cfg.batch, cfg.block), dtype=np.int8),
                 cfg.inp_elem_bytes) // cfg.inp_elem_bytes
    wgts = [b.data(rng.integers(-128, 128, (8, cfg.block, cfg.block), dtype=np.int8),
                   cfg.wgt_elem_bytes) // cfg.wgt_elem_bytes for _ in range(3)]
    kernels = [b.uops([Uop(int(rng.integers(0, 4)), int(rng.integers(0, 12)),
                           int(rng.integers(0, 8))) for _ in range(6)]
                      + [Uop(int(rng.integers(0, 8)), int(rng.integers(0, 8)))])
               for _ in range(3)]
    out = b.alloc(3 * 8 * cfg.out_elem_bytes) // cfg.out_elem_bytes
    reset = b.uops([Uop(0, 0)])
    b.emit(_load(MemType.INP, 0, inp, 16))
    b.emit(_load(MemType.UOP, 0, reset, 1))  # clear the ACC rows used: runs start equal
    b.emit(GemmInsn(reset=True, uop_bgn=0, uop_end=1, iter_out=12, dst_factor_out=1))
    for k in range(3):
        b.emit(_load(MemType.WGT, 0, wgts[k], 8, pop_next=k > 0, push_next=True))
        b.emit(_load(MemType.UOP, 0, kernels[k], 7, pop_prev=True))
        b.emit(GemmInsn(uop_bgn=0, uop_end=6, iter_out=2, dst_factor_out=4, src_factor_out=1))
        b.emit(AluInsn(alu_op=AluOp.ADD, uop_bgn=6, uop_end=7, iter_in=3, dst_factor_in=1,
                       src_factor_in=2, push_prev=True, push_next=True))
        b.emit(_store(0, out + 8 * k, 8, pop_prev=True, push_prev=True))
        b.emit(GemmInsn(reset=False, uop_bgn=0, uop_end=0, pop_next=True))  # a no-op
    b.emit(FinishInsn())
    image = b.image()
    for target in (FunctionalSimulator, CycleSimulator):
        sim = target(cfg, image.dram.size)
        for _ in range(2):
            _check(sim, image, cfg)


_BUFFERS = ("uop_raw", "inp_raw", "wgt_raw", "acc_raw", "out_raw")


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_twice_on_one_simulator(seed):
    """A second run (kernels and plans kept; on-chip buffers as the first run left them)
    equals the same run on a new simulator given the same buffers."""
    cfg = (SMALL, DEFAULT)[seed % 2]
    image = random_program(cfg, seed, n_body=30).image
    for target in (FunctionalSimulator, CycleSimulator):
        sim = target(cfg, image.dram.size)
        _check(sim, image, cfg)
        fresh = target(cfg, image.dram.size)
        for name in _BUFFERS:
            getattr(fresh.datapath, name)[...] = getattr(sim.datapath, name)
        results = []
        for s in (sim, fresh):
            s.write_dram(0, image.dram)
            stats = s.run(image.insn_addr, image.insn_count)
            results.append((stats, s.read_dram(0, image.dram.size).tobytes(),
                            [getattr(s.datapath, name).tobytes() for name in _BUFFERS]))
        assert results[0] == results[1]



def _repeated_words_program(cfg):
    """Equal GEMM and ALU instruction words, several times each."""
    rng = np.random.default_rng(4)
    b = ProgramBuilder(cfg)
    ib = b.data(rng.integers(-128, 128, (8, cfg.batch, cfg.block), dtype=np.int8),
                cfg.inp_elem_bytes) // cfg.inp_elem_bytes
    wb = b.data(rng.integers(-128, 128, (4, cfg.block, cfg.block), dtype=np.int8),
                cfg.wgt_elem_bytes) // cfg.wgt_elem_bytes
    ub = b.uops([Uop(0, 0, 0), Uop(0, 1, 1), Uop(0, 0)])
    out = b.alloc(4 * cfg.out_elem_bytes) // cfg.out_elem_bytes
    b.emit(_load(MemType.INP, 0, ib, 8))
    b.emit(_load(MemType.WGT, 0, wb, 4, push_next=True))
    b.emit(_load(MemType.UOP, 0, ub, 3))  # a compute-module load
    b.emit(GemmInsn(uop_bgn=0, uop_end=2, iter_out=4, dst_factor_out=1, src_factor_out=2,
                    pop_prev=True))
    for _ in range(3):
        b.emit(GemmInsn(uop_bgn=0, uop_end=2, iter_out=4, dst_factor_out=1, src_factor_out=2))
        b.emit(AluInsn(alu_op=AluOp.SHR, use_imm=True, imm=1, uop_bgn=2, uop_end=3, iter_out=4,
                       dst_factor_out=1))
    b.emit(AluInsn(alu_op=AluOp.MAX, use_imm=True, imm=-9, uop_bgn=2, uop_end=3, iter_out=4,
                   dst_factor_out=1, push_next=True))
    b.emit(_store(0, out, 4, pop_prev=True))
    b.emit(FinishInsn())
    return b.image()


@pytest.mark.parametrize("keep", ["all", "eight"])
def test_many_programs_decoded_once(keep, monkeypatch):
    """A model runs many programs in turn. Each distinct instruction word is decoded once
    per program; the programs stay decoded while they total at most _PROGRAM_CACHE_INSNS
    instructions (``all``: a second pass decodes nothing), else the least recently used
    beyond the last eight are decoded again (``eight``); either way every run equals the
    first run of its program on a fresh simulator."""
    from celosia.sim import fsim

    monkeypatch.setattr(fsim, "_PROGRAMS", {})
    monkeypatch.setattr(fsim, "_program_insns", [0])
    if keep == "eight":
        monkeypatch.setattr(fsim, "_PROGRAM_CACHE_INSNS", 0)
    calls = []
    decoder = fsim.decoder

    def counted(cfg):  # fsim decodes a program's words with decoder(cfg)
        decode = decoder(cfg)
        return lambda word, *a: calls.append(word) or decode(word, *a)
    monkeypatch.setattr(fsim, "decoder", counted)
    cfgs = [(SMALL, DEFAULT)[seed % 2] for seed in range(12)]
    images = [random_program(cfg, 100 + seed, n_body=25).image
              for seed, cfg in enumerate(cfgs[:-1])]
    images.append(_repeated_words_program(cfgs[-1]))
    first, repeats = [], 0
    for cfg, image in zip(cfgs, images):
        words = {image.dram[image.insn_addr + 16 * i:image.insn_addr + 16 * (i + 1)].tobytes()
                 for i in range(image.insn_count)}
        repeats += image.insn_count - len(words)
        before = len(calls)
        sim = CycleSimulator(cfg, image.dram.size)
        sim.write_dram(0, image.dram)
        first.append((sim.run(image.insn_addr, image.insn_count),
                      sim.read_dram(0, image.dram.size).tobytes()))
        assert len(calls) - before == len(words)
    assert repeats > 0
    before = len(calls)
    for k, (cfg, image) in enumerate(zip(cfgs, images)):
        for target in (CycleSimulator, FunctionalSimulator):
            sim = target(cfg, image.dram.size)
            sim.write_dram(0, image.dram)
            stats = sim.run(image.insn_addr, image.insn_count)
            assert sim.read_dram(0, image.dram.size).tobytes() == first[k][1]
            assert stats == (first[k][0] if target is CycleSimulator
                             else {key: first[k][0][key] for key in stats})
    assert (len(calls) == before) == (keep == "all")
    for target in (CycleSimulator, FunctionalSimulator):  # shared words: the reference's values
        _check(target(cfgs[-1], images[-1].dram.size), images[-1], cfgs[-1])
    assert len(fsim._PROGRAMS) == (12 if keep == "all" else 8)

# ---- statistics ---------------------------------------------------------------------------


def _previous_stats(tl, cfg, counters: dict) -> dict:
    """timeline_stats as it was before it kept its static part (one numpy pass per module);
    the current one must give exactly the same dictionary."""
    def split(begin, ready, end):
        mid = np.minimum(np.maximum(ready, begin), end)
        return mid - begin, mid

    def overlap(a0, a1, b0, b1):
        total = 0
        for s, e in zip(b0.tolist(), b1.tolist()):
            if e <= s:
                continue
            lo = int(np.searchsorted(a1, s, side="right"))
            hi = int(np.searchsorted(a0, e, side="left"))
            if hi > lo:
                total += int((np.minimum(a1[lo:hi], e) - np.maximum(a0[lo:hi], s)).clip(0).sum())
        return total

    t = tl.timing
    cycles = tl.cycles
    stats = {"cycles": cycles, "time_us": cycles / cfg.clock_mhz}
    n = len(tl.insns)
    bursts = tl.read_bursts()
    fetch_bursts = bursts[bursts[:, 0] == 0]
    gap_begin = np.concatenate(([0], tl.dispatch[:-1] + 1))
    data_wait, data_end = split(gap_begin, tl.avail, tl.dispatch)
    room_wait = tl.dispatch - gap_begin - data_wait
    fetch_bus = overlap(gap_begin, data_end, fetch_bursts[:, 2], fetch_bursts[:, 3])
    stats["fetch_busy_cycles"] = n
    stats["fetch_stall_dram_cycles"] = int(data_wait.sum()) - fetch_bus
    stats["fetch_stall_bus_cycles"] = fetch_bus
    for m, name in enumerate(MODULES):
        stats[f"fetch_stall_cmdq_full_{name}_cycles"] = int(room_wait[tl.module == m].sum())
    stats["fetch_idle_cycles"] = cycles - int(tl.dispatch[-1]) - 1
    writes = tl.writes or {}
    w_index = np.array(sorted(writes), np.int64)
    w_info = np.array([writes[j] for j in w_index.tolist()], np.int64).reshape(-1, 2)
    write_wait = np.zeros(n, np.int64)
    write_wait[w_index] = w_info[:, 1] * t.write_latency
    for m, name in enumerate(MODULES):
        mask = tl.module == m
        cmd, begin = split(tl.free[mask], tl.dispatch[mask] + 1, tl.start[mask])
        tokens = []
        for col in range(2):
            wait, begin = split(begin, tl.tok_ready[mask, col], tl.start[mask])
            tokens.append((tl.pop_q[mask, col], wait))
        begin = tl.done[mask]
        rooms = []
        for col in range(2):
            wait, begin = split(begin, tl.room_ready[mask, col], tl.push[mask])
            rooms.append((tl.push_q[mask, col], wait))
        run = tl.done[mask] - tl.start[mask]
        bus, dram = tl.rd_wait[mask], tl.rd_lat[mask] + write_wait[mask]
        row = {f"{name}_busy_cycles": int((run - bus - dram + 1).sum())}
        if name == "compute":  # GEMM/ALU: the pipeline's drain and the hazard stalls
            drain = sum(t.exec_stage + 1 for i in tl.insns if isinstance(i, (GemmInsn, AluInsn))
                        and i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn))
            hazard = sum(tl.stalls.values())
            row[f"{name}_busy_cycles"] -= drain + hazard
            row["compute_stall_pipeline_cycles"] = drain
            row["compute_stall_hazard_cycles"] = hazard
        row[f"{name}_stall_cmdq_empty_cycles"] = int(cmd.sum())
        for q in _POPS[name]:
            row[f"{name}_stall_token_{_QUEUE_ENDS[q][0]}_cycles"] = int(
                sum(w[qs == q].sum() for qs, w in tokens))
        for q in _PUSHES[name]:
            row[f"{name}_stall_push_{_QUEUE_ENDS[q][1]}_cycles"] = int(
                sum(w[qs == q].sum() for qs, w in rooms))
        row[f"{name}_stall_dram_cycles"] = int(dram.sum())
        if name != "store":
            row[f"{name}_stall_bus_cycles"] = int(bus.sum())
        row[f"{name}_idle_cycles"] = cycles - sum(row.values())
        stats.update(row)
    stats["gemm_utilization"] = counters["macs"] / (cycles * cfg.macs_per_cycle)
    fetch_beats = sum(sum(tl._batch(b).burst_beats) for b in range(len(tl.batches)))
    read_beats = fetch_beats + sum(p.beats for p in tl.plans if not isinstance(p, int))
    write_beats = int(w_info[:, 0].sum())
    read_bytes = n * 16 + sum(counters[f"{key}_load_bytes"] for key in _LOAD_BYTES.values())
    write_bytes = counters["out_store_bytes"]
    stats.update({
        "fetch_bytes": n * 16, "dram_read_bytes": read_bytes, "dram_write_bytes": write_bytes,
        "dram_read_beats": read_beats, "dram_write_beats": write_beats,
        "dram_read_bursts": int(bursts.shape[0]),
        "dram_read_bytes_per_cycle": read_bytes / cycles,
        "dram_write_bytes_per_cycle": write_bytes / cycles,
        "dram_read_channel_utilization": read_beats / cycles,
        "dram_write_channel_utilization": write_beats / cycles,
    })
    mem = np.array([int(i.mem_type) + (8 * int(i.opcode)) if isinstance(i, MemInsn) else -1
                    for i in tl.insns], np.int64)
    ran = tl.push + 1 - tl.start
    for mem_type, key in _LOAD_BYTES.items():
        c = int(ran[mem == int(mem_type)].sum())
        stats[f"{key}_load_bytes_per_cycle"] = counters[f"{key}_load_bytes"] / c if c else 0.0
    c = int(ran[mem == 8 + int(MemType.OUT)].sum())
    stats["out_store_bytes_per_cycle"] = write_bytes / c if c else 0.0
    return stats


@pytest.mark.parametrize("path", ["schedule", "python", "numpy"])
@pytest.mark.parametrize("name", ["small", "default", "tight"])
def test_statistics_equal_their_previous_implementation(name, path, monkeypatch):
    """Every way of summing: as the schedule goes (a run's statistics), and from the
    timeline alone (plain Python for short programs, numpy for long ones)."""
    monkeypatch.setattr(cycle_report, "_PYTHON_STATS", 10**9 if path == "python" else 0)
    cfg = {"small": SMALL, "default": DEFAULT,
           "tight": HwConfig(log_batch=1, log_block=3, log_inp_buff_size=12,
                             log_wgt_buff_size=13, log_acc_buff_size=13, log_uop_buff_size=10,
                             cmd_queue_depth=1, token_queue_depth=1)}[name]
    for seed in range(25):
        image = random_program(cfg, seed, n_body=40).image
        sim = CycleSimulator(cfg, image.dram.size)
        for _ in range(2):  # the second run uses the kept static part
            sim.write_dram(0, image.dram)
            stats = sim.run(image.insn_addr, image.insn_count)
            if path != "schedule":  # from the timeline alone, without the schedule's sums
                assert sim.timeline.sums is not None
                sim.timeline.sums = None
                again = sim._counters()
                again.update(cycle_report.timeline_stats(sim.timeline, cfg, again))
                assert again == stats, seed
                stats = again
            want = _previous_stats(sim.timeline, cfg, stats)
            assert {k: stats[k] for k in want} == want, seed
            assert list(stats)[-len(want):] == list(want)  # and in the same order


def test_max_cycles_on_a_program_with_kept_plans():
    """A program that ran once (its plans kept) fails a later run with a smaller max_cycles
    exactly as a fresh simulator does: same instruction, before the datapath runs it."""
    image = long_gemm_program(DEFAULT, 1, per=20)
    sim = CycleSimulator(DEFAULT, image.dram.size)
    sim.write_dram(0, image.dram)
    cycles = sim.run(image.insn_addr, image.insn_count)["cycles"]
    for limit in (10, 200, cycles - 1):
        fresh = CycleSimulator(DEFAULT, image.dram.size, max_cycles=limit)
        fresh.write_dram(0, image.dram)
        with pytest.raises(SimulationLimitError) as want:
            fresh.run(image.insn_addr, image.insn_count)
        sim.max_cycles = limit
        sim.write_dram(0, image.dram)
        with pytest.raises(SimulationLimitError) as got:
            sim.run(image.insn_addr, image.insn_count)
        assert str(got.value) == str(want.value)
        assert fresh.datapath.counters == sim.datapath.counters
    sim.max_cycles = cycles
    sim.write_dram(0, image.dram)
    assert sim.run(image.insn_addr, image.insn_count)["cycles"] == cycles
