"""One-node ONNX models checked against their oracle: each operator's case runs through
onnxruntime (or onnx's reference evaluator where onnxruntime lacks the operator or
mode), through celosia's import + reference executor, and through the compiled CPU build
(CpuModel), and the three must agree: bit for bit between celosia's two paths, and with
the oracle exactly for integer and boolean outputs, within a tolerance for floats.
Operators in ``FLOAT_KERNELS`` have compiled float32 kernels in the CPU build (sums in
another order than numpy's BLAS, fused multiply-adds): there the CPU build's float outputs
agree with the reference to float32 rounding (1e-5 of the output's scale), not bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from celosia.runtime.cpu import CpuModel
from celosia.runtime.reference import ReferenceModel

__all__ = ["node_model", "oracle", "check_node", "FLOAT_KERNELS"]

FLOAT_KERNELS = {"ConvTranspose", "Erf", "Gelu", "LayerNormalization", "Softmax", "Mish",
                 "LogSoftmax",
                 "ReduceMean", "Conv",  # spatial means on the gap kernel, 3-D convolutions
                 # function operators: their bodies' MatMul, Softmax, ... kernels
                 "Attention", "RotaryEmbedding", "MeanVarianceNormalization"}


def node_model(op, inputs, feeds, *, consts=None, attrs=None, opset=21, outputs=1,
               infer=True):
    """A model of one ``op`` node reading ``inputs`` (names; "" for a missing optional
    one): graph inputs typed after ``feeds``, initializers from ``consts``; ``infer=False``
    leaves the outputs untyped (an invalid node, for error tests)."""
    consts = consts or {}
    graph_inputs = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
    names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, list(inputs), names, **(attrs or {}))
    graph = helper.make_graph(
        [node], op.lower(), graph_inputs, [helper.make_empty_tensor_value_info(n) for n in names],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what this onnxruntime reads
    if not infer:
        return model
    # Typed outputs from onnx's shape inference (strict: an invalid case fails here); it
    # leaves those of function operators (GroupNormalization) untyped.
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _typed(model, arrays):
    """The model with every untyped (or unshaped) output typed after the oracle's array
    for it."""
    for out, a in zip(model.graph.output, arrays):
        if not (out.type.HasField("tensor_type") and out.type.tensor_type.HasField("shape")):
            out.CopyFrom(helper.make_tensor_value_info(
                out.name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
    return model


def oracle(model, feeds, which="onnxruntime"):
    if which == "onnxruntime":
        import onnxruntime

        session = onnxruntime.InferenceSession(model.SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


def check_node(op, inputs, feeds, *, consts=None, attrs=None, opset=21, outputs=1,
               which="onnxruntime", rtol=1e-5, atol=1e-6, sort_axis=None, exact=True):
    """Run the node every way and compare (see the module docstring); ``sort_axis``
    compares outputs sorted along that axis (an order the operator leaves open);
    ``exact=False`` compares integer outputs within the tolerance too."""
    model = node_model(op, inputs, feeds, consts=consts, attrs=attrs, opset=opset,
                       outputs=outputs)
    want = oracle(model, feeds, which)
    model = _typed(model, want)
    if not onnx.defs.get_schema(op, opset).deprecated:  # the checker rejects those
        onnx.checker.check_model(model, full_check=True)
    # The feeds' shapes, given: a 0 input dim is dynamic to the importer (exporters' mark).
    shapes = {k: v.shape for k, v in feeds.items()}
    ref = ReferenceModel.load(model, shapes).run(feeds)
    cpu = CpuModel.build(model, shapes).run(feeds)
    for k, w in enumerate(want):
        name = f"y{k}"
        got, built = ref[name], cpu[name]
        assert got.dtype == w.dtype and got.shape == w.shape, (
            f"{name}: {got.dtype}{list(got.shape)}, want {w.dtype}{list(w.shape)}")
        if op in FLOAT_KERNELS and got.dtype.kind == "f":
            np.testing.assert_allclose(built, got, rtol=0, atol=1e-5 * np.abs(got).max(),
                                       err_msg=f"{name}: CpuModel vs reference")
        else:
            np.testing.assert_array_equal(built, got, err_msg=f"{name}: CpuModel vs reference")
        if sort_axis is not None:
            w, got = np.sort(w, axis=sort_axis), np.sort(got, axis=sort_axis)
        if w.dtype.kind in "biu" and exact:
            np.testing.assert_array_equal(got, w, err_msg=name)
        else:
            np.testing.assert_allclose(got, w, rtol=rtol, atol=atol, err_msg=name)
    return want, ref
