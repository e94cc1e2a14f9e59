"""The compiler pipeline for the accelerator: schedule -> loop IR -> passes -> driver calls.

Read ``accelerator_pipeline`` top to bottom: each pass says why it is there and what it needs
before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from celosia.config import HwConfig

from .codegen_vta import build_ops, emit, insert_dependencies
from .expr import CompilerError
from .inject_dma import inject_dma
from .kernels import form_gemm_kernels, inject_alu
from .lower import lower
from .schedule import Schedule
from .storage import plan_storage
from .tir import Allocate, PrimFunc, verify, walk
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
        if dev.config != self.config:
            raise CompilerError(f"{self.func.name} was compiled for another configuration")
        if len(arrays) != len(self.func.params):
            raise CompilerError(f"{self.func.name} takes {len(self.func.params)} arrays, given "
                                f"{len(arrays)}")
        dram = {}
        for buf, arr in zip(self.func.params, arrays):
            if tuple(arr.shape) != tuple(buf.shape) or arr.dtype != np.dtype(buf.dtype):
                raise CompilerError(f"{self.func.name}: argument {buf.name} must be {buf.dtype} "
                                    f"of shape {buf.shape}, not {arr.dtype} {arr.shape}")
            dram[buf] = dev.upload(np.ascontiguousarray(arr), align=_align(buf))
        for node in walk(self.func.body):
            if isinstance(node, Allocate) and node.buffer.scope == "global":
                dram[node.buffer] = dev.alloc(_nbytes(node.buffer), align=_align(node.buffer))
        try:
            ops = insert_dependencies(build_ops(self.func, self.config, dram), self.config)
            emit(ops, dev)
            stats = dev.synchronize()
            for buf, arr in zip(self.func.params, arrays):
                arr[...] = dram[buf].read(arr.dtype, arr.shape)
        finally:
            for b in dram.values():
                dev.free(b)
        return stats


def _nbytes(buf) -> int:
    return math.prod(buf.shape) * np.dtype(buf.dtype).itemsize


def _align(buf) -> int:
    elem = math.prod(buf.shape[-2:]) * np.dtype(buf.dtype).itemsize
    return max(64, elem)


def build(sch: Schedule, args, config: HwConfig, name: str = "main") -> AcceleratorFunction:
    """Compile a schedule for the accelerator; ``args`` are the tensors passed in order."""
    return AcceleratorFunction(accelerator_pipeline(lower(sch, args, name), config), config)
