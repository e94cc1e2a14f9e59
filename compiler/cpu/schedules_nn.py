"""Schedules of the transformer models' operators (issue #12): the batched matrix product
of attention, ``[B, M, K] @ [B, K, N]`` with both operands computed at run time (scores
``Q @ K^T`` and ``softmax @ V``).

Each batch is a dense product: output tiles of ``rows x nb`` (rows a divisor of M from 4 to
8, nb 8 or 16: the kernel is offered only for such M and N)
accumulated in registers over K, batches in parallel on the kernels' own threads (numpy's BLAS threads would compete with them). One running float32 sum over
K (attention's K is a head size or a sequence length, a few hundred terms), as a BLAS
kernel does.
"""

from __future__ import annotations

from celosia.errors import CompilerError

from ..tensor import te
from ..tensor.schedule import Schedule, create_schedule

__all__ = ["batch_matmul", "schedule_batch_matmul", "batch_matmul_tiles"]

_TAG = "batch_matmul"


def batch_matmul_tiles(m: int, n: int) -> tuple[int, int] | None:
    """(rows, nb) of the output tile, or None when N has no vector-wide block or M no
    divisor of 4 to 8 (ViT's 197 tokens: one row per tile, slower than numpy)."""
    if n % 8:
        return None
    nb = 16 if n % 16 == 0 else 8
    rows = next((d for d in (8, 7, 6, 5, 4) if m % d == 0), None)
    return None if rows is None else (rows, nb)


def batch_matmul(a: te.Tensor, b: te.Tensor, name: str = "out", epilogue=None) -> te.Tensor:
    """``out[z, i, j] = sum_k a[z, i, k] * b[z, k, j]`` in float32, then
    ``epilogue(value, (z, i, j))`` if given (attention's scaling of the scores)."""
    (bz, m, k), (bz2, k2, n) = a.shape, b.shape
    if bz != bz2 or k != k2:
        raise CompilerError(f"{name}: batched product of {a.shape} and {b.shape}")
    r = te.reduce_axis(k, "k")
    acc = te.compute((bz, m, n), lambda z, i, j: te.sum(a[z, i, r] * b[z, r, j], axis=[r]),
                     f"{name}.acc", tag=_TAG)
    if epilogue is None:
        return te.compute((bz, m, n), lambda z, i, j: acc[z, i, j], name, tag=_TAG)
    return te.compute((bz, m, n), lambda z, i, j: epilogue(acc[z, i, j], (z, i, j)), name,
                      tag=_TAG)


def schedule_batch_matmul(out: te.Tensor) -> Schedule:
    if out.op.tag != _TAG:
        raise CompilerError(f"schedule_batch_matmul: {out.name} was not made by batch_matmul")
    s = create_schedule(out)
    _, m, n = out.shape
    rows, nb = batch_matmul_tiles(m, n)
    acc = next(st for st in s.stages if st.name == f"{out.name}.acc")
    o = s[out]
    z, i, j = o.leaves
    io, ii = o.split(i, rows)
    jo, ji = o.split(j, nb)
    o.reorder(z, jo, io, ii, ji)
    # Batches in parallel (heads x batch: a dozen and more). Not z fused with jo: the
    # accumulator's bounds, inferred through a fused loop, cover every column block
    # (measured 8x slower at N = 128).
    o.parallel(z)
    o.vectorize(ji)
    acc.set_scope("local")
    acc.compute_at(o, io)
    az, ai, aj, ak = acc.leaves
    acc.reorder(az, ak, ai, aj)
    acc.unroll(ai)
    acc.vectorize(aj)
    return s
