"""The datapath's int8 products (sim/igemm.py) against its float32 ones on whole programs:
random programs (tests/sim/programs.py) on three configurations and the two programs of
`celosia bench cycle` give the same final DRAM, counters and cycle statistics either way,
on fsim and the cycle model. The kernel-level comparisons against naive loops are in
test_gemm_paths.py, the kernel's own in test_igemm.py."""

import numpy as np
import pytest
from programs import random_program

from celosia import HwConfig
from celosia.sim import igemm
from celosia.sim.base import make_executor

pytestmark = pytest.mark.skipif(not igemm.available(),
                                reason="this host does not run the int8 kernel (AVX-512 VNNI)")

CONFIGS = {"default": HwConfig(), "small": HwConfig.preset("small"),
           "batch2_block8": HwConfig(log_batch=1, log_block=3, log_inp_buff_size=12,
                                     log_wgt_buff_size=13, log_acc_buff_size=13,
                                     log_uop_buff_size=10)}


def _run(image, cfg, target, int8: bool, monkeypatch):
    """(final DRAM, counters, int8 products made) of one run, the GEMM kernels compiled
    with the given products (a new executor: nothing compiled before)."""
    monkeypatch.setitem(igemm._state, "available", int8)
    calls = []
    real = igemm.matmul
    monkeypatch.setattr(igemm, "matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    ex = make_executor(target, cfg, image.dram.size)
    ex.write_dram(0, image.dram)
    stats = ex.run(image.insn_addr, image.insn_count)
    monkeypatch.setattr(igemm, "matmul", real)
    return ex.read_dram(0, image.dram.size), stats, len(calls)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_programs_int8_equals_float32(name, monkeypatch):
    cfg = CONFIGS[name]
    products = 0
    for seed in range(6):
        image = random_program(cfg, 700 + seed, n_body=30).image
        for target in ("fsim", "cycle"):
            dram8, stats8, n8 = _run(image, cfg, target, True, monkeypatch)
            dram32, stats32, n32 = _run(image, cfg, target, False, monkeypatch)
            np.testing.assert_array_equal(dram8, dram32, err_msg=f"{name} seed {seed} {target}")
            assert stats8 == stats32
            assert n32 == 0
            products += n8
    assert products > 0  # the int8 kernel ran


def test_bench_programs_int8_equals_float32(monkeypatch):
    from celosia.benchmarks.cycle_bench import workload_images

    cfg = HwConfig()
    for name, image in workload_images(cfg, quick=True).items():
        dram8, stats8, n8 = _run(image, cfg, "cycle", True, monkeypatch)
        dram32, stats32, n32 = _run(image, cfg, "cycle", False, monkeypatch)
        np.testing.assert_array_equal(dram8, dram32, err_msg=name)
        assert stats8 == stats32 and stats8["macs"] > 0
        assert n8 > 0 and n32 == 0
