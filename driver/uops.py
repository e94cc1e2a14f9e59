"""Micro-op kernels: recording, the immutable kernel record, and the on-chip micro-op cache.

A GEMM or ALU instruction runs a range of micro-ops in the UOP buffer inside up to two
loops (ISA.md section 4). The driver builds that range once per call site, as VTA's runtime
does: the first time :meth:`Device.gemm` / :meth:`Device.alu` sees a key it calls the
caller's ``record`` function with a :class:`UopKernelBuilder`, which declares the loops
(``loop``, outermost first, at most two, before any micro-op) and the micro-ops (``push``).
The result is a frozen :class:`UopKernel` that the device caches on the host by key.

Everything a kernel can get wrong is checked while it is recorded: loop count and order,
extents and factors that must fit their instruction fields, and every buffer row the
kernel reaches after loop arithmetic.

:class:`UopCache` models which kernels are resident in the on-chip UOP buffer: a resident
kernel is reused without a load; a new one is placed after the last one placed, or at row 0
when it does not fit, evicting every kernel it overlaps.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Hashable

from celosia.config import ALU_IMM_BITS, LOOP_ITER_BITS, MEM_SIZE_BITS, HwConfig
from celosia.errors import CelosiaError
from celosia.isa import AluInsn, AluOp, GemmInsn, Uop

__all__ = ["KernelMode", "UopLoop", "UopKernel", "UopKernelBuilder", "UopCache", "KernelError",
           "MAX_LOOPS"]

MAX_LOOPS = 2  # the instruction has an outer and an inner loop
_MAX_EXTENT = (1 << LOOP_ITER_BITS) - 1
_MAX_UOP_LOAD = (1 << MEM_SIZE_BITS) - 1  # one LOAD UOP's x_size
_IMM_MIN, _IMM_MAX = -(1 << (ALU_IMM_BITS - 1)), (1 << (ALU_IMM_BITS - 1)) - 1


class KernelError(CelosiaError, ValueError):
    """A micro-op kernel that cannot be turned into an instruction."""


class KernelMode(enum.IntEnum):
    GEMM = 0  # ACC[dst] += INP[src] x WGT[wgt]^T (or reset)
    ALU = 1  # ACC[dst] = op(ACC[dst], ACC[src] or imm)


@dataclass(frozen=True)
class UopLoop:
    """One loop level: ``extent`` iterations, each adding its factors to the micro-op rows."""

    extent: int
    dst_factor: int
    src_factor: int
    wgt_factor: int = 0


@dataclass(frozen=True, kw_only=True)
class UopKernel:
    """A recorded micro-op kernel: what one GEMM or ALU instruction runs.

    ``loops`` is outermost first. For ALU, a single loop is the *inner* loop (VTA's rule).
    """

    mode: KernelMode
    reset: bool = False
    alu_op: AluOp | None = None
    use_imm: bool = False
    imm: int = 0
    loops: tuple[UopLoop, ...] = ()
    uops: tuple[Uop, ...] = ()

    def __len__(self) -> int:
        return len(self.uops)

    def signature(self) -> tuple:
        """What must match when a cached kernel is used again under the same key."""
        return (self.mode, self.reset, self.alu_op, self.use_imm, self.imm)

    def describe(self) -> str:
        if self.mode == KernelMode.GEMM:
            return f"GEMM kernel (reset={self.reset})"
        operand = f"imm={self.imm}" if self.use_imm else "tensor operand"
        return f"ALU {self.alu_op.name} kernel ({operand})"

    def _loop_fields(self) -> tuple[UopLoop, UopLoop]:
        none = UopLoop(1, 0, 0, 0)
        if len(self.loops) == 2:
            return self.loops[0], self.loops[1]
        if len(self.loops) == 1:
            # VTA: GEMM's single loop is the outer one, ALU's the inner one.
            return (self.loops[0], none) if self.mode == KernelMode.GEMM else (none, self.loops[0])
        return none, none

    def instruction(self, uop_bgn: int) -> GemmInsn | AluInsn:
        """The GEMM/ALU instruction running this kernel from UOP row ``uop_bgn``."""
        outer, inner = self._loop_fields()
        common = dict(
            uop_bgn=uop_bgn, uop_end=uop_bgn + len(self.uops),
            iter_out=outer.extent, iter_in=inner.extent,
            dst_factor_out=outer.dst_factor, dst_factor_in=inner.dst_factor,
            src_factor_out=outer.src_factor, src_factor_in=inner.src_factor,
        )
        if self.mode == KernelMode.GEMM:
            return GemmInsn(reset=self.reset, wgt_factor_out=outer.wgt_factor,
                            wgt_factor_in=inner.wgt_factor, **common)
        return AluInsn(alu_op=self.alu_op, use_imm=self.use_imm, imm=self.imm, **common)


def _check_index(where: str, name: str, value, limit: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise KernelError(f"{where}: {name} must be an integer, not {value!r}")
    value = int(value)
    if not 0 <= value < limit:
        raise KernelError(f"{where}: {name}={value} is outside [0, {limit})")
    return value


class UopKernelBuilder:
    """Records one kernel: ``loop(...)`` up to twice, then ``push(...)`` once per micro-op."""

    def __init__(self, config: HwConfig, mode: KernelMode, *, reset: bool = False,
                 alu_op: AluOp | None = None, imm: int | None = None, name: str = "kernel"):
        self.config = config
        self.mode = KernelMode(mode)
        self.reset = bool(reset)
        self.alu_op = None if alu_op is None else AluOp(alu_op)
        self.use_imm = imm is not None
        self.imm = 0 if imm is None else int(imm)
        self.name = name
        self._loops: list[UopLoop] = []
        self._uops: list[Uop] = []
        c = config
        gemm = self.mode == KernelMode.GEMM
        # Buffer each micro-op field indexes, and the width of each loop-factor field.
        self._src_depth = c.inp_depth if gemm else c.acc_depth
        self._factor_limit = {
            "dst_factor": 1 << c.log_acc_depth,
            "src_factor": 1 << (c.log_inp_depth if gemm else c.log_acc_depth),
            "wgt_factor": 1 << c.log_wgt_depth,
        }

    def loop(self, extent: int, dst_factor: int, src_factor: int, wgt_factor: int = 0) -> None:
        """Open a loop level (the first call is the outer loop)."""
        where = f"{self.name}: loop"
        if self._uops:
            raise KernelError(f"{where}: loops must be declared before the first push "
                              f"({len(self._uops)} micro-ops already pushed)")
        if len(self._loops) >= MAX_LOOPS:
            raise KernelError(f"{where}: a kernel has at most {MAX_LOOPS} loop levels")
        if isinstance(extent, bool) or not hasattr(extent, "__index__") \
                or not 1 <= int(extent) <= _MAX_EXTENT:
            raise KernelError(f"{where}: extent must be an integer in [1, {_MAX_EXTENT}], "
                              f"not {extent!r}")
        factors = {}
        for name, value in (("dst_factor", dst_factor), ("src_factor", src_factor),
                            ("wgt_factor", wgt_factor)):
            factors[name] = _check_index(where, name, value, self._factor_limit[name])
        if self.mode == KernelMode.ALU and factors["wgt_factor"]:
            raise KernelError(f"{where}: wgt_factor must be 0 in an ALU kernel (ALU has no "
                              f"weight operand)")
        self._loops.append(UopLoop(int(extent), **factors))

    def push(self, dst: int, src: int = 0, wgt: int = 0) -> None:
        """Append one micro-op: ACC row ``dst``, source row ``src`` (INP for GEMM, ACC for
        ALU), WGT row ``wgt`` (GEMM only)."""
        where = f"{self.name}: push #{len(self._uops)}"
        c = self.config
        dst = _check_index(where, "dst", dst, c.acc_depth)
        src = _check_index(where, "src", src, self._src_depth)
        wgt = _check_index(where, "wgt", wgt, c.wgt_depth)
        if self.mode == KernelMode.ALU and wgt:
            raise KernelError(f"{where}: wgt must be 0 in an ALU kernel")
        self._uops.append(Uop(dst, src, wgt))

    def build(self) -> UopKernel:
        """The finished kernel; checks every row it reaches stays inside its buffer."""
        c = self.config
        if not self._uops:
            raise KernelError(f"{self.name}: the record function pushed no micro-op")
        if len(self._uops) > c.uop_depth:
            raise KernelError(f"{self.name}: {len(self._uops)} micro-ops do not fit the "
                              f"{c.uop_depth}-entry UOP buffer; split the kernel")
        if len(self._uops) > _MAX_UOP_LOAD:
            raise KernelError(f"{self.name}: {len(self._uops)} micro-ops do not fit one LOAD "
                              f"UOP (x_size is at most {_MAX_UOP_LOAD}); split the kernel")
        gemm = self.mode == KernelMode.GEMM
        reach = [("dst", "dst_factor", c.acc_depth, "ACC"),
                 ("src", "src_factor", self._src_depth, "INP" if gemm else "ACC")]
        if gemm and not self.reset:
            reach.append(("wgt", "wgt_factor", c.wgt_depth, "WGT"))
        for field, factor, depth, buf in reach:
            top = max(getattr(u, field) for u in self._uops)
            top += sum((lp.extent - 1) * getattr(lp, factor) for lp in self._loops)
            if top >= depth:
                raise KernelError(
                    f"{self.name}: micro-op {field} reaches {buf} row {top} after the loops, "
                    f"past the end of the {buf} buffer ({depth} rows)")
        if self.use_imm and not _IMM_MIN <= self.imm <= _IMM_MAX:
            raise KernelError(f"{self.name}: imm={self.imm} does not fit the signed "
                              f"{ALU_IMM_BITS}-bit field [{_IMM_MIN}, {_IMM_MAX}]")
        return UopKernel(mode=self.mode, reset=self.reset, alu_op=self.alu_op,
                         use_imm=self.use_imm, imm=self.imm, loops=tuple(self._loops),
                         uops=tuple(self._uops))


class UopCache:
    """Residency of kernels in the on-chip UOP buffer (rows ``[0, depth)``).

    Placement is a ring: after the last kernel placed, or back at row 0 when the kernel
    does not fit before the end; kernels overlapping the new range are evicted.
    """

    def __init__(self, depth: int):
        self.depth = depth
        self._resident: dict[Hashable, tuple[int, int]] = {}
        self._next = 0

    def lookup(self, key: Hashable) -> tuple[int, int] | None:
        """The (begin, end) rows of a resident kernel, or None."""
        return self._resident.get(key)

    def place(self, key: Hashable, size: int) -> tuple[int, int]:
        """Make a kernel of ``size`` micro-ops resident; returns its (begin, end) rows."""
        if size > self.depth:
            raise KernelError(f"a kernel of {size} micro-ops does not fit the {self.depth}-entry "
                              f"UOP buffer")
        begin = self._next if self._next + size <= self.depth else 0
        end = begin + size
        self._resident = {k: (b, e) for k, (b, e) in self._resident.items()
                          if e <= begin or b >= end}
        self._resident[key] = (begin, end)
        self._next = end
        return begin, end

    @property
    def resident(self) -> dict[Hashable, tuple[int, int]]:
        return dict(self._resident)

    def clear(self) -> None:
        self._resident.clear()
        self._next = 0

    def copy(self) -> "UopCache":
        other = UopCache(self.depth)
        other._resident = dict(self._resident)
        other._next = self._next
        return other
