"""Whole models on the reference executor against onnxruntime, and bad models."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from celosia.compiler.graph.ir import InputShapeError, ModelLoadError, UnsupportedOperatorError
from celosia.errors import CelosiaError
from celosia.models import zoo as models
from celosia.runtime.reference import ReferenceModel


def onnxruntime_run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def compare(model, shape, seed=1):
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    ref = ReferenceModel.load(model)
    (got,) = ref.run({"image": x}).values()
    (want,) = onnxruntime_run(model, {"image": x})
    assert got.shape == want.shape and got.dtype == want.dtype
    # rtol 1e-4 (the bar); atol relative to the output's scale for values near 0.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    return got


def test_parameter_counts():
    assert models.parameter_count(models.resnet18()) == 11_689_512
    assert models.parameter_count(models.mobilenet_v2()) == 3_504_872
    assert models.parameter_count(models.resnet50()) == 25_557_032  # torchvision's


def test_small_cnn():
    y = compare(models.small_cnn(batch=4), (4, 1, 8, 8))
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-5)


@pytest.mark.parametrize("build", [models.resnet18, models.mobilenet_v2])
@pytest.mark.parametrize("size", [64, 224])
def test_imagenet_models(build, size):
    y = compare(build(image_size=size), (1, 3, size, size))
    assert y.std() > 0.1  # the random network's output is not degenerate


# ---- bad models: a CelosiaError (one line in the CLI), never a traceback -------------------


def test_truncated_file(tmp_path):
    data = models.mobilenet_v2(image_size=32).SerializeToString()
    path = tmp_path / "mobilenet.onnx"
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelLoadError, match="mobilenet.onnx") as e:
        ReferenceModel.load(path)
    assert isinstance(e.value, CelosiaError)


def test_wrong_input_shape():
    ref = ReferenceModel.load(models.small_cnn())
    with pytest.raises(InputShapeError, match=r"'image' is float32\[1,1,28,28\].*"
                                              r"float32\[1,1,8,8\]"):
        ref.run({"image": np.zeros((1, 1, 28, 28), np.float32)})
    with pytest.raises(InputShapeError, match=r"float64\[1,1,8,8\]"):
        ref.run({"image": np.zeros((1, 1, 8, 8))})


def test_unsupported_operator():
    m = models.small_cnn()
    for k, node in enumerate(m.graph.node):
        if node.op_type == "Softmax":
            m.graph.node[k].CopyFrom(helper.make_node("StringNormalizer", node.input,
                                                      node.output, name="head"))
        if node.op_type == "MaxPool":
            m.graph.node[k].CopyFrom(helper.make_node("TfIdfVectorizer", node.input,
                                                      node.output, name="pool"))
    with pytest.raises(UnsupportedOperatorError,
                       match=r"2 unsupported nodes: TfIdfVectorizer: 1 node \('pool'\); "
                             r"StringNormalizer: 1 node \('head'\)"):
        ReferenceModel.load(m)


def test_input_shapes_for_a_dynamic_batch():
    m = models.small_cnn()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    ref = ReferenceModel.load(m, {"image": (3, 1, 8, 8)})
    x = np.random.default_rng(0).normal(size=(3, 1, 8, 8)).astype(np.float32)
    (got,) = ref.run({"image": x}).values()
    (want,) = onnxruntime_run(m, {"image": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
