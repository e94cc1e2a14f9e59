"""Program images: the whole DRAM plus where the instructions are and how many.

An image runs unchanged on every executor. On disk it is an ``.npz`` (a zip archive of
``.npy`` members, as ``np.savez`` writes it) with ``dram`` (1-D uint8), ``insn_addr`` (byte
address of the first instruction) and ``insn_count``; the DRAM size is the size of that
array and any access beyond it is illegal.

:meth:`ProgramImage.load` reads a file a user hands over, so it checks before it trusts:
the file's kind (an ``.npy``, text, a zip without these members), each member's ``.npy``
header (dtype, shape) before reading its data, the DRAM's size against
``celosia.limits.check_bytes``, and each scalar's type, finiteness, integrality and range.
Every failure is one :class:`ImageError` line naming the file, the member and what to do.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CelosiaError
from .isa import INSN_BYTES
from .limits import check_bytes

__all__ = ["ProgramImage", "ImageError"]

_MEMBERS = ("dram", "insn_addr", "insn_count")
_HOW = "an image is an .npz with dram (1-D uint8), insn_addr and insn_count (integers)"
_NPY_MAGIC = b"\x93NUMPY"
# Errors a damaged or exotic zip member raises while it is read.
_READ_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error,
                NotImplementedError, RuntimeError)


class ImageError(CelosiaError):
    """A program image file that cannot be used."""


def _as_index(value, name: str) -> int:
    """An integer field of an image: a Python or numpy integer (not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ImageError(f"{name} must be an integer, not {value!r}")
    return int(value)


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
        object.__setattr__(self, "insn_addr", _as_index(self.insn_addr, "insn_addr"))
        object.__setattr__(self, "insn_count", _as_index(self.insn_count, "insn_count"))
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
        with _open_archive(path) as archive:
            dram = _read_dram(archive, path)
            addr, count = (_read_scalar(archive, path, name) for name in _MEMBERS[1:])
        try:
            return cls(dram=dram, insn_addr=addr, insn_count=count)
        except ImageError as exc:
            raise ImageError(f"{path}: {exc} (members insn_addr and insn_count must place "
                             f"the program inside dram)") from None


def _open_archive(path: Path) -> zipfile.ZipFile:
    """The image's zip archive, after telling apart the files that are not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_NPY_MAGIC))
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ImageError(f"{path}: is a directory, not a program image; {_HOW}") from None
    except OSError as exc:
        raise ImageError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if head == _NPY_MAGIC:
        raise ImageError(f"{path}: a single .npy array, not a program image; {_HOW} "
                         f"(ProgramImage.save or np.savez writes one)")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        kind = "an empty file" if not head else (
            "a text file" if _looks_like_text(path) else "not a zip archive, or a damaged one")
        raise ImageError(f"{path}: not a readable .npz program image: {kind} ({exc}); "
                         f"{_HOW}") from None
    names = set(archive.namelist())
    missing = [m for m in _MEMBERS if f"{m}.npy" not in names and m not in names]
    if missing:
        found = ", ".join(sorted(names)[:8]) or "nothing"
        archive.close()
        raise ImageError(f"{path}: not a program image, missing {', '.join(missing)} (it holds "
                         f"{found}); {_HOW}")
    return archive


def _looks_like_text(path: Path) -> bool:
    with open(path, "rb") as f:
        chunk = f.read(512)
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in chunk


def _member(archive: zipfile.ZipFile, name: str) -> zipfile.ZipInfo:
    names = archive.namelist()
    return archive.getinfo(f"{name}.npy" if f"{name}.npy" in names else name)


def _read_member(archive: zipfile.ZipFile, path: Path, name: str, check=None):
    """(dtype, shape, data bytes) of one ``.npy`` member; ``check(dtype, shape)`` runs on
    the header before any data is read."""
    info = _member(archive, name)
    where = f"{path}: member {name}"
    try:
        with archive.open(info) as f:
            if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise ImageError(f"{where} is not a .npy array (or is damaged); {_HOW}")
            f.seek(0)
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise ImageError(f"{where}: unsupported .npy format version {version}; {_HOW}")
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            if check is not None:
                check(dtype, shape)
            nbytes = math.prod(shape) * dtype.itemsize
            data = f.read(nbytes)
            if len(data) != nbytes:
                raise ImageError(f"{where} is truncated: its header promises {nbytes:,} bytes of "
                                 f"data, it holds {len(data):,}; write the image again")
            f.read(1)  # to the end of the member: zipfile checks its CRC there
    except ImageError:
        raise
    except _READ_ERRORS as exc:
        raise ImageError(f"{where} is damaged or not a .npy array ({exc}); write the image "
                         f"again") from None
    return dtype, shape, data


def _read_dram(archive: zipfile.ZipFile, path: Path) -> np.ndarray:
    def check(dtype, shape):
        if dtype != np.uint8 or len(shape) != 1:
            raise ImageError(f"{path}: member dram must be a 1-D uint8 array, not "
                             f"{_describe(dtype)} of shape {shape}; save the DRAM's bytes "
                             f"(array.view(np.uint8).reshape(-1))")
        check_bytes(shape[0], f"{path}: member dram (uint8[{shape[0]}])")

    _, _, data = _read_member(archive, path, "dram", check)
    return np.frombuffer(data, np.uint8).copy()  # writable, owned


def _read_scalar(archive: zipfile.ZipFile, path: Path, name: str) -> int:
    """An integer member: any integer dtype, or a float that holds an integer exactly."""
    where = f"{path}: member {name}"

    def check(dtype, shape):
        if math.prod(shape) != 1 or len(shape) > 1:
            raise ImageError(f"{where} must be one integer, not an array of shape {shape}; "
                             f"save it as np.int64(value)")
        if dtype.kind not in "iuf":
            raise ImageError(f"{where} must be an integer, not {_describe(dtype)}; save it as "
                             f"np.int64(value)")

    dtype, _, data = _read_member(archive, path, name, check)
    value = np.frombuffer(data, dtype)[0]
    if dtype.kind == "f":
        if not math.isfinite(value) or value != math.floor(value):
            raise ImageError(f"{where} must be an integer, not the float {float(value)!r}; "
                             f"save it as np.int64(value)")
    return int(value)


def _describe(dtype: np.dtype) -> str:
    kinds = {"b": "a bool", "c": "a complex number", "U": "a string", "S": "a byte string",
             "O": "a Python object", "V": "a structured record", "M": "a date",
             "m": "a time span"}
    return kinds.get(dtype.kind, f"dtype {dtype}")
