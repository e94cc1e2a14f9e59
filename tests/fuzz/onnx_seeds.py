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


def _model(op_key, case):
    inputs, attrs, n_out, opset = case
    op = op_key.split("/")[0]
    graph_inputs, inits, names = [], [], []
    for spec in inputs:
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
