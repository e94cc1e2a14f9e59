"""Verilog export: one self-contained file per configuration.

The top module ``celosia_accel`` has ``clk``, ``rst`` (synchronous, active high), the AXI4
master ``m_axi__*`` and the AXI4-Lite slave ``s_axil__*``; hw/core.py documents them and
hw/regs.py the register map.

``gemm_products`` picks how the GEMM core builds its 8x8 products (hw/gemm.py): the
default ``"native"`` for simulation and generic synthesis, ``"dsp_pair"`` (two products per
25x18 DSP multiplier) for Xilinx 7-series. Both compute the same function with the same
cycle timing.
"""

from __future__ import annotations

from amaranth.back import verilog

from celosia.config import HwConfig

from .core import Accelerator

__all__ = ["verilog_text", "TOP_NAME"]

TOP_NAME = "celosia_accel"


def verilog_text(cfg: HwConfig | None = None, *, gemm_products: str = "native") -> str:
    """The accelerator for ``cfg`` (default configuration if None) as Verilog source."""
    cfg = HwConfig.load(cfg)
    top = Accelerator(cfg, gemm_products=gemm_products)
    header = ("/* celosia accelerator, configuration:\n"
              + "\n".join(f" *   {k} = {v}" for k, v in cfg.to_dict().items())
              + f"\n *   gemm_products = {gemm_products}\n */\n")
    return header + verilog.convert(top, name=TOP_NAME, emit_src=False)
