"""`celosia bench fpga` (benchmarks/fpga_bench.py) reuses a synthesis report only while the
design, the part and the tools are the same: the cache key follows the exported Verilog."""

from __future__ import annotations

import dataclasses
import json

import pytest

from celosia.benchmarks import fpga_bench
from celosia.config import HwConfig
from celosia.errors import CelosiaError
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
    # no kept results: fpga/results/ holds the small core's real report once it is current
    monkeypatch.setattr("celosia.fpga.clock.RESULTS", tmp_path / "no-results")
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
    monkeypatch.setattr("celosia.fpga.clock.RESULTS", tmp_path / "no-results")

    def failing(cfg, part_name, work, **kw):
        raise synth.SynthError(f"{part_name}: nextpnr-ecp5 did not finish")

    monkeypatch.setattr(synth, "synth", failing)
    monkeypatch.setattr(fpga_bench, "RUNS", [("small_ecp5", "small", "lfe5u-85f")])
    metrics, details = {}, {}
    fpga_bench._synth(metrics, details)
    assert metrics == {} and "did not finish" in details["small_ecp5"]["error"]


def test_kept_results_serve_the_same_design_only(tmp_path, monkeypatch):
    """A report kept in fpga/results/ (celosia fpga synth --out) is reused when it was made
    from the same Verilog, tools, speed grade, target clock and default seed."""
    monkeypatch.setenv("CELOSIA_FPGA_BENCH_CACHE", str(tmp_path / "cache"))
    small = HwConfig.preset("small")
    entry = {"part": "lfe5u-85f", "fits": True, "over": [], "fmax_mhz": 104.2,
             "speed_grade": 8, "target_mhz": small.clock_mhz, "seed": None,
             "verilog_sha256": synth.verilog_digest(small, "native"),
             "tools": synth.tool_versions(), "hw_commit": "abc1234"}
    results = tmp_path / "results"
    results.mkdir()

    def keep(**over):
        (results / "small.json").write_text(json.dumps(
            {"config": "small", "hw_config": small.to_dict(), "lfe5u-85f": {**entry, **over}}))

    monkeypatch.setattr("celosia.fpga.clock.RESULTS", results)
    keep()
    got = fpga_bench.kept_result(small, "lfe5u-85f")
    assert got["fmax_mhz"] == 104.2 and got["source"] == str(results / "small.json")
    for over in ({"verilog_sha256": "0" * 64}, {"seed": 2}, {"speed_grade": 6},
                 {"target_mhz": 50.0}, {"tools": {}}):
        keep(**over)
        assert fpga_bench.kept_result(small, "lfe5u-85f") is None, over
    assert fpga_bench.kept_result(small, "xc7z020") is None  # no entry for that part
    keep()
    monkeypatch.setattr(synth, "synth", lambda *a, **kw: pytest.fail("should be reused"))
    report = fpga_bench.cached_synth("small_ecp5", small, "lfe5u-85f")
    assert report["cached"] is True and report["hw_commit"] == "abc1234"


def test_run_names_the_design_and_refuses_a_report_of_other_verilog(tmp_path, monkeypatch):
    """The result says which hw/ commit and Verilog its figures are for, and a report whose
    Verilog is not what hw/ exports now (a hand-copied cache file) is an error, not a
    figure."""
    monkeypatch.setenv("CELOSIA_FPGA_BENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(fpga_bench, "_resnet_layers", lambda quick, metrics, details: None)
    monkeypatch.setattr(fpga_bench, "RUNS", [("small_ecp5", "small", "lfe5u-85f")])
    small = HwConfig.preset("small")
    digest = synth.verilog_digest(small, "native")
    report = {"part": "lfe5u-85f", "fits": True, "over": [], "fmax_mhz": 104.0, "lut": 10,
              "ff": 20, "bram": 1, "dsp": 2, "target_mhz": 100.0, "meets_clock": True,
              "verilog_sha256": digest, "hw_commit": "abc1234"}
    path = fpga_bench.cache_path("small_ecp5", small, "lfe5u-85f")
    path.write_text(json.dumps(report))
    result = fpga_bench.run(quick=True)
    assert result["design"]["verilog_sha256"] == {"small_ecp5": digest}
    assert result["design"]["hw_commit"] == synth.hw_commit()
    assert result["metrics"]["small_ecp5_fmax_mhz"] == 104.0
    assert result["metrics"]["small_ecp5_lut"] == 10 and result["small_ecp5"]["cached"]
    path.write_text(json.dumps({**report, "verilog_sha256": "0" * 64}))
    with pytest.raises(CelosiaError, match="small_ecp5 report .* other Verilog"):
        fpga_bench.run(quick=True)
