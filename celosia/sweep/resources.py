"""Resources of a configuration on an FPGA part: an analytic estimate (the default, instant)
or Yosys synthesis through fpga/synth.py (``celosia sweep --synth``: minutes per
configuration, cached per configuration hash in the results directory).

The analytic estimate (``resource_source = "analytic"`` in a row), for the parts of
fpga/synth.py:

- **DSP**: exact counting of the multipliers the RTL instantiates: BATCH x BLOCK x BLOCK
  int8 products (xc7z020: two per DSP48E1, ``dsp_pair``; LFE5U-85F: one MULT18X18D each),
  three per 32-bit ALU lane (BATCH x BLOCK lanes), plus a constant for the rest of the
  core (3 on the xc7z020, 2 on the LFE5U-85F). It reproduces every DSP figure of
  docs/fpga.md's table (small and default cores, both parts).
- **BRAM**: each buffer (UOP, INP, WGT, ACC twice for compute's two read ports, OUT) is
  mapped to block RAMs in the aspect ratio that needs fewest (DP16KD: 16384x1 ... 512x36;
  RAMB36: 32768x1 ... 512x72, with a RAMB18 counted as one half when it suffices).
  Against docs/fpga.md: LFE5U-85F small 15 and default 274 (both as measured); xc7z020
  default 137 (as measured), small 7.5 (measured 5.5: Yosys puts tiny buffers in LUTRAM).
- **LUT and FF**: a line through two synthesised points per part (a + b x MACs per cycle):
  the small (16 MACs) and default (256 MACs) cores, synthesised (docs/fpga.md's table; the
  pipelined small core on the xc7z020 by `celosia sweep --synth`). Buffer sizes,
  bus width and queue depths are not in it; it is exact at those two points only and is a
  first-order guide elsewhere, which is why ``--synth`` exists.

Fmax: ``fpga/clock.py``'s place-and-route results for the configuration (or, with
``--synth`` on the LFE5U-85F, the run's own), else empty.
"""

from __future__ import annotations

import math

__all__ = ["analytic", "fit", "ANALYTIC_NOTE"]

ANALYTIC_NOTE = ("analytic estimate (celosia/sweep/resources.py): DSP counted exactly, BRAM "
                 "from the buffer shapes, LUT/FF a line through two synthesised cores")

# (lut a, lut b, ff a, ff b) per part: LUT = a + b x MACs per cycle.
# xc7z020: small core 8,157 LUT / 6,631 FF (16 MACs; `celosia sweep --synth` of the small
# preset, Yosys 0.70 via yowasp, the pipelined core of main at a40ffc5), default 20,485 / 19,414
# (256 MACs, docs/fpga.md);
# LFE5U-85F: small core 14,092 / 7,635 (16 MACs, pipelined), default 42,208 / 11,822
# (256 MACs, before pipelining: the only default-core ECP5 synthesis there is).
_LINES = {
    "xc7z020": ((8157, 16), (20485, 256), (6631, 16), (19414, 256)),
    "lfe5u-85f": ((14092, 16), (42208, 256), (7635, 16), (11822, 256)),
}
# (width, depth) aspect ratios of one block RAM
_DP16KD = [(1, 16384), (2, 8192), (4, 4096), (9, 2048), (18, 1024), (36, 512)]
_RAMB36 = [(1, 32768), (2, 16384), (4, 8192), (9, 4096), (18, 2048), (36, 1024), (72, 512)]
_RAMB18 = [(1, 16384), (2, 8192), (4, 4096), (9, 2048), (18, 1024), (36, 512)]


def _line(p0, p1, macs: int) -> int:
    (y0, x0), (y1, x1) = p0, p1
    return round(y0 + (y1 - y0) * (macs - x0) / (x1 - x0))


def _blocks(bits: int, depth: int, modes) -> int:
    return min(math.ceil(bits / w) * math.ceil(depth / d) for w, d in modes)


def _buffers(cfg) -> list[tuple[int, int, int]]:
    """(element bits, depth, copies) of each on-chip buffer."""
    return [(32, cfg.uop_depth, 1), (8 * cfg.inp_elem_bytes, cfg.inp_depth, 1),
            (8 * cfg.wgt_elem_bytes, cfg.wgt_depth, 1), (8 * cfg.acc_elem_bytes, cfg.acc_depth, 2),
            (8 * cfg.out_elem_bytes, cfg.acc_depth, 1)]


def analytic(cfg, part_name: str) -> dict:
    """{lut, ff, bram, dsp} of ``cfg`` on the part (module doc)."""
    macs, lanes = cfg.macs_per_cycle, cfg.batch * cfg.block
    la, lb, fa, fb = _LINES[part_name]
    if part_name == "xc7z020":
        dsp = math.ceil(macs / 2) + 3 * lanes + 3
        bram = 0.0
        for bits, depth, copies in _buffers(cfg):
            full = _blocks(bits, depth, _RAMB36)
            half = _blocks(bits, depth, _RAMB18) / 2
            bram += copies * min(full, half)
    else:
        dsp = macs + 3 * lanes + 2
        bram = sum(copies * _blocks(bits, depth, _DP16KD) for bits, depth, copies in _buffers(cfg))
    return {"lut": _line(la, lb, macs), "ff": _line(fa, fb, macs), "bram": bram, "dsp": dsp}


def fit(res: dict, part_name: str) -> tuple[bool, str]:
    """Whether ``res`` fits the part, and the resources over it ("" when it fits)."""
    from celosia.fpga.synth import part

    cap = part(part_name).capacity
    keys = {"lut": "lut", "ff": "ff", "dsp": "dsp", "bram": "bram36" if "bram36" in cap else "bram"}
    over = [f"{k} {res[k]:g} > {cap[c]}" for k, c in keys.items()
            if res.get(k) is not None and res[k] > cap[c]]
    return not over, "; ".join(over)


def synthesised(report: dict) -> dict:
    """{lut, ff, bram, dsp} of a fpga/synth.py report (either part)."""
    return {"lut": report["lut"], "ff": report["ff"],
            "bram": report.get("bram36", report.get("bram")), "dsp": report["dsp"]}
