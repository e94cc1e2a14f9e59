"""Arrays from ``.npy`` and ``.npz`` bytes that may be damaged: the header checked (format
version, dtype from an allow-list, shape, size within ``celosia.limits``) before anything
is allocated, and the data's length against the header. Used for a .cel's members
(``strict``: exactly what ``numpy.save`` writes here) and for the arrays a user hands
``celosia run`` (any byte order or memory order, made native and C-ordered).

numpy's own header parser (``numpy.lib.format``) reads the header; its errors on damaged
bytes are many kinds of exception (ValueError, SyntaxError and tokenize.TokenError from
the dict literal, ...), all turned into one :class:`NpyError` here.
"""

from __future__ import annotations

import io
import tokenize
import warnings
import zipfile
import zlib

import numpy as np

from ..errors import CelosiaError
from ..limits import check_bytes

__all__ = ["NpyError", "DTYPES", "decode", "load_file"]

# Element types celosia reads: plain numbers (no objects, strings or records).
DTYPES = frozenset({"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                    "uint64", "float16", "float32", "float64"})
MAX_RANK = 16

_HEADER_ERRORS = (ValueError, SyntaxError, tokenize.TokenError, TypeError, KeyError,
                  OverflowError, RecursionError, MemoryError, EOFError, Warning)


class NpyError(CelosiaError):
    """Bytes that are not a readable .npy array (the message says what is wrong)."""


def _header(f, strict: bool):
    """(shape, fortran order, dtype) from numpy's parser, any failure an NpyError."""
    try:
        with warnings.catch_warnings():
            # A damaged header can make Python's parser warn (an invalid escape sequence):
            # an error here rather than a second line on stderr.
            warnings.simplefilter("error")
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                return np.lib.format.read_array_header_1_0(f)
            if version == (2, 0) and not strict:
                return np.lib.format.read_array_header_2_0(f)
    except _HEADER_ERRORS as e:
        raise NpyError(f"is not a .npy array: its header is damaged ({_first_line(e)})") from None
    raise NpyError(f"is .npy format version {version[0]}.{version[1]}, which celosia does "
                   f"not read")


def decode(data: bytes, *, strict: bool = False, what: str = "the array") -> np.ndarray:
    """The array in ``data`` (a whole .npy file), as a fresh C-ordered native array."""
    f = io.BytesIO(data)
    shape, fortran, dtype = _header(f, strict)
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None \
            or dtype.name not in DTYPES:
        raise NpyError(f"holds {dtype} elements; celosia reads {', '.join(sorted(DTYPES))}")
    if strict and (fortran or dtype.byteorder == ">"):
        raise NpyError("is not in C order and native byte order as celosia writes it")
    if not isinstance(shape, tuple) or len(shape) > MAX_RANK or \
            any(not isinstance(d, int) or d < 0 for d in shape):
        raise NpyError(f"has shape {shape!r}; a shape is at most {MAX_RANK} non-negative "
                       f"integers")
    size = dtype.itemsize
    for d in shape:
        size *= d
    check_bytes(size, f"{what} ({dtype.name}{list(shape)})")
    offset = f.tell()
    if len(data) - offset != size:
        raise NpyError(f"holds {len(data) - offset} bytes of data, its header "
                       f"({dtype.name}{list(shape)}) says {size}: truncated or corrupt")
    a = np.frombuffer(data, dtype, offset=offset, count=size // dtype.itemsize if
                      dtype.itemsize else 0)
    a = a.reshape(shape, order="F" if fortran else "C")
    # (np.array, not ascontiguousarray, which would make a scalar 1-D)
    return np.array(a, dtype=dtype.newbyteorder("="), order="C", copy=True)


def load_file(path, what: str) -> np.ndarray | dict:
    """A .npy file's array, or a .npz file's {name: array}; ``what`` names the file in
    errors (NpyError, or FileNotFoundError for a missing file)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        check_bytes(size, what)
        f.seek(0)
        data = f.read()
    if data[:4] != b"PK\x03\x04":
        return decode(data, what=what)
    arrays = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    raise NpyError(f"holds {info.filename!r}, which is not an array (.npy)")
                check_bytes(info.file_size, f"{what}: {info.filename}")
                name = info.filename[:-4]
                try:
                    arrays[name] = decode(z.read(info), what=f"{what}: {info.filename}")
                except NpyError as e:
                    raise NpyError(f"member {info.filename}: {e}") from None
    except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, ValueError,
            OverflowError, EOFError, OSError, IndexError) as e:
        raise NpyError(f"is not a readable .npz archive ({_first_line(e)})") from None
    return arrays


def _first_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= 120 else text[:117] + "..."
