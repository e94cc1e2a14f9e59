"""fsim: the functional simulator, the executable definition of the ISA (shared ISA.md).

Fetch dispatches instructions in program order into one bounded command queue per module;
load, compute and store each run their queue in order under the dependency-token protocol.
Values come from :class:`celosia.sim.datapath.Datapath`. There is no notion of time: each
module runs as far as its tokens allow, and when none can move before the program is done,
the run is a deadlock, reported with what every module waits on.

The token rules (docs/isa.md, "Choices celosia makes"):
- a module starts the instruction at the head of its command queue once every queue it pops
  holds a token; it then takes the instruction out of the command queue and the tokens;
- after the instruction completes, it pushes one token into each flagged queue; if any of
  them is full it waits until all have room, then pushes them together.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from celosia.config import HwConfig
from celosia.errors import DeadlockError, ProgramError, SimulationLimitError
from celosia.isa import INSN_BYTES, FinishInsn, Insn, Module, decoder, module_of

from .base import Executor
from .datapath import DEFAULT_MAX_WORK, Datapath, check_insn, check_max_work, single_threaded_blas

__all__ = ["FunctionalSimulator", "Program", "load_program", "TOKEN_QUEUES", "pops_of",
           "pushes_of"]

# The four token queues, named (from, to).
L2C, C2L, C2S, S2C = "load->compute", "compute->load", "compute->store", "store->compute"
TOKEN_QUEUES = (L2C, C2L, C2S, S2C)
_MODULE_NAMES = {Module.LOAD: "load", Module.COMPUTE: "compute", Module.STORE: "store"}


def pops_of(module: Module, insn: Insn) -> tuple[str, ...]:
    """The token queues an instruction pops before it starts."""
    if module == Module.LOAD:
        return (C2L,) if insn.pop_next else ()
    if module == Module.STORE:
        return (C2S,) if insn.pop_prev else ()
    return tuple(q for q, on in ((L2C, insn.pop_prev), (S2C, insn.pop_next)) if on)


def pushes_of(module: Module, insn: Insn) -> tuple[str, ...]:
    """The token queues an instruction pushes after it completes."""
    if module == Module.LOAD:
        return (L2C,) if insn.push_next else ()
    if module == Module.STORE:
        return (S2C,) if insn.push_prev else ()
    return tuple(q for q, on in ((C2L, insn.push_prev), (C2S, insn.push_next)) if on)


def _queue_ids() -> dict:
    """(module, deps) -> (the queue ids it pops, those it pushes), per pops_of/pushes_of."""
    from itertools import product

    qid = {q: k for k, q in enumerate(TOKEN_QUEUES)}
    out = {}
    for m, deps in product(Module, product((False, True), repeat=4)):
        # a record with these four flags (pops_of/pushes_of read only them)
        flags = FinishInsn(**dict(zip(("pop_prev", "pop_next", "push_prev", "push_next"), deps)))
        out[int(m), deps] = (tuple(qid[q] for q in pops_of(m, flags)),
                             tuple(qid[q] for q in pushes_of(m, flags)))
    return out


_QUEUE_IDS = _queue_ids()


class Program(list):
    """A decoded and checked program: its instructions (a list), plus what every run of it
    reuses: each instruction's module and token queues (indices into TOKEN_QUEUES, in
    pops_of/pushes_of order), and ``cache``, where executors keep what they derive from the
    program (the cycle model's plans)."""

    def __init__(self, insns):
        super().__init__(insns)
        per: dict = {}  # id -> (module, pops, pushes): a repeated word is one object
        ids = [id(insn) for insn in self]
        for insn in self:
            if id(insn) not in per:
                m = int(module_of(insn))
                per[id(insn)] = (m, *_QUEUE_IDS[m, insn.deps])
        rows = [per[k] for k in ids]
        self.modules = [r[0] for r in rows]
        self.pops = [r[1] for r in rows]
        self.pushes = [r[2] for r in rows]
        self.cache: dict = {}


# The programs last used, decoded and checked, by (configuration, DRAM size, program bytes):
# a model runs the same program images for every inference, one per accelerator node (a
# hundred or more for a transformer), so the cache keeps at least the last
# _PROGRAM_CACHE_SIZE programs and more while their instructions total at most
# _PROGRAM_CACHE_INSNS (with what executors derive from them, a few hundred bytes each),
# least recently used first out.
_PROGRAMS: dict = {}
_PROGRAM_CACHE_SIZE = 8
_PROGRAM_CACHE_INSNS = 1 << 19
_program_insns = [0]  # instructions of the programs in _PROGRAMS
_programs_lock = threading.Lock()


def _clear_caches() -> None:
    """Forget the decoded programs (sim/base.py ``clear_caches``)."""
    with _programs_lock:
        _PROGRAMS.clear()
        _program_insns[0] = 0


def load_program(dram: np.ndarray, insn_addr: int, insn_count: int, cfg: HwConfig) -> Program:
    """Decode the program in DRAM and check every rule its fields decide (ISA.md section 4)."""
    if insn_addr % INSN_BYTES:
        raise ProgramError(None, f"insn_addr={insn_addr} is not {INSN_BYTES}-byte aligned")
    if insn_count < 1:
        raise ProgramError(None, "the program is empty; it must end with FINISH")
    end = insn_addr + insn_count * INSN_BYTES
    if insn_addr < 0 or end > dram.size:
        raise ProgramError(None, f"the program [{insn_addr}, {end}) is outside the "
                                 f"{dram.size}-byte DRAM")
    key = (cfg, dram.size, dram[insn_addr:end].tobytes())
    with _programs_lock:
        cached = _PROGRAMS.pop(key, None)
        if cached is not None:
            _PROGRAMS[key] = cached  # now the most recently used
            return cached
    insns = _decode(key[2], cfg)
    checked: set = set()
    for index, insn in enumerate(insns):
        if isinstance(insn, FinishInsn) and index != len(insns) - 1:
            raise ProgramError(index + 1, "instruction fetched after FINISH (FINISH must be last)")
        if id(insn) not in checked:  # an instruction word repeated is checked once
            check_insn(insn, index, cfg, dram.size)
            checked.add(id(insn))
    if not isinstance(insns[-1], FinishInsn):
        raise ProgramError(len(insns) - 1, "the program does not end with FINISH")
    program = Program(insns)
    with _programs_lock:
        if key not in _PROGRAMS:
            _program_insns[0] += len(program)
        _PROGRAMS[key] = program
        while len(_PROGRAMS) > _PROGRAM_CACHE_SIZE and _program_insns[0] > _PROGRAM_CACHE_INSNS:
            _program_insns[0] -= len(_PROGRAMS.pop(next(iter(_PROGRAMS))))
    return program


def _decode(raw: bytes, cfg: HwConfig) -> list[Insn]:
    """isa.decode_program of a program image, decoding each distinct instruction word once
    (a program repeats most of its words: the GEMMs and ALUs of every tile, their loads of
    the same micro-ops); a repeated word is the same (immutable) instruction object."""
    seen: dict = {}
    insns = []
    decode_word = decoder(cfg)
    for i in range(0, len(raw), INSN_BYTES):
        word = raw[i:i + INSN_BYTES]
        insn = seen.get(word)
        if insn is None:
            insn = seen[word] = decode_word(int.from_bytes(word, "little"), i // INSN_BYTES)
        insns.append(insn)
    return insns


class FunctionalSimulator(Executor):
    """The functional simulator. Option: ``max_work``, the most work a run may do, counted
    as one per instruction plus one per micro-op iteration of GEMM and ALU instructions
    (default DEFAULT_MAX_WORK, 2^24); the instruction that would cross it raises
    SimulationLimitError before it runs. A run's work is in its counters as ``work``."""

    name = "fsim"
    models_time = False

    def __init__(self, config: HwConfig, dram_size: int, *, max_work: int = DEFAULT_MAX_WORK):
        super().__init__(config, dram_size)
        self.dram = np.zeros(self.dram_size, np.uint8)
        self.datapath = Datapath(config, self.dram, max_work=max_work)

    @property
    def max_work(self) -> int:
        return self.datapath.max_work

    @max_work.setter
    def max_work(self, value: int) -> None:
        self.datapath.max_work = check_max_work(value)

    def write_dram(self, addr: int, data) -> None:
        raw = np.frombuffer(memoryview(np.ascontiguousarray(data)).cast("B"), np.uint8)
        self._check_range(addr, raw.size)
        self.dram[addr:addr + raw.size] = raw

    def read_dram(self, addr: int, nbytes: int) -> np.ndarray:
        self._check_range(addr, nbytes)
        return self.dram[addr:addr + nbytes].copy()

    def dram_view(self, addr: int, nbytes: int) -> np.ndarray:
        self._check_range(addr, nbytes)
        return self.dram[addr:addr + nbytes]

    def run(self, insn_addr: int, insn_count: int) -> dict:
        insns = self._load(insn_addr, insn_count)
        with single_threaded_blas():
            _TokenMachine(insns, self.config, self.datapath.execute).run()
        return self._counters()

    def _load(self, insn_addr: int, insn_count: int) -> Program:
        """The decoded, checked program, with the counters reset for a run. A program with
        more instructions than max_work cannot finish: it fails before it is decoded."""
        for name, value in (("insn_addr", insn_addr), ("insn_count", insn_count)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ProgramError(None, f"{name} must be an integer, not {value!r}")
        if insn_count > self.max_work:
            raise SimulationLimitError(
                f"program: its {insn_count:,} instructions are more work than max_work="
                f"{self.max_work:,} (each instruction counts one); raise max_work (celosia "
                f"exec --max-work N) if the program is meant to be this long")
        insns = load_program(self.dram, insn_addr, insn_count, self.config)
        self.datapath.reset_counters()
        return insns

    def _counters(self) -> dict:
        return {**self.datapath.counters, "work": self.datapath.work}


class _TokenMachine:
    """Fetch plus three in-order modules under the token protocol, without time.

    Modules are numbered as Module (load 0, compute 1, store 2), token queues as
    TOKEN_QUEUES (0-3)."""

    def __init__(self, insns: list[Insn], cfg: HwConfig, execute):
        if not isinstance(insns, Program):
            insns = Program(insns)
        self.insns = insns
        self.execute = execute
        self.cmd_depth = cfg.cmd_queue_depth
        self.token_depth = cfg.token_queue_depth
        self.modules = insns.modules
        self.pops, self.pushes = insns.pops, insns.pushes
        self.cmdq = [deque(), deque(), deque()]
        self.tokens = [0, 0, 0, 0]
        self.pending_push = [(), (), ()]
        self.pending_index = [None, None, None]  # the instruction whose pushes wait
        self.pc = 0

    def _fetch(self) -> bool:
        moved = False
        n = len(self.insns)
        modules, cmdq, depth = self.modules, self.cmdq, self.cmd_depth
        while self.pc < n:
            q = cmdq[modules[self.pc]]
            if len(q) >= depth:
                break
            q.append(self.pc)
            self.pc += 1
            moved = True
        return moved

    def _step(self, module: int) -> bool:
        """Run the module as far as it can go; whether it moved."""
        moved = False
        q = self.cmdq[module]
        tokens, depth = self.tokens, self.token_depth
        insns, pops_of_, pushes_of_, execute = self.insns, self.pops, self.pushes, self.execute
        n = len(insns)
        while True:
            pending = self.pending_push[module]
            if pending:
                for t in pending:
                    if tokens[t] >= depth:
                        return moved
                for t in pending:
                    tokens[t] += 1
                self.pending_push[module] = ()
                moved = True
            if not q:
                return moved
            index = q[0]
            pops = pops_of_[index]
            for p in pops:
                if tokens[p] == 0:
                    return moved
            for p in pops:
                tokens[p] -= 1
            q.popleft()
            execute(index, insns[index])
            self.pending_push[module] = pushes_of_[index]
            self.pending_index[module] = index
            moved = True
            if len(q) < self.cmd_depth and self.pc < n:
                self._fetch()

    def run(self) -> None:
        n = len(self.insns)
        while True:
            moved = self._fetch()
            for module in range(3):
                moved |= self._step(module)
            if self.pc == n and not any(self.cmdq) and not any(self.pending_push):
                return
            if not moved:
                raise DeadlockError(self._waiting())

    def _waiting(self) -> list[tuple[str, int | None, str]]:
        waiting = []
        for module in Module:
            name = _MODULE_NAMES[module]
            if self.pending_push[module]:
                full = [TOKEN_QUEUES[q] for q in self.pending_push[module]
                        if self.tokens[q] >= self.token_depth]
                waiting.append((name, self.pending_index[module], "room to push (it has "
                                "completed) into " + ", ".join(f"{q} (full, {self.token_depth} tokens)"
                                                         for q in full)))
            elif self.cmdq[module]:
                index = self.cmdq[module][0]
                empty = [TOKEN_QUEUES[q] for q in self.pops[index] if self.tokens[q] == 0]
                waiting.append((name, index, "a token on " + " and ".join(
                    f"{q} (empty)" for q in empty)))
        if self.pc < len(self.insns):
            target = _MODULE_NAMES[Module(self.modules[self.pc])]
            waiting.append(("fetch", self.pc, f"room in the {target} command queue "
                                              f"(full, {self.cmd_depth} instructions)"))
        return waiting
