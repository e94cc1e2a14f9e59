"""The sweep's own error (spec.py and workloads.py both raise it)."""

from __future__ import annotations

from celosia.errors import CelosiaError

__all__ = ["SpecError"]


class SpecError(CelosiaError):
    """An invalid sweep specification: names the key and the reason."""
