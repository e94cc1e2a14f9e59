"""Packing and unpacking of values at the accelerator's region borders as compiled kernels
(LLVM IR written directly, like lut.py): runtime/accel.py converts images of BATCH 1 of
``COMPILED_LAYOUT_BYTES`` or more with them, and smaller ones or other layouts with numpy
(compiler/accel/partition.py pack_value/unpack_value, the definition they are tested
against).

With BATCH 1 the packed layout of an int8 image [N, C, *spatial] is [N, C/k, P, k] (k =
BLOCK, P pixels, channels zero-padded): per channel block a transpose of a k x P byte
matrix. numpy runs it as a strided copy of single bytes, about 1 GB/s here (U-Net's
[1, 64, 256, 256]: 4 ms, 45 times a plain copy). Here each k x k tile (k channels of k
pixels) is k vector loads, a transpose by shuffles and k vector stores:

    pack:   out[n, cb, p, kk] = x[n, cb*k + kk, p]      (0 where cb*k + kk >= C)
    unpack: y[n, c, p] = packed[n, c // k, p, c % k]

The loop runs over (image, channel block, chunk of ``PIXELS`` pixels); pixels after the last
whole tile of a chunk are copied one at a time. ``pack_fast``/``unpack_fast`` run it on the
calling thread: a memory-bound copy gains little from a second thread, and on a busy machine
waiting for a descheduled worker cost 5-10 ms a call (U-Net, PP-OCR det at full size). ``layout_kernel(op, n, c, p, k)``
gives the kernel (cached per shape in the process, its object code on disk by codegen.py);
``pack_fast``/``unpack_fast`` run it.
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
from llvmlite import ir

from .lut import counted_loop

__all__ = ["layout_kernel", "pack_fast", "unpack_fast", "PIXELS", "COMPILED_LAYOUT_BYTES",
           "compiled_layout"]

PIXELS = 4096  # pixels per parallel iteration (a multiple of every block size)
# Images of at least this many bytes are converted by the kernels (10-40x numpy's strided
# byte copy on large ones; below it the call costs more than numpy's copy).
COMPILED_LAYOUT_BYTES = 16384
_I8, _I64 = ir.IntType(8), ir.IntType(64)
_kernels: dict = {}
_lock = threading.Lock()


def compiled_layout(shape: tuple, packed: tuple, batch: int, k: int) -> bool:
    """Whether an image of ``shape`` ([N, C, H, W]) packed as ``packed`` ([N/BATCH, C/k, H,
    W, BATCH, k]) is converted by a kernel here: BATCH 1, a power-of-two block, large
    enough."""
    return batch == 1 and len(shape) == 4 and len(packed) == 6 and 2 <= k <= 64 and \
        not k & (k - 1) and math.prod(shape) >= COMPILED_LAYOUT_BYTES


def kernel_entry(name: str, symbol: str, k: int):
    """A layout kernel's start: module ``name`` with ``void symbol(i8** buffers, i64 begin,
    i64 end)``, a builder in its entry block, the source and destination pointers (buffers
    0 and 1), the <k x i8> vector type and its zero."""
    vec = ir.VectorType(_I8, k)
    module = ir.Module(name=name)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer().as_pointer(),
                                                            _I64, _I64]), symbol)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    src, dst = (b.load(b.gep(fn.args[0], [ir.Constant(_I64, i)])) for i in range(2))
    return module, fn, b, src, dst, vec, ir.Constant(vec, [ir.Constant(_I8, 0)] * k)


def _module(op: str, n: int, c: int, p: int, k: int, symbol: str) -> str:
    """One function fn(buffers, begin, end) over iterations t = (image * CB + block) *
    chunks + chunk."""
    cb = -(-c // k)
    chunks = -(-p // PIXELS)
    module, fn, b, src, dst, vec, zero_vec = kernel_entry(f"{op}_{k}", symbol, k)
    const = lambda v: ir.Constant(_I64, v)  # noqa: E731

    def body(t):
        chunk = b.urem(t, const(chunks))
        nb = b.udiv(t, const(chunks))  # image * CB + block
        image, block = b.udiv(nb, const(cb)), b.urem(nb, const(cb))
        c0 = b.mul(block, const(k))
        rows = b.sub(const(c), c0)  # real channels of this block
        rows = b.select(b.icmp_signed("<", rows, const(k)), rows, const(k))
        p0 = b.mul(chunk, const(PIXELS))
        p1 = b.add(p0, const(PIXELS))
        p1 = b.select(b.icmp_signed("<", p1, const(p)), p1, const(p))
        tiles_end = b.add(p0, b.mul(b.udiv(b.sub(p1, p0), const(k)), const(k)))
        # plain row r of this block: image * C + c0 + r; its pixel q at (row * P + q)
        plain0 = b.mul(b.add(b.mul(image, const(c)), c0), const(p))
        packed0 = b.mul(nb, const(p * k))  # (image * CB + block) * P * k

        def tile(q):  # pixels [q, q + k)
            if op == "pack":
                vs = []
                for r in range(k):
                    at = b.add(plain0, b.add(b.mul(const(r), const(p)), q))
                    ptr = b.bitcast(b.gep(src, [at]), vec.as_pointer())
                    # rows past the channels read as 0 (the padding), never loaded
                    vs.append(_masked_load(b, ptr, const(r), rows, vec, zero_vec))
                for j, v in enumerate(_transpose(b, vs, k)):
                    at = b.add(packed0, b.mul(b.add(q, const(j)), const(k)))
                    b.store(v, b.bitcast(b.gep(dst, [at]), vec.as_pointer()), align=1)
            else:
                vs = [b.load(b.bitcast(b.gep(src, [b.add(packed0, b.mul(b.add(q, const(j)),
                                                                       const(k)))]),
                                       vec.as_pointer()), align=1) for j in range(k)]
                for r, v in enumerate(_transpose(b, vs, k)):
                    at = b.add(plain0, b.add(b.mul(const(r), const(p)), q))
                    _masked_store(b, v, b.bitcast(b.gep(dst, [at]), vec.as_pointer()),
                                  const(r), rows)

        def single(q):  # one pixel, every row of the block
            def row(r):
                plain = b.add(plain0, b.add(b.mul(r, const(p)), q))
                packed = b.add(packed0, b.add(b.mul(q, const(k)), r))
                real = b.icmp_signed("<", r, rows)
                if op == "pack":
                    v = b.load(b.gep(src, [b.select(real, plain, const(0))]))
                    b.store(b.select(real, v, ir.Constant(_I8, 0)), b.gep(dst, [packed]))
                else:
                    with b.if_then(real):
                        b.store(b.load(b.gep(src, [packed])), b.gep(dst, [plain]))
            counted_loop(b, const(0), const(k), 1, row)

        counted_loop(b, p0, tiles_end, k, tile)
        counted_loop(b, tiles_end, p1, 1, single)

    counted_loop(b, fn.args[1], fn.args[2], 1, body)
    b.ret_void()
    return str(module)


def _masked_load(b, ptr, r, rows, vec, zero):
    """The vector at ``ptr`` if row r < rows, else zeros (without reading the memory)."""
    real = b.icmp_signed("<", r, rows)
    pre = b.block
    with b.if_then(real):
        v = b.load(ptr, align=1)
        then = b.block
    out = b.phi(vec)
    out.add_incoming(v, then)
    out.add_incoming(zero, pre)
    return out


def _masked_store(b, v, ptr, r, rows):
    with b.if_then(b.icmp_signed("<", r, rows)):
        b.store(v, ptr, align=1)


def _transpose(b, vs: list, k: int) -> list:
    """The k x k byte matrix of rows ``vs`` transposed, by log2(k) rounds of interleaving
    row i with row i + k/2 (the perfect shuffle: after log2(k) rounds, element (r, c) is at
    (c, r))."""
    rounds = int(math.log2(k))
    lo = [x for i in range(k // 2) for x in (i, k + i)]
    hi = [x for i in range(k // 2, k) for x in (i, k + i)]
    for _ in range(rounds):
        nxt = []
        for i in range(k // 2):
            a, c = vs[i], vs[i + k // 2]
            nxt.append(b.shuffle_vector(a, c, ir.Constant(ir.VectorType(ir.IntType(32), k), lo)))
            nxt.append(b.shuffle_vector(a, c, ir.Constant(ir.VectorType(ir.IntType(32), k), hi)))
        vs = nxt
    return vs


def layout_kernel(op: str, n: int, c: int, p: int, k: int):
    """The compiled ``pack`` or ``unpack`` kernel of int8 images [n, c, p pixels] and
    their packed [n, ceil(c/k), p, k] (a power-of-two k from 2 to 64)."""
    key = (op, n, c, p, k)
    with _lock:
        kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    from ..tensor.tir import Buffer
    from .codegen import CpuKernel, SavedSegment, _load_or_compile

    if op not in ("pack", "unpack") or k < 2 or k > 64 or k & (k - 1):
        raise ValueError(f"no {op} kernel for blocks of {k}")
    start = time.perf_counter()
    symbol = f"{op}_layout_seg0"
    llvm_ir = _module(op, n, c, p, k, symbol)
    obj, path, hit = _load_or_compile(llvm_ir, True)
    plain, packed = Buffer("plain", (n, c, p), "int8"), Buffer("packed", (n, -(-c // k), p, k),
                                                               "int8")
    params = [plain, packed] if op == "pack" else [packed, plain]
    extent = n * -(-c // k) * -(-p // PIXELS)
    kernel = CpuKernel(None, llvm_ir, obj, [], [SavedSegment(symbol, extent)], path, hit,
                       time.perf_counter() - start, name=f"{op}_layout", params=params,
                       written=[1])
    with _lock:
        _kernels[key] = kernel
    return kernel


def pack_fast(x: np.ndarray, out: np.ndarray, k: int) -> None:
    """``out`` [n, ceil(c/k), p, k] (any shape of those bytes) = the packed x [n, c, ...]."""
    n, c = x.shape[:2]
    p = math.prod(x.shape[2:])
    layout_kernel("pack", n, c, p, k).bind(np.ascontiguousarray(x).reshape(n, c, p),
                                           out.reshape(n, -(-c // k), p, k), serial=True)()


def unpack_fast(packed: np.ndarray, out: np.ndarray, k: int) -> None:
    """``out`` [n, c, ...] = the image packed in ``packed`` [n, ceil(c/k), p, k]."""
    n, c = out.shape[:2]
    p = math.prod(out.shape[2:])
    layout_kernel("unpack", n, c, p, k).bind(np.ascontiguousarray(packed).reshape(
        n, -(-c // k), p, k), out.reshape(n, c, p), serial=True)()
