"""The digits split, the bundled digits CNN (against onnxruntime and celosia's numpy
reference executor) and its numpy training script."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.reference import run_graph
from celosia.errors import CelosiaError
from celosia.models import digits, train_digits


@pytest.fixture(scope="module")
def split():
    return digits.load_split()


@pytest.fixture(scope="module")
def onnxruntime_outputs(split):
    x, _ = split["test"]
    session = ort.InferenceSession(str(digits.model_path()),
                                   providers=["CPUExecutionProvider"])
    probs, logits = session.run(["probs", "logits"], {"image": x})
    return probs, logits


def test_split_sizes_types_and_shapes(split):
    sizes = {"train": 1797 - 360, "calibration": 64, "test": 360}
    assert set(split) == set(sizes)
    for name, (x, y) in split.items():
        assert x.shape == (sizes[name], 1, 8, 8) and x.dtype == np.float32
        assert y.shape == (sizes[name],) and y.dtype == np.int64
        assert 0.0 <= x.min() and x.max() <= 1.0
        assert set(np.unique(y)) <= set(range(10))
    assert split["train"][0].max() == 1.0
    np.testing.assert_array_equal(split["calibration"][0], split["train"][0][:64])
    np.testing.assert_array_equal(split["calibration"][1], split["train"][1][:64])


def test_split_is_deterministic_and_disjoint(split):
    again = digits.load_split()
    for name in split:
        for a, b in zip(split[name], again[name]):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(digits.load_split(seed=1)["test"][1], split["test"][1])
    # The digits data set holds no duplicate images, so disjoint images mean disjoint splits.
    train = {x.tobytes() for x in split["train"][0]}
    test = {x.tobytes() for x in split["test"][0]}
    assert len(train) == 1797 - 360 and len(test) == 360 and not train & test


def test_bundled_model_interface():
    model = onnx.load(digits.model_path())
    onnx.checker.check_model(model)
    (image,) = model.graph.input
    dims = image.type.tensor_type.shape.dim
    assert image.name == "image"
    assert dims[0].dim_param == "N" and [d.dim_value for d in dims[1:]] == [1, 8, 8]
    assert [o.name for o in model.graph.output] == ["probs", "logits"]
    assert [n.op_type for n in model.graph.node] == [
        "Conv", "Relu", "Conv", "Relu", "Conv", "Add", "Relu", "Flatten", "Gemm", "Softmax"]
    assert digits.MODEL_PATH.stat().st_size < 200_000


def test_bundled_model_accuracy_and_dynamic_batch(split, onnxruntime_outputs):
    x, y = split["test"]
    probs, logits = onnxruntime_outputs
    assert probs.shape == logits.shape == (360, 10)
    assert digits.accuracy(probs, y) >= 0.97
    assert digits.accuracy(logits, y) == digits.accuracy(probs, y)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    session = ort.InferenceSession(str(digits.model_path()),
                                   providers=["CPUExecutionProvider"])
    (one,) = session.run(["probs"], {"image": x[:1]})
    np.testing.assert_allclose(one, probs[:1], atol=1e-6)


@pytest.mark.parametrize("optimized", [False, True], ids=["imported", "optimized"])
def test_bundled_model_matches_reference_executor(split, onnxruntime_outputs, optimized):
    x, _ = split["test"]
    graph = import_onnx(digits.model_path(), {"image": (360, 1, 8, 8)})
    if optimized:
        graph = optimize(graph)
    got = run_graph(graph, {"image": x})
    probs, logits = onnxruntime_outputs
    np.testing.assert_allclose(got["probs"], probs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got["logits"], logits, rtol=1e-5, atol=1e-5 * np.abs(logits).max())


def test_numpy_forward_matches_bundled_model(split, onnxruntime_outputs):
    params = {t.name: onnx.numpy_helper.to_array(t)
              for t in onnx.load(digits.model_path()).graph.initializer}
    probs, _ = onnxruntime_outputs
    logits = train_digits.predict(params, split["test"][0])
    np.testing.assert_allclose(train_digits.softmax(logits), probs, rtol=0, atol=1e-5)


def test_short_training_run_writes_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "sub" / "digits.onnx"
    assert train_digits.main(["--out", str(out), "--epochs", "1", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "epoch  1/1" in printed and "fp32 test accuracy" in printed
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x, y = digits.load_split()["test"]
    probs, logits = session.run(None, {"image": x[:50]})
    assert probs.shape == logits.shape == (50, 10)
    assert digits.accuracy(probs, y[:50]) > 0.5


def test_missing_model_says_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.setattr(digits, "MODEL_PATH", tmp_path / "digits_cnn.onnx")
    with pytest.raises(CelosiaError, match="python -m celosia.models.train_digits"):
        digits.model_path()
