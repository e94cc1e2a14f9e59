"""Program images: the whole DRAM plus where the instructions are and how many.

An image runs unchanged on every executor. On disk it is an ``.npz`` with ``dram`` (uint8),
``insn_addr`` (byte address of the first instruction) and ``insn_count``; the DRAM size is
the size of that array and any access beyond it is illegal.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CelosiaError
from .isa import INSN_BYTES

__all__ = ["ProgramImage", "ImageError"]


class ImageError(CelosiaError):
    """A program image file that cannot be used."""


@dataclass(frozen=True)
class ProgramImage:
    dram: np.ndarray
    insn_addr: int
    insn_count: int

    def __post_init__(self):
        dram = np.asarray(self.dram)
        if dram.dtype != np.uint8 or dram.ndim != 1:
            raise ImageError(f"dram must be a 1-D uint8 array, not {dram.dtype} of shape {dram.shape}")
        object.__setattr__(self, "dram", dram)
        object.__setattr__(self, "insn_addr", int(self.insn_addr))
        object.__setattr__(self, "insn_count", int(self.insn_count))
        if self.insn_addr < 0 or self.insn_addr % INSN_BYTES:
            raise ImageError(f"insn_addr={self.insn_addr} must be a non-negative multiple of "
                             f"{INSN_BYTES}")
        if self.insn_count < 1:
            raise ImageError(f"insn_count={self.insn_count}: a program has at least one "
                             f"instruction (FINISH)")
        end = self.insn_addr + self.insn_count * INSN_BYTES
        if end > dram.size:
            raise ImageError(f"the program [{self.insn_addr}, {end}) runs past the end of the "
                             f"{dram.size}-byte DRAM")

    @property
    def program_bytes(self) -> np.ndarray:
        return self.dram[self.insn_addr:self.insn_addr + self.insn_count * INSN_BYTES]

    def save(self, path: str | Path) -> None:
        np.savez_compressed(path, dram=self.dram, insn_addr=np.int64(self.insn_addr),
                            insn_count=np.int64(self.insn_count))

    @classmethod
    def load(cls, path: str | Path) -> "ProgramImage":
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                missing = [k for k in ("dram", "insn_addr", "insn_count") if k not in data.files]
                if missing:
                    raise ImageError(f"{path}: not a program image, missing {', '.join(missing)} "
                                     f"(an image holds dram, insn_addr and insn_count)")
                dram, addr, count = data["dram"], data["insn_addr"], data["insn_count"]
        except FileNotFoundError:
            raise ImageError(f"{path}: no such file") from None
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise ImageError(f"{path}: not a readable .npz program image ({exc})") from None
        try:
            return cls(dram=dram, insn_addr=int(addr), insn_count=int(count))
        except ImageError as exc:
            raise ImageError(f"{path}: {exc}") from None
        except TypeError:
            raise ImageError(f"{path}: insn_addr and insn_count must be integers") from None
