"""Hardware event counters: one 64-bit counter per event strobe (cleared with the core).

A strobe is registered before it counts (the strobes come from all over the chip): a count
lags its event by one cycle, and a run ends cycles after its last event."""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["EventCounters"]


class EventCounters(wiring.Component):
    def __init__(self, names):
        self.names = tuple(names)
        members = {}
        for name in self.names:
            members[f"ev_{name}"] = In(1)
            members[name] = Out(64)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for name in self.names:
            count = getattr(self, name)
            event = Signal(name=f"{name}_event")
            m.d.sync += event.eq(getattr(self, f"ev_{name}"))
            with m.If(event):
                m.d.sync += count.eq(count + 1)
        return m
