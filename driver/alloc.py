"""DRAM buffers and the allocator that hands them out.

The accelerator addresses DRAM physically, from byte 0 (ISA.md section 5), so the driver
manages the executor's whole DRAM itself: a first-fit allocator over ``[0, dram_size)`` with
a sorted free list whose neighbouring holes are merged on every free. A :class:`DramBuffer`
is a handle on one allocation: its physical address, its size, and host copies in and out
through the executor. Instruction ``dram_base`` fields count elements of a memory type, so
:meth:`DramBuffer.elem_offset` converts the address and refuses a misaligned buffer.

The high-water mark (the highest byte ever handed out) bounds the part of DRAM a program
can touch; program images are trimmed to it.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import numpy as np

from celosia.errors import CelosiaError
from celosia.isa import MemType, elem_bytes

if TYPE_CHECKING:
    from celosia.config import HwConfig
    from celosia.sim.base import Executor

__all__ = ["DramAllocator", "DramBuffer", "AllocationError"]


class AllocationError(CelosiaError, MemoryError):
    """DRAM exhausted, a bad size or alignment, a double free, or use of a freed buffer."""


class DramBuffer:
    """One allocation in the accelerator's DRAM: ``addr`` (physical bytes) and ``nbytes``.

    Made by :meth:`Device.alloc`, never directly. Reads and writes go through the executor.
    """

    __slots__ = ("addr", "nbytes", "_allocator", "_executor", "_config", "_live")

    def __init__(self, addr: int, nbytes: int, allocator: "DramAllocator",
                 executor: "Executor", config: "HwConfig"):
        self.addr = addr
        self.nbytes = nbytes
        self._allocator = allocator
        self._executor = executor
        self._config = config
        self._live = True

    def __repr__(self) -> str:
        state = "" if self._live else ", freed"
        return f"DramBuffer(addr=0x{self.addr:x}, nbytes={self.nbytes}{state})"

    @property
    def live(self) -> bool:
        return self._live

    def check_live(self, what: str) -> None:
        if not self._live:
            raise AllocationError(f"{what}: {self!r} was freed; allocate a new buffer")

    def _check_span(self, what: str, offset: int, nbytes: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
            raise AllocationError(f"{what}: offset must be a non-negative integer, not {offset!r}")
        if offset + nbytes > self.nbytes:
            raise AllocationError(
                f"{what}: bytes [{offset}, {offset + nbytes}) do not fit in the {self.nbytes}-byte "
                f"buffer at 0x{self.addr:x}")

    def write(self, data, offset: int = 0) -> None:
        """Copy an array (its raw bytes, C order) into the buffer at a byte offset."""
        self.check_live("DramBuffer.write")
        raw = np.ascontiguousarray(data)
        nbytes = raw.nbytes
        self._check_span("DramBuffer.write", offset, nbytes)
        if nbytes:
            self._executor.write_dram(self.addr + int(offset), raw.reshape(-1).view(np.uint8))

    def read(self, dtype=np.uint8, shape=None, offset: int = 0) -> np.ndarray:
        """A copy of the buffer's bytes from ``offset`` as an array of ``dtype`` and ``shape``.

        Without ``shape``, reads everything from ``offset`` to the end of the buffer.
        """
        self.check_live("DramBuffer.read")
        dtype = np.dtype(dtype)
        if shape is None:
            self._check_span("DramBuffer.read", offset, 0)
            count = (self.nbytes - int(offset)) // dtype.itemsize
            shape = (count,)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self._check_span("DramBuffer.read", offset, nbytes)
        raw = self._executor.read_dram(self.addr + int(offset), nbytes)
        return raw.view(dtype).reshape(shape).copy()

    def elem_offset(self, mem_type: MemType) -> int:
        """The buffer's address in elements of ``mem_type`` (what ``dram_base`` counts)."""
        mem_type = MemType(mem_type)
        eb = elem_bytes(self._config, mem_type)
        if self.addr % eb:
            raise AllocationError(
                f"buffer at 0x{self.addr:x} is not aligned to the {eb}-byte {mem_type.name} "
                f"element; allocate it with align={eb} (or a multiple)")
        return self.addr // eb


class DramAllocator:
    """First-fit allocation of ``[0, size)`` with coalescing of freed neighbours."""

    def __init__(self, size: int):
        if size <= 0:
            raise AllocationError(f"DRAM size must be positive, not {size}")
        self.size = size
        self._free: list[tuple[int, int]] = [(0, size)]  # sorted, disjoint (start, end)
        self._live: dict[int, DramBuffer] = {}
        self.high_water = 0

    @property
    def free_bytes(self) -> int:
        return sum(end - start for start, end in self._free)

    @property
    def largest_hole(self) -> int:
        return max((end - start for start, end in self._free), default=0)

    @property
    def live_buffers(self) -> list[DramBuffer]:
        return [self._live[a] for a in sorted(self._live)]

    def alloc(self, nbytes: int, align: int, make) -> DramBuffer:
        """The first hole that fits ``nbytes`` at an ``align``-byte address; ``make(addr,
        nbytes)`` builds the handle."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise AllocationError(f"alloc: nbytes must be a positive integer, not {nbytes!r}")
        if isinstance(align, bool) or not isinstance(align, (int, np.integer)) or align <= 0 \
                or align & (align - 1):
            raise AllocationError(f"alloc: align must be a positive power of two, not {align!r}")
        nbytes, align = int(nbytes), int(align)
        for i, (start, end) in enumerate(self._free):
            addr = -(-start // align) * align
            if addr + nbytes > end:
                continue
            pieces = [(s, e) for s, e in ((start, addr), (addr + nbytes, end)) if e > s]
            self._free[i:i + 1] = pieces
            buf = make(addr, nbytes)
            self._live[addr] = buf
            self.high_water = max(self.high_water, addr + nbytes)
            return buf
        raise AllocationError(
            f"alloc: out of DRAM: requested {nbytes} bytes (align {align}), but only "
            f"{self.free_bytes} of {self.size} bytes are free and the largest free block is "
            f"{self.largest_hole} bytes; free buffers or make the Device with a larger dram_size")

    def free(self, buf: DramBuffer) -> None:
        if not isinstance(buf, DramBuffer):
            raise AllocationError(f"free: expected a DramBuffer, not {type(buf).__name__}")
        if self._live.get(buf.addr) is not buf:
            state = "was already freed (double free)" if not buf.live \
                else "was not allocated by this device"
            raise AllocationError(f"free: {buf!r} {state}")
        del self._live[buf.addr]
        buf._live = False
        start, end = buf.addr, buf.addr + buf.nbytes
        i = bisect.bisect_left(self._free, (start, end))
        # Merge with the hole just before and the hole just after, if they touch.
        if i < len(self._free) and self._free[i][0] == end:
            end = self._free.pop(i)[1]
        if i > 0 and self._free[i - 1][1] == start:
            start = self._free.pop(i - 1)[0]
            i -= 1
        self._free.insert(i, (start, end))
