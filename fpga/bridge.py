"""The host bridge of a board top: a UART, the framed protocol of fpga/protocol.py, an
AXI4-Lite master to the accelerator's register file and a byte port to the board's RAM.

One request at a time: the bridge reads a request, checks it, acts, and answers; bytes that
arrive while it answers are dropped. Between requests it reads CONTROL over and over, so
``running`` (an LED on the board; the Verilator harness sleeps while it is low and no byte is
in flight) follows the accelerator within a few cycles.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from celosia.hw.axi import AxiLiteSignature
from celosia.hw.regs import REG_ADDR_WIDTH, reg

from .protocol import GAP_BYTE_TIMES, SYNC_REQ, SYNC_RSP, Cmd, Status
from .uart import UartRx, UartTx

__all__ = ["HostBridge"]


class HostBridge(wiring.Component):
    """``ram_bytes`` (the RAM behind ``mem_*``), ``config_id`` (answered to INFO) and
    ``divisor`` (UART clocks per bit) are fixed at elaboration.

    ``mem_sel`` high: the bridge owns the RAM; ``mem_addr`` is a byte address, ``mem_we``
    writes ``mem_wdata`` there, and ``mem_rdata`` is the byte at the ``mem_addr`` of the
    previous cycle."""

    def __init__(self, *, ram_bytes: int, config_id: int, divisor: int):
        self.ram_bytes, self.config_id, self.divisor = ram_bytes, config_id, divisor
        addr_bits = max(1, (ram_bytes - 1).bit_length())
        super().__init__({
            "uart_rx": In(1, init=1), "uart_tx": Out(1, init=1),
            "axil": Out(AxiLiteSignature(REG_ADDR_WIDTH)),
            "mem_sel": Out(1), "mem_addr": Out(addr_bits), "mem_we": Out(1),
            "mem_wdata": Out(8), "mem_rdata": In(8),
            "running": Out(1), "active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx = rx = UartRx(self.divisor)
        m.submodules.tx = tx = UartTx(self.divisor)
        m.d.comb += [rx.rx.eq(self.uart_rx), self.uart_tx.eq(tx.tx)]
        bus = self.axil
        rxv, rxd = rx.valid, rx.data
        control = reg("control").offset

        hdr = Signal(56)
        idx = Signal(range(7))
        cmd = Signal(8)
        addr = Signal(32)
        length = Signal(16)
        count = Signal(17)
        status = Signal(3)
        isum = Signal(8)
        osum = Signal(8)
        wval = Signal(32)
        word = Signal(64)
        got_sync = Signal()
        outstanding = Signal()
        running = Signal()
        gap_limit = GAP_BYTE_TIMES * 10 * self.divisor
        gap = Signal(range(gap_limit + 1))
        m.d.comb += [self.running.eq(running), bus.wstrb.eq(0xF)]

        def send(value, then):
            m.d.comb += [tx.data.eq(value), tx.valid.eq(1)]
            with m.If(tx.ready):
                then()

        def receiving(state_body):
            """A state that takes request bytes: a long gap drops the request."""
            with m.If(rxv):
                m.d.sync += gap.eq(0)
                state_body()
            with m.Elif(gap == gap_limit):
                m.next = "IDLE"
            with m.Else():
                m.d.sync += gap.eq(gap + 1)

        with m.FSM():
            with m.State("IDLE"):
                # poll CONTROL while no request is under way
                m.d.comb += [bus.araddr.eq(control), bus.arvalid.eq(~outstanding & ~got_sync),
                             bus.rready.eq(1)]
                with m.If(bus.arvalid & bus.arready):
                    m.d.sync += outstanding.eq(1)
                with m.If(bus.rvalid):
                    m.d.sync += [outstanding.eq(0), running.eq(bus.rdata[0])]
                with m.If(rxv & (rxd == SYNC_REQ)):
                    m.d.sync += got_sync.eq(1)
                with m.If(got_sync & ~outstanding):
                    m.d.sync += [got_sync.eq(0), idx.eq(0), isum.eq(0), gap.eq(0)]
                    m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += self.active.eq(1)

                def header():
                    m.d.sync += [hdr.eq(Cat(hdr[8:], rxd)), isum.eq(isum + rxd),
                                 idx.eq(idx + 1)]
                    with m.If(idx == 6):
                        m.next = "DECODE"
                receiving(header)
            with m.State("DECODE"):
                m.d.comb += self.active.eq(1)
                c, a, n = hdr[0:8], hdr[8:40], hdr[40:56]
                m.d.sync += [cmd.eq(c), addr.eq(a), length.eq(n), wval.eq(0),
                             count.eq(n)]
                reg_ok = (a < (1 << REG_ADDR_WIDTH)) & (a[0:2] == 0)
                mem_ok = (Cat(a, Const(0, 1)) + n) <= self.ram_bytes
                with m.Switch(c):
                    with m.Case(Cmd.INFO):
                        m.d.sync += status.eq(Status.OK)
                        with m.If((n != 0) | (a != 0)):
                            m.d.sync += status.eq(Status.BAD_CMD)
                    with m.Case(Cmd.REG_WRITE, Cmd.REG_READ):
                        m.d.sync += status.eq(Status.OK)
                        with m.If(~reg_ok):
                            m.d.sync += status.eq(Status.RANGE)
                        with m.If(n != _reg_len(c)):
                            m.d.sync += status.eq(Status.BAD_CMD)
                    with m.Case(Cmd.MEM_WRITE, Cmd.MEM_READ, Cmd.MEM_ZERO):
                        m.d.sync += status.eq(Status.OK)
                        with m.If(~mem_ok):
                            m.d.sync += status.eq(Status.RANGE)
                        with m.If(n == 0):
                            m.d.sync += status.eq(Status.BAD_CMD)
                    with m.Default():
                        m.d.sync += status.eq(Status.BAD_CMD)
                # the payload follows only for a write (odd command codes)
                with m.If(~c[0]):
                    m.d.sync += count.eq(0)
                with m.If((c == Cmd.MEM_WRITE) | (c == Cmd.MEM_READ) | (c == Cmd.MEM_ZERO)):
                    m.next = "BUSY_AR"
                with m.Else():
                    m.next = "PAYLOAD"
            with m.State("BUSY_AR"):  # is the accelerator running? (memory is off-limits)
                m.d.comb += [self.active.eq(1), bus.araddr.eq(control), bus.arvalid.eq(1)]
                with m.If(bus.arready):
                    m.next = "BUSY_R"
            with m.State("BUSY_R"):
                m.d.comb += [self.active.eq(1), bus.rready.eq(1)]
                with m.If(bus.rvalid):
                    m.d.sync += running.eq(bus.rdata[0])
                    with m.If(bus.rdata[0] & (status == Status.OK)):
                        m.d.sync += status.eq(Status.BUSY)
                    m.next = "PAYLOAD"
            with m.State("PAYLOAD"):
                m.d.comb += self.active.eq(1)
                writing = (cmd == Cmd.MEM_WRITE) & (status == Status.OK)
                m.d.comb += [self.mem_sel.eq(writing), self.mem_addr.eq(addr),
                             self.mem_wdata.eq(rxd)]
                with m.If(count == 0):
                    m.next = "CHECKSUM"
                with m.Else():
                    def payload():
                        m.d.comb += self.mem_we.eq(writing)
                        m.d.sync += [isum.eq(isum + rxd), count.eq(count - 1),
                                     addr.eq(addr + 1), wval.eq(Cat(wval[8:], rxd))]
                    receiving(payload)
            with m.State("CHECKSUM"):
                m.d.comb += self.active.eq(1)

                def check():
                    with m.If((isum + rxd)[0:8] != 0):
                        m.d.sync += status.eq(Status.BAD_SUM)
                    m.next = "EXEC"
                receiving(check)
            with m.State("EXEC"):
                m.d.comb += self.active.eq(1)
                m.d.sync += addr.eq(hdr[8:40])  # back to the start (after a MEM_WRITE)
                m.next = "REPLY_SYNC"
                with m.If(status == Status.OK):
                    with m.Switch(cmd):
                        with m.Case(Cmd.REG_WRITE):
                            m.next = "REG_AW"
                        with m.Case(Cmd.REG_READ):
                            m.next = "REG_AR"
                        with m.Case(Cmd.MEM_ZERO):
                            m.d.sync += count.eq(length)
                            m.next = "ZERO"
                        with m.Case(Cmd.INFO):
                            m.d.sync += word.eq(Cat(Const(self.ram_bytes, 32),
                                                    Const(self.config_id, 32)))
            with m.State("ZERO"):  # one byte per cycle
                m.d.comb += [self.active.eq(1), self.mem_sel.eq(1), self.mem_addr.eq(addr),
                             self.mem_wdata.eq(0), self.mem_we.eq(1)]
                m.d.sync += [addr.eq(addr + 1), count.eq(count - 1)]
                with m.If(count == 1):
                    m.next = "REPLY_SYNC"
            with m.State("REG_AW"):
                m.d.comb += [self.active.eq(1), bus.awaddr.eq(addr), bus.wdata.eq(wval),
                             bus.awvalid.eq(1), bus.wvalid.eq(1)]
                with m.If(bus.awready & bus.wready):
                    m.next = "REG_B"
            with m.State("REG_B"):
                m.d.comb += [self.active.eq(1), bus.bready.eq(1)]
                with m.If(bus.bvalid):
                    m.next = "REPLY_SYNC"
            with m.State("REG_AR"):
                m.d.comb += [self.active.eq(1), bus.araddr.eq(addr), bus.arvalid.eq(1)]
                with m.If(bus.arready):
                    m.next = "REG_R"
            with m.State("REG_R"):
                m.d.comb += [self.active.eq(1), bus.rready.eq(1)]
                with m.If(bus.rvalid):
                    m.d.sync += word.eq(bus.rdata)
                    m.next = "REPLY_SYNC"
            with m.State("REPLY_SYNC"):
                m.d.comb += self.active.eq(1)
                send(SYNC_RSP, lambda: setattr(m, "next", "REPLY_STATUS"))
            with m.State("REPLY_STATUS"):
                m.d.comb += self.active.eq(1)

                def after_status():
                    m.d.sync += osum.eq(status)
                    m.next = "REPLY_SUM"
                    with m.If(status == Status.OK):
                        with m.Switch(cmd):
                            with m.Case(Cmd.REG_READ):
                                m.d.sync += count.eq(4)
                                m.next = "REPLY_WORD"
                            with m.Case(Cmd.INFO):
                                m.d.sync += count.eq(8)
                                m.next = "REPLY_WORD"
                            with m.Case(Cmd.MEM_READ):
                                m.d.sync += count.eq(length)
                                m.next = "MEM_ADDR"
                send(status, after_status)
            with m.State("REPLY_WORD"):
                m.d.comb += self.active.eq(1)

                def after_byte():
                    m.d.sync += [osum.eq(osum + word[0:8]), word.eq(word >> 8),
                                 count.eq(count - 1)]
                    with m.If(count == 1):
                        m.next = "REPLY_SUM"
                send(word[0:8], after_byte)
            with m.State("MEM_ADDR"):
                m.d.comb += [self.active.eq(1), self.mem_sel.eq(1), self.mem_addr.eq(addr)]
                m.next = "MEM_SEND"
            with m.State("MEM_SEND"):
                m.d.comb += [self.active.eq(1), self.mem_sel.eq(1), self.mem_addr.eq(addr)]

                def after_mem():
                    m.d.sync += [osum.eq(osum + self.mem_rdata), addr.eq(addr + 1),
                                 count.eq(count - 1)]
                    m.next = "MEM_ADDR"
                    with m.If(count == 1):
                        m.next = "REPLY_SUM"
                send(self.mem_rdata, after_mem)
            with m.State("REPLY_SUM"):
                m.d.comb += self.active.eq(1)
                send((-osum)[0:8], lambda: setattr(m, "next", "IDLE"))
        return m


def _reg_len(c):
    """LEN a register command must carry: 4 for REG_WRITE, 0 for REG_READ."""
    return (c == Cmd.REG_WRITE) * 4
