"""A 1x1 convolution with its max pooling fused: the pooling runs in the accumulator on the
convolution's rows before they are stored, so the convolution's un-pooled output
is never written to DRAM nor loaded back (compiler/accel/ops_alu.py's max pooling loads its
input into the accumulator with ``ACC_8BIT``, two bus cycles per row, and waits for DRAM).

The layer is a 1x1, stride-1, unpadded conv2d (a few-channel layer over its windows,
compiler/accel/im2col.py, is one: ResNet's stem) followed by any 2-D max pooling of its
output whose tile fits the accumulator. Written against the driver's stream builder like
ops_alu.py. Per batch block and tile of ``th`` pooled rows (whole rows), for all output
channel blocks at once:

1. the window rows it shares with the previous tile (``span_h - th x stride_h`` of them),
   already reduced along the row, stay where they are: the window's rows are a ring of
   ``(th - 1) x stride_h + span_h`` accumulator rows per output block;
2. its new rows outside the image and its padding columns are set to the int32 minimum
   (``MIN -32768``, ``MAX -32768``, ``SHR -16``): below every value, so padding never wins
   a window (max pooling pads with -inf, and every window holds an image pixel);
3. its new image rows are the convolution: a GEMM reset of their accumulator rows, then per
   chunk of input pixels (all input blocks of up to ``chunk`` pixels: whole rows, or
   parts of one row; double-buffered in INP, loaded by the load module) one GEMM
   micro-op per input block, output block and pixel, the weights (all blocks, loaded
   once) in WGT;
4. the epilogue up to the shift on those rows (compiler/accel/ops.py's order: + bias,
   x multiplier, x scale, + bias if last), one ALU instruction per step;
5. the pooling, separable as in ops_alu.py and in place: each new row's window maxima along
   the row (``kw - 1`` MAX per output column, at the window's first column), then each
   pooled pixel's maxima down the column (``kh - 1`` MAX, at the window's first row);
   then the rest of the epilogue, ``>> shift`` and the clip, on the maxima only (both are
   monotone: the shift and clip of a maximum are the maximum of the shifted and clipped
   values), the clip's last step, ``MIN hi``, written into the tile's output rows (two
   buffers, alternating, so that a tile's store overlaps the next tile: each made exactly
   ``hi`` first by one ``MAX hi``, as everything they held is at most ``hi``), and the
   store. ResNet's stem: 6 ALU micro-ops per pooled pixel and output block after the row
   maxima, instead of 3 x 4 for the shift and clip of its four pixels and 4 for the pooling.

Every value is the unfused pair's (the int32 values before the shift are the conv2d's, and
the shift and clip of their maximum the maximum of its int8 outputs), so the result is the
pooled QConv's bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from celosia.config import HwConfig
from celosia.errors import CompilerError
from celosia.isa import AluOp, MemType, Module

from .ops import ConvSpec
from .ops_alu import _MAX_SIZE, AluProgram, PoolSpec, _check_axis, _tiles, _window

__all__ = ["ConvPoolKnobs", "conv_pool_knobs", "conv_pool", "why_not_fused"]


@dataclass(frozen=True)
class ConvPoolKnobs:
    tile_h: int  # pooled rows per tile
    chunk: int  # input pixels per INP load


def why_not_fused(cfg: HwConfig, conv: ConvSpec, pool: PoolSpec) -> str | None:
    """Why this convolution and max pooling cannot run as one program, or None."""
    if (conv.kh, conv.kw, conv.strides, conv.pads) != (1, 1, (1, 1), (0, 0, 0, 0)):
        return (f"the convolution is {conv.kh}x{conv.kw}, strides {conv.strides}, pads "
                f"{conv.pads}: only a 1x1, stride-1, unpadded one (a few-channel layer over "
                f"its windows) is fused with its pooling")
    if conv.epilogue.residual or conv.bias_classes:
        return "the convolution adds a residual or a bias table"
    if (pool.n, pool.c, pool.h, pool.w) != (conv.n, conv.o, conv.oh, conv.ow):
        return "the pooling does not read the convolution's output"
    for what, size, out, stride, pad, dil, taps in (
            ("row", pool.h, pool.oh, pool.stride_h, pool.pad_top, pool.dil_h, pool.kh),
            ("column", pool.w, pool.ow, pool.stride_w, pool.pad_left, pool.dil_w, pool.kw)):
        for y in range(out):
            if not any(0 <= y * stride - pad + d * dil < size for d in range(taps)):
                return (f"output {what} {y}'s window reads only padding (its -inf is "
                        f"written exactly only by the unfused max pooling)")
    try:
        conv_pool_knobs(cfg, conv, pool)
    except CompilerError as e:
        return str(e)
    return None


def _acc_rows(cfg: HwConfig, conv: ConvSpec, pool: PoolSpec, th: int) -> int:
    ob = conv.o // cfg.block
    e = conv.epilogue
    iw = _window(0, pool.ow, pool.stride_w, pool.pad_left, pool.span_w, pool.w)[1]
    ih = (th - 1) * pool.stride_h + pool.span_h
    return ob * (e.bias + e.scale) + ob * ih * iw + 2 * ob * th * pool.ow


def conv_pool_knobs(cfg: HwConfig, conv: ConvSpec, pool: PoolSpec) -> ConvPoolKnobs:
    """The most pooled rows per tile that fit the accumulator (whole rows), and the largest
    chunk of pixels two INP buffers hold; a CompilerError says what does not fit."""
    b, k = cfg.batch, cfg.block
    cb, ob = conv.c // k, conv.o // k
    if conv.n % b or conv.c % k or conv.o % k:
        raise CompilerError(f"N={conv.n}, C={conv.c}, O={conv.o} must be multiples of "
                            f"BATCH={b} and BLOCK={k}")
    if ob * cb > cfg.wgt_depth:
        raise CompilerError(f"its {ob * cb} weight blocks do not fit the {cfg.wgt_depth}-block "
                            f"weight buffer at once")
    if 2 * cb > cfg.inp_depth:
        raise CompilerError(f"two pixels of {cb} input blocks do not fit the input buffer")
    if pool.h * pool.w > _MAX_SIZE:
        raise CompilerError(f"a plane of {pool.h}x{pool.w} pixels is further than the DMA's "
                            f"row stride reaches ({_MAX_SIZE} elements)")
    iw = _window(0, pool.ow, pool.stride_w, pool.pad_left, pool.span_w, pool.w)[1]
    if iw > 2047:
        raise CompilerError(f"a pooled row reads {iw} columns, more than an ALU loop's "
                            f"factor reaches")
    th = next((t for t in range(pool.oh, 0, -1)
               if _acc_rows(cfg, conv, pool, t) <= cfg.acc_depth),
              None)
    if th is None:
        raise CompilerError(f"one pooled row of {ob} channel blocks needs "
                            f"{_acc_rows(cfg, conv, pool, 1)} accumulator rows (its window, "
                            f"two output buffers), more than {cfg.acc_depth}")
    for what, args in (("rows", (pool.h, pool.oh, th, pool.stride_h, pool.pad_top,
                                 pool.span_h)),
                       ("columns", (pool.w, pool.ow, pool.ow, pool.stride_w, pool.pad_left,
                                    pool.span_w))):
        problem = _check_axis(what, *args)
        if problem:
            raise CompilerError(f"max pooling: {problem}")
    most = cfg.inp_depth // (2 * cb)
    if most >= pool.w:  # whole rows per chunk, at most as many as a tile has
        return ConvPoolKnobs(th, min(most // pool.w, (th - 1) * pool.stride_h + pool.span_h)
                             * pool.w)
    parts = -(-pool.w // most)  # chunks per row, of equal widths
    return ConvPoolKnobs(th, -(-pool.w // parts))


def monotone(conv: ConvSpec, weight, bias, scale) -> bool:
    """Whether the whole epilogue is a non-decreasing function of the accumulator for these
    constants (packed as conv2d takes them): no step can wrap around int32 for any int8
    input (|accumulator| <= 128 x the sum of an output channel's |weights|), and every
    multiplier is non-negative. Then it too commutes with the maximum, and runs on the
    pooled maxima only (``conv_pool(..., whole=True)``)."""
    import numpy as np

    e = conv.epilogue
    w = np.abs(np.asarray(weight, np.float64))  # (O/k, C/k, KH, KW, k, k)
    x = 128.0 * w.sum(axis=(1, 2, 3, 5)).reshape(-1)  # per output channel
    per_channel = (lambda a: np.asarray(a, np.float64)[:, 0, :].reshape(-1))
    b = np.abs(per_channel(bias)) if e.bias else 0.0
    limit = 2.0 ** 31 - 1
    bounds = []
    if e.bias and not e.bias_last:
        x = x + b
        bounds.append(x)
    if e.multiplier is not None:
        if e.multiplier < 0:
            return False
        x = x * e.multiplier
        bounds.append(x)
    if e.scale:
        m = per_channel(scale)
        if (m < 0).any():
            return False
        x = x * m
        bounds.append(x)
    if e.bias and e.bias_last:
        x = x + b
        bounds.append(x)
    return all((v <= limit).all() for v in bounds)


def conv_pool(cfg: HwConfig, conv: ConvSpec, pool: PoolSpec, knobs: ConvPoolKnobs,
              name: str = "conv_pool", *, whole: bool = False) -> AluProgram:
    """The fused program (module docstring); takes (data, kernel[, bias][, scale], out),
    ``out`` the pooled output, packed like max pooling's. ``whole``: the whole epilogue
    after the pooling, on the maxima (only for constants that ``monotone`` accepts; else
    the shift and the clip alone)."""
    problem = why_not_fused(cfg, conv, pool)
    if problem:
        raise CompilerError(f"{name}: {problem}")
    b, k = cfg.batch, cfg.block
    nb, cb, ob = conv.n // b, conv.c // k, conv.o // k
    e = conv.epilogue
    H, W = pool.h, pool.w
    sh, sw, dh, dw = pool.stride_h, pool.stride_w, pool.dil_h, pool.dil_w
    th, chunk = knobs.tile_h, knobs.chunk
    if _acc_rows(cfg, conv, pool, th) > cfg.acc_depth:
        raise CompilerError(f"{name}: tiles of {th} pooled rows do not fit the accumulator")
    _, iw, pl, _ = _window(0, pool.ow, sw, pool.pad_left, pool.span_w, W)
    ih_max = (th - 1) * sh + pool.span_h
    bias_at = 0
    scale_at = ob * e.bias
    tb = ob * (e.bias + e.scale)  # the window tiles, one per output block
    ts = ih_max * iw
    o_at = tb + ob * ts  # two output buffers of ob x th x ow rows
    o_size = ob * th * pool.ow
    ow = pool.ow
    C, L, S = Module.COMPUTE, Module.LOAD, Module.STORE
    tiles = _tiles(pool.oh, th)

    # (the int32 minimum, exactly: below every value, so that padding never wins a window)
    LOWEST = ((AluOp.MIN, -(1 << 15)), (AluOp.MAX, -(1 << 15)), (AluOp.SHR, -16))

    def steps():
        """The epilogue's ALU steps: (op, imm, source row base or None)."""
        out = []
        if e.bias and not e.bias_last:
            out.append((AluOp.ADD, None, bias_at))
        if e.multiplier is not None:
            out.append((AluOp.MUL, e.multiplier, None))
        if e.scale:
            out.append((AluOp.MUL, None, scale_at))
        if e.bias and e.bias_last:
            out.append((AluOp.ADD, None, bias_at))
        if e.shift:
            out.append((AluOp.SHR, e.shift, None))
        out.append((AluOp.MAX, e.low, None))
        out.append((AluOp.MIN, e.hi, None))
        return out

    # shift and clip (or the whole epilogue): after the pooling
    after = steps() if whole else steps()[-(2 + bool(e.shift)):]

    def emit(dev, bufs):
        data, kernel, *consts, out = bufs
        dev.load_2d(kernel, 0, ob * cb, 1, ob * cb, sram_index=0, mem_type=MemType.WGT)
        for what, at in (("bias", bias_at), ("scale", scale_at)):
            if getattr(e, what):
                dev.load_2d(consts.pop(0), 0, ob, 1, ob, sram_index=at, mem_type=MemType.ACC)
        # both output buffers at most ``hi`` (the invariant the clip into them keeps)
        dev.alu(("convpool-o", o_at, 2 * o_size, e.hi),
                lambda kb: (kb.loop(2 * o_size, 1, 0), kb.push(o_at, 0)), AluOp.MIN, imm=e.hi)
        # the chunks of input pixels, in order: (batch block, first row, rows, first column,
        # width): whole rows (contiguous in DRAM) when a row fits a buffer, else parts of one
        def row_chunks(a, b):
            if chunk >= W:
                per = chunk // W
                return [(r, min(per, b - r), 0, W) for r in range(a, b, per)]
            return [(r, 1, c0, min(chunk, W - c0)) for r in range(a, b)
                    for c0 in range(0, W, chunk)]

        chunks = []
        for n in range(nb):
            prev = None
            for y0, y1 in tiles:
                r0, ih, _, _ = _window(y0, y1, sh, pool.pad_top, pool.span_h, H)
                ov = max(0, prev[0] + prev[1] - r0) if prev else 0
                chunks += [(n, *c) for c in row_chunks(max(r0 + ov, 0), min(r0 + ih, H))]
                prev = (r0, ih)
        n_chunks = len(chunks)
        # the load module runs ahead over every chunk; compute consumes them in order
        state = {"next": 0}

        def load_chunks_until(i):
            while state["next"] <= min(i, n_chunks - 1):
                j = state["next"]
                n, r, rows, c0, cw = chunks[j]
                if j >= 2:
                    dev.dep_pop(C, L)  # compute has used chunk j - 2's buffer
                dev.load_2d(data, n * cb * H * W + r * W + c0, rows * cw, cb, H * W,
                            sram_index=(j % 2) * cb * chunk, mem_type=MemType.INP)
                dev.dep_push(L, C)
                state["next"] += 1

        def rows_alu(key, op, imm, src, at, cols, col0):
            """``op`` on the tile rows at ACC rows ``at`` (block 0, column 0), ``cols``
            columns from ``col0``, every output block (``src``: a per-block row, or None)."""
            def record(kb):
                if ob > 1:
                    kb.loop(ob, ts, 1 if src is not None else 0)
                if cols > 1:
                    kb.loop(cols, 1, 0)
                for r in at:
                    kb.push(r + col0, src if src is not None else 0)
            dev.alu(("convpool", key, op, imm, src, ob, ts, iw, tuple(at), cols, col0),
                    record, op, imm=imm)

        ci = 0  # the next chunk compute takes
        t = 0
        for n in range(nb):
            prev = None
            first = _window(0, 1, sh, pool.pad_top, pool.span_h, H)[0]

            def at(r, first=first):
                """The ACC row of image row ``r``'s column 0 (block 0): the window rows are
                a ring of ``ih_max`` rows, so rows shared by consecutive tiles stay put."""
                return tb + ((r - first) % ih_max) * iw

            for y0, y1 in tiles:
                r0, ih, pt, pb = _window(y0, y1, sh, pool.pad_top, pool.span_h, H)
                ov = max(0, prev[0] + prev[1] - r0) if prev else 0
                new = range(r0 + ov, r0 + ih)  # the rows this tile adds (image rows)
                real = [r for r in new if 0 <= r < H]
                # 1. padding: new rows outside the image, and the padding columns
                pads = [at(r) for r in new if not 0 <= r < H]
                if pads:
                    for op, imm in LOWEST:
                        rows_alu("pad-rows", op, imm, None, pads, iw, 0)
                if real:
                    for c0, c1 in ((0, pl), (pl + W, iw)):
                        if c1 > c0:
                            for op, imm in LOWEST:
                                rows_alu("pad-cols", op, imm, None, [at(r) for r in real],
                                         c1 - c0, c0)
                    # 2. the convolution of the new image rows
                    def reset(kb, rows=tuple(at(r) for r in real)):
                        if ob > 1:
                            kb.loop(ob, ts, 0)
                        if W > 1:
                            kb.loop(W, 1, 0)
                        for r in rows:
                            kb.push(r + pl, 0)
                    dev.gemm(("convpool-reset", ob, ts, pl, W, tuple(at(r) for r in real)),
                             reset, reset=True)
                    for r, rows, c0, cw in row_chunks(real[0], real[-1] + 1):
                        load_chunks_until(ci + 1)
                        base = (ci % 2) * cb * chunk
                        dsts = tuple(at(r + rr) + pl + c0 for rr in range(rows))

                        def gemm(kb, base=base, dsts=dsts, cw=cw):
                            # pixels innermost: consecutive micro-ops write different rows
                            if ob > 1:
                                kb.loop(ob, ts, 0, cb)
                            if cb > 1:
                                kb.loop(cb, 0, len(dsts) * cw, 1)
                            for rr, d in enumerate(dsts):
                                for p in range(cw):
                                    kb.push(d + p, base + rr * cw + p, 0)
                        dev.dep_pop(L, C)
                        dev.gemm(("convpool-gemm", ob, ts, cb, base, dsts, cw), gemm)
                        if ci + 2 < n_chunks:
                            dev.dep_push(C, L)
                        ci += 1
                    # 3. the epilogue up to the shift
                    for op, imm, src in steps()[:len(steps()) - len(after)]:
                        rows_alu("epilogue", op, imm, src, [at(r) for r in real], W, pl)
                # 4. the pooling: row maxima of the new rows in place, then column maxima in
                # place (an output's first row is a tap of no later output, and the rows
                # shared with the next tile lie below every first row)
                oh_t = y1 - y0
                firsts = tuple(at(r0 + y * sh) for y in range(oh_t))

                def by_column(kb, micro, src_step=None):
                    if ob > 1:
                        kb.loop(ob, ts, ts if src_step is None else src_step)
                    if ow > 1:
                        kb.loop(ow, sw, sw if src_step is None else 0)
                    for d, src in micro:
                        kb.push(d, src)
                if pool.kw > 1 and len(new):
                    rows = tuple(at(r) for r in new)
                    dev.alu(("convpool-h", ob, ts, ow, sw, dw, pool.kw, rows),
                            lambda kb, rows=rows: by_column(
                                kb, [(r, r + dx * dw) for r in rows for dx in range(1, pool.kw)]),
                            AluOp.MAX)
                if pool.kh > 1:
                    taps = tuple((at(r0 + y * sh), at(r0 + y * sh + dy * dh))
                                 for y in range(oh_t) for dy in range(1, pool.kh))
                    dev.alu(("convpool-v", ob, ts, ow, sw, taps),
                            lambda kb, taps=taps: by_column(kb, taps), AluOp.MAX)
                # the rest of the epilogue on the maxima: shift and clip are monotone, so
                # they give the maximum of the epilogue's values
                for op, imm, src in after[:-1]:
                    micro = [(f, src if src is not None else 0) for f in firsts]
                    dev.alu(("convpool-after", op, imm, src, ob, ts, ow, sw, firsts),
                            lambda kb, micro=micro, src=src: by_column(
                                kb, micro, 1 if src is not None else 0), op, imm=imm)
                o_base = o_at + (t % 2) * o_size
                if t >= 2:
                    dev.dep_pop(S, C)  # the store of tile t - 2 has read this buffer
                # the clip's MIN into O: O, at most hi since its last use, is first made hi
                # exactly, then O = min(hi, maximum)
                dev.alu(("convpool-hi", o_base, ob, th, ow, oh_t, e.hi),
                        lambda kb, o_base=o_base, oh_t=oh_t: (
                            kb.loop(ob, th * ow, 0) if ob > 1 else None,
                            kb.loop(oh_t * ow, 1, 0) if oh_t * ow > 1 else None,
                            kb.push(o_base, 0)), AluOp.MAX, imm=e.hi)

                def into(kb, o_base=o_base, firsts=firsts):
                    if ob > 1:
                        kb.loop(ob, th * ow, ts)
                    for y, f in enumerate(firsts):
                        for x in range(ow):
                            kb.push(o_base + y * ow + x, f + x * sw)
                dev.alu(("convpool-min", ob, th, ow, o_base, ts, sw, firsts), into, AluOp.MIN)
                dev.dep_push(C, S)
                dev.dep_pop(C, S)
                for j in range(ob):
                    dev.store_2d(o_base + j * th * ow, out,
                                 ((n * ob + j) * pool.oh + y0) * ow, oh_t * ow, 1, oh_t * ow)
                dev.dep_push(S, C)
                t += 1
                prev = (r0, ih)
        for _ in range(min(t, 2)):  # take the last stores' tokens: none left for later programs
            dev.dep_pop(S, C)

    args = [("data", "int8", (nb, cb, H, W, b, k)),
            ("kernel", "int8", (ob, cb, 1, 1, k, k))]
    if e.bias:
        args.append(("bias", "int32", (ob, b, k)))
    if e.scale:
        args.append(("scale", "int32", (ob, b, k)))
    args.append(("out", "int8", (nb, ob, pool.oh, pool.ow, b, k)))
    return AluProgram(name, cfg, args, emit)


def _measure(cfg: HwConfig, fn, seed: int = 0) -> int:
    """Cycles of one run of ``fn`` (an AluProgram) on the cycle model with random data."""
    import numpy as np

    from celosia.driver import Device

    rng = np.random.default_rng(seed)
    arrays = [rng.integers(-128, 128, shape).astype(dt) if dt == "int8" else
              rng.integers(1, 999, shape).astype(dt) for _, dt, shape, _ in fn.arg_specs()]
    size = sum(a.nbytes for a in arrays) * 2 + (8 << 20)
    return int(fn(Device(cfg, target="cycle", dram_size=size), *arrays)["cycles"])


def plan(node, graph, cfg: HwConfig, placements: dict, layer, *, top: int = 4):
    """The fused program of a QConv and the MaxPool that alone reads its output.

    Taken when: ``layer`` (the QConv's, after compiler/accel/im2col.py) is a 1x1 conv2d, its
    output is no graph output and is read by one MaxPool only, placed on the accelerator
    (partition.annotate), ``why_not_fused`` finds nothing, and the fused program takes fewer
    cycles on the cycle model than the convolution's tuned schedule and the max pooling's
    program (one batch block each). Returns ((function, knobs, the MaxPool node), None), or
    (None, (the MaxPool's name, why it is not fused)) when a MaxPool on the accelerator reads
    the output, else (None, None)."""
    import hashlib
    import json
    from dataclasses import asdict, replace
    from pathlib import Path

    from . import ops_alu
    from .ops_alu import maxpool, pool_knobs
    from .partition import layer_for
    from .tune import _sources_hash, cache_dir, tune_conv

    readers = [n for n in graph.nodes if node.outputs[0] in n.inputs]
    pools = [n for n in readers if n.op == "MaxPool" and placements[n.name].target == "accel"]
    if not pools:
        return None, None
    pool_node = pools[0]

    def no(why):
        return None, (pool_node.name, why)
    others = [n.name for n in readers if n is not pool_node]
    if others or node.outputs[0] in graph.outputs:
        return no(f"{node.outputs[0]!r} is also read by {others[0]!r}" if others else
                  f"{node.outputs[0]!r} is also a graph output")
    if layer.kind != "conv2d":
        return no(f"{node.name!r} runs as {layer.kind}, not conv2d")
    pool = layer_for(pool_node, graph, cfg).spec
    why = why_not_fused(cfg, layer.spec, pool)
    if why:
        return no(why)
    conv1, pool1 = replace(layer.spec, n=cfg.batch), replace(pool, n=cfg.batch)
    knobs = conv_pool_knobs(cfg, conv1, pool1)
    whole = monotone(layer.spec, layer.weight, layer.bias, layer.scale)
    # (cached on disk like the schedule search, by the sources the cycles depend on)
    text = json.dumps({"src": _sources_hash(), "file": hashlib.sha256(
        Path(__file__).read_bytes() + Path(ops_alu.__file__).read_bytes()).hexdigest(),
        "cfg": cfg.to_dict(), "conv": asdict(conv1), "pool": asdict(pool1), "top": top,
        "whole": whole}, sort_keys=True, default=str)
    path = cache_dir() / f"convpool-{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"
    if path.exists():
        fused, apart = json.loads(path.read_text())
    else:
        fused = _measure(cfg, conv_pool(cfg, conv1, pool1, knobs, whole=whole))
        apart = tune_conv(cfg, conv1, top=top)[1]["cycles"] + \
            _measure(cfg, maxpool(cfg, pool1, pool_knobs(cfg, pool1)))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([fused, apart]))
    if fused >= apart:
        return no(f"fused it takes {fused:,} cycles on the cycle model, apart {apart:,}")
    return (conv_pool(cfg, layer.spec, pool, conv_pool_knobs(cfg, layer.spec, pool),
                      name=node.name, whole=whole), knobs, pool_node), None
