"""Few-channel convolutions run as a 1x1 layer over their windows, packed by the runtime
(compiler/accel/im2col.py): the packing against an explicit numpy im2col, the reordered
layer against the QConv's numpy definition, and whole models bit-exact on fsim and the
cycle model (and through a .cel round trip) against qops.qconv."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from celosia import HwConfig
from celosia.compiler.accel import im2col
from celosia.compiler.accel.partition import unpack_value
from celosia.compiler.graph import qops
from celosia.compiler.graph.ir import Graph, Node, TensorType, constant
from celosia.runtime.accel import AccelModel

from accel_helpers import after_accel_conv


def _windows_reference(x, win):
    """[n, kh * kw * c, oh, ow]: channel (dy * kw + dx) * c + ci of pixel (y, x) is the
    padded input (padding = z) at (y * sh + dy, x * sw + dx), channel ci."""
    n, c = x.shape[:2]
    x = x.reshape(n, c, win.h, win.w)
    pt, pl, pb, pr = win.pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=win.z)
    sh, sw = win.strides
    out = np.zeros((n, win.kh * win.kw * c, win.oh, win.ow), np.int8)
    for y in range(win.oh):
        for xx in range(win.ow):
            for dy in range(win.kh):
                for dx in range(win.kw):
                    t = (dy * win.kw + dx) * c
                    out[:, t:t + c, y, xx] = xp[:, :, y * sh + dy, xx * sw + dx]
    return out


def _config(name):
    """A named configuration, or "batch2": the default one with BATCH 2 (the gather path)."""
    from dataclasses import replace

    return replace(HwConfig.load("default"), log_batch=1) if name == "batch2" else \
        HwConfig.load(name)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 9), st.integers(1, 9), st.integers(1, 4),
       st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
       st.lists(st.integers(0, 3), min_size=4, max_size=4), st.integers(-128, 127),
       st.sampled_from(["default", "small", "batch2"]), st.integers(0, 2**31),
       st.integers(0, 16))
def test_pack_is_the_windows_in_conv2d_layout(c, h, w, kh, kw, sh, sw, pads, z, config, seed,
                                              lanes):
    """pack (BATCH 1: the compiled kernel, compiler/cpu/im2col_layout.py; BATCH 2: the
    gather) against an explicit numpy im2col, on random shapes, strides, padding, kernel
    sizes, pad values and bias lanes; the strided-view definition and the runtime's stager
    (bound to one buffer, used twice) give the same bytes."""
    cfg = _config(config)
    n = cfg.batch * 2
    kh, kw = min(kh, h + pads[0] + pads[2]), min(kw, w + pads[1] + pads[3])
    win = im2col.Windows(n, c, h, w, kh, kw, (sh, sw), tuple(pads), z)
    lanes = min(lanes, win.blocks(cfg.block) * cfg.block - win.channels)
    win = im2col.Windows(n, c, h, w, kh, kw, (sh, sw), tuple(pads), z,
                         tuple(range(-lanes, 0)))  # (bias lanes: their values)
    x = np.random.default_rng(seed).integers(-128, 128, (n, c, h, w), dtype=np.int8)
    packed = im2col.pack(x, win, cfg)
    assert packed.shape == win.packed_shape(cfg)
    full = unpack_value(packed, (n, win.blocks(cfg.block) * cfg.block, win.oh, win.ow))
    want = _windows_reference(x, win)
    np.testing.assert_array_equal(full[:, :win.channels], want)
    tail = win.channels + lanes
    assert (full[:, win.channels:tail].transpose(0, 2, 3, 1) == win.lanes).all()
    assert not full[:, tail:].any()  # channels past kh x kw x c and the lanes: zeros
    out = np.full(win.packed_shape(cfg), 77, np.int8)  # into given memory, every byte
    np.testing.assert_array_equal(im2col.pack(x, win, cfg, out=out), packed)
    np.testing.assert_array_equal(im2col.pack_reference(x, win, cfg), packed)
    buffer = np.full(win.packed_shape(cfg), 77, np.int8)
    stage = im2col.stager(win, cfg, buffer)
    x2 = np.random.default_rng(seed + 1).integers(-128, 128, x.shape, dtype=np.int8)
    for value in (x2, x):  # the same buffer, another input, then this one
        stage(value)
    np.testing.assert_array_equal(buffer, packed)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 20), st.integers(1, 40), st.integers(0, 2**31))
def test_bias_lanes_hold_the_bias_exactly_or_refuse(spare, o, seed):
    rng = np.random.default_rng(seed)
    reach = 63 + 127 * 127 * max(spare - 1, 0)
    bias = rng.integers(-reach, reach + 1, o).astype(np.int32)
    got = im2col.bias_lanes(bias, spare)
    if spare < 2:
        assert got is None
        return
    values, w = got
    assert values == (1,) + (127,) * (spare - 1) and w.dtype == np.int8 and w.shape == (o, spare)
    np.testing.assert_array_equal(w.astype(np.int64) @ np.array(values), bias)
    big = bias.copy()
    big[0] = 127 * 128 * spare + 200  # beyond every lane's reach
    assert im2col.bias_lanes(big, spare) is None


def test_windows_only_when_the_time_saved_exceeds_the_packing(monkeypatch):
    """plan takes the windows when the accelerator time they save (cycles for the batch at
    the configured clock) exceeds the extra CPU time of packing them, and not otherwise;
    the packing cost is a real timing."""
    from dataclasses import replace
    from celosia.compiler.accel.partition import annotate, layer_for
    from celosia.compiler.accel.tune import tune_conv

    g, node = _stem_graph()
    cfg = HwConfig.load("default")
    placements = annotate(g, cfg)
    base = layer_for(node, g, cfg)
    win = im2col.windows_of(node, g, cfg)
    extra = im2col.extra_pack_seconds(win, cfg)
    assert abs(extra) < 0.01  # seconds: the two packings of a small input, timed
    cycles = [tune_conv(cfg, replace(spec, n=cfg.batch))[1]["cycles"]
              for spec in (im2col.layer(node, g, cfg, win).spec, base.spec)]
    saved = (cycles[1] - cycles[0]) * win.n / (cfg.clock_mhz * 1e6)
    assert saved > 0
    for cost, clock, windowed in [(0.9 * saved, 100, True), (1.1 * saved, 100, False),
                                  (0.9 * saved, 1000, False), (0.09 * saved, 1000, True)]:
        monkeypatch.setattr(im2col, "extra_pack_seconds", lambda win, cfg, c=cost: c)
        got = im2col.plan(node, g, replace(cfg, clock_mhz=clock), placements, base)
        assert (got is not None) == windowed, (cost, clock)
    monkeypatch.setattr(im2col, "extra_pack_seconds", lambda win, cfg: 1.1 * saved)
    model = AccelModel.build(g, cfg)  # the build follows the plan: the plain layer
    assert "staged" not in model.programs["stem"]
    assert model.programs["stem"]["spec"]["kh"] == 7
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, g.types["x"].shape, dtype=np.int8)
    np.testing.assert_array_equal(model.run({"x": x}, target="cycle")["y"],
                                  model.cpu_build().run({"x": x})["y"])


def test_pack_refuses_the_wrong_input():
    win = im2col.Windows(1, 3, 8, 8, 3, 3, (1, 1), (1, 1, 1, 1), 0)
    with pytest.raises(Exception, match=r"im2col: expected int8 \[1, 3, 8, 8\], got float32"):
        im2col.pack(np.zeros((1, 3, 8, 8), np.float32), win, HwConfig())


def _stem_graph(c=3, size=20, k=7, stride=2, pad=3, o=24, z=-7, seed=0, one_d=False,
                residual=False, bias=20000):
    rng = np.random.default_rng(seed)
    inits = {"w": constant(rng.integers(-128, 128, (o, c, k) if one_d else (o, c, k, k),
                                        dtype=np.int8)),
             "b": constant(rng.integers(-bias, bias, o).astype(np.int32)),
             "m": constant(rng.integers(1, 300, o).astype(np.int32))}
    dims = 1 if one_d else 2
    x_shape = (2, c, size) if one_d else (2, c, size, size)
    out = (size + 2 * pad - k) // stride + 1
    y_shape = (2, o, out) if one_d else (2, o, out, out)
    attrs = dict(kernel_shape=[k] * dims, strides=[stride] * dims, pads=[pad] * 2 * dims,
                 dilations=[1] * dims, group=1, shift=10, lo=-128, hi=127, scale=0.05,
                 pad_value=z)
    inputs = ("x", "w", "b", "m") + (("r",) if residual else ())
    types = {"x": TensorType("int8", x_shape), "y": TensorType("int8", y_shape),
             **{n: TensorType(str(a.dtype), a.shape) for n, a in inits.items()}}
    if residual:
        types["r"] = TensorType("int8", y_shape)
    node = Node("QConv", inputs, ("y",), attrs, "stem")
    g = Graph("g", ("x", "r") if residual else ("x",), ("y",), (node,), inits, types)
    return g, node


@pytest.mark.parametrize("kw,lanes,config", [
    (dict(), True, "default"), (dict(), False, "small"),  # (small: 147 of 148 lanes)
    (dict(one_d=True, c=2, k=5, stride=1, pad=2), True, "default"),
    (dict(c=5, k=3, stride=1, pad=1, z=0, residual=True), True, "default"),
    (dict(bias=2**31 - 1), False, "default")])  # biases beyond the lanes' reach: the ALU adds them
def test_a_windowed_layer_is_bit_exact(tmp_path, kw, lanes, config):
    g, node = _stem_graph(**kw)
    cfg = HwConfig.load(config)
    model = AccelModel.build(g, cfg)
    staged = model.programs["stem"].get("staged", [])
    assert [s["layout"] for s in staged] == ["im2col"], "the layer runs over its windows"
    win = im2col.windows_of(node, g, cfg)
    assert model.programs["stem"]["spec"]["c"] == win.blocks(cfg.block) * cfg.block
    assert bool(win.lanes) == lanes
    assert model.programs["stem"]["spec"]["epilogue"]["bias"] == (not lanes)
    rng = np.random.default_rng(1)
    feeds = {v: rng.integers(-128, 128, g.types[v].shape, dtype=np.int8) for v in g.inputs}
    i = g.initializers
    want = qops.qconv(node.attrs, feeds["x"], *(np.asarray(i[v]) for v in ("w", "b", "m")),
                      feeds.get("r"))
    for target in ("fsim", "cycle"):
        np.testing.assert_array_equal(model.run(feeds, target=target)["y"], want)
    row = model.report[0]
    assert row["macs"] == win.channels * np.prod(g.types["y"].shape)
    o = g.types["y"].shape[1]  # (output channels are padded to BLOCK too)
    k = cfg.block
    assert row["padding_overhead"] == pytest.approx(
        win.blocks(k) * k / win.channels * (-(-o // k) * k) / o - 1)
    assert model.summary()["crossings"] == len(g.inputs) + 1  # packed once each, read once
    path = tmp_path / "m.cel"
    model.save(path)
    np.testing.assert_array_equal(AccelModel.load(path).run(feeds, target="cycle")["y"], want)


def test_a_layer_whose_input_the_accelerator_makes_keeps_its_padding():
    """The runtime packs only values the CPU makes: after an accelerator layer the stem's
    input stays in DRAM and the layer pads its channels (no windows)."""
    g, node = _stem_graph(c=3, size=12)
    rng = np.random.default_rng(2)
    g2 = after_accel_conv(g, (node,), ("y",), 3, rng)
    model = AccelModel.build(g2, "default")
    assert "staged" not in model.programs["stem"]
    assert model.programs["stem"]["spec"]["kh"] == 7
    x0 = rng.integers(-128, 128, (2, 3, 12, 12), dtype=np.int8)
    np.testing.assert_array_equal(model.run({"x0": x0}, target="cycle")["y"],
                                  model.cpu_build().run({"x0": x0})["y"])


def test_edited_window_operands_are_refused(tmp_path):
    from accel_helpers import edit_manifest
    from celosia.runtime.cpu import ArtifactError

    g, _ = _stem_graph()
    path = tmp_path / "m.cel"
    AccelModel.build(g, "default").save(path)

    def staged(doc):
        return doc["programs"]["stem"]["staged"][0]

    for edit, message in [
            (lambda d: staged(d).update(value="y"), r"staged\[0\].value: is not the input of a "
                                                    r"QConv node whose windows"),
            (lambda d: staged(d).update(shape=[2, 9, 10, 10, 1, 16]),
             r"staged\[0\].shape: is \[2, 9, 10, 10, 1, 16\], 'x''s im2col layout is "
             r"\[2, 10, 10, 10, 1, 16\]"),
            (lambda d: staged(d).update(layout="nchw"), r"layout")]:
        with pytest.raises(ArtifactError, match=message):
            AccelModel.load(edit_manifest(path, edit, tmp_path / "edited.cel"))


def test_a_windowed_layer_on_the_rtl_agrees_with_the_cycle_model():
    """The small configuration: the windowed program on the RTL gives the QConv's results
    and the cycle model's cycle count."""
    g, node = _stem_graph(c=2, size=8, k=3, stride=1, pad=1, o=8, bias=500)
    model = AccelModel.build(g, "small")
    assert [s["layout"] for s in model.programs["stem"]["staged"]] == ["im2col"]
    x = np.random.default_rng(7).integers(-128, 128, g.types["x"].shape, dtype=np.int8)
    i = g.initializers
    want = qops.qconv(node.attrs, x, *(np.asarray(i[v]) for v in ("w", "b", "m")))
    np.testing.assert_array_equal(model.run({"x": x}, target="rtl")["y"], want)
    rtl_cycles = model.report[0]["cycles"]
    np.testing.assert_array_equal(model.run({"x": x}, target="cycle")["y"], want)
    assert model.report[0]["cycles"] == rtl_cycles
