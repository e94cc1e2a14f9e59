"""Device: one accelerator behind an executor, and the stream-builder API of VTA's runtime.

A :class:`Device` owns an executor (made by name with ``make_executor``, or given), a DRAM
allocator over the executor's whole DRAM, a host cache of micro-op kernels, and the
pending instruction stream. The builder calls mirror VTA's runtime:

=====================  ======================================================================
``load_2d``            LOAD a 2D block (with zero padding) into INP, WGT, ACC or ACC_8BIT
``store_2d``           STORE a 2D block of OUT rows to DRAM
``gemm`` / ``alu``     run a micro-op kernel, recorded once per key and cached on the host
``dep_push/dep_pop``   dependency tokens between neighbouring modules
``synchronize``        close the stream (final tokens, FINISH), run it, reset
=====================  ======================================================================

Every argument is checked when the call is made, and a bad one raises
:class:`~celosia.errors.CelosiaError` naming the call and the parameter: an error while the
stream is built is easier to find than one the executor reports at run time.

The executor is used only through :class:`celosia.sim.base.Executor` (write/read DRAM, run),
so fsim, the cycle model, the RTL and a board are interchangeable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable

import numpy as np

from celosia.config import MEM_DRAM_BITS, MEM_PAD_BITS, MEM_SIZE_BITS, HwConfig
from celosia.errors import CelosiaError
from celosia.image import ProgramImage
from celosia.isa import (AluOp, Insn, MemInsn, MemType, Opcode, buffer_depth, disassemble,
                         elem_bytes, encode_program)
from celosia.sim.base import Executor, make_executor

from .alloc import DramAllocator, DramBuffer
from .stream import InsnStream
from .uops import KernelError, KernelMode, UopKernel, UopKernelBuilder

__all__ = ["Device", "Program"]

_MAX_SIZE = (1 << MEM_SIZE_BITS) - 1
_MAX_PAD = (1 << MEM_PAD_BITS) - 1
_LOADABLE = (MemType.INP, MemType.WGT, MemType.ACC, MemType.ACC_8BIT)
_MIN_STAGING = 1024  # bytes: smallest instruction / micro-op staging buffer


def _int(call: str, name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise CelosiaError(f"{call}: {name} must be an integer, not {value!r}")
    value = int(value)
    if not lo <= value <= hi:
        raise CelosiaError(f"{call}: {name} must be in [{lo}, {hi}], not {value}")
    return value


def _mem_type(call: str, value, allowed: tuple[MemType, ...]) -> MemType:
    try:
        mem_type = MemType(value)
    except ValueError:
        mem_type = None
    if mem_type not in allowed:
        names = ", ".join(f"MemType.{m.name}" for m in allowed)
        raise CelosiaError(f"{call}: mem_type must be one of {names}, not {value!r}")
    return mem_type


@dataclass(frozen=True)
class Program:
    """A program resident in DRAM (``Device.build_program``): where its instructions are,
    how many, and the buffers holding them and its micro-ops."""

    insn_addr: int
    insn_count: int
    buffers: tuple = ()


class Device:
    """An accelerator of one configuration behind an executor (``target``: fsim, cycle,
    rtl, or board:PORT for a board top over its UART, driver/board.py). ``dram_size``
    defaults to 64 MiB for the simulators and to the board's RAM for a board."""

    def __init__(self, config: HwConfig | str | Path | None = None,
                 target: str | Executor = "fsim", *, dram_size: int | None = None,
                 **executor_options):
        self.config = HwConfig.load(config)
        if isinstance(target, Executor):
            if executor_options:
                raise CelosiaError(f"Device: executor options {sorted(executor_options)} given "
                                   f"with an executor that is already made")
            if target.config != self.config:
                raise CelosiaError("Device: the executor was made for a different configuration")
            self.executor = target
        elif isinstance(target, str) and target.startswith("board:"):  # driver/board.py
            from .board import make_any_executor

            if dram_size is not None:
                dram_size = _int("Device", "dram_size", dram_size, 1, 1 << 40)
            self.executor = make_any_executor(target, self.config, dram_size,
                                              **executor_options)
        else:
            dram_size = _int("Device", "dram_size", 64 << 20 if dram_size is None else dram_size,
                             1, 1 << 40)
            self.executor = make_executor(target, self.config, dram_size, **executor_options)
        self.allocator = DramAllocator(self.executor.dram_size)
        self._stream = InsnStream(self.config)
        self._kernels: dict[Hashable, UopKernel] = {}
        self._insn_buf: DramBuffer | None = None
        self._uop_buf: DramBuffer | None = None
        self._stats: dict = {}
        self.runs = 0

    def __repr__(self) -> str:
        return (f"Device(target={self.executor.name!r}, block={self.config.block}, "
                f"dram={self.executor.dram_size} bytes, pending={len(self._stream)} insns)")

    # ---- DRAM ------------------------------------------------------------------------------

    def alloc(self, nbytes: int, align: int = 64) -> DramBuffer:
        """A DRAM buffer of ``nbytes`` at an ``align``-byte physical address (first fit)."""
        return self.allocator.alloc(
            nbytes, align,
            lambda addr, n: DramBuffer(addr, n, self.allocator, self.executor, self.config))

    def upload(self, array, align: int = 64) -> DramBuffer:
        """A new buffer holding a copy of ``array``'s bytes."""
        data = np.ascontiguousarray(array)
        buf = self.alloc(max(data.nbytes, 1), align)
        buf.write(data)
        return buf

    def free(self, buf: DramBuffer) -> None:
        self.allocator.free(buf)

    def _check_buffer(self, call: str, buf) -> DramBuffer:
        if not isinstance(buf, DramBuffer):
            raise CelosiaError(f"{call}: buf must be a DramBuffer from Device.alloc, not "
                               f"{type(buf).__name__}")
        buf.check_live(call)
        if buf._allocator is not self.allocator:
            raise CelosiaError(f"{call}: {buf!r} belongs to another Device")
        return buf

    def _dram_base(self, call: str, buf: DramBuffer, mem_type: MemType, elem_offset,
                   x_size: int, y_size: int, x_stride: int) -> int:
        """The instruction's dram_base, after checking every row lies inside ``buf``."""
        elem_offset = _int(call, "elem_offset", elem_offset, 0, (1 << MEM_DRAM_BITS) - 1)
        eb = elem_bytes(self.config, mem_type)
        if buf.addr % eb:
            raise CelosiaError(
                f"{call}: {buf!r} is not aligned to the {eb}-byte {mem_type.name} element; "
                f"allocate it with align={eb} (or a multiple)")
        end = elem_offset + (y_size - 1) * x_stride + x_size  # elements, exclusive
        if end * eb > buf.nbytes:
            raise CelosiaError(
                f"{call}: the access reaches {mem_type.name} element {end - 1} of the buffer "
                f"(elem_offset={elem_offset}, y_size={y_size}, x_stride={x_stride}, "
                f"x_size={x_size}), past its end ({buf.nbytes // eb} elements of {eb} bytes)")
        base = buf.addr // eb + elem_offset
        if base >= 1 << MEM_DRAM_BITS:
            raise CelosiaError(f"{call}: dram_base={base} does not fit the {MEM_DRAM_BITS}-bit "
                               f"field")
        return base

    def _check_sram(self, call: str, mem_type: MemType, sram_index, rows: int) -> int:
        depth = buffer_depth(self.config, mem_type)
        buffer = {MemType.ACC_8BIT: "ACC"}.get(mem_type, mem_type.name)
        sram_index = _int(call, "sram_index", sram_index, 0, depth - 1)
        if sram_index + rows > depth:
            raise CelosiaError(
                f"{call}: {rows} {buffer} rows from sram_index={sram_index} run past the end of "
                f"the {buffer} buffer ({depth} rows)")
        return sram_index

    # ---- the stream builder ----------------------------------------------------------------

    def load_2d(self, buf: DramBuffer, elem_offset: int, x_size: int, y_size: int,
                x_stride: int, *, x_pad_0: int = 0, y_pad_0: int = 0, x_pad_1: int = 0,
                y_pad_1: int = 0, sram_index: int, mem_type: MemType) -> None:
        """LOAD ``y_size`` rows of ``x_size`` elements (row stride ``x_stride``) from ``buf``
        starting at element ``elem_offset`` into the ``mem_type`` buffer at ``sram_index``,
        with zero padding around them. Offsets and sizes count elements of ``mem_type``."""
        call = "load_2d"
        buf = self._check_buffer(call, buf)
        mem_type = _mem_type(call, mem_type, _LOADABLE)
        x_size = _int(call, "x_size", x_size, 1, _MAX_SIZE)
        y_size = _int(call, "y_size", y_size, 1, _MAX_SIZE)
        x_stride = _int(call, "x_stride", x_stride, 0, _MAX_SIZE)
        pads = {name: _int(call, name, value, 0, _MAX_PAD) for name, value in
                (("x_pad_0", x_pad_0), ("y_pad_0", y_pad_0), ("x_pad_1", x_pad_1),
                 ("y_pad_1", y_pad_1))}
        rows = (pads["y_pad_0"] + y_size + pads["y_pad_1"]) * \
            (pads["x_pad_0"] + x_size + pads["x_pad_1"])
        sram_index = self._check_sram(call, mem_type, sram_index, rows)
        base = self._dram_base(call, buf, mem_type, elem_offset, x_size, y_size, x_stride)
        self._stream.emit(MemInsn(opcode=Opcode.LOAD, mem_type=mem_type, sram_base=sram_index,
                                  dram_base=base, y_size=y_size, x_size=x_size,
                                  x_stride=x_stride, **pads))

    def store_2d(self, sram_index: int, buf: DramBuffer, elem_offset: int, x_size: int,
                 y_size: int, x_stride: int, mem_type: MemType = MemType.OUT) -> None:
        """STORE ``y_size * x_size`` OUT rows from ``sram_index`` into ``buf`` as ``y_size``
        rows of ``x_size`` elements, ``x_stride`` elements apart, from ``elem_offset``."""
        call = "store_2d"
        mem_type = _mem_type(call, mem_type, (MemType.OUT,))
        buf = self._check_buffer(call, buf)
        x_size = _int(call, "x_size", x_size, 1, _MAX_SIZE)
        y_size = _int(call, "y_size", y_size, 1, _MAX_SIZE)
        x_stride = _int(call, "x_stride", x_stride, 0, _MAX_SIZE)
        sram_index = self._check_sram(call, mem_type, sram_index, x_size * y_size)
        base = self._dram_base(call, buf, mem_type, elem_offset, x_size, y_size, x_stride)
        self._stream.emit(MemInsn(opcode=Opcode.STORE, mem_type=mem_type, sram_base=sram_index,
                                  dram_base=base, y_size=y_size, x_size=x_size,
                                  x_stride=x_stride))

    def gemm(self, key: Hashable, record: Callable[[UopKernelBuilder], None] | None, *,
             reset: bool = False) -> UopKernel:
        """Run the GEMM kernel cached under ``key``; the first call records it with
        ``record(builder)``. ``reset=True`` zeroes the ACC (and OUT) rows it addresses."""
        kernel = self._kernel("gemm", key, record, KernelMode.GEMM, reset=bool(reset))
        self._stream.run_kernel(key, kernel)
        return kernel

    def alu(self, key: Hashable, record: Callable[[UopKernelBuilder], None] | None,
            op: AluOp, *, imm: int | None = None) -> UopKernel:
        """Run the ALU kernel cached under ``key`` (recorded on first use): ``op`` with the
        immediate ``imm``, or with the ACC rows the micro-ops' ``src`` name when ``imm`` is
        None."""
        try:
            op = AluOp(op)
        except ValueError:
            raise CelosiaError(f"alu: op must be an AluOp (MIN, MAX, ADD, SHR, MUL), "
                               f"not {op!r}") from None
        if imm is not None:
            imm = _int("alu", "imm", imm, -(1 << 15), (1 << 15) - 1)
        kernel = self._kernel("alu", key, record, KernelMode.ALU, alu_op=op, imm=imm)
        self._stream.run_kernel(key, kernel)
        return kernel

    def _kernel(self, call: str, key: Hashable, record, mode: KernelMode, **spec) -> UopKernel:
        try:
            hash(key)
        except TypeError:
            raise CelosiaError(f"{call}: key must be hashable, not {type(key).__name__}") from None
        builder = UopKernelBuilder(self.config, mode, name=f"{call} kernel {key!r}", **spec)
        kernel = self._kernels.get(key)
        if kernel is not None:
            want = UopKernel(mode=mode, reset=builder.reset, alu_op=builder.alu_op,
                             use_imm=builder.use_imm, imm=builder.imm)
            if kernel.signature() != want.signature():
                raise KernelError(
                    f"{call}: key {key!r} was recorded as {kernel.describe()}, but this call asks "
                    f"for {want.describe()}; give each distinct kernel its own key")
            return kernel
        if not callable(record):
            raise CelosiaError(f"{call}: key {key!r} is not recorded yet; record must be a "
                               f"function taking a UopKernelBuilder, not {record!r}")
        record(builder)
        kernel = builder.build()
        self._kernels[key] = kernel
        return kernel

    def dep_push(self, from_module, to_module) -> None:
        """``from_module`` signals ``to_module`` (a token after its latest instruction)."""
        self._stream.dep_push(from_module, to_module)

    def dep_pop(self, from_module, to_module) -> None:
        """``to_module``'s next instruction waits for a token from ``from_module``."""
        self._stream.dep_pop(from_module, to_module)

    # ---- inspection ------------------------------------------------------------------------

    @property
    def instructions(self) -> list[Insn]:
        """The pending instructions. LOAD UOP ``dram_base`` values are still relative to
        the micro-op staging area (placed at synchronize)."""
        return list(self._stream.insns)

    @property
    def kernels(self) -> dict[Hashable, UopKernel]:
        """The host micro-op kernel cache."""
        return dict(self._kernels)

    def disassemble(self) -> str:
        return disassemble(self._stream.insns)

    @property
    def stats(self) -> dict:
        """Counters summed over every synchronize."""
        return dict(self._stats)

    # ---- running ---------------------------------------------------------------------------

    def _grow(self, buf: DramBuffer | None, nbytes: int) -> DramBuffer:
        if buf is not None and buf.nbytes >= nbytes:
            return buf
        if buf is not None:
            self.free(buf)
        return self.alloc(max(_MIN_STAGING, 1 << (nbytes - 1).bit_length()), align=64)

    def _write_program(self, stream: InsnStream, buffer) -> tuple[DramBuffer, int]:
        """Finalise ``stream`` and write its micro-ops and instructions into DRAM, into the
        buffers ``buffer(kind, nbytes)`` gives for ``"uop"`` and ``"insn"``; returns (the
        instruction buffer, the instruction count)."""
        uops = stream.uop_staging()
        uop_buf = buffer("uop", max(uops.nbytes, 4))
        insns = stream.finalize(uop_buf.addr)
        program = encode_program(insns, self.config)
        insn_buf = buffer("insn", program.nbytes)
        if uops.size:
            uop_buf.write(uops.astype("<u4"))
        insn_buf.write(program)
        return insn_buf, len(insns)

    def _place(self, stream: InsnStream) -> tuple[int, int]:
        """Finalise ``stream`` into the staging area that every synchronize reuses;
        returns (insn_addr, insn_count)."""
        def staging(kind, nbytes):
            attr = f"_{kind}_buf"
            setattr(self, attr, self._grow(getattr(self, attr), nbytes))
            return getattr(self, attr)

        insn_buf, count = self._write_program(stream, staging)
        return insn_buf.addr, count

    def build_program(self) -> "Program":
        """Close the pending stream into a resident program: its micro-ops and instructions
        get DRAM buffers of their own (not the staging area ``synchronize`` reuses), so
        several programs can live in DRAM at once and run any number of times with
        ``run_program``. The stream is reset for the next program."""
        if self._stream.empty:
            raise CelosiaError("build_program: the stream is empty; there is no program to build")
        owned = []

        def own(kind, nbytes):
            owned.append(self.alloc(nbytes, align=64))
            return owned[-1]

        try:
            insn_buf, count = self._write_program(self._stream, own)
        finally:
            self._stream.reset()
        return Program(insn_buf.addr, count, tuple(owned))

    def run_program(self, program: "Program") -> dict:
        """Run a resident program (``build_program``) to completion; its counters."""
        if not self._stream.empty:
            raise CelosiaError("run_program: instructions are pending in the stream; "
                               "synchronize or build_program them first")
        counters = self.executor.run(program.insn_addr, program.insn_count)
        self.runs += 1
        for name, value in counters.items():
            if isinstance(value, (int, float, np.integer, np.floating)):
                self._stats[name] = self._stats.get(name, 0) + value
        return counters

    def _image(self, insn_addr: int, insn_count: int) -> ProgramImage:
        dram = self.executor.read_dram(0, self.allocator.high_water)
        return ProgramImage(dram, insn_addr, insn_count)

    def save_image(self, path: str | Path) -> ProgramImage:
        """Save the pending stream, closed as synchronize would close it, as a program image
        (DRAM up to the allocator's high-water mark). The stream stays pending."""
        if self._stream.empty:
            raise CelosiaError("save_image: the stream is empty; there is no program to save")
        image = self._image(*self._place(self._stream.copy()))
        image.save(path)
        return image

    def synchronize(self, *, image: str | Path | None = None) -> dict:
        """Close the stream, run it to completion and return the run's counters.

        With ``image``, the program image is saved there before it runs. The stream, its
        pending pops and the UOP residency are reset afterwards (also when the run fails).
        """
        if self._stream.empty:
            self._stream.reset()
            return dict.fromkeys(self._stats or _zero_counters(), 0)
        try:
            insn_addr, insn_count = self._place(self._stream)
            if image is not None:
                self._image(insn_addr, insn_count).save(image)
            counters = self.executor.run(insn_addr, insn_count)
        finally:
            self._stream.reset()
        self.runs += 1
        for name, value in counters.items():
            if isinstance(value, (int, float, np.integer, np.floating)):
                self._stats[name] = self._stats.get(name, 0) + value
        return counters


def _zero_counters() -> tuple[str, ...]:
    from celosia.sim.datapath import COUNTER_NAMES

    return COUNTER_NAMES
