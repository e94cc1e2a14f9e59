"""The GEMM datapath of one micro-op, pipelined: for every b < BATCH, o < BLOCK the sum
``sum_c INP[b][c] * WGT[o][c]`` of BLOCK signed 8x8 products. The accumulator add is not
here: compute adds the sum to the ACC row in its X stage, where it forwards rows still in
flight (hw/compute.py).

Pipeline (one operand pair per cycle, no stalls, no enables): the operands ``inp``/``wgt``
presented in cycle c are multiplied in c and the products registered; each following cycle
adds groups of four terms (two adder levels, ``((a + b) + (c + d))``) and registers them,
until one term per lane is left. ``sum`` shows the sums of the operands of cycle c in cycle
``c + latency``, ``latency = 1 + tree_stages(BLOCK)``. Registers around the multipliers are
what lets an FPGA whose multipliers have no registers of their own (ECP5's MULT18X18D as
nextpnr sees it) run at 100 MHz.

``products`` chooses how the 8x8 products are built; every choice computes the same
function with the same latency:

- ``"native"`` (default): one ``*`` per product; synthesis picks DSPs or LUTs.
- ``"dsp_pair"``: two products that share their input element in one 25x8 multiplier, for
  FPGAs whose DSP block has a 25x18 multiplier (Xilinx DSP48E1): outputs o and o+1 use
  ``(w1 * 2**16 + w0) * x = w1*x * 2**16 + w0*x``. As ``|w0*x| <= 2**14``, the low 16 bits
  sign-extended are ``w0*x``, and the bits from 16 up plus bit 15 (the borrow) are
  ``w1*x``. This halves the multipliers (256 -> 128 DSP48E1 for the default 1x16x16 core,
  which then fits the xc7z020).
- ``"wide"`` (for simulation: what ``celosia.sim.rtl`` builds): every operand, product and
  sum is a 32-bit two's-complement word and every operation is taken modulo 2**32. A
  sign-extended int8 is ``(v ^ 0x80) + (2**32 - 0x80)``, and products and sums of 16-bit
  and 18-bit values are exact in 32 bits, so each lane's sum is bit-identical to
  ``"native"``. Verilator compiles this to plain 32-bit multiplies and adds, where the
  native widths cost it a sign extension per operand of every product and adder. The
  whole dot product of each lane is computed in the first stage and then only delayed,
  and every stage is registered only when it holds operands: the core has an ``en`` input
  (the operands presented in this cycle are a micro-op's), and ``sum`` is defined in
  cycle ``c + latency`` only when ``en`` was high in cycle c (compute uses a sum only
  for a valid GEMM micro-op). So Verilator does the 256 multiplies only in cycles that
  need them, and keeps the partial sums in machine registers instead of 320 pipeline
  registers. Not for synthesis (one long combinational path, twice the register bits).
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from celosia.config import HwConfig

__all__ = ["GemmCore", "GEMM_PRODUCTS", "tree_stages", "SUM_BITS"]

GEMM_PRODUCTS = ("native", "dsp_pair", "wide")
#: width of one lane's sum on the ``sum`` port (sign-extended)
SUM_BITS = 32


def tree_stages(block: int) -> int:
    """Register stages of the adder tree over ``block`` products: each sums groups of 4."""
    stages, terms = 0, block
    while terms > 1:
        terms = -(-terms // 4)
        stages += 1
    return stages


def _reduce4(terms, wrap=lambda s: s):
    """Groups of four terms summed as two adder levels (each sum passed through ``wrap``)."""
    out = []
    for i in range(0, len(terms), 4):
        g = terms[i:i + 4]
        while len(g) > 1:
            g = [wrap(g[k] + g[k + 1]) if k + 1 < len(g) else g[k]
                 for k in range(0, len(g), 2)]
        out.append(g[0])
    return out


class GemmCore(wiring.Component):
    def __init__(self, cfg: HwConfig, *, products: str = "native"):
        if products not in GEMM_PRODUCTS:
            raise ValueError(f"products must be one of {GEMM_PRODUCTS}, not {products!r}")
        self.cfg = cfg
        self.products = products
        #: cycles from operands to their sums on ``sum``
        self.latency = 1 + tree_stages(cfg.block)
        ports = {"inp": In(8 * cfg.inp_elem_bytes), "wgt": In(8 * cfg.wgt_elem_bytes),
                 "sum": Out(SUM_BITS * cfg.batch * cfg.block)}
        if products == "wide":  # the operands of this cycle are used (module docstring)
            ports["en"] = In(1)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        n, batch = self.cfg.block, self.cfg.batch

        def x(b, c):
            return self.inp.word_select(b * n + c, 8).as_signed()

        def w(o, c):
            return self.wgt.word_select(o * n + c, 8).as_signed()

        def register(value, name):
            # data only: compute's valid bits (reset by start) say when a stage holds a
            # micro-op, so these need no reset (fewer FPGA reset nets; in Verilator their
            # logic no longer depends on the start strobe, a top-level input)
            reg = Signal(value.shape(), name=name, reset_less=True)
            m.d.sync += reg.eq(value)
            return reg

        if self.products == "wide":
            return self._elaborate_wide(m)
        # products, per lane (b, o): n terms, registered
        lanes = {}
        for b in range(batch):
            if self.products == "native":
                for o in range(n):
                    lanes[b * n + o] = [register(x(b, c) * w(o, c), f"p_{b}_{o}_{c}")
                                        for c in range(n)]
                continue
            for o in range(0, n, 2):  # BLOCK is a power of two >= 2: outputs pair up
                lows, highs = [], []
                for c in range(n):
                    packed = (w(o + 1, c) << 16) + w(o, c)  # 25-bit signed
                    p = packed * x(b, c)  # 33-bit signed: one DSP48E1
                    lows.append(register(p[:16].as_signed(), f"p_{b}_{o}_{c}"))
                    high = Signal(signed(17))
                    m.d.comb += high.eq(p[16:].as_signed() + p[15])
                    highs.append(register(high, f"p_{b}_{o + 1}_{c}"))
                lanes[b * n + o] = lows
                lanes[b * n + o + 1] = highs
        # adder tree: groups of four per stage
        for stage in range(tree_stages(n)):
            for lane, terms in lanes.items():
                lanes[lane] = [register(t, f"t{stage}_{lane}_{i}")
                               for i, t in enumerate(_reduce4(terms))]
        for lane, (total,) in lanes.items():
            m.d.comb += self.sum.word_select(lane, SUM_BITS).eq(total)
        return m

    def _elaborate_wide(self, m):
        n, batch, bits = self.cfg.block, self.cfg.batch, SUM_BITS

        def extend(byte, name):  # the int8 ``byte`` sign-extended to a 32-bit word
            word = Signal(bits, name=name)
            m.d.comb += word.eq(((byte ^ 0x80) + Const((1 << bits) - 0x80, bits))[:bits])
            return word

        xs = {(b, c): extend(self.inp.word_select(b * n + c, 8), f"x_{b}_{c}")
              for b in range(batch) for c in range(n)}
        # The weights as offset bytes: u = w ^ 0x80 = w + 128 in [0, 255], flipped four
        # bytes at a time, so that a product needs only a byte's shift and mask:
        # sum_c x_c * w_c = sum_c x_c * u_c - 128 * sum_c x_c (modulo 2**32 as everywhere).
        words = []
        for i in range(0, len(self.wgt), bits):
            part = self.wgt[i:i + bits]
            word = Signal(len(part), name=f"u_{i // bits}")
            m.d.comb += word.eq(part ^ int.from_bytes(b"\x80" * (len(part) // 8), "little"))
            words.append(word)

        def u(o, c):
            k = (o * n + c) * 8
            return words[k // bits][k % bits:k % bits + 8]

        offsets = {}  # -128 * sum_c x_c, one more term of each lane of batch row b
        for b in range(batch):
            terms = [xs[b, c] for c in range(n)]
            while len(terms) > 1:
                terms = _reduce4(terms, lambda s: s[:bits])
            offsets[b] = Signal(bits, name=f"offset_{b}")
            m.d.comb += offsets[b].eq((0 - (terms[0] << 7))[:bits])
        # stage 1: each lane's whole sum (the adder tree of "native", as one expression);
        # the later stages only delay it. Each stage is registered when it holds operands
        # whose sum is wanted (en, delayed along): other cycles leave it as it is.
        en = self.en
        sums = {}
        for b in range(batch):
            for o in range(n):
                terms = [(xs[b, c] * u(o, c))[:bits] for c in range(n)] + [offsets[b]]
                while len(terms) > 1:
                    terms = _reduce4(terms, lambda s: s[:bits])
                total = Signal(bits, name=f"d0_{b * n + o}", reset_less=True)
                with m.If(en):
                    m.d.sync += total.eq(terms[0])
                sums[b * n + o] = total
        for stage in range(tree_stages(n)):
            held = Signal(name=f"en_{stage + 1}")  # the previous stage holds a wanted sum
            m.d.sync += held.eq(en)
            for lane, value in sums.items():
                delayed = Signal(bits, name=f"d{stage + 1}_{lane}", reset_less=True)
                with m.If(held):
                    m.d.sync += delayed.eq(value)
                sums[lane] = delayed
            en = held
        for lane, total in sums.items():
            m.d.comb += self.sum.word_select(lane, bits).eq(total)
        return m
