"""The host CPU as LLVM sees it: llvmlite initialised once, the target machine, the number of
threads and the kernel cache folder. Shared by the code generator (codegen.py) and the native
thread pool (threads.py), so neither imports the other."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from celosia.errors import CompilerError

__all__ = ["HostTarget", "llvm_binding", "host_target", "target_machine", "num_threads",
           "cache_dir"]

_lock = threading.Lock()
_state: dict = {}


@dataclass(frozen=True)
class HostTarget:
    triple: str
    cpu: str
    features: str


def llvm_binding():
    """llvmlite's binding layer, initialised once."""
    with _lock:
        if "llvm" not in _state:
            import llvmlite.binding as llvm
            # llvmlite >= 0.44 initialises the core itself and rejects llvm.initialize().
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _state["llvm"] = llvm
        return _state["llvm"]


def host_target() -> HostTarget:
    """The CPU this process runs on, as LLVM names it (e.g. znver4, +avx512f,...)."""
    llvm = llvm_binding()
    if "target" not in _state:
        _state["target"] = HostTarget(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                                      llvm.get_host_cpu_features().flatten())
    return _state["target"]


def num_threads() -> int:
    """Threads for parallel loops: $CELOSIA_NUM_THREADS, else the CPUs this process may use."""
    env = os.environ.get("CELOSIA_NUM_THREADS")
    if env:
        if not env.isdigit() or int(env) < 1:
            raise CompilerError(f"CELOSIA_NUM_THREADS must be a positive integer, not {env!r}")
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cache_dir() -> Path:
    """Where compiled kernels are kept: $CELOSIA_CACHE/llvm or ~/.cache/celosia/llvm."""
    root = os.environ.get("CELOSIA_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "celosia") / "llvm"


def target_machine():
    llvm, target = llvm_binding(), host_target()
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc="pic", codemodel="jitdefault")
