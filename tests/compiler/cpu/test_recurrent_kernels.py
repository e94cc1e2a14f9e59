"""The compiled LSTM, GRU and RNN layers (compiler/cpu/kernels_recurrent.py) against the
numpy reference (graph/ops_recurrent.py) on seeded random weights and inputs: every
direction, layout and sequence-length case at small sizes, batch 1 and more (tails of the
4-row register tiles), odd hidden sizes (padded gate blocks), every attribute the kernels
cover; what they do not cover stays a numpy step; the zoo's LSTM against onnxruntime."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx_builders import recurrent_layer as layer, vi

from celosia.compiler.cpu.codegen import compile_cpu
from celosia.compiler.cpu.kernels_recurrent import sigmoid, tanh
from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.tensor.expr import Var
from celosia.compiler.tensor.tir import Buffer, For, PrimFunc, Store, seq
from celosia.runtime.cpu import CpuModel

def x_for(m, seed=1):
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def check(m, *, compiled=True):
    """The CPU build against the numpy reference, 1e-5 relative; which step kind ran it."""
    feeds = {"X": x_for(m)}
    want = run_graph(optimize(import_onnx(m)), feeds)
    built = CpuModel.build(m)
    kinds = {s["kind"] for s in built.program.steps if s["node"] == "rnn"}
    assert kinds == ({"kernel"} if compiled else {"numpy"})
    got = built.run(feeds)
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, k
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    return got


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_directions_layouts_and_lengths(op, direction, layout):
    """Batch 3 with lengths (one 0, one short), hidden 17 (gate blocks padded to 32); and
    batch 1, full lengths, hidden 5, no initial state."""
    got = check(layer(op, direction=direction, layout=layout, hidden=17, seq_lens=[6, 0, 2]))
    y = got["Y"] if layout == 0 else got["Y"].transpose(1, 2, 0, 3)  # [T, dirs, B, H]
    assert not y[2:, :, 2].any() and not y[:, :, 1].any()
    check(layer(op, direction=direction, layout=layout, batch=1, initial=False))


@pytest.mark.parametrize("threads, step_parallel", [
    (1, 0), (2, None), pytest.param(3, 0, marks=pytest.mark.slow),
    pytest.param(4, 0, marks=pytest.mark.slow)])
def test_thread_counts(threads, step_parallel, monkeypatch):
    """Built for one thread, or steps too small for a barrier each: a direction's time loop
    in one function (bidirectional: a direction per thread); else a segment per phase and
    step, the slices in parts per thread (3 parts of 4 slices: uneven)."""
    from celosia.compiler.cpu import kernels_recurrent

    monkeypatch.setenv("CELOSIA_NUM_THREADS", str(threads))
    if step_parallel is not None:
        monkeypatch.setattr(kernels_recurrent, "STEP_PARALLEL_MACS", step_parallel)
    # (hidden 64, batch 3: 4 slices of 16 units)
    check(layer("LSTM", hidden=64, seq_lens=[6, 0, 2], peepholes=True))
    check(layer("GRU", direction="bidirectional", layout=1, hidden=40, seq_lens=[3, 6, 1]))
    built = CpuModel.build(layer("RNN", direction="bidirectional", hidden=40))
    segments = [len(k.segments) for k in built.program.kernels.values() if k.name == "recurrent"]
    # init, the steps (one function, or phase and tick per step), final
    assert segments == ([2 + 2 * 6] if threads == 4 else [3])


@pytest.mark.parametrize("batch", [5, 6])
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_row_tile_tails(op, batch):
    """Batches of 4-row register tiles plus a tail of 1 or 2 rows, lengths per row."""
    check(layer(op, batch=batch, hidden=9, steps=4, seq_lens=[4, 1, 3, 0, 2, 4][:batch]))


def test_lstm_peepholes_input_forget_and_clip():
    check(layer("LSTM", direction="bidirectional", peepholes=True, clip=0.7, hidden=17))
    check(layer("LSTM", direction="reverse", peepholes=True, input_forget=1, batch=1))


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_linear_before_reset_and_clip(linear_before_reset):
    check(layer("GRU", direction="bidirectional", linear_before_reset=linear_before_reset,
                clip=0.4, hidden=17, seq_lens=[3, 6, 0]))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_without_bias(op):
    check(layer(op, bias=False, hidden=8))


def test_wide_layer_batch_one():
    """Hidden 100 (padded to 112; tiles of 128, 64 and 16 columns), 40 steps: the long
    recurrence stays within 1e-5 of numpy."""
    check(layer("LSTM", hidden=100, size=24, steps=40, batch=1))
    check(layer("GRU", hidden=100, size=24, steps=40, batch=2, linear_before_reset=1))


def test_uncovered_attributes_stay_numpy():
    """Other activations, and lengths known only at run time (numpy checks their range),
    keep the numpy step (its results, not wrong ones)."""
    from celosia.compiler.cpu.lower_recurrent import numpy_reason
    from celosia.compiler.cpu.lowering import _Lowering

    m = layer("GRU", activations=["HardSigmoid", "Softsign"])
    check(m, compiled=False)
    graph = optimize(import_onnx(m))
    assert "the kernels compute the default ['Sigmoid', 'Tanh']" in \
        numpy_reason(_Lowering(graph), graph.nodes[0])
    # sequence_lens as a graph input
    lens_model = layer("RNN", seq_lens=[1, 2, 3])
    lens_model.graph.initializer.remove(
        next(i for i in lens_model.graph.initializer if i.name == "L"))
    lens_model.graph.input.append(vi("L", [3], TensorProto.INT32))
    feeds = {"X": x_for(lens_model), "L": np.array([6, 0, 3], np.int32)}
    built = CpuModel.build(lens_model)
    assert {s["kind"] for s in built.program.steps if s["node"] == "rnn"} == {"numpy"}
    want = run_graph(optimize(import_onnx(lens_model)), feeds)
    np.testing.assert_allclose(built.run(feeds)["Y"], want["Y"], rtol=1e-5, atol=1e-6)


def test_activations_to_float32_accuracy():
    """The kernels' sigmoid and tanh within 1e-6 relative of float64 on [-20, 20] and on
    tiny arguments (tanh keeps its relative accuracy near 0)."""
    x = np.concatenate([np.linspace(-20, 20, 40001), np.geomspace(1e-8, 1, 2001),
                        -np.geomspace(1e-8, 1, 2001)]).astype(np.float32)
    x = np.pad(x, (0, -len(x) % 16))
    n = len(x)
    src, out = Buffer("x", (n,), "float32"), Buffer("y", (2, n), "float32")
    i = Var("i")
    body = For(i, n, Store(out, (0, i), sigmoid(src[i])), "vectorize")
    j = Var("j")
    body2 = For(j, n, Store(out, (1, j), tanh(src[j])), "vectorize")
    kernel = compile_cpu(PrimFunc("acts", (src, out), seq(body, body2)), use_cache=False)
    y = np.zeros((2, n), np.float32)
    kernel(x, y)
    x64 = x.astype(np.float64)
    want = np.stack([1 / (1 + np.exp(-x64)), np.tanh(x64)])
    rel = np.abs(y - want) / np.maximum(np.abs(want), 1e-30)
    assert rel[0].max() < 1e-6 and rel[1].max() < 1e-6, rel.max(axis=1)


def test_zoo_lstm_small_against_onnxruntime():
    """The zoo's stacked LSTM (torch export, small): both layers compiled, onnxruntime's
    logits."""
    from celosia.models import recurrent

    m = recurrent.lstm(features=12, hidden=24, time=9, batch=2)
    x = np.random.default_rng(0).normal(size=(2, 9, 12)).astype(np.float32)
    built = CpuModel.build(m, {"features": x.shape})
    assert [s["kind"] for s in built.program.steps if s["op"] == "LSTM"] == ["kernel"] * 4
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"features": x})
    np.testing.assert_allclose(built.run({"features": x})["logits"], want, rtol=1e-5,
                               atol=1e-6)


def test_cel_manifest_kernel_step_with_several_outputs(tmp_path):
    """A .cel keeps the recurrent step writing Y, Y_h and Y_c; the manifest check holds a
    kernel step's outputs to exactly the parameters its kernel writes."""
    import hashlib
    import io
    import json
    import zipfile

    from celosia.runtime.artifact import ArtifactError, seal

    m = layer("LSTM", batch=2)
    path = tmp_path / "lstm.cel"
    CpuModel.build(m).save(path)
    feeds = {"X": x_for(m)}
    want = run_graph(optimize(import_onnx(m)), feeds)
    got = CpuModel.load(path).run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)

    def edited(outputs, name, blank_inputs=False):
        with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as z:
            table = {n: z.read(n) for n in z.namelist()}
        doc = json.loads(table["manifest.json"])
        step = next(s for s in doc["program"]["steps"] if len(s["outputs"]) == 3)
        step["outputs"] = outputs(step["outputs"])
        step["inputs"] = step["inputs"][:-3] + outputs(step["inputs"][-3:]) \
            if blank_inputs else step["inputs"]
        table["manifest.json"] = json.dumps(doc).encode()
        for n, entry in doc["members"].items():
            entry["sha256"] = hashlib.sha256(table[n]).hexdigest()
        table["manifest.json"] = json.dumps(doc).encode()
        table["manifest.sha256"] = seal(table["manifest.json"])
        out = tmp_path / name
        with zipfile.ZipFile(out, "w") as z:
            for n, d in table.items():
                z.writestr(n, d)
        return out

    with pytest.raises(ArtifactError, match=r"'Y_c' is read before any step makes it"):
        CpuModel.load(edited(lambda o: o[:2], "two.cel"))
    with pytest.raises(ArtifactError, match="a kernel step has named inputs and outputs"):
        CpuModel.load(edited(lambda o: o[:2] + [""], "empty.cel", blank_inputs=True))
