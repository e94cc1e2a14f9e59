"""What celosia takes of each ONNX operator, declared once as data, and the checks that hold
every node to it before anything reads the node.

``SPECS[op]`` is an :class:`OpSpec`: the operator's inputs and outputs by name (``x?`` is
optional, ``x...`` one or more), and every attribute any opset from 11 on gives it, as an
:class:`Attr`: its kind (int, ints, float, floats, string, strings, tensor) and the values
celosia accepts (a minimum, a set of choices, a length tied to the input's rank, an axis of
the input). The table is a superset over opsets; onnx's checker (onnx.py) holds each node to
its own opset's schema on top of it.

- ``read_node`` checks a protobuf node's arity and each attribute's kind and shape-free range,
  and returns the attributes as Python values (strings decoded, tensors checked before they
  are read);
- ``check_ranks`` checks what needs the input's rank (lengths, axes) once its type is known;
- ``output_bounds`` gives, for operators whose output can outgrow their inputs (broadcasts,
  Expand, Tile, Gather, GatherND, OneHot, Pad, Cast, and the vision operators whose output
  sizes are attributes: AffineGrid, GridSample, RoiAlign, MaxRoiPool, MaxUnpool, Col2Im,
  CenterCropPad), the output sizes to check against
  celosia.limits before a kernel runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..graph.ir import Node, NodeError
from .dtypes import supported_elem_type
from .tensors import read_tensor

__all__ = ["Attr", "OpSpec", "SPECS", "read_node", "check_ranks", "check_value",
           "output_bounds"]


@dataclass(frozen=True)
class Attr:
    """One attribute: ``kind``, and what values are accepted.

    ``low``: the least value of an int/float or of each element of ints/floats;
    ``choices``: the only values accepted; ``length``: how many values relative to input 0's
    rank r ("spatial": r-2, "pads": 2(r-2), "rank": r); ``axis``: the value(s) are axes of
    input 0 ("in": [-r, r), "flatten": [-r, r], "out": axes of the output of Unsqueeze);
    ``dtype``: an ONNX element-type code of a type celosia supports; ``unique``: no value
    twice; ``required``: every opset requires it; ``outputs``: an int that equals the node's
    number of outputs, or ints with one value per output; ``below``: each value is less than
    the largest of these attributes' values at its position (absent ones count as 1, the
    default of strides and dilations).
    """

    kind: str
    low: float | None = None
    choices: tuple = ()
    length: str | None = None
    axis: str | None = None
    dtype: bool = False
    unique: bool = False
    required: bool = False
    outputs: bool = False
    below: tuple = ()


@dataclass(frozen=True)
class OpSpec:
    """An operator's inputs and outputs (space-separated names; ``?`` optional, ``...`` one or
    more), its attributes, and ``values``: rules, as for attributes, for inputs whose value
    the importer reads at compile time (TopK's k, OneHot's depth; ``check_value``), an
    "int" being one value (a scalar or a one-element tensor)."""

    inputs: str
    outputs: str
    attrs: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)


MAX_RANK = 64  # numpy's limit on an array's dimensions
_BOOL = (0, 1)
_AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_WINDOW = {"kernel_shape": Attr("ints", low=1, length="spatial"),
           "strides": Attr("ints", low=1, length="spatial"),
           "dilations": Attr("ints", low=1, length="spatial"),
           "pads": Attr("ints", low=0, length="pads"),
           "auto_pad": Attr("string", choices=_AUTO_PAD)}
_KERNEL = {"kernel_shape": Attr("ints", low=1, length="spatial", required=True)}
_REDUCE = OpSpec("data axes?", "reduced", {
    "axes": Attr("ints", axis="in", unique=True), "keepdims": Attr("int", choices=_BOOL),
    "noop_with_empty_axes": Attr("int", choices=_BOOL)})
_UNARY = OpSpec("x", "y")
_BINARY = OpSpec("a b", "c")
_VARIADIC = OpSpec("data...", "result")
_ALPHA = OpSpec("x", "y", {"alpha": Attr("float")})
# Cast's saturate and round_mode only change float8 results, which celosia does not make.
_CAST_EXTRA = {"saturate": Attr("int", choices=_BOOL),
               "round_mode": Attr("string", choices=("up", "down", "nearest"))}
_QUANTIZE = {"axis": Attr("int"), "block_size": Attr("int", low=0),
             "output_dtype": Attr("int", dtype=True)}

SPECS: dict[str, OpSpec] = {
    "Conv": OpSpec("x w b?", "y", {**_WINDOW, "group": Attr("int", low=1)}),
    "MaxPool": OpSpec("x", "y indices?", {**_WINDOW, **_KERNEL,
                                          "ceil_mode": Attr("int", choices=_BOOL),
                                          "storage_order": Attr("int", choices=_BOOL)}),
    "AveragePool": OpSpec("x", "y", {**_WINDOW, **_KERNEL,
                                     "ceil_mode": Attr("int", choices=_BOOL),
                                     "count_include_pad": Attr("int", choices=_BOOL)}),
    "GlobalAveragePool": OpSpec("x", "y"), "GlobalMaxPool": OpSpec("x", "y"),
    "Gemm": OpSpec("a b c?", "y", {"alpha": Attr("float"), "beta": Attr("float"),
                                   "transA": Attr("int", choices=_BOOL),
                                   "transB": Attr("int", choices=_BOOL)}),
    "MatMul": _BINARY,
    "BatchNormalization": OpSpec("x scale b mean var", "y running_mean? running_var?", {
        "epsilon": Attr("float"), "momentum": Attr("float"),
        "training_mode": Attr("int", choices=_BOOL), "spatial": Attr("int", choices=_BOOL)}),
    "Softmax": OpSpec("x", "y", {"axis": Attr("int", axis="in")}),
    "LogSoftmax": OpSpec("x", "y", {"axis": Attr("int", axis="in")}),
    **{op: _BINARY for op in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater",
                              "And", "Or", "PRelu")},
    **{op: _VARIADIC for op in ("Max", "Min", "Sum", "Mean")},
    "Where": OpSpec("condition x y", "z"),
    "Clip": OpSpec("x min? max?", "y"),
    **{op: _UNARY for op in ("Not", "Relu", "Sigmoid", "HardSwish", "Tanh", "Exp", "Log",
                             "Sqrt", "Abs", "Neg", "Reciprocal", "Floor", "Ceil", "Softplus",
                             "Softsign", "Identity", "Size")},
    "LeakyRelu": _ALPHA, "Elu": _ALPHA,
    "HardSigmoid": OpSpec("x", "y", {"alpha": Attr("float"), "beta": Attr("float")}),
    "Selu": OpSpec("x", "y", {"alpha": Attr("float"), "gamma": Attr("float")}),
    "Dropout": OpSpec("data ratio? training_mode?", "output mask?", {
        "ratio": Attr("float", low=0.0), "seed": Attr("int")}),
    "Cast": OpSpec("x", "y", {"to": Attr("int", dtype=True, required=True), **_CAST_EXTRA}),
    "CastLike": OpSpec("x target_type", "y", _CAST_EXTRA),
    "QuantizeLinear": OpSpec("x scale zero_point?", "y", {
        **_QUANTIZE, "saturate": Attr("int", choices=_BOOL),
        "precision": Attr("int", dtype=True)}),
    "DequantizeLinear": OpSpec("x scale zero_point?", "y", _QUANTIZE),
    **{op: _REDUCE for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                              "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                              "ReduceLogSumExp", "ReduceSumSquare")},
    "Reshape": OpSpec("data shape", "reshaped", {"allowzero": Attr("int", choices=_BOOL)}),
    "Flatten": OpSpec("x", "y", {"axis": Attr("int", axis="flatten")}),
    "Transpose": OpSpec("data", "transposed", {"perm": Attr("ints", length="rank", axis="in",
                                                             unique=True)}),
    "Squeeze": OpSpec("data axes?", "squeezed", {"axes": Attr("ints", axis="in", unique=True)}),
    "Unsqueeze": OpSpec("data axes?", "expanded", {"axes": Attr("ints", axis="out",
                                                                 unique=True)}),
    "Concat": OpSpec("inputs...", "concat_result", {"axis": Attr("int", axis="in",
                                                                    required=True)}),
    "Split": OpSpec("x split?", "outputs...", {"axis": Attr("int", axis="in"),
                                               "split": Attr("ints", low=0, outputs=True),
                                               "num_outputs": Attr("int", low=1,
                                                                   outputs=True)}),
    "Slice": OpSpec("data starts ends axes? steps?", "output"),
    "Pad": OpSpec("data pads constant_value? axes?", "output", {
        "mode": Attr("string", choices=("constant", "reflect", "edge", "wrap"))}),
    "Gather": OpSpec("data indices", "output", {"axis": Attr("int", axis="in")}),
    "Expand": OpSpec("x shape", "y"),
    "Tile": OpSpec("x repeats", "y"),
    "Shape": OpSpec("data", "shape", {"start": Attr("int"), "end": Attr("int")}),
    "ConstantOfShape": OpSpec("shape", "output", {"value": Attr("tensor")}),
    "Range": OpSpec("start limit delta", "output", {"stash_type": Attr("int", dtype=True)}),
    "Constant": OpSpec("", "output", {
        "value": Attr("tensor"), "value_float": Attr("float"), "value_floats": Attr("floats"),
        "value_int": Attr("int"), "value_ints": Attr("ints"),
        "value_string": Attr("string"), "value_strings": Attr("strings"),
        "sparse_value": Attr("sparse_tensor")}),
}

# ---- the operators of issue #12 (graph/ops_math.py, ops_nn.py, ops_tensor.py, ops_resize.py) --

_FLOAT_STASH = Attr("int", choices=(1, 10, 11))  # float32, float16, float64: what to compute in
_AXIS = {"axis": Attr("int", axis="in")}
_ARG = OpSpec("data", "reduced", {**_AXIS, "keepdims": Attr("int", choices=_BOOL),
                                  "select_last_index": Attr("int", choices=_BOOL)})
_BLOCKS = {"blocksize": Attr("int", low=1, required=True),
           "mode": Attr("string", choices=("DCR", "CRD"))}
_SCATTER_REDUCTION = Attr("string", choices=("none", "add", "mul", "max", "min"))
_RESIZE_MODES = {
    "mode": Attr("string", choices=("nearest", "linear", "cubic")),
    "coordinate_transformation_mode": Attr("string", choices=(
        "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")),
    "nearest_mode": Attr("string", choices=("round_prefer_floor", "round_prefer_ceil", "floor",
                                            "ceil")),
    "keep_aspect_ratio_policy": Attr("string", choices=("stretch", "not_larger",
                                                        "not_smaller")),
    "cubic_coeff_a": Attr("float"), "extrapolation_value": Attr("float"),
    "exclude_outside": Attr("int", choices=_BOOL), "antialias": Attr("int", choices=_BOOL),
    "axes": Attr("ints", axis="in", unique=True)}

SPECS.update({
    # normalizations
    "LayerNormalization": OpSpec("x scale b?", "y mean? inv_std_dev?", {
        **_AXIS, "epsilon": Attr("float"), "stash_type": _FLOAT_STASH}),
    "GroupNormalization": OpSpec("x scale bias", "y", {
        "num_groups": Attr("int", low=1, required=True), "epsilon": Attr("float"),
        "stash_type": _FLOAT_STASH}),
    "InstanceNormalization": OpSpec("input scale b", "output", {"epsilon": Attr("float")}),
    "LpNormalization": OpSpec("input", "output", {**_AXIS, "p": Attr("int", choices=(1, 2))}),
    "Hardmax": OpSpec("input", "output", _AXIS),
    # activations and element-wise math
    "Gelu": OpSpec("x", "y", {"approximate": Attr("string", choices=("none", "tanh"))}),
    "Celu": _ALPHA, "ThresholdedRelu": _ALPHA,
    "Shrink": OpSpec("input", "output", {"bias": Attr("float"), "lambd": Attr("float")}),
    **{op: _UNARY for op in ("Erf", "Sin", "Cos", "Round", "Sign", "Mish", "IsNaN")},
    "IsInf": OpSpec("x", "y", {"detect_negative": Attr("int", choices=_BOOL),
                               "detect_positive": Attr("int", choices=_BOOL)}),
    "Mod": OpSpec("a b", "c", {"fmod": Attr("int", choices=_BOOL)}),
    **{op: _BINARY for op in ("GreaterOrEqual", "LessOrEqual", "Xor")},
    "BitShift": OpSpec("x y", "z", {"direction": Attr("string", choices=("LEFT", "RIGHT"),
                                                      required=True)}),
    # reductions, selections, scans
    **{op: _REDUCE for op in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                              "ReduceSumSquare")},
    "ArgMax": _ARG, "ArgMin": _ARG,
    "TopK": OpSpec("x k", "values indices", {
        **_AXIS, "largest": Attr("int", choices=_BOOL), "sorted": Attr("int", choices=_BOOL)},
        values={"k": Attr("int", low=0)}),
    "CumSum": OpSpec("x axis", "y", {"exclusive": Attr("int", choices=_BOOL),
                                     "reverse": Attr("int", choices=_BOOL)},
                     values={"axis": Attr("int", axis="in")}),
    "Einsum": OpSpec("inputs...", "output", {"equation": Attr("string", required=True)}),
    # indexing and data movement
    "GatherElements": OpSpec("data indices", "output", _AXIS),
    "GatherND": OpSpec("data indices", "output", {"batch_dims": Attr("int", low=0)}),
    "ScatterElements": OpSpec("data indices updates", "output", {
        **_AXIS, "reduction": _SCATTER_REDUCTION}),
    "ScatterND": OpSpec("data indices updates", "output", {"reduction": _SCATTER_REDUCTION}),
    "Trilu": OpSpec("input k?", "output", {"upper": Attr("int", choices=_BOOL)},
                    values={"k": Attr("int")}),
    "NonZero": OpSpec("x", "y"),
    "OneHot": OpSpec("indices depth values", "output", {"axis": Attr("int", axis="out")},
                     values={"depth": Attr("int", low=1)}),
    "DepthToSpace": OpSpec("input", "output", _BLOCKS),
    "SpaceToDepth": OpSpec("input", "output", _BLOCKS),  # mode: opset 28
    # ConvTranspose: output_padding below the stride or the dilation (ONNX, onnxruntime);
    # output_shape gives the spatial sizes (onnx's inference takes nothing else).
    "ConvTranspose": OpSpec("x w b?", "y", {
        **_WINDOW, "group": Attr("int", low=1),
        "output_padding": Attr("ints", low=0, length="spatial",
                               below=("strides", "dilations")),
        "output_shape": Attr("ints", low=1, length="spatial")}),
    "Resize": OpSpec("x roi? scales? sizes?", "y", _RESIZE_MODES,
                     values={"sizes": Attr("ints", low=0)}),
    # control flow and recurrent layers (frontend/control.py): the bodies are graphs
    "If": OpSpec("cond", "outputs...", {"then_branch": Attr("graph", required=True),
                                        "else_branch": Attr("graph", required=True)}),
    "Loop": OpSpec("m? cond? v_initial...?", "v_final_and_scan_outputs...",
                   {"body": Attr("graph", required=True)}),
    "Scan": OpSpec("initial_state_and_scan_inputs...", "final_state_and_scan_outputs...", {
        "body": Attr("graph", required=True), "num_scan_inputs": Attr("int", low=1,
                                                                      required=True),
        # axes of each scan input or output (control.py holds them to those ranks)
        "scan_input_axes": Attr("ints"), "scan_output_axes": Attr("ints"),
        "scan_input_directions": Attr("ints", choices=_BOOL),
        "scan_output_directions": Attr("ints", choices=_BOOL)}),
    **{op: OpSpec(f"x w r b? sequence_lens? initial_h?{extra_in}", f"y? y_h?{extra_out}", {
        "hidden_size": Attr("int", low=1), "layout": Attr("int", choices=_BOOL),
        "direction": Attr("string", choices=("forward", "reverse", "bidirectional")),
        # names as onnxruntime matches them, in any case (control.py)
        "activations": Attr("strings"), "activation_alpha": Attr("floats"),
        "activation_beta": Attr("floats"), "clip": Attr("float", low=0.0), **extra})
       for op, extra_in, extra_out, extra in (
           ("LSTM", " initial_c? p?", " y_c?", {"input_forget": Attr("int", choices=_BOOL)}),
           ("GRU", "", "", {"linear_before_reset": Attr("int", choices=_BOOL)}),
           ("RNN", "", "", {}))},
    # Upsample (opsets 7 to 9; onnx's version converter makes it a Resize): the scales are
    # an attribute before opset 9, an input since.
    "Upsample": OpSpec("x scales?", "y", {
        "mode": Attr("string", choices=("nearest", "linear", "bilinear")),
        "scales": Attr("floats", low=1)}),
})

# ---- element-wise math, integer products, signals (graph/ops_signal.py) ---------------------

_Q_WINDOW = {**_WINDOW, "group": Attr("int", low=1)}
_WINDOW_FN = OpSpec("size", "output", {"output_datatype": Attr("int", dtype=True),
                                       "periodic": Attr("int", choices=_BOOL)},
                    values={"size": Attr("int", low=0)})

SPECS.update({
    **{op: _UNARY for op in ("Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
                             "Atanh", "BitwiseNot")},
    **{op: _BINARY for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")},
    "Swish": _ALPHA,
    "EyeLike": OpSpec("input", "output", {"dtype": Attr("int", dtype=True), "k": Attr("int")}),
    "CumProd": OpSpec("x axis", "y", {"exclusive": Attr("int", choices=_BOOL),
                                      "reverse": Attr("int", choices=_BOOL)},
                      values={"axis": Attr("int", axis="in")}),
    "ReverseSequence": OpSpec("input sequence_lens", "Y", {
        "batch_axis": Attr("int", choices=_BOOL), "time_axis": Attr("int", choices=_BOOL)}),
    "RMSNormalization": OpSpec("X scale", "Y", {**_AXIS, "epsilon": Attr("float"),
                                                "stash_type": _FLOAT_STASH}),
    # onnxruntime's dynamic quantization and the QOperator format
    "DynamicQuantizeLinear": OpSpec("x", "y y_scale y_zero_point"),
    "MatMulInteger": OpSpec("A B a_zero_point? b_zero_point?", "Y"),
    "ConvInteger": OpSpec("x w x_zero_point? w_zero_point?", "y", _Q_WINDOW),
    "QLinearMatMul": OpSpec("a a_scale a_zero_point b b_scale b_zero_point y_scale "
                            "y_zero_point", "y"),
    "QLinearConv": OpSpec("x x_scale x_zero_point w w_scale w_zero_point y_scale "
                          "y_zero_point B?", "y", _Q_WINDOW),
    # signals: the axis is an attribute in opset 17, an input from opset 20
    "DFT": OpSpec("input dft_length? axis?", "output", {
        "axis": Attr("int"), "inverse": Attr("int", choices=_BOOL),
        "onesided": Attr("int", choices=_BOOL)},
        values={"dft_length": Attr("int", low=1), "axis": Attr("int")}),
    "STFT": OpSpec("signal frame_step window? frame_length?", "output", {
        "onesided": Attr("int", choices=_BOOL)},
        values={"frame_step": Attr("int", low=1), "frame_length": Attr("int", low=1)}),
    "HannWindow": _WINDOW_FN, "HammingWindow": _WINDOW_FN, "BlackmanWindow": _WINDOW_FN,
    "MelWeightMatrix": OpSpec("num_mel_bins dft_length sample_rate lower_edge_hertz "
                              "upper_edge_hertz", "output",
                              {"output_datatype": Attr("int", dtype=True)}),
})

# ---- vision and detection operators (graph/ops_vision.py) -------------------------------------

_ALIGN = {"align_corners": Attr("int", choices=_BOOL)}
_PAD_WINDOW = {"pads": Attr("ints", low=0, length="pads"),
               "strides": Attr("ints", low=1, length="spatial")}

SPECS.update({
    # GridSample: opset 16 names the modes bilinear and bicubic, 20 linear and cubic.
    "GridSample": OpSpec("x grid", "y", {
        **_ALIGN, "mode": Attr("string", choices=("bilinear", "nearest", "bicubic", "linear",
                                                  "cubic")),
        "padding_mode": Attr("string", choices=("zeros", "border", "reflection"))}),
    "AffineGrid": OpSpec("theta size", "grid", _ALIGN, values={"size": Attr("ints", low=1)}),
    "NonMaxSuppression": OpSpec(
        "boxes scores max_output_boxes_per_class? iou_threshold? score_threshold?",
        "selected_indices", {"center_point_box": Attr("int", choices=_BOOL)}),
    "RoiAlign": OpSpec("x rois batch_indices", "y", {
        "coordinate_transformation_mode": Attr("string", choices=("half_pixel",
                                                                  "output_half_pixel")),
        "mode": Attr("string", choices=("avg", "max")),
        "output_height": Attr("int", low=1), "output_width": Attr("int", low=1),
        "sampling_ratio": Attr("int", low=0), "spatial_scale": Attr("float")}),
    "MaxRoiPool": OpSpec("x rois", "y", {
        "pooled_shape": Attr("ints", low=1, length="spatial", required=True),
        "spatial_scale": Attr("float")}),
    "LRN": OpSpec("x", "y", {"alpha": Attr("float"), "beta": Attr("float"),
                             "bias": Attr("float"), "size": Attr("int", low=1, required=True)}),
    "LpPool": OpSpec("x", "y", {**_WINDOW, **_KERNEL, "ceil_mode": Attr("int", choices=_BOOL),
                                "p": Attr("int", low=1)}),
    "GlobalLpPool": OpSpec("x", "y", {"p": Attr("int", low=1)}),
    "MeanVarianceNormalization": OpSpec("x", "y", {"axes": Attr("ints", axis="in",
                                                                unique=True)}),
    "MaxUnpool": OpSpec("x i output_shape?", "output", {**_PAD_WINDOW, **_KERNEL},
                        values={"output_shape": Attr("ints", low=1, length="rank")}),
    "Col2Im": OpSpec("input image_shape block_shape", "output", {
        "dilations": Attr("ints", low=1), "pads": Attr("ints", low=0),
        "strides": Attr("ints", low=1)},
        values={"image_shape": Attr("ints", low=1), "block_shape": Attr("ints", low=1)}),
    "CenterCropPad": OpSpec("input_data shape", "output_data", {
        "axes": Attr("ints", axis="in", unique=True)}, values={"shape": Attr("ints", low=0)}),
    "DeformConv": OpSpec("x w offset b? mask?", "y", {
        "kernel_shape": Attr("ints", low=1, length="spatial"),
        "strides": Attr("ints", low=1, length="spatial"),
        "dilations": Attr("ints", low=1, length="spatial"),
        "pads": Attr("ints", low=0, length="pads"),
        "group": Attr("int", low=1), "offset_group": Attr("int", low=1)}),
})

# ---- data-dependent, reinterpreting and random operators (graph/ops_data.py, ops_random.py) --

_FLOAT_TYPES = (1, 10, 11)  # float32, float16, float64: what the random draws can be
_SEED = Attr("float")

SPECS.update({
    # opsets 9-10 (deprecated at 11): the version converter makes it a ScatterElements
    "Scatter": OpSpec("data indices updates", "output", _AXIS),
    "Compress": OpSpec("input condition", "output", _AXIS),
    "Unique": OpSpec("X", "Y indices? inverse_indices? counts?", {
        **_AXIS, "sorted": Attr("int", choices=_BOOL)}),
    "TensorScatter": OpSpec("past_cache update write_indices?", "present_cache", {
        **_AXIS, "mode": Attr("string", choices=("linear", "circular"))}),
    "Det": OpSpec("X", "Y"),
    "BitCast": OpSpec("input", "output", {"to": Attr("int", dtype=True, required=True)}),
    "RandomNormal": OpSpec("", "output", {
        "shape": Attr("ints", low=0, required=True), "dtype": Attr("int", choices=_FLOAT_TYPES),
        "mean": Attr("float"), "scale": Attr("float"), "seed": _SEED}),
    "RandomUniform": OpSpec("", "output", {
        "shape": Attr("ints", low=0, required=True), "dtype": Attr("int", choices=_FLOAT_TYPES),
        "low": Attr("float"), "high": Attr("float"), "seed": _SEED}),
    "RandomNormalLike": OpSpec("input", "output", {
        "dtype": Attr("int", choices=_FLOAT_TYPES), "mean": Attr("float"),
        "scale": Attr("float"), "seed": _SEED}),
    "RandomUniformLike": OpSpec("input", "output", {
        "dtype": Attr("int", choices=_FLOAT_TYPES), "low": Attr("float"),
        "high": Attr("float"), "seed": _SEED}),
    "Bernoulli": OpSpec("input", "output", {"dtype": Attr("int", dtype=True), "seed": _SEED}),
    "Multinomial": OpSpec("input", "output", {
        "dtype": Attr("int", choices=(6, 7)), "sample_size": Attr("int", low=1),
        "seed": _SEED}),
})

# AttributeProto.type -> the kind it holds, and the field its value is in.
_KINDS = {1: ("float", "f"), 2: ("int", "i"), 3: ("string", "s"), 4: ("tensor", "t"),
          5: ("graph", "g"), 6: ("floats", "floats"), 7: ("ints", "ints"),
          8: ("strings", "strings"), 9: ("tensors", "tensors"), 10: ("graphs", "graphs"),
          11: ("sparse_tensor", "sparse_tensor"), 12: ("sparse_tensors", "sparse_tensors"),
          13: ("type_proto", "tp"), 14: ("type_protos", "type_protos")}
_ARTICLE = {"int": "an int", "ints": "a list of ints", "float": "a float",
            "floats": "a list of floats", "string": "a string", "strings": "a list of strings",
            "tensor": "a tensor"}


def _arity(node: Node, names: str, given: tuple, what: str) -> None:
    """Hold a node's inputs (or outputs) to ``names``: ``x`` required, ``x?`` optional (may
    be given as an empty name), ``x...`` one or more, ``x...?`` zero or more (last only)."""
    parts = names.split()
    variadic = bool(parts) and parts[-1].rstrip("?").endswith("...")
    fixed = parts[:-1] if variadic else parts
    least = max((k + 1 for k, p in enumerate(fixed) if not p.endswith("?")), default=0)
    if variadic and not parts[-1].endswith("?"):
        least = len(fixed) + 1
    most = None if variadic else len(parts)
    listed = ", ".join(parts) or "none"
    if len(given) < least or (most is not None and len(given) > most):
        count = f"{least}" if most == least else (
            f"{least} or more" if most is None else f"{least} to {most}")
        raise NodeError(node, f"has {len(given)} {what}{'s' * (len(given) != 1)} but "
                              f"{node.op} takes {count} "
                              f"({listed}); fix the node's {what} list")
    for k, name in enumerate(given[:len(fixed)]):
        if not name and not fixed[k].endswith("?"):
            raise NodeError(node, f"{what} {k} ({fixed[k]}) is required but empty; connect a "
                                  "value to it")
    if variadic and not all(given[len(fixed):]):
        raise NodeError(node, f"an empty {what} name among its {what}s ({listed}); connect a "
                              "value to each")


def _in_range(node, key, spec: Attr, value) -> None:
    values = value if isinstance(value, list) else [value]
    if spec.kind in ("float", "floats") and not all(math.isfinite(v) for v in values):
        raise NodeError(node, f"attribute {key!r} = {value} is not a finite number")
    if spec.low is not None and any(v < spec.low for v in values):
        raise NodeError(node, f"attribute {key!r} = {value}: every value must be at least "
                              f"{spec.low}")
    if spec.choices and any(v not in spec.choices for v in values):
        raise NodeError(node, f"attribute {key!r} = {value!r} is not one of "
                              f"{', '.join(map(repr, spec.choices))}")
    if spec.axis and any(not -MAX_RANK <= v <= MAX_RANK for v in values):
        # Known before any rank is: onnx's inference crashes the process on some (a
        # LayerNormalization axis of 2^31).
        raise NodeError(node, f"attribute {key!r} = {value} cannot be an axis: tensors have at "
                              f"most {MAX_RANK} dimensions")
    if spec.unique and len(set(values)) != len(values):
        raise NodeError(node, f"attribute {key!r} = {value} names a value twice")
    if spec.outputs and (value if spec.kind == "int" else len(values)) != len(node.outputs):
        raise NodeError(node, f"attribute {key!r} = {value} does not match its "
                              f"{len(node.outputs)} outputs")
    if spec.dtype:
        for v in values:
            if not supported_elem_type(v):
                raise NodeError(node, f"attribute {key!r} = {v} is not an element type celosia "
                                      "supports (bool, integers and float16/32/64 are)")


def _attr_value(node, a, spec: Attr, where):
    kind, field_name = _KINDS.get(a.type, (None, None))
    if kind is None:
        raise NodeError(node, f"attribute {a.name!r} has no valid type (AttributeProto.type "
                              f"{a.type}); re-export the model")
    if kind != spec.kind:
        raise NodeError(node, f"attribute {a.name!r} is {_ARTICLE.get(kind, 'a ' + kind)} but "
                              f"{node.op} takes {_ARTICLE.get(spec.kind, spec.kind)}")
    if kind == "tensor":
        return read_tensor(a.t, f"node {node.name!r} ({node.op}) attribute {a.name!r}", where)
    if kind in ("string", "strings"):
        raw = [a.s] if kind == "string" else list(a.strings)
        try:
            text = [s.decode("utf-8") for s in raw]
        except UnicodeDecodeError:
            raise NodeError(node, f"attribute {a.name!r} is not UTF-8 text ({raw[0][:20]!r}...)"
                                  "; re-export the model") from None
        return text[0] if kind == "string" else text
    value = getattr(a, field_name)
    return list(value) if kind in ("ints", "floats") else value


def read_node(proto, name: str, where: str) -> Node:
    """The graph Node of an ONNX NodeProto of a supported operator, after checking its arity
    and each attribute's kind and value against ``SPECS``."""
    op = proto.op_type
    spec = SPECS[op]
    node = Node(op, tuple(proto.input), tuple(proto.output), {}, name)
    _arity(node, spec.inputs, node.inputs, "input")
    _arity(node, spec.outputs, node.outputs, "output")
    attrs = {}
    for a in proto.attribute:
        if a.name in attrs:
            raise NodeError(node, f"attribute {a.name!r} is given twice")
        if a.name not in spec.attrs:
            known = ", ".join(sorted(spec.attrs)) or "none"
            raise NodeError(node, f"{op} has no attribute {a.name!r} (its attributes: {known})"
                                  "; remove it or re-export the model")
        attrs[a.name] = _attr_value(node, a, spec.attrs[a.name], where)
        if spec.attrs[a.name].kind in ("int", "ints", "float", "floats", "string", "strings"):
            _in_range(node, a.name, spec.attrs[a.name], attrs[a.name])
    missing = [k for k, rule in spec.attrs.items() if rule.required and k not in attrs]
    if missing:
        raise NodeError(node, f"attribute {missing[0]!r} is required but missing; re-export the "
                              "model")
    return Node(op, node.inputs, node.outputs, attrs, name)


def check_ranks(node: Node, rank: int) -> None:
    """The attribute rules that need input 0's rank: lengths and axes (``Attr.length``,
    ``Attr.axis``), then the bounds by other attributes (``Attr.below``)."""
    spec = SPECS.get(node.op)
    if spec is None:
        return
    for key, rule in spec.attrs.items():
        if key in node.attrs and (rule.length is not None or rule.axis is not None):
            _check_shaped(node, f"attribute {key!r}", rule, node.attrs[key], rank)
    for key, rule in spec.attrs.items():
        if key in node.attrs and rule.below:
            _check_below(node, key, rule.below)


def _check_shaped(node, what, rule: Attr, value, rank) -> None:
    values = value if isinstance(value, list) else [value]
    want = {"spatial": rank - 2, "pads": 2 * (rank - 2), "rank": rank}.get(rule.length)
    if want is not None and len(values) != want:
        raise NodeError(node, f"{what} has {len(values)} values but the input has rank {rank}, "
                              f"which needs {want}")
    if rule.axis:
        r = rank + len(values) if rule.axis == "out" else rank
        hi = r + 1 if rule.axis == "flatten" else r
        bad = [v for v in values if not -r <= v < max(hi, 1)]
        if bad:
            raise NodeError(node, f"{what} = {value}: axis {bad[0]} is out of range for rank "
                                  f"{r} ([{-r}, {hi - 1}])")
        if rule.unique and len({v % max(r, 1) for v in values}) != len(values):
            raise NodeError(node, f"{what} = {value} names an axis twice")


def _check_below(node, key, bounds) -> None:
    for i, v in enumerate(node.attrs[key]):
        limit = max(node.attrs[b][i] if b in node.attrs else 1 for b in bounds)
        if v >= limit:
            shown = " and ".join(f"{b} = {node.attrs.get(b, 'absent (1)')}" for b in bounds)
            raise NodeError(node, f"attribute {key!r} = {node.attrs[key]}: value {v} at {i} "
                                  f"must be less than {limit}, the largest of {shown} there")


def check_value(node: Node, index: int, value, rank: int):
    """Hold a compile-time input value to the operator's rule for that input
    (``OpSpec.values``), if it has one; ``rank`` is input 0's. Returns the value."""
    spec = SPECS.get(node.op)
    names = spec.inputs.split() if spec else []
    name = names[index].rstrip("?") if index < len(names) else None
    rule = spec.values.get(name) if spec else None
    if rule is None or value is None:
        return value
    flat = np.reshape(value, -1)
    what = f"input {index} ({name})"
    if rule.kind == "int" and flat.size != 1:
        raise NodeError(node, f"{what} must hold one value, not {list(np.shape(value))}; "
                              "give a scalar or a one-element tensor")
    if flat.dtype.kind == "f" and not np.all(np.isfinite(flat)):
        raise NodeError(node, f"{what} = {flat.tolist()} is not finite")
    numbers = [int(v) if flat.dtype.kind in "biu" else float(v) for v in flat]
    shown = numbers[0] if rule.kind == "int" else numbers
    if rule.low is not None and any(v < rule.low for v in numbers):
        raise NodeError(node, f"{what} = {shown}: every value must be at least {rule.low}")
    if rule.length is not None or rule.axis is not None:
        _check_shaped(node, what, rule, shown, rank)
    return value


# ---- output sizes known before a kernel runs -------------------------------------------------


def _broadcast(node, types):
    shapes = [t.shape for t in types if t is not None]
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        return []  # not broadcastable: the kernel says so, allocating nothing
    return [(shape, max(np.dtype(t.dtype).itemsize for t in types if t is not None))]


def _same_as(index, itemsize):
    return lambda node, types: [(types[index].shape, itemsize(node, types))]


def _expand(node, types):
    try:
        shape = np.broadcast_shapes(types[0].shape, tuple(max(d, 0) for d in node.attrs["shape"]))
    except ValueError:
        return []
    return [(shape, np.dtype(types[0].dtype).itemsize)]


def _tile(node, types):
    repeats = node.attrs["repeats"]
    if len(repeats) != len(types[0].shape):
        return []
    return [(tuple(d * max(r, 0) for d, r in zip(types[0].shape, repeats)),
             np.dtype(types[0].dtype).itemsize)]


def _gather(node, types):
    data, indices, axis = types[0].shape, types[1].shape, node.attrs["axis"]
    return [(data[:axis] + indices + data[axis + 1:], np.dtype(types[0].dtype).itemsize)]


def _pad(node, types):
    shape, pads = types[0].shape, node.attrs["pads"]
    r = len(shape)
    if len(pads) != 2 * r:
        return []
    return [(tuple(max(d + pads[i] + pads[i + r], 0) for i, d in enumerate(shape)),
             np.dtype(types[0].dtype).itemsize)]


def _gather_nd(node, types):
    data, indices, b = types[0].shape, types[1].shape, node.attrs.get("batch_dims", 0)
    if not indices or indices[-1] > len(data) - b:
        return []  # the kernel says what is wrong
    return [(indices[:-1] + data[b + indices[-1]:], np.dtype(types[0].dtype).itemsize)]


def _one_hot(node, types):
    indices, axis = types[0].shape, node.attrs["axis"]
    return [(indices[:axis] + (node.attrs["depth"],) + indices[axis:],
             np.dtype(types[1].dtype).itemsize)]


def _dtype_attr(key):
    return lambda node, types: np.dtype(node.attrs[key]).itemsize


def _spatial_output(spatial_of):
    """[N or rows, C, *spatial] of the vision operators whose output sizes come from
    attributes: ``spatial_of(node, types) -> (leading dims, spatial dims)`` or None."""
    def rule(node, types):
        dims = spatial_of(node, types)
        if dims is None:
            return []
        return [(tuple(max(int(d), 0) for d in dims), np.dtype(types[0].dtype).itemsize)]
    return rule


def _col2im_dims(node, types):
    x, a = types[0].shape, node.attrs
    blocks = math.prod(a["block_shape"])
    if len(x) != 3 or x[1] % max(blocks, 1):
        return None
    return (x[0], x[1] // blocks, *a["image_shape"])


def _center_crop_pad_dims(node, types):
    shape = list(types[0].shape)
    for axis, size in zip(node.attrs["axes"], node.attrs["shape"]):
        if 0 <= axis < len(shape):
            shape[axis] = size
    return shape


_VISION_BOUNDS = {
    "AffineGrid": _spatial_output(lambda node, types: (
        node.attrs["size"][0], *node.attrs["size"][2:], len(node.attrs["size"]) - 2)),
    "GridSample": _spatial_output(lambda node, types: (
        *types[0].shape[:2], *types[1].shape[1:-1])),
    "RoiAlign": _spatial_output(lambda node, types: (
        types[1].shape[0], types[0].shape[1], node.attrs["output_height"],
        node.attrs["output_width"]) if len(types[1].shape) == 2 and len(types[0].shape) > 1
        else None),
    "MaxRoiPool": _spatial_output(lambda node, types: (
        types[1].shape[0], types[0].shape[1], *node.attrs["pooled_shape"])
        if len(types[1].shape) == 2 and len(types[0].shape) > 1 else None),
    "MaxUnpool": _spatial_output(lambda node, types: node.attrs["output_shape"]),
    "Col2Im": _spatial_output(_col2im_dims),
    "CenterCropPad": _spatial_output(_center_crop_pad_dims),
}


_BOUNDS = {
    **{op: _broadcast for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean",
                                 "Equal", "Less", "Greater", "And", "Or", "Where", "PRelu",
                                 "Clip", "Mod", "GreaterOrEqual", "LessOrEqual", "Xor",
                                 "BitShift")},
    "Expand": _expand, "Tile": _tile, "Gather": _gather, "Pad": _pad,
    "GatherND": _gather_nd, "OneHot": _one_hot,
    "Cast": _same_as(0, _dtype_attr("to")),
    "QuantizeLinear": _same_as(0, _dtype_attr("output_dtype")),
    "DequantizeLinear": _same_as(0, _dtype_attr("output_dtype")),
    **_VISION_BOUNDS,
}


def output_bounds(node: Node, types: list) -> list[tuple[tuple, int]]:
    """(shape, bytes per element) of the outputs of a canonical node whose output can be
    larger than its inputs, computed without running it; [] for the others, and for a node
    in run-time form (graph/dynamic.py: its shape inputs, Tile's repeats or OneHot's depth,
    are still inputs, and its size is known when it runs)."""
    rule = _BOUNDS.get(node.op)
    if rule is None or node.attrs.get("runtime_shape") or any(
            t is None for t in types[:1]) or not all(t.static for t in types if t is not None):
        return []  # a size only known at run time: the inferred type bounds what it can
    return rule(node, types)


def nbytes(shape, itemsize) -> int:
    """Bytes of a tensor, in Python integers (no int64 overflow for absurd shapes); a size
    only known at run time (None) counts as 1, so the figure is a lower bound."""
    return math.prod(1 if d is None else d for d in shape) * itemsize
