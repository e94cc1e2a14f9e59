"""The im2col windows of a few-channel convolution (compiler/accel/im2col.py) packed by a
compiled kernel (LLVM IR written directly, like packed_layout.py), for BATCH 1.

The staged operand is [n, cb, oh, ow, k] (``Windows.packed_shape`` with BATCH 1): lane
``l = j * k + kk`` of output pixel (y, x) of image i holds, for ``l < kh * kw * C``, the
padded input at channel ``l % C``, row ``y * sh + dy``, column ``x * sw + dx`` (tap
``l // C = dy * kw + dx``), and past them the bias lanes' values or 0. The kernel reads a
padded copy of the input (NCHW, the padding ``z``: ``packer`` keeps one per geometry and
output buffer, and the kernel copies each image into its interior first), so each lane is
one load at a constant offset from the pixel's base: per pixel and block of k lanes, the
loads inserted into a vector of the constant lanes and one k-byte store, the offsets and
the constant lanes compiled in (7 us for the digits CNN's 64 images on an idle core: 13 us
with a store per byte and numpy's copy into the interior). numpy does the same as one gather with a precomputed index
(im2col.pack's fallback): 47 us for the digits CNN's 64 images (65,536 bytes) on an idle
core, and 75-230 us inside a run, where the 512 KiB index is out of the cache; the kernel
has no index to read.
"""

from __future__ import annotations

import functools
import math
import threading
import time

import numpy as np
from llvmlite import ir

from .lut import counted_loop

__all__ = ["windows_kernel", "packer", "pack_windows"]

_I8, _I64 = ir.IntType(8), ir.IntType(64)
_kernels: dict = {}
_bound: dict = {}  # (Windows, k, address, bytes) -> packer
_lock = threading.Lock()


def _module(win, k: int, symbol: str) -> str:
    """fn(buffers, begin, end) over images: buffers (the input [n, c, h, w], the padded
    input [n, c, hp, wp], the windows [n, cb, oh, ow, k]); per image its input copied into
    the padded one's interior, then its rows of windows."""
    module = ir.Module(name="im2col_windows")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer().as_pointer(),
                                                            _I64, _I64]), symbol)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x, src, dst = (b.load(b.gep(fn.args[0], [ir.Constant(_I64, i)])) for i in range(3))
    const = lambda v: ir.Constant(_I64, v)  # noqa: E731
    pt, pl, pb, pr = win.pads
    hp, wp = win.h + pt + pb, win.w + pl + pr
    sh, sw = win.strides
    c, oh, ow = win.c, win.oh, win.ow
    cb = win.blocks(k)
    lanes = cb * k
    vec = ir.VectorType(_I8, k)
    offsets = []
    for lane in range(lanes):
        if lane < win.channels:
            tap, ci = divmod(lane, c)
            dy, dx = divmod(tap, win.kw)
            offsets.append(ci * hp * wp + dy * wp + dx)
        else:
            extra = lane - win.channels
            offsets.append(ir.Constant(_I8, win.lanes[extra] if extra < len(win.lanes) else 0))

    def image(i):
        # the input's rows (c x h of w bytes) into the padded interior
        def copy_row(r):
            ci, y = b.sdiv(r, const(win.h)), b.srem(r, const(win.h))
            into = b.add(b.mul(i, const(c * hp * wp)),
                         b.add(b.mul(ci, const(hp * wp)), b.add(b.mul(y, const(wp)),
                                                                const(pt * wp + pl))))
            start = b.add(b.mul(i, const(c * win.h * win.w)), b.mul(r, const(win.w)))
            counted_loop(b, const(0), const(win.w), 1, lambda j: b.store(
                b.load(b.gep(x, [b.add(start, j)])), b.gep(src, [b.add(into, j)])))
        counted_loop(b, const(0), const(c * win.h), 1, copy_row)

        def row(y):
            src_row = b.add(b.mul(i, const(c * hp * wp)), b.mul(y, const(sh * wp)))
            dst_row = b.add(b.mul(b.mul(i, const(cb)), const(oh * ow * k)),
                            b.mul(y, const(ow * k)))

            def pixel(xx):
                # per block, the k lanes as one vector: the constant lanes compiled into
                # it, each loaded lane inserted, one k-byte store (byte stores took twice
                # as long)
                base = b.add(src_row, b.mul(xx, const(sw)))
                out = b.add(dst_row, b.mul(xx, const(k)))
                for j in range(cb):
                    block = offsets[j * k:(j + 1) * k]
                    v = ir.Constant(vec, [o if isinstance(o, ir.Constant) else
                                          ir.Constant(_I8, 0) for o in block])
                    for kk, off in enumerate(block):
                        if not isinstance(off, ir.Constant):
                            v = b.insert_element(
                                v, b.load(b.gep(src, [b.add(base, const(off))])),
                                ir.Constant(ir.IntType(32), kk))
                    ptr = b.bitcast(b.gep(dst, [b.add(out, const(j * oh * ow * k))]),
                                    vec.as_pointer())
                    b.store(v, ptr, align=1)
            counted_loop(b, const(0), const(ow), 1, pixel)
        counted_loop(b, const(0), const(oh), 1, row)

    counted_loop(b, fn.args[1], fn.args[2], 1, image)
    b.ret_void()
    return str(module)


def windows_kernel(win, k: int):
    """The compiled kernel of one window geometry (``im2col.Windows``) and block ``k``
    (cached in the process, its object code on disk by codegen.py)."""
    key = (win, k)
    with _lock:
        kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    from ..tensor.tir import Buffer
    from .codegen import CpuKernel, SavedSegment, _load_or_compile

    start = time.perf_counter()
    symbol = "im2col_windows_seg0"
    llvm_ir = _module(win, k, symbol)
    obj, path, hit = _load_or_compile(llvm_ir, True)
    pt, pl, pb, pr = win.pads
    params = [Buffer("x", (win.n, win.c, win.h, win.w), "int8"),
              Buffer("padded", (win.n, win.c, win.h + pt + pb, win.w + pl + pr), "int8"),
              Buffer("windows", (win.n, win.blocks(k), win.oh, win.ow, k), "int8")]
    kernel = CpuKernel(None, llvm_ir, obj, [], [SavedSegment(symbol, win.n)], path,
                       hit, time.perf_counter() - start, name="im2col_windows", params=params,
                       written=[1, 2])
    with _lock:
        _kernels[key] = kernel
    return kernel


def packer(win, k: int, out: np.ndarray):
    """A function of int8 ``x`` [n, c, h, w] writing its windows into ``out`` (the windows
    [n, cb, oh, ow, k], any shape of those bytes, C-contiguous; BATCH 1): the kernel bound
    once to ``out`` and the padded input (binding checks every argument, 45-80 us, longer
    than the digits CNN's whole packing), per call only the input's pointer set. Kept per
    geometry and buffer, so a runtime packing into the same DRAM buffer every run binds
    once."""
    key = (win, k, out.ctypes.data, out.nbytes)
    with _lock:
        found = _bound.get(key)
    if found is not None:
        return found
    pt, pl, pb, pr = win.pads
    padded = np.full((win.n, win.c, win.h + pt + pb, win.w + pl + pr), win.z, np.int8)
    shape = (win.n, win.c, win.h, win.w)
    size = math.prod(shape)
    kernel = windows_kernel(win, k)
    windows = out.reshape(win.n, win.blocks(k), win.oh, win.ow, k)
    # (the bound function keeps ``out``: no other array takes its address while it is kept)
    run = kernel.bind(np.zeros(shape, np.int8), padded, windows, serial=True)
    # one segment: partial(fn, pointers, 0, n), whose first pointer is the input's
    pointers = run.args[0] if isinstance(run, functools.partial) else None

    def pack(x: np.ndarray) -> None:
        if x.dtype != np.int8 or x.size != size:
            raise ValueError(f"im2col: expected int8 {list(shape)}, got {x.dtype}"
                             f"{list(x.shape)}")
        if pointers is None or not x.flags.c_contiguous:
            kernel.bind(np.ascontiguousarray(x).reshape(shape), padded, windows,
                        serial=True)()
            return
        pointers[0] = x.ctypes.data
        run()

    def fixed(src: np.ndarray):
        """The packing of ``src`` (an int8 array of the input's size kept from run to run,
        C-contiguous: the runtime's host buffer of the value) as one C call with every
        pointer bound now: no per-call check, no pointer to look up (``x.ctypes.data``
        took 2 us warm, 20-100 us on cold caches)."""
        if src.dtype != np.int8 or src.size != size or not src.flags.c_contiguous:
            return functools.partial(pack, src)
        return kernel.bind(src.reshape(shape), padded, windows, serial=True)
    pack.fixed = fixed

    with _lock:
        if len(_bound) >= 16:
            _bound.pop(next(iter(_bound)))
        _bound[key] = pack
    return pack


def pack_windows(x: np.ndarray, win, out: np.ndarray, k: int) -> None:
    """``out`` (the windows [n, cb, oh, ow, k], C-contiguous) = the windows of int8 ``x``
    [n, c, h, w] (BATCH 1), by ``packer``."""
    packer(win, k, out)(x)
