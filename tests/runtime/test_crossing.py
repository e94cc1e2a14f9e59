"""Planned crossings (runtime/crossing.py) against the general numpy conversions they
replace (partition.pack_value / unpack_value): random int8 values of every layout the
border sees (NCHW, [N, C, L], [N, C] with padding rows), channels that are and are not a
multiple of BLOCK, BATCH 1 and 2, large images (the compiled kernel bound once), strided and
sliced host arrays, DRAM that held other bytes, executors with and without DRAM views."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from celosia import HwConfig
from celosia.compiler.accel.partition import pack_value, packed_shape, unpack_value
from celosia.compiler.accel.matmul import (matrices_shape, pack_matrices, pack_weights,
                                           unpack_matrices, weights_shape)
from celosia.runtime.crossing import Crossing, pairs, staged_packer
from celosia.sim.base import make_executor

_ADDR = 4096


class _NoViews:
    """An executor without DRAM views (as a board's): read_dram/write_dram copies only."""

    def __init__(self, ex):
        self.inner = ex

    def dram_view(self, addr, nbytes):
        return None

    def read_dram(self, addr, nbytes):
        return self.inner.read_dram(addr, nbytes)

    def write_dram(self, addr, data):
        self.inner.write_dram(addr, data)


def _config(batch: int):
    cfg = HwConfig.load("default")
    return replace(cfg, log_batch=1) if batch == 2 else cfg


def _setup(shape, batch, views, seed, out=False):
    cfg = _config(batch)
    ex = make_executor("fsim", cfg, 8 << 20)
    rng = np.random.default_rng(seed)
    pshape = packed_shape(shape, cfg)
    size = int(np.prod(pshape))
    # DRAM that held other bytes: the padding must come out as zeros all the same
    ex.write_dram(_ADDR, rng.integers(0, 256, size, dtype=np.uint8))
    host = np.empty(shape, np.int8) if out else None
    c = Crossing(ex if views else _NoViews(ex), _ADDR, pshape, shape, cfg, out=host)
    return cfg, ex, c, rng, pshape, size


def _dram(ex, pshape, size):
    return ex.read_dram(_ADDR, size).view(np.int8).reshape(pshape)


_SHAPES = st.one_of(
    st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 7), st.integers(1, 7)),
    st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 9)),
    st.tuples(st.integers(1, 70), st.integers(1, 40)))


@settings(max_examples=60, deadline=None)
@given(_SHAPES, st.sampled_from([1, 2]), st.booleans(), st.booleans(), st.booleans(),
       st.integers(0, 2**31))
def test_pack_and_unpack_match_pack_value(shape, batch, views, strided, out, seed):
    """pack writes exactly pack_value's bytes (padding zeroed over old bytes), twice in a
    row with different values; unpack gives unpack_value's array, into the kept buffer
    when one is given; a strided host array packs the same as its contiguous copy."""
    shape = (shape[0] * batch, *shape[1:])
    cfg, ex, c, rng, pshape, size = _setup(shape, batch, views, seed, out)
    for _ in range(2):
        x = rng.integers(-128, 128, shape, dtype=np.int8)
        if strided:  # a sliced view of a larger array: not C-contiguous
            big = rng.integers(-128, 128, (*shape[:-1], 2 * shape[-1]), dtype=np.int8)
            big[..., ::2] = x
            x = big[..., ::2]
        c.pack(x)
        want = pack_value(np.ascontiguousarray(x), cfg)
        np.testing.assert_array_equal(_dram(ex, pshape, size), want)
        got = c.unpack()
        np.testing.assert_array_equal(got, unpack_value(want, shape))
        np.testing.assert_array_equal(got, x)
        assert got.dtype == np.int8 and got.shape == shape


@pytest.mark.parametrize("shape", [(1, 40, 24, 24), (1, 64, 16, 16), (1, 3, 100, 60)])
def test_compiled_crossing_binds_once(shape):
    """Images of BATCH 1 of 16 KiB or more go through the compiled layout kernels bound once
    to the DRAM view: the bytes are pack_value's and unpack_value's, run after run, into a
    kept buffer or fresh arrays, and a non-contiguous host array is taken too."""
    for out in (False, True):
        cfg, ex, c, rng, pshape, size = _setup(shape, 1, True, 5, out)
        assert c.kind == "compiled"
        results = []
        for k in range(3):
            x = rng.integers(-128, 128, shape, dtype=np.int8)
            if k == 2:
                x = np.asfortranarray(x)
            c.pack(x)
            want = pack_value(np.ascontiguousarray(x), cfg)
            np.testing.assert_array_equal(_dram(ex, pshape, size), want)
            got = c.unpack()
            np.testing.assert_array_equal(got, x)
            results.append(got if out else got.copy())
        if not out:  # each unpack a fresh array
            assert c.unpack() is not c.unpack()


def test_row_major_is_a_view_and_kinds():
    """A value whose packed bytes are its own in order (BATCH 1, whole channel blocks, one
    pixel) unpacks as a view of DRAM; what each value of a few shapes gets planned as."""
    cfg, ex, c, rng, pshape, size = _setup((4, 32), 1, True, 1)
    assert c.kind == "row_major"
    x = rng.integers(-128, 128, (4, 32), dtype=np.int8)
    c.pack(x)
    got = c.unpack()
    np.testing.assert_array_equal(got, x)
    assert np.shares_memory(got, ex.dram_view(_ADDR, size))
    assert _setup((4, 10), 1, True, 1)[2].kind == "views"
    assert _setup((4, 10), 1, False, 1)[2].kind == "general"
    # a "matrices" operand of BATCH 1 with whole column blocks: its bytes in order, with
    # padding after the matrix (zeroed by pack), read back as a view
    shape = (1, 5, 32)
    pshape = matrices_shape(shape, cfg)
    assert pshape[1] > 5 * 32  # (the stride pads each matrix)
    size = int(np.prod(pshape))
    ex.write_dram(_ADDR, np.full(size, 7, np.uint8))
    m = Crossing(ex, _ADDR, pshape, shape, cfg, layout="matrices")
    assert m.kind == "row_major"
    x = rng.integers(-128, 128, shape, dtype=np.int8)
    m.pack(x)
    np.testing.assert_array_equal(_dram(ex, pshape, size), pack_matrices(x, cfg))
    assert np.shares_memory(m.unpack(), ex.dram_view(_ADDR, size))
    np.testing.assert_array_equal(m.unpack(), x)


def test_pairs_cover_the_value_once():
    """pairs: every element of the value in exactly one pair, every packed byte either in a
    pair or in a padding view."""
    cfg = _config(2)
    for shape in [(4, 20, 3, 5), (6, 16, 2, 2), (8, 37), (2, 5, 7)]:
        p = np.zeros(packed_shape(shape, cfg), np.int64)
        x = np.zeros(shape, np.int64)
        got = pairs(p, x, cfg.batch, cfg.block)
        assert got is not None
        for dst, src in got[0]:
            dst += 1
            src += 1
        for pad in got[1]:
            pad += 1
        assert (x == 1).all() and (p == 1).all()
    assert pairs(np.zeros((1, 2, 3, 3, 1, 16)), np.zeros((1, 40, 3, 4)), 1, 16) is None


def test_mistyped_value_keeps_pack_value():
    """A value of another dtype goes through pack_value as before (it converts)."""
    cfg, ex, c, rng, pshape, size = _setup((2, 20, 3, 3), 1, True, 2)
    x = rng.integers(-128, 128, (2, 20, 3, 3)).astype(np.int32)
    c.pack(x)
    np.testing.assert_array_equal(_dram(ex, pshape, size), pack_value(x, cfg))


def test_windows_packer_takes_any_input_layout():
    """The im2col windows' packer (bound once, per call the input's pointer set): the same
    bytes as pack_reference for a contiguous input, a strided one and a second buffer,
    call after call."""
    from celosia.compiler.accel import im2col
    from celosia.compiler.cpu.im2col_layout import packer

    cfg = _config(1)
    rng = np.random.default_rng(3)
    for win in (im2col.Windows(4, 3, 9, 7, 3, 3, (2, 1), (1, 0, 2, 1), -5, (1, 127)),
                im2col.Windows(2, 1, 8, 8, 3, 3, (1, 1), (1, 1, 1, 1), 0)):
        out = np.full(win.packed_shape(cfg), 9, np.int8)
        pack = packer(win, cfg.block, out)
        shape = (win.n, win.c, win.h, win.w)
        for k in range(3):
            x = rng.integers(-128, 128, shape, dtype=np.int8)
            if k == 1:
                x = np.asfortranarray(x)
            pack(x)
            np.testing.assert_array_equal(out, im2col.pack_reference(x, win, cfg))
        with pytest.raises(ValueError, match="expected int8"):
            pack(x.astype(np.int16))


_MATRICES = st.tuples(st.lists(st.integers(1, 3), max_size=2), st.integers(1, 40),
                      st.integers(1, 40))


@settings(max_examples=40, deadline=None)
@given(_MATRICES, st.sampled_from([1, 2]), st.booleans(), st.booleans(), st.integers(0, 2**31))
def test_matrices_layout_matches_pack_matrices(dims, batch, views, out, seed):
    """A QMatMul operand [..., rows, cols] in the "matrices" layout: pack writes
    pack_matrices' bytes (padding zeroed over old bytes), unpack gives unpack_matrices'
    array, leading dims of any count, rows and columns not multiples of BATCH or BLOCK."""
    lead, rows, cols = dims
    rows = rows * batch
    shape = (*lead, rows, cols)
    cfg = _config(batch)
    ex = make_executor("fsim", cfg, 8 << 20)
    rng = np.random.default_rng(seed)
    pshape = matrices_shape(shape, cfg)
    size = int(np.prod(pshape))
    ex.write_dram(_ADDR, rng.integers(0, 256, size, dtype=np.uint8))
    c = Crossing(ex if views else _NoViews(ex), _ADDR, pshape, shape, cfg, layout="matrices",
                 out=np.empty(shape, np.int8) if out else None)
    assert c.kind in (("views", "row_major") if views else ("general",))
    for _ in range(2):
        x = rng.integers(-128, 128, shape, dtype=np.int8)
        c.pack(x)
        want = pack_matrices(x, cfg)
        np.testing.assert_array_equal(_dram(ex, pshape, size), want)
        got = c.unpack()
        np.testing.assert_array_equal(got, unpack_matrices(want, shape, cfg))
        np.testing.assert_array_equal(got, x)


@settings(max_examples=40, deadline=None)
@given(_MATRICES, st.booleans(), st.integers(0, 2**31))
def test_staged_weights_match_pack_weights(dims, strided, seed):
    """A QMatMul's second operand packed by the runtime into the weight layout before each
    run (its staged operand): the views made once write pack_weights' bytes, over old
    bytes, run after run, from contiguous or strided arrays."""
    lead, kdim, ndim = dims
    shape = (*lead, kdim, ndim)
    cfg = _config(1)
    rng = np.random.default_rng(seed)
    dram = rng.integers(-128, 128, weights_shape(shape, cfg), dtype=np.int8)
    pack = staged_packer(dram, shape, cfg)
    assert pack is not None
    for _ in range(2):
        x = rng.integers(-128, 128, shape, dtype=np.int8)
        if strided:
            x = np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -1, -2)), -1, -2)
        pack(x)
        np.testing.assert_array_equal(dram, pack_weights(x, cfg))
    # bound to a kept buffer (``fixed``): the copies between views of both made once, the
    # buffer's contents of the moment packed, over old bytes
    kept = np.empty(shape, np.int8)
    run = pack.fixed(kept)
    for _ in range(2):
        kept[...] = rng.integers(-128, 128, shape, dtype=np.int8)
        dram[...] = rng.integers(-128, 128, dram.shape, dtype=np.int8)
        run()
        np.testing.assert_array_equal(dram, pack_weights(kept, cfg))


def test_model_runs_keep_their_outputs_across_runs_and_executors():
    """Through AccelModel.run: outputs read back from DRAM are the caller's (a later run, on
    the same executor or another, does not change them), every run bit-exact with the
    int8 CPU build of the same graph, the crossings planned once per executor."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_accel import _residual_net

    from celosia.runtime.accel import AccelModel

    g = _residual_net(n=2, c=3, o=20)
    model = AccelModel.build(g, "default")
    cpu = model.cpu_build()
    rng = np.random.default_rng(11)
    feeds = [{"x": rng.integers(-128, 128, (2, 3, 8, 8), dtype=np.int8)} for _ in range(3)]
    got = []
    for target, f in zip(["cycle", "cycle", "fsim"], feeds):
        got.append(model.run(f, target=target))
        assert model.summary()["crossings"] == 2
    for f, out in zip(feeds, got):
        np.testing.assert_array_equal(out["z"], cpu.run(f, target="fsim")["z"])
    assert not np.array_equal(got[0]["z"], got[1]["z"])
    assert model._borders[0] is model._executors["fsim"]


@settings(max_examples=40, deadline=None)
@given(st.one_of(_SHAPES, st.sampled_from([(1, 40, 24, 24), (1, 3, 100, 60)])),
       st.sampled_from([1, 2]), st.integers(0, 2**31))
def test_kept_buffer_packs_by_its_bound_copies(shape, batch, seed):
    """A value the CPU writes into its kept host buffer (AccelModel._segment_out) packs by
    copies or the layout kernel bound to that buffer and DRAM once: pack_value's bytes,
    run after run with new contents, padding zeroed over DRAM that held other bytes; any
    other array of the value still packs by the general way."""
    if len(shape) == 4 and shape[0] == 1 and shape[2] * shape[3] > 1000:
        batch = 1  # (the large images: the compiled kernel's case)
    shape = (shape[0] * batch, *shape[1:])
    cfg, ex, c, rng, pshape, size = _setup(shape, batch, True, seed, out=True)
    if c.kind == "row_major":
        return
    assert c._bound_ok
    for k in range(3):
        c.out[...] = x = rng.integers(-128, 128, shape, dtype=np.int8)
        ex.write_dram(_ADDR, rng.integers(0, 256, size, dtype=np.uint8))  # stale bytes
        c.pack(c.out)
        np.testing.assert_array_equal(_dram(ex, pshape, size), pack_value(x, cfg))
        assert c._pack_out is not None
        y = np.asfortranarray(rng.integers(-128, 128, shape, dtype=np.int8))
        c.pack(y)  # (not the kept buffer)
        np.testing.assert_array_equal(_dram(ex, pshape, size), pack_value(y, cfg))


def test_windows_packer_bound_to_a_kept_buffer():
    """The im2col windows' packer bound to a kept input buffer (``fixed``): pack_reference's
    bytes call after call with new contents, over DRAM that held other bytes; a buffer it
    cannot bind (not contiguous) still packs, through the general call."""
    from celosia.compiler.accel import im2col
    from celosia.compiler.cpu.im2col_layout import packer

    cfg = _config(1)
    rng = np.random.default_rng(4)
    for win in (im2col.Windows(3, 3, 9, 7, 3, 3, (2, 1), (1, 0, 2, 1), -5, (1, 127)),
                im2col.Windows(5, 1, 8, 8, 3, 3, (1, 1), (1, 1, 1, 1), 0)):
        out = np.empty(win.packed_shape(cfg), np.int8)
        shape = (win.n, win.c, win.h, win.w)
        kept = np.empty(shape, np.int8)
        strided = np.empty((*shape[:-1], 2 * shape[-1]), np.int8)[..., ::2]
        pack = packer(win, cfg.block, out)
        for src in (kept, strided):
            run = pack.fixed(src)
            for _ in range(3):
                src[...] = rng.integers(-128, 128, shape, dtype=np.int8)
                out[...] = rng.integers(-128, 128, out.shape, dtype=np.int8)
                run()
                np.testing.assert_array_equal(out, im2col.pack_reference(src, win, cfg))


def test_cpu_made_operands_cross_from_kept_buffers():
    """The digits CNN: the CPU segment that quantizes the image writes it into the kept
    buffer that the windows' packer is bound to; three runs with other images on the
    cycle model and fsim, each bit-exact with the int8 CPU build and none changing an
    earlier run's outputs."""
    from celosia.models import digits
    from celosia.runtime.accel import AccelModel

    calib, _ = digits.load_split()["calibration"]
    model = AccelModel.from_onnx(str(digits.model_path()), "default",
                                 input_shapes={"image": (6, 1, 8, 8)},
                                 calibration={"image": calib}, target="cycle")
    cpu = model.cpu_build()
    rng = np.random.default_rng(12)
    feeds = [{"image": rng.uniform(0, 16, (6, 1, 8, 8)).astype(np.float32)} for _ in range(3)]
    got, setup = [], []
    for target, f in zip(["cycle", "cycle", "fsim"], feeds):
        got.append(model.run(f, target=target))
        setup.append(model.summary()["border_setup_ms"])
    # the border's planning is reported for each executor's first run, and only then
    assert setup[0] > 0 and setup[1] == 0 and setup[2] > 0
    for f, out in zip(feeds, got):
        np.testing.assert_array_equal(out["probs"], cpu.run(f)["probs"])
    assert not np.array_equal(got[0]["probs"], got[1]["probs"])
    outs = [o for o in model.__dict__["_segment_outs"].values() if o]
    assert outs, "the quantized image is written into its kept buffer"
    staged = [s for per in model._staged_of.values() for v in per.values() for s in v]
    assert any(buf is not None and buf is outs[0].get(value)
               for value, _, buf, _ in staged), "the windows are packed from it, bound"
    # planned before the first run's windows (AccelModel._plan_border): the value the CPU
    # reads back from the accelerator (the dense layer's result), on each executor
    back = {n.inputs[0] for n in model.graph.nodes if n.op == "Dequantize"} & set(model.values)
    assert back and back <= set(model._borders[1])
    assert len(model._border_planned) == 2


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 70), st.integers(1, 70), st.sampled_from(["default", "small"]),
       st.sampled_from([0, 64]), st.integers(0, 2**31))
def test_weights_kernel_matches_pack_weights(g, kdim, ndim, config, extra, seed):
    """The compiled weight-layout kernel (compiler/cpu/weight_layout.py): pack_weights'
    bytes for rows and columns that are and are not multiples of BLOCK, BLOCK 16 and 4,
    over DRAM that held other bytes, with the padding past each matrix (a longer stride
    than the layout's) zeroed."""
    from celosia.compiler.cpu.weight_layout import weights_kernel

    cfg = HwConfig.load(config)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (g, kdim, ndim), dtype=np.int8)
    gs, stride = weights_shape(x.shape, cfg)
    out = rng.integers(-128, 128, (gs, stride + extra), dtype=np.int8)
    weights_kernel(g, kdim, ndim, cfg.block, stride + extra).bind(x, out, serial=True)()
    np.testing.assert_array_equal(out[:, :stride], pack_weights(x, cfg))
    assert not out[:, stride:].any()
    k = cfg.block
    with pytest.raises(ValueError, match="does not hold"):
        weights_kernel(g, kdim, ndim, k, -(-kdim // k) * -(-ndim // k) * k * k - 1)
