"""PYNQ-Z1 (Zynq xc7z020): the files a Vivado user needs (``celosia fpga build --board
pynq-z1``; docs/board.md). Vivado is not open, so celosia writes its inputs and stops:

- ``celosia_accel.v``: the core (hw/export.py, GEMM products two per DSP48E1) inside
  ``PynqTop`` below, as one Verilog file;
- ``celosia_pynq.v``: a wrapper with Vivado's interface names and attributes: ``ap_clk``,
  ``ap_rst_n``, the AXI4-Lite slave ``s_axi_control`` (12-bit addresses: the core's register
  map at 0x000-0x0FF, DRAM_BASE at 0x100) and the AXI4 master ``m_axi_gmem`` (32-bit
  addresses, the DDR through the PS's HP0 port);
- ``build.tcl``: the block design (Zynq PS, AXI interconnects, the accelerator at 100 MHz
  from FCLK_CLK0), synthesis, implementation, and the overlay files ``celosia.bit`` and
  ``celosia.hwh`` for pynq's ``Overlay``;
- ``README.md``: how to build and what is not done.

``DRAM_BASE`` is added to every address the core sends, so programs laid out from address 0
(as celosia's images are) run from a contiguous buffer anywhere in the DDR (pynq.allocate:
its ``physical_address``).
"""

from __future__ import annotations

from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from celosia.config import HwConfig
from celosia.hw.axi import Axi4Signature, AxiLiteSignature
from celosia.hw.core import Accelerator

__all__ = ["PynqTop", "write_pynq", "wrapper_ports", "DRAM_BASE_OFFSET", "CORE_TOP",
           "WRAPPER_TOP"]

CORE_TOP = "celosia_pynq_core"
WRAPPER_TOP = "celosia_pynq"
DRAM_BASE_OFFSET = 0x100
LITE_ADDR_BITS = 12
GMEM_ADDR_BITS = 32
_LITE_SIG = AxiLiteSignature(LITE_ADDR_BITS)


def _gmem_signature(cfg: HwConfig) -> wiring.Signature:
    members = dict(Axi4Signature(8 * cfg.bus_bytes).members.items())
    members["araddr"] = Out(GMEM_ADDR_BITS)
    members["awaddr"] = Out(GMEM_ADDR_BITS)
    return wiring.Signature(members)


class PynqTop(wiring.Component):
    """The accelerator with a DRAM_BASE register (at 0x100 of the AXI4-Lite space) added to
    its 64-bit DRAM addresses, which leave as 32-bit physical addresses."""

    def __init__(self, cfg: HwConfig):
        self.cfg = cfg
        super().__init__({"m_axi": Out(_gmem_signature(cfg)), "s_axil": In(_LITE_SIG)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = Accelerator(self.cfg, gemm_products="dsp_pair")
        bus, inner, outer = self.s_axil, core.s_axil, core.m_axi
        base = Signal(GMEM_ADDR_BITS)
        own_b = Signal()
        own_r = Signal()
        own_rdata = Signal(32)
        mine_w = bus.awaddr[8]
        mine_r = bus.araddr[8]
        own_w_accept = bus.awvalid & bus.wvalid & mine_w & ~own_b & ~inner.bvalid
        own_r_accept = bus.arvalid & mine_r & ~own_r & ~inner.rvalid
        m.d.comb += [
            inner.awaddr.eq(bus.awaddr[:8]), inner.wdata.eq(bus.wdata),
            inner.wstrb.eq(bus.wstrb), inner.araddr.eq(bus.araddr[:8]),
            inner.awvalid.eq(bus.awvalid & ~mine_w), inner.wvalid.eq(bus.wvalid & ~mine_w),
            inner.arvalid.eq(bus.arvalid & ~mine_r),
            inner.bready.eq(bus.bready), inner.rready.eq(bus.rready),
            bus.awready.eq(Mux(mine_w, own_w_accept, inner.awready)),
            bus.wready.eq(Mux(mine_w, own_w_accept, inner.wready)),
            bus.bvalid.eq(inner.bvalid | own_b), bus.bresp.eq(0),
            bus.arready.eq(Mux(mine_r, own_r_accept, inner.arready)),
            bus.rvalid.eq(inner.rvalid | own_r), bus.rresp.eq(0),
            bus.rdata.eq(Mux(own_r, own_rdata, inner.rdata)),
        ]
        with m.If(own_w_accept):
            m.d.sync += [base.eq(bus.wdata), own_b.eq(1)]
        with m.Elif(own_b & bus.bready):
            m.d.sync += own_b.eq(0)
        with m.If(own_r_accept):
            m.d.sync += [own_rdata.eq(Mux(bus.araddr[2:8] == 0, base, 0)), own_r.eq(1)]
        with m.Elif(own_r & bus.rready):
            m.d.sync += own_r.eq(0)
        out = self.m_axi
        for name in _gmem_signature(self.cfg).members:
            if name in ("araddr", "awaddr"):
                m.d.comb += getattr(out, name).eq(getattr(outer, name)[:GMEM_ADDR_BITS] + base)
            elif _gmem_signature(self.cfg).members[name].flow == wiring.Out:
                m.d.comb += getattr(out, name).eq(getattr(outer, name))
            else:
                m.d.comb += getattr(outer, name).eq(getattr(out, name))
        return m


def wrapper_ports(cfg: HwConfig) -> list[tuple[str, str, int, str]]:
    """The wrapper's ports: (name, direction, width, the core port it connects to)."""
    ports = [("ap_clk", "input", 1, "clk"), ("ap_rst_n", "input", 1, "rst")]
    for prefix, inner, sig, flip in (("s_axi_control", "s_axil", _LITE_SIG, True),
                                     ("m_axi_gmem", "m_axi", _gmem_signature(cfg), False)):
        for name, member in sig.members.items():
            out = (member.flow == wiring.Out) != flip
            width = member.shape.width if hasattr(member.shape, "width") else int(member.shape)
            ports.append((f"{prefix}_{name}", "output" if out else "input", width,
                          f"{inner}__{name}"))
    return ports


def _wrapper_verilog(cfg: HwConfig) -> str:
    freq = int(cfg.clock_mhz * 1e6)
    lines = [f"// celosia on the PYNQ-Z1: {WRAPPER_TOP} wraps {CORE_TOP} (celosia_accel.v) with "
             f"Vivado's interface names.", f"module {WRAPPER_TOP} ("]
    decl = []
    for name, direction, width, _ in wrapper_ports(cfg):
        rng = f" [{width - 1}:0]" if width > 1 else ""
        if name == "ap_clk":
            attr = ('(* X_INTERFACE_INFO = "xilinx.com:signal:clock:1.0 ap_clk CLK", '
                    'X_INTERFACE_PARAMETER = "ASSOCIATED_BUSIF s_axi_control:m_axi_gmem, '
                    f'ASSOCIATED_RESET ap_rst_n, FREQ_HZ {freq}" *)')
        elif name == "ap_rst_n":
            attr = ('(* X_INTERFACE_INFO = "xilinx.com:signal:reset:1.0 ap_rst_n RST", '
                    'X_INTERFACE_PARAMETER = "POLARITY ACTIVE_LOW" *)')
        else:
            bus, sig = name.rsplit("_", 1)
            kind = "aximm:1.0"
            attr = f'(* X_INTERFACE_INFO = "xilinx.com:interface:{kind} {bus} {sig.upper()}" *)'
        decl.append(f"  {attr}\n  {direction} wire{rng} {name}")
    lines.append(",\n".join(decl))
    lines.append(");")
    conns = []
    for name, _, _, inner in wrapper_ports(cfg):
        if inner == "rst":
            conns.append("    .rst(~ap_rst_n)")
        else:
            conns.append(f"    .{inner}({name})")
    lines.append(f"  {CORE_TOP} core (\n" + ",\n".join(conns) + "\n  );")
    lines.append("endmodule")
    return "\n".join(lines) + "\n"


_TCL = r"""# celosia accelerator on the PYNQ-Z1 (xc7z020clg400-1): block design, bitstream and the
# pynq overlay files. Written by `celosia fpga build --board pynq-z1`; run it with
#     vivado -mode batch -source build.tcl
set here [file dirname [file normalize [info script]]]
create_project celosia_pynq $here/vivado -part xc7z020clg400-1 -force
if {[llength [get_board_parts -quiet {*pynq-z1*}]]} {
    set_property board_part [lindex [get_board_parts -quiet {*pynq-z1*}] end] [current_project]
}
add_files -norecurse [list $here/celosia_accel.v $here/celosia_pynq.v]
update_compile_order -fileset sources_1
create_bd_design "celosia"

# the Zynq processing system: GP0 master for the registers, HP0 slave for the DDR
set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:processing_system7:5.5 ps7]
apply_bd_automation -rule xilinx.com:bd_rule:processing_system7 \
    -config {make_external "FIXED_IO, DDR" apply_board_preset "1" Master "Disable" Slave "Disable"} $ps
set_property -dict [list \
    CONFIG.PCW_USE_M_AXI_GP0 {1} \
    CONFIG.PCW_USE_S_AXI_HP0 {1} \
    CONFIG.PCW_S_AXI_HP0_DATA_WIDTH {@DATA_WIDTH@} \
    CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ {@CLOCK_MHZ@} \
] $ps

# the accelerator (celosia_pynq.v)
set accel [create_bd_cell -type module -reference @WRAPPER@ accel]

# AXI interconnects, resets and clocks: GP0 -> s_axi_control, m_axi_gmem -> HP0
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config { \
    Clk_master {/ps7/FCLK_CLK0 (@CLOCK_MHZ@ MHz)} Clk_slave {Auto} Clk_xbar {Auto} \
    Master {/ps7/M_AXI_GP0} Slave {/accel/s_axi_control} \
    intc_ip {New AXI Interconnect} master_apm {0}} [get_bd_intf_pins accel/s_axi_control]
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config { \
    Clk_master {Auto} Clk_slave {/ps7/FCLK_CLK0 (@CLOCK_MHZ@ MHz)} Clk_xbar {Auto} \
    Master {/accel/m_axi_gmem} Slave {/ps7/S_AXI_HP0} \
    intc_ip {New AXI Interconnect} master_apm {0}} [get_bd_intf_pins ps7/S_AXI_HP0]
if {[llength [get_bd_nets -quiet -of_objects [get_bd_pins accel/ap_clk]]] == 0} {
    connect_bd_net [get_bd_pins ps7/FCLK_CLK0] [get_bd_pins accel/ap_clk]
}

# addresses: the registers at 0x43C0_0000 (4 KiB), the whole DDR for the accelerator
assign_bd_address
set regs [get_bd_addr_segs {ps7/Data/SEG_accel_*}]
set_property offset 0x43C00000 $regs
set_property range 4K $regs
validate_bd_design
save_bd_design

make_wrapper -files [get_files celosia.bd] -top
add_files -norecurse [glob $here/vivado/celosia_pynq.gen/sources_1/bd/celosia/hdl/celosia_wrapper.v]
set_property top celosia_wrapper [current_fileset]
update_compile_order -fileset sources_1
launch_runs impl_1 -to_step write_bitstream -jobs 4
wait_on_run impl_1

# the pynq overlay: celosia.bit and celosia.hwh side by side
file mkdir $here/overlay
file copy -force [glob $here/vivado/celosia_pynq.runs/impl_1/*.bit] $here/overlay/celosia.bit
file copy -force [glob $here/vivado/celosia_pynq.gen/sources_1/bd/celosia/hw_handoff/celosia.hwh] \
    $here/overlay/celosia.hwh
puts "celosia: wrote $here/overlay/celosia.bit and celosia.hwh"
"""

_README = """# celosia on the PYNQ-Z1

Written by `celosia fpga build --board pynq-z1 --config {config}`. Vivado (2020.2 or later,
with the Zynq-7000 devices) builds the bitstream:

    vivado -mode batch -source build.tcl

which makes a block design (Zynq PS; an AXI interconnect from the PS's GP0 master to the
accelerator's registers `s_axi_control` at 0x43C0_0000; an AXI interconnect from the
accelerator's DMA master `m_axi_gmem` to the PS's HP0 port, so it reaches the DDR;
FCLK_CLK0 at {clock} MHz for both), implements it and writes `overlay/celosia.bit` and
`overlay/celosia.hwh`, the two files pynq's `Overlay` loads.

| file | what |
| --- | --- |
| `celosia_accel.v` | the accelerator ({config}: {block}, {bus}-byte bus) with the DRAM_BASE register, module `{core}` |
| `celosia_pynq.v` | module `{wrapper}`: Vivado's interface names (`ap_clk`, `ap_rst_n`, `s_axi_control_*`, `m_axi_gmem_*`) |
| `build.tcl` | the block design, synthesis, implementation, the overlay files |

## Registers (offsets from 0x43C0_0000)

0x000-0x0FF: the core's register map (celosia's hw/regs.py; ISA.md section 5): CONTROL at
0x00 (write 1 to start; read bit 1 = done, bit 2 = error), INSN_COUNT 0x04, INSN_ADDR
0x08, DRAM_SIZE 0x10, ERROR_CODE 0x18, CYCLES 0x20, then status and counters.
0x100: DRAM_BASE, a physical address added to every address the core sends. Put a program
image (`celosia exec`'s format: its DRAM from address 0) into one contiguous buffer
(`pynq.allocate`), write the buffer's `physical_address` to DRAM_BASE, INSN_ADDR and
INSN_COUNT as the image says, DRAM_SIZE = the buffer's size, then CONTROL = 1, and poll
CONTROL until bit 1.

## Not done

- The bitstream was never built here (no Vivado); the script follows Vivado's documented
  block-design commands, and a test checks that its interface names match the Verilog's ports.
- There is no PYNQ executor in celosia's driver yet (the register sequence above is what
  it would do, with pynq's MMIO and allocate); the DDR buffer must be flushed from the
  CPU's caches (`buffer.flush()` / `invalidate()`), since HP0 is not cache-coherent.
"""


def write_pynq(cfg: HwConfig, out: Path) -> list[Path]:
    """Write the PYNQ-Z1 files for ``cfg`` into ``out``; their paths."""
    from celosia.config import PRESETS

    out.mkdir(parents=True, exist_ok=True)
    core = verilog.convert(PynqTop(cfg), name=CORE_TOP, emit_src=False)
    header = ("/* celosia accelerator for the PYNQ-Z1, configuration:\n"
              + "\n".join(f" *   {k} = {v}" for k, v in cfg.to_dict().items()) + "\n */\n")
    files = {
        "celosia_accel.v": header + core,
        "celosia_pynq.v": _wrapper_verilog(cfg),
        "build.tcl": (_TCL.replace("@DATA_WIDTH@", str(min(64, max(32, 8 * cfg.bus_bytes))))
                      .replace("@CLOCK_MHZ@", f"{cfg.clock_mhz:g}")
                      .replace("@WRAPPER@", WRAPPER_TOP)),
        "README.md": _README.format(
            config=next((n for n, p in PRESETS.items() if p == cfg), "a custom configuration"),
            clock=f"{cfg.clock_mhz:g}", block=f"{cfg.batch}x{cfg.block}x{cfg.block} GEMM",
            bus=cfg.bus_bytes, core=CORE_TOP, wrapper=WRAPPER_TOP),
    }
    paths = []
    for name, text in files.items():
        (out / name).write_text(text)
        paths.append(out / name)
    return paths
