"""The instruction stream: dependency tokens, NOPs, micro-op loads, and the final sync.

:class:`InsnStream` is the part of VTA's command queue that decides *which* instructions
go out, given already-checked requests from :class:`~celosia.driver.Device`:

- Pending pops. ``dep_pop(from, to)`` does not make an instruction; it marks the next
  instruction of stage ``to`` to pop (``pop_prev`` when ``from`` comes before ``to`` in the
  pipeline, else ``pop_next``). A second pending pop of the same kind first commits the
  waiting ones as a NOP of that stage.
- Pushes. ``dep_push(from, to)`` commits ``from``'s pending pops, then sets the push flag on
  the last instruction if it belongs to stage ``from`` and lacks it, else appends a NOP of
  stage ``from`` that carries it.
- NOPs are zero-size memory instructions, one per stage: LOAD INP (load), LOAD UOP
  (compute), STORE OUT (store).
- Micro-ops. A kernel not resident in the UOP buffer is placed by the :class:`UopCache`
  and loaded by one LOAD UOP right before its GEMM/ALU. The micro-op words are staged on
  the host (each kernel once per run); LOAD UOP ``dram_base`` values are relative to the
  staging area until :meth:`finalize` is given its physical address.
- Finalisation (VTA's synchronize): push store->compute and load->compute, pop both at
  compute, commit them as a compute NOP, append FINISH.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Hashable

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError
from celosia.isa import FinishInsn, Insn, MemInsn, MemType, Module, Opcode, encode_uops, module_of

from .uops import UopCache, UopKernel

__all__ = ["InsnStream", "nop"]

_UOP_BYTES = 4


def nop(stage: Module, **flags: bool) -> MemInsn:
    """The zero-size memory instruction that only moves tokens for ``stage``."""
    if stage == Module.LOAD:
        return MemInsn(opcode=Opcode.LOAD, mem_type=MemType.INP, **flags)
    if stage == Module.COMPUTE:
        return MemInsn(opcode=Opcode.LOAD, mem_type=MemType.UOP, **flags)
    return MemInsn(opcode=Opcode.STORE, mem_type=MemType.OUT, **flags)


def _check_pair(call: str, from_module, to_module) -> tuple[Module, Module]:
    try:
        src, dst = Module(from_module), Module(to_module)
    except ValueError:
        raise CelosiaError(f"{call}: modules must be Module.LOAD, COMPUTE or STORE, not "
                           f"{from_module!r} -> {to_module!r}") from None
    if abs(src - dst) != 1:
        raise CelosiaError(
            f"{call}: no token queue between {src.name} and {dst.name}; queues join neighbours "
            f"only (load<->compute, compute<->store)")
    return src, dst


class InsnStream:
    """The pending instructions of one run, with token and micro-op bookkeeping."""

    def __init__(self, config: HwConfig):
        self.config = config
        self.insns: list[Insn] = []
        self.uop_cache = UopCache(config.uop_depth)
        self._pending = {m: {"pop_prev": False, "pop_next": False} for m in Module}
        self._staged: dict[Hashable, int] = {}  # kernel key -> word offset in staging
        self._uop_words: list[np.ndarray] = []
        self._uop_count = 0
        self._uop_loads: list[int] = []  # indices of LOAD UOPs whose dram_base is relative

    def __len__(self) -> int:
        return len(self.insns)

    @property
    def empty(self) -> bool:
        return not self.insns

    # ---- instructions and tokens ---------------------------------------------------------

    def emit(self, insn: Insn) -> int:
        """Append an instruction; it absorbs its stage's pending pops. Returns its index."""
        pending = self._pending[module_of(insn)]
        flags = {k: True for k, on in pending.items() if on}
        if flags:
            insn = insn.with_deps(**flags)
            pending.update(pop_prev=False, pop_next=False)
        self.insns.append(insn)
        return len(self.insns) - 1

    def commit_pending_pops(self, stage: Module) -> None:
        if any(self._pending[stage].values()):
            self.emit(nop(stage))

    def dep_pop(self, from_module, to_module) -> None:
        src, dst = _check_pair("dep_pop", from_module, to_module)
        kind = "pop_prev" if src < dst else "pop_next"
        if self._pending[dst][kind]:
            self.commit_pending_pops(dst)
        self._pending[dst][kind] = True

    def dep_push(self, from_module, to_module) -> None:
        src, dst = _check_pair("dep_push", from_module, to_module)
        kind = "push_next" if src < dst else "push_prev"
        self.commit_pending_pops(src)
        if self.insns:
            last = self.insns[-1]
            if module_of(last) == src and not getattr(last, kind):
                self.insns[-1] = last.with_deps(**{kind: True})
                return
        self.emit(nop(src, **{kind: True}))

    # ---- micro-op kernels ----------------------------------------------------------------

    def run_kernel(self, key: Hashable, kernel: UopKernel) -> None:
        """Emit the GEMM/ALU instruction of a kernel, preceded by its LOAD UOP if needed."""
        rows = self.uop_cache.lookup(key)
        if rows is None:
            begin, end = self.uop_cache.place(key, len(kernel))
            offset = self._staged.get(key)
            if offset is None:
                offset = self._uop_count
                self._staged[key] = offset
                self._uop_words.append(encode_uops(kernel.uops, self.config))
                self._uop_count += len(kernel)
            n = end - begin
            index = self.emit(MemInsn(opcode=Opcode.LOAD, mem_type=MemType.UOP, sram_base=begin,
                                      dram_base=offset, y_size=1, x_size=n, x_stride=n))
            self._uop_loads.append(index)
            rows = (begin, end)
        self.emit(kernel.instruction(rows[0]))

    @property
    def uop_bytes(self) -> int:
        return self._uop_count * _UOP_BYTES

    def uop_staging(self) -> np.ndarray:
        """The staged micro-op words, in staging order (uint32)."""
        if not self._uop_words:
            return np.zeros(0, np.uint32)
        return np.concatenate(self._uop_words)

    # ---- the end of a run ----------------------------------------------------------------

    def finalize(self, uop_addr: int) -> list[Insn]:
        """Close the stream (sync tokens, FINISH) and return it with LOAD UOPs pointing at
        the staging area placed at byte address ``uop_addr``."""
        if uop_addr % _UOP_BYTES:
            raise CelosiaError(f"micro-op staging address 0x{uop_addr:x} is not 4-byte aligned")
        self.dep_push(Module.STORE, Module.COMPUTE)
        self.dep_push(Module.LOAD, Module.COMPUTE)
        self.dep_pop(Module.STORE, Module.COMPUTE)
        self.dep_pop(Module.LOAD, Module.COMPUTE)
        self.commit_pending_pops(Module.COMPUTE)
        self.insns.append(FinishInsn())
        base = uop_addr // _UOP_BYTES
        out = list(self.insns)
        for i in self._uop_loads:
            out[i] = _relocate(out[i], base)
        return out

    def reset(self) -> None:
        """Forget the run: instructions, pending pops, staged micro-ops, UOP residency."""
        self.insns.clear()
        for flags in self._pending.values():
            flags.update(pop_prev=False, pop_next=False)
        self.uop_cache.clear()
        self._staged.clear()
        self._uop_words.clear()
        self._uop_count = 0
        self._uop_loads.clear()

    def copy(self) -> "InsnStream":
        other = InsnStream(self.config)
        other.insns = list(self.insns)
        other._pending = {m: dict(f) for m, f in self._pending.items()}
        other.uop_cache = self.uop_cache.copy()
        other._staged = dict(self._staged)
        other._uop_words = list(self._uop_words)
        other._uop_count = self._uop_count
        other._uop_loads = list(self._uop_loads)
        return other


def _relocate(insn: MemInsn, base: int) -> MemInsn:
    return replace(insn, dram_base=insn.dram_base + base)
