"""The ALU instruction's executions as batched numpy operations, in time linear in their count.

An ALU instruction is a sequence of executions ``ACC[d] = op(ACC[d], ACC[s] or imm)`` (and
OUT[d] = the low byte), each seeing every earlier one. :func:`plan_alu` turns the
executions of one chunk into *steps* that give the in-order result:

- **one batch**: no execution reads or rewrites a row an earlier one wrote (the usual
  case: each row written once), so all of them run as one array operation;
- **closed forms**, when rows repeat but never feed each other: a row updated k times by
  one operand (the immediate, or one source row the instruction never writes) is one
  operation (x + k*y, x * y^k, x >> k*a, ...); with several such source rows, their values
  are folded first (sum, product, min, max); with every execution in place (x op x), k
  updates of a row are again closed forms or at most 64 array steps;
- otherwise **hazard-free batches**: the longest runs that execute at once with the in-order
  result, found in one pass (:func:`_batch_bounds`); runs of tiny batches (a true chain of
  dependent updates) execute one by one on row views, about a microsecond each.

Every path is O(n log n) in the executions of the chunk; only true chains pay per
execution. ACC arithmetic is int32 and wraps like the hardware; OUT is written once per
touched row at the end of each step, with the low byte of the row's final value (what
the last execution writing it leaves there).
"""

from __future__ import annotations

import numpy as np

from celosia.isa import AluInsn, AluOp

__all__ = ["plan_alu", "one_batch", "shr_tensor", "as_rows", "ALU_UFUNCS"]

# ALU operations as int32 ufuncs (int32 array arithmetic wraps like the hardware); SHR is
# a right or left shift by a constant, or shr_tensor.
ALU_UFUNCS = {AluOp.MIN: np.minimum, AluOp.MAX: np.maximum, AluOp.ADD: np.add,
              AluOp.MUL: np.multiply}
# Batches shorter than this run one execution at a time (a numpy call per batch costs
# more than a loop over a few rows).
_SMALL_BATCH = 8
_MASK32 = np.uint64(0xFFFFFFFF)


def shr_tensor(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x >> y lane by lane, left by -y when y < 0, amounts capped at 31 (int64: negating
    -2^31); the low 32 bits."""
    y64 = y.astype(np.int64)
    x64 = x.astype(np.int64)
    return np.where(y64 >= 0, x64 >> np.minimum(y64, 31),
                    x64 << np.minimum(-y64, 31)).astype(np.int32)


def _wrap32(v: np.ndarray) -> np.ndarray:
    """int64 (or uint64) values to int32, modulo 2^32."""
    return (v.astype(np.uint64) & _MASK32).astype(np.uint32).view(np.int32)


def plan_alu(insn: AluInsn, dst: np.ndarray, src: np.ndarray, acc: np.ndarray,
             out: np.ndarray) -> tuple[list, int]:
    """(steps, bytes they hold) for the executions ``dst``/``src`` (row indices in order) of
    ``insn`` on ``acc`` (rows, BATCH, BLOCK int32) and ``out`` (its int8 side copy): running
    each step (a function of no arguments) in order gives the in-order result."""
    use_src = not insn.use_imm
    n = dst.size
    if n == 0:
        return [], 0
    if _each_row_once(dst, src if use_src else None):
        return _one_batch(insn, dst, src, acc, out)
    rows, inverse, counts = np.unique(dst, return_inverse=True, return_counts=True)
    nbytes = rows.nbytes + counts.nbytes
    if not use_src:
        return [_repeated_closed_form(insn.alu_op, rows, counts, acc, out, imm=insn.imm)], nbytes
    if bool(np.all(src == dst)):
        return [_in_place_closed_form(insn, rows, counts, acc, out)], nbytes
    if not bool(np.isin(src, rows).any()):  # operands from rows the instruction never writes
        src_of = np.zeros(rows.size, src.dtype)
        src_of[inverse] = src
        if bool(np.all(src_of[inverse] == src)):  # one source row per destination row
            return [_repeated_closed_form(insn.alu_op, rows, counts, acc, out,
                                          src_rows=src_of)], nbytes + src_of.nbytes
        if insn.alu_op != AluOp.SHR:
            return _folded_operands(insn, dst, src, acc, out)
    return _batched(insn, dst, src, acc, out)


def _each_row_once(dst: np.ndarray, src: np.ndarray | None) -> bool:
    """Whether all executions can run as one batch, judged cheaply: rows written once in
    increasing order, and each read row either the written one or one never written."""
    n = dst.size
    if n > 1 and not bool(np.all(dst[1:] > dst[:-1])):
        return False
    if src is None or n == 1:
        return True
    return bool(np.all(src == dst)) or src.max() < dst.min() or src.min() > dst.max()


def as_rows(idx: np.ndarray, *, step: bool = False, repeat: bool = False):
    """Row indices (at least one) as a slice when they are consecutive (a view instead of a
    gather; with ``step`` also evenly spaced, with ``repeat`` also one row repeated, which
    broadcasts), else as an index array."""
    lo = int(idx[0])
    if idx.size == 1:
        return slice(lo, lo + 1)
    gap = int(idx[1]) - lo
    if gap == 1 or (step and gap > 0) or (repeat and gap == 0):
        if bool(np.all(np.diff(idx) == gap)):
            return slice(lo, lo + 1) if gap == 0 else slice(lo, int(idx[-1]) + 1, gap)
    return np.ascontiguousarray(idx, dtype=np.intp)


def _imm_operation(insn: AluInsn):
    """(ufunc, y) applying the instruction's immediate operand once."""
    if insn.alu_op != AluOp.SHR:
        return ALU_UFUNCS[insn.alu_op], np.int32(insn.imm)
    if insn.imm >= 0:  # right, or left when negative; amounts capped at 31
        return np.right_shift, np.int32(min(insn.imm, 31))
    return np.left_shift, np.int32(min(-insn.imm, 31))


def _one_batch(insn: AluInsn, dst, src, acc, out) -> tuple[list, int]:
    """Every execution at once, on views of ACC and OUT when the rows are evenly spaced."""
    d = as_rows(dst, step=True)
    s = None if insn.use_imm else as_rows(src, step=True, repeat=True)
    return one_batch(insn, d, s, acc, out)


def one_batch(insn: AluInsn, d, s, acc, out) -> tuple[list, int]:
    """(steps, bytes) running every execution at once: ``d`` the written rows, ``s`` the
    read ones (None for an immediate operand), each a slice or an index array, such that
    no execution reads or rewrites a row an earlier one wrote (see ``plan_alu``)."""
    if insn.use_imm or insn.alu_op != AluOp.SHR:
        ufunc, y_imm = (_imm_operation(insn) if insn.use_imm
                        else (ALU_UFUNCS[insn.alu_op], None))
    else:
        ufunc, y_imm = None, None  # SHR by a tensor of amounts: shr_tensor
    nbytes = sum(x.nbytes for x in (d, s) if isinstance(x, np.ndarray))
    if isinstance(d, slice):
        x, o = acc[d], out[d]
        y = y_imm if s is None else (acc[s] if isinstance(s, slice) else None)
        gather = s if isinstance(s, np.ndarray) else None

        def batch_in_place():
            yy = acc[gather] if gather is not None else y
            # ufuncs read overlapping inputs as if copied first: every x and y is read
            # before any is written, as the batch assumes
            if ufunc is not None:
                ufunc(x, yy, out=x)
            else:
                x[...] = shr_tensor(x, yy)
            np.copyto(o, x, casting="unsafe")  # the low byte, as astype(int8)
        return [batch_in_place], nbytes

    def batch_gathered():
        v = acc[d]
        yy = y_imm if s is None else acc[s]
        r = ufunc(v, yy, out=v) if ufunc is not None else shr_tensor(v, yy)
        acc[d] = r
        out[d] = r.astype(np.int8)
    return [batch_gathered], nbytes


def _repeated_closed_form(op: AluOp, rows, counts, acc, out, *, imm=None, src_rows=None):
    """Row ``rows[i]`` updated ``counts[i]`` times by one operand: the immediate, or the row
    ``src_rows[i]``, which the instruction never writes. No row reads another's result, so
    each row's k updates are one operation: x + k*y, x * y^k, min or max once, and shifts
    that add up (an arithmetic right shift past 31 leaves the sign, a left shift past 31
    leaves 0)."""
    k = counts.astype(np.int64)[:, None, None]

    def closed_form():
        x = acc[rows]
        y = np.int64(imm) if src_rows is None else acc[src_rows].astype(np.int64)
        if op == AluOp.ADD:
            r = x + _wrap32(k * y)
        elif op == AluOp.MUL:
            r = _wrap32(x.view(np.uint32).astype(np.uint64) * _pow_mod32(y, k))
        elif op in (AluOp.MIN, AluOp.MAX):
            r = ALU_UFUNCS[op](x, y.astype(np.int32))
        else:
            amount = np.minimum(k * np.minimum(np.abs(y), 31), 32)  # 32: all shifted out
            right = x >> np.minimum(amount, 31)
            left = np.where(amount < 32, x.astype(np.int64) << np.minimum(amount, 31), 0)
            r = _wrap32(np.where(y >= 0, right, left))
        r = r.astype(np.int32, copy=False)
        acc[rows] = r
        out[rows] = r.astype(np.int8)
    return closed_form


def _pow_mod32(base: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    """base ** exponent modulo 2^32, element by element (broadcast; uint64), by repeated
    squaring."""
    b = np.asarray(base).astype(np.uint64) & _MASK32
    e = np.asarray(exponents, np.int64).copy()
    result = np.ones(np.broadcast_shapes(b.shape, e.shape), np.uint64)
    while bool(np.any(e)):
        result = np.where(e & 1, (result * b) & _MASK32, result)
        b = (b * b) & _MASK32
        e >>= 1
    return result


def _in_place_closed_form(insn: AluInsn, rows, counts, acc, out):
    """Every execution is x = op(x, x): each row's k updates are independent of the other
    rows. ADD doubles (k doublings: a left shift by k), MIN and MAX change nothing; MUL
    squares and SHR shifts x by itself, and both reach a fixed point: x^(2^k) modulo 2^32
    is 1 or 0 from k = 30 on (odd residues have order dividing 2^30, even ones reach 2^32),
    and x >> x reaches 0 within 64 steps (a positive x at least halves; a negative one
    gains trailing zeros until it is 0 or positive). So those run min(k, 64) array steps,
    each on the rows that still have updates left."""
    op = insn.alu_op
    k = counts.astype(np.int64)

    def closed_form():
        x = acc[rows]
        if op == AluOp.ADD:
            shift = np.minimum(k, 32)[:, None, None]
            x = np.where(shift < 32, _wrap32(x.astype(np.int64) << np.minimum(shift, 31)), 0)
        elif op in (AluOp.MUL, AluOp.SHR):
            for step in range(int(min(k.max(), 64))):
                live = k > step
                v = x[live]
                x[live] = v * v if op == AluOp.MUL else shr_tensor(v, v)
        x = x.astype(np.int32, copy=False)
        acc[rows] = x
        out[rows] = x.astype(np.int8)
    return closed_form


def _folded_operands(insn: AluInsn, dst, src, acc, out) -> tuple[list, int]:
    """Source rows the instruction never writes: each destination row's operands fold into
    one (ADD, MUL, MIN and MAX are associative and commutative on int32 with wrap-around),
    which is then applied once."""
    order = np.argsort(dst, kind="stable")
    d = dst[order]
    starts = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1])))
    rows, s = d[starts], np.ascontiguousarray(src[order])
    op = insn.alu_op

    def folded():
        y = acc[s]
        if op == AluOp.ADD:  # int64 sums of int32 values, then modulo 2^32
            y = _wrap32(np.add.reduceat(y.astype(np.int64), starts, axis=0))
        elif op == AluOp.MUL:  # uint64 products keep their low 32 bits exactly
            y = _wrap32(np.multiply.reduceat(y.view(np.uint32).astype(np.uint64), starts, axis=0))
        else:
            y = ALU_UFUNCS[op].reduceat(y, starts, axis=0)
        r = ALU_UFUNCS[op](acc[rows], y)
        acc[rows] = r
        out[rows] = r.astype(np.int8)
    return [folded], rows.nbytes + s.nbytes + starts.nbytes


def _batch_bounds(dst: np.ndarray, src: np.ndarray) -> list[int]:
    """Boundaries [0, ..., n] of the greedy hazard-free batches: a batch ends before the
    first execution that rewrites a row or reads a row that an execution of the batch wrote
    (reading a row that a later execution of the batch writes is fine: a batch reads all
    its operands before it writes). O(n log n): ``h[p]`` is the last earlier execution that
    wrote row dst[p] or src[p], and a batch starting at b ends at the first p with h[p] >= b."""
    n = dst.size
    order = np.argsort(dst, kind="stable")
    d = dst[order]
    same = d[1:] == d[:-1]
    h = np.full(n, -1, np.int64)
    h[order[1:][same]] = order[:-1][same]  # the previous write of the same row
    # the last write of row src[p] before p: the largest (row, position) key below (src[p], p)
    keys = d.astype(np.int64) * n + order
    q = np.searchsorted(keys, src.astype(np.int64) * n + np.arange(n)) - 1
    qc = np.maximum(q, 0)
    h = np.maximum(h, np.where((q >= 0) & (d[qc] == src), order[qc], -1))
    cand = np.flatnonzero(h >= 0)
    bounds, start = [0], 0
    for p, hp in zip(cand.tolist(), h[cand].tolist()):
        if hp >= start:
            bounds.append(p)
            start = p
    bounds.append(n)
    return bounds


def _batched(insn: AluInsn, dst, src, acc, out) -> tuple[list, int]:
    """Hazard-free batches in order; runs of small ones one execution at a time."""
    bounds = _batch_bounds(dst, src)
    steps, nbytes = [], 0
    k = 0
    while k < len(bounds) - 1:
        a, b = bounds[k], bounds[k + 1]
        if b - a >= _SMALL_BATCH:
            d, s = np.ascontiguousarray(dst[a:b]), np.ascontiguousarray(src[a:b])
            steps.append(_gathered_batch(insn.alu_op, d, s, acc))
            nbytes += d.nbytes + s.nbytes
            k += 1
            continue
        while k < len(bounds) - 1 and bounds[k + 1] - bounds[k] < _SMALL_BATCH:
            k += 1
        b = bounds[k]
        steps.append(_one_by_one(insn.alu_op, dst[a:b].tolist(), src[a:b].tolist(), acc))
        nbytes += 16 * (b - a)
    touched = np.unique(dst)

    def side_write():  # OUT: the low byte of each touched row's final value
        out[touched] = acc[touched].astype(np.int8)
    steps.append(side_write)
    return steps, nbytes + touched.nbytes


def _gathered_batch(op: AluOp, d, s, acc):
    ufunc = ALU_UFUNCS.get(op)

    def batch():
        x, y = acc[d], acc[s]
        acc[d] = ufunc(x, y, out=x) if ufunc is not None else shr_tensor(x, y)
    return batch


def _one_by_one(op: AluOp, d: list, s: list, acc):
    """Executions one at a time, on row views (a true chain of dependent updates)."""
    ufunc = ALU_UFUNCS.get(op)

    rows = {r: acc[r] for r in set(d) | set(s)}  # views of ACC (which never moves)

    def chain():
        if ufunc is not None:
            for a, b in zip(d, s):
                ufunc(rows[a], rows[b], out=rows[a])
        else:
            for a, b in zip(d, s):
                _shr_row(rows[a], rows[b])
    return chain


def _shr_row(x: np.ndarray, y: np.ndarray) -> None:
    """x = SHR(x, y) in place, with fewer array operations than shr_tensor (this runs once
    per execution of a chain): x * 2^-y in float64 is exact (at most 31 significant bits
    times a power of two), its floor is the arithmetic right shift, and the int64 -> int32
    cast keeps the low 32 bits of a left shift."""
    amount = np.minimum(np.maximum(y, -31), 31)  # np.clip costs more on a short row
    np.copyto(x, np.floor(x * np.ldexp(1.0, np.negative(amount))).astype(np.int64),
              casting="unsafe")
