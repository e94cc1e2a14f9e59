"""Wide integer products on the int8 GEMM core: ``acc = a @ w.T`` exactly in int32, with
``a`` int8 or int16 and ``w`` int8 or int16, as int8 GEMM passes (bit-sliced
multi-precision, as TFLite's 16x8 integer LSTM needs it); the int32 accumulator itself is
the output (qops.py ``wide_matmul`` is the definition).

Operands split into int8 *digits* (most significant first):

- an int16 activation (any int16 value) as ``a = 256 * a_hi + a_lo + 128`` with
  ``a_hi = a >> 8`` and ``a_lo = (a & 255) - 128``, both int8. The constant ``128 *
  sum_k w[o, k]`` per output channel is the accumulator's starting value (loaded into ACC
  in place of a reset), so nothing is added on the host;
- an int16 weight (in [-32768, 32639]: ``wide_weight_problem``) as ``w = 256 * w_hi +
  w_lo`` with ``w_hi = (w + 128) >> 8`` and ``w_lo = w - 256 * w_hi``, both int8 (signed
  digits: a weight is a constant, so no run-time correction is needed).

The product of digit i of ``a`` and digit j of ``w`` goes to accumulator ``i + j`` (0 the
most significant). Every digit plane of a k-chunk is loaded once and used by every
product it enters, so an int16 x int8 product loads its weights once. Then Horner's rule on
the ALU: ``acc0 = (acc0 << 8) + acc1 [; acc0 = (acc0 << 8) + acc2]`` (SHR by -8, ADD of ACC
rows), wrapping in 32 bits exactly as the definition wraps. The int32 result leaves through
the 8-bit OUT view as four byte planes: STORE, SHR 8, STORE, ... (``unpack_acc32`` puts
them together; the low three planes are read unsigned).

Layouts (BATCH b, BLOCK k; M rows, K and O padded to k):
    a     (A, M/b, K/k, b, k) int8     the A digit planes (A = 1 or 2)
    w     (W, O/k, K/k, k, k) int8     the W digit planes (dense weight layout)
    corr  (O/k, b, k) int32            128 * sum_k w[o, k] (int16 activations only)
    out   (4, M/b, O/k, b, k) int8     the accumulator's bytes, least significant first

The program, per tile of ``tile_m`` row blocks x ``tile_o`` output blocks, per chunk of
``tile_k`` input blocks: the load module loads the chunk's digit planes into one of two
input/weight slots (double buffering: it waits for the compute module to release the slot
it used two chunks before), the compute module runs one GEMM per digit product. After the
last chunk: the Horner ALU steps and the four stores (each store waits for its ALU step,
the next ALU step for the store). The rows of a tile are zeroed (or given the correction)
before its first chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CompilerError
from celosia.isa import AluOp, MemType, Module

from .ops import pad_channels
from .ops_alu import AluProgram

__all__ = ["WideSpec", "WideKnobs", "wide_knobs", "wide_dense", "split_activation",
           "split_weight", "pack_wide_activation", "pack_wide_weight", "wide_correction",
           "unpack_acc32", "wide_weight_problem", "WEIGHT16_MAX", "combine_exact",
           "exact_correction"]

WEIGHT16_MAX = 32639  # the largest int16 weight whose signed digits are both int8
# XOR per byte of a little-endian int16 (low, high): the low byte minus 128 as int8
_HI_LO_FLIP = np.array([[0x80], [0]], np.uint8)


@dataclass(frozen=True)
class WideSpec:
    """``acc[M, O] = a[M, K] @ w[O, K].T`` in int32; ``k`` and ``o`` multiples of BLOCK,
    ``m`` of BATCH; ``a_digits``/``w_digits``: 1 for int8, 2 for int16."""

    m: int
    k: int
    o: int
    a_digits: int = 2
    w_digits: int = 1
    # exact: store every accumulator (``accumulators`` x 4 byte planes) instead of
    # combining them on the ALU, and leave the activation's correction to the host
    # (``combine_exact``): the product exactly, in int64, where Horner's rule in 32 bits
    # could wrap (16 x 16-bit products: a sum of 256 already can).
    exact: bool = False

    @property
    def macs(self) -> int:
        """The product's multiply-adds (each once, not once per pass)."""
        return self.m * self.k * self.o

    @property
    def accumulators(self) -> int:
        return self.a_digits + self.w_digits - 1


@dataclass(frozen=True)
class WideKnobs:
    tile_m: int  # row (batch) blocks per tile
    tile_o: int  # output blocks per tile
    tile_k: int  # input blocks per chunk


def _divisors(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _fits(cfg: HwConfig, spec: WideSpec, m: int, o: int, k: int) -> bool:
    return (2 * spec.a_digits * m * k <= cfg.inp_depth
            and 2 * spec.w_digits * o * k <= cfg.wgt_depth
            and spec.accumulators * m * o <= cfg.acc_depth
            and k * m <= cfg.uop_depth // 8)


def wide_knobs(cfg: HwConfig, spec: WideSpec) -> WideKnobs:
    """The tiling: the whole K per chunk if it fits (fewest passes over the weights), then
    the most output blocks, then the most rows; a CompilerError names what does not fit."""
    mb, kb, ob = spec.m // cfg.batch, spec.k // cfg.block, spec.o // cfg.block
    for tk in _divisors(kb):
        for to in _divisors(ob):
            for tm in _divisors(mb):
                if _fits(cfg, spec, tm, to, tk):
                    return WideKnobs(tm, to, tk)
    raise CompilerError(f"wide product {spec}: not even one block of each operand fits the "
                        f"buffers of this configuration")


def _check(cfg: HwConfig, spec: WideSpec, knobs: WideKnobs, name: str) -> None:
    b, k = cfg.batch, cfg.block
    if spec.m % b or spec.k % k or spec.o % k or spec.m <= 0 or spec.k <= 0 or spec.o <= 0:
        raise CompilerError(f"{name}: M={spec.m} must be a positive multiple of BATCH={b}, "
                            f"K={spec.k} and O={spec.o} of BLOCK={k}")
    if spec.a_digits not in (1, 2) or spec.w_digits not in (1, 2):
        raise CompilerError(f"{name}: operands are int8 or int16 (1 or 2 digits), not "
                            f"{spec.a_digits} and {spec.w_digits}")
    for what, extent, tile in (("tile_m", spec.m // b, knobs.tile_m),
                               ("tile_o", spec.o // k, knobs.tile_o),
                               ("tile_k", spec.k // k, knobs.tile_k)):
        if tile < 1 or extent % tile:
            raise CompilerError(f"{name}: {what}={tile} must divide {extent}")
    if not _fits(cfg, spec, knobs.tile_m, knobs.tile_o, knobs.tile_k):
        raise CompilerError(f"{name}: tiles {knobs} do not fit the buffers")


def wide_dense(cfg: HwConfig, spec: WideSpec, knobs: WideKnobs | None = None,
               name: str = "wide") -> AluProgram:
    """The program (module docstring); takes (a, w[, corr], out) in the packed layouts,
    ``corr`` only for int16 activations."""
    knobs = knobs or wide_knobs(cfg, spec)
    _check(cfg, spec, knobs, name)
    b, k = cfg.batch, cfg.block
    mb, kb, ob = spec.m // b, spec.k // k, spec.o // k
    tm, to, tk = knobs.tile_m, knobs.tile_o, knobs.tile_k
    na, nw, nacc = spec.a_digits, spec.w_digits, spec.accumulators
    rows = tm * to                       # ACC rows of one accumulator
    inp_slot, wgt_slot = na * tm * tk, nw * to * tk
    corrected = na == 2 and not spec.exact
    L, C, S = Module.LOAD, Module.COMPUTE, Module.STORE

    def gemm(dev, acc: int, slot: int, da: int, dw: int):
        dst, src, wgt = acc * rows, slot * inp_slot + da * tm * tk, slot * wgt_slot + dw * to * tk

        def record(kb_):
            if tm > 1:
                kb_.loop(tm, to, tk, 0)
            if to > 1:
                kb_.loop(to, 1, 0, tk)
            for kk in range(tk):
                kb_.push(dst, src + kk, wgt + kk)
        dev.gemm(("wide-gemm", tm, to, tk, dst, src, wgt), record)

    def rows_op(dev, key, op, imm=None, dst=0, src=0):
        def record(kb_):
            if rows > 1:
                kb_.loop(rows, 1, 1 if imm is None else 0)
            kb_.push(dst, src if imm is None else dst)
        dev.alu(("wide-alu", key, rows, dst, src, imm), record, op, imm=imm)

    def emit(dev, bufs):
        a, w = bufs[0], bufs[1]
        corr = bufs[2] if corrected else None
        out = bufs[-1]
        chunk = 0
        first_tile = True
        for o0 in range(0, ob, to):
            for m0 in range(0, mb, tm):
                # A tile's accumulators: the store of the previous tile must have read OUT.
                if not first_tile:
                    dev.dep_pop(S, C)
                first_tile = False
                for acc in range(nacc):
                    if corrected and acc == nacc - 1:
                        dev.load_2d(corr, o0, to, tm, 0, sram_index=acc * rows,
                                    mem_type=MemType.ACC)
                    else:
                        def reset(kb_, acc=acc):
                            kb_.loop(rows, 1, 0, 0)
                            kb_.push(acc * rows, 0, 0)
                        dev.gemm(("wide-reset", acc * rows, rows), reset, reset=True)
                for k0 in range(0, kb, tk):
                    slot = chunk % 2
                    if chunk >= 2:
                        dev.dep_pop(C, L)  # the GEMMs of chunk - 2 have read this slot
                    for da in range(na):
                        dev.load_2d(a, (da * mb + m0) * kb + k0, tk, tm, kb,
                                    sram_index=slot * inp_slot + da * tm * tk,
                                    mem_type=MemType.INP)
                    for dw in range(nw):
                        dev.load_2d(w, (dw * ob + o0) * kb + k0, tk, to, kb,
                                    sram_index=slot * wgt_slot + dw * to * tk,
                                    mem_type=MemType.WGT)
                    dev.dep_push(L, C)
                    dev.dep_pop(L, C)
                    for da in range(na):
                        for dw in range(nw):
                            gemm(dev, da + dw, slot, da, dw)
                    dev.dep_push(C, L)
                    chunk += 1
                stored = range(nacc) if spec.exact else range(1)
                if not spec.exact:
                    for acc in range(1, nacc):  # Horner: acc0 = (acc0 << 8) + acc
                        rows_op(dev, "shl", AluOp.SHR, imm=-8)
                        rows_op(dev, "add", AluOp.ADD, dst=0, src=acc * rows)
                for acc in stored:
                    for byte in range(4):
                        if acc or byte:
                            dev.dep_pop(S, C)  # the store before has read OUT
                        if byte:
                            rows_op(dev, "shr", AluOp.SHR, imm=8, dst=acc * rows)
                        dev.dep_push(C, S)
                        dev.dep_pop(C, S)
                        dev.store_2d(acc * rows, out, ((acc * 4 + byte) * mb + m0) * ob + o0,
                                     to, tm, ob)
                        dev.dep_push(S, C)
        dev.dep_pop(S, C)  # the last store's token: none left for later programs
        for _ in range(min(chunk, 2)):
            dev.dep_pop(C, L)

    args = [("a", "int8", (na, mb, kb, b, k)), ("w", "int8", (nw, ob, kb, k, k))]
    if corrected:
        args.append(("corr", "int32", (ob, b, k)))
    args.append(("out", "int8", ((nacc if spec.exact else 1) * 4, mb, ob, b, k)))
    return AluProgram(name, cfg, args, emit)


# ---- operands ---------------------------------------------------------------------------


def split_activation(a: np.ndarray) -> np.ndarray:
    """int16 ``a`` -> int8 digits [2, ...]: ``a >> 8`` and ``(a & 255) - 128``."""
    a = np.asarray(a).astype(np.int32)
    return np.stack([a >> 8, (a & 255) - 128]).astype(np.int8)


def wide_weight_problem(w: np.ndarray) -> str | None:
    """Why an int16 weight has no signed int8 digits (None: it has)."""
    top = int(np.max(w)) if np.size(w) else 0
    if top > WEIGHT16_MAX:
        return f"an int16 weight of {top} is above {WEIGHT16_MAX}: its high digit leaves int8"
    return None


def split_weight(w: np.ndarray) -> np.ndarray:
    """int16 ``w`` (at most WEIGHT16_MAX) -> signed int8 digits [2, ...]; int8 -> [1, ...]."""
    w = np.asarray(w)
    if w.dtype == np.int8:
        return w[None]
    problem = wide_weight_problem(w)
    if problem:
        raise CompilerError(problem)
    hi = (w.astype(np.int32) + 128) >> 8
    return np.stack([hi, w.astype(np.int32) - 256 * hi]).astype(np.int8)


def pack_wide_activation(a: np.ndarray, cfg: HwConfig, rows: int | None = None) -> np.ndarray:
    """[M, K] int8 or int16 -> the ``a`` layout (digit planes, rows padded to ``rows`` or
    BATCH, K to BLOCK). Padding is digit 0, which is a value of 0 only for int8 operands:
    padded K columns meet zero weights, padded rows are never read back."""
    b, k = cfg.batch, cfg.block
    a = np.asarray(a)
    m, kd = a.shape
    mp = rows if rows is not None else -(-m // b) * b
    kp = -(-kd // k) * k
    if b == 1 and mp == m and kp == kd and a.dtype == np.int16:
        # The layout is the [2, M, K] digit planes themselves: the int16's bytes, the high
        # one as it is, the low one XOR 0x80 (an unsigned byte minus 128). This runs per
        # time step of a recurrent layer, so it avoids the general path's copies.
        lo_hi = np.ascontiguousarray(a.astype("<i2", copy=False)).view(np.uint8).reshape(m * kd, 2)
        out = np.empty((2, m * kd), np.uint8)
        np.bitwise_xor(lo_hi.T, _HI_LO_FLIP, out=out[::-1])  # rows: high byte, low ^ 0x80
        return out.view(np.int8).reshape(2, m, kd // k, 1, k)
    digits = a[None] if a.dtype == np.int8 else split_activation(a)
    out = np.zeros((digits.shape[0], mp, kp), np.int8)
    out[:, :m, :kd] = digits
    return np.ascontiguousarray(out.reshape(-1, mp // b, b, kp // k, k).transpose(0, 1, 3, 2, 4))


def pack_wide_weight(w: np.ndarray, cfg: HwConfig) -> np.ndarray:
    """[O, K] int8 or int16 -> the ``w`` layout (digit planes, O and K padded to BLOCK)."""
    k = cfg.block
    digits = split_weight(np.asarray(w))
    digits = pad_channels(pad_channels(digits, 1, k), 2, k)
    nd, o, kd = digits.shape
    return np.ascontiguousarray(digits.reshape(nd, o // k, k, kd // k, k).transpose(0, 1, 3, 2, 4))


def wide_correction(w: np.ndarray, cfg: HwConfig) -> np.ndarray:
    """The ``corr`` rows of an int16-activation product: ``128 * sum_k w[o, k]`` per output
    channel (O padded to BLOCK), wrapped to int32, the same for every batch lane."""
    b, k = cfg.batch, cfg.block
    s = 128 * np.asarray(w).astype(np.int64).sum(axis=1)
    s = ((s + 2**31) % 2**32 - 2**31).astype(np.int32)
    s = pad_channels(s, 0, k)
    return np.broadcast_to(s.reshape(-1, 1, k), (s.size // k, b, k)).copy()


def combine_exact(planes: np.ndarray, m: int, o: int, correction=None) -> np.ndarray:
    """An exact program's ``out`` (accumulators x 4 byte planes) -> the int64 product [m, o]:
    ``sum_i acc_i * 256**(n-1-i)`` plus ``correction`` (``exact_correction``, int16
    activations)."""
    n = planes.shape[0] // 4
    _, mb, ob, b, k = planes.shape
    if b == 1:  # one gather of every accumulator's bytes, then the int64 sum in one product
        words = _gather_bytes(planes.reshape(4 * n, mb * ob * k)).view("<i4")  # [M * O, n]
        total = (words.astype(np.int64) @ (256 ** np.arange(n - 1, -1, -1, dtype=np.int64)))
        total = total.reshape(mb, ob * k)[:m, :o]
    else:
        total = np.zeros((m, o), np.int64)
        for i in range(n):
            total = total * 256 + unpack_acc32(planes[4 * i:4 * i + 4], m, o)
    return total if correction is None else total + correction[:o]


def exact_correction(w: np.ndarray) -> np.ndarray:
    """``128 * sum_k w[o, k]`` in int64: the int16 activation digits' constant."""
    return 128 * np.asarray(w).astype(np.int64).sum(axis=1)


def _gather_bytes(rows: np.ndarray) -> np.ndarray:
    """[R, N] byte planes -> [N, R] (each element's bytes side by side): one transposing
    copy for a few thousand elements, a strided copy per plane for more (3x faster on a
    100-step input projection's result, slower on one step's)."""
    if rows.shape[1] <= 2048:
        return rows.T.copy()
    out = np.empty(rows.shape[::-1], rows.dtype)
    for r in range(rows.shape[0]):
        out[:, r] = rows[r]
    return out


def unpack_acc32(planes: np.ndarray, m: int, o: int) -> np.ndarray:
    """The ``out`` layout -> int32 [m, o]: the four byte planes put together."""
    _, mb, ob, b, k = planes.shape
    if b == 1:  # (4, M, O) byte planes: each int32's four bytes gathered, read as one
        p = _gather_bytes(planes.reshape(4, mb * ob * k))
        return p.view("<i4").reshape(mb, ob * k)[:m, :o].astype(np.int32, copy=False)
    p = planes.transpose(0, 1, 3, 2, 4).reshape(4, mb * b, ob * k)[:, :m, :o]
    u = p.view(np.uint8).astype(np.uint32)
    return (u[0] | (u[1] << 8) | (u[2] << 16) | (u[3] << 24)).view(np.int32)
