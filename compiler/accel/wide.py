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
           "exact_correction", "sum_accumulators", "carry_correction", "carry_plan", "exact_in_int32", "unpack_int64",
           "out_planes"]

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
    # carry (exact products only): the ALU puts the accumulators together instead of the
    # host: each one's low byte stored, then its arithmetic shift by 8 added to the next
    # (the carry), the most significant one stored as four bytes and its sign twice more:
    # the int64 product's eight little-endian byte planes, which the host reads as they are
    # (``unpack_int64``). The activation correction is the accumulators' starting value
    # (``carry_correction``). Exact when no accumulator can pass int32: ``carry_plan``.
    carry: bool = False
    # carry programs: how many of the last accumulators start at a correction (the others
    # are zeroed): 1 (all of it in the least significant one), or one per weight digit
    carry_init: int = 1

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
    if spec.carry and not spec.exact:
        raise CompilerError(f"{name}: carry is a way of storing an exact product: exact=True")
    if spec.carry and not 0 <= spec.carry_init < spec.accumulators + (spec.a_digits == 1):
        raise CompilerError(f"{name}: carry_init={spec.carry_init} must be in [0, "
                            f"{spec.accumulators - 1}]")
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
    carry = spec.carry
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
        corr = bufs[2] if corrected or (carry and spec.carry_init) else None
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
                    if carry and acc >= nacc - spec.carry_init:  # starts at its correction
                        dev.load_2d(corr, (acc - nacc + spec.carry_init) * ob + o0, to, tm, 0,
                                    sram_index=acc * rows, mem_type=MemType.ACC)
                    elif corrected and acc == nacc - 1:
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
                # The stores, each after its ALU steps: (steps, accumulator, byte plane).
                for i, (steps, acc, plane) in enumerate(_store_plan(spec)):
                    if i:
                        dev.dep_pop(S, C)  # the store before has read OUT
                    for key, op, imm, dst, src in steps:
                        rows_op(dev, key, op, imm=imm, dst=dst * rows, src=src * rows)
                    dev.dep_push(C, S)
                    dev.dep_pop(C, S)
                    dev.store_2d(acc * rows, out, (plane * mb + m0) * ob + o0, to, tm, ob)
                    dev.dep_push(S, C)
        dev.dep_pop(S, C)  # the last store's token: none left for later programs
        for _ in range(min(chunk, 2)):
            dev.dep_pop(C, L)

    args = [("a", "int8", (na, mb, kb, b, k)), ("w", "int8", (nw, ob, kb, k, k))]
    if carry and spec.carry_init:
        args.append(("corr", "int32", (spec.carry_init, ob, b, k)))
    elif corrected:
        args.append(("corr", "int32", (ob, b, k)))
    args.append(("out", "int8", (out_planes(spec), mb, ob, b, k)))
    return AluProgram(name, cfg, args, emit)


def out_planes(spec: WideSpec) -> int:
    """Byte planes of the program's result: 4 (int32), 4 per accumulator (exact), or 8
    (carry: the int64)."""
    return 8 if spec.carry else 4 * spec.accumulators if spec.exact else 4


def _store_plan(spec: WideSpec) -> list:
    """Per store, in order: (ALU steps before it as (key, op, imm, dst, src) with
    accumulator indices, the accumulator stored, the byte plane it goes to)."""
    nacc = spec.accumulators
    shr8 = [("shr", AluOp.SHR, 8, 0, 0)]
    if not spec.exact:  # Horner: acc0 = (acc0 << 8) + acc, then acc0's four bytes
        horner = [step for acc in range(1, nacc) for step in
                  (("shl", AluOp.SHR, -8, 0, 0), ("add", AluOp.ADD, None, 0, acc))]
        return [(horner, 0, 0)] + [(shr8, 0, byte) for byte in range(1, 4)]
    if not spec.carry:  # every accumulator's four bytes
        return [([("shr", AluOp.SHR, 8, acc, 0)] if byte else [], acc, 4 * acc + byte)
                for acc in range(nacc) for byte in range(4)]
    plan, pending = [], []
    for plane, acc in enumerate(range(nacc - 1, 0, -1)):
        # acc's low byte is the product's byte ``plane``; the rest, acc >> 8, carries
        plan.append((pending, acc, plane))
        pending = [("shr", AluOp.SHR, 8, acc, 0), ("add", AluOp.ADD, None, acc - 1, acc)]
    low = nacc - 1
    plan.append((pending, 0, low))
    plan += [(shr8, 0, low + byte) for byte in range(1, 4)]
    plan.append(([("shr", AluOp.SHR, 7, 0, 0)], 0, low + 4))  # acc0 >> 31: the sign
    plan += [([], 0, plane) for plane in range(low + 5, 8)]
    return plan


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


def exact_in_int32(w: np.ndarray) -> bool:
    """Whether every product of int16 activations (|a| <= 32768) and weight ``w`` [O, K]
    fits int32, so that the 32-bit program (Horner's rule, wrapping) gives it exactly."""
    w = np.asarray(w)
    if not w.size:
        return True
    return 32768 * int(np.abs(w.astype(np.int64)).sum(axis=1).max()) <= 2**31 - 1


def _digit_sums(w: np.ndarray) -> np.ndarray:
    """[W, O, K] int64 digits of a weight (split_weight)."""
    return split_weight(np.asarray(w)).astype(np.int64)


def _carry_init(digits: np.ndarray, a_digits: int, count: int) -> np.ndarray:
    """[count, O] int64: the starting values of the last ``count`` accumulators."""
    nacc = a_digits + digits.shape[0] - 1
    init = np.zeros((nacc, digits.shape[1]), np.int64)
    if a_digits == 2:
        # An int16 activation's low digit is ``(a & 255) - 128``: weight digit j adds
        # 128 * sum_k w_j[o, k] at the low activation digit's place, accumulator 1 + j;
        # moved down to the last accumulator it is worth 256 times as much per place.
        per_digit = 128 * digits.sum(axis=2)
        if count == 1:
            init[-1] = sum(v * 256 ** (nacc - 2 - j) for j, v in enumerate(per_digit))
        else:
            init[1:] = per_digit
    return init[nacc - count:]


def carry_correction(w: np.ndarray, cfg: HwConfig, count: int, a_digits: int = 2) -> np.ndarray:
    """The ``corr`` of a carry program (``carry_plan``'s ``count``): the starting values of
    the last ``count`` accumulators, O padded to BLOCK, the same for every batch lane."""
    b, k = cfg.batch, cfg.block
    init = _carry_init(_digit_sums(w), a_digits, count)
    init = pad_channels(init.astype(np.int32), 1, k)
    return np.broadcast_to(init.reshape(count, -1, 1, k), (count, init.shape[1] // k, b, k)).copy()


def _carry_bound(digits: np.ndarray, a_digits: int, count: int) -> float:
    """The largest magnitude any accumulator of a carry program can reach: per output
    channel, its starting value plus 128 times the sum of |digit| of the weight digits
    that meet an activation digit there (activation digits lie in [-128, 127]), plus the
    carry from below (that one's bound / 256 + 1)."""
    sums = np.abs(digits).sum(axis=2)                     # [W, O]
    nw = digits.shape[0]
    nacc = a_digits + nw - 1
    bound = np.zeros((nacc, digits.shape[1]), np.float64)
    for da in range(a_digits):
        for dw in range(nw):
            bound[da + dw] += 128.0 * sums[dw]
    if count:
        bound[nacc - count:] += np.abs(_carry_init(digits, a_digits, count)).astype(np.float64)
    for acc in range(nacc - 1, 0, -1):
        bound[acc - 1] += bound[acc] / 256 + 1
    return float(bound.max()) if bound.size else 0.0


def carry_plan(w: np.ndarray, a_digits: int = 2) -> tuple[int, str | None]:
    """(``carry_init``, None) of a carry program for weight ``w`` [O, K]: the correction
    in the last accumulator alone (one ACC load per tile) where that stays inside int32,
    else one accumulator per weight digit; or (0, why) when an accumulator could pass
    int32 either way (tens of thousands of inputs), and the product is stored exactly
    without carries."""
    digits = _digit_sums(w)
    counts = [0] if a_digits == 1 else sorted({1, digits.shape[0]})
    worst = 0.0
    for count in counts:
        worst = _carry_bound(digits, a_digits, count)
        if worst < 2**31 - 1:
            return count, None
    return 0, (f"an accumulator could reach {worst:.0f}, past int32 (K={digits.shape[2]} "
               f"with these weights)")


def unpack_int64(planes: np.ndarray, m: int, o: int) -> np.ndarray:
    """A carry program's ``out`` (eight byte planes) -> the int64 product [m, o]."""
    _, mb, ob, b, k = planes.shape
    p = planes.transpose(0, 1, 3, 2, 4).reshape(8, mb * b * ob * k)
    return _gather_bytes(p).view("<i8").reshape(mb * b, ob * k)[:m, :o].copy()


def combine_exact(planes: np.ndarray, m: int, o: int, correction=None) -> np.ndarray:
    """An exact program's ``out`` (accumulators x 4 byte planes) -> the int64 product [m, o]:
    ``sum_i acc_i * 256**(n-1-i)`` plus ``correction`` (``exact_correction``, int16
    activations)."""
    n = planes.shape[0] // 4
    _, mb, ob, b, k = planes.shape
    if b == 1:  # one gather of every accumulator's bytes
        words = _gather_bytes(planes.reshape(4 * n, mb * ob * k)).view("<i4")  # [M * O, n]
        acc = words.reshape(mb, ob * k, n)[:m, :o]
    else:
        acc = np.stack([unpack_acc32(planes[4 * i:4 * i + 4], m, o) for i in range(n)], -1)
    return sum_accumulators(acc, correction)


def sum_accumulators(acc: np.ndarray, correction=None) -> np.ndarray:
    """An exact program's int32 accumulators ``acc`` [..., O, n] (the most significant
    first) as the int64 product [..., O]: ``sum_i acc_i * 256**(n-1-i)``, plus
    ``correction`` per output channel (``exact_correction``, int16 activations)."""
    n = acc.shape[-1]
    total = acc.astype(np.int64) @ (256 ** np.arange(n - 1, -1, -1, dtype=np.int64))
    return total if correction is None else total + correction[:total.shape[-1]]


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
    return join_bytes(planes.transpose(0, 1, 3, 2, 4).reshape(4, mb * b, ob * k)[:, :m, :o])


def join_bytes(planes) -> np.ndarray:
    """Four int8 byte planes of one shape (an array [4, ...] or a sequence of four),
    the least significant first -> the int32 values they hold."""
    u = [np.asarray(p).view(np.uint8).astype(np.uint32) for p in planes]
    return (u[0] | (u[1] << 8) | (u[2] << 16) | (u[3] << 24)).view(np.int32)
