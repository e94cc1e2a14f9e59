"""LSTM, GRU and RNN: the numpy definitions (graph/ops_recurrent.py) through import and the
CPU build against onnxruntime on seeded random inputs, every direction, biases, initial
states, sequence lengths, peepholes, clip, activations with parameters, both layouts."""

import numpy as np
import pytest
from onnx import numpy_helper
from onnx_builders import recurrent_layer, onnxruntime_run

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.ir import NodeError
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.reference import run_graph
from celosia.runtime.cpu import CpuModel

SEQ, BATCH, SIZE, HIDDEN = 6, 3, 5, 4

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def recurrent_model(op, direction="forward", **kwargs):
    """One recurrent node at this file's sizes; X is the graph input, everything else an
    initializer (onnx_builders.recurrent_layer)."""
    return recurrent_layer(op, steps=SEQ, batch=BATCH, size=SIZE, hidden=HIDDEN,
                           direction=direction, scale=0.5, **kwargs)



def assert_close(got, want):
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, k
        # onnxruntime's sigmoid and tanh are float32 approximations (MLAS)
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=2e-6, err_msg=k)


def x_input(layout=0, seed=1):
    shape = (BATCH, SEQ, SIZE) if layout else (SEQ, BATCH, SIZE)
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def check(m, layout=0):
    feeds = {"X": x_input(layout)}
    got = run_graph(optimize(import_onnx(m)), feeds)
    assert_close(got, onnxruntime_run(m, feeds))
    return got


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_directions_with_bias_and_initial_state(op, direction):
    check(recurrent_model(op, direction))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_defaults_without_bias_or_initial_state(op):
    check(recurrent_model(op, bias=False, initial=False))


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_sequence_lengths(op, direction):
    """Sequences shorter than X (one of length 0): Y is 0 past each length, the final state
    is that of each sequence's last element (0 for the empty one)."""
    y = check(recurrent_model(op, direction, seq_lens=[SEQ, 0, 2]))
    assert not y["Y"][2:, :, 2].any() and not y["Y_h"][:, 1].any()


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_clip(op):
    got = check(recurrent_model(op, "bidirectional", clip=0.3))
    unclipped = run_graph(import_onnx(recurrent_model(op, "bidirectional")), {"X": x_input()})
    assert not np.allclose(got["Y"], unclipped["Y"])


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_linear_before_reset(linear_before_reset):
    check(recurrent_model("GRU", "bidirectional", linear_before_reset=linear_before_reset))


def test_lstm_peepholes_and_input_forget():
    check(recurrent_model("LSTM", "bidirectional", peepholes=True))
    check(recurrent_model("LSTM", "reverse", peepholes=True, input_forget=1))


# Activations with parameters, consumed in order by the functions that take them.
ACTIVATION_CASES = {
    "LSTM": dict(activations=["HardSigmoid", "LeakyRelu", "ScaledTanh",
                              "Sigmoid", "Softsign", "Affine"],
                 activation_alpha=[0.3, 0.2, 1.5, 0.8], activation_beta=[0.4, 0.7, 0.2, 0.1]),
    "GRU": dict(activations=["Sigmoid", "Elu", "HardSigmoid", "ThresholdedRelu"],
                activation_alpha=[0.5, 0.25, 0.1], activation_beta=[0.6]),
    "RNN": dict(activations=["Relu", "Softplus"]),
}


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_activations_with_parameters(op):
    check(recurrent_model(op, "bidirectional", **ACTIVATION_CASES[op]))


def test_activation_defaults_come_from_onnxruntime():
    """LeakyRelu without an alpha is 0.01, HardSigmoid 0.2/0.5, Elu 1 (onnxruntime's table)."""
    g = import_onnx(recurrent_model("GRU", activations=["HardSigmoid", "LeakyRelu"]))
    (node,) = g.nodes
    assert node.attrs["activation_alpha"] == [0.2, 0.01]
    assert node.attrs["activation_beta"] == [0.5, 0.0]
    check(recurrent_model("GRU", activations=["HardSigmoid", "LeakyRelu"]))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_batch_first_layout(op):
    """layout=1 (onnxruntime has no kernel for it): the same numbers as layout 0 on
    transposed tensors."""
    m1 = recurrent_model(op, "bidirectional", layout=1, seq_lens=[4, SEQ, 1], seed=3)
    m0 = recurrent_model(op, "bidirectional", layout=0, seq_lens=[4, SEQ, 1], seed=3,
                         initial=False)
    x = x_input(1)
    # the same weights; initial states transposed into layout 0
    inits = {i.name: numpy_helper.to_array(i) for i in m1.graph.initializer}
    for name in ("H0", "C0"):
        if name in inits:
            m0.graph.initializer.append(numpy_helper.from_array(
                np.ascontiguousarray(inits[name].swapaxes(0, 1)), name))
    m0.graph.node[0].input.extend([""] * (8 - len(m0.graph.node[0].input)))
    m0.graph.node[0].input[5] = "H0"
    if op == "LSTM":
        m0.graph.node[0].input[6] = "C0"
    del m0.graph.node[0].input[7 if op == "LSTM" else 6:]
    want = onnxruntime_run(m0, {"X": np.ascontiguousarray(x.swapaxes(0, 1))})
    got = run_graph(import_onnx(m1), {"X": x})
    np.testing.assert_allclose(got["Y"], want["Y"].transpose(2, 0, 1, 3), rtol=1e-5,
                               atol=2e-6)
    np.testing.assert_allclose(got["Y_h"], want["Y_h"].swapaxes(0, 1), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_cpu_build_and_cel_round_trip(op, direction, tmp_path):
    m = recurrent_model(op, direction, seq_lens=[SEQ, 3, 5], peepholes=op == "LSTM")
    feeds = {"X": x_input()}
    want = onnxruntime_run(m, feeds)
    built = CpuModel.build(m)
    assert {s["op"]: s["kind"] for s in built.program.steps}[op] == "kernel"  # compiled
    assert_close(built.run(feeds), want)
    built.save(tmp_path / "rnn.cel")
    assert_close(CpuModel.load(tmp_path / "rnn.cel").run(feeds), want)


def test_wrong_shapes_name_the_input():
    m = recurrent_model("GRU", "bidirectional")
    m.graph.node[0].attribute[0].s = b"forward"  # direction: W has 2 directions
    with pytest.raises(NodeError, match=r"node 'rnn' \(GRU\): input W is float32\[2,12,5\] but "
                                        r"must be float32\[1,12,5\]"):
        import_onnx(m)
    m = recurrent_model("RNN", activations=["Swish"])
    with pytest.raises(NodeError, match="activation 'Swish' is not one of"):
        import_onnx(m)


def test_sequence_lengths_out_of_range_at_run_time():
    m = recurrent_model("RNN", seq_lens=[SEQ + 1, 1, 1])
    with pytest.raises(NodeError, match=r"node 'rnn' \(RNN\): failed at run time: "
                                        r"sequence_lens \[7, 1, 1\] must be within \[0, 6\]"):
        run_graph(import_onnx(m), {"X": x_input()})


def test_torch_exported_lstm_and_gru(tmp_path):
    """A stacked bidirectional batch-first LSTM, a GRU (linear_before_reset, as PyTorch
    exports it) and a Linear, exported by PyTorch: the CPU build gives PyTorch's and
    onnxruntime's outputs."""
    torch = pytest.importorskip("torch")
    import io
    import warnings

    class Recognizer(torch.nn.Module):  # the recurrent half of a CRNN
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True,
                                      batch_first=True)
            self.gru = torch.nn.GRU(32, 12)
            self.fc = torch.nn.Linear(12, 5)

        def forward(self, x):
            y, _ = self.lstm(x)
            z, h = self.gru(y.transpose(0, 1))
            return self.fc(z), h

    torch.manual_seed(0)
    net = Recognizer().eval()
    x = torch.randn(2, 7, 8)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), buf, dynamo=False, input_names=["x"],
                          output_names=["y", "h"], opset_version=17)
    built = CpuModel.build(buf.getvalue())
    got = built.run({"x": x.numpy()})
    with torch.no_grad():
        want_y, want_h = (t.numpy() for t in net(x))
    np.testing.assert_allclose(got["y"], want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["h"], want_h, rtol=1e-5, atol=1e-6)
    import onnx
    assert_close(got, onnxruntime_run(onnx.load_from_string(buf.getvalue()),
                                      {"x": x.numpy()}))
    kinds = [(s["op"], s["kind"]) for s in built.program.steps if s["op"] in ("LSTM", "GRU")]
    # each layer compiled: its input projection and its time loop
    assert kinds == [("LSTM", "kernel")] * 4 + [("GRU", "kernel")] * 2
