"""What each module reports to the register file: enough to name, on a deadlock, which
instruction waits on which queue (sim/rtl.py turns it into a DeadlockError)."""

from __future__ import annotations

from amaranth.lib import data, enum

from .isa import INDEX_BITS, ErrorCode

__all__ = ["ModuleState", "ModuleStatus", "ErrorReport"]


class ModuleState(enum.Enum, shape=2):
    IDLE = 0  # waiting for an instruction or for its tokens
    BUSY = 1  # executing
    PUSH = 2  # finished, waiting for room to push its tokens


#: state, the dependency flags (pop_prev, pop_next, push_prev, push_next) of the instruction
#: at the head of the queue (IDLE) or in flight (BUSY/PUSH), whether there is one, its index
ModuleStatus = data.StructLayout({
    "state": ModuleState, "flags": 4, "valid": 1, "index": INDEX_BITS,
})

#: an error a module raises: a one-cycle strobe with the rule broken and where
ErrorReport = data.StructLayout({"valid": 1, "code": ErrorCode, "index": INDEX_BITS})
