"""Cold and warm runs: ``sim.base.clear_caches`` makes the next run of a program a first run
(decoded, checked, planned and compiled into kernels again, as a program the process has
not run before), whose results, cycles and statistics are those of any later run; and
`celosia bench cycle` / `bench fsim` time the two kinds separately."""

import numpy as np
import pytest
from programs import random_program

from celosia import HwConfig
from celosia.sim import fsim
from celosia.sim.base import clear_caches, make_executor

DEFAULT, SMALL = HwConfig(), HwConfig.preset("small")


@pytest.fixture
def decodes(monkeypatch):
    """How many times programs were decoded (a cold run decodes its program)."""
    count = [0]
    real = fsim._decode

    def counted(raw, cfg):
        count[0] += 1
        return real(raw, cfg)
    monkeypatch.setattr(fsim, "_decode", counted)
    return count


@pytest.mark.parametrize("cfg", [DEFAULT, SMALL], ids=["default", "small"])
@pytest.mark.parametrize("seed", range(4))
def test_a_cold_run_gives_what_a_warm_run_gives(cfg, seed, decodes):
    image = random_program(cfg, seed).image
    ex = make_executor("cycle", cfg, image.dram.size)
    results = []
    for cold in (True, False, True, False):
        if cold:
            clear_caches(ex)
            assert not ex.datapath._by_fields and not ex.datapath._mem_by_insn
            assert ex.timeline is None  # nor the last program's decoded instructions
        before = decodes[0]
        ex.write_dram(0, image.dram)
        stats = ex.run(image.insn_addr, image.insn_count)
        assert decodes[0] - before == (1 if cold else 0)
        results.append((ex.read_dram(0, image.dram.size).tobytes(), stats))
    dram0, stats0 = results[0]
    for dram, stats in results[1:]:
        assert dram == dram0
        assert stats.keys() == stats0.keys()
        for k, v in stats.items():
            assert np.array_equal(v, stats0[k]), k


def test_bench_cycle_reports_cold_and_warm(monkeypatch, decodes):
    """The benchmark's JSON: every metric cold and warm, sample counts, and cold samples
    that are first runs (each decodes its program). The RTL's place is taken by the cycle
    model (its cycle counts must agree, and no Verilator build is needed)."""
    from celosia.benchmarks import cycle_bench

    def no_rtl(target, cfg, size, **options):
        return make_executor("cycle" if target == "rtl" else target, cfg, size, **options)
    monkeypatch.setattr(cycle_bench, "make_executor", no_rtl)
    monkeypatch.setattr(cycle_bench, "FAST_RUNS", 2)
    result = cycle_bench.run(quick=True)
    m = result["metrics"]
    for kind in ("cold", "warm"):
        for name in ("speedup_vs_rtl", "time_ratio_vs_fsim", "cycles_per_s"):
            assert m[f"{name}_{kind}"] > 0
            assert m[f"gemm64_{name}_{kind}"] > 0 and m[f"conv16_{name}_{kind}"] > 0
        assert m[f"speedup_vs_rtl_{kind}"] == min(m[f"gemm64_speedup_vs_rtl_{kind}"],
                                                  m[f"conv16_speedup_vs_rtl_{kind}"])
    assert result["samples"] == {"rtl": 3, "fsim_cold": 6, "cycle_cold": 6, "fsim_warm": 6,
                                 "cycle_warm": 6}
    for w in result["workloads"].values():
        assert {k: len(v) for k, v in w["runs_s"].items()} == \
            {"rtl": 3, "fsim_cold": 6, "cycle_cold": 6, "fsim_warm": 6, "cycle_warm": 6}
        assert w["median_s"]["cycle_cold"] == np.median(w["runs_s"]["cycle_cold"])
    # per program: each of the 12 cold samples decoded it, and the first of the four
    # executors' first runs (executors share decoded programs; the stand-in RTL always
    # finds the program decoded by the run before it)
    assert decodes[0] == 2 * (12 + 1)


def test_bench_fsim_reports_cold_and_warm(decodes):
    from celosia.benchmarks import fsim_bench

    m = fsim_bench.run(quick=True)["metrics"]
    for kind in ("cold", "warm"):
        assert m[f"gemm256_gmacs_per_s_{kind}"] > 0 and m[f"conv56_s_{kind}"] > 0
    assert decodes[0] == 2 * (1 + 3)  # per workload: the devices' first run, 3 cold runs
