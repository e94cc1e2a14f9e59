"""The datapath's GEMM and ALU kernels (sim/datapath.py) against naive loops: the grid kernel
(float32 im2col products, exact by construction, or sim/igemm.py's int8 products), the
general kernel, and the ALU's in-place batches, on random and adversarial operands (extreme
int8 values, reductions longer than one exact float32 slice, repeated destination rows, ACC
values that wrap). Every test runs with both kinds of products (``products``)."""

import numpy as np
import pytest

from celosia import HwConfig
from celosia.errors import ProgramError
from celosia.isa import AluInsn, AluOp, GemmInsn, Uop, encode_uops
from celosia.sim import igemm
from celosia.sim.datapath import Datapath, numpy_blas_controllers, single_threaded_blas

CONFIGS = [HwConfig(), HwConfig.preset("small"),
           HwConfig(log_batch=1, log_block=3, log_inp_buff_size=12, log_wgt_buff_size=13,
                    log_acc_buff_size=13, log_uop_buff_size=10)]
IDS = ["default", "small", "batch2_block8"]


@pytest.fixture(autouse=True, params=["int8", "float32"])
def products(request, monkeypatch):
    """The GEMM kernels' products: igemm.py's int8 kernel (where the host runs it) or
    float32 BLAS; kernels compiled in the test use it."""
    if request.param == "int8" and not igemm.available():
        pytest.skip("this host does not run the int8 kernel (AVX-512 VNNI)")
    monkeypatch.setitem(igemm._state, "available", request.param == "int8")
    return request.param


def _naive(dp: Datapath, insn: GemmInsn, uops: list[Uop]):
    """(ACC, OUT) after the instruction, one micro-op at a time."""
    acc = dp.acc.astype(np.int64).copy()
    out = dp.out.copy()
    touched = set()
    for i in range(insn.iter_out):
        for j in range(insn.iter_in):
            for u in uops:
                a = u.dst + i * insn.dst_factor_out + j * insn.dst_factor_in
                s = u.src + i * insn.src_factor_out + j * insn.src_factor_in
                w = u.wgt + i * insn.wgt_factor_out + j * insn.wgt_factor_in
                acc[a] += dp.inp[s].astype(np.int64) @ dp.wgt[w].astype(np.int64).T
                touched.add(a)
    acc = ((acc + 2**31) % 2**32 - 2**31).astype(np.int32)
    rows = sorted(touched)
    out[rows] = acc[rows].astype(np.int8)
    return acc, out


def _random_case(cfg, rng, grid: bool):
    dp = Datapath(cfg, np.zeros(64, np.uint8))
    dp.inp[:] = rng.integers(-128, 128, dp.inp.shape)
    dp.wgt[:] = rng.integers(-128, 128, dp.wgt.shape)
    dp.acc[:] = rng.integers(-2**31, 2**31, dp.acc.shape)
    io, ii = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    groups, per = int(rng.integers(1, 4)), int(rng.integers(1, 80))
    if grid:  # equal groups, distinct dst rows per group, weights fixed across loops
        uops = [Uop(g * io * ii, int(rng.integers(0, cfg.inp_depth - 8)),
                    int(rng.integers(0, cfg.wgt_depth))) for g in range(groups) for _ in range(per)]
        rng.shuffle(uops)
        insn = GemmInsn(uop_bgn=0, uop_end=len(uops), iter_out=io, iter_in=ii,
                        dst_factor_out=ii, dst_factor_in=1, src_factor_out=int(rng.integers(0, 3)),
                        src_factor_in=int(rng.integers(0, 3)))
    else:  # arbitrary: colliding rows, moving weights
        uops = [Uop(int(rng.integers(0, 8)), int(rng.integers(0, cfg.inp_depth - 8)),
                    int(rng.integers(0, cfg.wgt_depth - 8))) for _ in range(per)]
        insn = GemmInsn(uop_bgn=0, uop_end=len(uops), iter_out=io, iter_in=ii,
                        dst_factor_out=int(rng.integers(0, 2)), dst_factor_in=int(rng.integers(0, 2)),
                        src_factor_out=1, src_factor_in=2, wgt_factor_out=int(rng.integers(0, 2)),
                        wgt_factor_in=1)
    dp.uop[:len(uops)] = encode_uops(uops, cfg)
    return dp, insn, uops


def _kernel_name(dp: Datapath, insn) -> str:
    kind = "GEMM" if isinstance(insn, GemmInsn) else "ALU"
    return dp._kernel(0, insn, kind).__name__.removesuffix("_int8")


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
@pytest.mark.parametrize("grid", [True, False], ids=["grid", "general"])
def test_gemm_matches_naive(cfg, grid):
    rng = np.random.default_rng(7)
    for _ in range(6):
        dp, insn, uops = _random_case(cfg, rng, grid)
        want_acc, want_out = _naive(dp, insn, uops)
        if grid:
            assert _kernel_name(dp, insn) == "gemm_grid"
        dp.gemm(0, insn)
        np.testing.assert_array_equal(dp.acc, want_acc)
        np.testing.assert_array_equal(dp.out, want_out)


def test_grid_path_is_taken_for_tensorized_loops():
    cfg = HwConfig()
    rng = np.random.default_rng(1)
    dp, insn, uops = _random_case(cfg, rng, grid=True)
    assert _kernel_name(dp, insn) == "gemm_grid"


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per_group"])
def test_grid_rows_interleaved_by_iteration(cfg, shared):
    """Groups whose ACC rows interleave (group g of iteration r in row g + G * r: a GEMM
    tiled over output blocks, each iteration's blocks side by side): consecutive in
    iteration-major order, which the grid kernel updates as a view of ACC."""
    rng = np.random.default_rng(3 + shared)
    for groups, per, io, ii in ((4, 3, 5, 2), (16, 16, 8, 1), (3, 70, 2, 3)):
        dp = Datapath(cfg, np.zeros(64, np.uint8))
        dp.inp[:] = rng.integers(-128, 128, dp.inp.shape)
        dp.wgt[:] = rng.integers(-128, 128, dp.wgt.shape)
        dp.acc[:] = rng.integers(-2**31, 2**31, dp.acc.shape)
        dp.out[:] = rng.integers(-128, 128, dp.out.shape)
        srcs = [int(v) for v in rng.integers(0, cfg.inp_depth - 4 * io * ii, per)]
        uops = [Uop(g, s if shared else int(rng.integers(0, cfg.inp_depth - 4 * io * ii)),
                    int(rng.integers(0, cfg.wgt_depth))) for g in range(groups) for s in srcs]
        uops = [uops[k] for k in rng.permutation(len(uops))]
        insn = GemmInsn(uop_bgn=0, uop_end=len(uops), iter_out=io, iter_in=ii,
                        dst_factor_out=groups * ii, dst_factor_in=groups,
                        src_factor_out=2 * ii, src_factor_in=2)
        dp.uop[:len(uops)] = encode_uops(uops, cfg)
        want_acc, want_out = _naive(dp, insn, uops)
        assert _kernel_name(dp, insn) == "gemm_grid"
        dp.gemm(0, insn)
        np.testing.assert_array_equal(dp.acc, want_acc)
        np.testing.assert_array_equal(dp.out, want_out)


# ---- adversarial GEMMs ------------------------------------------------------------------


def _grid_case(cfg, rng, *, groups, per, io, ii, shared, fill, acc_fill, gaps=False):
    """A grid GEMM: ``groups`` dst groups of ``per`` micro-ops each (``per * BLOCK``
    products summed per lane, i.e. several exact float32 slices when that passes 1024),
    over an (io, ii) loop; src rows equal across groups when ``shared``; dst rows with gaps
    between groups (ACC rows by index) when ``gaps``."""
    dp = Datapath(cfg, np.zeros(64, np.uint8))
    dp.inp[:] = fill(rng, dp.inp.shape)
    dp.wgt[:] = fill(rng, dp.wgt.shape)
    dp.acc[:] = acc_fill(rng, dp.acc.shape)
    rows = io * ii
    src_rows = [int(v) for v in rng.integers(0, cfg.inp_depth - 2 * rows, per)]
    uops = []
    for g in range(groups):
        srcs = (src_rows if shared
                else [int(v) for v in rng.integers(0, cfg.inp_depth - 2 * rows, per)])
        dst = g * rows * (2 if gaps else 1)
        uops += [Uop(dst, s, int(rng.integers(0, cfg.wgt_depth))) for s in srcs]
    order = rng.permutation(len(uops))
    uops = [uops[k] for k in order]
    insn = GemmInsn(uop_bgn=0, uop_end=len(uops), iter_out=io, iter_in=ii,
                    dst_factor_out=ii, dst_factor_in=1, src_factor_out=ii, src_factor_in=1)
    dp.uop[:len(uops)] = encode_uops(uops, cfg)
    return dp, insn, uops


def _extremes(rng, shape):
    """Only -128 and 127 (the largest products, odd and even)."""
    return np.where(rng.random(shape) < 0.5, -128, 127)


def _all(value):
    return lambda rng, shape: np.full(shape, value)


ACC_FILLS = {
    "random": lambda rng, shape: rng.integers(-2**31, 2**31, shape),
    "near_max": lambda rng, shape: np.full(shape, 2**31 - 5),
    "near_min": lambda rng, shape: np.full(shape, -2**31 + 5),
}


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2]], ids=[IDS[0], IDS[2]])
@pytest.mark.parametrize("fill", ["all_minus128", "all_127", "extremes"])
@pytest.mark.parametrize("acc_fill", sorted(ACC_FILLS))
def test_grid_long_reductions_are_exact(cfg, fill, acc_fill):
    """Rows accumulating 2000-2400 extreme products each (several float32 slices of 1024),
    into ACC values that wrap: bit-identical to sequential int64 arithmetic mod 2^32."""
    fills = {"all_minus128": _all(-128), "all_127": _all(127), "extremes": _extremes}
    rng = np.random.default_rng(11)
    per = min(2400 // cfg.block, cfg.uop_depth - 6)  # 2400 (default) or 2000 products a lane
    groups = 2 if 2 * per <= cfg.uop_depth else 1
    assert per * cfg.block > 1024  # more than one exact float32 slice
    for shared, gaps, io, ii in ((True, False, 2, 3), (False, True, 1, 4), (True, True, 3, 1)):
        dp, insn, uops = _grid_case(cfg, rng, groups=groups, per=per, io=io, ii=ii, shared=shared,
                                    fill=fills[fill], acc_fill=ACC_FILLS[acc_fill], gaps=gaps)
        assert _kernel_name(dp, insn) == "gemm_grid"
        want_acc, want_out = _naive(dp, insn, uops)
        dp.gemm(0, insn)
        np.testing.assert_array_equal(dp.acc, want_acc)
        np.testing.assert_array_equal(dp.out, want_out)


def test_float32_alone_would_not_be_exact():
    """The slices matter: 1041 products of 127 x 127 sum to an odd number above 2^24, which
    float32 cannot hold, so one float32 product over them cannot be exact."""
    x = np.full((1, 1041), 127, np.float32)
    assert 1041 * 127 * 127 > 2**24 and int((x @ x.T)[0, 0]) != 1041 * 127 * 127


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_gemm_repeated_rows_general_kernel(cfg):
    """Micro-ops and loop iterations hitting the same ACC rows (not a grid): the general
    kernel sums every product into its row, with wrap-around."""
    rng = np.random.default_rng(3)
    for trial in range(4):
        dp = Datapath(cfg, np.zeros(64, np.uint8))
        dp.inp[:] = _extremes(rng, dp.inp.shape)
        dp.wgt[:] = _extremes(rng, dp.wgt.shape)
        dp.acc[:] = ACC_FILLS["near_max" if trial % 2 else "near_min"](rng, dp.acc.shape)
        uops = [Uop(int(rng.integers(0, 3)), int(rng.integers(0, 8)), int(rng.integers(0, 8)))
                for _ in range(40)]
        insn = GemmInsn(uop_bgn=0, uop_end=len(uops), iter_out=3, iter_in=2,
                        dst_factor_out=0, dst_factor_in=1, src_factor_out=1, src_factor_in=0,
                        wgt_factor_out=trial % 2, wgt_factor_in=0)
        dp.uop[:len(uops)] = encode_uops(uops, cfg)
        want_acc, want_out = _naive(dp, insn, uops)
        dp.gemm(0, insn)
        np.testing.assert_array_equal(dp.acc, want_acc)
        np.testing.assert_array_equal(dp.out, want_out)


def test_kernels_follow_new_uops_and_weights():
    """A kernel is kept per instruction and micro-op words, and the grid kernel's float32
    weights per WGT contents: new micro-ops or new weights are used at once."""
    cfg = HwConfig()
    rng = np.random.default_rng(5)
    dp, insn, uops = _grid_case(cfg, rng, groups=3, per=7, io=2, ii=2, shared=True,
                                fill=lambda r, s: r.integers(-128, 128, s),
                                acc_fill=ACC_FILLS["random"])
    for step in range(4):
        if step == 1:  # new weights in the same rows
            dp.wgt[:] = rng.integers(-128, 128, dp.wgt.shape)
        if step == 2:  # new micro-ops (same count) for the same instruction
            uops = [Uop(u.dst, u.src, (u.wgt + 1) % cfg.wgt_depth) for u in uops]
            dp.uop[:len(uops)] = encode_uops(uops, cfg)
        if step == 3:
            dp.inp[:] = rng.integers(-128, 128, dp.inp.shape)
        want_acc, want_out = _naive(dp, insn, uops)
        dp.gemm(0, insn)
        np.testing.assert_array_equal(dp.acc, want_acc)
        np.testing.assert_array_equal(dp.out, want_out)


# ---- ALU kernels --------------------------------------------------------------------------


def _wrap(v):
    return (np.asarray(v, dtype=np.int64) + 2**31) % 2**32 - 2**31


def _alu_lane(op, x, y):
    if op == AluOp.MIN:
        return min(x, y)
    if op == AluOp.MAX:
        return max(x, y)
    if op == AluOp.ADD:
        return int(_wrap(x + y))
    if op == AluOp.MUL:
        return int(_wrap(x * y))
    if y >= 0:
        return x >> min(y, 31)
    return int(_wrap(x << min(-y, 31)))


def _naive_alu(dp: Datapath, insn: AluInsn, uops: list[Uop]):
    acc = dp.acc.astype(np.int64).reshape(dp.acc.shape[0], -1).tolist()
    out = dp.out.copy().reshape(dp.out.shape[0], -1)
    for i in range(insn.iter_out):
        for j in range(insn.iter_in):
            for u in uops:
                a = u.dst + i * insn.dst_factor_out + j * insn.dst_factor_in
                s = u.src + i * insn.src_factor_out + j * insn.src_factor_in
                ys = [insn.imm] * len(acc[a]) if insn.use_imm else acc[s]
                acc[a] = [_alu_lane(insn.alu_op, x, y) for x, y in zip(acc[a], ys)]
                out[a] = np.array(acc[a], np.int64).astype(np.int8)
    return np.array(acc, np.int64).astype(np.int32).reshape(dp.acc.shape), out.reshape(dp.out.shape)


ALU_CASES = [
    # (uops as (dst, src), iter_out, iter_in, dst_f_out, dst_f_in, src_f_out, src_f_in)
    ([(0, 0)], 3, 40, 40, 1, 40, 1),  # in place over 120 consecutive rows (views)
    ([(3, 3)], 1, 30, 0, 3, 0, 3),  # in place with a stride of 3 (strided views)
    ([(0, 100)], 1, 50, 0, 1, 0, 0),  # every row reads one source row (broadcast)
    ([(10, 0)], 1, 50, 0, 1, 0, 1),  # ranges overlap: reads rows written earlier
    ([(0, 5)], 1, 50, 0, 1, 0, 1),  # reads rows written later in the same batch
    ([(1, 0)], 1, 60, 0, 1, 0, 1),  # a chain: each row reads the one just written
    ([(7, 7), (7, 7)], 2, 3, 0, 0, 0, 0),  # the same row, again and again
    ([(4, 9), (2, 4), (9, 2)], 3, 4, 1, 0, 0, 1),  # scattered rows, index arrays
    # repeated rows (sim/alu.py's closed forms and batches)
    ([(3, 3)], 10, 20, 0, 0, 0, 0),  # in place, 200 times: MUL and SHR reach fixed points
    ([(0, 100), (5, 101)], 7, 9, 0, 0, 0, 0),  # one source row each, never written
    ([(0, 100), (0, 101), (1, 102)], 2, 10, 0, 0, 0, 1),  # several source rows: folded
    ([(0, 0), (0, 5)], 3, 4, 0, 0, 0, 0),  # in place and not, on one row
    ([(0, 1), (1, 0)], 2, 20, 0, 0, 0, 0),  # a chain through two rows
    ([(k, k + 1) for k in range(12)], 3, 2, 0, 0, 0, 0),  # long hazard-free batches, repeated
    ([(9, 2), (2, 9), (4, 4), (7, 1)], 5, 6, 1, 0, 1, 0),  # mixed, some rows repeated
]


@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[2]], ids=[IDS[1], IDS[2]])
@pytest.mark.parametrize("op", list(AluOp))
@pytest.mark.parametrize("use_imm", [False, True], ids=["tensor", "imm"])
def test_alu_kernels_match_naive(cfg, op, use_imm):
    rng = np.random.default_rng(int(op) * 2 + use_imm)
    edge = np.array([2**31 - 1, -2**31, -1, 0, 1, 31, 32, -33, 65536, 46341], np.int64)
    for case in ALU_CASES:
        pairs, io, ii, dfo, dfi, sfo, sfi = case
        dp = Datapath(cfg, np.zeros(64, np.uint8))
        shape = dp.acc.shape
        dp.acc[:] = np.where(rng.random(shape) < 0.3, rng.choice(edge, shape),
                             rng.integers(-2**31, 2**31, shape))
        if op == AluOp.SHR and not use_imm:  # amounts of every sign and size
            dp.acc[:] = rng.integers(-40, 40, shape)
        dp.out[:] = rng.integers(-128, 128, dp.out.shape)
        uops = [Uop(d, s) for d, s in pairs]
        dp.uop[:len(uops)] = encode_uops(uops, cfg)
        for imm in ([-40, -31, -1, 0, 3, 31, 32767, -32768] if use_imm else [0]):
            insn = AluInsn(alu_op=op, use_imm=use_imm, imm=imm, uop_bgn=0, uop_end=len(uops),
                           iter_out=io, iter_in=ii, dst_factor_out=dfo, dst_factor_in=dfi,
                           src_factor_out=sfo, src_factor_in=sfi)
            want_acc, want_out = _naive_alu(dp, insn, uops)
            dp.alu(0, insn)
            np.testing.assert_array_equal(dp.acc, want_acc, err_msg=f"{case} imm={imm}")
            np.testing.assert_array_equal(dp.out, want_out, err_msg=f"{case} imm={imm}")


# ---- BLAS threads -------------------------------------------------------------------------


def test_single_threaded_blas_restores_the_thread_count():
    pytest.importorskip("threadpoolctl")
    import scipy.linalg  # noqa: F401 - loads a second OpenBLAS, which is not numpy's

    libs = numpy_blas_controllers()
    assert libs and all("numpy" in lib.filepath for lib in libs)
    before = [lib.get_num_threads() for lib in libs]
    with single_threaded_blas():
        with single_threaded_blas():  # nested: restored once, by the outer
            assert all(lib.get_num_threads() == 1 for lib in libs)
        assert all(lib.get_num_threads() == 1 for lib in libs)
    assert [lib.get_num_threads() for lib in libs] == before


def _random_alu_case(cfg, rng):
    """Micro-ops over a few rows (so rows repeat and feed each other), random loops."""
    rows = int(rng.integers(2, 12))
    uops = [Uop(int(rng.integers(0, rows)), int(rng.integers(0, rows + 2)))
            for _ in range(int(rng.integers(1, 6)))]
    f = lambda: int(rng.choice([0, 0, 1, 2]))  # noqa: E731
    insn = AluInsn(alu_op=AluOp(int(rng.integers(0, 5))), use_imm=bool(rng.random() < 0.3),
                   imm=int(rng.integers(-40, 40)), uop_bgn=0, uop_end=len(uops),
                   iter_out=int(rng.integers(1, 6)), iter_in=int(rng.integers(1, 12)),
                   dst_factor_out=f(), dst_factor_in=f(), src_factor_out=f(), src_factor_in=f())
    return uops, insn


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_alu_random_patterns_match_naive(chunked, monkeypatch):
    """Random ALU instructions with repeated and chained rows against the naive loop; with
    ``chunked``, long-instruction chunks of 7 executions (so a pattern spans chunks)."""
    import celosia.sim.datapath as datapath

    if chunked:
        monkeypatch.setattr(datapath, "_KERNEL_EXECS", 16)
        monkeypatch.setattr(datapath, "_CHUNK", 7)
    cfg = CONFIGS[1]
    rng = np.random.default_rng(12 + chunked)
    for case in range(150):
        uops, insn = _random_alu_case(cfg, rng)
        dp = Datapath(cfg, np.zeros(64, np.uint8))
        small = insn.alu_op in (AluOp.SHR, AluOp.MUL) and rng.random() < 0.5
        dp.acc[:] = (rng.integers(-40, 40, dp.acc.shape) if small
                     else rng.integers(-2**31, 2**31, dp.acc.shape))
        dp.out[:] = rng.integers(-128, 128, dp.out.shape)
        dp.uop[:len(uops)] = encode_uops(uops, cfg)
        want_acc, want_out = _naive_alu(dp, insn, uops)
        dp.alu(0, insn)
        msg = f"case {case}: {insn} {uops}"
        np.testing.assert_array_equal(dp.acc, want_acc, err_msg=msg)
        np.testing.assert_array_equal(dp.out, want_out, err_msg=msg)


def test_one_micro_op_kernels_match_naive():
    """ALU instructions and GEMM resets of one micro-op (every program's epilogues and
    resets) are built from the loop fields alone when their rows are arithmetic
    progressions that run as one batch (Datapath._compile_one_uop); any other pattern
    (overlapping reads, repeated rows, rows out of order) takes the general kernels. Both
    against the naive loop, the fast path taken where it applies."""
    cfg = CONFIGS[0]
    rng = np.random.default_rng(21)
    fast = 0
    for case in range(250):
        dp = Datapath(cfg, np.zeros(64, np.uint8))
        dp.acc[:] = rng.integers(-2**31, 2**31, dp.acc.shape)
        dp.out[:] = rng.integers(-128, 128, dp.out.shape)
        io, ii = int(rng.integers(1, 7)), int(rng.integers(1, 9))
        f = lambda: int(rng.choice([0, 1, 1, 2, 3, ii]))  # noqa: E731
        dst = int(rng.integers(0, 200))
        src = int(rng.choice([dst, dst + int(rng.integers(-60, 60)), 1500]))
        uop = [Uop(dst, max(src, 0))]
        dp.uop[:1] = encode_uops(uop, cfg)
        if rng.random() < 0.25:
            insn = GemmInsn(reset=True, uop_bgn=0, uop_end=1, iter_out=io, iter_in=ii,
                            dst_factor_out=f(), dst_factor_in=f())
            rows = {dst + i * insn.dst_factor_out + j * insn.dst_factor_in
                    for i in range(io) for j in range(ii)}
            want_acc, want_out = dp.acc.copy(), dp.out.copy()
            want_acc[sorted(rows)] = 0
            want_out[sorted(rows)] = 0
            fast += dp._compile_one_uop(insn, "GEMM") is not None
            dp.gemm(0, insn)
        else:
            dfo, dfi = f(), f()
            same = rng.random() < 0.3
            insn = AluInsn(alu_op=AluOp(int(rng.integers(0, 5))),
                           use_imm=bool(rng.random() < 0.4), imm=int(rng.integers(-40, 40)),
                           uop_bgn=0, uop_end=1, iter_out=io, iter_in=ii,
                           dst_factor_out=dfo, dst_factor_in=dfi,
                           src_factor_out=dfo if same else f(),
                           src_factor_in=dfi if same else f())
            if insn.alu_op == AluOp.SHR and not insn.use_imm:
                dp.acc[:] = rng.integers(-40, 40, dp.acc.shape)
            want_acc, want_out = _naive_alu(dp, insn, uop)
            fast += dp._compile_one_uop(insn, "ALU") is not None
            dp.alu(0, insn)
        msg = f"case {case}: {insn} {uop}"
        np.testing.assert_array_equal(dp.acc, want_acc, err_msg=msg)
        np.testing.assert_array_equal(dp.out, want_out, err_msg=msg)
    assert 60 < fast < 250  # both paths taken
    # rows past the end: the general path's error, naming the iteration and the row
    dp = Datapath(cfg, np.zeros(64, np.uint8))
    dp.uop[:1] = encode_uops([Uop(2040, 0)], cfg)
    for insn in (GemmInsn(reset=True, uop_bgn=0, uop_end=1, iter_out=3, iter_in=4,
                          dst_factor_out=4, dst_factor_in=1),
                 AluInsn(alu_op=AluOp.ADD, use_imm=True, imm=1, uop_bgn=0, uop_end=1,
                         iter_out=3, iter_in=4, dst_factor_out=4, dst_factor_in=1)):
        with pytest.raises(ProgramError, match=r"iteration \(out 2, in 0\) uses ACC row 2048"):
            (dp.gemm if isinstance(insn, GemmInsn) else dp.alu)(0, insn)


def test_in_place_mul_and_shr_reach_fixed_points():
    """The in-place closed form runs at most 64 steps of x*x and x >> x: every int32 is at
    its fixed point by then (x*x: 0 or 1 from step 30, x >> x: 0 within 64 steps)."""
    from celosia.sim.alu import shr_tensor

    rng = np.random.default_rng(5)
    x = np.concatenate([rng.integers(-2**31, 2**31, 20000), np.arange(-70, 70),
                        [-2**31, 2**31 - 1, -2**30, 2**30]]).astype(np.int32)
    for step in (lambda v: v * v, lambda v: shr_tensor(v, v)):
        v = x.copy()
        for _ in range(64):
            v = step(v)
        np.testing.assert_array_equal(step(v), v)


@pytest.mark.parametrize("pairs,fo,fi", [
    ([(0, 0)], 0, 0),  # in place on one row
    ([(0, 1)], 0, 0),  # one row, one source row
    ([(0, 1), (0, 2)], 0, 0),  # one row, two source rows
    ([(0, 1), (1, 0)], 0, 0),  # a chain through two rows
])
@pytest.mark.parametrize("op", [AluOp.ADD, AluOp.SHR])
def test_repeated_row_updates_take_linear_time(pairs, fo, fi, op):
    """2^16 updates of the same rows took a minute when batches were found quadratically
    (issue #18); now they take well under a second (a chain, a few microseconds each)."""
    import time

    cfg = CONFIGS[0]
    dp = Datapath(cfg, np.zeros(64, np.uint8))
    dp.acc[:] = np.random.default_rng(0).integers(-3, 3, dp.acc.shape)
    uops = [Uop(d, s) for d, s in pairs]
    dp.uop[:len(uops)] = encode_uops(uops, cfg)
    insn = AluInsn(alu_op=op, uop_bgn=0, uop_end=len(uops), iter_out=256,
                   iter_in=256 // len(uops), dst_factor_out=fo, dst_factor_in=fi)
    start = time.process_time()
    with single_threaded_blas():
        dp.alu(0, insn)
    assert time.process_time() - start < 5.0


# ---- the tiles kernel: any affine GEMM as batched products ---------------------------------


def _tiles_case(cfg, rng, fill, acc_fill):
    """A GEMM the grid kernel does not take: random loop factors for dst, src and wgt
    (weights moving with either loop or both, factors of 0 that repeat dst rows), micro-ops
    in equal dst groups or scattered, and sometimes more than 1024 products per row."""
    dp = Datapath(cfg, np.zeros(64, np.uint8))
    dp.inp[:] = fill(rng, dp.inp.shape)
    dp.wgt[:] = fill(rng, dp.wgt.shape)
    dp.acc[:] = acc_fill(rng, dp.acc.shape)
    io, ii = int(rng.integers(1, 6)), int(rng.integers(1, 7))
    fs = [int(rng.choice([0, 1, 2, 3, 5])) for _ in range(6)]
    if not (fs[4] or fs[5]):  # weights fixed over the loops: the grid kernel's case
        fs[5] = 1
    reach = [(io - 1) * fs[2 * k] + (ii - 1) * fs[2 * k + 1] for k in range(3)]
    room = [cfg.acc_depth - reach[0], cfg.inp_depth - reach[1], cfg.wgt_depth - reach[2]]
    assert min(room) > 8
    groups = int(rng.integers(1, 4))
    per = (int(rng.integers(1200 // cfg.block, 1500 // cfg.block)) if rng.random() < 0.2
           else int(rng.integers(1, 12)))
    per = min(per, cfg.uop_depth // groups)

    def uop(dst):
        return Uop(dst, int(rng.integers(0, room[1])), int(rng.integers(0, room[2])))

    if rng.random() < 0.6:  # equal dst groups
        dsts = rng.choice(room[0], groups, replace=False)
        uops = [uop(int(d)) for d in dsts for _ in range(per)]
        if rng.random() < 0.5:  # every group reads the same input rows
            srcs = [u.src for u in uops[:per]] * groups
            uops = [Uop(u.dst, s, u.wgt) for u, s in zip(uops, srcs)]
        order = rng.permutation(len(uops))
        uops = [uops[k] for k in order]
    else:
        uops = [uop(int(rng.integers(0, min(6, room[0])))) for _ in range(per)]
    insn = GemmInsn(uop_bgn=0, uop_end=len(uops), iter_out=io, iter_in=ii,
                    dst_factor_out=fs[0], dst_factor_in=fs[1], src_factor_out=fs[2],
                    src_factor_in=fs[3], wgt_factor_out=fs[4], wgt_factor_in=fs[5])
    dp.uop[:len(uops)] = encode_uops(uops, cfg)
    return dp, insn, uops


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
@pytest.mark.parametrize("fill", ["random", "extremes"])
def test_tiles_kernel_matches_naive(cfg, fill):
    """Random affine GEMMs with moving weights (dense layers, per-head matmuls, reductions
    over a loop) on the tiles kernel: bit-identical to the naive loop, ACC wrapping."""
    fills = {"random": lambda rng, shape: rng.integers(-128, 128, shape), "extremes": _extremes}
    rng = np.random.default_rng(21 + CONFIGS.index(cfg) + 3 * (fill == "extremes"))
    names = set()
    for case in range(40):
        acc_fill = ACC_FILLS[sorted(ACC_FILLS)[case % 3]]
        dp, insn, uops = _tiles_case(cfg, rng, fills[fill], acc_fill)
        names.add(_kernel_name(dp, insn))
        want_acc, want_out = _naive(dp, insn, uops)
        dp.gemm(0, insn)
        np.testing.assert_array_equal(dp.acc, want_acc, err_msg=f"case {case}: {insn}")
        np.testing.assert_array_equal(dp.out, want_out, err_msg=f"case {case}: {insn}")
    assert names == {"gemm_tiles"}


def test_dense_layer_is_one_product():
    """The dense layer's loop nest (input rows with the outer loop, weight column blocks
    with the inner one, K in the micro-ops) takes the tiles kernel and matches the naive
    loop, run twice (the kernel and its float32 weights kept)."""
    cfg = HwConfig()
    rng = np.random.default_rng(4)
    dp = Datapath(cfg, np.zeros(64, np.uint8))
    dp.inp[:] = rng.integers(-128, 128, dp.inp.shape)
    dp.wgt[:] = rng.integers(-128, 128, dp.wgt.shape)
    dp.acc[:] = rng.integers(-2**31, 2**31, dp.acc.shape)
    uops = [Uop(0, u, u) for u in range(8)]
    dp.uop[:8] = encode_uops(uops, cfg)
    insn = GemmInsn(uop_bgn=0, uop_end=8, iter_out=64, iter_in=8, dst_factor_out=8,
                    dst_factor_in=1, src_factor_out=8, wgt_factor_in=8)
    assert _kernel_name(dp, insn) == "gemm_tiles"
    for _ in range(2):
        want_acc, want_out = _naive(dp, insn, uops)
        dp.gemm(0, insn)
        np.testing.assert_array_equal(dp.acc, want_acc)
        np.testing.assert_array_equal(dp.out, want_out)


def test_tiles_kernel_falls_back_when_operands_are_large(monkeypatch):
    """A GEMM whose float32 operands would pass _TILE_BYTES takes the general path, with the
    same result."""
    import celosia.sim.datapath as datapath

    cfg = CONFIGS[2]
    rng = np.random.default_rng(8)
    dp, insn, uops = _tiles_case(cfg, rng, _extremes, ACC_FILLS["near_max"])
    monkeypatch.setattr(datapath, "_TILE_BYTES", 64)
    assert _kernel_name(dp, insn) == "<lambda>"  # the general path
    want_acc, want_out = _naive(dp, insn, uops)
    dp.gemm(0, insn)
    np.testing.assert_array_equal(dp.acc, want_acc)
    np.testing.assert_array_equal(dp.out, want_out)
