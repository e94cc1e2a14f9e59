"""Accelerator passes, each on a small function: the IR before, and the IR expected after."""

import textwrap

import pytest

from celosia import HwConfig
from celosia.compiler.tensor import te
from celosia.compiler.accel.codegen import AccelOp, insert_dependencies
from celosia.errors import CompilerError
from celosia.compiler.accel.dma import inject_dma
from celosia.compiler.accel.intrin import gemm_intrinsic
from celosia.compiler.accel.tensorize import form_gemm_kernels
from celosia.compiler.tensor.lower import lower
from celosia.compiler.tensor.schedule import create_schedule
from celosia.compiler.accel.storage import plan_storage
from celosia.compiler.accel.vthread import inject_virtual_threads
from celosia.isa import Module

CFG = HwConfig()
L, C, S = Module.LOAD, Module.COMPUTE, Module.STORE


def tiny_dense(vthreads: bool = False, intrinsic=None, interleave: str = "statement"):
    """(2 x 32) x (64 x 32)^T, output blocks tiled by 2, the GEMM tensorized."""
    data = te.placeholder((2, 2, 1, 16), "int8", "data")
    weight = te.placeholder((4, 2, 16, 16), "int8", "weight")
    ko, ki = te.reduce_axis(2, "ko"), te.reduce_axis(16, "ki")
    g = te.compute((2, 4, 1, 16), lambda i, j, b, o: te.sum(
        data[i, ko, b, ki].astype("int32") * weight[j, ko, o, ki].astype("int32"), axis=[ko, ki]),
        "gemm")
    res = te.compute(g.shape, lambda i, j, b, o: g[i, j, b, o].astype("int8"), "res")
    s = create_schedule(res)
    s[g].set_scope("acc")
    i, j, b, o = s[res].axes
    jo, ji = s[res].split(j, 2)
    order = [jo, i, ji, b, o]
    if vthreads:
        jt, jo2 = s[res].split(jo, 1)
        s[res].bind_vthread(jt, interleave=interleave)
        order = [jt, jo2, i, ji, b, o]
    s[res].reorder(*order)
    s[g].compute_at(s[res], order[-5])
    s[res].pragma(order[-4], "dma_copy")
    gi, gj, gb, go = s[g].axes
    gko, gki = s[g].reduce_axes
    s[g].reorder(gko, gi, gj, gb, go, gki)
    s[g].tensorize(gb, intrinsic or gemm_intrinsic(CFG))
    for t, scope in ((data, "inp"), (weight, "wgt")):
        cached = s.cache_read(t, scope, [g])
        s[cached].compute_at(s[g], gko)
        s[cached].pragma(s[cached].axes[0], "dma_copy")
    return lower(s, [data, weight, res], "tiny")


def body(func) -> str:
    """The printed function without its signature line, dedented."""
    return textwrap.dedent(str(func).split("\n", 1)[1])


def test_tensorize_lowers_to_micro_op_calls():
    assert body(tiny_dense()) == textwrap.dedent("""\
          # stage res
          for j.outer in range(2):
            gemm = alloc(2, 2, 1, 16; int32, acc)
            # stage gemm
            for i in range(2):
              for j in range(2):
                uop_gemm(gemm, i * 2 + j, 1)
            for ko in range(2):
              data.inp = alloc(2, 1, 1, 16; int8, inp)
              # stage data.inp
              # pragma dma_copy
              for ax0 in range(2):
                for ax1 in range(1):
                  for ax2 in range(1):
                    for ax3 in range(16):
                      data.inp[ax0, ax1, ax2, ax3] = data[ax0, ko + ax1, ax2, ax3]
              weight.wgt = alloc(2, 1, 16, 16; int8, wgt)
              # stage weight.wgt
              # pragma dma_copy
              for ax0_1 in range(2):
                for ax1_1 in range(1):
                  for ax2_1 in range(16):
                    for ax3_1 in range(16):
                      weight.wgt[ax0_1, ax1_1, ax2_1, ax3_1] = weight[j.outer * 2 + ax0_1, ko + ax1_1, ax2_1, ax3_1]
              for i in range(2):
                for j in range(2):
                  uop_gemm(gemm, i * 2 + j, 0, data.inp, i, weight.wgt, j)
            # pragma dma_copy
            for i_1 in range(2):
              for j.inner in range(2):
                for b in range(1):
                  for o in range(16):
                    res[i_1, j.outer * 2 + j.inner, b, o] = int8(gemm[i_1, j.inner, b, o])
        """)


def test_inject_dma_then_form_gemm_kernels():
    after = form_gemm_kernels(inject_dma(tiny_dense()))
    assert body(after) == textwrap.dedent("""\
          # stage res
          for j.outer in range(2):
            gemm = alloc(2, 2, 1, 16; int32, acc)
            # stage gemm
            kernel gemm_reset on gemm loops[i<2 j<2]:
              uop(i * 2 + j, 0, 0)
            for ko in range(2):
              data.inp = alloc(2, 1, 1, 16; int8, inp)
              # stage data.inp
              load_2d(data, ko, 1, 2, 2, 0, 0, 0, 0, data.inp, 0, 2)
              weight.wgt = alloc(2, 1, 16, 16; int8, wgt)
              # stage weight.wgt
              load_2d(weight, ko + j.outer * 4, 1, 2, 2, 0, 0, 0, 0, weight.wgt, 0, 1)
              kernel gemm on gemm, data.inp, weight.wgt loops[i<2 j<2]:
                uop(i * 2 + j, i, j)
            store_2d(gemm, 0, res, j.outer * 2, 2, 2, 4)
        """)


def test_virtual_threads_duplicate_buffers_and_interleave_statements():
    after = inject_virtual_threads(form_gemm_kernels(inject_dma(tiny_dense(vthreads=True))))
    text = body(after)
    # Each thread has its own buffers; within the ko loop, both threads load, then both compute.
    for name in ("gemm.t0", "gemm.t1", "data.inp.t0", "data.inp.t1", "weight.wgt.t0", "weight.wgt.t1"):
        assert f"{name} = alloc" in text
    def target(line):
        if line.startswith("load_2d"):
            return "load " + line.split(", ")[-3]
        return "gemm " + line.split(" on ")[1].split(",")[0]
    order = [target(l.strip()) for l in text.splitlines()
             if l.strip().startswith(("load_2d", "kernel gemm on"))]
    assert order == ["load data.inp.t0", "load data.inp.t1", "load weight.wgt.t0",
                     "load weight.wgt.t1", "gemm gemm.t0", "gemm gemm.t1"]
    assert "load_2d(weight, ko + j.outer.inner * 4 + 4, 1, 2, 2, 0, 0, 0, 0, weight.wgt.t1, 0, 1)" in text


def _order(func):
    """Loads and GEMMs in program order, as "load <buffer>" / "gemm <buffer>"."""
    def target(line):
        if line.startswith("load_2d"):
            return "load " + line.split(", ")[-3]
        return "gemm " + line.split(" on ")[1].split(",")[0]
    return [target(l.strip()) for l in body(func).splitlines()
            if l.strip().startswith(("load_2d", "kernel gemm on"))]


def test_virtual_threads_thread_major_keep_each_threads_group_together():
    """interleave="thread": a thread's loads are consecutive (its compute waits only for
    them), the allocations are hoisted to the loop body, and no buffer needs more rows."""
    func = inject_virtual_threads(form_gemm_kernels(inject_dma(
        tiny_dense(vthreads=True, interleave="thread"))))
    assert _order(func) == ["load data.inp.t0", "load weight.wgt.t0", "load data.inp.t1",
                            "load weight.wgt.t1", "gemm gemm.t0", "gemm gemm.t1"]
    text = body(func)
    assert text.index("weight.wgt.t1 = alloc") < text.index("load_2d")
    statement = plan_storage(inject_virtual_threads(form_gemm_kernels(inject_dma(
        tiny_dense(True)))), CFG)
    thread = plan_storage(func, CFG)
    assert {b.name: r for b, r in thread.attrs["sram_base"].items()} == \
        {b.name: r for b, r in statement.attrs["sram_base"].items()}


def test_thread_major_conv_runs_each_threads_alu_chain_then_stores():
    """conv2d with two threads: per step both threads' loads, then per thread its reset (on
    the first step) and GEMM; after the reduction thread 0's whole ALU chain before thread
    1's, so thread 0's store overlaps thread 1's ALU work."""
    from celosia.compiler.accel.ops import ConvKnobs, ConvSpec, Epilogue, conv2d

    spec = ConvSpec(1, 32, 8, 8, 64, 3, 3, 1, 1, Epilogue(shift=8, relu=True))
    text = str(conv2d(CFG, spec, ConvKnobs(4, 8, 2, 1, vthreads=2)))
    ops = [l.strip().split(" on ")[0].replace("kernel ", "") + " " +
           l.strip().split(" on ")[1].split(",")[0].split(" ")[0]
           for l in text.splitlines() if l.strip().startswith("kernel ")]
    assert ops == ["gemm_reset conv.t0", "gemm conv.t0", "gemm_reset conv.t1", "gemm conv.t1",
                   "SHR imm=8 epilogue.t0", "MAX imm=0 epilogue.t0", "MIN imm=127 epilogue.t0",
                   "SHR imm=8 epilogue.t1", "MAX imm=0 epilogue.t1", "MIN imm=127 epilogue.t1"]
    assert text.count("if ci.outer == 0:") == 2
    stores = [l.strip().split(",")[0] for l in text.splitlines() if "store_2d" in l]
    assert stores == ["store_2d(epilogue.t0", "store_2d(epilogue.t1"]


def test_plan_storage_places_buffers_and_reuses_rows_of_finished_ones():
    func = plan_storage(inject_virtual_threads(form_gemm_kernels(inject_dma(tiny_dense(True)))), CFG)
    base = {b.name: row for b, row in func.attrs["sram_base"].items()}
    assert base == {"gemm.t0": 0, "gemm.t1": 4, "data.inp.t0": 0, "data.inp.t1": 2,
                    "weight.wgt.t0": 0, "weight.wgt.t1": 2}


def test_tensorize_mismatch_says_what_differs():
    other = gemm_intrinsic(HwConfig(log_block=3, log_inp_buff_size=12, log_wgt_buff_size=14,
                                    log_acc_buff_size=14))
    with pytest.raises(CompilerError, match=r"loop o \(data, 16 iterations\) plays gemm's axis o \(data, 8\)|"
                                            r"last 2 dimensions must be \(1, 8\)"):
        tiny_dense(intrinsic=other)


def _op(module, *access):
    return AccelOp(module, f"{module.name.lower()}", lambda dev: None, list(access))


def test_dependencies_before_and_after():
    """load A, load B, compute on A, compute on B, store, then reload A: tokens exactly where
    a module must wait for another."""
    ops = [
        _op(L, ("inp", 0, 4, True)),                               # 0 load tile A
        _op(L, ("inp", 4, 8, True)),                               # 1 load tile B
        _op(C, ("inp", 0, 4, False), ("out", 0, 4, True)),         # 2 compute A
        _op(C, ("inp", 4, 8, False), ("out", 4, 8, True)),         # 3 compute B
        _op(S, ("out", 0, 8, False)),                              # 4 store both
        _op(L, ("inp", 0, 4, True)),                               # 5 reload A (WAR on 2)
        _op(C, ("inp", 0, 4, False), ("out", 0, 4, True)),         # 6 compute A (RAW 5, WAR 4)
    ]
    insert_dependencies(ops, CFG)
    assert [sorted(m.name for m in o.pushes) for o in ops] == [
        ["COMPUTE"], ["COMPUTE"], ["LOAD"], ["STORE"], ["COMPUTE"], ["COMPUTE"], []]
    assert [{m.name: n for m, n in o.pops.items()} for o in ops] == [
        {}, {}, {"LOAD": 1}, {"LOAD": 1}, {"COMPUTE": 1}, {"COMPUTE": 1}, {"LOAD": 1, "STORE": 1}]


def test_inject_dma_merged_host_loops_leave_no_loop_variable_in_the_addresses():
    """A padded copy whose three outer loops (batch, super-group, block) are contiguous on
    both sides: they merge into one host loop of 8 iterations, and the variables of the
    outer two leave the DMA addresses (they used to stay there, unbound)."""
    from celosia.compiler.tensor.expr import select

    data = te.placeholder((2, 2, 2, 3, 4, 1, 16), "int8", "data")
    pad = te.compute((2, 2, 2, 5, 6, 1, 16), lambda n, s, c, y, x, b, k: select(
        (y >= 1) & (y < 4) & (x >= 1) & (x < 5), data[n, s, c, y - 1, x - 1, b, k], 0),
        "data_pad")
    res = te.compute(pad.shape, lambda *i: pad[i], "res")
    sch = create_schedule(res)
    sch[pad].set_scope("inp")
    sch[pad].pragma(sch[pad].axes[0], "dma_copy")
    before = lower(sch, [data, res], "t")
    copy = body(before).split("# stage res")[0]
    assert copy == textwrap.dedent("""\
        data_pad = alloc(2, 2, 2, 5, 6, 1, 16; int8, inp)
        # stage data_pad
        # pragma dma_copy
        for n in range(2):
          for s in range(2):
            for c in range(2):
              for y in range(5):
                for x in range(6):
                  for b in range(1):
                    for k in range(16):
                      data_pad[n, s, c, y, x, b, k] = select(y >= 1 && y < 4 && x >= 1 && x < 5, data[n, s, c, y - 1, x - 1, b, k], int8(0))
        """)
    # One 4 x 3 DMA per (n, s, c) block, padded by one element on every side: block
    # c' = 4n + 2s + c starts at 12c' in DRAM and 30c' in the input buffer.
    assert body(inject_dma(before)).split("# stage res")[0] == textwrap.dedent("""\
        data_pad = alloc(2, 2, 2, 5, 6, 1, 16; int8, inp)
        # stage data_pad
        for c in range(8):
          load_2d(data, c * 12, 4, 3, 4, 1, 1, 1, 1, data_pad, c * 30, 2)
        """)


def _dma_of_copy(shape, region=None):
    """A dma_copy of ``data`` (``shape``) into an ACC buffer of ``region``'s shape (the
    leading corner of each axis; the whole of it by default)."""
    data = te.placeholder(shape, "int8", "data")
    cp = te.compute(region or shape, lambda *i: data[i], "cp")
    res = te.compute(cp.shape, lambda *i: cp[i], "res")
    sch = create_schedule(res)
    sch[cp].set_scope("acc")
    sch[cp].pragma(sch[cp].axes[0], "dma_copy")
    return body(inject_dma(lower(sch, [data, res], "t"))).split("# stage res")[0]


def test_inject_dma_splits_a_contiguous_run_longer_than_x_size():
    """2 x 300 x 300 contiguous elements merge into one run of 180,000, past the 16-bit
    x_size: x keeps the columns (300) and the merged rest becomes the y loop (600 rows of
    stride 300), one DMA as before but one that encodes."""
    assert _dma_of_copy((2, 300, 300, 1, 16)) == textwrap.dedent("""\
        cp = alloc(2, 300, 300, 1, 16; int8, acc)
        # stage cp
        load_2d(data, 0, 300, 600, 300, 0, 0, 0, 0, cp, 0, 5)
        """)


def test_inject_dma_keeps_a_dram_stride_past_x_stride_as_a_host_loop():
    """Two planes of 70,000 elements, 1,000 of each copied: the plane stride does not fit
    the 16-bit x_stride, so the planes are a host loop of 1-row DMAs (U-Net at 256 x 256
    made a channel-block stride of 65,536 and failed in the driver)."""
    assert _dma_of_copy((2, 70000, 1, 16), (2, 1000, 1, 16)) == textwrap.dedent("""\
        cp = alloc(2, 1000, 1, 16; int8, acc)
        # stage cp
        for i0 in range(2):
          load_2d(data, i0 * 70000, 1000, 1, 1000, 0, 0, 0, 0, cp, i0 * 1000, 5)
        """)
