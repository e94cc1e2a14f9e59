"""The im2col windows of a few-channel convolution (compiler/accel/im2col.py) packed by a
compiled kernel (LLVM IR written directly, like packed_layout.py), for BATCH 1.

The staged operand is [n, cb, oh, ow, k] (``Windows.packed_shape`` with BATCH 1): lane
``l = j * k + kk`` of output pixel (y, x) of image i holds, for ``l < kh * kw * C``, the
padded input at channel ``l % C``, row ``y * sh + dy``, column ``x * sw + dx`` (tap
``l // C = dy * kw + dx``), and past them the bias lanes' values or 0. The kernel reads a
padded copy of the input (NCHW, the padding ``z``: ``pack_windows`` keeps one per geometry
and output buffer, and writes only its interior), so each lane is one load at a constant offset from the
pixel's base: per pixel the lanes are unrolled loads and stores, the offsets and the
constant lanes compiled in. numpy does the same as one gather with a precomputed index
(im2col.pack's fallback): 47 us for the digits CNN's 64 images (65,536 bytes) on an idle
core, and 75-230 us inside a run, where the 512 KiB index is out of the cache; the kernel
has no index to read.
"""

from __future__ import annotations

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
    """fn(buffers, begin, end) over rows t = image * oh + y: buffers (the padded input
    [n, c, hp, wp], the windows [n, cb, oh, ow, k])."""
    module = ir.Module(name="im2col_windows")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer().as_pointer(),
                                                            _I64, _I64]), symbol)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    src, dst = (b.load(b.gep(fn.args[0], [ir.Constant(_I64, i)])) for i in range(2))
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

    def row(t):
        image = b.sdiv(t, const(oh))
        y = b.srem(t, const(oh))
        src_row = b.add(b.mul(image, const(c * hp * wp)), b.mul(y, const(sh * wp)))
        dst_row = b.add(b.mul(b.mul(image, const(cb)), const(oh * ow * k)),
                        b.mul(y, const(ow * k)))

        def pixel(x):
            # per block, the k lanes as one vector: the constant lanes compiled into it,
            # each loaded lane inserted, one k-byte store (byte stores took twice as long)
            base = b.add(src_row, b.mul(x, const(sw)))
            out = b.add(dst_row, b.mul(x, const(k)))
            for j in range(cb):
                block = offsets[j * k:(j + 1) * k]
                v = ir.Constant(vec, [o if isinstance(o, ir.Constant) else ir.Constant(_I8, 0)
                                      for o in block])
                for kk, off in enumerate(block):
                    if not isinstance(off, ir.Constant):
                        v = b.insert_element(v, b.load(b.gep(src, [b.add(base, const(off))])),
                                             ir.Constant(ir.IntType(32), kk))
                ptr = b.bitcast(b.gep(dst, [b.add(out, const(j * oh * ow * k))]),
                                vec.as_pointer())
                b.store(v, ptr, align=1)
        counted_loop(b, const(0), const(ow), 1, pixel)

    counted_loop(b, fn.args[1], fn.args[2], 1, row)
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
    params = [Buffer("padded", (win.n, win.c, win.h + pt + pb, win.w + pl + pr), "int8"),
              Buffer("windows", (win.n, win.blocks(k), win.oh, win.ow, k), "int8")]
    kernel = CpuKernel(None, llvm_ir, obj, [], [SavedSegment(symbol, win.n * win.oh)], path,
                       hit, time.perf_counter() - start, name="im2col_windows", params=params,
                       written=[1])
    with _lock:
        _kernels[key] = kernel
    return kernel


def packer(win, k: int, out: np.ndarray):
    """A function of int8 ``x`` [n, c, h, w] writing its windows into ``out`` (the windows
    [n, cb, oh, ow, k], any shape of those bytes, C-contiguous; BATCH 1): the kernel bound
    to ``out`` and the padded input (binding checks every argument, 45-80 us, longer than
    the digits CNN's whole packing). Kept per geometry and buffer, so a runtime packing
    into the same DRAM buffer every run binds once."""
    key = (win, k, out.ctypes.data, out.nbytes)
    with _lock:
        found = _bound.get(key)
    if found is not None:
        return found
    pt, pl, pb, pr = win.pads
    padded = np.full((win.n, win.c, win.h + pt + pb, win.w + pl + pr), win.z, np.int8)
    inside = padded[:, :, pt:pt + win.h, pl:pl + win.w]
    # (the bound function keeps ``out``: no other array takes its address while it is kept)
    run = windows_kernel(win, k).bind(padded, out.reshape(win.n, win.blocks(k), win.oh,
                                                          win.ow, k), serial=True)
    shape, size = inside.shape, inside.size

    def pack(x: np.ndarray) -> None:
        if x.dtype != np.int8 or x.size != size:
            raise ValueError(f"im2col: expected int8 {list(shape)}, got {x.dtype}"
                             f"{list(x.shape)}")
        inside[...] = x.reshape(shape)
        run()

    with _lock:
        if len(_bound) >= 16:
            _bound.pop(next(iter(_bound)))
        _bound[key] = pack
    return pack


def pack_windows(x: np.ndarray, win, out: np.ndarray, k: int) -> None:
    """``out`` (the windows [n, cb, oh, ow, k], C-contiguous) = the windows of int8 ``x``
    [n, c, h, w] (BATCH 1), by ``packer``."""
    packer(win, k, out)(x)
