"""Valid ONNX models the fuzzers mutate: the zoo's small CNN and MobileNetV2, the bundled
digits CNN, and one small onnx.helper graph per supported operator (``op_models``), each with
attributes set so the mutators have something to change."""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B, U8, I8 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL, TensorProto.UINT8, \
    TensorProto.INT8

# op -> (inputs: list of (name, elem type, shape) for graph inputs or (name, array) for
# initializers, attributes, number of outputs, opset)
_X = ("x", F, [1, 2, 5, 5])
_V = ("v", F, [2, 3])


def _c(name, a):
    return (name, np.asarray(a))


_W = _c("w", np.random.default_rng(1).normal(size=(4, 2, 3, 3)).astype(np.float32))
OP_CASES = {
    "Conv": ([_X, _W, _c("b", np.ones(4, np.float32))],
             {"strides": [2, 1], "pads": [1, 1, 0, 0], "dilations": [1, 1], "group": 1}, 1, 17),
    "Conv/auto": ([_X, _W], {"auto_pad": "SAME_UPPER", "kernel_shape": [3, 3]}, 1, 17),
    "MaxPool": ([_X], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, 2, 17),
    "AveragePool": ([_X], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                           "count_include_pad": 1}, 1, 17),
    "GlobalAveragePool": ([_X], {}, 1, 17), "GlobalMaxPool": ([_X], {}, 1, 17),
    "Gemm": ([_V, _c("b", np.ones((4, 3), np.float32)), _c("c", np.ones(4, np.float32))],
             {"alpha": 0.5, "beta": 2.0, "transB": 1}, 1, 17),
    "MatMul": ([("a", F, [2, 2, 3]), ("b", F, [3, 4])], {}, 1, 17),
    "BatchNormalization": ([_X] + [_c(n, np.full(2, v, np.float32)) for n, v in
                                   (("s", 1.5), ("bb", 0.1), ("m", 0.2), ("var", 2.0))],
                           {"epsilon": 1e-3}, 1, 17),
    "Softmax": ([("x", F, [2, 3, 4])], {"axis": 1}, 1, 17),
    "Softmax/11": ([("x", F, [2, 3, 4])], {"axis": 1}, 1, 11),
    "LogSoftmax": ([("x", F, [2, 3, 4])], {"axis": -1}, 1, 17),
    **{op: ([_V, ("b", F, [1, 3])], {}, 1, 17) for op in ("Add", "Sub", "Mul", "Div", "Max",
                                                          "Min", "Sum", "Mean", "PRelu")},
    "Pow": ([_V, _c("b", np.float32(2))], {}, 1, 17),
    **{op: ([_V, ("b", F, [3])], {}, 1, 17) for op in ("Equal", "Less", "Greater")},
    **{op: ([("a", B, [2, 3]), ("b", B, [3])], {}, 1, 17) for op in ("And", "Or")},
    "Not": ([("a", B, [2, 3])], {}, 1, 17),
    "Where": ([("c", B, [2, 3]), _V, ("y", F, [3])], {}, 1, 17),
    "Clip": ([_V, _c("lo", np.float32(-0.5)), _c("hi", np.float32(0.5))], {}, 1, 17),
    **{op: ([_V], {}, 1, 17) for op in (
        "Relu", "Sigmoid", "HardSwish", "Tanh", "Exp", "Abs", "Neg", "Floor", "Ceil",
        "Softplus", "Softsign", "Identity", "Size", "Shape", "Sqrt", "Log", "Reciprocal")},
    "LeakyRelu": ([_V], {"alpha": 0.2}, 1, 17), "Elu": ([_V], {"alpha": 0.7}, 1, 17),
    "HardSigmoid": ([_V], {"alpha": 0.3, "beta": 0.4}, 1, 17),
    "Selu": ([_V], {"alpha": 1.5, "gamma": 1.1}, 1, 17),
    "Dropout": ([_V], {"seed": 3}, 2, 17),
    "Cast": ([_V], {"to": TensorProto.INT32}, 1, 17),
    "CastLike": ([_V, ("t", TensorProto.DOUBLE, [1])], {}, 1, 17),
    "QuantizeLinear": ([_V, _c("s", np.float32(0.1)), _c("z", np.int8(3))], {"axis": 1}, 1, 17),
    "DequantizeLinear": ([("q", I8, [2, 3]), _c("s", np.float32(0.1)), _c("z", np.int8(3))],
                         {}, 1, 17),
    **{op: ([("x", F, [2, 3, 4])], {"axes": [1], "keepdims": 0}, 1, 17) for op in (
        "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")},
    "ReduceSum": ([("x", F, [2, 3, 4]), _c("axes", np.array([-1]))], {"keepdims": 1}, 1, 17),
    "Reshape": ([("x", F, [2, 3, 4]), _c("s", np.array([0, -1, 2]))], {}, 1, 17),
    "Flatten": ([("x", F, [2, 3, 4])], {"axis": 2}, 1, 17),
    "Transpose": ([("x", F, [2, 3, 4])], {"perm": [2, 0, 1]}, 1, 17),
    "Squeeze": ([("x", F, [2, 1, 4]), _c("axes", np.array([1]))], {}, 1, 17),
    "Unsqueeze": ([("x", F, [2, 4]), _c("axes", np.array([0, 3]))], {}, 1, 17),
    "Unsqueeze/11": ([("x", F, [2, 4])], {"axes": [0, 3]}, 1, 11),
    "Concat": ([_V, ("b", F, [1, 3])], {"axis": 0}, 1, 17),
    "Split": ([("x", F, [2, 6])], {"axis": 1, "num_outputs": 3}, 3, 18),
    "Split/13": ([("x", F, [2, 6]), _c("split", np.array([2, 4]))], {"axis": -1}, 2, 13),
    "Slice": ([("x", F, [4, 5])] + [_c(n, np.array(v)) for n, v in (
        ("st", [1, 0]), ("en", [4, 5]), ("ax", [0, 1]), ("sp", [2, 2]))], {}, 1, 17),
    "Pad": ([_V, _c("p", np.array([0, 1, 1, 0])), _c("cv", np.float32(2))],
            {"mode": "constant"}, 1, 17),
    "Pad/reflect": ([("x", F, [3, 4]), _c("p", np.array([1, 2, 1, 0]))],
                    {"mode": "reflect"}, 1, 17),
    "Gather": ([("x", F, [4, 3]), _c("i", np.array([[0, 3], [1, 2]]))], {"axis": 0}, 1, 17),
    "Expand": ([("x", F, [3, 1]), _c("s", np.array([2, 3, 4]))], {}, 1, 17),
    "Tile": ([_V, _c("r", np.array([2, 1]))], {}, 1, 17),
    "ConstantOfShape": ([_c("s", np.array([2, 3]))],
                        {"value": numpy_helper.from_array(np.array([1.5], np.float32))}, 1, 17),
    "Range": ([_c("a", np.float32(1)), _c("l", np.float32(7)), _c("d", np.float32(1.5))],
              {}, 1, 17),
    "Constant": ([], {"value": numpy_helper.from_array(np.arange(6, dtype=np.float32)
                                                       .reshape(2, 3))}, 1, 17),
}

# The operators of issue #12. "" is an input left out (Resize's roi and scales).
_R = np.random.default_rng(2)
_X3 = ("x", F, [2, 3, 4])
OP_CASES.update({
    # normalizations
    "LayerNormalization": ([_X3, _c("s", _R.normal(size=4).astype(np.float32)),
                            _c("b", np.full(4, 0.1, np.float32))],
                           {"axis": -1, "epsilon": 1e-3, "stash_type": 1}, 3, 17),
    # opset 18: onnxruntime has no opset-21 kernel to compare with
    "GroupNormalization": ([_X, _c("s", np.array([1.5, 0.5], np.float32)),
                            _c("b", np.array([0.1, -0.2], np.float32))],
                           {"num_groups": 2, "epsilon": 1e-3}, 1, 18),
    "InstanceNormalization": ([_X, _c("s", np.array([1.5, 0.5], np.float32)),
                               _c("b", np.array([0.1, -0.2], np.float32))],
                              {"epsilon": 1e-3}, 1, 17),
    "LpNormalization": ([_V], {"axis": 1, "p": 1}, 1, 17),
    "Hardmax": ([_X3], {"axis": 1}, 1, 17),
    "Hardmax/11": ([_X3], {"axis": 1}, 1, 11),
    # activations and element-wise math
    "Gelu": ([_V], {"approximate": "tanh"}, 1, 20),
    "Celu": ([_V], {"alpha": 0.7}, 1, 17), "ThresholdedRelu": ([_V], {"alpha": 0.3}, 1, 17),
    "Shrink": ([_V], {"bias": 0.2, "lambd": 0.4}, 1, 17),
    **{op: ([_V], {}, 1, 18) for op in ("Erf", "Sin", "Cos", "Round", "Sign", "Mish",
                                        "IsNaN")},
    "IsInf": ([_V], {"detect_negative": 0}, 1, 17),
    "Mod": ([("a", TensorProto.INT32, [2, 3]), _c("b", np.array([2, 3, -5], np.int32))],
            {"fmod": 0}, 1, 13),
    "Mod/fmod": ([_V, _c("b", np.array([0.5, -2.0, 3.0], np.float32))], {"fmod": 1}, 1, 13),
    **{op: ([_V, ("b", F, [3])], {}, 1, 16) for op in ("GreaterOrEqual", "LessOrEqual")},
    "Xor": ([("a", B, [2, 3]), ("b", B, [3])], {}, 1, 17),
    "BitShift": ([("x", U8, [2, 3]), _c("y", np.array([1, 2, 7], np.uint8))],
                 {"direction": "LEFT"}, 1, 17),
    # reductions, selections, scans
    **{op: ([_X3], {"axes": [1], "keepdims": 0}, 1, 13) for op in (
        "ReduceL1", "ReduceL2", "ReduceSumSquare")},
    **{op: ([("x", F, [2, 3, 4]), _c("axes", np.array([0, -1]))], {"keepdims": 1}, 1, 18)
       for op in ("ReduceLogSumExp", "ReduceLogSum")},
    "ArgMax": ([_X3], {"axis": 1, "keepdims": 0, "select_last_index": 1}, 1, 13),
    "ArgMin": ([_X3], {"axis": -1, "keepdims": 1}, 1, 13),
    "TopK": ([("x", F, [2, 5]), _c("k", np.array([3]))], {"axis": 1, "largest": 0}, 2, 17),
    "CumSum": ([_V, _c("a", np.array(1))], {"exclusive": 1, "reverse": 1}, 1, 14),
    "Einsum": ([("a", F, [2, 3]), ("b", F, [3, 4])], {"equation": "ij,jk->ik"}, 1, 12),
    # indexing and data movement
    "GatherElements": ([("x", F, [3, 4]), _c("i", np.array([[0, 2, 1, 3], [1, 0, 2, -1]]))],
                       {"axis": 1}, 1, 13),
    "GatherND": ([_X3, _c("i", np.array([[0, 1], [1, 2]]))], {"batch_dims": 0}, 1, 13),
    "ScatterElements": ([("x", F, [3, 4]), _c("i", np.array([[0, 1], [2, 0]])),
                         ("u", F, [2, 2])], {"axis": 0, "reduction": "add"}, 1, 18),
    "ScatterND": ([("x", F, [4, 3]), _c("i", np.array([[1], [3]])), ("u", F, [2, 3])],
                  {"reduction": "none"}, 1, 18),
    "Trilu": ([("x", F, [3, 4]), _c("k", np.array(1))], {"upper": 0}, 1, 14),
    "NonZero": ([_c("x", np.array([[0, 1, 0], [2, 0, 3]], np.float32))], {}, 1, 13),
    "OneHot": ([("i", I64, [2, 3]), _c("d", np.array(4)),
                _c("v", np.array([0.0, 1.0], np.float32))], {"axis": -1}, 1, 11),
    "DepthToSpace": ([("x", F, [1, 8, 2, 3])], {"blocksize": 2, "mode": "CRD"}, 1, 13),
    "SpaceToDepth": ([("x", F, [1, 2, 4, 6])], {"blocksize": 2}, 1, 13),
    # ConvTranspose and Resize
    "ConvTranspose": ([_X, _c("w", _R.normal(size=(2, 3, 3, 3)).astype(np.float32)),
                       _c("b", np.ones(3, np.float32))],
                      {"strides": [2, 1], "pads": [1, 0, 0, 1], "output_padding": [1, 0],
                       "dilations": [1, 1], "group": 1}, 1, 17),
    "ConvTranspose/shape": ([_X, _c("w", _R.normal(size=(2, 2, 3, 3)).astype(np.float32))],
                            {"strides": [2, 2], "output_shape": [10, 10],
                             "kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}, 1, 17),
    "Resize": ([_X, "", _c("s", np.array([1, 1, 2, 1.5], np.float32))],
               {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, 1, 13),
    "Resize/sizes": ([_X, "", "", _c("sz", np.array([3, 7]))],
                     {"mode": "nearest", "axes": [2, 3], "nearest_mode": "ceil",
                      "coordinate_transformation_mode": "asymmetric"}, 1, 18),
    "Resize/cubic": ([_X, "", _c("s", np.array([1, 1, 0.6, 0.8], np.float32))],
                     {"mode": "cubic", "antialias": 1, "cubic_coeff_a": -0.5,
                      "exclude_outside": 1}, 1, 19),
    # opset 9: onnx's version converter makes it a Resize
    "Upsample": ([_X, _c("s", np.array([1, 1, 2, 2], np.float32))], {"mode": "nearest"}, 1, 9),
})


def _body(name, nodes, inputs, outputs, inits=()):
    """A subgraph: inputs and outputs as (name, elem type, shape)."""
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info(*i) for i in inputs],
                             [helper.make_tensor_value_info(*o) for o in outputs],
                             [numpy_helper.from_array(a, n) for n, a in inits])


def _recurrent(op, gates, extra=()):
    hidden, rng = 3, np.random.default_rng(3)
    weights = [_c(n, rng.normal(size=shape).astype(np.float32) * 0.5) for n, shape in (
        ("w", (1, gates * hidden, 4)), ("r", (1, gates * hidden, hidden)),
        ("b", (1, 2 * gates * hidden)))]
    return ([("x", F, [3, 2, 4]), *weights, *extra], {"hidden_size": hidden}, 2, 14)


# Control flow and recurrent layers. An entry with a fourth item "outer" is a graph input
# the node does not take: its bodies read it from the enclosing scope.
OP_CASES.update({
    "If": ([("c", B, []), (*_V, "outer")], {
        "then_branch": _body("then", [helper.make_node("Relu", ["v"], ["t"])], [],
                             [("t", F, [2, 3])]),
        "else_branch": _body("else", [helper.make_node("Neg", ["v"], ["e"])], [],
                             [("e", F, [2, 3])])}, 1, 16),
    "Loop": ([_c("m", np.array(3)), "", ("v", F, [2])], {
        "body": _body("body", [helper.make_node("Identity", ["cond"], ["cond_out"]),
                               helper.make_node("Add", ["acc", "one"], ["acc_out"]),
                               helper.make_node("Mul", ["acc", "acc"], ["square"])],
                      [("i", I64, []), ("cond", B, []), ("acc", F, [2])],
                      [("cond_out", B, []), ("acc_out", F, [2]), ("square", F, [2])],
                      [("one", np.ones(2, np.float32))])}, 2, 16),
    "Scan": ([("s", F, [2]), ("xs", F, [3, 2])], {
        "num_scan_inputs": 1, "scan_input_directions": [1], "scan_output_axes": [1],
        "body": _body("body", [helper.make_node("Add", ["s_in", "x"], ["s_out"]),
                               helper.make_node("Mul", ["s_in", "x"], ["prod"])],
                      [("s_in", F, [2]), ("x", F, [2])],
                      [("s_out", F, [2]), ("prod", F, [2])])}, 2, 16),
    "LSTM": _recurrent("LSTM", 4),
    "GRU": _recurrent("GRU", 3),
    "RNN": _recurrent("RNN", 1),
})
OP_CASES["GRU"][1].update(linear_before_reset=1, direction="reverse")
OP_CASES["LSTM"][1].update(clip=2.5)

# Vision and detection operators (graph/ops_vision.py).
_ROIS = np.array([[0, 0, 3, 3], [1, 0.5, 4.5, 2], [-1, 2, 2, 6]], np.float32)
_UNPOOL = (np.array([[0, 2], [8, 11]]) + np.array([0, 16])[:, None, None])[None]
OP_CASES.update({
    "GridSample": ([_X, ("g", F, [1, 3, 4, 2])], {"mode": "bicubic", "padding_mode": "border",
                                                   "align_corners": 1}, 1, 16),
    "GridSample/3d": ([("x", F, [1, 2, 3, 4, 5]), ("g", F, [1, 2, 3, 2, 3])],
                      {"mode": "nearest", "padding_mode": "reflection"}, 1, 20),
    "AffineGrid": ([("t", F, [2, 2, 3]), _c("s", np.array([2, 3, 4, 5]))],
                   {"align_corners": 1}, 1, 20),
    "NonMaxSuppression": ([("b", F, [1, 6, 4]), ("s", F, [1, 2, 6]), _c("m", np.array([3])),
                           _c("i", np.array([0.5], np.float32)),
                           _c("t", np.array([0.1], np.float32))], {"center_point_box": 1}, 1, 11),
    "RoiAlign": ([_X, _c("r", _ROIS), _c("bi", np.zeros(3, np.int64))],
                 {"mode": "max", "output_height": 2, "output_width": 3, "sampling_ratio": 2,
                  "spatial_scale": 0.5, "coordinate_transformation_mode": "output_half_pixel"},
                 1, 16),
    "MaxRoiPool": ([_X, _c("r", np.concatenate([np.zeros((3, 1), np.float32), _ROIS], 1))],
                   {"pooled_shape": [2, 2], "spatial_scale": 1.0}, 1, 11),
    "LRN": ([_X], {"size": 3, "alpha": 1e-3, "beta": 0.5, "bias": 2.0}, 1, 13),
    "LpPool": ([_X], {"kernel_shape": [2, 2], "strides": [1, 2], "pads": [1, 0, 0, 1], "p": 3,
                      "dilations": [1, 2], "ceil_mode": 1}, 1, 18),
    "GlobalLpPool": ([_X], {"p": 1}, 1, 11),
    "MeanVarianceNormalization": ([_X], {"axes": [0, 2, 3]}, 1, 13),
    "MaxUnpool": ([("x", F, [1, 2, 2, 2]), _c("i", _UNPOOL.reshape(1, 2, 2, 2)),
                   _c("o", np.array([1, 2, 4, 4]))], {"kernel_shape": [2, 2],
                                                      "strides": [2, 2]}, 1, 11),
    "Col2Im": ([("x", F, [1, 8, 12]), _c("is", np.array([4, 5])), _c("bs", np.array([2, 2]))],
               {"strides": [1, 1], "dilations": [1, 1]}, 1, 18),
    "CenterCropPad": ([_X, _c("s", np.array([3, 7]))], {"axes": [2, 3]}, 1, 18),
    "DeformConv": ([_X, _c("w", np.ones((3, 2, 2, 2), np.float32)), ("o", F, [1, 8, 4, 4])],
                   {"pads": [0, 0, 0, 0], "group": 1}, 1, 19),
})


# Data-dependent, reinterpreting and random operators (graph/ops_data.py, ops_random.py).
OP_CASES.update({
    "Compress": ([_V, ("c", B, [3])], {"axis": -1}, 1, 11),
    "Compress/flat": ([_V, _c("c", np.array([True, False, True, True]))], {}, 1, 11),
    "Unique": ([_V], {"sorted": 0, "axis": 1}, 4, 11),
    "TensorScatter": ([("p", F, [2, 3, 6, 4]), ("u", F, [2, 3, 2, 4]),
                       _c("w", np.array([1, 5]))], {"mode": "circular"}, 1, 24),
    "Det": ([("x", F, [2, 3, 3])], {}, 1, 11),
    "BitCast": ([_V], {"to": TensorProto.INT32}, 1, 26),
    "RandomNormalLike": ([_V], {"mean": 1.0, "scale": 2.0, "seed": 1.0}, 1, 17),
    "RandomUniform": ([], {"shape": [2, 3], "low": -1.0, "high": 1.0}, 1, 17),
    "Multinomial": ([_V], {"sample_size": 5, "seed": 2.0}, 1, 17),
})


def _model(op_key, case):
    inputs, attrs, n_out, opset = case
    op = op_key.split("/")[0]
    graph_inputs, inits, names = [], [], []
    for spec in inputs:
        if spec == "":
            names.append("")
            continue
        if len(spec) == 4:  # read by the bodies only
            graph_inputs.append(helper.make_tensor_value_info(*spec[:3]))
            continue
        if len(spec) == 3:
            graph_inputs.append(helper.make_tensor_value_info(*spec))
        else:
            inits.append(numpy_helper.from_array(spec[1], spec[0]))
        names.append(spec[0])
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, name=op.lower(), **attrs)
    graph = helper.make_graph([node], op_key.replace("/", "_"), graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    # The outputs' types as onnx infers them (what an exporter writes).
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.ClearField("value_info")
    return model


@functools.cache
def op_models() -> dict[str, bytes]:
    """{case name: serialized model}, one small graph per supported operator."""
    return {key: _model(key, case).SerializeToString() for key, case in OP_CASES.items()}


@functools.cache
def zoo_models() -> dict[str, tuple[bytes, dict | None]]:
    """{name: (serialized model, input_shapes)} of the whole models."""
    from celosia.models import zoo
    from celosia.models.digits import model_path

    return {"small_cnn": (zoo.small_cnn().SerializeToString(), None),
            "mobilenet_v2": (zoo.mobilenet_v2(image_size=32).SerializeToString(), None),
            "digits": (model_path().read_bytes(), {"image": (1, 1, 8, 8)})}


def seeds() -> dict[str, tuple[bytes, dict | None]]:
    return {**{k: (v, None) for k, v in op_models().items()}, **zoo_models()}


def parse(data: bytes) -> onnx.ModelProto:
    return onnx.load_from_string(data)
