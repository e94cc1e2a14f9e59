"""Small ONNX models written with onnx.helper, for the tests that build models node by node
(tests/conftest.py puts this folder on sys.path)."""

from onnx import TensorProto, helper


def make_model(nodes, inputs, outputs, inits=(), opset=17):
    """A model of one graph "g"; IR version 10, which onnxruntime loads."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def vi(name, shape, elem=TensorProto.FLOAT):
    """A value's type: ``shape`` None for an unknown rank."""
    return helper.make_tensor_value_info(name, elem, shape)


GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent_layer(op, *, steps=6, batch=3, size=7, hidden=5, direction="forward", layout=0,
                    seq_lens=None, initial=True, bias=True, peepholes=False, seed=0,
                    scale=None, opset=14, **attrs):
    """One LSTM/GRU/RNN node named "rnn" on input X; weights (and lengths, initial states)
    initializers, normal with ``scale`` (default min(0.5, 1.5 / sqrt(hidden)), which keeps
    the gates out of saturation); ``layout`` written only when it is 1."""
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    dirs, g = (2 if direction == "bidirectional" else 1), GATES[op]
    scale = min(0.5, 1.5 / np.sqrt(hidden)) if scale is None else scale

    def rand(*shape):
        return (rng.normal(size=shape) * scale).astype(np.float32)

    inits = {"W": rand(dirs, g * hidden, size), "R": rand(dirs, g * hidden, hidden)}
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        inits["B"], names[3] = rand(dirs, 2 * g * hidden), "B"
    if seq_lens is not None:
        inits["L"], names[4] = np.array(seq_lens, np.int32), "L"
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    if initial:
        inits["H0"], names[5] = rand(*state), "H0"
        if op == "LSTM":
            inits["C0"], names[6] = rand(*state), "C0"
    if peepholes:
        inits["P"], names[7] = rand(dirs, 3 * hidden), "P"
    while not names[-1]:
        names.pop()
    outs = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    node = helper.make_node(op, names, outs, name="rnn", direction=direction,
                            hidden_size=hidden, **({"layout": layout} if layout else {}),
                            **attrs)
    x_shape = [batch, steps, size] if layout else [steps, batch, size]
    return make_model([node], [vi("X", x_shape)], [vi(o, None) for o in outs],
                      [numpy_helper.from_array(v, k) for k, v in inits.items()], opset=opset)


def onnxruntime_run(model, feeds) -> dict:
    """onnxruntime's outputs of ``model`` (a ModelProto) on ``feeds``, by output name."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def float_graph(nodes, inputs: dict, inits: dict, opset=17):
    """The optimized celosia graph of ``nodes`` on float inputs {name: shape}, initializers
    {name: array} and one output "y"."""
    from onnx import numpy_helper

    from celosia.compiler.frontend.onnx import import_onnx
    from celosia.compiler.graph.passes import optimize

    return optimize(import_onnx(make_model(
        nodes, [vi(k, list(s)) for k, s in inputs.items()], [vi("y", None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()], opset=opset)))


def cpu_build_checked(model, feeds: dict, output: str = "y", *, rtol=1e-4, atol=1e-5):
    """(CpuModel, its ``output``) of ``model`` on ``feeds``, checked against the numpy
    reference executor and onnxruntime: same shape, within ``rtol`` and ``atol`` times the
    reference's largest magnitude (float32 kernels sum in another order)."""
    import numpy as np

    from celosia.runtime.cpu import CpuModel
    from celosia.runtime.reference import ReferenceModel

    shapes = {k: v.shape for k, v in feeds.items()}
    built = CpuModel.build(model, shapes)
    got = built.run(feeds)[output]
    ref = ReferenceModel.load(model, shapes).run(feeds)[output]
    want = onnxruntime_run(model, feeds)[output]
    for other in (ref, want):
        assert got.shape == other.shape
        np.testing.assert_allclose(got, other, rtol=rtol, atol=atol * np.abs(other).max())
    return built, got


def onnxruntime_qdq(tmp_path, model, data, activation_type="QInt8", symmetric=None):
    """The path of onnxruntime's ``quantize_static`` QDQ model of ``model`` (per-channel
    int8 weights) calibrated on the feeds ``data``; ``symmetric`` sets its
    ActivationSymmetric option, None leaves onnxruntime's default (asymmetric)."""
    import logging

    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    src, dst = tmp_path / "float.onnx", tmp_path / f"qdq_{activation_type}.onnx"
    onnx.save(model, src)
    extra = {} if symmetric is None else {"ActivationSymmetric": symmetric}
    logging.disable(logging.WARNING)  # "please run pre-processing" advice
    try:
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=getattr(QuantType, activation_type),
                        weight_type=QuantType.QInt8, per_channel=True, extra_options=extra)
    finally:
        logging.disable(logging.NOTSET)
    return dst
