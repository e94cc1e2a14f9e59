"""Schedule search: choose a layer's knobs (tiles, virtual threads) on the cycle model.

Candidates are the knob combinations whose buffers fit the configuration. An estimate (a
coarse simulation of the program conv2d emits, instruction by instruction, with the cycle
model's closed-form durations: ``estimate_conv``) ranks them; the best few are compiled and
run on the cycle model, and the fastest wins. Results are cached on disk by a hash of the
configuration, the layer, the search settings and the sources the choice depends on, so a
second search of the same layer is a file read. docs/compiler.md has the estimate's accuracy
and the ResNet-18 results.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CompilerError

from .border import bias_rows, bias_uops
from .ops import ConvKnobs, ConvSpec, _row_strided, conv2d

__all__ = ["conv_candidates", "estimate_conv", "measure_conv", "tune_conv", "cache_dir"]

_VERSION = 3  # bump when schedules change, so cached choices are not reused
# Candidates whose estimate is more than this fraction above the best estimate are not
# measured (the estimate's spread against the cycle model is a few per cent).
_MARGIN = 0.04


def cache_dir() -> Path:
    root = os.environ.get("CELOSIA_CACHE") or Path.home() / ".cache" / "celosia"
    return Path(root) / "tune"


def _loop_cycles(cfg: HwConfig, n: int) -> int:
    """A GEMM/ALU instruction of ``n`` micro-ops on compute, start to push (the cycle
    model's rule: the micro-ops plus the pipeline's depth)."""
    from celosia.sim.cycle_timing import Timing

    return Timing.from_config(cfg).loop_cycles(n)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _buffer_limits(cfg: HwConfig) -> dict:
    """SRAM rows a schedule may hold per buffer (half the micro-op buffer: the kernels of
    two threads)."""
    return {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth,
            "uop": cfg.uop_depth // 2}


def _tile_widths(ow: int) -> list[int]:
    """Tile widths searched: divisors of the output width of at least 7 columns (or the
    whole row)."""
    return [w for w in _divisors(ow) if w >= min(ow, 7)]


def _rows(cfg: HwConfig, spec: ConvSpec, k: ConvKnobs) -> dict:
    """SRAM rows a schedule holds at once, per buffer."""
    in_h, in_w = _input_tile(spec, k)
    bias = spec.epilogue.bias * bias_rows(spec.bias_classes, k.tile_h, k.tile_w)
    extra_acc = k.tile_co * (bias + spec.epilogue.scale) + \
        (k.tile_co * k.tile_h * k.tile_w if spec.epilogue.residual else 0)
    return {
        "inp": k.vthreads * k.tile_ci * in_h * in_w,
        "wgt": k.vthreads * k.tile_co * k.tile_ci * spec.kh * spec.kw,
        "acc": k.vthreads * (k.tile_co * k.tile_h * k.tile_w + extra_acc),
        "uop": _gemm_uops(spec, k) + bias_uops(spec.bias_classes, k.tile_h, k.tile_w),
    }


def _unrolled(extents) -> int:
    """Micro-ops of a kernel over loops of these extents (outermost first): loops of one
    iteration drop out, the two outermost others become the instruction's loops and the
    rest are unrolled (tensorize.py's _fold_loops)."""
    loops = [e for e in extents if e > 1]
    return math.prod(loops[2:])


def _gemm_uops(spec: ConvSpec, k: ConvKnobs) -> int:
    """The GEMM kernel's micro-ops: conv2d's loops rows, output blocks, input blocks, taps,
    columns (a 1-D layer's single row and output block make columns an instruction loop)."""
    return _unrolled((k.tile_h, k.tile_co, k.tile_ci, spec.kh, spec.kw, k.tile_w))


def _alu_uops(k: ConvKnobs) -> int:
    """Micro-ops of each ALU kernel (and the reset): output blocks, rows, columns."""
    return _unrolled((k.tile_co, k.tile_h, k.tile_w))


def _input_tile(spec: ConvSpec, k: ConvKnobs) -> tuple[int, int]:
    """Rows and columns of a tile's input (a strided 1x1 convolution loads only the rows it
    reads, see ops.conv2d)."""
    sh, sw = spec.strides
    if _row_strided(spec):
        in_h = k.tile_h
    else:
        in_h = (k.tile_h - 1) * sh + spec.kh
    return in_h, (k.tile_w - 1) * sw + spec.kw


def _reads_padding_only(spec: ConvSpec, k: ConvKnobs) -> bool:
    """Whether some tile's input lies entirely in the padding (padding of a kernel's size or
    more on a side: those output rows or columns see no input; the DMA cannot copy nothing,
    so larger tiles must cover them)."""
    if _row_strided(spec) or not any(spec.pads):
        return False
    in_h, in_w = _input_tile(spec, k)
    (sh, sw), (pt, pl) = spec.strides, spec.pads[:2]
    rows = any(y * k.tile_h * sh - pt + in_h <= 0 or y * k.tile_h * sh - pt >= spec.h
               for y in range(spec.oh // k.tile_h))
    return rows or any(x * k.tile_w * sw - pl + in_w <= 0 or x * k.tile_w * sw - pl >= spec.w
                       for x in range(spec.ow // k.tile_w))


def conv_candidates(cfg: HwConfig, spec: ConvSpec, *, vthreads: bool = True) -> list[ConvKnobs]:
    """Every knob combination whose buffers fit: tile sizes dividing the output (widths of at
    least 7 columns, or the whole row), each tile reading some input, and with ``vthreads`` also two threads on output
    channel blocks or rows wherever their tile count is even."""
    ob, cb = spec.o // cfg.block, spec.c // cfg.block
    limit = _buffer_limits(cfg)
    out = []
    widths = _tile_widths(spec.ow)
    for th in _divisors(spec.oh):
        for tw in widths:
            for tco in _divisors(ob):
                for tci in _divisors(cb):
                    threads = [(1, "co")]
                    if vthreads:
                        if (ob // tco) % 2 == 0:
                            threads.append((2, "co"))
                        if (spec.oh // th) % 2 == 0:
                            threads.append((2, "h"))
                    for vt, axis in threads:
                        knobs = ConvKnobs(th, tw, tco, tci, vt, axis)
                        rows = _rows(cfg, spec, knobs)
                        if (all(rows[b] <= limit[b] for b in rows)
                                and not _reads_padding_only(spec, knobs)):
                            out.append(knobs)
    return out


def _alu_ops(spec: ConvSpec) -> int:
    """ALU operations per output row (micro-op executions per accumulator row)."""
    e = spec.epilogue
    return 2 + bool(e.shift) + e.bias + (e.multiplier is not None) + e.scale + e.residual


def _load_cycles(cfg: HwConfig, rows: int, x: int, eb: int, pad_elems: int) -> float:
    """One LOAD of ``rows`` DRAM rows of ``x`` elements (``eb`` bytes each) and ``pad_elems``
    zero elements, uncontended (docs/cycle_model.md): every row pays the DRAM latency, and
    every further burst of a row the latency again. Where rows cross burst boundaries
    depends on the buffer's DRAM address, unknown here: the expected number of crossings
    (the buffer aligned to one element or 64 bytes) is used."""
    if rows == 0 or x == 0:
        return 4 + pad_elems
    lat, bus = cfg.dram_latency, cfg.bus_bytes
    burst = min(4096, 256 * bus)
    row_cycles = -(-x * eb // bus) if eb >= bus else x  # narrow elements: one per cycle
    crossings = max(0, x * eb - max(64, eb)) / burst
    return 4 + pad_elems + rows * (lat + 3 + row_cycles + crossings * (lat + 2))


def _store_cycles(cfg: HwConfig, rows: int, x: int, eb: int) -> int:
    burst = min(4096, 256 * cfg.bus_bytes)
    beats = -(-x * eb // cfg.bus_bytes)
    bursts = -(-x * eb // burst)
    return 3 + rows * (1 + bursts * (1 + cfg.dram_latency) + beats)


def estimate_conv(cfg: HwConfig, spec: ConvSpec, k: ConvKnobs, *, groups: int = 8) -> float:
    """Estimated cycles of a schedule: a coarse simulation of its program.

    The program conv2d emits is simulated instruction by instruction as the hardware runs
    it, in program order, each module in order and each instruction after the ones it
    depends on (the dependencies insert_dependencies derives from the buffers' rows): a
    thread's loads wait for its previous GEMM (its input and weight buffers are reused),
    its GEMM for its loads, its reset for its previous store, its store for its ALU chain.
    Durations are the cycle model's closed forms for uncontended instructions. Tiles are
    simulated for the first ``groups`` groups of tiles (one tile per thread) and the rest
    extrapolated from the last ones (all inner tiles cost the same). Fetch, command and
    token queues and read-channel contention are left out: the estimate is a few per cent
    below the cycle model, and ranks schedules the same way within about that."""
    blk = cfg.block
    ob, cb = spec.o // blk, spec.c // blk
    oh, ow = spec.oh, spec.ow
    sh, sw = spec.strides
    pt, pl = spec.pads[:2]
    th, tw, tco, tci, vt = k.tile_h, k.tile_w, k.tile_co, k.tile_ci, k.vthreads
    in_h, in_w = _input_tile(spec, k)
    # input rows per output row, and the rows the tiles' input is cut from
    ys, image_h = (1, oh) if _row_strided(spec) else (sh, spec.h)
    taps = spec.kh * spec.kw
    steps = cb // tci
    nco, nh, nw = ob // tco, oh // th, ow // tw
    nb = spec.n // cfg.batch
    if vt > 1 and k.vthread_axis == "co":
        per = nco // vt
        order = [[(t * per + c, y, x) for t in range(vt)]
                 for c in range(per) for y in range(nh) for x in range(nw)]
    elif vt > 1:
        per = nh // vt
        order = [[(c, t * per + y, x) for t in range(vt)]
                 for c in range(nco) for y in range(per) for x in range(nw)]
    else:
        order = [[(c, y, x)] for c in range(nco) for y in range(nh) for x in range(nw)]
    total_groups = len(order) * nb
    ieb, web, oeb = cfg.inp_elem_bytes, cfg.wgt_elem_bytes, cfg.out_elem_bytes
    inp_memo: dict = {}

    def inp_load(y: int, x: int) -> float:
        if (y, x) not in inp_memo:
            y0, x0 = y * th * ys - pt, x * tw * sw - pl
            dy = max(0, min(y0 + in_h, image_h) - max(y0, 0))
            dx = max(0, min(x0 + in_w, spec.w) - max(x0, 0))
            inp_memo[(y, x)] = _load_cycles(cfg, dy, dx, ieb, in_h * in_w - dy * dx)
        return inp_memo[(y, x)]

    if tci == cb:  # the tile's weights are contiguous: one DRAM row
        wgt_load = _load_cycles(cfg, 1, tco * cb * taps, web, 0)
    else:
        wgt_load = _load_cycles(cfg, tco, tci * taps, web, 0)

    rows = th * tw * tco
    alu_ops = _alu_ops(spec)
    gemm = _loop_cycles(cfg, rows * tci * taps)
    reset = _loop_cycles(cfg, rows)
    epilogue = alu_ops * _loop_cycles(cfg, rows)
    lat = cfg.dram_latency
    e = spec.epilogue
    if e.bias or e.scale:  # per tile, tco accumulator elements each
        epilogue += (e.bias + e.scale) * _load_cycles(cfg, 1, tco, cfg.acc_elem_bytes, 0)
    if e.residual:  # per tile, int8 rows into the accumulator (on compute)
        epilogue += _load_cycles(cfg, tco * th, tw, oeb, 0)
    if tw == ow:
        store = _store_cycles(cfg, tco, th * tw, oeb)
    else:
        store = _store_cycles(cfg, tco * th, tw, oeb)
    # Each thread's kernels are loaded into the UOP buffer on first use.
    uops_first = vt * ((_gemm_uops(spec, k) + lat + 8) + (alu_ops + 1) * (_alu_uops(k) + lat + 8))

    def simulate(n_groups: int) -> float:
        free = [0, uops_first, 0]  # load, compute, store: the cycle each is free

        def run(module: int, dur: float, ready: float) -> float:
            t0 = max(free[module], ready) + 1
            free[module] = t0 + dur
            return t0 + dur

        last_gemm, last_store = [0] * vt, [0] * vt
        for gi in range(n_groups):
            tiles = order[gi % len(order)]
            for step in range(steps):
                loaded = []
                for t, (c, y, x) in enumerate(tiles):
                    run(0, inp_load(y, x), last_gemm[t])  # one LOAD per input block
                    for _ in range(tci - 1):
                        run(0, inp_load(y, x), 0)
                    loaded.append(run(0, wgt_load, 0))
                for t in range(vt):
                    if step == 0:
                        run(1, reset, last_store[t])
                    last_gemm[t] = run(1, gemm, loaded[t])
            done = [run(1, epilogue, 0) for _ in range(vt)]
            for t in range(vt):
                last_store[t] = run(2, store, done[t])
        return max(free)

    if total_groups <= groups:
        return float(simulate(total_groups))
    half = groups // 2
    a, b = simulate(half), simulate(groups)
    return b + (total_groups - groups) * (b - a) / (groups - half)


def measure_conv(cfg: HwConfig, spec: ConvSpec, knobs: ConvKnobs, *, seed: int = 0,
                 timing=None) -> dict:
    """Run the layer with random data on the cycle model (under ``timing``, a
    celosia.sim.cycle_timing.Timing, if given); its counters."""
    from celosia.driver import Device

    from .ops import pack_bias, pack_nchw, pack_oihw

    rng = np.random.default_rng(seed)
    b, k = cfg.batch, cfg.block
    fn = conv2d(cfg, spec, knobs)
    args = [pack_nchw(rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8), b, k),
            pack_oihw(rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8), k)]
    if spec.epilogue.bias:  # (a bias table's shape: the function's own)
        args.append(rng.integers(-999, 999, fn.func.params[2].shape).astype(np.int32))
    if spec.epilogue.scale:
        args.append(pack_bias(rng.integers(1, 999, spec.o).astype(np.int32), b, k))
    if spec.epilogue.residual:
        args.append(np.zeros((spec.n // b, spec.o // k, spec.oh, spec.ow, b, k), np.int8))
    args.append(np.zeros((spec.n // b, spec.o // k, spec.oh, spec.ow, b, k), np.int8))
    size = sum(a.nbytes for a in args) * 2 + (8 << 20)
    options = {} if timing is None else {"timing": timing}
    return fn(Device(cfg, target="cycle", dram_size=size, **options), *args)


def _sources_hash() -> str:
    """A hash of the code a choice depends on (the schedules and the passes that turn them
    into programs, the search, the cycle model), so a cached choice is not reused after any
    of them changes."""
    import celosia.compiler.accel.codegen as codegen_vta
    import celosia.compiler.accel.dma as inject_dma
    import celosia.compiler.accel.ops as ops
    import celosia.compiler.accel.storage as storage
    import celosia.compiler.accel.tensorize as kernels
    import celosia.compiler.accel.vthread as vthread
    import celosia.compiler.tensor.lower as lower
    import celosia.sim.cycle as cycle
    import celosia.sim.cycle_timing as timing

    digest = hashlib.sha256()
    for module in (ops, lower, inject_dma, kernels, vthread, storage, codegen_vta, cycle,
                   timing, sys.modules[__name__]):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


def _key(cfg: HwConfig, spec: ConvSpec, vthreads: bool, top: int) -> str:
    text = json.dumps({"v": _VERSION, "src": _sources_hash(), "cfg": cfg.to_dict(),
                       "spec": asdict(spec), "vthreads": vthreads, "top": top},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def tune_conv(cfg: HwConfig, spec: ConvSpec, *, vthreads: bool = True, top: int = 8,
              use_cache: bool = True) -> tuple[ConvKnobs, dict]:
    """The fastest knobs found and their cycle-model counters.

    Every candidate is estimated (``estimate_conv``); at most ``top`` of the best, and only
    those within ``_MARGIN`` of the best estimate, are measured on the cycle model.
    ``vthreads=False`` searches the single-threaded schedules only; ``vthreads=True`` all of
    them (threads on output channel blocks or rows, or none when that is faster)."""
    path = cache_dir() / f"conv-{_key(cfg, spec, vthreads, top)}.json"

    def ranked():
        candidates = conv_candidates(cfg, spec, vthreads=vthreads)
        if not candidates:
            raise CompilerError(f"no schedule of {spec} fits this configuration's buffers")
        estimates = {k: estimate_conv(cfg, spec, k) for k in candidates}
        ranked = sorted(candidates, key=estimates.get)
        cutoff = estimates[ranked[0]] * (1 + _MARGIN)
        return ranked, len([k for k in ranked[:max(1, top)] if estimates[k] <= cutoff])

    return search_cached(path, use_cache, ConvKnobs, ranked,
                         functools.partial(measure_conv, cfg, spec), spec)


# How a search measures its pool of candidates: None, one after another in this process;
# else a function (measure, [knobs]) -> [counters or CompilerError], which
# celosia.sweep.measure.through sets to run them at once on a sweep engine (local worker
# processes or Ray tasks). The choice is the same either way (search_cached).
_MEASURE_MAP = None


def set_measure_map(mapper):
    """Set how searches measure their pools (None: in this process); the previous one."""
    global _MEASURE_MAP
    previous, _MEASURE_MAP = _MEASURE_MAP, mapper
    return previous


def search_cached(path: Path, use_cache: bool, knobs_type, rank, measure, what) -> tuple:
    """The search every layer kind shares: the cached (knobs, counters) at ``path`` if
    ``use_cache`` and it exists; else ``rank()`` gives the candidates best estimate first
    and how many of them (the pool) to measure, each is measured (``measure(knobs)``, the
    cycle-model counters) and the fastest kept, written to ``path`` with ``use_cache``.
    Past the pool a candidate is measured only while none measured so far compiled."""
    if use_cache and path.exists():
        data = json.loads(path.read_text())
        return knobs_type(**data["knobs"]), data["stats"]
    ranked, pool = rank()
    # the pool measured at once when a measure map is set (the same counters, the same
    # choice: the fastest, the first in rank order among equals)
    at_once = _MEASURE_MAP(measure, ranked[:pool]) if _MEASURE_MAP and pool > 1 else None
    # (None from the map too: it could not send ``measure`` to its workers)
    best, errors = None, []
    for i, knobs in enumerate(ranked):
        if i >= pool and best is not None:
            break  # past the pool: only while nothing measured so far compiled
        try:
            if at_once is not None and i < pool:
                if isinstance(at_once[i], CompilerError):
                    raise at_once[i]
                stats = at_once[i]
            else:
                stats = measure(knobs)
        except CompilerError as e:  # (a candidate that does not compile: try the next one)
            errors.append(str(e))
            continue
        if best is None or stats["cycles"] < best[1]["cycles"]:
            best = (knobs, stats)
    if best is None:
        raise CompilerError(f"no candidate schedule of {what} compiled (the first: "
                            f"{errors[0]})")
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"knobs": asdict(best[0]), "stats": best[1]}, indent=1))
    return best
