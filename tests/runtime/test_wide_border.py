"""The border of a wide product run from the host (runtime/wide_border.py): in place on the
executor's DRAM it writes the same operand bytes as the packing definition
(compiler/accel/wide.py pack_wide_activation) and reads the same products as the unpacking
ones (unpack_acc32, combine_exact, unpack_int64), for each kind of program, fewer rows than
the buffer has and shapes changing between launches; where the executor offers no views it
copies, with the same bits. Whole models (a recurrent layer, a Loop, an If with an LSTM and
a convolution) agree bit for bit with the int8 CPU build either way, their exact products
put together on the ALU (carry programs) and the layer's border only where it crosses."""

import os

import numpy as np
import pytest
from onnx_builders import recurrent_layer

from celosia.compiler.accel.wide import (combine_exact, exact_correction, pack_wide_activation,
                                         unpack_acc32, unpack_int64)
from celosia.compiler.pipeline import quantize_model
from celosia.config import HwConfig
from celosia.models import recurrent
from celosia.runtime.accel import AccelModel, compare_outputs
from celosia.runtime.wide_border import WideBorder
from celosia.sim.fsim import FunctionalSimulator


_USUAL_CACHE = os.environ.get("CELOSIA_CACHE")

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _record(cfg, rows, k, o, mode, accumulators):
    b, blk = cfg.batch, cfg.block
    planes = {0: 4, 1: 4 * accumulators, 2: 8}[mode]
    return {"a_addr": 4096, "out_addr": 1 << 16, "o": o, "m": rows, "k": k,
            "a_shape": [2, rows // b, -(-k // blk), b, blk],
            "out_shape": [planes, rows // b, -(-o // blk), b, blk],
            "spec": [rows, -(-k // blk) * blk, -(-o // blk) * blk, 2, 1, mode]}


@pytest.mark.parametrize("preset", ["default", "small"])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("views", [True, False])
def test_the_border_is_the_packing_and_unpacking_definition(preset, mode, views, monkeypatch):
    if not views:
        monkeypatch.setattr(FunctionalSimulator, "dram_view", lambda self, addr, n: None)
    cfg = HwConfig.load(preset)
    rng = np.random.default_rng(mode + 3 * views)
    rows = 4 * cfg.batch
    kd, o = 40, 70  # neither a multiple of BLOCK
    ex = FunctionalSimulator(cfg, 1 << 20)
    rec = _record(cfg, rows, kd, o, mode, 3)
    w = rng.integers(-30000, 30000, (o, kd)).astype(np.int16)
    corr = exact_correction(w) if mode == 1 else None
    border = WideBorder(ex, cfg, rec, corr)
    assert border.in_place == (views and cfg.batch == 1)
    a_bytes = int(np.prod(rec["a_shape"]))
    out_bytes = int(np.prod(rec["out_shape"]))
    for m in (1, rows, 3, 3):  # shapes change between launches, and stay
        a = rng.integers(-32768, 32768, (m, kd)).astype(np.int16)
        a[0, :2] = (-32768, 32767)
        border.put(a)
        want = pack_wide_activation(a, cfg, rows=rows)
        got = ex.read_dram(rec["a_addr"], a_bytes).view(np.int8).reshape(want.shape)
        # rows past m and padded columns meet zero weights or are never read back
        # (the int16 1's low digit, -127, marks the places of both digits)
        mask = pack_wide_activation(np.ones((m, kd), np.int16), cfg, rows=rows) != 0
        mask = np.broadcast_to(mask[1:], mask.shape)
        assert mask.sum() == 2 * m * kd
        np.testing.assert_array_equal(got[mask], want[mask])
        raw = rng.integers(-128, 128, out_bytes).astype(np.int8)
        ex.write_dram(rec["out_addr"], raw)
        planes = raw.reshape(rec["out_shape"])
        result = border.take(m)
        if mode == 0:
            expect = unpack_acc32(planes, m, o)
        elif mode == 1:
            expect = combine_exact(planes, m, o, corr)
        else:
            expect = unpack_int64(planes, m, o)
        assert result.shape == (m, o) and result.dtype == expect.dtype
        np.testing.assert_array_equal(result, expect)


def _models():
    lstm = recurrent_layer("LSTM", seed=3, direction="bidirectional", hidden=20, size=33,
                           batch=1, steps=9)
    shape = [d.dim_value for d in lstm.graph.input[0].type.tensor_type.shape.dim]
    feeds = [{"X": np.random.default_rng(s).normal(size=shape).astype(np.float32)}
             for s in range(5)]
    yield "lstm", lstm, feeds[:4], feeds[4]
    loop = recurrent.control_flow(features=8, hidden=40, classes=5, time=6, batch=1)
    rng = np.random.default_rng(0)
    args = dict(batch=1, time=6, features=8)
    yield "loop", loop, [recurrent.control_flow_feeds(args, rng) for _ in range(3)], \
        recurrent.control_flow_feeds(args, rng)


@pytest.mark.parametrize("name,model,calib,test", list(_models()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_models_agree_with_and_without_views(name, model, calib, test, monkeypatch):
    q = quantize_model(model, calib, input_shapes={k: v.shape for k, v in test.items()})
    built = AccelModel.build(q, "default")
    want = built.cpu_build().run(test)
    modes = [p["spec"][5] for prog in built.programs.values()
             for p in prog.get("products", []) + [p for b in prog.get("bodies", [])
                                                  for p in b["products"]]]
    assert modes, "no wide products on the accelerator"
    if name == "loop":  # the body's int16 x int16 product: exact, put together on the ALU
        assert 2 in modes, modes
    for target in ("fsim", "cycle"):
        same, detail = compare_outputs(built.run(test, target=target), want, exact=True)
        assert same, f"{target}: {detail['summary']}"
    monkeypatch.setattr(FunctionalSimulator, "dram_view", lambda self, addr, n: None)
    fresh = AccelModel.build(q, "default")
    for target in ("fsim", "cycle"):
        same, detail = compare_outputs(fresh.run(test, target=target), want, exact=True)
        assert same, f"{target}, copies: {detail['summary']}"


def test_the_rtl_runs_the_border_in_place(monkeypatch):
    """The small configuration on the RTL (Verilator): a recurrent layer (32-bit programs)
    and a Loop's body product (a carry program), their borders on views of the RTL's DRAM,
    bit-exact with the int8 CPU build and the cycle model's cycles."""
    # the simulator library from the usual cache (as test_wide.py's RTL test finds it),
    # not built again in this module's private one
    if _USUAL_CACHE is None:
        monkeypatch.delenv("CELOSIA_CACHE", raising=False)
    else:
        monkeypatch.setenv("CELOSIA_CACHE", _USUAL_CACHE)
    lstm = recurrent_layer("LSTM", seed=5, direction="forward", hidden=8, batch=1, steps=3)
    shape = [d.dim_value for d in lstm.graph.input[0].type.tensor_type.shape.dim]
    feeds = [{"X": np.random.default_rng(s).normal(size=shape).astype(np.float32)}
             for s in range(3)]
    loop = recurrent.control_flow(features=4, hidden=8, classes=3, time=3, batch=1)
    rng = np.random.default_rng(1)
    args = dict(batch=1, time=3, features=4)
    for model, calib, test in ((lstm, feeds[:2], feeds[2]),
                               (loop, [recurrent.control_flow_feeds(args, rng)
                                       for _ in range(2)],
                                recurrent.control_flow_feeds(args, rng))):
        q = quantize_model(model, calib, input_shapes={k: v.shape for k, v in test.items()})
        built = AccelModel.build(q, "small")
        want = built.cpu_build().run(test)
        cycles = {}
        for target in ("cycle", "rtl"):
            same, detail = compare_outputs(built.run(test, target=target), want, exact=True)
            assert same, f"{target}: {detail['summary']}"
            cycles[target] = built.summary()["cycles"]
        assert cycles["rtl"] == cycles["cycle"] > 0


def test_a_cel_whose_product_planes_do_not_match_its_mode_is_refused(tmp_path):
    """A .cel's product records say how their results come back (spec's last: 0 int32, 1
    exact, 2 exact with carries) and how many byte planes they hold; a manifest where the
    two disagree is refused when loaded, naming the field."""
    import io
    import json
    import zipfile

    from celosia.runtime.artifact import ArtifactError, seal

    loop = recurrent.control_flow(features=4, hidden=8, classes=3, time=3, batch=1)
    rng = np.random.default_rng(2)
    args = dict(batch=1, time=3, features=4)
    calib = [recurrent.control_flow_feeds(args, rng) for _ in range(2)]
    test = recurrent.control_flow_feeds(args, rng)
    q = quantize_model(loop, calib, input_shapes={k: v.shape for k, v in test.items()})
    built = AccelModel.build(q, "default")
    built.save(tmp_path / "m.cel")
    want = built.cpu_build().run(test)
    same, _ = compare_outputs(AccelModel.load(tmp_path / "m.cel").run(test, target="fsim"),
                              want, exact=True)
    assert same
    data = (tmp_path / "m.cel").read_bytes()
    for mode in (1, 7):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            table = {n: z.read(n) for n in z.namelist()}
        doc = json.loads(table["manifest.json"])
        products = [p for prog in doc["programs"].values() for b in prog.get("bodies", [])
                    for p in b["products"] if p["spec"][5] == 2]
        assert products, "no carry program in the Loop's body"
        products[0]["spec"][5] = mode
        table["manifest.json"] = json.dumps(doc).encode()
        table["manifest.sha256"] = seal(table["manifest.json"])
        path = tmp_path / f"e{mode}.cel"
        with zipfile.ZipFile(path, "w") as z:
            for n, d in table.items():
                z.writestr(n, d)
        with pytest.raises(ArtifactError, match="do not go together"):
            AccelModel.load(path)
