"""The compiler pipeline for the accelerator: schedule -> loop IR -> passes -> driver calls.

Read ``accelerator_pipeline`` top to bottom: each pass says why it is there and what it needs
before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CompilerError

from ..tensor.lower import lower
from ..tensor.schedule import Schedule
from ..tensor.tir import Allocate, PrimFunc, verify, walk
from .codegen import build_ops, emit, insert_dependencies
from .dma import inject_dma
from .storage import plan_storage
from .tensorize import form_gemm_kernels, inject_alu
from .vthread import inject_virtual_threads

__all__ = ["build", "accelerator_pipeline", "AcceleratorFunction"]


def accelerator_pipeline(func: PrimFunc, cfg: HwConfig) -> PrimFunc:
    """The passes from a lowered function to one the code generator can emit."""
    # Copies marked dma_copy become 2D DMA calls with hardware padding. First, because the
    # later passes only look at compute nests.
    func = inject_dma(func)
    # Tensorized GEMM micro-ops are grouped into kernels, folding up to two loops into the
    # instruction's own loops (fewer micro-ops, fewer instructions).
    func = form_gemm_kernels(func)
    # Element-wise nests marked alu become in-place ALU kernel chains; records which buffers
    # alias (the ALU overwrites its first operand).
    func = inject_alu(func)
    # Virtual threads: each thread gets its own on-chip buffers and the threads' statements
    # are interleaved, so one thread's loads overlap another's compute. After kernels are
    # formed (they are the units interleaved), before storage (buffers are duplicated).
    func = inject_virtual_threads(func)
    # Every on-chip buffer gets its SRAM rows; overflowing a buffer is an error naming it.
    func = plan_storage(func, cfg)
    verify(func)
    return func


@dataclass
class AcceleratorFunction:
    """A compiled function: call it with a Device and numpy arrays (one per argument); the
    arrays of outputs are updated in place. Dependency tokens are inserted when the host
    program runs (codegen_vta)."""

    func: PrimFunc
    config: HwConfig

    def __str__(self) -> str:
        return str(self.func)

    def __call__(self, dev, *arrays: np.ndarray) -> dict:
        if len(arrays) != len(self.func.params):
            raise CompilerError(f"{self.func.name} takes {len(self.func.params)} arrays, given "
                                f"{len(arrays)}")
        for buf, arr in zip(self.func.params, arrays):
            if tuple(arr.shape) != tuple(buf.shape) or arr.dtype != np.dtype(buf.dtype):
                raise CompilerError(f"{self.func.name}: argument {buf.name} must be {buf.dtype} "
                                    f"of shape {buf.shape}, not {arr.dtype} {arr.shape}")
        self._check_device(dev)
        dram = [dev.upload(np.ascontiguousarray(arr), align=_align(buf))
                for buf, arr in zip(self.func.params, arrays)]
        scratch = []
        try:
            scratch = self.bind(dev, dram)
            stats = dev.synchronize()
            for d, buf, arr in zip(dram, self.func.params, arrays):
                arr[...] = d.read(arr.dtype, arr.shape)
        finally:
            for b in dram + scratch:
                dev.free(b)
        return stats

    def _check_device(self, dev) -> None:
        if dev.config != self.config:
            raise CompilerError(f"{self.func.name} was compiled for another configuration")

    def arg_specs(self) -> list[tuple[str, str, tuple[int, ...], int]]:
        """(name, dtype, shape, DRAM alignment) of each argument, in order."""
        return [(b.name, b.dtype, tuple(b.shape), _align(b)) for b in self.func.params]

    def bind(self, dev, buffers) -> list:
        """Emit the program into ``dev``'s stream for arguments already in DRAM (one buffer
        per parameter, in order), without running it: ``dev.synchronize()`` runs it once,
        ``dev.build_program()`` keeps it resident to run many times. Returns the DRAM
        scratch buffers it allocated, which must live as long as the program."""
        return self.bind_many(dev, [buffers])

    def bind_many(self, dev, buffer_lists) -> list:
        """``bind`` for several argument sets (one per call of the function, run in order)
        as one instruction stream: the dependency tokens are inserted over all of them, so
        a call's loads wait for the previous call's use of the on-chip buffers."""
        self._check_device(dev)
        ops, scratch = [], []
        try:
            for buffers in buffer_lists:
                if len(buffers) != len(self.func.params):
                    raise CompilerError(f"{self.func.name} takes {len(self.func.params)} "
                                        f"buffers, given {len(buffers)}")
                dram = {}
                for buf, d in zip(self.func.params, buffers):
                    if d.nbytes < _nbytes(buf) or d.addr % _align(buf):
                        raise CompilerError(f"{self.func.name}: the DRAM buffer for {buf.name} "
                                            f"must hold {_nbytes(buf)} bytes at a multiple of "
                                            f"{_align(buf)}")
                    dram[buf] = d
                for node in walk(self.func.body):
                    if isinstance(node, Allocate) and node.buffer.scope == "global":
                        dram[node.buffer] = dev.alloc(_nbytes(node.buffer),
                                                      align=_align(node.buffer))
                        scratch.append(dram[node.buffer])
                ops += build_ops(self.func, self.config, dram)
            emit(insert_dependencies(ops, self.config), dev)
        except BaseException:
            for b in scratch:
                dev.free(b)
            raise
        return scratch


def _nbytes(buf) -> int:
    return math.prod(buf.shape) * np.dtype(buf.dtype).itemsize


def _align(buf) -> int:
    elem = math.prod(buf.shape[-2:]) * np.dtype(buf.dtype).itemsize
    return max(64, elem)


def build(sch: Schedule, args, config: HwConfig, name: str = "main") -> AcceleratorFunction:
    """Compile a schedule for the accelerator; ``args`` are the tensors passed in order."""
    return AcceleratorFunction(accelerator_pipeline(lower(sch, args, name), config), config)
