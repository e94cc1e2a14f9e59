"""Dependency tokens: pending-pop absorption, push flags, NOP insertion, the final sync."""

import pytest

from celosia.driver import Device, nop
from celosia.errors import CelosiaError, DeadlockError
from celosia.isa import (
    AluOp, FinishInsn, MemInsn, MemType, Module, Opcode, decode_program, module_of,
)

L, C, S = Module.LOAD, Module.COMPUTE, Module.STORE


def flags(insn):
    return {n for n, on in zip(("pop_prev", "pop_next", "push_prev", "push_next"), insn.deps) if on}


def is_nop(insn, stage):
    return isinstance(insn, MemInsn) and insn.x_size == 0 and module_of(insn) == stage


@pytest.fixture
def dev():
    d = Device("default", dram_size=1 << 20)
    d.inp = d.alloc(64 * 16)
    d.acc = d.alloc(64 * 64)
    d.out = d.alloc(64 * 16)
    return d


def load_inp(d):
    d.load_2d(d.inp, 0, 1, 1, 1, sram_index=0, mem_type=MemType.INP)


def load_acc(d):
    d.load_2d(d.acc, 0, 1, 1, 1, sram_index=0, mem_type=MemType.ACC)


def store(d):
    d.store_2d(0, d.out, 0, 1, 1, 1)


def test_nop_shapes():
    assert (nop(L).opcode, nop(L).mem_type) == (Opcode.LOAD, MemType.INP)
    assert (nop(C).opcode, nop(C).mem_type) == (Opcode.LOAD, MemType.UOP)
    assert (nop(S).opcode, nop(S).mem_type) == (Opcode.STORE, MemType.OUT)
    assert all(module_of(nop(m)) == m and nop(m).x_size == 0 for m in Module)


def test_pending_pop_absorbed_by_next_insn_of_stage(dev):
    dev.dep_pop(C, L)
    load_acc(dev)  # compute stage: does not absorb the load stage's pop
    load_inp(dev)
    insns = dev.instructions
    assert flags(insns[0]) == set() and flags(insns[1]) == {"pop_next"}
    dev.dep_pop(L, C)
    dev.dep_pop(S, C)
    load_acc(dev)  # absorbs both kinds at once
    assert flags(dev.instructions[-1]) == {"pop_prev", "pop_next"}


def test_second_pending_pop_commits_a_nop(dev):
    dev.dep_pop(L, C)
    dev.dep_pop(L, C)
    load_acc(dev)
    insns = dev.instructions
    assert len(insns) == 2
    assert is_nop(insns[0], C) and flags(insns[0]) == {"pop_prev"}
    assert flags(insns[1]) == {"pop_prev"}


def test_push_sets_flag_on_last_insn_of_stage(dev):
    load_inp(dev)
    dev.dep_push(L, C)
    assert len(dev.instructions) == 1 and flags(dev.instructions[0]) == {"push_next"}
    dev.dep_push(L, C)  # already carries it: a NOP of the load stage
    assert is_nop(dev.instructions[1], L) and flags(dev.instructions[1]) == {"push_next"}
    dev.dep_push(C, S)  # last insn is not compute: compute NOP
    assert is_nop(dev.instructions[2], C) and flags(dev.instructions[2]) == {"push_next"}
    store(dev)
    dev.dep_push(S, C)
    assert flags(dev.instructions[3]) == {"push_prev"} and len(dev.instructions) == 4
    dev.dep_push(C, L)  # on an empty compute history: NOP
    assert is_nop(dev.instructions[4], C) and flags(dev.instructions[4]) == {"push_prev"}


def test_push_commits_pending_pops_of_its_stage(dev):
    store(dev)
    dev.dep_pop(C, S)
    dev.dep_push(S, C)
    insns = dev.instructions
    assert len(insns) == 2 and flags(insns[0]) == set()
    assert is_nop(insns[1], S) and flags(insns[1]) == {"pop_prev", "push_prev"}


def test_gemm_pop_absorbed_by_its_uop_load(dev):
    dev.dep_pop(L, C)
    dev.gemm("g", lambda k: k.push(0, 0, 0))
    dev.dep_push(C, S)
    dev.dep_pop(L, C)
    dev.gemm("g", None)  # resident: the GEMM itself absorbs the pop
    uop_load, gemm1, gemm2 = dev.instructions
    assert uop_load.mem_type == MemType.UOP and flags(uop_load) == {"pop_prev"}
    assert flags(gemm1) == {"push_next"}
    assert flags(gemm2) == {"pop_prev"}


def test_bad_module_pairs(dev):
    with pytest.raises(CelosiaError, match="no token queue between LOAD and STORE"):
        dev.dep_push(L, S)
    with pytest.raises(CelosiaError, match="no token queue between STORE and LOAD"):
        dev.dep_pop(S, L)
    with pytest.raises(CelosiaError, match="no token queue between COMPUTE and COMPUTE"):
        dev.dep_pop(C, C)
    with pytest.raises(CelosiaError, match="modules must be Module"):
        dev.dep_push(7, 1)


def test_final_sync_sequence(dev, tmp_path):
    load_inp(dev)
    dev.dep_push(L, C)
    store(dev)
    dev.dep_pop(L, C)  # a user pop left pending at compute: committed before the final pops
    image = dev.save_image(tmp_path / "p.npz")
    assert len(dev.instructions) == 2  # save_image leaves the stream pending
    program = decode_program(image.program_bytes, dev.config)
    shape = [(module_of(i).name, isinstance(i, MemInsn) and i.x_size == 0, flags(i))
             for i in program]
    assert shape == [
        ("LOAD", False, {"push_next"}),
        ("STORE", False, {"push_prev"}),  # final store->compute push set on the last store
        ("LOAD", True, {"push_next"}),  # final load->compute push: last insn is not load
        # The final store->compute pop joins the user's pending load->compute pop; the
        # final load->compute pop finds one pending, so both are committed as a NOP first.
        ("COMPUTE", True, {"pop_prev", "pop_next"}),
        ("COMPUTE", True, {"pop_prev"}),
        ("COMPUTE", False, set()),  # FINISH carries no pop
    ]
    assert isinstance(program[-1], FinishInsn)
    stats = dev.synchronize()
    assert stats["insn_count"] == len(program)


def test_empty_synchronize_returns_zero_counters():
    dev = Device("small", dram_size=1 << 16)
    stats = dev.synchronize()
    assert stats and all(v == 0 for v in stats.values())
    assert dev.runs == 0
    dev.dep_pop(C, L)  # only a pending pop: still nothing to run
    assert all(v == 0 for v in dev.synchronize().values())
    with pytest.raises(CelosiaError, match="stream is empty"):
        dev.save_image("/nonexistent/never-written.npz")


def test_deadlock_reported_and_stream_reset(dev):
    dev.dep_pop(L, C)
    dev.dep_pop(L, C)  # two pops, one push at sync: the second never gets its token
    load_acc(dev)
    with pytest.raises(DeadlockError, match="compute"):
        dev.synchronize()
    assert dev.instructions == []
    load_acc(dev)
    dev.synchronize()  # the device stays usable


def test_stats_accumulate():
    dev = Device("small", dram_size=1 << 16)
    buf = dev.alloc(64 * 16)
    for _ in range(3):
        dev.load_2d(buf, 0, 2, 1, 2, sram_index=0, mem_type=MemType.ACC)
        dev.alu("k", lambda k: k.push(0, 0), AluOp.ADD, imm=1)
        dev.synchronize()
    assert dev.runs == 3
    assert dev.stats["alu_uops"] == 3 and dev.stats["acc_load_bytes"] == 3 * 2 * 16
    assert dev.stats["uop_load_bytes"] == 3 * 4
