"""int8 max pooling of a channel-blocked ``[N, Cb, H, W, cb]`` tensor, written directly in
LLVM IR (the ``maxpool`` spec of kernels.py with ``"dtype": "int8"``). Bit-exact with
graph_numpy's MaxPool: the padding is -128, which never wins, so a window's maximum is
that of its in-bounds taps (-128 for a window all padding).

One parallel loop over (image, channel block, output row); a row reads only the kernel
rows inside the image (bounds computed per row), its interior columns (every kernel
column inside) take the kernel columns unrolled with no test, the border columns their
in-bounds ones. Each tap is one vector of the block's ``cb`` channels (a pixel's channels
are contiguous) and one signed byte maximum. The tensor-language kernel it replaces
tested every tap's bounds with a select: ResNet-18's 3x3 stride-2 pooling of 112x112x64
in blocks of 16 took 54 us on one thread of a Zen 5, this one 18 (docs/runtime.md).
"""

from __future__ import annotations

import time

from llvmlite import ir

from celosia.errors import CompilerError

from ..tensor.tir import Buffer
from .codegen import CpuKernel, SavedSegment, _load_or_compile
from .int8_emit import _I8, _Builder, _c, _segment, _splat_const

__all__ = ["compile_maxpool"]


def compile_maxpool(spec: dict, *, use_cache: bool = True) -> CpuKernel:
    """The compiled int8 ``maxpool`` kernel of a spec (data, out, kernel, strides, pads,
    dilations)."""
    start = time.perf_counter()
    n, cb_count, h, w, cb = spec["data"]
    on, ob_count, oh, ow, ob = spec["out"]
    kh, kw = spec["kernel"]
    sh, sw = spec["strides"]
    pt, pl = spec["pads"][:2]
    dh, dw = spec["dilations"]
    if (on, ob_count, ob) != (n, cb_count, cb) or min(kh, kw, sh, sw, dh, dw) < 1:
        raise CompilerError(f"maxpool: data {spec['data']} and out {spec['out']} do not match")
    module = ir.Module(name="qmaxpool")
    name = "qmaxpool_seg0"
    fn, b = _segment(module, name)
    hb = _Builder(b)
    data = b.load(b.gep(fn.args[0], [_c(0)]))
    out = b.load(b.gep(fn.args[0], [_c(1)]))
    vty = ir.VectorType(_I8, cb)
    lowest = _splat_const(vty, -128)
    # columns whose every kernel column is inside the image: x_left <= ox < x_right
    x_left = min(ow, -(-pl // sw))
    x_right = max(x_left, min(ow, -(-(w + pl - (kw - 1) * dw) // sw)))
    y_top = min(oh, -(-pt // sh))
    y_bottom = max(y_top, min(oh, -(-(h + pt - (kh - 1) * dh) // sh)))
    acc = b.alloca(vty)

    def bounds(o, pad, stride, dil, size, k):
        """(first, end) kernel positions inside the image for output position ``o``."""
        low = b.sub(_c(pad), b.mul(o, _c(stride)))            # k * dil >= low
        first = b.sdiv(b.add(low, _c(dil - 1)), _c(dil))
        first = b.select(b.icmp_signed("<", low, _c(0)), _c(0), first)
        first = b.select(b.icmp_signed(">", first, _c(k)), _c(k), first)
        room = b.sub(_c(size - 1 + pad), b.mul(o, _c(stride)))  # k * dil <= room
        end = b.add(b.sdiv(room, _c(dil)), _c(1))
        end = b.select(b.icmp_signed("<", room, _c(0)), _c(0), end)
        end = b.select(b.icmp_signed(">", end, _c(k)), _c(k), end)
        return first, b.select(b.icmp_signed("<", end, first), first, end)

    def item(it):
        oy = b.srem(it, _c(oh))
        plane = b.sdiv(it, _c(oh))                              # n * Cb + channel block
        src_plane = b.mul(plane, _c(h * w * cb))
        dst_row = b.mul(b.add(b.mul(plane, _c(oh)), oy), _c(ow * cb))
        iy0 = b.sub(b.mul(oy, _c(sh)), _c(pt))

        def row(ky_range):
            def pixel(ox, kx_range):
                b.store(lowest, acc)
                ix0 = b.sub(b.mul(ox, _c(sw)), _c(pl))

                def tap(ky, kx):
                    iy = b.add(iy0, b.mul(ky, _c(dh)))
                    ix = b.add(ix0, b.mul(kx, _c(dw)))
                    v = hb.load(data, b.add(src_plane, b.mul(b.add(b.mul(iy, _c(w)), ix),
                                                             _c(cb))), vty)
                    m = b.load(acc)
                    b.store(b.select(b.icmp_signed(">", v, m), v, m), acc)
                hb.loop(ky_range[0], ky_range[1],
                        lambda ky: hb.loop(kx_range[0], kx_range[1], lambda kx: tap(ky, kx)))
                hb.store(b.load(acc), out, b.add(dst_row, b.mul(ox, _c(cb))))

            def border(ox):
                pixel(ox, bounds(ox, pl, sw, dw, w, kw))
            hb.loop(0, x_left, border)
            hb.loop(x_left, x_right, lambda ox: pixel(ox, (0, kw)))
            hb.loop(x_right, ow, border)
        inside = b.and_(b.icmp_signed(">=", oy, _c(y_top)), b.icmp_signed("<", oy, _c(y_bottom)))
        hb.when(inside, lambda: row((0, kh)), lambda: row(bounds(oy, pt, sh, dh, h, kh)))
    hb.loop(fn.args[1], fn.args[2], item)
    b.ret_void()
    llvm_ir = str(module)
    obj, path, hit = _load_or_compile(llvm_ir, use_cache)
    params = [Buffer("data", tuple(spec["data"]), "int8"),
              Buffer("out", tuple(spec["out"]), "int8")]
    return CpuKernel(None, llvm_ir, obj, [], [SavedSegment(name, n * cb_count * oh)], path,
                     hit, time.perf_counter() - start, name="maxpool", params=params,
                     written=[1])
