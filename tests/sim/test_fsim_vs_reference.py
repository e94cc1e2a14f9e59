"""fsim against the naive reference interpreter (reference.py): random race-free programs and
targeted corner cases. Both must leave the same DRAM, the same on-chip buffers and the same
counters."""

import numpy as np
import pytest

from celosia import HwConfig
from celosia.isa import (AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop,
    buffer_depth, elem_bytes)
from celosia.sim.fsim import FunctionalSimulator
from programs import ProgramBuilder, random_program
from reference import RefRace, run_reference

SMALL = HwConfig.preset("small")
DEFAULT = HwConfig()
# Batch 2, block 8, and one-deep queues: every token hand-off and fetch stall is tight.
TIGHT = HwConfig(log_batch=1, log_block=3, log_inp_buff_size=12, log_wgt_buff_size=13,
                 log_acc_buff_size=13, log_uop_buff_size=10, cmd_queue_depth=1,
                 token_queue_depth=1)
CONFIGS = {"small": SMALL, "default": DEFAULT, "tight": TIGHT}


def run_both(image, cfg, schedule_seed=None):
    """Run on fsim and on the reference; assert identical DRAM, buffers and counters."""
    sim = FunctionalSimulator(cfg, image.dram.size)
    sim.write_dram(0, image.dram)
    counters = sim.run(image.insn_addr, image.insn_count)
    dram = sim.read_dram(0, image.dram.size)
    state = {}
    ref_dram, ref_counters = run_reference(image.dram, image.insn_addr, image.insn_count, cfg,
                                           schedule_seed=schedule_seed, state=state)
    if bytes(dram) != ref_dram:
        diff = np.flatnonzero(dram != np.frombuffer(ref_dram, np.uint8))
        pytest.fail(f"DRAM differs at {diff.size} bytes, first at {diff[:8].tolist()}")
    dp = sim.datapath
    for name, raw in (("uop", dp.uop_raw), ("inp", dp.inp_raw), ("wgt", dp.wgt_raw),
                      ("acc", dp.acc_raw), ("out", dp.out_raw)):
        if raw.tobytes() != state[name]:
            rows = np.flatnonzero((raw != np.frombuffer(state[name], np.uint8).reshape(raw.shape))
                                  .any(axis=1))
            pytest.fail(f"{name.upper()} buffer differs in rows {rows[:8].tolist()}")
    assert counters == ref_counters
    return dram, counters, state


# ---- random programs -------------------------------------------------------------------------


@pytest.mark.parametrize("name,count", [("small", 60), ("default", 40), ("tight", 40)])
def test_random_programs(name, count):
    cfg = CONFIGS[name]
    for seed in range(count):
        prog = random_program(cfg, seed)
        try:
            run_both(prog.image, cfg, schedule_seed=seed)
        except BaseException as exc:
            exc.add_note(f"config {name}, random_program seed {seed}")
            raise


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_random_programs_sweep(name):
    cfg = CONFIGS[name]
    for seed in range(1000, 1600):
        prog = random_program(cfg, seed, n_body=60)
        try:
            run_both(prog.image, cfg, schedule_seed=seed)
        except BaseException as exc:
            exc.add_note(f"config {name}, random_program seed {seed}, n_body 60")
            raise


def test_result_independent_of_schedule():
    """Race-free programs give the same result under any schedule the tokens allow."""
    for seed in range(8):
        prog = random_program(SMALL, seed, n_body=30)
        img = prog.image
        results = {run_reference(img.dram, img.insn_addr, img.insn_count, SMALL,
                                 schedule_seed=s)[0] for s in (None, 1, 2, 3)}
        assert len(results) == 1


def test_generated_programs_need_their_tokens():
    """The reference's race detector is live: without their tokens, generated programs race."""
    raced = 0
    for seed in range(10):
        prog = random_program(SMALL, seed)
        b = ProgramBuilder(SMALL)
        b.insns = [i.with_deps(pop_prev=False, pop_next=False, push_prev=False, push_next=False)
                   for i in prog.insns]
        img = b.image(insn_addr=prog.image.insn_addr, dram_size=prog.image.dram.size)
        dram = img.dram.copy()
        dram[:prog.image.insn_addr] = prog.image.dram[:prog.image.insn_addr]
        dram[img.insn_addr + 16 * img.insn_count:] = \
            prog.image.dram[img.insn_addr + 16 * img.insn_count:]
        try:
            run_reference(dram, img.insn_addr, img.insn_count, SMALL, schedule_seed=seed)
        except RefRace:
            raced += 1
    assert raced >= 8


# ---- targeted cases ------------------------------------------------------------------------


def _load(mt, sram, dram, y, x, stride=None, pads=(0, 0, 0, 0), **flags):
    return MemInsn(opcode=Opcode.LOAD, mem_type=mt, sram_base=sram, dram_base=dram, y_size=y,
                   x_size=x, x_stride=x if stride is None else stride, y_pad_0=pads[0],
                   y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3], **flags)


def _store(sram, dram, y, x, stride=None, **flags):
    return MemInsn(opcode=Opcode.STORE, mem_type=MemType.OUT, sram_base=sram, dram_base=dram,
                   y_size=y, x_size=x, x_stride=x if stride is None else stride, **flags)


def _acc_rows(b: ProgramBuilder, cfg, values) -> int:
    """Put int32 ACC rows (rows x BATCH*BLOCK) in DRAM; returns their dram_base."""
    arr = np.asarray(values, dtype=np.int64).astype("<i4").reshape(-1, cfg.batch * cfg.block)
    return b.data(arr, cfg.acc_elem_bytes) // cfg.acc_elem_bytes


def _acc_program(cfg, values, uops, alu: AluInsn, extra=()):
    """Load ACC rows, run one ALU over micro-ops, FINISH; returns the final ACC (int32)."""
    b = ProgramBuilder(cfg)
    base = _acc_rows(b, cfg, values)
    ubase = b.uops(uops)
    n = len(values)
    b.emit(_load(MemType.ACC, 0, base, 1, n))
    b.emit(_load(MemType.UOP, 0, ubase, 1, len(uops)))
    b.emit(alu)
    for insn in extra:
        b.emit(insn)
    b.emit(FinishInsn())
    _, _, state = run_both(b.image(), cfg)
    lanes = cfg.batch * cfg.block
    acc = np.frombuffer(state["acc"], "<i4").reshape(-1, lanes)
    out = np.frombuffer(state["out"], np.int8).reshape(-1, lanes)
    return acc, out


def _wrap(v):
    return ((np.asarray(v, dtype=np.int64) + 2**31) % 2**32 - 2**31)


def test_alu_prefix_sum_chain():
    """Micro-op k reads the row micro-op k-1 just wrote (the in-order rule)."""
    cfg = SMALL
    rng = np.random.default_rng(1)
    values = rng.integers(-2**31, 2**31, (12, cfg.block))
    uops = [Uop(k, k - 1) for k in range(1, 12)]
    acc, out = _acc_program(cfg, values, uops, AluInsn(alu_op=AluOp.ADD, uop_bgn=0, uop_end=11))
    expect = _wrap(np.cumsum(values, axis=0))
    assert np.array_equal(acc[:12], expect)
    assert np.array_equal(out[1:12], expect[1:].astype(np.int8))  # row 0 only loaded: no OUT


def test_alu_chain_through_loop_factors():
    """The same chain made by iter_in: iteration j reads what iteration j-1 wrote."""
    cfg = SMALL
    values = np.arange(1, 9)[:, None] * np.ones((1, cfg.block), np.int64)
    acc, _ = _acc_program(cfg, values, [Uop(1, 0)],
                          AluInsn(alu_op=AluOp.ADD, uop_bgn=0, uop_end=1, iter_in=7,
                                  dst_factor_in=1, src_factor_in=1))
    assert acc[:8, 0].tolist() == np.cumsum(np.arange(1, 9)).tolist()


def test_alu_duplicated_dst_and_self_source():
    cfg = SMALL
    values = [[3] * cfg.block, [5] * cfg.block, [7] * cfg.block]
    uops = [Uop(0, 1), Uop(0, 1), Uop(0, 1), Uop(2, 2), Uop(2, 2), Uop(2, 2)]
    acc, _ = _acc_program(cfg, values, uops, AluInsn(alu_op=AluOp.ADD, uop_bgn=0, uop_end=6))
    assert acc[0, 0] == 3 + 3 * 5
    assert acc[2, 0] == 7 * 8  # doubled three times, each micro-op seeing the last
    acc, _ = _acc_program(cfg, values, [Uop(1, 0), Uop(0, 1), Uop(1, 0)],
                          AluInsn(alu_op=AluOp.MUL, uop_bgn=0, uop_end=3))
    assert (acc[1, 0], acc[0, 0]) == (3 * 3 * 5 * 15, 3 * 15)


def _shr(x, y):
    if y >= 0:
        return x >> min(y, 31)
    return int(_wrap(x << min(-y, 31)))


SHIFT_VALUES = [-2**31, -2**31 + 1, -5, -1, 0, 1, 7, 0x12345678, 2**31 - 1]


@pytest.mark.parametrize("amount", [-40, -33, -32, -31, -30, -17, -1, 0, 1, 5, 30, 31, 32, 33,
                                    40, 32767, -32768])
def test_shr_immediate(amount):
    cfg = SMALL
    values = np.resize(np.array(SHIFT_VALUES, np.int64), (3, cfg.block))
    acc, out = _acc_program(cfg, values, [Uop(0, 0), Uop(1, 0), Uop(2, 0)],
                            AluInsn(alu_op=AluOp.SHR, use_imm=True, imm=amount, uop_bgn=0,
                                    uop_end=3))
    expect = [[_shr(int(x), amount) for x in row] for row in values]
    assert acc[:3].tolist() == expect
    assert out[:3].tolist() == np.array(expect).astype(np.int8).tolist()


def test_shr_tensor_amounts():
    """Shift amounts from ACC: every 32-bit amount, including -2^31 and amounts >= 32."""
    cfg = SMALL
    amounts = [-2**31, -2**31 + 1, -100, -33, -32, -31, -1, 0, 1, 31, 32, 33, 100, 2**31 - 1]
    rows = []
    for a in amounts:
        rows.append(np.resize(np.array(SHIFT_VALUES, np.int64), cfg.block))
        rows.append(np.full(cfg.block, a, np.int64))
    n = len(amounts)
    uops = [Uop(2 * k, 2 * k + 1) for k in range(n)]
    acc, _ = _acc_program(cfg, rows, uops, AluInsn(alu_op=AluOp.SHR, uop_bgn=0, uop_end=n))
    for k, a in enumerate(amounts):
        assert acc[2 * k].tolist() == [_shr(int(x), a) for x in rows[2 * k]], a


@pytest.mark.parametrize("op", [AluOp.ADD, AluOp.MUL, AluOp.MIN, AluOp.MAX])
def test_alu_wrap_and_signed_compare(op):
    cfg = SMALL
    edge = np.array([2**31 - 1, -2**31, -1, 1, 65536, -65537, 46341, 0], np.int64)
    x = np.resize(edge, (4, cfg.block))
    y = np.roll(x, 1)
    rows = np.concatenate([x, y])
    imm = -32768 if op == AluOp.MUL else 32767
    uops = [Uop(k, 4 + k) for k in range(4)]
    acc, _ = _acc_program(cfg, rows, uops, AluInsn(alu_op=op, uop_bgn=0, uop_end=4))
    fn = {AluOp.ADD: np.add, AluOp.MUL: np.multiply, AluOp.MIN: np.minimum,
          AluOp.MAX: np.maximum}[op]
    expect = _wrap(fn(x.astype(object), y.astype(object)).astype(object) % 2**32)
    assert acc[:4].tolist() == expect.tolist()
    acc, _ = _acc_program(cfg, rows, [Uop(0, 0)],
                          AluInsn(alu_op=op, use_imm=True, imm=imm, uop_bgn=0, uop_end=1,
                                  iter_out=4, dst_factor_out=1))
    expect = _wrap(fn(x.astype(object), imm).astype(object) % 2**32)
    assert acc[:4].tolist() == expect.tolist()


def test_gemm_repeated_dst_rows_and_wrap():
    """Several micro-ops and loop iterations accumulate into the same ACC row."""
    cfg = SMALL
    n = cfg.block
    rng = np.random.default_rng(7)
    inp = rng.integers(-128, 128, (6, cfg.batch, n)).astype(np.int8)
    wgt = rng.integers(-128, 128, (5, n, n)).astype(np.int8)
    acc0 = np.full((3, cfg.batch * n), 2**31 - 1000, np.int64)  # near the top: sums wrap
    b = ProgramBuilder(cfg)
    ib = b.data(inp, cfg.inp_elem_bytes) // cfg.inp_elem_bytes
    wb = b.data(wgt, cfg.wgt_elem_bytes) // cfg.wgt_elem_bytes
    ab = _acc_rows(b, cfg, acc0)
    uops = [Uop(0, 1, 2), Uop(0, 3, 4), Uop(0, 1, 2), Uop(2, 0, 0), Uop(2, 0, 0)]
    ub = b.uops(uops)
    b.emit(_load(MemType.INP, 0, ib, 1, 6))
    b.emit(_load(MemType.WGT, 0, wb, 1, 5, push_next=True))
    b.emit(_load(MemType.ACC, 0, ab, 1, 3))
    b.emit(_load(MemType.UOP, 0, ub, 1, 5))
    # Two outer iterations with dst factor 0 and src factor 1: row 0 gets six products.
    b.emit(GemmInsn(uop_bgn=0, uop_end=5, iter_out=2, src_factor_out=1, wgt_factor_in=0,
                    pop_prev=True))
    b.emit(FinishInsn())
    _, counters, state = run_both(b.image(), cfg)
    acc = np.frombuffer(state["acc"], "<i4").reshape(-1, cfg.batch, n)
    expect = acc0.reshape(3, cfg.batch, n).copy()
    i64 = lambda a: a.astype(np.int64)  # noqa: E731
    for i in range(2):
        for u in uops:
            expect[u.dst] += i64(inp[u.src + i]) @ i64(wgt[u.wgt]).T
    assert np.array_equal(acc[:3], _wrap(expect))
    assert counters["gemm_uops"] == 10 and counters["macs"] == 10 * cfg.macs_per_cycle


def test_gemm_reset_clears_acc_and_out():
    cfg = SMALL
    b = ProgramBuilder(cfg)
    ab = _acc_rows(b, cfg, np.full((4, cfg.block), -77))
    ub = b.uops([Uop(0, 0), Uop(3, 0)])
    b.emit(_load(MemType.ACC, 0, ab, 1, 4))
    b.emit(_load(MemType.UOP, 0, ub, 1, 2))
    b.emit(AluInsn(alu_op=AluOp.ADD, use_imm=True, imm=0, uop_bgn=0, uop_end=1, iter_out=4,
                   dst_factor_out=1))
    b.emit(GemmInsn(reset=True, uop_bgn=0, uop_end=2))
    b.emit(FinishInsn())
    _, counters, state = run_both(b.image(), cfg)
    acc = np.frombuffer(state["acc"], "<i4").reshape(-1, cfg.block)
    out = np.frombuffer(state["out"], np.int8).reshape(-1, cfg.block)
    assert acc[:4, 0].tolist() == [0, -77, -77, 0] and out[:4, 0].tolist() == [0, -77, -77, 0]
    assert counters["gemm_uops"] == 0  # reset micro-ops are not counted


PADS = [(p, q, r, s) for k in range(4) for v in range(16)
        for p, q, r, s in [tuple(v if i == k else (k + v) % 3 for i in range(4))]]


@pytest.mark.parametrize("mt", [MemType.INP, MemType.WGT, MemType.ACC, MemType.ACC_8BIT,
                                MemType.UOP])
def test_load_every_padding(mt):
    """Each pad 0..15 with the others small, plus random combinations, for every type."""
    cfg = DEFAULT
    rng = np.random.default_rng(int(mt))
    cases = PADS + [tuple(int(v) for v in rng.integers(0, 16, 4)) for _ in range(20)]
    eb = elem_bytes(cfg, mt)
    depth = buffer_depth(cfg, mt)
    b = ProgramBuilder(cfg)
    src = b.data(rng.integers(0, 256, 40 * eb, dtype=np.uint8), eb) // eb
    if mt == MemType.UOP:  # micro-op words are data here; keep them any 32-bit value
        pass
    load_module = mt in (MemType.INP, MemType.WGT)
    for k, pads in enumerate(cases):
        y, x = 1 + k % 3, 1 + k % 4
        rows = (pads[0] + y + pads[1]) * (pads[2] + x + pads[3])
        sram = (k * 37) % max(1, depth - rows)
        if rows > depth:
            continue
        b.emit(_load(mt, sram, src + k % 5, y, x, stride=x + k % 3, pads=pads))
    b.emit(FinishInsn())
    assert len(b.insns) > 60 or load_module
    run_both(b.image(), cfg)


@pytest.mark.parametrize("cfg", [SMALL, TIGHT], ids=["small", "tight"])
def test_loads_overlapping_and_zero_strides(cfg):
    rng = np.random.default_rng(3)
    b = ProgramBuilder(cfg)
    for mt in (MemType.INP, MemType.WGT, MemType.ACC, MemType.ACC_8BIT, MemType.UOP):
        eb = elem_bytes(cfg, mt)
        src = b.data(rng.integers(0, 256, 16 * eb, dtype=np.uint8), eb) // eb
        b.emit(_load(mt, 0, src, 3, 4, stride=1))  # rows overlap in DRAM
        b.emit(_load(mt, 12, src, 3, 4, stride=0))  # the same row three times
        b.emit(_load(mt, 24, src + 2, 2, 5, stride=3, pads=(1, 0, 2, 1)))
    b.emit(FinishInsn())
    run_both(b.image(), cfg)


def test_zero_size_noops_and_pad_only_loads():
    """x_size = 0 touches nothing, whatever the other fields; y_size = 0 with x_size > 0 writes
    only the padding rows; STORE with y_size = 0 writes nothing."""
    cfg = SMALL
    b = ProgramBuilder(cfg)
    rng = np.random.default_rng(5)
    for mt in (MemType.INP, MemType.WGT, MemType.ACC, MemType.ACC_8BIT, MemType.UOP):
        eb = elem_bytes(cfg, mt)
        src = b.data(rng.integers(1, 256, 8 * eb, dtype=np.uint8), eb) // eb
        b.emit(_load(mt, 0, src, 2, 4))
        b.emit(_load(mt, 0xFFFF, 0xFFFFFFFF, 0xFFFF, 0, stride=0xFFFF, pads=(15, 15, 15, 15)))
        b.emit(_load(mt, 1, 0xFFFFFFFF, 0, 2, stride=7, pads=(1, 1, 1, 0)))  # zeros only
    b.emit(GemmInsn(uop_bgn=5, uop_end=5, iter_out=3, iter_in=3))
    b.emit(AluInsn(uop_bgn=0, uop_end=4, iter_out=0, iter_in=9, dst_factor_in=100))
    b.emit(_store(0xFFFF, 0xFFFFFFFF, 0xFFFF, 0, stride=0xFFFF))
    b.emit(_store(0, 0xFFFFFFFF, 0, 3, stride=9))
    b.emit(FinishInsn())
    img = b.image()
    dram, counters, state = run_both(img, cfg)
    assert np.array_equal(dram, img.dram)
    inp = np.frombuffer(state["inp"], np.uint8).reshape(cfg.inp_depth, -1)
    assert not inp[1:7].any() and inp[0].any() and inp[7].any()


def test_store_overlapping_rows_later_row_wins():
    cfg = SMALL
    b = ProgramBuilder(cfg)
    ab = _acc_rows(b, cfg, np.arange(8)[:, None] * np.ones((1, cfg.block), np.int64) + 1)
    ub = b.uops([Uop(0, 0)])
    out = b.alloc(32 * cfg.out_elem_bytes, cfg.out_elem_bytes) // cfg.out_elem_bytes
    b.emit(_load(MemType.ACC, 0, ab, 1, 8))
    b.emit(_load(MemType.UOP, 0, ub, 1, 1))
    b.emit(AluInsn(alu_op=AluOp.ADD, use_imm=True, imm=0, uop_bgn=0, uop_end=1, iter_out=8,
                   dst_factor_out=1, push_next=True))
    b.emit(_store(0, out, 4, 2, stride=1, pop_prev=True))  # rows overlap by one element
    b.emit(_store(0, out + 10, 2, 4, stride=0))  # both rows onto the same place
    b.emit(FinishInsn())
    dram, _, _ = run_both(b.image(), cfg)
    eb = cfg.out_elem_bytes
    got = dram[out * eb:(out + 14) * eb].reshape(14, eb)[:, 0].tolist()
    assert got[:5] == [1, 3, 5, 7, 8]
    assert got[10:14] == [5, 6, 7, 8]
