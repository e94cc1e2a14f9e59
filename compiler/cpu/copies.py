"""Strided copies as compiled kernels: Transpose, Slice, and the row padding and cropping
around the dense and batched-matmul kernels (whose register tiles need a row count with a
small divisor: ViT's 197 tokens are computed as 200).

One spec covers them all: output axis ``k`` reads input axis ``perm[k]`` at
``starts[k] + i * steps[k]``; an index past the input's end (padding) reads its last
element instead (clamped, a copy of the last row: the rows the padding adds are computed
and dropped, so they only need to be finite values of the data):

    {"op": "copy", "dtype": "float32", "data": [1, 197, 12, 64], "out": [1, 12, 64, 197],
     "perm": [0, 2, 3, 1], "starts": [0, 0, 0, 0], "steps": [1, 1, 1, 1]}

numpy runs a Transpose or a Slice as a strided copy too; here it is one parallel loop
nest without a Python call per node (a 197x768 copy: ~0.4 ms as a numpy Pad, ~0.05 ms
compiled).
"""

from __future__ import annotations

from celosia.errors import CompilerError

from ..tensor import te
from ..tensor.expr import as_expr, min_expr
from ..tensor.schedule import create_schedule
from .schedules import schedule_elementwise

__all__ = ["copy_spec", "build_copy"]


def copy_spec(dtype: str, data, out, perm=None, starts=None, steps=None) -> dict:
    rank = len(out)
    return {"op": "copy", "dtype": dtype, "data": [int(d) for d in data],
            "out": [int(d) for d in out],
            "perm": list(range(rank)) if perm is None else [int(p) for p in perm],
            "starts": [0] * rank if starts is None else [int(s) for s in starts],
            "steps": [1] * rank if steps is None else [int(s) for s in steps]}


def _check(spec) -> None:
    data, out, perm = spec["data"], spec["out"], spec["perm"]
    if len(data) != len(out) or sorted(perm) != list(range(len(out))) \
            or len(spec["starts"]) != len(out) or len(spec["steps"]) != len(out):
        raise CompilerError(f"copy spec: {data} -> {out} with perm {perm}, starts "
                            f"{spec['starts']}, steps {spec['steps']} do not fit")
    for k, p in enumerate(perm):
        first, step = spec["starts"][k], spec["steps"][k]
        last = first + (out[k] - 1) * step
        if not 0 <= first < data[p] or (step < 0 and last < 0) or step == 0:
            raise CompilerError(f"copy spec: output axis {k} reads input axis {p} (size "
                                f"{data[p]}) from {first} in steps of {step}")


def build_copy(spec):
    _check(spec)
    x = te.placeholder(tuple(spec["data"]), spec["dtype"], "data")
    out, perm = spec["out"], spec["perm"]

    def body(*idx):
        at = [None] * len(perm)
        for k, p in enumerate(perm):
            first, step = spec["starts"][k], spec["steps"][k]
            i = idx[k] if step == 1 else idx[k] * step
            i = i + first if first else i
            if step > 0 and first + (out[k] - 1) * step >= x.shape[p]:
                i = min_expr(i, as_expr(x.shape[p] - 1, i))  # padding: the last element
            at[p] = i
        return x[tuple(at)]
    y = te.compute(tuple(out), body, "out")
    if perm[-1] == len(perm) - 1 or len(out) < 2:
        return schedule_elementwise(y), [x, y]
    return _schedule_gather(y, x, perm), [x, y]


def _schedule_gather(y, x, perm):
    """A transpose that moves the last axis: the outer axes fused and parallel, the last
    two output axes in tiles of 8 x 8 (each tile reads 8 runs of 8 floats along the input's
    own last axis and writes 8 of the output's), unrolled, not vectorised (a vector of
    strided lanes is a gather, slower than scalars)."""
    s = create_schedule(y)
    st = s[y]
    leaves = list(st.leaves)
    a, b = leaves[-2], leaves[-1]
    if a.extent % 8 == 0 and b.extent % 8 == 0:
        a, ai = st.split(a, 8)
        bo, bi = st.split(b, 8)
        st.reorder(*leaves[:-2], a, bo, ai, bi)
        st.unroll(bi)
    outer = leaves[0] if len(leaves) > 2 else a
    for iv in leaves[1:-2]:
        outer = st.fuse(outer, iv)
    st.parallel(outer)
    return s
