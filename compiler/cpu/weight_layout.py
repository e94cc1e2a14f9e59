"""A QMatMul's second operand packed into the weight layout by a compiled kernel (LLVM IR
written directly, like packed_layout.py), for the runtime's staged operands (an attention's
keys and values, which the accelerator or the CPU makes every run).

The weight layout (compiler/accel/matmul.py ``pack_weights``) holds, per matrix g of b
[G, K, N], b^T as [N/k, K/k, k, k] (K and N zero-padded to k), then zeros up to the row
stride S of the packed (G, S) bytes:

    out[g, ((j * KB + ko) * k + oo) * k + ki] = b[g, ko * k + ki, j * k + oo]

Per k x k tile that is a transpose: numpy runs it as a strided copy of single bytes (the
staged packing's views, runtime/crossing.py ``weight_plan``: about 1 GB/s, 40-90 us for
MiniLM's [12, 32, 128] keys inside a run); here a tile of whole columns is k vector loads
(rows past K read as zeros, never loaded), log2(k) rounds of shuffles and k vector stores,
and a last partial block of columns is copied a byte at a time. The padding up to S is
zeroed by the kernel too, so one call writes every byte of the buffer. The loop runs over
(matrix, column block) on the calling thread.
"""

from __future__ import annotations

import threading
import time

from llvmlite import ir

from .lut import counted_loop
from .packed_layout import _masked_load, _transpose, kernel_entry

__all__ = ["weights_kernel"]

_I8, _I64 = ir.IntType(8), ir.IntType(64)
_kernels: dict = {}
_lock = threading.Lock()


def _module(g: int, kdim: int, ndim: int, k: int, stride: int, symbol: str) -> str:
    """fn(buffers, begin, end) over t = matrix * NB + column block: buffers (b [G, K, N],
    the packed (G, S))."""
    kb, nb = -(-kdim // k), -(-ndim // k)
    full = ndim // k  # column blocks of k real columns
    raw = nb * kb * k * k
    module, fn, b, src, dst, vec, zero_vec = kernel_entry(f"weights_{k}", symbol, k)
    const = lambda v: ir.Constant(_I64, v)  # noqa: E731

    def body(t):
        m, j = b.udiv(t, const(nb)), b.urem(t, const(nb))
        plain0 = b.add(b.mul(m, const(kdim * ndim)), b.mul(j, const(k)))  # b[m, 0, j*k]
        packed0 = b.add(b.mul(m, const(stride)), b.mul(j, const(kb * k * k)))

        def tile(ko):  # rows [ko*k, ko*k + k) of column block j, all k columns real
            rows = b.sub(const(kdim), b.mul(ko, const(k)))  # real rows of this block
            rows = b.select(b.icmp_signed("<", rows, const(k)), rows, const(k))
            vs = []
            for r in range(k):
                at = b.add(plain0, b.mul(b.add(b.mul(ko, const(k)), const(r)), const(ndim)))
                ptr = b.bitcast(b.gep(src, [at]), vec.as_pointer())
                vs.append(_masked_load(b, ptr, const(r), rows, vec, zero_vec))
            out0 = b.add(packed0, b.mul(ko, const(k * k)))
            for oo, v in enumerate(_transpose(b, vs, k)):
                ptr = b.bitcast(b.gep(dst, [b.add(out0, const(oo * k))]), vec.as_pointer())
                b.store(v, ptr, align=1)

        def partial_tile(ko):  # the last column block, fewer than k real columns
            out0 = b.add(packed0, b.mul(ko, const(k * k)))

            def element(e):  # e = oo * k + ki
                oo, ki = b.udiv(e, const(k)), b.urem(e, const(k))
                row = b.add(b.mul(ko, const(k)), ki)
                real = b.and_(b.icmp_signed("<", row, const(kdim)),
                              b.icmp_signed("<", b.add(b.mul(j, const(k)), oo), const(ndim)))
                at = b.add(plain0, b.add(b.mul(row, const(ndim)), oo))
                v = b.load(b.gep(src, [b.select(real, at, const(0))]))
                b.store(b.select(real, v, ir.Constant(_I8, 0)), b.gep(dst, [b.add(out0, e)]))
            counted_loop(b, const(0), const(k * k), 1, element)

        if full == nb:
            counted_loop(b, const(0), const(kb), 1, tile)
        else:
            is_full = b.icmp_signed("<", j, const(full))
            with b.if_else(is_full) as (then, otherwise):
                with then:
                    counted_loop(b, const(0), const(kb), 1, tile)
                with otherwise:
                    counted_loop(b, const(0), const(kb), 1, partial_tile)
        if stride > raw:  # the matrix's padding up to the stride, once per matrix
            with b.if_then(b.icmp_signed("==", j, const(nb - 1))):
                pad0 = b.add(b.mul(m, const(stride)), const(raw))
                counted_loop(b, const(0), const(stride - raw), 1, lambda e: b.store(
                    ir.Constant(_I8, 0), b.gep(dst, [b.add(pad0, e)])))

    counted_loop(b, fn.args[1], fn.args[2], 1, body)
    b.ret_void()
    return str(module)


def weights_kernel(g: int, kdim: int, ndim: int, k: int, stride: int):
    """The compiled kernel writing b [g, kdim, ndim] int8 into the weight layout (g, stride)
    with blocks of k (a power of two from 2 to 64; cached per shape in the process, its
    object code on disk by codegen.py)."""
    key = (g, kdim, ndim, k, stride)
    with _lock:
        kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    from ..tensor.tir import Buffer
    from .codegen import CpuKernel, SavedSegment, _load_or_compile

    if k < 2 or k > 64 or k & (k - 1):
        raise ValueError(f"no weight-layout kernel for blocks of {k}")
    if stride < -(-kdim // k) * -(-ndim // k) * k * k:
        raise ValueError(f"a stride of {stride} bytes does not hold a [{kdim}, {ndim}] matrix")
    start = time.perf_counter()
    symbol = "weights_layout_seg0"
    llvm_ir = _module(g, kdim, ndim, k, stride, symbol)
    obj, path, hit = _load_or_compile(llvm_ir, True)
    params = [Buffer("b", (g, kdim, ndim), "int8"), Buffer("packed", (g, stride), "int8")]
    kernel = CpuKernel(None, llvm_ir, obj, [], [SavedSegment(symbol, g * -(-ndim // k))], path,
                       hit, time.perf_counter() - start, name="weights_layout", params=params,
                       written=[1])
    with _lock:
        _kernels[key] = kernel
    return kernel
