"""The PYNQ-Z1 files (fpga/pynq.py): complete and consistent (Vivado is not available: the
names the block-design script uses must be the wrapper's ports, and the wrapper's
connections the core's ports), and the DRAM_BASE register of PynqTop in simulation."""

from __future__ import annotations

import re

import pytest

from celosia.config import HwConfig
from celosia.fpga.pynq import CORE_TOP, WRAPPER_TOP, PynqTop, write_pynq

SMALL = HwConfig.preset("small")

_AXI4_MASTER = ("awaddr awlen awsize awburst awvalid awready wdata wstrb wlast wvalid wready "
                "bresp bvalid bready araddr arlen arsize arburst arvalid arready rdata rresp "
                "rlast rvalid rready").split()
_AXI_LITE = ("awaddr awvalid awready wdata wstrb wvalid wready bresp bvalid bready araddr "
             "arvalid arready rdata rresp rvalid rready").split()


def _module_ports(text: str, module: str) -> set[str]:
    head = re.search(rf"module\s+{module}\s*\((.*?)\);", text, re.S)
    assert head, f"module {module} not found"
    ports = set()
    for item in head.group(1).split(","):
        item = re.sub(r"\(\*.*?\*\)", "", item, flags=re.S).strip()
        if item:
            ports.add(item.split()[-1])
    return ports


def test_pynq_files_are_complete_and_consistent(tmp_path):
    paths = write_pynq(SMALL, tmp_path)
    names = {p.name for p in paths}
    assert names == {"celosia_accel.v", "celosia_pynq.v", "build.tcl", "README.md"}
    core_v = (tmp_path / "celosia_accel.v").read_text()
    wrap_v = (tmp_path / "celosia_pynq.v").read_text()
    tcl = (tmp_path / "build.tcl").read_text()

    core_ports = _module_ports(core_v, CORE_TOP)
    wrap_ports = _module_ports(wrap_v, WRAPPER_TOP)
    # the wrapper connects every core port, to a port of its own (or the inverted reset)
    conns = dict(re.findall(r"\.(\w+)\(([^)]*)\)", wrap_v))
    assert set(conns) == core_ports
    for inner, outer in conns.items():
        assert outer.lstrip("~") in wrap_ports, (inner, outer)
    # full AXI4 master and AXI4-Lite slave, with Vivado's names and interface attributes
    for sig in _AXI4_MASTER:
        assert f"m_axi_gmem_{sig}" in wrap_ports
        assert f'aximm:1.0 m_axi_gmem {sig.upper()}"' in wrap_v
    for sig in _AXI_LITE:
        assert f"s_axi_control_{sig}" in wrap_ports
    assert {"ap_clk", "ap_rst_n"} <= wrap_ports
    assert re.search(r"input wire \[31:0\] m_axi_gmem_rdata|input wire \[63:0\] "
                     r"m_axi_gmem_rdata", wrap_v)
    assert "input wire [31:0] m_axi_gmem_araddr" not in wrap_v
    assert "output wire [31:0] m_axi_gmem_araddr" in wrap_v

    # the Tcl script: its files exist, its module is the wrapper, its pins are its ports
    for f in re.search(r"add_files -norecurse \[list (.*?)\]", tcl).group(1).split():
        assert (tmp_path / f.replace("$here/", "")).exists(), f
    assert re.search(rf"-reference {WRAPPER_TOP} accel", tcl)
    prefixes = {p.rsplit("_", 1)[0] for p in wrap_ports if p.startswith(("s_axi", "m_axi"))}
    pins = set(re.findall(r"accel/(\w+)", tcl))
    assert pins and pins <= prefixes | {"ap_clk"}
    assert {"s_axi_control", "m_axi_gmem"} <= pins
    for ps_intf in ("M_AXI_GP0", "S_AXI_HP0", "FCLK_CLK0"):
        assert f"ps7/{ps_intf}" in tcl
    assert "xc7z020clg400-1" in tcl and "processing_system7" in tcl
    assert "PCW_FPGA0_PERIPHERAL_FREQMHZ {100}" in tcl
    assert "write_bitstream" in tcl and "celosia.hwh" in tcl
    readme = (tmp_path / "README.md").read_text()
    assert "vivado -mode batch -source build.tcl" in readme and "DRAM_BASE" in readme


def test_pynq_top_dram_base_register():
    """Writes to 0x100 set DRAM_BASE (read back there); the core's registers stay where
    they are (INSN_COUNT at 0x04), and a write to 0x100 does not reach CONTROL."""
    from amaranth.sim import Simulator

    dut = PynqTop(SMALL)
    results = {}

    async def write(ctx, addr, value):
        bus = dut.s_axil
        ctx.set(bus.awaddr, addr)
        ctx.set(bus.wdata, value)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        ctx.set(bus.bready, 1)
        for _ in range(10):
            accepted = ctx.get(bus.awready) and ctx.get(bus.wready)
            await ctx.tick()
            if accepted:
                break
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        for _ in range(10):
            if ctx.get(bus.bvalid):
                break
            await ctx.tick()
        assert ctx.get(bus.bvalid)
        await ctx.tick()
        ctx.set(bus.bready, 0)

    async def read(ctx, addr):
        bus = dut.s_axil
        ctx.set(bus.araddr, addr)
        ctx.set(bus.arvalid, 1)
        ctx.set(bus.rready, 1)
        for _ in range(10):
            accepted = ctx.get(bus.arready)
            await ctx.tick()
            if accepted:
                break
        ctx.set(bus.arvalid, 0)
        for _ in range(10):
            if ctx.get(bus.rvalid):
                break
            await ctx.tick()
        value = ctx.get(bus.rdata)
        await ctx.tick()
        ctx.set(bus.rready, 0)
        return value

    async def bench(ctx):
        await ctx.tick().repeat(3)
        await write(ctx, 0x100, 0x1F00_0000)
        await write(ctx, 0x004, 7)
        results["base"] = await read(ctx, 0x100)
        results["count"] = await read(ctx, 0x004)
        results["control"] = await read(ctx, 0x000)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert results == {"base": 0x1F00_0000, "count": 7, "control": 0}


@pytest.mark.slow
def test_pynq_default_files(tmp_path):
    """The default configuration's files (the core the PYNQ-Z1 is for)."""
    write_pynq(HwConfig.preset("default"), tmp_path)
    assert "log_block = 4" in (tmp_path / "celosia_accel.v").read_text()[:2000]
