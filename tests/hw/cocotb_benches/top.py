"""The bench top: every block instance of the cocotb benches side by side in one module.

A block instance ``name`` has its ports at ``<name>__<port>`` (Amaranth's flattening of
interface members: ``ld0__cmd__valid``, ``arb__clients__1__arvalid``); all share ``clk``
and ``rst``. The tables below are the single source of the instances' parameters, read by
both the top and the benches.
"""

from __future__ import annotations

import dataclasses

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from celosia.config import PRESETS
from celosia.hw.alu import AluLane
from celosia.hw.arbiter import ReadArbiter
from celosia.hw.cmd_queue import CommandQueue
from celosia.hw.gemm import GEMM_PRODUCTS, GemmCore
from celosia.hw.tensor_load import TensorLoad
from celosia.hw.tensor_store import TensorStore
from celosia.hw.token_queue import TokenQueue

TOP = "bench_top"
TOKEN_QUEUES = {f"tq{d}": d for d in (1, 3, 8)}  # name: depth
CMD_QUEUES = {f"cq{d}": d for d in (1, 4)}
ARBITER = ("arb", 3, 8)  # name, clients, bus bytes
LOADS = {"ld0": ([4, 16], 8), "ld1": ([16, 64, 4], 8), "ld2": ([2, 8], 4), "ld3": ([32], 16)}
STORE_DEPTH = 256
STORES = {"st0": (4, 8), "st1": (16, 8), "st2": (16, 16), "st3": (64, 8)}  # elem, bus bytes
# GEMM cores: a 2x4x4 core (two batch rows) and the default 1x16x16, each both ways.
GEMM_CONFIGS = {"b2n4": dataclasses.replace(PRESETS["small"], log_batch=1),
                "b1n16": PRESETS["default"]}
GEMMS = {f"gemm_{c}_{p}": (c, p) for c in GEMM_CONFIGS for p in GEMM_PRODUCTS}


def blocks() -> dict:
    out = {name: TokenQueue(depth=d) for name, d in TOKEN_QUEUES.items()}
    out.update({name: CommandQueue(depth=d) for name, d in CMD_QUEUES.items()})
    out["alu"] = AluLane()
    out[ARBITER[0]] = ReadArbiter(clients=ARBITER[1], data_width=8 * ARBITER[2])
    out.update({name: TensorLoad(elem_bytes=e, bus_bytes=b) for name, (e, b) in LOADS.items()})
    out.update({name: TensorStore(elem_bytes=e, bus_bytes=b, sram_depth=STORE_DEPTH)
                for name, (e, b) in STORES.items()})
    out.update({name: GemmCore(GEMM_CONFIGS[c], products=p) for name, (c, p) in GEMMS.items()})
    return out


class BenchTop(wiring.Component):
    def __init__(self):
        self._blocks = blocks()
        super().__init__({name: Out(block.signature) for name, block in self._blocks.items()})

    def elaborate(self, platform):
        m = Module()
        for name, block in self._blocks.items():
            m.submodules[name] = block
            outer = getattr(self, name)
            # wiring.connect cannot flip arrays of interfaces (the arbiter's clients): wire
            # the flattened members one by one instead
            for path, member, inner in block.signature.flatten(block):
                port = outer
                for step in path:
                    port = port[step] if isinstance(step, int) else getattr(port, step)
                if member.flow == wiring.In:
                    m.d.comb += inner.eq(port)
                else:
                    m.d.comb += port.eq(inner)
        return m


def verilog() -> str:
    from amaranth.back import verilog as back

    return back.convert(BenchTop(), name=TOP, emit_src=False)
