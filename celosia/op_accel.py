"""The accelerator target of ``celosia.op`` (docs/op.md): one resident program per build.

``AccelKernel`` is what ``Op.kernel`` caches for ``target="accel"``: the match of the
compute (compiler/accel/te_op.py), its accelerator function, DRAM buffers for its
packed arguments on the operator's ``Device`` (fsim, the cycle model or the RTL), and the program
bound to those buffers and kept resident (``Device.build_program``), so a call packs its
inputs into the buffers, runs the program (``run_program``), reads the output and
unpacks it: nothing is compiled or bound again for the same (shapes, dtypes, constants).
"""

from __future__ import annotations

import numpy as np

from .compiler.accel.build import _align, _nbytes
from .compiler.accel.te_op import (build_gemm_op, choose_knobs, match_gemm, pack_inputs,
                                   ranked_knobs, unpack_output)

__all__ = ["AccelKernel", "EXECUTORS"]

EXECUTORS = ("fsim", "cycle", "rtl")


class AccelKernel:
    """A compiled, bound and resident accelerator program for one build of an op."""

    def __init__(self, op, holders, outs, device, intrinsic: str = "gemm"):
        where = f"celosia.op {op.name} (target accel)"
        cfg = device.config
        self.op, self.device = op, device
        self.match = match_gemm(holders, outs, cfg, where)
        self.tuning: list = []   # (cycles, knobs) measured when the op tunes
        if op.tune:
            self.knobs, self.function = self._tune(op, intrinsic)
        else:
            self.knobs = choose_knobs(self.match, cfg)
            self.function = build_gemm_op(self.match, cfg, self.knobs, op.name, intrinsic)
        self.out_shape, self.out_dtype = tuple(outs[0].shape), outs[0].dtype
        self._buffers: list = []
        try:
            self._bind()
        except BaseException:
            self.free()
            raise

    def __repr__(self) -> str:
        k = self.knobs
        return (f"AccelKernel({self.match.describe()}; tiles {k.tile_n}x{k.tile_o}x{k.tile_k}"
                f"{f', {k.vthreads} threads' if k.vthreads > 1 else ''})")

    def _tune(self, op, intrinsic: str):
        """The best of the ``op.tune`` tilings ``estimate_dense`` ranks first, measured on
        the cycle model (on zeros: the timing does not depend on the data)."""
        from .driver import Device

        cfg = self.device.config
        best = None
        for kn in ranked_knobs(self.match, cfg)[:max(1, int(op.tune))]:
            fn = build_gemm_op(self.match, cfg, kn, op.name, intrinsic)
            args = [np.zeros(shape, dtype) for _, dtype, shape, _ in fn.arg_specs()]
            dram = sum(a.nbytes + 4096 for a in args) + (1 << 20)
            cycles = fn(Device(cfg, target="cycle", dram_size=dram), *args)["cycles"]
            self.tuning.append((cycles, kn))
            if best is None or cycles < best[0]:
                best = (cycles, kn, fn)
        return best[1], best[2]

    def _alloc(self, nbytes: int, align: int):
        buf = self.device.alloc(nbytes, align=align)
        self._buffers.append(buf)
        return buf

    def _bind(self) -> None:
        dev = self.device
        self.buffers = [self._alloc(max(_nbytes(p), 1), _align(p))
                        for p in self.function.func.params]
        self._buffers += self.function.bind(dev, self.buffers)   # DRAM scratch, if any
        self.program = dev.build_program()
        self._buffers += list(self.program.buffers)

    def __call__(self, *arrays) -> None:
        """Run on the op's input arrays; the result is written into the last array."""
        *inputs, result = arrays
        cfg = self.device.config
        for buf, packed in zip(self.buffers, pack_inputs(self.match, inputs, cfg, self.knobs)):
            buf.write(packed)
        stats = self.device.run_program(self.program)
        out = self.function.func.params[-1]
        result[...] = unpack_output(self.match, self.buffers[-1].read(np.int8, out.shape), cfg,
                                    self.knobs)
        m = self.match
        stats = dict(stats)
        stats["useful_macs"] = m.groups * m.m * m.k * m.n
        if "cycles" in stats and stats["cycles"]:
            peak = cfg.batch * cfg.block * cfg.block
            stats["useful_utilization"] = stats["useful_macs"] / (stats["cycles"] * peak)
        self.op.last_stats = stats

    def free(self) -> None:
        """Give the program's and the arguments' DRAM back (when the build is evicted)."""
        for b in self._buffers:
            if b.live:
                self.device.free(b)
        self._buffers = []

