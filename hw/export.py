"""Verilog export: one self-contained file per configuration.

The top module ``celosia_accel`` has ``clk``, ``rst`` (synchronous, active high), the AXI4
master ``m_axi__*`` and the AXI4-Lite slave ``s_axil__*``; hw/core.py documents them and
hw/regs.py the register map.
"""

from __future__ import annotations

from amaranth.back import verilog

from celosia.config import HwConfig

from .core import Accelerator

__all__ = ["verilog_text", "TOP_NAME"]

TOP_NAME = "celosia_accel"


def verilog_text(cfg: HwConfig | None = None) -> str:
    """The accelerator for ``cfg`` (default configuration if None) as Verilog source."""
    cfg = HwConfig.load(cfg)
    top = Accelerator(cfg)
    header = ("/* celosia accelerator, configuration:\n"
              + "\n".join(f" *   {k} = {v}" for k, v in cfg.to_dict().items()) + "\n */\n")
    return header + verilog.convert(top, name=TOP_NAME, emit_src=False)
