"""The interface every executor of a program image implements.

An executor owns a DRAM of fixed size and runs programs that live in it. The driver and the
runtime see executors only through this interface (write/read DRAM, run, counters), so the
functional simulator, the cycle model, the RTL under Verilator and a board are
interchangeable.
"""

from __future__ import annotations

import importlib
import inspect
from abc import ABC, abstractmethod

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError
from celosia.image import ProgramImage
from celosia.limits import check_bytes

__all__ = ["Executor", "TARGETS", "make_executor", "run_image", "clear_caches"]


class Executor(ABC):
    """Runs program images on one configuration; DRAM is a flat byte array of fixed size."""

    #: target name, as given to ``celosia exec --target``
    name: str = ""
    #: whether ``run`` reports ``cycles``
    models_time: bool = False

    def __init__(self, config: HwConfig, dram_size: int):
        if isinstance(dram_size, bool) or not isinstance(dram_size, (int, np.integer)) \
                or dram_size <= 0:
            raise CelosiaError(f"dram_size must be a positive integer, not {dram_size!r}")
        check_bytes(int(dram_size), f"the {self.name or type(self).__name__} executor's DRAM")
        self.config = config
        self.dram_size = int(dram_size)

    @abstractmethod
    def write_dram(self, addr: int, data) -> None:
        """Copy bytes (or any array, as its raw bytes) into DRAM at a byte address."""

    @abstractmethod
    def read_dram(self, addr: int, nbytes: int) -> np.ndarray:
        """A uint8 copy of ``nbytes`` of DRAM from a byte address."""

    def dram_view(self, addr: int, nbytes: int) -> np.ndarray | None:
        """A writable uint8 view of ``nbytes`` of DRAM from a byte address: the CPU working
        on the accelerator's memory in place, as a board's CPU does on its DMA buffers
        (runtime/accel.py's in-place nodes). None where the executor has no such access;
        then ``read_dram`` and ``write_dram`` copy."""
        return None

    @abstractmethod
    def run(self, insn_addr: int, insn_count: int) -> dict:
        """Run the program at ``insn_addr`` to completion and return its counters.

        Raises ProgramError (DeadlockError) for an illegal program, naming the instruction,
        and SimulationLimitError when the run would pass the executor's limit (fsim:
        ``max_work``; timed targets: ``max_cycles`` too), naming the option to raise.
        """

    def _check_range(self, addr: int, nbytes: int) -> None:
        if addr < 0 or nbytes < 0 or addr + nbytes > self.dram_size:
            raise CelosiaError(
                f"DRAM access [{addr}, {addr + nbytes}) is outside the {self.dram_size}-byte DRAM"
            )


# Targets are imported lazily so that, e.g., the RTL's toolchain is only needed when used.
TARGETS = {
    "fsim": ("celosia.sim.fsim", "FunctionalSimulator"),
    "cycle": ("celosia.sim.cycle", "CycleSimulator"),
    "rtl": ("celosia.sim.rtl", "RtlSimulator"),
}


def make_executor(target: str, config: HwConfig, dram_size: int, **options) -> Executor:
    if target not in TARGETS:
        raise CelosiaError(f"unknown target {target!r}; targets are {', '.join(TARGETS)}")
    module_name, class_name = TARGETS[target]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise CelosiaError(f"target {target!r} is not available in this version of celosia") from None
        raise
    cls = getattr(module, class_name)
    known = [p.name for p in inspect.signature(cls).parameters.values()
             if p.kind == inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise CelosiaError(f"target {target!r} has no option {', '.join(unknown)}; its options "
                           f"are {', '.join(known) or '(none)'}")
    return cls(config, dram_size, **options)


def run_image(image: ProgramImage, target: str = "fsim", config: HwConfig | None = None,
              **options) -> tuple[np.ndarray, dict]:
    """Run a program image; returns (final DRAM, counters)."""
    config = config or HwConfig()
    executor = make_executor(target, config, image.dram.size, **options)
    executor.write_dram(0, image.dram)
    stats = executor.run(image.insn_addr, image.insn_count)
    return executor.read_dram(0, image.dram.size), stats


def clear_caches(*executors: Executor) -> None:
    """Forget everything the simulators keep for later runs of a program: the decoded and
    checked programs, the cycle model's plans and fetch batches, and the compiled kernels
    of the given executors, so that the next run of any program on them is a first run: a
    *cold* run, as of a program the process has not run before (the executor itself, its
    DRAM and buffers, exists already, as it would after other programs). Benchmarks use
    this to time cold runs. A cycle-model executor also drops its last ``timeline``: it
    holds that program's decoded instructions and plans, which would otherwise be freed
    inside the next (timed) run, where fsim's are freed here."""
    import sys

    for name, _ in TARGETS.values():
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "_clear_caches"):
            module._clear_caches()
    for executor in executors:
        if getattr(executor, "timeline", None) is not None:
            executor.timeline = None
        datapath = getattr(executor, "datapath", None)
        if datapath is not None:
            datapath.clear_kernels()
