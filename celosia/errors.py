"""Errors a user can cause. The CLI prints their message on one line, without a traceback."""

from __future__ import annotations


class CelosiaError(Exception):
    """Base of every error caused by bad input (program, configuration, model, file)."""


class ProgramError(CelosiaError):
    """An illegal program: names the instruction index and the ISA rule it broke."""

    def __init__(self, index: int | None, rule: str):
        self.index = index
        self.rule = rule
        where = f"instruction {index}: " if index is not None else "program: "
        super().__init__(where + rule)


class DeadlockError(ProgramError):
    """No module can make progress: ``waiting`` lists (module, instruction index, what it waits on)."""

    def __init__(self, waiting: list[tuple[str, int | None, str]], detail: str = ""):
        self.waiting = waiting
        parts = [
            f"{module} at instruction {index} waits for {what}" if index is not None
            else f"{module} {what}"
            for module, index, what in waiting
        ]
        first = min((i for _, i, _ in waiting if i is not None), default=None)
        super().__init__(first, "deadlock: " + "; ".join(parts) + (f" ({detail})" if detail else ""))


class SimulationLimitError(CelosiaError):
    """A simulation ran past its cycle or time limit."""


class CompilerError(CelosiaError):
    """A model or program the compiler cannot handle: says what, where, and what to do."""
