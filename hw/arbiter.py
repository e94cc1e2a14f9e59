"""Round-robin arbiter of read clients onto the one AXI4 read channel.

One burst is in flight at a time: a grant covers one AR handshake and the R beats up to
RLAST. Timing (docs/microarchitecture.md): in a cycle where the arbiter is idle it picks
the first client with ARVALID high, searching from the one after the previous grant; the
chosen client's AR is on the bus from the next cycle. After the RLAST handshake the
arbiter is idle again in the next cycle. Fixed order and one burst at a time keep every
transfer's time a closed-form function of latency and burst length.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi import ReadClientSignature

__all__ = ["ReadArbiter"]


class ReadArbiter(wiring.Component):
    def __init__(self, *, clients: int, data_width: int):
        if not isinstance(clients, int) or clients < 1:
            raise ValueError(f"clients must be a positive integer, not {clients!r}")
        self.n = clients
        super().__init__({
            "clients": In(ReadClientSignature(data_width)).array(clients),
            "bus": Out(ReadClientSignature(data_width)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n
        busy = Signal()
        ar_done = Signal()  # the granted client's AR has been accepted
        grant = Signal(range(n))
        last = Signal(range(n), init=n - 1)
        chosen = Signal(range(n))
        any_req = Signal()

        with m.Switch(last):
            for prev in range(n):
                with m.Case(prev):
                    # later assignments win: walk from lowest to highest priority
                    for off in reversed(range(1, n + 1)):
                        idx = (prev + off) % n
                        with m.If(self.clients[idx].arvalid):
                            m.d.comb += [chosen.eq(idx), any_req.eq(1)]

        with m.If(~busy):
            with m.If(any_req):
                m.d.sync += [busy.eq(1), grant.eq(chosen), ar_done.eq(0)]
        with m.Else():
            for idx, client in enumerate(self.clients):
                with m.If(grant == idx):
                    m.d.comb += [
                        self.bus.araddr.eq(client.araddr), self.bus.arlen.eq(client.arlen),
                        self.bus.arvalid.eq(client.arvalid & ~ar_done),
                        client.arready.eq(self.bus.arready & ~ar_done),
                        client.rdata.eq(self.bus.rdata), client.rlast.eq(self.bus.rlast),
                        client.rvalid.eq(self.bus.rvalid), self.bus.rready.eq(client.rready),
                    ]
            with m.If(self.bus.arvalid & self.bus.arready):
                m.d.sync += ar_done.eq(1)
            with m.If(self.bus.rvalid & self.bus.rready & self.bus.rlast):
                m.d.sync += [busy.eq(0), last.eq(grant)]
        return m
