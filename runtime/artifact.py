"""The ``.cel`` artifact: one reader and one writer for CPU and accelerator builds.

A ``.cel`` file is a zip archive:

    manifest.json      {"format", "version", ..., "members": {NAME: {"sha256", "bytes"}}}:
                       the build's description (runtime/cpu.py, runtime/accel.py) and the
                       SHA-256 and size of every other member
    manifest.sha256    the SHA-256 of manifest.json, as ``sha256sum`` prints it
    NAME ...           the members the manifest lists (constants, object code, ...)

Loading trusts no byte before it is checked, in this order:

1. the zip directory: the manifest's members and no others, no name twice, stored or
   deflated, not encrypted, each size within ``celosia.limits`` (before reading it);
2. manifest.json: parsed, its format and version read first (an older file says to
   rebuild), then its digest against manifest.sha256, then its fields one by one (the
   caller's schema, written with :class:`Field`: types, dtypes from an allow-list, shapes
   of non-negative integers, references between fields, byte sizes);
3. each member when it is first read: size and SHA-256 against the manifest; an ``.npy``
   member also its header (runtime/npyio.py), object code its ELF structure
   (runtime/elf.py) before LLVM sees it.

Every failure is one :class:`ArtifactError` naming the file, the member or manifest field,
what is wrong and what to do (build the model again with ``celosia compile``).

The digests find corruption and accidental edits. They are not a signature: whoever
rewrites a member and recomputes the digests makes a different, well-formed model. The
schema checks keep such a file from crashing the loader or running past a buffer, as far
as the manifest can be checked without compiling; the meaning of machine code is not.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from pathlib import Path

import numpy as np

from ..errors import CelosiaError
from ..limits import ResourceLimitError, check_bytes
from . import npyio

__all__ = ["ArtifactError", "Invalid", "Field", "Artifact", "write_artifact", "is_artifact",
           "artifact_format", "REBUILD", "MANIFEST", "SEAL", "seal"]

MANIFEST = "manifest.json"
SEAL = "manifest.sha256"
REBUILD = "build it again with `celosia compile`"

# What zipfile raises on a damaged archive, besides BadZipFile: a damaged deflate stream
# (zlib.error), a flipped method or flag (NotImplementedError, RuntimeError), a damaged
# size or offset (ValueError, OverflowError, EOFError, OSError), a damaged name
# (UnicodeDecodeError, a ValueError).
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError,
               ValueError, OverflowError, EOFError, OSError, IndexError)


class ArtifactError(CelosiaError):
    """A .cel file that cannot be loaded: names the file, the member or field, and what
    to do."""


class Invalid(Exception):
    """A check failed (internal: the reader turns it into an ArtifactError with the file
    and what to do)."""


def is_artifact(path) -> bool:
    """Whether ``path`` is meant as a .cel rather than an ONNX file: a zip archive, or
    named .cel (a damaged one is then reported as a damaged model, not as bad ONNX)."""
    if isinstance(path, (str, Path)) and Path(path).suffix == ".cel":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def artifact_format(path) -> str | None:
    """The format a .cel says it has (unverified: only to choose a loader), or None."""
    try:
        with Artifact(path) as a:
            fmt = a.raw_manifest().get("format")
            return fmt if isinstance(fmt, str) else None
    except ArtifactError:
        return None


def seal(manifest_bytes: bytes) -> bytes:
    """manifest.sha256's content for a manifest.json."""
    return f"{hashlib.sha256(manifest_bytes).hexdigest()}  {MANIFEST}\n".encode()


def write_artifact(path, manifest: dict, members: dict, *, deflate: bool = False) -> bytes:
    """Write a .cel (to ``path``, or only return its bytes when ``path`` is None):
    ``manifest`` gains ``members`` (digest and size of each of ``members``, {name: bytes}).
    The file appears whole or not at all (written beside it, then renamed)."""
    manifest = {**manifest, "members": {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        for name, data in members.items()}}
    text = json.dumps(manifest).encode()  # NaN and Infinity (attributes) as Python reads them
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", method) as z:
        z.writestr(MANIFEST, text)
        z.writestr(SEAL, seal(text))
        for name, data in members.items():
            z.writestr(name, data)
    data = buf.getvalue()
    if path is not None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(data)
            tmp.replace(path)
        except OSError as e:
            if tmp.parent.is_dir():
                tmp.unlink(missing_ok=True)
            raise ArtifactError(f"{path}: cannot write the model ({e.strerror}); choose a "
                                f"writable file (-o)") from None
    return data


class Artifact:
    """A .cel opened for reading (a path, or bytes with ``where`` naming them).

        with Artifact(path) as a:
            manifest = a.manifest(FORMAT, VERSION)   # checked up to the schema
            root = Field(manifest)                   # the caller's schema
            weights = a.npy("constants/0.npy")       # verified before use
    """

    def __init__(self, source, where: str | None = None):
        self.where = str(where if where is not None else source)
        self._manifest: dict | None = None
        try:
            if isinstance(source, (bytes, bytearray)):
                check_bytes(len(source), f"{self.where}")
                self._zip = zipfile.ZipFile(io.BytesIO(source))
            else:
                path = Path(source)
                if not path.is_file():
                    raise ArtifactError(f"{path}: no such file")
                try:  # an unreadable file is not a damaged one
                    path.open("rb").close()
                except OSError as e:
                    raise ArtifactError(f"{path}: cannot be read ({e.strerror})") from None
                self._zip = zipfile.ZipFile(path)
        except _ZIP_ERRORS as e:
            raise self.error(f"not a complete zip archive ({_reason(e)}): truncated or "
                             f"corrupt") from None
        try:
            self._infos = self._check_directory()
        except BaseException:
            self._zip.close()
            raise

    def __enter__(self) -> "Artifact":
        return self

    def __exit__(self, *exc) -> None:
        self._zip.close()

    def error(self, what: str, member: str | None = None) -> ArtifactError:
        where = f"{self.where}: {member}" if member else self.where
        return ArtifactError(f"{where}: {what}; {REBUILD}")

    # ---- the zip directory -------------------------------------------------------------------

    def _check_directory(self) -> dict:
        infos = {}
        for info in self._zip.infolist():
            name = info.filename
            if name in infos:
                raise self.error(f"holds member {name!r} twice")
            if info.flag_bits & 0x1:
                raise self.error("is encrypted", name)
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise self.error(f"compression method {info.compress_type} (celosia writes "
                                 f"stored or deflated members)", name)
            try:
                check_bytes(info.file_size, f"{self.where}: {name}")
            except ResourceLimitError as e:
                raise ResourceLimitError(f"{e} (if the file is corrupt, {REBUILD})") from None
            infos[name] = info
        if MANIFEST not in infos:
            raise self.error(f"has no {MANIFEST}: not a celosia model")
        return infos

    def _read_raw(self, name: str) -> bytes:
        info = self._infos[name]
        try:
            with self._zip.open(info) as f:
                data = f.read(info.file_size + 1)
        except _ZIP_ERRORS as e:
            raise self.error(f"cannot be read ({_reason(e)}): truncated or corrupt",
                             name) from None
        if len(data) != info.file_size:
            raise self.error(f"holds {len(data)} bytes, its zip entry says {info.file_size}",
                             name)
        return data

    # ---- the manifest ------------------------------------------------------------------------

    def raw_manifest(self) -> dict:
        """manifest.json parsed, nothing else checked."""
        if self._manifest is None:
            data = self._read_raw(MANIFEST)
            try:
                manifest = json.loads(data)
            except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
                raise self.error(f"is not JSON ({_reason(e)})", MANIFEST) from None
            if not isinstance(manifest, dict):
                raise self.error(f"holds {_kind(manifest)}, not an object", MANIFEST)
            self._manifest_bytes = data
            self._manifest = manifest
        return self._manifest

    def manifest(self, fmt: str, version: int) -> dict:
        """The manifest of a file of format ``fmt``, version ``version``: format and version
        checked first (so an old file says so), then its digest and its member table."""
        m = self.raw_manifest()
        if m.get("format") != fmt:
            shown = m.get("format")
            raise ArtifactError(f"{self.where}: a model of format {_short(shown)}, not "
                                f"{fmt!r}" + ("" if isinstance(shown, str) else
                                              f"; {REBUILD}"))
        v = m.get("version")
        if v != version:
            if isinstance(v, int) and not isinstance(v, bool) and 0 < v < version:
                raise ArtifactError(
                    f"{self.where}: format version {v}, written by an older celosia; this "
                    f"one reads version {version} (with checksums of every member): {REBUILD}")
            raise ArtifactError(f"{self.where}: format version {_short(v)}, this celosia "
                                f"reads version {version}; {REBUILD}, or load it with the "
                                f"celosia that built it")
        if SEAL not in self._infos:
            raise self.error(f"has no {SEAL}, the digest of its manifest")
        digest = self._read_raw(SEAL)
        if digest != seal(self._manifest_bytes):
            raise self.error("does not match its SHA-256 in manifest.sha256 (edited or "
                             "corrupt)", MANIFEST)
        try:
            members = Field(m)["members"]
            for name, entry in members.items():
                entry["sha256"].string(pattern="sha256")
                entry["bytes"].integer()
        except Invalid as e:
            raise self.error(str(e), MANIFEST) from None
        listed = set(m["members"]) | {MANIFEST, SEAL}
        for name in self._infos:
            if name not in listed:
                raise self.error(f"holds member {name!r}, which the manifest does not list")
        for name in m["members"]:
            if name not in self._infos:
                raise self.error(f"has no member {name!r}, which the manifest lists")
            if self._infos[name].file_size != m["members"][name]["bytes"]:
                raise self.error(f"is {self._infos[name].file_size} bytes, the manifest "
                                 f"says {m['members'][name]['bytes']}", name)
        return m

    def check(self, schema, *args):
        """Run ``schema(Field(manifest), *args)``; an Invalid becomes an ArtifactError
        naming manifest.json and the field."""
        try:
            return schema(Field(self._manifest), *args)
        except Invalid as e:
            raise self.error(str(e), MANIFEST) from None
        except ResourceLimitError as e:
            raise ResourceLimitError(f"{self.where}: {MANIFEST}: {e}") from None

    # ---- members -----------------------------------------------------------------------------

    def has(self, name: str) -> bool:
        return name in self._manifest["members"]

    def read(self, name: str) -> bytes:
        """A member's bytes, after its SHA-256 matched the manifest's."""
        entry = self._manifest["members"].get(name)
        if entry is None:
            raise self.error(f"has no member {name!r}, which the manifest refers to")
        data = self._read_raw(name)
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise self.error("does not match its SHA-256 in the manifest (corrupt or "
                             "edited)", name)
        return data

    def npy(self, name: str, *, dtype: str | None = None, shape=None) -> np.ndarray:
        """A verified ``.npy`` member as an array; with ``dtype``/``shape``, those are
        required."""
        data = self.read(name)
        try:
            a = npyio.decode(data, strict=True)
        except npyio.NpyError as e:
            raise self.error(str(e), name) from None
        except ResourceLimitError as e:
            raise ResourceLimitError(f"{self.where}: {name}: {e}") from None
        if dtype is not None and str(a.dtype) != dtype:
            raise self.error(f"holds {a.dtype} data, the manifest says {dtype}", name)
        if shape is not None and tuple(a.shape) != tuple(shape):
            raise self.error(f"has shape {list(a.shape)}, the manifest says {list(shape)}",
                             name)
        return a


# ---- the manifest schema ---------------------------------------------------------------------

DTYPES = npyio.DTYPES
MAX_RANK = npyio.MAX_RANK
MAX_DIM = 1 << 62


class Field:
    """A value of the manifest and where it is, e.g. ``program.values["relu9"].shape[0]``:
    accessors that return the value when it has the expected type and raise Invalid naming
    the place otherwise."""

    __slots__ = ("value", "path")

    def __init__(self, value, path: str = ""):
        self.value = value
        self.path = path

    def fail(self, what: str) -> Invalid:
        return Invalid(f"{self.path or 'the manifest'}: {what}")

    def _want(self, kind: str):
        return self.fail(f"is {_kind(self.value)}, expected {kind}")

    def obj(self) -> dict:
        if not isinstance(self.value, dict):
            raise self._want("an object")
        return self.value

    def __getitem__(self, key: str) -> "Field":
        d = self.obj()
        if key not in d:
            raise self.fail(f"has no {key!r}")
        return Field(d[key], f"{self.path}.{key}" if self.path else key)

    def get(self, key: str) -> "Field | None":
        return self[key] if key in self.obj() else None

    def items(self) -> list[tuple[str, "Field"]]:
        return [(k, Field(v, f"{self.path}[{json.dumps(k)}]")) for k, v in self.obj().items()]

    def list(self, length: int | None = None) -> list["Field"]:
        if not isinstance(self.value, list):
            raise self._want("a list")
        if length is not None and len(self.value) != length:
            raise self.fail(f"has {len(self.value)} items, expected {length}")
        return [Field(v, f"{self.path}[{i}]") for i, v in enumerate(self.value)]

    def string(self, choices=None, *, pattern: str | None = None) -> str:
        v = self.value
        if not isinstance(v, str):
            raise self._want("a string")
        if choices is not None and v not in choices:
            raise self.fail(f"is {_short(v)}, expected one of {', '.join(sorted(choices))}")
        if pattern == "sha256" and (len(v) != 64 or v.strip("0123456789abcdef")):
            raise self.fail(f"is {_short(v)}, not a SHA-256 in hex")
        return v

    def integer(self, lo: int = 0, hi: int = MAX_DIM) -> int:
        v = self.value
        if not isinstance(v, int) or isinstance(v, bool):
            raise self._want("an integer")
        if not lo <= v <= hi:
            raise self.fail(f"is {v}, outside [{lo}, {hi}]")
        return v

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self._want("true or false")
        return self.value

    def names(self) -> list[str]:
        """A list of strings (value or node names)."""
        return [f.string() for f in self.list()]

    def dtype(self) -> str:
        return self.string(DTYPES)

    def shape(self) -> tuple[int, ...]:
        dims = self.list()
        if len(dims) > MAX_RANK:
            raise self.fail(f"has rank {len(dims)}, more than {MAX_RANK}")
        return tuple(d.integer() for d in dims)


def nbytes(dtype: str, shape) -> int:
    """Bytes of an array, in Python integers (no overflow)."""
    n = np.dtype(dtype).itemsize
    for d in shape:
        n *= d
    return n


def check_array(f: Field, what: str) -> tuple[str, tuple[int, ...]]:
    """``f`` is [dtype, shape] (or {"dtype", "shape"}) of an array within the byte limit."""
    if isinstance(f.value, dict):
        dtype, shape = f["dtype"].dtype(), f["shape"].shape()
    else:
        d, s = f.list(2)
        dtype, shape = d.dtype(), s.shape()
    check_bytes(nbytes(dtype, shape), f"{f.path} ({what} {dtype}{list(shape)})")
    return dtype, shape


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    return "an object"


def _short(v) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _reason(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= 120 else text[:117] + "..."
