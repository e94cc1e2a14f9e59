"""The vision operators inside models, against onnxruntime through the reference executor
and the compiled CpuModel (also through a .cel file and back): a spatial transformer and a
Fold exported from PyTorch (AffineGrid + GridSample, opset 20; Col2Im, opset 18), and,
built with onnx.helper (no torchvision here), a detection head (NonMaxSuppression on
run-time boxes, the kept boxes gathered into RoiAlign) and a classic CNN block (LRN,
MaxPool indices into MaxUnpool, MeanVarianceNormalization, LpPool, GlobalLpPool,
CenterCropPad, DeformConv)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_nodes import oracle

from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

F32 = np.float32


def _torch_model(module, args, opset):
    import torch

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, f, dynamo=False, opset_version=opset,
                          input_names=["x"], output_names=["y"])
    model = onnx.load_from_string(f.getvalue())
    model.ir_version = 10  # what this onnxruntime reads
    return model


def _spatial_transformer():
    import torch
    from torch import nn
    from torch.nn import functional

    class STN(nn.Module):
        def __init__(self):
            super().__init__()
            self.loc = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                     nn.Flatten(), nn.Linear(8, 6))
            with torch.no_grad():  # near the identity, as a trained one starts
                self.loc[-1].weight.mul_(0.1)
                self.loc[-1].bias.copy_(torch.tensor([1.0, 0.1, 0.05, -0.1, 0.9, 0.0]))
            self.head = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            theta = self.loc(x).view(-1, 2, 3)
            grid = functional.affine_grid(theta, list(x.shape), align_corners=False)
            warped = functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                                            align_corners=False)
            return self.head(warped)

    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((2, 3, 12, 14)).astype(F32)
    return _torch_model(STN(), (torch.from_numpy(x),), 20), {"x": x}, {"AffineGrid",
                                                                        "GridSample"}


def _fold():
    import torch
    from torch import nn

    class Fold(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3 * 2 * 3, 1)
            self.fold = nn.Fold((9, 10), (2, 3))

        def forward(self, x):
            return self.fold(self.conv(x).flatten(2))

    torch.manual_seed(1)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(F32)
    return _torch_model(Fold(), (torch.from_numpy(x),), 18), {"x": x}, {"Col2Im"}


def _graph(nodes, inputs, outputs, weights, opset):
    graph = helper.make_graph(nodes, "m", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k)
                               for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _detection():
    """Features from a conv; NonMaxSuppression over the boxes and scores (graph inputs,
    so its output size is known only when it runs); the kept boxes' rows gathered and
    pooled by RoiAlign; a mean per kept box."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    count = 30
    centers = rng.uniform(2, 14, (1, count, 2))
    sizes = rng.uniform(2, 6, (1, count, 2))
    boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], -1)[..., [1, 0, 3, 2]]
    feeds = {"x": rng.standard_normal((1, 3, 16, 16)).astype(F32),
             "boxes": boxes.astype(F32), "scores": rng.random((1, 2, count)).astype(F32)}
    w = {"w": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(F32),
         "max": np.array([5], np.int64), "iou": np.array([0.4], F32),
         "thr": np.array([0.2], F32), "two": np.array(2, np.int64),
         "zero": np.array(0, np.int64), "xyxy": np.array([1, 0, 3, 2], np.int64)}
    nodes = [
        n("Conv", ["x", "w"], ["f"], pads=[1, 1, 1, 1]), n("Relu", ["f"], ["feat"]),
        n("NonMaxSuppression", ["boxes", "scores", "max", "iou", "thr"], ["sel"]),
        n("Gather", ["sel", "two"], ["box_index"], axis=1),
        n("Gather", ["sel", "zero"], ["batch"], axis=1),
        n("Squeeze", ["boxes", "zero_axes"], ["boxes0"]),
        n("Gather", ["boxes0", "box_index"], ["kept_yx"], axis=0),
        n("Gather", ["kept_yx", "xyxy"], ["rois"], axis=1),  # y1 x1 y2 x2 -> x1 y1 x2 y2
        n("RoiAlign", ["feat", "rois", "batch"], ["pooled"], output_height=3,
          output_width=3, sampling_ratio=2, spatial_scale=1.0),
        n("ReduceMean", ["pooled", "mean_axes"], ["y"], keepdims=0),
    ]
    w["zero_axes"] = np.array([0], np.int64)
    w["mean_axes"] = np.array([2, 3], np.int64)
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
              for k, v in feeds.items()]
    model = _graph(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                 ["k", 4])], w, 18)
    return model, feeds, {"NonMaxSuppression", "RoiAlign"}


def _classic_cnn():
    """LRN after a conv (AlexNet), MaxPool's indices undone by MaxUnpool, MVN, a
    deformable conv whose offsets come from a conv, LpPool, CenterCropPad, GlobalLpPool."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    feeds = {"x": rng.standard_normal((1, 3, 12, 12)).astype(F32)}
    w = {"w1": (rng.standard_normal((8, 3, 3, 3)) * 0.4).astype(F32),
         "wo": (rng.standard_normal((18, 8, 3, 3)) * 0.05).astype(F32),
         "wd": (rng.standard_normal((6, 8, 3, 3)) * 0.2).astype(F32),
         "bd": rng.standard_normal(6).astype(F32),
         "crop": np.array([5, 7], np.int64)}
    nodes = [
        n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
        n("LRN", ["r1"], ["l1"], size=5, alpha=1e-3, beta=0.75, bias=2.0),
        n("MaxPool", ["l1"], ["p1", "idx"], kernel_shape=[2, 2], strides=[2, 2]),
        n("MaxUnpool", ["p1", "idx"], ["u1"], kernel_shape=[2, 2], strides=[2, 2]),
        n("MeanVarianceNormalization", ["u1"], ["m1"], axes=[0, 2, 3]),
        n("Conv", ["m1", "wo"], ["off"], pads=[1, 1, 1, 1]),
        n("DeformConv", ["m1", "wd", "off", "bd"], ["d1"], pads=[1, 1, 1, 1]),
        n("LpPool", ["d1"], ["lp"], kernel_shape=[3, 3], strides=[2, 2], p=2,
          auto_pad="SAME_UPPER"),
        n("CenterCropPad", ["lp", "crop"], ["cc"], axes=[2, 3]),
        n("GlobalLpPool", ["cc"], ["y"], p=3),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, feeds["x"].shape)]
    model = _graph(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                 None)], w, 19)
    return model, feeds, {"LRN", "MaxUnpool", "MeanVarianceNormalization", "DeformConv",
                          "LpPool", "CenterCropPad", "GlobalLpPool"}


@pytest.mark.parametrize("make", [_spatial_transformer, _fold, _detection, _classic_cnn],
                         ids=["spatial_transformer", "fold", "detection", "classic_cnn"])
def test_model(make, tmp_path):
    model, feeds, ops = make()
    assert ops <= {node.op_type for node in model.graph.node}
    (want,) = oracle(model, feeds)
    ref = ReferenceModel.load(model).run(feeds)["y"]
    built = CpuModel.build(model)
    built.save(tmp_path / "m.cel")
    runs = [built.run(feeds)["y"], CpuModel.load(tmp_path / "m.cel").run(feeds)["y"]]
    assert ref.shape == want.shape and want.size > 0
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-4)
    for got in runs:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(runs[0], runs[1])
