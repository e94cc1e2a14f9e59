"""Program images saved by the driver, and the errors of bad builder calls."""

import numpy as np
import pytest

from celosia.config import HwConfig
from celosia.driver import Device
from celosia.errors import CelosiaError
from celosia.image import ProgramImage
from celosia.isa import AluOp, MemType, Module
from celosia.sim.base import make_executor, run_image

C, L, S = Module.COMPUTE, Module.LOAD, Module.STORE


def build_gemm(dev, seed=0):
    """A small GEMM + ReLU program; returns the output buffer."""
    cfg = dev.config
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (2, 1, cfg.batch, cfg.block), dtype=np.int8)
    w = rng.integers(-128, 128, (2, 1, cfg.block, cfg.block), dtype=np.int8)
    bx, bw = dev.upload(x), dev.upload(w, align=cfg.wgt_elem_bytes)
    out = dev.alloc(4 * cfg.out_elem_bytes)
    dev.load_2d(bx, 0, 2, 1, 2, sram_index=0, mem_type=MemType.INP)
    dev.load_2d(bw, 0, 2, 1, 2, sram_index=0, mem_type=MemType.WGT)
    dev.dep_push(L, C)
    dev.dep_pop(L, C)
    dev.gemm("reset", lambda k: (k.loop(4, 1, 0), k.push(0, 0)), reset=True)
    dev.gemm("mm", lambda k: (k.loop(2, 2, 1), k.push(0, 0, 0), k.push(1, 0, 1)))
    dev.alu("relu", lambda k: (k.loop(4, 1, 1), k.push(0, 0)), AluOp.MAX, imm=0)
    dev.dep_push(C, S)
    dev.dep_pop(C, S)
    dev.store_2d(0, out, 0, 4, 1, 4)
    ref = np.einsum("mkbc,nkoc->mnbo", x.astype(np.int64), w.astype(np.int64))
    return out, np.maximum(ref, 0).astype(np.int8)


@pytest.mark.parametrize("preset", ["default", "small"])
def test_image_reproduces_the_run(tmp_path, preset):
    dev = Device(preset, dram_size=1 << 20)
    out, want = build_gemm(dev)
    path = tmp_path / "gemm.npz"
    stats = dev.synchronize(image=path)
    np.testing.assert_array_equal(out.read(np.int8, want.shape), want)
    image = ProgramImage.load(path)
    assert image.dram.size == dev.allocator.high_water  # trimmed to the high-water mark
    final, image_stats = run_image(image, "fsim", dev.config)
    np.testing.assert_array_equal(final, dev.executor.read_dram(0, image.dram.size))
    assert image_stats == stats


def test_save_image_keeps_the_stream(tmp_path):
    dev = Device("small", dram_size=1 << 20)
    out, want = build_gemm(dev)
    pending = dev.instructions
    image = dev.save_image(tmp_path / "pending.npz")
    assert dev.instructions == pending
    final, _ = run_image(image, "fsim", dev.config)
    got = final[out.addr:out.addr + want.nbytes].view(np.int8).reshape(want.shape)
    np.testing.assert_array_equal(got, want)
    dev.synchronize()  # the same program still runs on the device itself
    np.testing.assert_array_equal(out.read(np.int8, want.shape), want)


def test_instruction_buffer_grows():
    dev = Device("small", dram_size=1 << 20)
    buf = dev.alloc(16)
    dev.load_2d(buf, 0, 1, 1, 1, sram_index=0, mem_type=MemType.ACC)
    dev.synchronize()
    first = dev._insn_buf.nbytes
    for _ in range(200):
        dev.load_2d(buf, 0, 1, 1, 1, sram_index=0, mem_type=MemType.ACC)
    stats = dev.synchronize()
    assert dev._insn_buf.nbytes > first and stats["insn_count"] == 200 + 4
    assert dev._insn_buf.addr % 16 == 0


def test_device_with_an_executor_and_config_spellings(tmp_path):
    cfg = HwConfig.preset("small")
    ex = make_executor("fsim", cfg, 1 << 16)
    dev = Device(cfg, ex)
    assert dev.executor is ex and dev.allocator.size == 1 << 16
    with pytest.raises(CelosiaError, match="different configuration"):
        Device("default", ex)
    path = tmp_path / "vta_config.json"
    path.write_text('{"LOG_INP_WIDTH": 3, "LOG_WGT_WIDTH": 3, "LOG_ACC_WIDTH": 5, "LOG_BATCH": 0,'
                    ' "LOG_BLOCK": 3, "LOG_UOP_BUFF_SIZE": 12, "LOG_INP_BUFF_SIZE": 12,'
                    ' "LOG_WGT_BUFF_SIZE": 14, "LOG_ACC_BUFF_SIZE": 14}')
    assert Device(path, dram_size=1 << 16).config.block == 8
    assert Device(dram_size=1 << 16).config == HwConfig()
    with pytest.raises(CelosiaError, match="unknown target 'nope'"):
        Device(None, "nope")
    with pytest.raises(CelosiaError, match="neither a preset"):
        Device("no-such-preset")


# ---- argument errors ---------------------------------------------------------------------

@pytest.fixture
def dev():
    d = Device("default", dram_size=1 << 20)
    d.buf = d.alloc(64 * 64, align=256)  # 64 ACC elements, 256 INP elements
    return d


LOAD_ERRORS = [
    (dict(sram_index=2048), r"load_2d: sram_index must be in \[0, 2047\], not 2048"),
    (dict(sram_index=-1), "sram_index must be in"),
    (dict(sram_index=2047, x_size=2), r"2 ACC rows from sram_index=2047 run past the end of the "
                                      r"ACC buffer \(2048 rows\)"),
    (dict(x_size=0), r"x_size must be in \[1, 65535\], not 0"),
    (dict(x_size=1 << 16), "x_size must be in"),
    (dict(y_size=0), "y_size must be in"),
    (dict(x_stride=-1), "x_stride must be in"),
    (dict(x_pad_0=16), r"x_pad_0 must be in \[0, 15\], not 16"),
    (dict(y_pad_1=-1), "y_pad_1 must be in"),
    (dict(mem_type=MemType.OUT), "mem_type must be one of MemType.INP, MemType.WGT, "
                                 "MemType.ACC, MemType.ACC_8BIT"),
    (dict(mem_type=MemType.UOP), "mem_type must be one of"),
    (dict(mem_type=9), "mem_type must be one of"),
    (dict(elem_offset=60, x_size=5), r"reaches ACC element 64 of the buffer .* past its end "
                                     r"\(64 elements of 64 bytes\)"),
    (dict(elem_offset=-1), "elem_offset must be in"),
    (dict(y_size=3, x_stride=40), "past its end"),
    (dict(x_size=True), "x_size must be an integer"),
]


@pytest.mark.parametrize("override,match", LOAD_ERRORS)
def test_load_2d_errors(dev, override, match):
    args = dict(elem_offset=0, x_size=1, y_size=1, x_stride=1, sram_index=0, mem_type=MemType.ACC)
    args.update(override)
    with pytest.raises(CelosiaError, match=match):
        dev.load_2d(dev.buf, args.pop("elem_offset"), args.pop("x_size"), args.pop("y_size"),
                    args.pop("x_stride"), **args)
    assert dev.instructions == []


def test_load_2d_buffer_errors(dev):
    small = Device("small", dram_size=1 << 16)
    with pytest.raises(CelosiaError, match="buf must be a DramBuffer"):
        dev.load_2d(np.zeros(4), 0, 1, 1, 1, sram_index=0, mem_type=MemType.INP)
    with pytest.raises(CelosiaError, match="belongs to another Device"):
        dev.load_2d(small.alloc(64), 0, 1, 1, 1, sram_index=0, mem_type=MemType.INP)
    freed = dev.alloc(64)
    dev.free(freed)
    with pytest.raises(CelosiaError, match="load_2d: .* was freed"):
        dev.load_2d(freed, 0, 1, 1, 1, sram_index=0, mem_type=MemType.INP)
    dev.alloc(16, align=16)
    odd = dev.alloc(16, align=16)
    assert odd.addr % 256
    with pytest.raises(CelosiaError, match="not aligned to the 256-byte WGT element"):
        dev.load_2d(odd, 0, 1, 1, 1, sram_index=0, mem_type=MemType.WGT)
    # Padding counts towards the SRAM range: 16 rows of 16 INP elements from row 1800.
    with pytest.raises(CelosiaError, match="256 INP rows from sram_index=1800"):
        dev.load_2d(dev.buf, 0, 14, 14, 14, x_pad_0=1, x_pad_1=1, y_pad_0=1, y_pad_1=1,
                    sram_index=1800, mem_type=MemType.INP)


def test_store_2d_errors(dev):
    with pytest.raises(CelosiaError, match="store_2d: mem_type must be one of MemType.OUT"):
        dev.store_2d(0, dev.buf, 0, 1, 1, 1, mem_type=MemType.ACC)
    with pytest.raises(CelosiaError, match="4 OUT rows from sram_index=2046 run past the end"):
        dev.store_2d(2046, dev.buf, 0, 2, 2, 2)
    with pytest.raises(CelosiaError, match="store_2d: the access reaches OUT element 256"):
        dev.store_2d(0, dev.buf, 250, 7, 1, 7)
    with pytest.raises(CelosiaError, match=r"store_2d: x_size must be in \[1, 65535\]"):
        dev.store_2d(0, dev.buf, 0, 0, 1, 1)
    assert dev.instructions == []


def test_package_docstring_example():
    import doctest

    import celosia.driver

    result = doctest.testmod(celosia.driver, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 5 and result.failed == 0
