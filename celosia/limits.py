"""Resource limits that hold for every loader and executor: bad input says so before it
allocates, and nothing runs without a bound.

``max_bytes()`` is the most memory one thing a user hands celosia (a program image's DRAM, a
model's tensor, an artifact member) may ask for: $CELOSIA_MAX_BYTES if set, else 8 GiB.
``check_bytes`` raises :class:`ResourceLimitError` with what asked and how to raise the limit.
"""

from __future__ import annotations

import os

from .errors import CelosiaError

__all__ = ["ResourceLimitError", "max_bytes", "check_bytes", "DEFAULT_MAX_BYTES"]

DEFAULT_MAX_BYTES = 8 << 30


class ResourceLimitError(CelosiaError):
    """An input that would need more memory (or work) than the configured limit."""


def max_bytes() -> int:
    """The byte limit: $CELOSIA_MAX_BYTES (a positive integer), else DEFAULT_MAX_BYTES."""
    env = os.environ.get("CELOSIA_MAX_BYTES")
    if env is None or env == "":
        return DEFAULT_MAX_BYTES
    if not env.isdigit() or int(env) < 1:
        raise CelosiaError(f"CELOSIA_MAX_BYTES must be a positive integer number of bytes, "
                           f"not {env!r}")
    return int(env)


def check_bytes(nbytes: int, what: str) -> None:
    """Raise ResourceLimitError if ``what`` (e.g. "model.onnx: initializer 'w' float32[...]")
    would need more than max_bytes() bytes."""
    limit = max_bytes()
    if nbytes > limit:
        raise ResourceLimitError(
            f"{what} needs {nbytes:,} bytes, more than the limit of {limit:,}; if this is "
            f"meant, raise the limit with CELOSIA_MAX_BYTES=<bytes>")
