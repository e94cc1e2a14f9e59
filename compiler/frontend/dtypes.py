"""ONNX element types as numpy dtypes, within what celosia supports."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..graph.ir import GraphError

__all__ = ["np_dtype", "supported_elem_type"]


def _dtype(elem_type) -> np.dtype | None:
    """The numpy dtype of a supported ONNX element type code, else None (UNDEFINED, codes
    onnx does not know, strings, bfloat16, float8, 4-bit and complex types)."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(elem_type)))
    except Exception:  # onnx raises KeyError for unknown codes, TypeError for odd ones
        return None
    return dtype if dtype.kind in "biuf" and dtype.itemsize <= 8 else None


def supported_elem_type(elem_type) -> bool:
    return _dtype(elem_type) is not None


def np_dtype(elem_type, what, where) -> str:
    dtype = _dtype(elem_type)
    if dtype is None:
        try:
            name = TensorProto.DataType.Name(int(elem_type))
        except ValueError:
            name = f"code {elem_type} (not an ONNX element type)"
        raise GraphError(f"{where}: {what} has element type {name}, which celosia does not "
                         "support (bool, integers and float16/32/64 are)")
    return str(dtype)
