"""The tensor level: what to compute and how, down to a loop IR both backends emit from.

Takes: tensor expressions (te.py) written by a backend's operator library, and schedules
(schedule.py: split, reorder, tile, placement in memory scopes).
Gives: a lowered loop-IR function (lower.py -> tir.PrimFunc), printed, verified and
interpretable (tir.py), over scalar expressions (expr.py, with their text form).

May import: nothing else in the compiler (only ``celosia.errors``). Target knowledge (the
GEMM intrinsic, SRAM scopes, LLVM) lives in the backends.
"""
