"""Micro-op kernels: host cache, record-time checks, on-chip residency and eviction."""

import numpy as np
import pytest

from celosia.driver import Device, KernelError, KernelMode, UopCache, UopKernelBuilder
from celosia.errors import CelosiaError
from celosia.isa import AluInsn, AluOp, GemmInsn, MemInsn, MemType, Module, Opcode


def uop_loads(dev):
    return [i for i in dev.instructions
            if isinstance(i, MemInsn) and i.mem_type == MemType.UOP and i.x_size]


def add_kernel(n, rows):
    """n micro-ops adding 1 to ACC rows i % rows: row r gets +count(i % rows == r)."""
    def record(k):
        for i in range(n):
            k.push(i % rows, 0)
    return record


def test_record_once_and_reuse_without_reload(dev_default):
    dev = dev_default
    calls = []

    def record(k):
        calls.append(1)
        k.loop(4, 1, 1)
        k.push(0, 0)

    first = dev.alu("k", record, AluOp.ADD, imm=1)
    second = dev.alu("k", record, AluOp.ADD, imm=1)
    assert first is second and len(calls) == 1
    assert len(uop_loads(dev)) == 1
    dev.alu("other", lambda k: k.push(1, 0), AluOp.ADD, imm=1)
    dev.alu("k", None, AluOp.ADD, imm=1)  # resident, no record needed
    assert len(uop_loads(dev)) == 2
    alus = [i for i in dev.instructions if isinstance(i, AluInsn)]
    assert [(a.uop_bgn, a.uop_end) for a in alus] == [(0, 1), (0, 1), (1, 2), (0, 1)]
    assert (alus[0].iter_out, alus[0].iter_in) == (1, 4)  # one ALU loop is the inner loop


def test_residency_forgotten_at_synchronize(dev_default):
    dev = dev_default
    dev.alu("k", lambda k: k.push(0, 0), AluOp.ADD, imm=1)
    dev.synchronize()
    dev.alu("k", None, AluOp.ADD, imm=1)
    assert len(uop_loads(dev)) == 1
    dev.synchronize()


def test_eviction_when_full(dev_small):
    """UOP depth 256: A (200) then B (100) wraps to 0 and evicts A; A again evicts B."""
    dev = dev_small
    cfg = dev.config
    assert cfg.uop_depth == 256
    rows = 8
    x = np.zeros((rows, cfg.batch, cfg.block), np.int32)
    src, out = dev.upload(x), dev.alloc(rows * cfg.out_elem_bytes)
    dev.load_2d(src, 0, rows, 1, rows, sram_index=0, mem_type=MemType.ACC)
    dev.alu("A", add_kernel(200, rows), AluOp.ADD, imm=1)
    dev.alu("C", add_kernel(40, rows), AluOp.ADD, imm=1)  # fits after A: [200, 240)
    dev.alu("B", add_kernel(100, rows), AluOp.ADD, imm=1)  # wraps to [0, 100): evicts A only
    dev.alu("C", None, AluOp.ADD, imm=1)  # still resident
    dev.alu("A", None, AluOp.ADD, imm=1)  # [100, 300) does not fit: [0, 200), evicts B
    dev.alu("C", None, AluOp.ADD, imm=1)  # still resident at [200, 240)
    dev.alu("B", None, AluOp.ADD, imm=1)  # [200, 300) does not fit: [0, 100), evicts A
    loads = uop_loads(dev)
    assert [(u.sram_base, u.x_size) for u in loads] == [(0, 200), (200, 40), (0, 100), (0, 200),
                                                        (0, 100)]
    # A is staged once per run: both of its loads read the same DRAM words.
    assert loads[0].dram_base == loads[3].dram_base
    ranges = [(i.uop_bgn, i.uop_end) for i in dev.instructions if isinstance(i, AluInsn)]
    assert ranges == [(0, 200), (200, 240), (0, 100), (200, 240), (0, 200), (200, 240),
                      (0, 100)]
    dev.dep_push(Module.COMPUTE, Module.STORE)
    dev.dep_pop(Module.COMPUTE, Module.STORE)
    dev.store_2d(0, out, 0, rows, 1, rows)
    stats = dev.synchronize()
    assert stats["uop_load_bytes"] == 4 * (200 + 40 + 100 + 200 + 100)
    calls = {200: 2, 40: 3, 100: 2}  # kernel size -> times run
    per_row = np.array([sum(c * (n // rows + (n % rows > r)) for n, c in calls.items())
                        for r in range(rows)])
    got = out.read(np.int8, x.shape)
    np.testing.assert_array_equal(got[:, 0, 0], per_row.astype(np.int8))


def test_uop_cache_model():
    cache = UopCache(10)
    assert cache.place("a", 6) == (0, 6)
    assert cache.place("b", 3) == (6, 9)
    assert cache.place("c", 2) == (0, 2)  # 9 + 2 > 10: wraps, evicts a
    assert cache.lookup("a") is None and cache.lookup("b") == (6, 9)
    assert cache.place("d", 5) == (2, 7)  # evicts b
    assert set(cache.resident) == {"c", "d"}
    with pytest.raises(KernelError, match="kernel of 11 micro-ops does not fit"):
        cache.place("e", 11)
    cache.clear()
    assert cache.resident == {}


def test_kernel_larger_than_uop_buffer(dev_small):
    with pytest.raises(KernelError, match="257 micro-ops do not fit the 256-entry UOP buffer"):
        dev_small.alu("big", add_kernel(257, 4), AluOp.ADD, imm=1)


def test_gemm_loop_mapping_and_kernel_record(dev_default):
    dev = dev_default

    def rec(k):
        k.loop(3, 4, 5, 6)
        k.loop(2, 1, 1, 1)
        k.push(7, 8, 9)

    kernel = dev.gemm("g", rec)
    assert kernel.mode == KernelMode.GEMM and len(kernel) == 1
    g = [i for i in dev.instructions if isinstance(i, GemmInsn)][0]
    assert (g.iter_out, g.iter_in) == (3, 2)
    assert (g.dst_factor_out, g.src_factor_out, g.wgt_factor_out) == (4, 5, 6)
    assert (g.dst_factor_in, g.src_factor_in, g.wgt_factor_in) == (1, 1, 1)
    dev.gemm("one", lambda k: (k.loop(5, 1, 1, 1), k.push(0, 0, 0)))
    g1 = [i for i in dev.instructions if isinstance(i, GemmInsn)][1]
    assert (g1.iter_out, g1.iter_in) == (5, 1)  # one GEMM loop is the outer loop
    assert dev.kernels["g"] is kernel


def test_kernel_reuse_with_different_signature(dev_default):
    dev = dev_default
    dev.gemm("k", lambda k: k.push(0, 0, 0))
    with pytest.raises(KernelError, match=r"key 'k' was recorded as GEMM kernel \(reset=False\), "
                                          r"but this call asks for GEMM kernel \(reset=True\)"):
        dev.gemm("k", None, reset=True)
    with pytest.raises(KernelError, match="recorded as GEMM"):
        dev.alu("k", None, AluOp.ADD, imm=1)
    dev.alu("a", lambda k: k.push(0, 0), AluOp.ADD, imm=1)
    with pytest.raises(KernelError, match=r"ALU ADD kernel \(imm=1\).*ALU ADD kernel \(imm=2\)"):
        dev.alu("a", None, AluOp.ADD, imm=2)
    with pytest.raises(KernelError, match="tensor operand"):
        dev.alu("a", None, AluOp.ADD)


@pytest.mark.parametrize("record,match", [
    (lambda k: None, "pushed no micro-op"),
    (lambda k: (k.loop(2, 1, 1), k.loop(2, 1, 1), k.loop(2, 1, 1)), "at most 2 loop levels"),
    (lambda k: (k.push(0, 0), k.loop(2, 1, 1)), "loops must be declared before the first push"),
    (lambda k: k.loop(0, 1, 1), r"extent must be an integer in \[1, 16383\]"),
    (lambda k: k.loop(1 << 14, 1, 1), "extent"),
    (lambda k: k.loop(2, 1 << 11, 1), r"dst_factor=2048 is outside \[0, 2048\)"),
    (lambda k: k.push(2048, 0), r"dst=2048 is outside \[0, 2048\)"),
    (lambda k: k.push(0, -1), "src=-1 is outside"),
    (lambda k: k.push(0, 0, 1024), "wgt=1024 is outside"),
    (lambda k: (k.loop(2048, 1, 0), k.push(1, 0)), "dst reaches ACC row 2048 after the loops"),
    (lambda k: (k.loop(3, 0, 1000), k.push(0, 100)), "src reaches INP row 2100"),
    (lambda k: k.push("x", 0), "dst must be an integer"),
])
def test_gemm_record_errors(dev_default, record, match):
    with pytest.raises(KernelError, match=match):
        dev_default.gemm("bad", record)
    assert "bad" not in dev_default.kernels and not dev_default.instructions


def test_alu_record_errors(dev_default):
    dev = dev_default
    with pytest.raises(KernelError, match="wgt must be 0 in an ALU kernel"):
        dev.alu("x", lambda k: k.push(0, 0, 1), AluOp.ADD, imm=1)
    with pytest.raises(KernelError, match="wgt_factor must be 0 in an ALU kernel"):
        dev.alu("x", lambda k: (k.loop(2, 1, 1, 1), k.push(0, 0)), AluOp.ADD)
    # ALU sources index ACC (2048 rows), not INP.
    dev.alu("ok", lambda k: k.push(0, 2047), AluOp.ADD)
    with pytest.raises(CelosiaError, match=r"alu: imm must be in \[-32768, 32767\], not 32768"):
        dev.alu("y", lambda k: k.push(0, 0), AluOp.ADD, imm=32768)
    with pytest.raises(CelosiaError, match="op must be an AluOp"):
        dev.alu("y", lambda k: k.push(0, 0), 7)
    with pytest.raises(CelosiaError, match="key must be hashable"):
        dev.alu(["list"], lambda k: k.push(0, 0), AluOp.ADD)
    with pytest.raises(CelosiaError, match="is not recorded yet"):
        dev.alu("never", None, AluOp.ADD)


def test_builder_standalone():
    cfg = Device("small", dram_size=4096).config
    b = UopKernelBuilder(cfg, KernelMode.ALU, alu_op=AluOp.MUL, imm=-3)
    b.loop(4, 2, 2)
    b.push(1, 1)
    kernel = b.build()
    insn = kernel.instruction(uop_bgn=10)
    assert isinstance(insn, AluInsn) and insn.alu_op == AluOp.MUL and insn.use_imm
    assert (insn.imm, insn.uop_bgn, insn.uop_end, insn.iter_out, insn.iter_in) == (-3, 10, 11, 1, 4)
    assert insn.opcode == Opcode.ALU
