"""fsim's work limit (``max_work``: instructions plus micro-op iterations), shared by the cycle
model: the runaway program of issue #18 stops at once, the limit is exact, checked before any
work (also on kept kernels and before decoding), validated, and passed by the driver."""

import time

import numpy as np
import pytest

from celosia import HwConfig
from celosia.driver import Device
from celosia.errors import CelosiaError, SimulationLimitError
from celosia.image import ProgramImage
from celosia.isa import AluInsn, AluOp, FinishInsn, MemInsn, MemType, Opcode, Uop
from celosia.sim.base import make_executor, run_image
from celosia.sim.datapath import DEFAULT_MAX_WORK
from celosia.sim.fsim import FunctionalSimulator
from programs import ProgramBuilder, random_program
from reference import run_reference

DEFAULT = HwConfig()
SMALL = HwConfig.preset("small")
TARGETS = ["fsim", "cycle"]


def one_row_alu(iter_out: int, iter_in: int, cfg=DEFAULT, **alu) -> ProgramImage:
    """Issue #18's program: load one micro-op, an ALU on one ACC row, FINISH."""
    b = ProgramBuilder(cfg)
    base = b.uops([Uop(0, 0)])
    b.emit(MemInsn(opcode=Opcode.LOAD, mem_type=MemType.UOP, dram_base=base, y_size=1,
                   x_size=1, x_stride=1))
    b.emit(AluInsn(uop_bgn=0, uop_end=1, iter_out=iter_out, iter_in=iter_in,
                   **{"alu_op": AluOp.ADD, "use_imm": True, "imm": 1, **alu}))
    b.emit(FinishInsn())
    return b.image()


@pytest.mark.parametrize("target", TARGETS)
def test_runaway_program_of_the_issue_stops_at_once(target):
    image = one_row_alu(8192, 8192)
    start = time.process_time()
    with pytest.raises(SimulationLimitError) as info:
        run_image(image, target)
    assert time.process_time() - start < 2.0
    msg = str(info.value)
    assert msg.startswith("instruction 1: ALU of 67,108,864 micro-op iterations")
    assert f"max_work={DEFAULT_MAX_WORK:,}" in msg and "--max-work" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("target", TARGETS)
def test_raised_limit_runs_it_in_closed_form(target):
    """2^24 updates of one row (past the default limit) under a raised one: closed forms,
    chunk by chunk, in seconds."""
    image = one_row_alu(4096, 4096, imm=3)
    sim = make_executor(target, DEFAULT, image.dram.size, max_work=1 << 25)
    sim.write_dram(0, image.dram)
    start = time.process_time()
    stats = sim.run(image.insn_addr, image.insn_count)
    assert time.process_time() - start < 10.0
    assert stats["work"] == 3 + (1 << 24) and stats["alu_uops"] == 1 << 24
    # the row was zero (nothing loaded it): 3 * 2^24, whose low byte OUT holds
    assert (sim.datapath.acc[0] == 3 << 24).all() and not sim.datapath.out[0].any()


@pytest.mark.parametrize("target", TARGETS)
def test_work_is_instructions_plus_iterations_and_the_limit_is_exact(target):
    image = random_program(SMALL, 3).image
    _, ref = run_reference(image.dram, image.insn_addr, image.insn_count, SMALL)
    _, stats = run_image(image, target, SMALL)
    assert stats["work"] == ref["work"] > stats["insn_count"]
    run_image(image, target, SMALL, max_work=stats["work"])
    with pytest.raises(SimulationLimitError, match=f"past max_work={stats['work'] - 1:,}"):
        run_image(image, target, SMALL, max_work=stats["work"] - 1)


def test_kept_kernels_are_still_counted():
    """A second run of the same program reuses its kernels but not its allowance."""
    image = random_program(SMALL, 4).image
    sim = FunctionalSimulator(SMALL, image.dram.size)
    sim.write_dram(0, image.dram)
    work = sim.run(image.insn_addr, image.insn_count)["work"]
    sim.write_dram(0, image.dram)
    sim.max_work = work - 1
    with pytest.raises(SimulationLimitError):
        sim.run(image.insn_addr, image.insn_count)


@pytest.mark.parametrize("target", TARGETS)
def test_too_many_instructions_fail_before_decoding(target):
    """Undecodable bytes: a program longer than max_work fails on its length alone."""
    dram = np.full(16 * 100, 0xFF, np.uint8)
    ex = make_executor(target, SMALL, dram.size, max_work=50)
    ex.write_dram(0, dram)
    with pytest.raises(SimulationLimitError, match=r"^program: its 100 instructions are more "
                                                   r"work than max_work=50"):
        ex.run(0, 100)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "10", None])
def test_max_work_must_be_a_positive_integer(target, bad):
    with pytest.raises(CelosiaError, match="max_work must be a positive integer"):
        make_executor(target, SMALL, 64, max_work=bad)


def test_unknown_option_is_an_error_naming_the_options():
    with pytest.raises(CelosiaError, match="target 'fsim' has no option max_cycles; its "
                                           "options are max_work"):
        make_executor("fsim", SMALL, 64, max_cycles=10)
    with pytest.raises(CelosiaError, match="dram_size must be a positive integer"):
        make_executor("fsim", SMALL, 2.5)


def test_dram_size_is_checked_against_the_memory_limit(monkeypatch):
    monkeypatch.setenv("CELOSIA_MAX_BYTES", "4096")
    with pytest.raises(CelosiaError, match="the fsim executor's DRAM needs 8,192 bytes"):
        make_executor("fsim", SMALL, 8192)


def test_the_driver_passes_max_work():
    def record(k):
        k.loop(100, 0, 0)
        k.loop(100, 0, 0)
        k.push(0, 0)

    dev = Device(SMALL, target="fsim", max_work=1000)
    dev.alu("add", record, AluOp.ADD, imm=1)
    with pytest.raises(SimulationLimitError, match="ALU of 10,000 micro-op iterations .* "
                                                   "past max_work=1,000"):
        dev.synchronize()


def test_range_error_far_into_a_long_loop_is_instant():
    """The out-of-range report finds its iteration without walking the loops (it took
    128 x 16383 array operations to find this one)."""
    depth = SMALL.acc_depth
    image = one_row_alu(200, 16383, cfg=SMALL, dst_factor_out=1)
    start = time.process_time()
    with pytest.raises(CelosiaError, match=r"instruction 1: ALU micro-op 0 at iteration "
                                           rf"\(out {depth}, in 0\) uses ACC row {depth} as "
                                           r"dst, outside the ACC buffer"):
        run_image(image, "fsim", SMALL)
    assert time.process_time() - start < 2.0
