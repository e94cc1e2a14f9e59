"""ONNX tensors (initializers, tensor attributes, external data) read into numpy only after
their element type, dims, byte size and stored data have been checked: a corrupt or hostile
file gets an error naming the tensor, never an allocation it asked for or a read outside the
model's folder."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from celosia.limits import ResourceLimitError, check_bytes

from ..graph.ir import GraphError, ModelLoadError
from .dtypes import np_dtype

__all__ = ["TensorTooLargeError", "check_size", "read_tensor", "inline_external_data"]


class TensorTooLargeError(GraphError, ResourceLimitError):
    """A model's tensor (initializer, input or computed value) larger than celosia.limits
    allows."""


def check_size(nbytes: int, what: str) -> None:
    """check_bytes, as an error of the graph compiler's family."""
    try:
        check_bytes(nbytes, what)
    except ResourceLimitError as e:
        raise TensorTooLargeError(str(e)) from None


def _dims_text(dtype, dims) -> str:
    return f"{dtype}[{','.join(map(str, dims))}]"


def read_tensor(t: TensorProto, what: str, where: str, base_dir: Path | None = None
                ) -> np.ndarray:
    """The array of a TensorProto after checking it (``what`` names it in errors, e.g.
    "initializer 'w'"); ``base_dir`` is the model's folder, where external data may live."""
    dtype = np_dtype(t.data_type, what, where)
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{where}: {what} has dims {dims}: a size is negative; the file "
                             "is corrupt, re-export the model")
    if t.HasField("segment"):
        raise ModelLoadError(f"{where}: {what} is stored in segments, which celosia does not "
                             "read; re-export the model with whole tensors")
    count = math.prod(dims)
    nbytes = count * np.dtype(dtype).itemsize
    shown = f"{where}: {what} {_dims_text(dtype, dims)}"
    if t.data_location == TensorProto.EXTERNAL:
        return _read_external(t, dtype, dims, nbytes, shown, base_dir)
    if t.HasField("raw_data"):
        stored, unit = len(t.raw_data), "bytes"
        expected = nbytes
    else:
        stored, unit = len(getattr(t, helper.tensor_dtype_to_field(t.data_type))), "values"
        expected = count
    if stored != expected:
        raise ModelLoadError(f"{shown} holds {stored} {unit} of data but its dims need "
                             f"{expected}; the file is truncated or corrupt")
    check_size(nbytes, shown)
    return numpy_helper.to_array(t).astype(dtype, copy=False)


def inline_external_data(proto, where: str, base_dir: Path | None) -> None:
    """Initializers stored in external files read (after the checks of ``read_tensor``) into
    the model, as onnx.load does unchecked, so onnx's checker sees an ordinary model."""
    for t in proto.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            a = read_tensor(t, f"initializer {t.name!r}", where, base_dir)
            t.data_location = TensorProto.DEFAULT
            del t.external_data[:]
            t.raw_data = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()


def _read_external(t, dtype, dims, nbytes, shown, base_dir) -> np.ndarray:
    if base_dir is None:
        raise ModelLoadError(f"{shown} is stored in an external file; import the model from "
                             "its path (with the data file beside it)")
    info = {e.key: e.value for e in t.external_data}
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else nbytes
    except ValueError:
        raise ModelLoadError(f"{shown}: external data offset/length {info} are not "
                             "integers; the file is corrupt") from None
    base = Path(base_dir).resolve()
    path = (base / info.get("location", "")).resolve()
    if not info.get("location") or base not in path.parents or not path.is_file():
        raise ModelLoadError(f"{shown}: external data {info.get('location')!r} is not a file "
                             "inside the model's folder; keep the data file beside the model")
    if offset < 0 or length != nbytes or offset + nbytes > path.stat().st_size:
        raise ModelLoadError(f"{shown}: external data {path.name!r} at offset {offset} with "
                             f"length {length} does not hold its {nbytes} bytes; the data "
                             "file is truncated or does not belong to this model")
    check_size(nbytes, shown)
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(nbytes)
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).astype(
        dtype).reshape(dims)
