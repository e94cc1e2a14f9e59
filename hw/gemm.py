"""The GEMM datapath of one micro-op: ACC[b][o] + sum_c INP[b][c] * WGT[o][c] for every
b < BATCH, o < BLOCK, as BATCH x BLOCK x BLOCK signed 8x8 products and balanced adder trees
(32-bit wrap-around). Combinational: the compute pipeline registers around it.

``products`` chooses how the 8x8 products are built; every choice computes the same
function, in the same cycle:

- ``"native"`` (default): one ``*`` per product; synthesis picks DSPs or LUTs.
- ``"dsp_pair"``: two products that share their input element in one 25x8 multiplier, for
  FPGAs whose DSP block has a 25x18 multiplier (Xilinx DSP48E1): outputs o and o+1 use
  ``(w1 * 2**16 + w0) * x = w1*x * 2**16 + w0*x``. As ``|w0*x| <= 2**14``, the low 16 bits
  sign-extended are ``w0*x``, and the bits from 16 up plus bit 15 (the borrow) are
  ``w1*x``; the borrow bits join output o+1's adder tree. This halves the multipliers
  (256 -> 128 DSP48E1 for the default 1x16x16 core, which then fits the xc7z020).
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from celosia.config import HwConfig

__all__ = ["GemmCore", "GEMM_PRODUCTS"]

GEMM_PRODUCTS = ("native", "dsp_pair")


def _tree_sum(values):
    values = list(values)
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


class GemmCore(wiring.Component):
    def __init__(self, cfg: HwConfig, *, products: str = "native"):
        if products not in GEMM_PRODUCTS:
            raise ValueError(f"products must be one of {GEMM_PRODUCTS}, not {products!r}")
        self.cfg = cfg
        self.products = products
        super().__init__({
            "inp": In(8 * cfg.inp_elem_bytes), "wgt": In(8 * cfg.wgt_elem_bytes),
            "acc": In(8 * cfg.acc_elem_bytes), "out": Out(8 * cfg.acc_elem_bytes),
        })

    def elaborate(self, platform):
        m = Module()
        n, batch = self.cfg.block, self.cfg.batch

        def x(b, c):
            return self.inp.word_select(b * n + c, 8).as_signed()

        def w(o, c):
            return self.wgt.word_select(o * n + c, 8).as_signed()

        def write(b, o, terms):
            lane = b * n + o
            acc = self.acc.word_select(lane, 32).as_signed()
            m.d.comb += self.out.word_select(lane, 32).eq(acc + _tree_sum(terms))

        for b in range(batch):
            if self.products == "native":
                for o in range(n):
                    write(b, o, [x(b, c) * w(o, c) for c in range(n)])
                continue
            for o in range(0, n, 2):  # BLOCK is a power of two >= 2: outputs pair up
                lows, highs, borrows = [], [], []
                for c in range(n):
                    packed = (w(o + 1, c) << 16) + w(o, c)  # 25-bit signed
                    p = packed * x(b, c)  # 33-bit signed: one DSP48E1
                    lows.append(p[:16].as_signed())
                    highs.append(p[16:].as_signed())
                    borrows.append(p[15])
                write(b, o, lows)
                write(b, o + 1, borrows + highs)
        return m
