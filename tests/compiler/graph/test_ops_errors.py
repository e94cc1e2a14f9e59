"""Bad uses of the operators of ops_math/ops_nn/ops_tensor/ops_resize/ops_vision: celosia's own
one-line errors (GraphError, a CelosiaError) naming the node and what is wrong, at import
where the shapes and attributes show it, at run time (both executors) where only the
values do. At import the first to see it says it: the operator table (specs.py), onnx's
strict inference, the canonical form or the shape rule."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_nodes import check_node, node_model

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.ir import GraphError, NodeError
from celosia.errors import CelosiaError
from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

X = np.zeros((1, 4, 5, 6), np.float32)
I64 = np.int64

_BAD = [
    # (op, inputs, feeds, consts, attrs, opset, message pattern)
    ("Resize", ["x"], {"x": X}, {}, {}, 13,
     "Either `sizes` or `scales` must be provided, but not both"),
    ("Resize", ["x", "", "s"], {"x": X}, {"s": np.ones(4, np.float32)}, {"mode": "bicubic"},
     13, "attribute 'mode' = 'bicubic' is not one of 'nearest', 'linear', 'cubic'"),
    ("Resize", ["x", "", "s"], {"x": X}, {"s": np.ones(3, np.float32)}, {}, 13,
     "Number of elements of input 'scales' must be same as rank of input 'X'"),
    ("Resize", ["x", "", "s"], {"x": X}, {"s": np.array([1, 1, 0, 2], np.float32)}, {}, 13,
     "scale 0.0 on axis 2 must be positive"),
    ("Resize", ["x", "", "s"], {"x": X}, {"s": np.ones(4, np.float32)},
     {"coordinate_transformation_mode": "tf_crop_and_resize"}, 13,
     "tf_crop_and_resize needs a roi of 8 values"),
    ("TopK", ["x", "k"], {"x": X}, {"k": np.array([10], I64)}, {}, 11,
     "Axis has less than the requested k elements"),
    ("GatherElements", ["x", "i"], {"x": X}, {"i": np.full((1, 4, 5, 6), 7, I64)},
     {"axis": 3}, 13, "index 7 .* out of range for a dimension of size 6"),
    ("ConvTranspose", ["x", "w"], {"x": X}, {"w": np.zeros((3, 2, 3, 3), np.float32)}, {}, 11,
     "input has 4 channels but weight float32\\[3,2,3,3\\]"),
    ("ConvTranspose", ["x", "w"], {"x": X}, {"w": np.zeros((4, 2, 3, 3), np.float32)},
     {"strides": [2]}, 11, "Attribute strides has incorrect size"),
    ("ConvTranspose", ["x", "w"], {"x": X}, {"w": np.zeros((4, 2, 3, 3), np.float32)},
     {"strides": [2, 1], "dilations": [1, 3], "output_padding": [1, 3]}, 11,
     r"'output_padding' = \[1, 3\]: value 3 at 1 must be less than 3"),
    ("Einsum", ["x"], {"x": X}, {}, {"equation": "abcd->abce"}, 12,
     "Equation output contains a label missing from the inputs"),
    ("DepthToSpace", ["x"], {"x": X}, {}, {"blocksize": 3}, 13,
     "4 channels are not a multiple of blocksize"),
    ("GroupNormalization", ["x", "s", "b"], {"x": X},
     {"s": np.ones(4, np.float32), "b": np.zeros(4, np.float32)}, {"num_groups": 2}, 18,
     r"scale and bias must have shape \[2\]"),
    ("GroupNormalization", ["x", "s"], {"x": X}, {"s": np.ones(2, np.float32)},
     {"num_groups": 2}, 18, r"has 2 inputs but GroupNormalization takes 3 \(x, scale, bias\)"),
    ("ScatterND", ["x", "i", "u"], {"x": X},
     {"i": np.zeros((2, 1), I64), "u": np.zeros((3, 5, 6), np.float32)}, {}, 13,
     r"updates float32\[3,5,6\] must have shape \[2, 4, 5, 6\]"),
    ("LayerNormalization", ["x", "s"], {"x": X}, {"s": np.ones(5, np.float32)}, {}, 17,
     "does not broadcast to the normalized shape"),
    ("OneHot", ["i", "d", "v"], {"i": np.zeros(3, I64)},
     {"d": np.array(0, I64), "v": np.array([0, 1], np.float32)}, {}, 11,
     r"input 1 \(depth\) = 0: every value must be at least 1"),
    ("Mod", ["x", "x"], {"x": X}, {}, {"fmod": 2}, 13, "attribute 'fmod' = 2 is not one of 0, 1"),
    ("Einsum", ["x"], {"x": X}, {}, {}, 12, "attribute 'equation' is required but missing"),
    ("LpNormalization", ["x"], {"x": X}, {}, {"p": 3}, 11, "attribute 'p' = 3 is not one of 1, 2"),
    ("TopK", ["x", "k"], {"x": X}, {"k": np.array([-1], I64)}, {}, 11,
     r"input 1 \(k\) = -1: every value must be at least 0"),
    ("CumSum", ["x", "a"], {"x": X}, {"a": np.array(4, I64)}, {}, 14,
     r"input 1 \(axis\) = 4: axis 4 is out of range for rank 4"),
    ("DepthToSpace", ["x"], {"x": X}, {}, {"blocksize": 0}, 13,
     "attribute 'blocksize' = 0: every value must be at least 1"),
    # the vision operators (ops_vision.py)
    ("GridSample", ["x", "g"], {"x": X}, {"g": np.zeros((1, 3, 4, 2), np.float32)},
     {"mode": "area"}, 16, "attribute 'mode' = 'area' is not one of 'bilinear', 'nearest'"),
    ("GridSample", ["x", "g"], {"x": X}, {"g": np.zeros((1, 3, 4, 3), np.float32)}, {}, 20,
     "The last dimension of the grid tensor must be the rank of the grid tensor - 2"),
    ("AffineGrid", ["t", "s"], {"t": np.zeros((1, 2, 3), np.float32)},
     {"s": np.array([1, 3, 4, 5, 6], I64)}, {}, 20,
     r"theta of shape \[1, 2, 3\] and size \[1, 3, 4, 5, 6\] do not match"),
    ("AffineGrid", ["t", "s"], {"t": np.zeros((1, 2, 3), np.float32)},
     {"s": np.array([1, 3, 0, 5], I64)}, {}, 20,
     r"input 1 \(size\) = \[1, 3, 0, 5\]: every value must be at least 1"),
    ("RoiAlign", ["x", "r", "b"], {"x": X},
     {"r": np.zeros((1, 4), np.float32), "b": np.zeros(1, I64)}, {"mode": "sum"}, 16,
     "attribute 'mode' = 'sum' is not one of 'avg', 'max'"),
    ("RoiAlign", ["x", "r", "b"], {"x": X},
     {"r": np.zeros((1, 4), np.float32), "b": np.zeros(1, I64)}, {"output_height": 0}, 16,
     "attribute 'output_height' = 0: every value must be at least 1"),
    ("NonMaxSuppression", ["b", "s"], {"b": np.zeros((1, 3, 4), np.float32)},
     {"s": np.zeros((1, 1, 3), np.float32)}, {"center_point_box": 2}, 11,
     "attribute 'center_point_box' = 2 is not one of 0, 1"),
    ("LRN", ["x"], {"x": X}, {}, {}, 13, "attribute 'size' is required but missing"),
    ("MaxRoiPool", ["x", "r"], {"x": X}, {"r": np.zeros((1, 5), np.float32)},
     {"pooled_shape": [2]}, 11, "Attribute pooled_shape has incorrect length"),
    ("Col2Im", ["x", "i", "b"], {"x": np.zeros((1, 8, 13), np.float32)},
     {"i": np.array([4, 5], I64), "b": np.array([2, 2], I64)}, {}, 18,
     r"does not hold the columns of blocks \[2, 2\] over images \[4, 5\] \(it must be "
     r"\[N, C \* 4, 12\]\)"),
    ("DeformConv", ["x", "w", "o"], {"x": X}, {"w": np.zeros((2, 4, 3, 3), np.float32),
                                            "o": np.zeros((1, 18, 2, 2), np.float32)}, {}, 19,
     r"offset of shape \[1, 18, 2, 2\] must be \[1, 18, 3, 4\]"),
    ("LpPool", ["x"], {"x": X}, {}, {"kernel_shape": [2, 2], "p": 0}, 18,
     "attribute 'p' = 0: every value must be at least 1"),
]


@pytest.mark.parametrize("op, inputs, feeds, consts, attrs, opset, message", _BAD,
                         ids=[f"{b[0]}-{k}" for k, b in enumerate(_BAD)])
def test_import_errors(op, inputs, feeds, consts, attrs, opset, message):
    model = node_model(op, inputs, feeds, consts=consts, attrs=attrs, opset=opset,
                       outputs=2 if op == "TopK" else 1, infer=False)
    with pytest.raises(GraphError, match=f"node '{op}_0' \\({op}\\): .*{message}") as err:
        import_onnx(model)
    assert isinstance(err.value, CelosiaError) and "\n" not in str(err.value)


def test_index_out_of_range_at_run_time():
    """Indices known only at run time: both executors name the node."""
    data, idx = np.zeros((3, 4), np.float32), np.array([[0, 9, 1, 2]], I64)
    model = node_model("GatherElements", ["x", "i"], {"x": data, "i": idx})
    for build in (ReferenceModel.load, CpuModel.build):
        with pytest.raises(NodeError, match=r"GatherElements_0.*failed at run time: "
                                            r"(ValueError: )?index 9 at \[0, 1\] is out of "
                                            "range"):
            build(model).run({"x": data, "i": idx})


def test_run_time_shape_inputs_run_or_are_bound():
    """TopK's K and OneHot's depth decide the output's shape: given at run time, the node
    runs in ONNX's form (graph/dynamic.py) and agrees with onnxruntime; bound, it is
    static."""
    x = np.random.default_rng(0).normal(size=(2, 6)).astype(np.float32)
    k = np.array([2], I64)
    check_node("TopK", ["x", "k"], {"x": x, "k": k}, outputs=2, attrs={"axis": -1},
               opset=11)
    model = node_model("TopK", ["x", "k"], {"x": x, "k": k}, outputs=2, infer=False)
    assert import_onnx(model).types["y0"].shape == (2, None)
    assert import_onnx(model, bind_inputs={"k": k}).types["y0"].shape == (2, 2)
    feeds = {"i": np.array([[0, 2], [1, -1]], I64), "d": np.array(3, I64)}
    check_node("OneHot", ["i", "d", "v"], feeds, consts={"v": np.array([0, 5], np.float32)},
               attrs={"axis": -2}, opset=11)
    model = node_model("OneHot", ["i", "d", "v"], feeds, infer=False,
                       consts={"v": np.array([0, 5], np.float32)}, attrs={"axis": -2})
    assert import_onnx(model).types["y0"].shape == (2, None, 2)


@pytest.mark.parametrize("op, inputs, feeds, consts, message", [
    ("RoiAlign", ["x", "r", "b"], {"x": X, "b": np.array([0, 3], I64)},
     {"r": np.zeros((2, 4), np.float32)},
     r"batch index 3 is out of range for an input of 1 images; give indices in \[0, N\)"),
    ("NonMaxSuppression", ["b", "s", "m", "i"],
     {"b": np.zeros((1, 3, 4), np.float32), "i": np.array([1.5], np.float32)},
     {"s": np.zeros((1, 1, 3), np.float32), "m": np.array([2], I64)},
     r"iou_threshold = 1.5 must be in \[0, 1\]"),
    ("MaxUnpool", ["x", "i"], {"x": X[:, :, :2, :3], "i": np.full((1, 4, 2, 3), 99, I64)}, {},
     "index 99 is out of range for the output of shape \\[1, 4, 4, 6\\]; the indices must "
     "come from the MaxPool this undoes"),
])
def test_vision_errors_at_run_time(op, inputs, feeds, consts, message):
    """Values only known at run time: both executors name the node and what to fix."""
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]} if op == "MaxUnpool" else {}
    model = node_model(op, inputs, feeds, consts=consts, attrs=attrs, opset=16, infer=False)
    for build in (ReferenceModel.load, CpuModel.build):
        with pytest.raises(NodeError, match=f"{op}_0.*failed at run time: (ValueError: )?"
                                            f"{message}"):
            build(model).run(feeds)
