"""A DRAM behind a Python AXI4 slave, for Amaranth-simulator testbenches of the DMA blocks.

Each cycle: ``drive(ctx)`` sets the slave's outputs from its state (random stalls and a
random read latency), then the testbench reads the DUT, then ``sample(ctx)`` applies the
handshakes of the cycle before ``await ctx.tick()``.
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np


class AxiSlaveModel:
    def __init__(self, dram: np.ndarray, bus_bytes: int, *, rng: random.Random,
                 latency=(1, 6), stall: float = 0.3):
        self.dram, self.bus, self.rng = dram, bus_bytes, rng
        self.latency, self.stall = latency, stall
        self.now = 0
        self.reads = deque()
        self.r_beat = 0
        self.w = None  # [addr, beat] of the write burst in progress
        self.b_at = None
        self.bursts = []  # (kind, byte address, beats) of every accepted burst

    def _ok(self):
        return self.rng.random() >= self.stall

    def drive(self, ctx, rd=None, wr=None):
        if rd is not None:
            self._ar_ready = len(self.reads) < 1 and self._ok()
            ctx.set(rd.arready, self._ar_ready)
            rv = bool(self.reads) and self.reads[0][2] <= self.now and self._ok()
            self._rvalid = rv
            ctx.set(rd.rvalid, rv)
            if rv:
                addr, beats, _ = self.reads[0]
                a = addr + self.r_beat * self.bus
                ctx.set(rd.rdata, int.from_bytes(self.dram[a:a + self.bus].tobytes(), "little"))
                ctx.set(rd.rlast, self.r_beat + 1 == beats)
            else:
                ctx.set(rd.rlast, 0)
        if wr is not None:
            self._aw_ready = self.w is None and self.b_at is None and self._ok()
            self._w_ready = self.w is not None and self._ok()
            self._b_valid = self.b_at is not None and self.b_at <= self.now and self._ok()
            ctx.set(wr.awready, self._aw_ready)
            ctx.set(wr.wready, self._w_ready)
            ctx.set(wr.bvalid, self._b_valid)

    def sample(self, ctx, rd=None, wr=None):
        if rd is not None:
            if self._ar_ready and ctx.get(rd.arvalid):
                addr, beats = ctx.get(rd.araddr), ctx.get(rd.arlen) + 1
                assert addr % self.bus == 0
                assert addr // 4096 == (addr + beats * self.bus - 1) // 4096, "burst crosses 4 KiB"
                self.reads.append((addr, beats, self.now + self.rng.randint(*self.latency)))
                self.bursts.append(("r", addr, beats))
            if self._rvalid and ctx.get(rd.rready):
                self.r_beat += 1
                if self.r_beat == self.reads[0][1]:
                    self.reads.popleft()
                    self.r_beat = 0
        if wr is not None:
            if self._aw_ready and ctx.get(wr.awvalid):
                self.w = [ctx.get(wr.awaddr), 0, ctx.get(wr.awlen) + 1]
                self.bursts.append(("w", self.w[0], self.w[2]))
            elif self._w_ready and ctx.get(wr.wvalid):
                addr, beat, beats = self.w
                data = ctx.get(wr.wdata).to_bytes(self.bus, "little")
                strb = ctx.get(wr.wstrb)
                a = addr + beat * self.bus
                for i in range(self.bus):
                    if strb >> i & 1:
                        self.dram[a + i] = data[i]
                assert bool(ctx.get(wr.wlast)) == (beat + 1 == beats)
                self.w[1] += 1
                if beat + 1 == beats:
                    self.w = None
                    self.b_at = self.now + self.rng.randint(*self.latency)
            if self._b_valid and ctx.get(wr.bready):
                self.b_at = None
        self.now += 1
