"""One test per illegal condition of ISA.md section 4 (and deadlocks, section 3): fsim raises
ProgramError (DeadlockError) naming the instruction and the rule, and the reference
interpreter rejects the same instruction."""

import numpy as np
import pytest

from celosia import DeadlockError, HwConfig, ProgramError
from celosia.image import ProgramImage
from celosia.isa import (AluInsn, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop,
                         buffer_depth, elem_bytes, insn_layout)
from celosia.sim.base import run_image
from programs import ProgramBuilder
from reference import RefDeadlock, RefIllegal, run_reference

SMALL = HwConfig.preset("small")


def expect_illegal(img: ProgramImage, index, phrase: str, cfg=SMALL, error=ProgramError):
    with pytest.raises(error) as info:
        run_image(img, "fsim", cfg)
    exc = info.value
    assert exc.index == index, str(exc)
    assert phrase in str(exc), str(exc)
    if index is not None:
        assert f"instruction {index}" in str(exc)
    ref_error = RefDeadlock if error is DeadlockError else RefIllegal
    with pytest.raises(ref_error) as ref:
        run_reference(img.dram, img.insn_addr, img.insn_count, cfg, check_races=False)
    if ref_error is RefIllegal:
        assert ref.value.index == index, str(ref.value)
    return exc, ref.value


def program(*insns, cfg=SMALL, uops=(), dram_size=None) -> ProgramImage:
    b = ProgramBuilder(cfg)
    b.alloc(4096)  # data area: loads below read zeros from here
    if uops:
        base = b.uops(list(uops))
        b.emit(load(MemType.UOP, 0, base, 1, len(uops)))
    for insn in insns:
        b.emit(insn)
    return b.image(dram_size=dram_size)


def load(mt, sram=0, dram=0, y=1, x=1, stride=None, pads=(0, 0, 0, 0), **flags):
    return MemInsn(opcode=Opcode.LOAD, mem_type=mt, sram_base=sram, dram_base=dram, y_size=y,
                   x_size=x, x_stride=x if stride is None else stride, y_pad_0=pads[0],
                   y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3], **flags)


def store(sram=0, dram=0, y=1, x=1, stride=None, mt=MemType.OUT, pads=(0, 0, 0, 0), **flags):
    return MemInsn(opcode=Opcode.STORE, mem_type=mt, sram_base=sram, dram_base=dram, y_size=y,
                   x_size=x, x_stride=x if stride is None else stride, y_pad_0=pads[0],
                   y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3], **flags)


def patch(img: ProgramImage, index: int, lo: int, width: int, value: int) -> ProgramImage:
    """The image with bits [lo, lo + width) of instruction ``index`` set to ``value``."""
    dram = img.dram.copy()
    at = img.insn_addr + 16 * index
    word = int.from_bytes(dram[at:at + 16].tobytes(), "little")
    word = word & ~(((1 << width) - 1) << lo) | value << lo
    dram[at:at + 16] = np.frombuffer(word.to_bytes(16, "little"), np.uint8)
    return ProgramImage(dram, img.insn_addr, img.insn_count)


FIN = FinishInsn()


# ---- decoding ----------------------------------------------------------------------------


@pytest.mark.parametrize("opcode", [5, 6, 7])
def test_undefined_opcode(opcode):
    img = patch(program(load(MemType.INP), load(MemType.WGT), FIN), 1, 0, 3, opcode)
    expect_illegal(img, 1, f"opcode {opcode} is not defined")


@pytest.mark.parametrize("mem_type", [6, 7])
@pytest.mark.parametrize("opcode", [Opcode.LOAD, Opcode.STORE])
def test_undefined_memory_type(opcode, mem_type):
    insn = load(MemType.INP) if opcode == Opcode.LOAD else store()
    img = patch(program(insn, FIN), 0, 7, 3, mem_type)
    expect_illegal(img, 0, f"memory type {mem_type} is not defined")


@pytest.mark.parametrize("alu_op", [5, 6, 7])
def test_undefined_alu_opcode(alu_op):
    lay = insn_layout(SMALL).alu["alu_op"]
    img = patch(program(AluInsn(uop_bgn=0, uop_end=0), FIN), 0, lay[0], lay[1], alu_op)
    expect_illegal(img, 0, f"ALU opcode {alu_op} is not defined")


# ---- LOAD / STORE types and padding ---------------------------------------------------------


def test_load_of_out():
    expect_illegal(program(load(MemType.INP), load(MemType.OUT), FIN), 1,
                   "LOAD of memory type OUT is illegal")


@pytest.mark.parametrize("mt", [MemType.UOP, MemType.WGT, MemType.INP, MemType.ACC,
                                MemType.ACC_8BIT])
def test_store_of_non_out(mt):
    expect_illegal(program(store(mt=mt), FIN), 0, f"STORE of memory type {mt.name} is illegal")


@pytest.mark.parametrize("pad", range(4))
def test_store_with_padding(pad):
    pads = tuple(1 if i == pad else 0 for i in range(4))
    expect_illegal(program(store(), store(pads=pads), FIN), 1, "STORE must have zero padding")


def test_store_padding_is_illegal_even_for_a_noop():
    expect_illegal(program(store(x=0, pads=(0, 0, 0, 3)), FIN), 0, "zero padding")


# ---- SRAM ranges of LOAD / STORE --------------------------------------------------------------


@pytest.mark.parametrize("mt", [MemType.UOP, MemType.WGT, MemType.INP, MemType.ACC,
                                MemType.ACC_8BIT])
@pytest.mark.parametrize("how", ["base", "rows", "pads"])
def test_load_past_buffer_end(mt, how):
    depth = buffer_depth(SMALL, mt)
    buf = "ACC" if mt == MemType.ACC_8BIT else mt.name
    if how == "base":  # the last row fits; one more does not
        ok, bad = load(mt, sram=depth - 1), load(mt, sram=depth)
    elif how == "rows":
        ok, bad = load(mt, sram=depth - 6, y=2, x=3), load(mt, sram=depth - 5, y=2, x=3)
    else:  # 3 rows of 1 + 1 + 2 elements: 12 rows
        ok = load(mt, sram=depth - 12, y=1, x=1, pads=(1, 1, 1, 2))
        bad = load(mt, sram=depth - 12, y=1, x=1, pads=(1, 1, 2, 2))
    expect_illegal(program(ok, bad, FIN), 1, f"past the end of the {buf} buffer ({depth} rows)")


def test_store_past_out_end():
    depth = SMALL.acc_depth
    img = program(store(sram=depth - 6, y=2, x=3), store(sram=depth - 5, y=2, x=3), FIN)
    expect_illegal(img, 1, f"past the end of the OUT buffer ({depth} rows)")


# ---- DRAM ranges --------------------------------------------------------------------------------


@pytest.mark.parametrize("mt", [MemType.UOP, MemType.WGT, MemType.INP, MemType.ACC,
                                MemType.ACC_8BIT, MemType.OUT])
def test_dram_access_outside_dram(mt):
    size = 1 << 16
    eb = elem_bytes(SMALL, mt)
    make = store if mt == MemType.OUT else (lambda **kw: load(mt, **kw))
    last = size // eb  # elements in DRAM
    ok = make(dram=last - 10, y=3, x=2, stride=4)  # ends exactly at the end of DRAM
    bad = make(dram=last - 9, y=3, x=2, stride=4)
    img = program(ok, bad, FIN, dram_size=size)
    assert img.dram.size == size
    expect_illegal(img, 1, f"past the end of the {size}-byte DRAM")


def test_dram_base_beyond_dram():
    img = program(load(MemType.INP, dram=0xFFFFFFFF), FIN, dram_size=1 << 16)
    expect_illegal(img, 0, "past the end of the 65536-byte DRAM")


# ---- micro-op ranges and GEMM / ALU indices -----------------------------------------------------


def test_uop_end_past_uop_buffer():
    depth = SMALL.uop_depth
    img = program(GemmInsn(uop_bgn=0, uop_end=depth), GemmInsn(uop_bgn=0, uop_end=depth + 1), FIN)
    expect_illegal(img, 1, f"uop_end={depth + 1} is past the end of the UOP buffer")


@pytest.mark.parametrize("cls", [GemmInsn, AluInsn])
def test_uop_bgn_after_uop_end(cls):
    img = program(cls(uop_bgn=3, uop_end=3), cls(uop_bgn=4, uop_end=3), FIN)
    expect_illegal(img, 1, "uop_bgn=4 is greater than uop_end=3")


GEMM_LOOP_CASES = {
    # field: (micro-op, factors), depth
    "dst": (Uop(5, 0, 0), dict(dst_factor_out=SMALL.acc_depth - 6), "ACC", SMALL.acc_depth),
    "src": (Uop(0, 5, 0), dict(src_factor_in=SMALL.inp_depth - 6), "INP", SMALL.inp_depth),
    "wgt": (Uop(0, 0, 5), dict(wgt_factor_out=SMALL.wgt_depth - 6), "WGT", SMALL.wgt_depth),
}


@pytest.mark.parametrize("field", sorted(GEMM_LOOP_CASES))
def test_gemm_index_out_of_range_by_loop_factor(field):
    uop, factors, buf, depth = GEMM_LOOP_CASES[field]
    ok = GemmInsn(uop_bgn=0, uop_end=1, iter_out=2, iter_in=2, **factors)
    bad_factors = {k: v + 1 for k, v in factors.items()}
    bad = GemmInsn(uop_bgn=0, uop_end=1, iter_out=2, iter_in=2, **bad_factors)
    img = program(ok, bad, FIN, uops=[uop])
    exc, _ = expect_illegal(img, 2, f"uses {buf} row {depth} as {field}, outside the {buf} buffer")
    assert "GEMM micro-op 0" in str(exc)


def test_gemm_src_out_of_range_by_micro_op():
    """With INP shallower than ACC, the micro-op's src field can name a missing INP row."""
    cfg = HwConfig.from_dict({**SMALL.to_dict(), "log_inp_buff_size": 8})  # 64 INP rows
    assert cfg.inp_depth == 64 and cfg.uop_src_bits == 7
    img = program(GemmInsn(uop_bgn=0, uop_end=1), GemmInsn(uop_bgn=1, uop_end=2), FIN, cfg=cfg,
                  uops=[Uop(0, 63, 0), Uop(0, 64, 0)])
    expect_illegal(img, 2, "uses INP row 64 as src", cfg=cfg)


def test_alu_src_out_of_range_by_micro_op():
    """With INP deeper than ACC, the micro-op's src field can name a missing ACC row."""
    cfg = HwConfig.from_dict({**SMALL.to_dict(), "log_inp_buff_size": 10})  # 256 INP rows
    assert cfg.acc_depth == 128 and cfg.uop_src_bits == 8
    img = program(AluInsn(uop_bgn=0, uop_end=1), AluInsn(uop_bgn=1, uop_end=2), FIN, cfg=cfg,
                  uops=[Uop(0, 127), Uop(0, 200)])
    expect_illegal(img, 2, "uses ACC row 200 as src", cfg=cfg)


@pytest.mark.parametrize("field", ["dst", "src"])
def test_alu_index_out_of_range_by_loop_factor(field):
    depth = SMALL.acc_depth
    ok = AluInsn(uop_bgn=0, uop_end=1, iter_in=3, **{f"{field}_factor_in": (depth - 4) // 2})
    bad = AluInsn(uop_bgn=0, uop_end=1, iter_in=3, **{f"{field}_factor_in": (depth - 2) // 2})
    img = program(ok, bad, FIN, uops=[Uop(2, 2)])
    expect_illegal(img, 2, f"uses ACC row {depth} as {field}, outside the ACC buffer")


# ---- flags on the wrong module --------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["pop_prev", "push_prev"])
@pytest.mark.parametrize("mt", [MemType.INP, MemType.WGT])
def test_load_module_with_prev_flag(mt, flag):
    # LOAD of UOP and ACC belong to compute, where prev flags are legal.
    img = program(load(MemType.UOP), load(MemType.ACC), load(mt, **{flag: True}), FIN)
    expect_illegal(img, 2, "a load-module instruction has no previous module")


@pytest.mark.parametrize("flag", ["pop_next", "push_next"])
def test_store_with_next_flag(flag):
    expect_illegal(program(store(), store(**{flag: True}), FIN), 1,
                   "a store instruction has no next module")


# ---- FINISH ---------------------------------------------------------------------------------------


def test_program_without_finish():
    expect_illegal(program(load(MemType.INP), GemmInsn()), 1,
                   "the program does not end with FINISH")


def test_instruction_after_finish():
    expect_illegal(program(load(MemType.INP), FIN, store(), FIN), 2,
                   "instruction fetched after FINISH")


# ---- deadlocks ------------------------------------------------------------------------------------


def test_deadlock_pop_without_push():
    img = program(load(MemType.INP), GemmInsn(pop_prev=True), FIN)
    exc, ref = expect_illegal(img, 1, "load->compute (empty)", error=DeadlockError)
    assert [(m, i) for m, i, _ in exc.waiting] == [("compute", 1)]
    assert [(m, i) for m, i, _ in ref.waiting] == [("compute", 1)]


def test_deadlock_store_waits_forever():
    img = program(load(MemType.INP), store(pop_prev=True), FIN)
    exc, _ = expect_illegal(img, 1, "compute->store (empty)", error=DeadlockError)
    assert exc.waiting[0][:2] == ("store", 1)


def test_deadlock_full_token_queue():
    depth = SMALL.token_queue_depth
    loads = [load(MemType.INP, push_next=True) for _ in range(depth + 1)]
    img = program(*loads, FIN)
    exc, ref = expect_illegal(img, depth, f"load->compute (full, {depth} tokens)",
                              error=DeadlockError)
    assert [m for m, _, _ in exc.waiting] == ["load"]
    assert [m for m, _, _ in ref.waiting] == ["load"]


def test_full_token_queue_drained_later_is_not_a_deadlock():
    depth = SMALL.token_queue_depth
    loads = [load(MemType.INP, push_next=True) for _ in range(depth + 1)]
    img = program(*loads, GemmInsn(pop_prev=True), FIN)
    run_image(img, "fsim", SMALL)
    run_reference(img.dram, img.insn_addr, img.insn_count, SMALL, check_races=False)


def test_deadlock_full_command_queue_starves_producer():
    """Compute waits for a token the load module would push, but the load instruction sits
    behind a full compute command queue: fetch stalls and nobody moves."""
    depth = SMALL.cmd_queue_depth
    body = [GemmInsn(pop_prev=True)] + [GemmInsn() for _ in range(depth)]
    img = program(*body, load(MemType.INP, push_next=True), FIN)
    exc, ref = expect_illegal(img, 0, "room in the compute command queue", error=DeadlockError)
    assert [(m, i) for m, i, _ in exc.waiting] == [("compute", 0), ("fetch", depth)]
    assert [(m, i) for m, i, _ in ref.waiting] == [("compute", 0), ("fetch", depth)]
    # One fewer instruction in between and the same program runs.
    img = program(*body[:-1], load(MemType.INP, push_next=True), FIN)
    run_image(img, "fsim", SMALL)


def test_deadlock_cycle_between_modules():
    img = program(load(MemType.INP, pop_next=True, push_next=True),
                  GemmInsn(pop_prev=True, push_prev=True), FIN)
    exc, _ = expect_illegal(img, 0, "compute->load (empty)", error=DeadlockError)
    assert {m for m, _, _ in exc.waiting} == {"load", "compute"}
