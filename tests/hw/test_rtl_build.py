"""The rtl target's build options (sim/rtl.py): every option is in the cache key, and the
harness clocks one eval() per cycle only when the Verilated AXI master outputs do not
depend on the model's inputs. No Verilator build here (fast)."""

from __future__ import annotations

import pytest

from celosia.config import HwConfig
from celosia.sim import rtl


@pytest.mark.parametrize("name,value", [
    ("VERILATOR_FLAGS", ("-O2", "--x-assign", "fast")),
    ("OPT_FAST", "-O2"),
    ("LINK_FLAGS", ()),
    ("OPT_SLOW", "-O2"),
    ("OPT_HARNESS", "-O3"),
    ("YOSYS_PASSES", ("proc", "flatten", "memory_collect")),
    ("SIM_GEMM_PRODUCTS", "native"),
])
def test_cache_key_changes_with_every_build_option(monkeypatch, name, value):
    cfg = HwConfig.preset("small")
    before = rtl._source_key(cfg, False)
    assert rtl._source_key(cfg, False) == before  # deterministic
    monkeypatch.setattr(rtl, name, value)
    assert rtl._source_key(cfg, False) != before


def test_cache_key_changes_with_the_compiler_and_trace(monkeypatch):
    cfg = HwConfig.preset("small")
    before = rtl._source_key(cfg, False)
    assert rtl._source_key(cfg, True) != before
    monkeypatch.setenv("CXX", "no-such-compiler-celosia")
    assert rtl._source_key(cfg, False) != before


_ICO = """void Vcelosia_accel___024root___ico_sequent__TOP__0(Vcelosia_accel___024root* vlSelf) {
    auto& vlSelfRef = std::ref(*vlSelf).get();
%s
}
"""


@pytest.mark.parametrize("body,one_eval", [
    ("    vlSelfRef.s_axil___05Fawready = vlSelfRef.s_axil___05Fawvalid;", True),
    ("    vlSelfRef.m_axi___05Frready = vlSelfRef.m_axi___05Frvalid;", False),
    ("    if (vlSelfRef.m_axi___05Frvalid == 1U) { x = 0; }", True),  # read, not assigned
])
def test_one_eval_only_when_no_master_output_follows_the_inputs(tmp_path, body, one_eval):
    (tmp_path / "Vcelosia_accel___024root__0.cpp").write_text(_ICO % body)
    assert rtl._outputs_need_no_input_eval(tmp_path) is one_eval


def test_one_eval_when_the_model_has_no_input_logic(tmp_path):
    (tmp_path / "Vcelosia_accel___024root__0.cpp").write_text("void f() {\n}\n")
    assert rtl._outputs_need_no_input_eval(tmp_path)
