"""Element-wise CPU nodes computed in place on the accelerator's packed layout
(partition.packed_nodes) and squeeze-excitation's gate as a QMul on the ALU: small ONNX
models quantized to int8 and built with AccelModel.build are bit-exact with the all-CPU
build of the same graph on fsim and the cycle model (and after a save and load); the
tables run on the CPU in DRAM, so the nodes after them stay on the accelerator and only the
model's own input and output cross. Channel counts are not multiples of BLOCK and the
tables map 0 to nonzero values (Sigmoid), so the padding channels of the packed layout hold
garbage after a table, which must never reach a real output."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from accel_helpers import crossings as count_crossings
from onnx_builders import make_model, vi

from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel, compare_outputs

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _conv(rng, name, x, y, cin, cout, k=3, group=1, gain=1.0):
    w = rng.normal(0, gain / np.sqrt(cin // group * k * k), (cout, cin // group, k, k))
    b = rng.normal(0, 0.3, cout)
    return ([helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], kernel_shape=[k, k],
                              pads=[k // 2] * 4, group=group)],
            [numpy_helper.from_array(w.astype(np.float32), f"{name}_w"),
             numpy_helper.from_array(b.astype(np.float32), f"{name}_b")])


def _block(rng, cin, c, hw, n):
    """A stem conv, then a MobileNetV3/EfficientNet block: conv + HardSwish, depthwise conv
    + SiLU (x * Sigmoid(x)), squeeze-excitation (GlobalAveragePool, 1x1 conv + Relu, 1x1
    conv + Sigmoid, Mul by the gate), a projection and a residual Add after a Sigmoid."""
    h = helper.make_node
    parts = [_conv(rng, "stem", "x", "x0", cin, cin),
             _conv(rng, "expand", "x0", "e", cin, c),
             ([h("HardSwish", ["e"], ["e1"])], []),
             _conv(rng, "dw", "e1", "d", c, c, group=c),
             ([h("Sigmoid", ["d"], ["ds"]), h("Mul", ["d", "ds"], ["d1"]),
               h("GlobalAveragePool", ["d1"], ["g"])], []),
             _conv(rng, "fc1", "g", "g1", c, 8, k=1),
             ([h("Relu", ["g1"], ["g2"])], []),
             _conv(rng, "fc2", "g2", "g3", 8, c, k=1),
             ([h("Sigmoid", ["g3"], ["gate"]), h("Mul", ["d1", "gate"], ["se"])], []),
             _conv(rng, "proj", "se", "p", c, cin, k=1),
             ([h("Sigmoid", ["p"], ["ps"]), h("Add", ["ps", "x0"], ["y"])], [])]
    nodes = [node for ns, _ in parts for node in ns]
    inits = [i for _, its in parts for i in its]
    shape = (n, cin, hw, hw)
    m = make_model(nodes, [vi("x", list(shape))], [vi("y", None)], inits)
    calib = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(3)]
    return quantize_model(m, calib, input_shapes={"x": shape}), shape


def _check(q, feeds, tmp_path, monkeypatch):
    """Bit-exact with the all-CPU build on fsim and the cycle model, where the kernels work
    on views of the executor's DRAM (no copy: no layout time) and, after a save and load,
    where the executor offers no views (the values copied out and back: layout time)."""
    from celosia.sim.fsim import FunctionalSimulator

    model = AccelModel.build(q)
    want = model.cpu_build().run(feeds)
    for target in ("fsim", "cycle"):
        got = model.run(feeds, target=target)
        same, detail = compare_outputs(got, want, exact=True)
        assert same, f"{target}: {detail['summary']}"
        rows = {r["node"]: r for r in model.report}
        assert all(rows[k]["layout_ms"] == 0 and rows[k]["cpu_ms"] > 0 for k in model.packed)
    model.save(tmp_path / "m.cel")
    loaded = AccelModel.load(tmp_path / "m.cel")
    assert loaded.packed == model.packed
    monkeypatch.setattr(FunctionalSimulator, "dram_view", lambda self, addr, n: None)
    for target in ("fsim", "cycle"):
        same, detail = compare_outputs(loaded.run(feeds, target=target), want, exact=True)
        assert same, f"{target}, copies: {detail['summary']}"
        rows = {r["node"]: r for r in loaded.report}
        assert all(rows[k]["layout_ms"] > 0 for k in loaded.packed)  # DRAM reads, writes
    return model


@pytest.mark.parametrize("cin,c,hw,n", [(20, 40, 6, 1), (8, 20, 5, 2)])
def test_tables_in_place_keep_a_block_on_the_accelerator(cin, c, hw, n, tmp_path, monkeypatch):
    rng = np.random.default_rng(c + n)
    q, shape = _block(rng, cin, c, hw, n)
    ops = {nd.name: nd.op for nd in q.nodes}
    luts = [k for k, op in ops.items() if op == "QLut"]
    assert len(luts) == 4, [nd.op for nd in q.nodes]  # HardSwish, SiLU's, the gate's, proj's
    # the table of Sigmoid maps the padding channels' 0 to about half its range
    assert any(int(q.initializers[nd.inputs[1]][128]) != 0 for nd in q.nodes
               if nd.op == "QLut")
    model = _check(q, {"x": rng.normal(0, 1, shape).astype(np.float32)}, tmp_path, monkeypatch)
    places = model.placements
    assert model.packed == set(luts)
    for name, op in ops.items():
        if op in ("QConv", "QGlobalAveragePool", "QMul", "QAdd"):
            assert places[name].target == "accel", (name, places[name].reason)
    assert {ops[k] for k, p in places.items() if p.target == "cpu"} == \
        {"Quantize", "Dequantize", "QLut"}
    s = model.summary()
    assert s["crossings"] == 2 == count_crossings(q, places)  # the input and the output
    assert s["in_place"] == 2 * len(luts)  # each table reads and writes one DRAM value
    # the gate's table wrote garbage into the padding channels (which never reach y)
    gate = next(nd.outputs[0] for nd in q.nodes if nd.op == "QLut" and
                q.types[nd.outputs[0]].shape[2:] == (1, 1))
    v = model.values[gate]
    raw = model._executors["fsim"].read_dram(v["addr"], int(np.prod(v["shape"])))
    assert raw.view(np.int8).reshape(v["shape"])[:, -1, ..., c % 16:].any()
    rows = {r["node"]: r for r in model.report}
    assert all(rows[k].get("in_place") and rows[k]["target"] == "cpu" for k in luts)


def test_table_between_dense_layers_on_padded_rows(tmp_path, monkeypatch):
    """[70, 24] rows: the packed layout pads them to 72 (dense_rows); Gemm, Sigmoid (a
    QLut in place, over the padding rows too), Gemm: bit-exact, two crossings."""
    rng = np.random.default_rng(5)
    h = helper.make_node
    w1 = rng.normal(0, 0.2, (24, 40)).astype(np.float32)
    w2 = rng.normal(0, 0.2, (40, 10)).astype(np.float32)
    nodes = [h("Gemm", ["x", "w1"], ["a"]), h("Sigmoid", ["a"], ["s"]),
             h("Gemm", ["s", "w2"], ["y"])]
    m = make_model(nodes, [vi("x", [70, 24])], [vi("y", None)],
                   [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    calib = [{"x": rng.normal(0, 1, (70, 24)).astype(np.float32)} for _ in range(3)]
    q = quantize_model(m, calib, input_shapes={"x": (70, 24)})
    model = _check(q, {"x": rng.normal(0, 1, (70, 24)).astype(np.float32)}, tmp_path,
                   monkeypatch)
    lut = [nd.name for nd in q.nodes if nd.op == "QLut"]
    assert model.packed == set(lut) and len(lut) == 1
    assert model.values[q.nodes[[nd.op for nd in q.nodes].index("QLut")].inputs[0]][
        "shape"][0] == 72
    assert model.summary()["crossings"] == 2 == count_crossings(q, model.placements)


@pytest.mark.parametrize("preset", ["default", "small"])
@pytest.mark.parametrize("shape", [(128, 384), (70, 32), (3, 20), (1, 48, 1, 1), (4, 32, 1, 1),
                                   (1, 32, 2, 2), (2, 32, 5), (2, 20, 3, 3)])
def test_pack_and_unpack_round_trip(preset, shape):
    """pack_value/unpack_value, also where the packed bytes are row-major (BATCH 1, whole
    channel blocks, one pixel, no padding rows: a reshape, no copy of its own), and
    pack_value into given memory."""
    from celosia.compiler.accel.partition import pack_value, packed_shape, unpack_value
    from celosia.config import HwConfig

    cfg = HwConfig.load(preset)
    x = np.random.default_rng(len(shape)).integers(-128, 128, shape, dtype=np.int8)
    p = pack_value(x, cfg)
    assert p.shape == packed_shape(shape, cfg)
    b, k = cfg.batch, cfg.block
    if len(shape) == 2:
        rows = -(-shape[0] // b) * b
        want = np.zeros((p.shape[0] * b, p.shape[1] * k), np.int8)
        want[:shape[0], :shape[1]] = x
        want = want.reshape(p.shape[0], b, p.shape[1], k).transpose(0, 2, 1, 3)
        assert rows <= p.shape[0] * b
        np.testing.assert_array_equal(p, want)
    np.testing.assert_array_equal(unpack_value(p, shape), x)
    # packed into memory that held anything (a view of DRAM): the same bytes, padding zeroed
    out = np.random.default_rng(1).integers(-128, 128, p.shape, dtype=np.int8)
    assert pack_value(x, cfg, out=out) is out
    np.testing.assert_array_equal(out, p)


def test_the_artifact_names_its_in_place_nodes(tmp_path, monkeypatch):
    """The manifest lists the in-place nodes (``in_place``); a name that cannot run in place
    is refused at load, naming the field; an artifact without the field (written before
    in-place nodes existed: its tables are ordinary CPU segments) loads and runs them so."""
    import json
    import zipfile

    from accel_helpers import edit_manifest

    from celosia.compiler.accel import partition as inplace
    from celosia.runtime.artifact import ArtifactError

    rng = np.random.default_rng(11)
    q, shape = _block(rng, 8, 20, 4, 1)
    feeds = {"x": rng.normal(0, 1, shape).astype(np.float32)}
    model = AccelModel.build(q)
    model.save(tmp_path / "m.cel")
    with zipfile.ZipFile(tmp_path / "m.cel") as z:
        assert json.loads(z.read("manifest.json"))["in_place"] == sorted(model.packed)

    def add_quantize(doc):
        doc["in_place"].append(next(n.name for n in q.nodes if n.op == "Quantize"))
    edit_manifest(tmp_path / "m.cel", add_quantize, tmp_path / "bad.cel")
    with pytest.raises(ArtifactError, match="in_place"):
        AccelModel.load(tmp_path / "bad.cel")

    # an older build: no node in place (its tables and what reads them on the CPU)
    monkeypatch.setattr(inplace, "packed_nodes", lambda graph, placements: set())
    old = AccelModel.build(q)
    assert old.packed == set()
    old.save(tmp_path / "old.cel")
    edit_manifest(tmp_path / "old.cel", lambda doc: doc.pop("in_place"))
    monkeypatch.undo()
    loaded = AccelModel.load(tmp_path / "old.cel")
    assert loaded.packed == set()
    want = model.cpu_build().run(feeds)
    same, detail = compare_outputs(loaded.run(feeds, target="fsim"), want, exact=True)
    assert same, detail["summary"]
    assert loaded.summary()["crossings"] > 2 and loaded.summary()["in_place"] == 0


def test_runs_with_other_inputs_reuse_no_stale_memory():
    """Values crossing through the compiled pack/unpack kernels (images past
    packed_layout.COMPILED_LAYOUT_BYTES), unpacked into buffers kept from run to run: two runs
    with other inputs are each bit-exact, and the first run's outputs are left as they
    were."""
    from celosia.compiler.cpu.packed_layout import COMPILED_LAYOUT_BYTES

    rng = np.random.default_rng(21)
    q, shape = _block(rng, 32, 40, 24, 1)
    assert np.prod(shape) >= COMPILED_LAYOUT_BYTES
    model = AccelModel.build(q)
    cpu = model.cpu_build()
    feeds = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
    first = model.run(feeds[0], target="fsim")
    kept = {k: v.copy() for k, v in first.items()}
    second = model.run(feeds[1], target="fsim")
    for got, f in ((first, feeds[0]), (second, feeds[1])):
        same, detail = compare_outputs(got, cpu.run(f), exact=True)
        assert same, detail["summary"]
    for k in kept:
        np.testing.assert_array_equal(first[k], kept[k])
        assert not np.array_equal(first[k], second[k])


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 5, 19), (3, 19, 21)), ((1, 12, 128, 32),
                                                                           (1, 12, 32, 128))])
def test_matmul_operands_packed_into_memory_that_held_anything(a_shape, b_shape):
    """pack_matrices/pack_weights(out=): the bytes of a fresh pack, padding zeroed (the
    runtime packs QMatMul operands straight into views of DRAM)."""
    from celosia.compiler.accel.matmul import pack_matrices, pack_weights
    from celosia.config import HwConfig

    cfg = HwConfig()
    rng = np.random.default_rng(len(a_shape))
    for fn, shape in ((pack_matrices, a_shape), (pack_weights, b_shape)):
        x = rng.integers(-128, 128, shape, dtype=np.int8)
        fresh = fn(x, cfg)
        out = rng.integers(-128, 128, fresh.shape, dtype=np.int8)
        assert fn(x, cfg, out=out) is out
        np.testing.assert_array_equal(out, fresh)


@pytest.mark.slow
def test_block_on_the_rtl_agrees_with_the_cycle_model():
    """The small configuration on the RTL: the block's QMul by its gate and its other ALU
    programs, with the tables computed in place in the RTL's DRAM between them, give the
    all-CPU build's outputs and the cycle model's cycle counts."""
    rng = np.random.default_rng(17)
    q, shape = _block(rng, 8, 12, 4, 1)
    model = AccelModel.build(q, "small")
    assert any(n.op == "QMul" and model.placements[n.name].target == "accel"
               for n in model.graph.nodes)
    assert model.packed
    feeds = {"x": rng.normal(0, 1, shape).astype(np.float32)}
    want = model.cpu_build().run(feeds)
    rtl = model.run(feeds, target="rtl")
    same, detail = compare_outputs(rtl, want, exact=True)
    assert same, detail["summary"]
    rtl_cycles = [r["cycles"] for r in model.report if r["target"] == "accel"]
    model.run(feeds, target="cycle")
    assert [r["cycles"] for r in model.report if r["target"] == "accel"] == rtl_cycles


@pytest.mark.parametrize("preset", ["default", "small"])
@pytest.mark.parametrize("shape", [(1, 40, 33, 31), (1, 24, 1, 5000), (1, 24, 3000)])
def test_large_images_cross_through_the_compiled_kernels(preset, shape, monkeypatch):
    """The runtime packs and unpacks an image past COMPILED_LAYOUT_BYTES with the compiled
    kernels (compiler/cpu/packed_layout.py): the bytes partition.pack_value's numpy gives,
    also into memory that held anything, and back."""
    from celosia.compiler.accel.partition import pack_value, packed_shape, unpack_value
    from celosia.compiler.cpu import packed_layout
    from celosia.config import HwConfig
    from celosia.runtime.crossing import _pack, _unpack

    cfg = HwConfig.load(preset)
    x = np.random.default_rng(len(shape)).integers(-128, 128, shape, dtype=np.int8)
    assert x.size >= packed_layout.COMPILED_LAYOUT_BYTES
    calls = []
    for name in ("pack_fast", "unpack_fast"):
        fn = getattr(packed_layout, name)
        monkeypatch.setattr(packed_layout, name, lambda *a, _fn=fn, _n=name: (
            calls.append(_n), _fn(*a))[1])
    want = pack_value(x, cfg)
    np.testing.assert_array_equal(_pack(x, cfg), want)
    into = np.full(packed_shape(shape, cfg), 5, np.int8)
    assert _pack(x, cfg, None, into) is into
    np.testing.assert_array_equal(into, want)
    np.testing.assert_array_equal(_unpack(want, shape, None, cfg), unpack_value(want, shape))
    np.testing.assert_array_equal(_unpack(want, shape, None, cfg, np.zeros(shape, np.int8)), x)
    assert calls == ["pack_fast", "pack_fast", "unpack_fast", "unpack_fast"]
