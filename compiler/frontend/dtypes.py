"""ONNX element types as numpy dtypes, within what celosia supports."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ..graph.ir import GraphError

__all__ = ["np_dtype"]


def np_dtype(elem_type, what, where) -> str:
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        dtype = None
    if dtype is None or dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise GraphError(f"{where}: {what} has element type "
                         f"{helper.tensor_dtype_to_string(elem_type)}, which celosia does not "
                         "support (bool, integers and float16/32/64 are)")
    return str(dtype)
