"""celosia.hw: the accelerator in Amaranth (see docs/microarchitecture.md).

``Accelerator(cfg)`` (hw/core.py) is the top level; ``export.verilog_text(cfg)`` gives its
Verilog. Import submodules directly; this package does not import Amaranth eagerly.
"""
