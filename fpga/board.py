"""Board tops: the accelerator, its DRAM as on-chip block RAM, and a UART host bridge
(docs/board.md).

``BoardTop(cfg, ram_bytes=..., divisor=...)`` is the whole design on the board: ports
``uart_rx``, ``uart_tx`` and ``leds`` (bit 0 the accelerator runs, bit 1 a request is
under way), clock and reset from the platform. The same module, with a divisor of 4, runs
under Verilator for the tests (fpga/board_sim.py).

Why on-chip RAM and not the ULX3S's 32 MiB SDRAM: no open SDRAM controller is in the
dependency set (amaranth-boards only names the pins; LiteDRAM would bring LiteX and its
build system along), while block RAM needs none and keeps the DRAM model exact (a fixed
read latency, like the simulators'). The RAM takes the block RAMs the core leaves free:
``ram_bytes_for`` picks the largest power of two that fits beside the core's buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from celosia.config import HwConfig
from celosia.errors import CelosiaError
from celosia.hw.axi import Axi4Signature
from celosia.hw.core import Accelerator

from .bridge import HostBridge
from .protocol import config_id
from .uart import MIN_DIVISOR

__all__ = ["BoardSpec", "BOARDS", "board", "BoardTop", "AxiRam", "BoardFitError",
           "core_bram_blocks", "ram_bram_blocks", "ram_bytes_for", "check_fit"]


class BoardFitError(CelosiaError):
    """A configuration (with its RAM) does not fit the board's FPGA."""


@dataclass(frozen=True)
class BoardSpec:
    name: str
    part: str            # fpga/synth.py part name
    clock_hz: float      # the board's oscillator, the design's clock
    bram_blocks: int     # block RAMs of the part
    bram_bits: int       # bits of one block RAM (data and parity: 512 x 36 for a DP16KD)
    bram_width: int      # widest data port of one block RAM, bits
    baud: int = 115200
    margin_blocks: int = 8  # left free for the synthesis tool's own choices


BOARDS = {
    "ulx3s-85f": BoardSpec("ulx3s-85f", "lfe5u-85f", 25e6, 208, 18432, 36),
}


def board(name: str) -> BoardSpec:
    if name.lower() not in BOARDS:
        raise CelosiaError(f"unknown board {name!r}; boards are {', '.join(BOARDS)} "
                           f"(and pynq-z1, whose files `celosia fpga build --board pynq-z1` "
                           f"writes for Vivado)")
    return BOARDS[name.lower()]


def _blocks(depth: int, width_bits: int, spec: BoardSpec) -> int:
    """Block RAMs of a ``depth`` x ``width_bits`` memory: whole blocks side by side for
    the width, and enough rows for the bytes."""
    wide = -(-width_bits // spec.bram_width)
    rows_per_block = spec.bram_bits // spec.bram_width
    return wide * -(-depth // rows_per_block)


def core_bram_blocks(cfg: HwConfig, spec: BoardSpec) -> int:
    """The core's block RAMs, counted from its buffers (ACC twice: two read ports). The
    small preset counts 15 here, what Yosys uses for it (docs/fpga.md, docs/board.md)."""
    buffers = [(cfg.uop_depth, 32), (cfg.inp_depth, 8 * cfg.inp_elem_bytes),
               (cfg.wgt_depth, 8 * cfg.wgt_elem_bytes), (cfg.acc_depth, 8 * cfg.acc_elem_bytes),
               (cfg.acc_depth, 8 * cfg.acc_elem_bytes), (cfg.acc_depth, 8 * cfg.out_elem_bytes)]
    return sum(_blocks(d, w, spec) for d, w in buffers)


def ram_bram_blocks(cfg: HwConfig, ram_bytes: int, spec: BoardSpec) -> int:
    return _blocks(ram_bytes // cfg.bus_bytes, 8 * cfg.bus_bytes, spec)


def ram_bytes_for(cfg: HwConfig, spec: BoardSpec) -> int:
    """The largest power-of-two RAM (at least 4 KiB) that fits beside the core."""
    free = spec.bram_blocks - spec.margin_blocks - core_bram_blocks(cfg, spec)
    size = 4096
    if ram_bram_blocks(cfg, size, spec) > free:
        check_fit(cfg, size, spec)  # raises
    while ram_bram_blocks(cfg, 2 * size, spec) <= free:
        size *= 2
    return size


def check_fit(cfg: HwConfig, ram_bytes: int, spec: BoardSpec) -> None:
    """Raise BoardFitError when the core and a RAM of ``ram_bytes`` need more block RAMs
    than the board's part has (less the margin)."""
    if ram_bytes < 4096 or ram_bytes % cfg.bus_bytes or ram_bytes >= 1 << 32:
        raise BoardFitError(f"the board RAM must be at least 4096 bytes, a multiple of "
                            f"bus_bytes ({cfg.bus_bytes}) and below 4 GiB, not {ram_bytes}")
    core = core_bram_blocks(cfg, spec)
    ram = ram_bram_blocks(cfg, ram_bytes, spec)
    have = spec.bram_blocks - spec.margin_blocks
    if core + ram > have:
        hint = ("shrink the RAM (--ram-kib)" if core < have else
                "use a configuration with smaller buffers (log_*_buff_size), e.g. --config small")
        raise BoardFitError(
            f"the {spec.name}'s {spec.part} has {spec.bram_blocks} block RAMs ({have} usable); "
            f"the core's buffers need {core} and a {ram_bytes // 1024} KiB RAM {ram}: {hint}")


class AxiRam(wiring.Component):
    """``depth`` rows of ``8 * bus_bytes`` bits behind an AXI4 slave (INCR bursts, one
    burst at a time per direction), and a byte port for the host bridge that takes the RAM
    while ``host_sel`` is high (only when the accelerator is stopped).

    Read timing: a burst's first beat is valid two cycles after its AR is accepted, then
    one beat per cycle while RREADY; writes take one beat per cycle and answer B the cycle
    after WLAST."""

    def __init__(self, bus_bytes: int, depth: int):
        self.bus_bytes, self.depth = bus_bytes, depth
        addr_bits = max(1, (depth * bus_bytes - 1).bit_length())
        super().__init__({
            "axi": In(Axi4Signature(8 * bus_bytes)),
            "host_sel": In(1), "host_addr": In(addr_bits), "host_we": In(1),
            "host_wdata": In(8), "host_rdata": Out(8),
        })

    def elaborate(self, platform):
        m = Module()
        bb = self.bus_bytes
        lo = (bb - 1).bit_length()
        row_bits = max(1, (self.depth - 1).bit_length())
        m.submodules.mem = mem = memory.Memory(shape=8 * bb, depth=self.depth, init=[])
        wp = mem.write_port(granularity=8)
        rp = mem.read_port()
        axi = self.axi

        def row(byte_addr):
            return byte_addr[lo:lo + row_bits]

        # ---- host byte port -------------------------------------------------------------
        sel_lo = Signal(max(1, lo))
        m.d.sync += sel_lo.eq(self.host_addr[:lo] if lo else 0)
        m.d.comb += self.host_rdata.eq(rp.data.word_select(sel_lo, 8) if lo else rp.data[:8])

        # ---- AXI reads -------------------------------------------------------------------
        r_row = Signal(row_bits)
        r_left = Signal(9)
        r_fire = axi.rvalid & axi.rready
        with m.FSM(name="rd"):
            with m.State("IDLE"):
                m.d.comb += axi.arready.eq(1)
                with m.If(axi.arvalid):
                    m.d.sync += [r_row.eq(row(axi.araddr)), r_left.eq(axi.arlen + 1)]
                    m.next = "FIRST"
            with m.State("FIRST"):  # the row's address goes to the RAM
                m.d.comb += rp.addr.eq(r_row)
                m.next = "BEATS"
            with m.State("BEATS"):
                m.d.comb += [axi.rvalid.eq(1), axi.rdata.eq(rp.data), axi.rlast.eq(r_left == 1),
                             rp.addr.eq(r_row + r_fire)]
                with m.If(r_fire):
                    m.d.sync += [r_row.eq(r_row + 1), r_left.eq(r_left - 1)]
                    with m.If(r_left == 1):
                        m.next = "IDLE"

        # ---- AXI writes ------------------------------------------------------------------
        w_row = Signal(row_bits)
        with m.FSM(name="wr"):
            with m.State("IDLE"):
                m.d.comb += axi.awready.eq(1)
                with m.If(axi.awvalid):
                    m.d.sync += w_row.eq(row(axi.awaddr))
                    m.next = "BEATS"
            with m.State("BEATS"):
                m.d.comb += [axi.wready.eq(1), wp.addr.eq(w_row), wp.data.eq(axi.wdata)]
                with m.If(axi.wvalid):
                    m.d.comb += wp.en.eq(axi.wstrb)
                    m.d.sync += w_row.eq(w_row + 1)
                    with m.If(axi.wlast):
                        m.next = "RESP"
            with m.State("RESP"):
                m.d.comb += axi.bvalid.eq(1)
                with m.If(axi.bready):
                    m.next = "IDLE"

        # ---- the host bridge takes both ports while host_sel --------------------------------
        with m.If(self.host_sel):
            m.d.comb += [rp.addr.eq(row(self.host_addr)), wp.addr.eq(row(self.host_addr)),
                         wp.data.eq(Cat(*[self.host_wdata] * bb)),
                         wp.en.eq(self.host_we << (self.host_addr[:lo] if lo else 0))]
        return m


class BoardTop(wiring.Component):
    """The accelerator for ``cfg``, ``ram_bytes`` of on-chip RAM as its DRAM (from address
    0) and the UART host bridge (``divisor`` clocks per bit)."""

    def __init__(self, cfg: HwConfig, *, ram_bytes: int, divisor: int):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"cfg must be an HwConfig, not {cfg!r}")
        if ram_bytes < 4096 or ram_bytes % cfg.bus_bytes or ram_bytes >= 1 << 32:
            raise BoardFitError(f"the board RAM must be at least 4096 bytes, a multiple of "
                                f"bus_bytes ({cfg.bus_bytes}) and below 4 GiB, not {ram_bytes}")
        if not isinstance(divisor, int) or divisor < MIN_DIVISOR:
            raise CelosiaError(f"the UART divisor must be an integer >= {MIN_DIVISOR}, "
                               f"not {divisor!r}")
        self.cfg, self.ram_bytes, self.divisor = cfg, ram_bytes, divisor
        super().__init__({"uart_rx": In(1, init=1), "uart_tx": Out(1, init=1),
                          "leds": Out(8)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.accel = accel = Accelerator(cfg)
        m.submodules.ram = ram = AxiRam(cfg.bus_bytes, self.ram_bytes // cfg.bus_bytes)
        m.submodules.bridge = bridge = HostBridge(ram_bytes=self.ram_bytes,
                                                  config_id=config_id(cfg),
                                                  divisor=self.divisor)
        wiring.connect(m, accel.m_axi, ram.axi)
        wiring.connect(m, bridge.axil, accel.s_axil)
        m.d.comb += [
            bridge.uart_rx.eq(self.uart_rx), self.uart_tx.eq(bridge.uart_tx),
            ram.host_sel.eq(bridge.mem_sel), ram.host_addr.eq(bridge.mem_addr),
            ram.host_we.eq(bridge.mem_we), ram.host_wdata.eq(bridge.mem_wdata),
            bridge.mem_rdata.eq(ram.host_rdata),
            self.leds.eq(Cat(bridge.running, bridge.active)),
        ]
        return m
