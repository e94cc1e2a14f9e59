"""Schedule search: choose a layer's knobs (tiles, virtual threads) on the cycle model.

Candidates are the knob combinations whose buffers fit the configuration. An analytic
estimate (compute time against DRAM traffic, both in cycles) ranks them; the best few are
compiled and run on the cycle model, and the fastest wins. Results are cached on disk by
a hash of the configuration, the layer and the search settings, so a second search of the
same layer is a file read.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

from celosia.config import HwConfig

from .expr import CompilerError
from .ops import ConvKnobs, ConvSpec, conv2d

__all__ = ["conv_candidates", "estimate_conv", "measure_conv", "tune_conv", "cache_dir"]

_VERSION = 1  # bump when schedules change, so cached choices are not reused


def cache_dir() -> Path:
    root = os.environ.get("CELOSIA_CACHE") or Path.home() / ".cache" / "celosia"
    return Path(root) / "tune"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _rows(cfg: HwConfig, spec: ConvSpec, k: ConvKnobs) -> dict:
    """SRAM rows a schedule holds at once, per buffer."""
    in_h = (k.tile_h - 1) * spec.stride + spec.kh
    in_w = (k.tile_w - 1) * spec.stride + spec.kw
    extra_acc = k.tile_co * (spec.epilogue.bias + spec.epilogue.scale) + \
        (k.tile_co * k.tile_h * k.tile_w if spec.epilogue.residual else 0)
    return {
        "inp": k.vthreads * k.tile_ci * in_h * in_w,
        "wgt": k.vthreads * k.tile_co * k.tile_ci * spec.kh * spec.kw,
        "acc": k.vthreads * (k.tile_co * k.tile_h * k.tile_w + extra_acc),
        "uop": k.tile_ci * spec.kh * spec.kw * k.tile_w,
    }


def conv_candidates(cfg: HwConfig, spec: ConvSpec, *, vthreads: bool = True) -> list[ConvKnobs]:
    ob, cb = spec.o // cfg.block, spec.c // cfg.block
    limit = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth,
             "uop": cfg.uop_depth // 2}
    out = []
    widths = [w for w in _divisors(spec.ow) if w >= min(spec.ow, 7)]
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
                        if all(rows[b] <= limit[b] for b in rows):
                            out.append(knobs)
    return out


def estimate_conv(cfg: HwConfig, spec: ConvSpec, k: ConvKnobs) -> float:
    """Estimated cycles: GEMM and ALU work, and DRAM transfers priced the way the hardware
    reads (one burst at a time, each paying the DRAM latency; an input row per burst),
    overlapped when there are two threads."""
    tiles = (spec.oh // k.tile_h) * (spec.ow // k.tile_w) * (spec.o // cfg.block // k.tile_co)
    steps = tiles * (spec.c // cfg.block // k.tile_ci)
    in_h = (k.tile_h - 1) * spec.stride + spec.kh
    in_w = (k.tile_w - 1) * spec.stride + spec.kw
    lat = cfg.dram_latency
    inp_bytes = k.tile_ci * in_h * in_w * cfg.inp_elem_bytes
    inp_bursts = k.tile_ci * in_h
    wgt_bytes = k.tile_co * k.tile_ci * spec.kh * spec.kw * cfg.wgt_elem_bytes
    wgt_bursts = -(-wgt_bytes // (256 * cfg.bus_bytes))
    traffic = steps * ((inp_bytes + wgt_bytes) / cfg.bus_bytes + (inp_bursts + wgt_bursts) * lat)
    out_rows = spec.n * spec.o * spec.oh * spec.ow // cfg.block
    traffic += out_rows * cfg.out_elem_bytes / cfg.bus_bytes + tiles * k.tile_co * lat
    alu_ops = 2 + bool(spec.epilogue.shift) + bool(spec.epilogue.bias) \
        + (spec.epilogue.multiplier is not None) + spec.epilogue.scale + spec.epilogue.residual
    compute = spec.macs / cfg.macs_per_cycle + out_rows * alu_ops + steps * 20
    if k.vthreads > 1:
        return max(compute, traffic) + traffic / steps
    return compute + traffic


def measure_conv(cfg: HwConfig, spec: ConvSpec, knobs: ConvKnobs, *, seed: int = 0) -> dict:
    """Run the layer with random data on the cycle model; its counters."""
    from celosia.driver import Device

    from .ops import pack_bias, pack_nchw, pack_oihw

    rng = np.random.default_rng(seed)
    b, k = cfg.batch, cfg.block
    fn = conv2d(cfg, spec, knobs)
    args = [pack_nchw(rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8), b, k),
            pack_oihw(rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8), k)]
    if spec.epilogue.bias:
        args.append(pack_bias(rng.integers(-999, 999, spec.o).astype(np.int32), b, k))
    if spec.epilogue.scale:
        args.append(pack_bias(rng.integers(1, 999, spec.o).astype(np.int32), b, k))
    if spec.epilogue.residual:
        args.append(np.zeros((spec.n // b, spec.o // k, spec.oh, spec.ow, b, k), np.int8))
    args.append(np.zeros((spec.n // b, spec.o // k, spec.oh, spec.ow, b, k), np.int8))
    size = sum(a.nbytes for a in args) * 2 + (8 << 20)
    return fn(Device(cfg, target="cycle", dram_size=size), *args)


def _sources_hash() -> str:
    """A hash of the code a measurement depends on (schedules, cycle model), so a cached
    choice is not reused after either changes."""
    import celosia.compiler.ops as ops
    import celosia.sim.cycle as cycle
    import celosia.sim.cycle_timing as timing

    digest = hashlib.sha256()
    for module in (ops, cycle, timing):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


def _key(cfg: HwConfig, spec: ConvSpec, vthreads: bool, top: int) -> str:
    text = json.dumps({"v": _VERSION, "src": _sources_hash(), "cfg": cfg.to_dict(),
                       "spec": asdict(spec), "vthreads": vthreads, "top": top},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def tune_conv(cfg: HwConfig, spec: ConvSpec, *, vthreads: bool = True, top: int = 8,
              use_cache: bool = True) -> tuple[ConvKnobs, dict]:
    """The fastest knobs found and their cycle-model counters."""
    path = cache_dir() / f"conv-{_key(cfg, spec, vthreads, top)}.json"
    if use_cache and path.exists():
        data = json.loads(path.read_text())
        return ConvKnobs(**data["knobs"]), data["stats"]
    candidates = conv_candidates(cfg, spec, vthreads=vthreads)
    if not candidates:
        raise CompilerError(f"no schedule of {spec} fits this configuration's buffers")
    if vthreads:  # the threaded schedules only, to measure what threads bring
        candidates = [k for k in candidates if k.vthreads > 1] or candidates
    ranked = sorted(candidates, key=lambda k: estimate_conv(cfg, spec, k))
    pool = ranked[:top]
    best = None
    for knobs in pool:
        try:
            stats = measure_conv(cfg, spec, knobs)
        except CompilerError:
            continue
        if best is None or stats["cycles"] < best[1]["cycles"]:
            best = (knobs, stats)
    if best is None:
        raise CompilerError(f"no candidate schedule of {spec} compiled")
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"knobs": asdict(best[0]), "stats": best[1]}, indent=1))
    return best
