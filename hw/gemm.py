"""The GEMM datapath of one micro-op: ACC[b][o] + sum_c INP[b][c] * WGT[o][c] for every
b < BATCH, o < BLOCK, as BATCH x BLOCK x BLOCK signed 8x8 products and balanced adder trees
(32-bit wrap-around). Combinational: the compute pipeline registers around it.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from celosia.config import HwConfig

__all__ = ["GemmCore"]


def _tree_sum(values):
    values = list(values)
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


class GemmCore(wiring.Component):
    def __init__(self, cfg: HwConfig):
        self.cfg = cfg
        super().__init__({
            "inp": In(8 * cfg.inp_elem_bytes), "wgt": In(8 * cfg.wgt_elem_bytes),
            "acc": In(8 * cfg.acc_elem_bytes), "out": Out(8 * cfg.acc_elem_bytes),
        })

    def elaborate(self, platform):
        m = Module()
        n, batch = self.cfg.block, self.cfg.batch
        for b in range(batch):
            for o in range(n):
                lane = b * n + o
                products = [
                    self.inp.word_select(b * n + c, 8).as_signed()
                    * self.wgt.word_select(o * n + c, 8).as_signed()
                    for c in range(n)
                ]
                acc = self.acc.word_select(lane, 32).as_signed()
                m.d.comb += self.out.word_select(lane, 32).eq(acc + _tree_sum(products))
        return m
