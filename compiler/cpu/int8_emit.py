"""The LLVM IR of int8_dot.py's kernels: one function per segment (``fn(buffers, begin,
end)``), written with llvmlite's builder. ``_Emitter(geometry, symbol)`` emits them:
``stage`` (the input staged as the windows read it), ``pack`` (a matmul's right operand as
weights, with its column sums) and ``dot`` (register tiles over the reduction, then the
epilogue); each returns its function's name. int8_dot.py documents the layouts and the
arithmetic; int8_forms.py the instructions.
"""

from __future__ import annotations

from llvmlite import ir

from .host import llvm_binding
from .lut import counted_loop

__all__ = ["Emitter"]

# Pixels a plain image's stage interleaves at a time (one byte vector per channel plane).
_PLANAR_RUN = 64

_I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (8, 16, 32, 64))
_PTR = _I8.as_pointer()


def _c(v: int, ty=_I64):
    return ir.Constant(ty, v)


def _splat_const(ty: ir.VectorType, v: int):
    return ir.Constant(ty, [ir.Constant(ty.element, v)] * ty.count)


class _Builder:
    """llvmlite helpers: byte-addressed loads and stores, counted loops."""

    def __init__(self, b: ir.IRBuilder):
        self.b = b

    def at(self, base, offset):
        """``base`` (i8*) + ``offset`` bytes (i64 value or int)."""
        return self.b.gep(base, [offset if isinstance(offset, ir.Value) else _c(offset)])

    def load(self, base, offset, ty):
        return self.b.load(self.b.bitcast(self.at(base, offset), ty.as_pointer()), align=1)

    def store(self, value, base, offset):
        self.b.store(value, self.b.bitcast(self.at(base, offset), value.type.as_pointer()),
                     align=1)

    def loop(self, lo, hi, body, step=1):
        """``for i in range(lo, hi, step): body(i)`` (i64 values or ints); emitted inline
        when it runs at most once."""
        b = self.b
        if not isinstance(lo, ir.Value) and not isinstance(hi, ir.Value):
            if hi - lo <= 0:
                return
            if hi - lo <= step:
                body(_c(lo))
                return
        lo = lo if isinstance(lo, ir.Value) else _c(lo)
        hi = hi if isinstance(hi, ir.Value) else _c(hi)
        counted_loop(b, lo, hi, step, body)

    def when(self, cond, then, otherwise=None):
        b = self.b
        if otherwise is None:
            with b.if_then(cond):
                then()
        else:
            with b.if_else(cond) as (yes, no):
                with yes:
                    then()
                with no:
                    otherwise()

    def splat(self, v, ty: ir.VectorType):
        undef = ir.Constant(ty, ir.Undefined)
        one = self.b.insert_element(undef, v, _c(0, _I32))
        return self.b.shuffle_vector(one, undef, ir.Constant(ir.VectorType(_I32, ty.count),
                                                             [0] * ty.count))


def _segment(module, name: str):
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR.as_pointer(), _I64, _I64]),
                     name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    return fn, b


class Emitter:
    def __init__(self, geo, symbol: str):
        """``geo``: an int8_dot.Geometry; ``symbol``: the prefix of the functions."""
        self.geo, self.f, self.symbol = geo, geo.form, symbol
        self.module = ir.Module(name="qdot")
        f = self.f
        self.elem = _I8 if f.bytes == 1 else _I16
        self.acc_ty = ir.VectorType(_I32, f.lanes)
        self.operand_ty = ir.VectorType(self.elem, f.lanes * f.group)
        self.names = [buf.name for buf in geo.params() + geo.temps()]

    def _named(self, b: ir.IRBuilder, fn) -> dict:
        """{buffer name: i8*} of a segment's buffers (parameters, then temporaries)."""
        return {name: b.load(b.gep(fn.args[0], [_c(k)])) for k, name in enumerate(self.names)}

    # -- the transform of an input value into the staged operand
    def _stage_value(self, b, v):
        """int8 vector or scalar -> the staged operand."""
        if self.f.unsigned:
            ty = v.type
            flip = _splat_const(ty, -128) if isinstance(ty, ir.VectorType) else _c(-128, _I8)
            return b.xor(v, flip)
        ty = ir.VectorType(_I16, v.type.count) if isinstance(v.type, ir.VectorType) else _I16
        return b.sext(v, ty)

    def _pad_element(self) -> int:
        """The staged value of the padding (as a signed element)."""
        p = self.geo.pad_value
        if not self.f.unsigned:
            return p
        u = p + 128  # x ^ 0x80 as an unsigned byte, stored as the signed byte of its bits
        return u - 256 if u > 127 else u

    def _fill(self, h: _Builder, base, offset, count: int):
        """``count`` staged elements at ``base + offset`` bytes set to the padding."""
        eb, pad = self.f.bytes, self._pad_element()
        chunk = 64 // eb
        whole = count // chunk
        vty = ir.VectorType(self.elem, chunk)
        if whole:
            h.loop(0, whole, lambda i: h.store(_splat_const(vty, pad), base,
                                               h.b.add(offset, h.b.mul(i, _c(64)))))
        rest = count - whole * chunk
        if rest:
            tail = h.b.add(offset, _c(whole * 64))
            h.store(_splat_const(ir.VectorType(self.elem, rest), pad), base, tail)

    # -- segment 0: stage the input
    def stage(self):
        g, f = self.geo, self.f
        eb = f.bytes
        name = f"{self.symbol}_stage"
        fn, b = _segment(self.module, name)
        h = _Builder(b)
        bufs = self._named(b, fn)
        data, staged = bufs["a" if g.matmul else "data"], bufs["staged"]
        row_bytes = g.ws * g.ctot * eb
        x_lo = min(g.ws, -(-g.pl // g.step_w))
        x_hi = max(x_lo, min(g.ws, -(-(g.w + g.pl) // g.step_w)))
        # a plain image of a few channels (blocks of 1) staged densely: its planes are
        # interleaved a run of pixels at a time (the stem: 3 bytes a pixel)
        planar = g.cb == 1 and g.g == 1 and g.cs == g.cg and g.step_w == 1 \
            and 2 <= g.c <= 4

        def row(r):
            n = b.sdiv(r, _c(g.hs))
            ys = b.srem(r, _c(g.hs))
            iy = b.sub(b.mul(ys, _c(g.step_h)), _c(g.pt))
            dst = b.mul(r, _c(row_bytes))
            inside = b.and_(b.icmp_signed(">=", iy, _c(0)), b.icmp_signed("<", iy, _c(g.h)))

            def copy_row():
                if x_lo:
                    self._fill(h, staged, dst, x_lo * g.ctot)
                start = x_lo
                if planar:  # 64 pixels at a time, then one at a time
                    whole = (x_hi - x_lo) // _PLANAR_RUN
                    h.loop(0, whole, lambda j: self._planar_run(
                        h, data, staged, n, iy, b.add(_c(x_lo), b.mul(j, _c(_PLANAR_RUN))),
                        dst))
                    start = x_lo + whole * _PLANAR_RUN
                h.loop(start, x_hi, lambda xs: self._pixel(h, data, staged, n, iy, xs, dst))
                if x_hi < g.ws:
                    self._fill(h, staged, b.add(dst, _c(x_hi * g.ctot * eb)),
                               (g.ws - x_hi) * g.ctot)
            h.when(inside, copy_row, lambda: self._fill(h, staged, dst, g.ws * g.ctot))
        h.loop(fn.args[1], fn.args[2], row)
        b.ret_void()
        return name

    def _planar_run(self, h: _Builder, data, staged, n, iy, xs, dst):
        """Stage _PLANAR_RUN pixels from staged column ``xs`` of a plain image's row: a
        vector of each channel plane, interleaved into pixels by one shuffle."""
        g, b, eb = self.geo, h.b, self.f.bytes
        run = _PLANAR_RUN
        ix = b.sub(xs, _c(g.pl))
        rows = [h.load(data, b.add(b.mul(b.add(b.mul(b.add(b.mul(n, _c(g.c)), _c(k)),
                                                    _c(g.h)), iy), _c(g.w)), ix),
                       ir.VectorType(_I8, run)) for k in range(g.c)]
        rows += rows[-1:] * (4 - g.c)   # four planes: concatenated in pairs
        while len(rows) > 1:
            width = 2 * rows[0].type.count
            rows = [b.shuffle_vector(rows[i], rows[i + 1], ir.Constant(
                ir.VectorType(_I32, width), list(range(width)))) for i in range(0, len(rows), 2)]
        mask = [k * run + p for p in range(run) for k in range(g.c)]
        pixels = b.shuffle_vector(rows[0], rows[0], ir.Constant(ir.VectorType(_I32, len(mask)),
                                                                mask))
        h.store(self._stage_value(b, pixels), staged,
                b.add(dst, b.mul(xs, _c(g.ctot * eb))))

    def _pixel(self, h: _Builder, data, staged, n, iy, xs, dst):
        """Stage the input pixel read by staged column ``xs`` of a row."""
        g, b, eb = self.geo, h.b, self.f.bytes
        ix = b.sub(b.mul(xs, _c(g.step_w)), _c(g.pl))
        out = b.add(dst, b.mul(xs, _c(g.ctot * eb)))
        # source offset of channel block k: (((n*Cb + k)*H + iy)*W + ix)*cb
        plane = g.h * g.w * g.cb

        def block_at(k):
            pix = b.add(b.mul(iy, _c(g.w * g.cb)), b.mul(ix, _c(g.cb)))
            return b.add(b.mul(b.add(b.mul(n, _c(g.cb_count)), k), _c(plane)), pix)
        if g.cs == g.cg:  # staged channel c is input channel c: copy whole blocks
            def copy_block(k):
                src = block_at(k)
                dst = b.add(out, b.mul(k, _c(g.cb * eb)))
                done = 0
                while done < g.cb:
                    width = min(64, g.cb - done)
                    width = 1 << (width.bit_length() - 1)  # a power of two
                    v = h.load(data, b.add(src, _c(done)), ir.VectorType(_I8, width))
                    h.store(self._stage_value(b, v), staged, b.add(dst, _c(done * eb)))
                    done += width
            h.loop(0, g.cb_count, copy_block)
            return
        # groups whose channels are not a multiple of the form's group: one at a time
        self._fill(h, staged, out, g.ctot)

        def channel(c):
            k, ci = b.sdiv(c, _c(g.cb)), b.srem(c, _c(g.cb))
            v = h.load(data, b.add(block_at(k), ci), _I8)
            grp, within = b.sdiv(c, _c(g.cg)), b.srem(c, _c(g.cg))
            at = b.add(out, b.mul(b.add(b.mul(grp, _c(g.cs)), within), _c(eb)))
            h.store(self._stage_value(b, v), staged, at)
        h.loop(0, g.c, channel)

    # -- a matmul's segment 2: its right operand packed as weights, per matrix
    def pack(self):
        """``b [Z, K, N]`` into ``packed [Z, 1, T, 1, 1, Q, V, L, group]`` (zeros past K
        and N) and ``colbias [Z, Mgp]``: ``-128 * sum over k of b[k, n]`` for an unsigned
        form, else 0 (what ``pack_dot_weight`` and ``unsigned_bias`` do to constant
        weights). Per ``group`` rows of b and ``L`` columns: the rows loaded as vectors
        (column tails and a K tail through a zeroed scratch row) and interleaved."""
        g, f = self.geo, self.f
        eb, lanes, grp = f.bytes, f.lanes, f.group
        z_count, k_count, n_count = self.geo.spec["b"]
        name = f"{self.symbol}_pack"
        fn, b = _segment(self.module, name)
        h = _Builder(b)
        bufs = self._named(b, fn)
        src, packed, colbias = bufs["b"], bufs["packed"], bufs["colbias"]
        row_ty = ir.VectorType(_I8, lanes)
        scratch = b.alloca(row_ty, name="row")
        scratch_p = b.bitcast(scratch, _PTR)
        sums = b.alloca(self.acc_ty, name="sums")
        wide_row = ir.VectorType(self.elem, lanes)
        mask = [e * lanes + lane for lane in range(lanes) for e in range(grp)]

        def matrix(z):
            def vector(t, j):
                n0 = b.add(b.mul(t, _c(g.tile)), _c(j * lanes))
                whole = b.icmp_signed("<=", b.add(n0, _c(lanes)), _c(n_count))
                b.store(_splat_const(self.acc_ty, 0), sums)

                def row(k):
                    """Row k of b at columns n0.., zeros past N (k < K)."""
                    at = b.add(b.mul(b.add(b.mul(z, _c(k_count)), k), _c(n_count)), n0)
                    b.store(_splat_const(row_ty, 0), scratch)

                    def copy_lanes():
                        def lane(i):
                            inside = b.icmp_signed("<", b.add(n0, i), _c(n_count))
                            h.when(inside, lambda: h.store(h.load(src, b.add(at, i), _I8),
                                                           scratch_p, i))
                        h.loop(0, lanes, lane)
                    h.when(whole, lambda: b.store(h.load(src, at, row_ty), scratch),
                           copy_lanes)
                    return b.load(scratch)

                def step(q, rows_there: int):
                    rows = []
                    for e in range(grp):
                        if e < rows_there:
                            v = row(b.add(b.mul(q, _c(grp)), _c(e)))
                        else:
                            v = _splat_const(row_ty, 0)
                        rows.append(v if eb == 1 else b.sext(v, wide_row))
                    total = b.load(sums)
                    for v in rows:
                        total = b.add(total, b.sext(v, self.acc_ty))
                    b.store(total, sums)
                    while len(rows) > 2:  # concatenate pairs: a shuffle takes two vectors
                        rows = [b.shuffle_vector(rows[i], rows[i + 1], ir.Constant(
                            ir.VectorType(_I32, 2 * rows[i].type.count),
                            list(range(2 * rows[i].type.count)))) for i in range(0, len(rows), 2)]
                    inter = b.shuffle_vector(rows[0], rows[1], ir.Constant(
                        ir.VectorType(_I32, len(mask)), mask))
                    index = b.add(b.mul(b.add(b.mul(b.add(b.mul(z, _c(g.tiles)), t), _c(g.q)),
                                              q), _c(g.vectors)), _c(j))
                    h.store(inter, packed, b.mul(index, _c(lanes * grp * eb)))
                full_steps, rest = divmod(k_count, grp)
                h.loop(0, full_steps, lambda q: step(q, grp))
                if rest:
                    step(_c(full_steps), rest)
                total = b.load(sums)
                if f.unsigned:
                    total = b.mul(total, _splat_const(self.acc_ty, -128))
                else:
                    total = _splat_const(self.acc_ty, 0)
                h.store(total, colbias, b.mul(b.add(b.mul(z, _c(g.mgp)), n0), _c(4)))
            h.loop(0, g.tiles, lambda t: [vector(t, j) for j in range(g.vectors)])
        h.loop(fn.args[1], fn.args[2], matrix)
        b.ret_void()
        return name

    # -- the last segment: the dot products and the epilogue
    def dot(self):
        g, f = self.geo, self.f
        eb = f.bytes
        name = f"{self.symbol}_dot"
        fn, b = _segment(self.module, name)
        h = _Builder(b)
        bufs = self._named(b, fn)
        residual, out, staged = bufs.get("residual"), bufs["out"], bufs["staged"]
        if g.matmul:  # qops.qmatmul: [multiplier, shift], rounding 2**(shift-1), int8 range
            weight, bias = bufs["packed"], bufs["colbias"]
            m_value, s_value = (h.load(bufs["qparams"], 4 * k, _I32) for k in range(2))
            rq = [s_value, _c(-128, _I32), _c(127, _I32),
                  b.shl(_c(1, _I32), b.sub(s_value, _c(1, _I32)))]
            mult = h.splat(m_value, self.acc_ty)
        else:
            weight, bias, mult = bufs["weight"], bufs["bias"], bufs["multiplier"]
            rq = [h.load(bufs["requant"], 4 * k, _I32) for k in range(4)]
        shift, lo, hi, rnd = (h.splat(v, self.acc_ty) for v in rq)
        r_max, v_count = g.columns, g.vectors
        acc = b.alloca(ir.ArrayType(self.acc_ty, r_max * v_count), name="acc")

        def slot(r, j):
            return b.gep(acc, [_c(0, _I32), _c(r * v_count + j, _I32)])

        def item(it):
            xc = b.srem(it, _c(g.chunks))
            rest = b.sdiv(it, _c(g.chunks))
            oy = b.srem(rest, _c(g.oh))
            rest = b.sdiv(rest, _c(g.oh))
            t = b.srem(rest, _c(g.tiles))
            rest = b.sdiv(rest, _c(g.tiles))
            gi = b.srem(rest, _c(g.g))
            n = b.sdiv(rest, _c(g.g))
            tap_bytes = g.q * v_count * f.lanes * f.group * eb
            # a matmul's weights and bias are its image's (n's) own
            own = b.add(b.mul(n, _c(g.g)), gi) if g.matmul else gi
            w_tile = b.mul(b.add(b.mul(own, _c(g.tiles)), t), _c(g.kh * g.taps_w * tap_bytes))
            row0 = b.add(b.mul(n, _c(g.hs)), b.mul(oy, _c(g.rs_h)))
            in_row = b.add(b.mul(row0, _c(g.ws * g.ctot * eb)), b.mul(gi, _c(g.cs * eb)))
            ch0 = b.add(b.mul(own, _c(g.mgp)), b.mul(t, _c(g.tile)))  # bias/multiplier index
            oc0 = b.mul(t, _c(g.tile))                                # channel in the group
            first = b.mul(xc, _c(g.blocks_per_chunk))
            last = b.add(first, _c(g.blocks_per_chunk))
            last = b.select(b.icmp_signed("<", last, _c(g.full_blocks)), last,
                            _c(g.full_blocks))
            def row(ky_range):
                ctx = (n, gi, oy, w_tile, in_row, ch0, oc0, ky_range)

                def dynamic_block(k):
                    self._block(h, ctx, b.mul(k, _c(g.columns)), g.columns, slot, bufs_ctx)

                def block(k, border=tuple(k for k in g.border_blocks if k < g.full_blocks)):
                    if not border:
                        return dynamic_block(k)
                    kb = border[0]
                    h.when(b.icmp_signed("==", k, _c(kb)),
                           lambda: self._block(h, ctx, _c(kb * g.columns), g.columns, slot,
                                               bufs_ctx, x_static=kb * g.columns),
                           lambda: block(k, border[1:]))
                h.loop(first, last, block)
                if g.tail:
                    is_last = b.icmp_signed("==", xc, _c(g.chunks - 1))
                    x_tail = g.full_blocks * g.columns
                    static = x_tail if g.full_blocks in g.border_blocks else None
                    h.when(is_last, lambda: self._block(h, ctx, _c(x_tail), g.tail, slot,
                                                        bufs_ctx, x_static=static))
            if g.row_border:  # rows reaching the padding apart: the others as without it
                y_top, y_bottom = g.border_rows
                border_row = b.or_(b.icmp_signed("<", oy, _c(y_top)),
                                   b.icmp_signed(">=", oy, _c(y_bottom)))
                h.when(border_row, lambda: row(self._rows_in_bounds(b, oy)),
                       lambda: row((0, g.kh)))
            else:
                row((0, g.kh))
        bufs_ctx = (weight, bias, mult, residual, out, staged, shift, lo, hi, rnd,
                    bufs.get("tapsum"))
        h.loop(fn.args[1], fn.args[2], item)
        b.ret_void()
        return name

    def _dot_step(self, b, a, wv, s):
        """One instruction's worth: ``s + dot(a, wv)`` per lane."""
        f = self.f
        if f.unsigned:
            name = f"llvm.x86.avx512.vpdpbusd.{f.lanes * 32}"
            new_types = llvm_binding().llvm_version_info[0] >= 22
            arg = ir.VectorType(_I8, f.lanes * 4) if new_types else self.acc_ty
            fn = self.module.globals.get(name) or ir.Function(
                self.module, ir.FunctionType(self.acc_ty, [self.acc_ty, arg, arg]), name)
            return b.call(fn, [s, b.bitcast(a, arg), b.bitcast(wv, arg)])
        name = "llvm.x86.avx2.pmadd.wd"
        v16 = ir.VectorType(_I16, 16)
        fn = self.module.globals.get(name) or ir.Function(
            self.module, ir.FunctionType(self.acc_ty, [v16, v16]), name)
        return b.add(s, b.call(fn, [b.bitcast(a, v16), b.bitcast(wv, v16)]))

    def _rows_in_bounds(self, b, oy):
        """(first, end) kernel rows whose input row is inside the image for output row
        ``oy``: ``0 <= oy * sh - pt + ky * dh < h``."""
        g = self.geo
        top = b.sub(_c(g.pt), b.mul(oy, _c(g.sh)))          # ky * dh >= top
        first = b.sdiv(b.add(top, _c(g.dh - 1)), _c(g.dh))
        first = b.select(b.icmp_signed("<", top, _c(0)), _c(0), first)
        room = b.add(_c(g.h - 1 + g.pt), b.mul(oy, _c(-g.sh)))  # ky * dh <= room
        end = b.add(b.sdiv(room, _c(g.dh)), _c(1))
        end = b.select(b.icmp_signed("<", room, _c(0)), _c(0), end)
        first = b.select(b.icmp_signed(">", first, _c(g.kh)), _c(g.kh), first)
        end = b.select(b.icmp_signed(">", end, _c(g.kh)), _c(g.kh), end)
        end = b.select(b.icmp_signed("<", end, first), first, end)  # a row all padding
        return first, end

    def _columns_in_bounds(self, x0: int, cols: int, kx: int) -> tuple[int, int]:
        """(first, end) of the block's columns whose tap ``kx`` reads inside the image."""
        g = self.geo
        inside = [r for r in range(cols)
                  if 0 <= (x0 + r) * g.sw - g.pl + kx * g.dw < g.w]
        return (inside[0], inside[-1] + 1) if inside else (0, 0)

    def _block(self, h: _Builder, ctx, x0, cols: int, slot, bufs_ctx, x_static=None):
        """``cols`` output columns from ``x0``: the reduction into registers, then the
        epilogue. With ``skip_padding``, only the kernel rows inside the image (``ky_range``)
        and, for a block at a static ``x_static``, each column's in-bounds kernel columns
        are multiplied; a skipped tap adds what its padding would have: ``tapsum`` (the
        staged padding value times the tap's weight sums)."""
        g, f, b = self.geo, self.f, h.b
        eb = f.bytes
        n, gi, oy, w_tile, in_row, ch0, oc0, (ky_first, ky_end) = ctx
        weight, bias, mult, residual, out, staged, shift, lo, hi, rnd, tapsum = bufs_ctx
        v_count = g.vectors
        zero = _splat_const(self.acc_ty, 0)
        for r in range(cols):
            for j in range(v_count):
                b.store(zero, slot(r, j))
        col_bytes = g.rs_w * g.ctot * eb
        group_ty = ir.IntType(32)  # one broadcast group: 4 bytes or 2 int16
        step_bytes = v_count * f.lanes * f.group * eb
        x_base = b.add(in_row, b.mul(x0, _c(col_bytes)))
        if g.skip:
            t_tile = b.mul(b.sdiv(ch0, _c(g.tile)), _c(g.kh * g.taps_w * g.tile * 4))

        def add_tapsum(ky, kx, columns):
            """The skipped tap (ky, kx)'s padding products into ``columns``' sums."""
            at = b.add(t_tile, b.mul(b.add(b.mul(ky, _c(g.taps_w)), kx), _c(g.tile * 4)))
            for j in range(v_count):
                tv = h.load(tapsum, b.add(at, _c(j * f.lanes * 4)), self.acc_ty)
                for r in columns:
                    b.store(b.add(b.load(slot(r, j)), tv), slot(r, j))
        if g.row_border:  # the kernel rows above and below the image, every column
            for lo_ky, hi_ky in ((0, ky_first), (ky_end, g.kh)):
                h.loop(lo_ky, hi_ky, lambda ky: h.loop(
                    0, g.taps_w, lambda kx: add_tapsum(ky, kx, range(cols))))

        def tap(ky, kx, first=0, end=cols):
            tap_index = b.add(b.mul(ky, _c(g.taps_w)), kx)
            w_tap = b.add(w_tile, b.mul(tap_index, _c(g.q * step_bytes)))
            offset = b.add(b.mul(ky, _c(g.dh * g.ws * g.ctot * eb)),
                           b.mul(kx, _c(g.dw * g.ctot * eb)))
            p_tap = b.add(x_base, offset)

            def step(q):
                wq = b.add(w_tap, b.mul(q, _c(step_bytes)))
                ws = [h.load(weight, b.add(wq, _c(j * f.lanes * f.group * eb)),
                             self.operand_ty) for j in range(v_count)]
                pq = b.add(p_tap, b.mul(q, _c(f.group * eb)))
                for r in range(first, end):
                    word = h.load(staged, b.add(pq, _c(r * col_bytes)), group_ty)
                    a = b.bitcast(h.splat(word, self.acc_ty), self.operand_ty)
                    for j in range(v_count):
                        b.store(self._dot_step(b, a, ws[j], b.load(slot(r, j))), slot(r, j))
            if end > first:
                h.loop(0, g.q, step)
            skipped = [r for r in range(cols) if not first <= r < end]
            if skipped:
                add_tapsum(ky, kx, skipped)
        if x_static is None:
            h.loop(ky_first, ky_end, lambda ky: h.loop(0, g.taps_w, lambda kx: tap(ky, kx)))
        else:
            def row(ky):
                for kx in range(g.kw):
                    tap(ky, _c(kx), *self._columns_in_bounds(x_static, cols, kx))
            h.loop(ky_first, ky_end, row)
        # epilogue
        for j in range(v_count):
            at = b.add(ch0, _c(j * f.lanes))
            bv = h.load(bias, b.mul(at, _c(4)), self.acc_ty)
            mv = mult if self.geo.matmul else h.load(mult, b.mul(at, _c(4)), self.acc_ty)
            oc = b.add(oc0, _c(j * f.lanes))  # first channel of the vector in its group
            for r in range(cols):
                t = b.mul(b.add(b.load(slot(r, j)), bv), mv)
                t = b.ashr(b.add(t, rnd), shift)
                x = b.add(x0, _c(r))
                self._store(h, t, gi, oc, n, oy, x, residual, out, lo, hi)

    def _out_offset(self, b, channel, n, oy, x):
        """Byte offset of output channel ``channel`` (i64) at (n, oy, x)."""
        g = self.geo
        blk, within = b.sdiv(channel, _c(g.ob)), b.srem(channel, _c(g.ob))
        pix = b.add(b.mul(oy, _c(g.ow)), x)
        return b.add(b.mul(b.add(b.mul(b.add(b.mul(n, _c(g.mb_count)), blk), _c(g.oh * g.ow)),
                                 pix), _c(g.ob)), within)

    def _store(self, h: _Builder, t, gi, oc, n, oy, x, residual, out, lo, hi):
        """Residual, clip and store the lanes of one vector (channels ``oc`` .. of group
        ``gi``) at (n, oy, x)."""
        g, f, b = self.geo, self.f, h.b
        lanes = f.lanes
        channel = b.add(b.mul(gi, _c(g.mg)), oc)
        i8v = ir.VectorType(_I8, lanes)

        def finish(v):
            v = b.select(b.icmp_signed("<", v, lo), lo, v)
            v = b.select(b.icmp_signed(">", v, hi), hi, v)
            return b.trunc(v, i8v)

        def whole():
            at = self._out_offset(b, channel, n, oy, x)
            v = t
            if residual is not None:
                v = b.add(v, b.sext(h.load(residual, at, i8v), self.acc_ty))
            h.store(finish(v), out, at)

        def lane_by_lane():
            for lane in range(lanes):
                inside = b.icmp_signed("<", b.add(oc, _c(lane)), _c(g.mg))

                def one(lane=lane):
                    at = self._out_offset(b, b.add(channel, _c(lane)), n, oy, x)
                    v = b.extract_element(t, _c(lane, _I32))
                    if residual is not None:
                        v = b.add(v, b.sext(h.load(residual, at, _I8), _I32))
                    v = b.select(b.icmp_signed("<", v, b.extract_element(lo, _c(0, _I32))),
                                 b.extract_element(lo, _c(0, _I32)), v)
                    v = b.select(b.icmp_signed(">", v, b.extract_element(hi, _c(0, _I32))),
                                 b.extract_element(hi, _c(0, _I32)), v)
                    h.store(b.trunc(v, _I8), out, at)
                h.when(inside, one)
        if g.mg % lanes == 0 and g.ob % lanes == 0:
            # every vector is whole channels of one output block, or all padding (a tile
            # of more vectors than the group's channels fill)
            if g.mgp == g.mg:
                whole()
            else:
                h.when(b.icmp_signed("<", oc, _c(g.mg)), whole)
            return
        # a vector is stored whole when its channels are all real and in one block
        fits = b.and_(b.icmp_signed("<=", b.add(oc, _c(lanes)), _c(g.mg)),
                      b.icmp_signed("<=", b.add(b.srem(channel, _c(g.ob)), _c(lanes)),
                                    _c(g.ob)))
        h.when(fits, whole, lane_by_lane)

    # -- the form's peak (int8_dot.compile_peak): independent instructions on registers
    def peak(self, accumulators: int, steps: int) -> str:
        name = f"{self.symbol}_seg0"
        fn, b = _segment(self.module, name)
        h = _Builder(b)
        out = b.load(b.gep(fn.args[0], [_c(0)]))
        acc = b.alloca(ir.ArrayType(self.acc_ty, accumulators))

        def item(i):
            seed = b.trunc(i, _I32)
            a = h.splat(b.or_(seed, _c(0x01010101, _I32)), self.acc_ty)
            wv = b.bitcast(h.splat(b.add(seed, _c(0x02030405, _I32)), self.acc_ty),
                           self.operand_ty)
            slots = [b.gep(acc, [_c(0, _I32), _c(k, _I32)]) for k in range(accumulators)]
            for s in slots:
                b.store(_splat_const(self.acc_ty, 0), s)

            def rounds(_):
                # each round's activations depend on the last round's first sum, so nothing
                # is loop-invariant (LLVM would hoist a vpmaddwd of constant operands)
                step_a = b.bitcast(b.xor(b.load(slots[0]), a), self.operand_ty)
                for s in slots:
                    b.store(self._dot_step(b, step_a, wv, b.load(s)), s)
            h.loop(0, steps, rounds)
            total = b.load(slots[0])
            for s in slots[1:]:
                total = b.add(total, b.load(s))
            h.store(total, out, b.mul(i, _c(self.f.lanes * 4)))
        h.loop(fn.args[1], fn.args[2], item)
        b.ret_void()
        return name
