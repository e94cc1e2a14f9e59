"""Hand-scheduled accelerator workloads written with the driver API, and their numpy references.

These are what the compiler (compiler/) will generate automatically; until then they drive the
demo and the simulator benchmarks. Both are tiled to fit the on-chip buffers of any
configuration and alternate load/compute/store with dependency tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from celosia.errors import CelosiaError
from celosia.isa import AluOp, MemType, Module

__all__ = ["Workload", "gemm_requant", "gemm_requant_reference", "conv2d_requant", "conv2d_requant_reference",
           "pack_conv_data", "pack_conv_kernel"]

L, C, S = Module.LOAD, Module.COMPUTE, Module.STORE


@dataclass
class Workload:
    """A recorded program: run ``dev.synchronize()``, then ``result()`` reads the output back
    and frees the workload's DRAM buffers."""

    dev: object
    macs: int
    read: Callable[[], np.ndarray]
    buffers: list

    def result(self) -> np.ndarray:
        out = self.read()
        for buf in self.buffers:
            self.dev.free(buf)
        return out


def gemm_requant_reference(a: np.ndarray, w: np.ndarray, shift: int) -> np.ndarray:
    """int8 (M, K) x int8 (N, K)^T -> int32, arithmetic shift right, clip to [-128, 127]."""
    acc = (a.astype(np.int64) @ w.astype(np.int64).T).astype(np.int32)
    return np.clip(acc >> shift, -128, 127).astype(np.int8)


def _requant_kernel(dev, key, n_rows: int, shift: int):
    """ALU epilogue over ACC rows [0, n_rows): >> shift, then clip to int8."""
    def rows(k):
        k.loop(n_rows, 1, 1)
        k.push(0, 0)
    dev.alu((key, "shr", n_rows, shift), rows, AluOp.SHR, imm=shift)
    dev.alu((key, "max", n_rows), rows, AluOp.MAX, imm=-128)
    dev.alu((key, "min", n_rows), rows, AluOp.MIN, imm=127)


def gemm_requant(dev, a: np.ndarray, w: np.ndarray, shift: int) -> Workload:
    """Record a tiled GEMM with a requantizing epilogue on ``dev``.

    ``a`` is (M, K) int8 with M a multiple of BATCH, ``w`` is (N, K) int8; K and N multiples of
    BLOCK. The workload's result is the (M, N) int8 output.
    """
    cfg = dev.config
    bt, bk = cfg.batch, cfg.block
    m, k = a.shape
    n = w.shape[0]
    if m % bt or k % bk or n % bk or w.shape[1] != k:
        raise CelosiaError(f"gemm_requant: shapes a{a.shape} w{w.shape} must be multiples of "
                           f"BATCH={bt} (rows) and BLOCK={bk} (K, N)")
    mo, ko, no = m // bt, k // bk, n // bk
    if no * ko > cfg.wgt_depth:
        raise CelosiaError(f"gemm_requant: {no * ko} weight blocks do not fit the WGT buffer "
                           f"({cfg.wgt_depth})")
    # Rows of A per tile: bounded by the INP and ACC buffers.
    tile = max(1, min(mo, cfg.inp_depth // ko, cfg.acc_depth // no))
    a_buf = dev.alloc(a.size)
    a_buf.write(a.reshape(mo, bt, ko, bk).transpose(0, 2, 1, 3).copy())  # (mo, ko, b, c)
    w_buf = dev.alloc(w.size, align=max(64, cfg.wgt_elem_bytes))  # WGT elements are large
    w_buf.write(w.reshape(no, bk, ko, bk).transpose(0, 2, 1, 3).copy())  # (no, ko, o, c)
    out_buf = dev.alloc(m * n)

    def reset(rows):
        def record(kb):
            kb.loop(rows * no, 1, 0, 0)
            kb.push(0, 0, 0)
        return record

    def body(rows):
        def record(kb):
            kb.loop(rows, no, ko, 0)
            for j in range(no):
                for i in range(ko):
                    kb.push(j, i, j * ko + i)
        return record

    dev.load_2d(w_buf, 0, no * ko, 1, no * ko, sram_index=0, mem_type=MemType.WGT)
    for t, row0 in enumerate(range(0, mo, tile)):
        rows = min(tile, mo - row0)  # the last tile may be shorter
        if t > 0:
            dev.dep_pop(C, L)
        dev.load_2d(a_buf, row0 * ko, rows * ko, 1, rows * ko, sram_index=0, mem_type=MemType.INP)
        dev.dep_push(L, C)
        dev.dep_pop(L, C)
        if t > 0:
            dev.dep_pop(S, C)
        dev.gemm(("gemm-reset", rows, no), reset(rows), reset=True)
        dev.gemm(("gemm", rows, no, ko), body(rows))
        _requant_kernel(dev, "gemm", rows * no, shift)
        dev.dep_push(C, L)
        dev.dep_push(C, S)
        dev.dep_pop(C, S)
        dev.store_2d(0, out_buf, row0 * no, rows * no, 1, rows * no)
        dev.dep_push(S, C)
    def read():
        return out_buf.read(np.int8, (mo, no, bt, bk)).transpose(0, 2, 1, 3).reshape(m, n)
    return Workload(dev, m * n * k, read, [a_buf, w_buf, out_buf])


# ---- conv2d on packed layouts ------------------------------------------------------------


def pack_conv_data(x: np.ndarray, batch: int, block: int) -> np.ndarray:
    """NCHW int8 -> (N/b, C/blk, H, W, b, blk)."""
    n, c, h, w = x.shape
    return x.reshape(n // batch, batch, c // block, block, h, w).transpose(0, 2, 4, 5, 1, 3).copy()


def pack_conv_kernel(k: np.ndarray, block: int) -> np.ndarray:
    """OIHW int8 -> (O/blk, I/blk, KH, KW, blk_o, blk_i)."""
    o, i, kh, kw = k.shape
    return k.reshape(o // block, block, i // block, block, kh, kw).transpose(0, 2, 4, 5, 1, 3).copy()


def conv2d_requant_reference(x: np.ndarray, k: np.ndarray, pad: int, shift: int) -> np.ndarray:
    """NCHW int8 conv2d (stride 1) -> int32 -> >> shift -> clip to int8 (NCHW)."""
    n, c, h, w = x.shape
    o, _, kh, kw = k.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    acc = np.zeros((n, o, oh, ow), np.int64)
    for dy in range(kh):
        for dx in range(kw):
            patch = xp[:, :, dy:dy + oh, dx:dx + ow]  # (n, c, oh, ow)
            acc += np.einsum("nchw,oc->nohw", patch, k[:, :, dy, dx].astype(np.int64))
    acc = acc.astype(np.int32)
    return np.clip(acc >> shift, -128, 127).astype(np.int8)


def conv2d_requant(dev, x: np.ndarray, k: np.ndarray, pad: int, shift: int) -> Workload:
    """A stride-1 conv2d with a requantizing epilogue, tiled over output rows.

    ``x`` is NCHW int8 with N = BATCH and C a multiple of BLOCK; ``k`` is OIHW int8. Input rows
    are loaded with the hardware's zero padding, so no padded copy exists in DRAM. The
    workload's result is the NCHW int8 output.
    """
    cfg = dev.config
    bt, bk = cfg.batch, cfg.block
    n, c, h, w = x.shape
    o, _, kh, kw = k.shape
    if n != bt or c % bk or o % bk:
        raise CelosiaError(f"conv2d_requant: N must equal BATCH={bt} and C, O be multiples of "
                           f"BLOCK={bk}; got x{x.shape} k{k.shape}")
    ci, co = c // bk, o // bk
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    pw = w + 2 * pad
    if co * ci * kh * kw > cfg.wgt_depth:
        raise CelosiaError(f"conv2d_requant: the kernel's {co * ci * kh * kw} blocks do not fit "
                           f"the WGT buffer ({cfg.wgt_depth})")
    # Output rows per tile: the input rows it needs must fit INP, its outputs ACC.
    th = oh
    while th > 1 and ((th + kh - 1) * pw * ci > cfg.inp_depth or th * ow * co > cfg.acc_depth):
        th -= 1
    if (th + kh - 1) * pw * ci > cfg.inp_depth or th * ow * co > cfg.acc_depth:
        raise CelosiaError("conv2d_requant: one output row does not fit the on-chip buffers")
    x_buf = dev.alloc(x.size)
    x_buf.write(pack_conv_data(x, bt, bk))  # elements (ci, h, w)
    k_buf = dev.alloc(k.size, align=max(64, cfg.wgt_elem_bytes))
    k_buf.write(pack_conv_kernel(k, bk))  # elements (co, ci, kh, kw)
    out_buf = dev.alloc(n * o * oh * ow)  # elements (co, oh, ow)
    in_rows = th + kh - 1
    dev.load_2d(k_buf, 0, co * ci * kh * kw, 1, co * ci * kh * kw, sram_index=0, mem_type=MemType.WGT)

    def conv_kernel(rows):
        def record(kb):
            kb.loop(rows, ow, pw, 0)
            kb.loop(ow, 1, 1, 0)
            for oc in range(co):
                for ic in range(ci):
                    for dy in range(kh):
                        for dx in range(kw):
                            kb.push(oc * th * ow, ic * in_rows * pw + dy * pw + dx,
                                    ((oc * ci + ic) * kh + dy) * kw + dx)
        return record

    def reset(kb):
        kb.loop(co * th * ow, 1, 0, 0)
        kb.push(0, 0, 0)

    for t, y0 in enumerate(range(0, oh, th)):
        rows = min(th, oh - y0)
        if t > 0:
            dev.dep_pop(C, L)
        # Input rows y0 - pad .. y0 + rows + kh - 1 - pad, clipped to the image; the rest is
        # hardware zero padding.
        top = y0 - pad
        need = rows + kh - 1
        first, last = max(top, 0), min(top + need, h)
        y_pad_0, y_pad_1 = first - top, top + need - last
        for ic in range(ci):
            dev.load_2d(x_buf, ic * h * w + first * w, w, last - first, w,
                        x_pad_0=pad, x_pad_1=pad, y_pad_0=y_pad_0, y_pad_1=y_pad_1,
                        sram_index=ic * in_rows * pw, mem_type=MemType.INP)
        dev.dep_push(L, C)
        dev.dep_pop(L, C)
        if t > 0:
            dev.dep_pop(S, C)
        dev.gemm(("conv-reset", co, th, ow), reset, reset=True)
        dev.gemm(("conv", co, ci, kh, kw, rows, th, ow, pw, in_rows), conv_kernel(rows))
        _requant_kernel(dev, "conv", co * th * ow, shift)
        dev.dep_push(C, L)
        dev.dep_push(C, S)
        dev.dep_pop(C, S)
        if rows == th:
            dev.store_2d(0, out_buf, y0 * ow, rows * ow, co, oh * ow)
        else:  # a shorter last tile: its rows of each channel block are not contiguous in OUT
            for oc in range(co):
                dev.store_2d(oc * th * ow, out_buf, oc * oh * ow + y0 * ow, rows * ow, 1, rows * ow)
        dev.dep_push(S, C)
    def read():
        out = out_buf.read(np.int8, (co, oh, ow, bt, bk))
        return out.transpose(3, 0, 4, 1, 2).reshape(n, o, oh, ow)
    return Workload(dev, n * o * oh * ow * c * kh * kw, read, [x_buf, k_buf, out_buf])
