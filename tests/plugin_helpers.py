"""An installed distribution's metadata, written for a test: what importlib.metadata reads
to find entry points (a ``NAME-VERSION.dist-info`` folder on sys.path)."""

from __future__ import annotations

from pathlib import Path


def write_distribution(folder: Path, name: str, group: str, entries: dict) -> Path:
    """``folder/NAME-1.0.dist-info`` declaring ``entries`` (entry point -> "module:attr") in
    the entry-point ``group``; put ``folder`` on sys.path to install it."""
    dist = Path(folder) / f"{name.replace('-', '_')}-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entries.items())
    (dist / "entry_points.txt").write_text(f"[{group}]\n{lines}")
    return dist
