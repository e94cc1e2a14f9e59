"""VTA's instruction unit tests (test_vta_insn.py), written through the driver API.

Every case builds its program with load_2d / gemm / alu / store_2d and dependency tokens,
runs it on fsim and compares the int8 output (or the full 32-bit accumulators, read back
one byte at a time) with numpy, bit for bit. Each runs on the default configuration and on
the small preset (1x4x4).
"""

import numpy as np
import pytest

from celosia.isa import AluOp, MemType, Module

C, L, S = Module.COMPUTE, Module.LOAD, Module.STORE


# ---- numpy references ----------------------------------------------------------------------

def wrap32(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.int64)
    return ((v + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def alu_ref(op: AluOp, x, y) -> np.ndarray:
    """ISA.md section 4, on int32 lanes (y broadcasts)."""
    x = np.asarray(x, np.int64)
    y = np.broadcast_to(np.asarray(y, np.int64), x.shape)
    if op == AluOp.MIN:
        return wrap32(np.minimum(x, y))
    if op == AluOp.MAX:
        return wrap32(np.maximum(x, y))
    if op == AluOp.ADD:
        return wrap32(x + y)
    if op == AluOp.MUL:
        return wrap32(x * y)
    right = x >> np.minimum(np.maximum(y, 0), 31)
    left = x << np.minimum(np.maximum(-y, 0), 31)
    return wrap32(np.where(y >= 0, right, left))


def rand_acc(rng, cfg, rows, lo=-(1 << 31), hi=1 << 31):
    return rng.integers(lo, hi, (rows, cfg.batch, cfg.block), dtype=np.int64).astype(np.int32)


def sync_compute_to_store(dev):
    dev.dep_push(C, S)
    dev.dep_pop(C, S)


def copy_rows_kernel(rows, src_offset=0, *, two_loops=None):
    """Record ``rows`` ALU micro-op executions dst=i, src=src_offset+i (one or two loops)."""
    def record(k):
        if two_loops:
            outer, inner = two_loops
            assert outer * inner == rows
            k.loop(outer, inner, inner)
            k.loop(inner, 1, 1)
        else:
            k.loop(rows, 1, 1)
        k.push(0, src_offset)
    return record


def run_alu_chain(dev, x, ops, *, y=None, two_loops=None):
    """x (rows, B, N) int32 into ACC; apply ``ops`` [(AluOp, imm or None)] in place (with y
    as the tensor operand); returns the stored int8 OUT rows."""
    cfg = dev.config
    rows = x.shape[0]
    bx = dev.upload(x)
    out = dev.alloc(rows * cfg.out_elem_bytes)
    dev.load_2d(bx, 0, rows, 1, rows, sram_index=0, mem_type=MemType.ACC)
    if y is not None:
        by = dev.upload(y)
        dev.load_2d(by, 0, rows, 1, rows, sram_index=rows, mem_type=MemType.ACC)
    for i, (op, imm) in enumerate(ops):
        src = rows if imm is None else 0
        dev.alu(("chain", i, rows, op, imm), copy_rows_kernel(rows, src, two_loops=two_loops), op, imm=imm)
    sync_compute_to_store(dev)
    dev.store_2d(0, out, 0, rows, 1, rows)
    dev.synchronize()
    return out.read(np.int8, x.shape)


def run_alu_full32(dev, x, op, *, imm=None, y=None):
    """The full 32-bit result of one ALU op: four copies of x get the op, then copy j is
    shifted right by 8*j and stored, so OUT row j holds byte j of the accumulator."""
    cfg = dev.config
    rows = x.shape[0]
    bx = dev.upload(x)
    for j in range(4):
        dev.load_2d(bx, 0, rows, 1, rows, sram_index=j * rows, mem_type=MemType.ACC)
    def apply(k):  # 4 copies x rows: dst copy j row i, src = tensor copy j row i
        k.loop(4, rows, rows)
        k.loop(rows, 1, 1)
        k.push(0, 4 * rows)
    if y is not None:
        by = dev.upload(y)
        for j in range(4):
            dev.load_2d(by, 0, rows, 1, rows, sram_index=(4 + j) * rows, mem_type=MemType.ACC)
    dev.alu("full32-op", apply, op, imm=imm)
    for j in range(1, 4):
        def shift(k, j=j):  # copy j in place, so OUT row j*rows+i holds byte j
            k.loop(rows, 1, 1)
            k.push(j * rows, j * rows)
        dev.alu(("full32-byte", j), shift, AluOp.SHR, imm=8 * j)
    out = dev.alloc(4 * rows * cfg.out_elem_bytes)
    sync_compute_to_store(dev)
    dev.store_2d(0, out, 0, 4 * rows, 1, 4 * rows)
    dev.synchronize()
    got = out.read(np.uint8, (4, rows, cfg.batch, cfg.block)).astype(np.uint32)
    return sum(got[j] << (8 * j) for j in range(4)).astype(np.uint32).view(np.int32)


# ---- 1. save and load through ACC and OUT --------------------------------------------------

@pytest.mark.parametrize("two_loops", [None, (6, 6)])
def test_save_load_out(dev, two_loops):
    rng = np.random.default_rng(1)
    x = rand_acc(rng, dev.config, 36)
    got = run_alu_chain(dev, x, [(AluOp.SHR, 0)], two_loops=two_loops)
    np.testing.assert_array_equal(got, x.astype(np.int8))  # truncation, not saturation


# ---- 2. padded loads ---------------------------------------------------------------------------

PADS = {
    "y_pad_0": dict(y_pad_0=2), "x_pad_0": dict(x_pad_0=2),
    "y_pad_1": dict(y_pad_1=2), "x_pad_1": dict(x_pad_1=2),
    "all": dict(y_pad_0=1, y_pad_1=1, x_pad_0=1, x_pad_1=1),
    "y15": dict(y_pad_0=15, y_pad_1=15), "x15": dict(x_pad_0=15, x_pad_1=15),
    "mixed": dict(y_pad_0=3, y_pad_1=0, x_pad_0=15, x_pad_1=1),
}


def _check_padded_load(dev, pads, h, w):
    cfg = dev.config
    yp0, yp1 = pads.get("y_pad_0", 0), pads.get("y_pad_1", 0)
    xp0, xp1 = pads.get("x_pad_0", 0), pads.get("x_pad_1", 0)
    hh, ww = h + yp0 + yp1, w + xp0 + xp1
    assert hh * ww <= cfg.acc_depth, "the test's padded block must fit the ACC buffer"
    rng = np.random.default_rng(2)
    # The source rows sit inside a wider DRAM tensor (stride 7) to exercise x_stride.
    src = rand_acc(rng, cfg, h * 7).reshape(h, 7, cfg.batch, cfg.block)
    bsrc = dev.upload(src)
    out = dev.alloc(hh * ww * cfg.out_elem_bytes)
    dev.load_2d(bsrc, 1, w, h, 7, sram_index=0, mem_type=MemType.ACC, **pads)
    dev.alu("copy", copy_rows_kernel(hh * ww), AluOp.SHR, imm=0)
    sync_compute_to_store(dev)
    dev.store_2d(0, out, 0, hh * ww, 1, hh * ww)
    dev.synchronize()
    got = out.read(np.int8, (hh, ww, cfg.batch, cfg.block))
    want = np.pad(src[:, 1:1 + w].astype(np.int8), ((yp0, yp1), (xp0, xp1), (0, 0), (0, 0)))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", list(PADS))
def test_padded_load(dev, name):
    # The small preset's ACC holds 128 rows: a smaller source block keeps pads of 15 inside it.
    h, w = (3, 5) if dev.config.acc_depth >= 1024 else (1, 2)
    _check_padded_load(dev, PADS[name], h, w)


def test_padded_load_15_on_every_side(dev_default):
    _check_padded_load(dev_default, dict(y_pad_0=15, y_pad_1=15, x_pad_0=15, x_pad_1=15), 3, 5)


def test_padded_load_inp_feeds_gemm(dev):
    """Padding also works for INP (zero rows contribute nothing to the GEMM)."""
    cfg = dev.config
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (2, cfg.batch, cfg.block), dtype=np.int8)
    wt = rng.integers(-128, 128, (1, cfg.block, cfg.block), dtype=np.int8)
    bx, bw = dev.upload(x), dev.upload(wt, align=cfg.wgt_elem_bytes)
    out = dev.alloc(4 * cfg.out_elem_bytes)
    dev.load_2d(bx, 0, 1, 2, 1, x_pad_0=1, sram_index=0, mem_type=MemType.INP)  # rows 0,2 zero
    dev.load_2d(bw, 0, 1, 1, 1, sram_index=0, mem_type=MemType.WGT)
    dev.dep_push(L, C)
    dev.dep_pop(L, C)
    dev.gemm("reset4", lambda k: (k.loop(4, 1, 0), k.push(0, 0)), reset=True)
    dev.gemm("mm4", lambda k: (k.loop(4, 1, 1), k.push(0, 0, 0)))
    sync_compute_to_store(dev)
    dev.store_2d(0, out, 0, 4, 1, 4)
    dev.synchronize()
    got = out.read(np.int8, (4, cfg.batch, cfg.block))
    inp = np.zeros((4, cfg.batch, cfg.block), np.int64)
    inp[1], inp[3] = x[0], x[1]
    want = np.einsum("rbc,oc->rbo", inp, wt[0].astype(np.int64)).astype(np.int8)
    np.testing.assert_array_equal(got, want)


# ---- 3. GEMM -----------------------------------------------------------------------------------

def gemm_reference(x, w, shift=8):
    """x (M, Kb, B, N) int8, w (Nb, Kb, N, N) int8 -> relu(clip(x.w >> shift)) as int8."""
    acc = np.einsum("mkbc,nkoc->mnbo", x.astype(np.int64), w.astype(np.int64))
    acc = wrap32(acc)
    return np.clip(acc >> shift, 0, 127).astype(np.int8)


def gemm_operands(cfg, m, kb, nb, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (m, kb, cfg.batch, cfg.block), dtype=np.int8)
    w = rng.integers(-128, 128, (nb, kb, cfg.block, cfg.block), dtype=np.int8)
    return x, w


def epilogue(dev, key, rows, base=0):
    """>> 8, max 0, min 127 over ACC rows [base, base + rows)."""
    def rec(k):
        k.loop(rows, 1, 1)
        k.push(base, base)
    dev.alu((key, "shr"), rec, AluOp.SHR, imm=8)
    dev.alu((key, "max"), rec, AluOp.MAX, imm=0)
    dev.alu((key, "min"), rec, AluOp.MIN, imm=127)


@pytest.mark.parametrize("m,kb,nb", [(4, 1, 4), (3, 2, 2)])
def test_gemm_default(dev, m, kb, nb):
    cfg = dev.config
    x, w = gemm_operands(cfg, m, kb, nb, seed=4)
    bx, bw = dev.upload(x), dev.upload(w, align=cfg.wgt_elem_bytes)
    out = dev.alloc(m * nb * cfg.out_elem_bytes)
    dev.load_2d(bx, 0, m * kb, 1, m * kb, sram_index=0, mem_type=MemType.INP)
    dev.load_2d(bw, 0, nb * kb, 1, nb * kb, sram_index=0, mem_type=MemType.WGT)
    dev.dep_push(L, C)
    dev.dep_pop(L, C)

    def reset(k):
        k.loop(m, nb, 0)
        for n in range(nb):
            k.push(n, 0)

    def mm(k):
        k.loop(m, nb, kb, 0)
        for n in range(nb):
            for ko in range(kb):
                k.push(n, ko, n * kb + ko)

    dev.gemm("reset", reset, reset=True)
    dev.gemm("mm", mm)
    epilogue(dev, "ep", m * nb)
    sync_compute_to_store(dev)
    dev.store_2d(0, out, 0, m * nb, 1, m * nb)
    stats = dev.synchronize()
    got = out.read(np.int8, (m, nb, cfg.batch, cfg.block))
    np.testing.assert_array_equal(got, gemm_reference(x, w))
    assert stats["gemm_uops"] == m * nb * kb
    assert stats["alu_uops"] == 3 * m * nb


def test_gemm_virtual_threads(dev):
    """Two virtual threads (halves of the batch axis), each with its own INP/WGT/ACC region,
    interleaved in one stream: load of one thread overlaps compute of the other, and the
    K loop reuses each thread's input buffers under compute->load tokens."""
    cfg = dev.config
    m, kb, nb = 4, 2, 2
    half = m // 2
    x, w = gemm_operands(cfg, m, kb, nb, seed=5)
    bx, bw = dev.upload(x), dev.upload(w, align=cfg.wgt_elem_bytes)
    out = dev.alloc(m * nb * cfg.out_elem_bytes)
    inp_rows, wgt_rows, acc_rows = half, nb, half * nb  # per thread and K chunk

    for t in range(2):  # reset each thread's accumulators
        def reset(k, t=t):
            k.loop(half, nb, 0)
            for n in range(nb):
                k.push(t * acc_rows + n, 0)
        dev.gemm(("reset", t), reset, reset=True)
    for ko in range(kb):
        for t in range(2):
            if ko:
                dev.dep_pop(C, L)  # wait until thread t's compute released its buffers
            # rows m in [t*half, (t+1)*half), chunk ko: stride kb elements in DRAM
            dev.load_2d(bx, t * half * kb + ko, 1, half, kb,
                        sram_index=t * inp_rows, mem_type=MemType.INP)
            dev.load_2d(bw, ko, 1, nb, kb, sram_index=t * wgt_rows, mem_type=MemType.WGT)
            dev.dep_push(L, C)
        for t in range(2):
            def mm(k, t=t):
                k.loop(half, nb, 1, 0)
                for n in range(nb):
                    k.push(t * acc_rows + n, t * inp_rows, t * wgt_rows + n)
            dev.dep_pop(L, C)
            dev.gemm(("mm", t), mm)
            dev.dep_push(C, L)
    for t in range(2):
        dev.dep_pop(C, L)  # absorb the tokens of the last K chunk
    for t in range(2):
        epilogue(dev, ("ep", t), acc_rows, base=t * acc_rows)
        dev.dep_push(C, S)
    for t in range(2):
        dev.dep_pop(C, S)
        dev.store_2d(t * acc_rows, out, t * acc_rows, acc_rows, 1, acc_rows)
    insns = dev.instructions
    assert sum(i.pop_next for i in insns if i.opcode.name == "LOAD"
               and i.mem_type in (MemType.INP, MemType.WGT)) == 3  # 2 in the loop + 1 NOP
    dev.synchronize()
    got = out.read(np.int8, (m, nb, cfg.batch, cfg.block))
    np.testing.assert_array_equal(got, gemm_reference(x, w))


# ---- 4. ALU ----------------------------------------------------------------------------------

ALU_IMM_CASES = [
    ("SHL", AluOp.SHR, -3), ("SHR", AluOp.SHR, 4), ("SHR31", AluOp.SHR, 40),
    ("SHL31", AluOp.SHR, -40), ("MAX", AluOp.MAX, 3), ("MIN", AluOp.MIN, -7),
    ("ADD", AluOp.ADD, 2), ("ADDneg", AluOp.ADD, -32768), ("MUL", AluOp.MUL, 32767),
    ("MULneg", AluOp.MUL, -3),
]


@pytest.mark.parametrize("name,op,imm", ALU_IMM_CASES, ids=[c[0] for c in ALU_IMM_CASES])
def test_alu_imm(dev, name, op, imm):
    x = rand_acc(np.random.default_rng(6), dev.config, 8)
    got = run_alu_full32(dev, x, op, imm=imm)
    np.testing.assert_array_equal(got, alu_ref(op, x, imm))


@pytest.mark.parametrize("op", list(AluOp), ids=[o.name for o in AluOp])
def test_alu_tensor(dev, op):
    rng = np.random.default_rng(7)
    x = rand_acc(rng, dev.config, 8)
    y = rand_acc(rng, dev.config, 8, -40, 40) if op == AluOp.SHR else rand_acc(rng, dev.config, 8)
    got = run_alu_full32(dev, x, op, y=y)
    np.testing.assert_array_equal(got, alu_ref(op, x, y))


def test_alu_vta_cases(dev):
    """VTA's test_alu: 8x8 rows, random imm in [1, 5), int8 output."""
    rng = np.random.default_rng(8)
    cfg = dev.config
    rows = 64 if cfg.acc_depth >= 128 else 32
    for op, imm, tensor in [(AluOp.SHR, -2, False), (AluOp.MAX, 3, False), (AluOp.MAX, None, True),
                            (AluOp.ADD, 4, False), (AluOp.ADD, None, True), (AluOp.SHR, 1, False)]:
        x = rand_acc(rng, cfg, rows, -(1 << 20), 1 << 20)
        y = rand_acc(rng, cfg, rows, -(1 << 20), 1 << 20) if tensor else None
        got = run_alu_chain(dev, x, [(op, imm)], y=y)
        want = alu_ref(op, x, y if tensor else imm).astype(np.int8)
        np.testing.assert_array_equal(got, want, err_msg=f"{op.name} imm={imm}")


def test_relu(dev):
    rng = np.random.default_rng(9)
    x = rand_acc(rng, dev.config, 80 if dev.config.acc_depth >= 160 else 40, -256, 256)
    got = run_alu_chain(dev, x, [(AluOp.MAX, 0), (AluOp.MIN, 127)])
    np.testing.assert_array_equal(got, np.clip(x, 0, 127).astype(np.int8))


def test_shift_and_scale(dev):
    rng = np.random.default_rng(10)
    x = rand_acc(rng, dev.config, 16, -(1 << 12), 1 << 12)
    add, shr = int(rng.integers(0, 8)), int(rng.integers(1, 5))
    got = run_alu_chain(dev, x, [(AluOp.ADD, add), (AluOp.SHR, shr)])
    np.testing.assert_array_equal(got, ((x + add) >> shr).astype(np.int8))


def test_acc_8bit_residual_add(dev):
    cfg = dev.config
    rng = np.random.default_rng(11)
    rows = 12
    x = rand_acc(rng, cfg, rows)
    r = rng.integers(-128, 128, (rows, cfg.batch, cfg.block), dtype=np.int8)
    bx, br = dev.upload(x), dev.upload(r)
    out = dev.alloc(rows * cfg.out_elem_bytes)
    dev.load_2d(bx, 0, rows, 1, rows, sram_index=0, mem_type=MemType.ACC)
    dev.load_2d(br, 0, rows, 1, rows, sram_index=rows, mem_type=MemType.ACC_8BIT)
    dev.alu("res", copy_rows_kernel(rows, rows), AluOp.ADD)
    dev.alu("sign", copy_rows_kernel(rows, 0), AluOp.SHR, imm=24)  # byte 3 shows the carry
    sync_compute_to_store(dev)
    dev.store_2d(0, out, 0, rows, 1, rows)
    dev.synchronize()
    got = out.read(np.int8, x.shape)
    np.testing.assert_array_equal(got, (wrap32(x.astype(np.int64) + r) >> 24).astype(np.int8))


# ---- 7. DRAM round trips -------------------------------------------------------------------

def test_runtime_array_round_trip(dev):
    cfg = dev.config
    rng = np.random.default_rng(12)
    a = rng.integers(-128, 128, (100, 100, cfg.batch, cfg.block), dtype=np.int8)
    buf = dev.upload(a)
    np.testing.assert_array_equal(buf.read(np.int8, a.shape), a)


def test_round_trip_through_acc_8bit(dev):
    """int8 DRAM -> ACC_8BIT (sign extension) -> OUT -> DRAM gives the same bytes."""
    cfg = dev.config
    rows = min(100, cfg.acc_depth)
    a = np.random.default_rng(13).integers(-128, 128, (rows, cfg.batch, cfg.block), dtype=np.int8)
    src, dst = dev.upload(a), dev.alloc(a.nbytes)
    dev.load_2d(src, 0, rows, 1, rows, sram_index=0, mem_type=MemType.ACC_8BIT)
    dev.alu("copy", copy_rows_kernel(rows), AluOp.SHR, imm=0)
    sync_compute_to_store(dev)
    dev.store_2d(0, dst, 0, rows, 1, rows)
    dev.synchronize()
    np.testing.assert_array_equal(dst.read(np.int8, a.shape), a)


def test_store_2d_strided(dev):
    """store_2d scatters rows into a strided DRAM tensor and leaves the gaps alone."""
    cfg = dev.config
    x = rand_acc(np.random.default_rng(14), cfg, 6)
    bx = dev.upload(x)
    out = dev.upload(np.full((3, 4, cfg.batch, cfg.block), 99, np.int8))
    dev.load_2d(bx, 0, 6, 1, 6, sram_index=0, mem_type=MemType.ACC)
    dev.alu("copy", copy_rows_kernel(6), AluOp.SHR, imm=0)
    sync_compute_to_store(dev)
    dev.store_2d(0, out, 1, 2, 3, 4)
    dev.synchronize()
    want = np.full((3, 4, cfg.batch, cfg.block), 99, np.int8)
    want[:, 1:3] = x.astype(np.int8).reshape(3, 2, cfg.batch, cfg.block)
    np.testing.assert_array_equal(out.read(np.int8, want.shape), want)
