"""`celosia bench fpga` (benchmarks/fpga_bench.py) reuses a synthesis report only while the
design, the part and the tools are the same: the cache key follows the exported Verilog."""

from __future__ import annotations

import dataclasses
import json

from celosia.benchmarks import fpga_bench
from celosia.config import HwConfig
from celosia.fpga import synth


def test_cache_key_follows_the_design_part_and_clock():
    small = HwConfig.preset("small")
    key = fpga_bench.cache_key(small, "lfe5u-85f")
    assert key == fpga_bench.cache_key(small, "ecp5")  # an alias: the same part
    assert key != fpga_bench.cache_key(small, "xc7z020")  # other part, other GEMM products
    assert key != fpga_bench.cache_key(small, "lfe5u-85f", speed=6)
    # another configuration: another design (and here another target clock too)
    assert key != fpga_bench.cache_key(dataclasses.replace(small, clock_mhz=50.0), "lfe5u-85f")


def test_cached_report_is_reused_and_a_new_one_is_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("CELOSIA_FPGA_BENCH_CACHE", str(tmp_path))
    small = HwConfig.preset("small")
    calls = []

    def fake_synth(cfg, part_name, work, **kw):
        calls.append((cfg, part_name, kw["speed"]))
        return {"part": part_name, "fits": True, "over": [], "fmax_mhz": 101.5}

    monkeypatch.setattr(synth, "synth", fake_synth)
    first = fpga_bench.cached_synth("small_ecp5", small, "lfe5u-85f")
    assert calls == [(small, "lfe5u-85f", 8)] and first["cached"] is False
    stored = json.loads(fpga_bench.cache_path("small_ecp5", small, "lfe5u-85f").read_text())
    assert stored["fmax_mhz"] == 101.5
    again = fpga_bench.cached_synth("small_ecp5", small, "lfe5u-85f")
    assert len(calls) == 1 and again["cached"] is True and again["fmax_mhz"] == 101.5
    # another configuration is not served from that report
    fpga_bench.cached_synth("small_ecp5", dataclasses.replace(small, clock_mhz=50.0), "lfe5u-85f")
    assert len(calls) == 2


def test_a_failed_run_is_recorded_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("CELOSIA_FPGA_BENCH_CACHE", str(tmp_path))

    def failing(cfg, part_name, work, **kw):
        raise synth.SynthError(f"{part_name}: nextpnr-ecp5 did not finish")

    monkeypatch.setattr(synth, "synth", failing)
    monkeypatch.setattr(fpga_bench, "RUNS", [("small_ecp5", "small", "lfe5u-85f")])
    metrics, details = {}, {}
    fpga_bench._synth(metrics, details)
    assert metrics == {} and "did not finish" in details["small_ecp5"]["error"]
