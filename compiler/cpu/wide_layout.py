"""The two byte shuffles at a wide product's border (runtime/wide_border.py) as compiled
kernels (LLVM IR written directly, like packed_layout.py), for BATCH 1:

    digits:  dst[0, i, j] = a[i, j] >> 8,  dst[1, i, j] = (a[i, j] & 255) ^ 0x80
             (an int16 operand [m, kd] into its digit planes [2, rows, kp]:
             compiler/accel/wide.py split_activation, the high digit first)
    gather:  words[e, r] = planes[r, e]
             (a result's byte planes [P, stride] into each element's P bytes side by side,
             which read as little-endian int32 or int64 are the accumulators)

numpy runs them as a broadcast XOR over a strided view and P strided byte copies, a few
microseconds each for one recurrent step's [1, 256] operand and [1, 1024] result, most of
it the calls themselves; a bound kernel is one C call (loops vectorized at O3). A
recurrent layer crosses the border twice per time step, so this is most of its layout
time. ``digits_kernel`` / ``gather_kernel`` give the kernel of one shape (cached in the
process, its object code on disk by codegen.py).
"""

from __future__ import annotations

import threading
import time

from llvmlite import ir

from .lut import counted_loop

__all__ = ["digits_kernel", "gather_kernel"]

_I8, _I16, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(64)
_kernels: dict = {}
_lock = threading.Lock()


def _function(name: str, symbol: str):
    module = ir.Module(name=name)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer().as_pointer(),
                                                            _I64, _I64]), symbol)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    src, dst = (b.load(b.gep(fn.args[0], [ir.Constant(_I64, i)])) for i in range(2))
    return module, fn, b, src, dst


def _digits_module(kd: int, kp: int, rows: int, symbol: str) -> str:
    """fn(buffers, begin, end) over operand rows: buffers (a int16 [m, kd] as bytes, dst
    [2, rows, kp])."""
    module, fn, b, src, dst = _function("wide_digits", symbol)
    const = lambda v: ir.Constant(_I64, v)  # noqa: E731
    a = b.bitcast(src, _I16.as_pointer())

    def row(i):
        a0, d0 = b.mul(i, const(kd)), b.mul(i, const(kp))

        def col(j):
            v = b.load(b.gep(a, [b.add(a0, j)]), align=1)
            hi = b.trunc(b.ashr(v, ir.Constant(_I16, 8)), _I8)
            lo = b.xor(b.trunc(v, _I8), ir.Constant(_I8, 0x80))
            at = b.add(d0, j)
            b.store(hi, b.gep(dst, [at]))
            b.store(lo, b.gep(dst, [b.add(at, const(rows * kp))]))
        counted_loop(b, const(0), const(kd), 1, col)

    counted_loop(b, fn.args[1], fn.args[2], 1, row)
    b.ret_void()
    return str(module)


def _gather_module(planes: int, stride: int, symbol: str) -> str:
    """fn(buffers, begin, end) over elements: buffers (planes [P, stride], words [n, P])."""
    module, fn, b, src, dst = _function("wide_gather", symbol)
    const = lambda v: ir.Constant(_I64, v)  # noqa: E731

    def element(e):
        base = b.mul(e, const(planes))
        for r in range(planes):
            v = b.load(b.gep(src, [b.add(e, const(r * stride))]))
            b.store(v, b.gep(dst, [b.add(base, const(r))]))

    counted_loop(b, fn.args[1], fn.args[2], 1, element)
    b.ret_void()
    return str(module)


def _kernel(key, make_ir, params, extent: int):
    with _lock:
        kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    from .codegen import CpuKernel, SavedSegment, _load_or_compile

    start = time.perf_counter()
    symbol = f"{key[0]}_seg0"
    llvm_ir = make_ir(symbol)
    obj, path, hit = _load_or_compile(llvm_ir, True)
    kernel = CpuKernel(None, llvm_ir, obj, [], [SavedSegment(symbol, extent)], path, hit,
                       time.perf_counter() - start, name=key[0], params=params, written=[1])
    with _lock:
        _kernels[key] = kernel
    return kernel


def digits_kernel(m: int, kd: int, rows: int, kp: int):
    """The kernel writing an int16 operand [m, kd] (given as int8 [m, 2 * kd], its bytes)
    into digit planes int8 [2, rows, kp] (m <= rows, kd <= kp; the rest left as it is)."""
    from ..tensor.tir import Buffer

    if not (0 < m <= rows and 0 < kd <= kp):
        raise ValueError(f"an operand [{m}, {kd}] does not fit digit planes [{rows}, {kp}]")
    params = [Buffer("a", (m, 2 * kd), "int8"), Buffer("planes", (2, rows, kp), "int8")]
    return _kernel(("wide_digits", m, kd, rows, kp),
                   lambda s: _digits_module(kd, kp, rows, s), params, m)


def gather_kernel(planes: int, stride: int, n: int):
    """The kernel gathering the first ``n`` bytes of each of ``planes`` byte planes int8
    [planes, stride] into int8 [n, planes]."""
    from ..tensor.tir import Buffer

    if not 0 < n <= stride:
        raise ValueError(f"{n} elements of planes of {stride}")
    params = [Buffer("planes", (planes, stride), "int8"), Buffer("words", (n, planes), "int8")]
    return _kernel(("wide_gather", planes, stride, n),
                   lambda s: _gather_module(planes, stride, s), params, n)
