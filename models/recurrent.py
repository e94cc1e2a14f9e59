"""Sequence models: recurrence and control flow.

- ``lstm``: a keyword-spotting style classifier in plain torch (two stacked LSTM layers
  over [batch, time, features], a Linear on the last step), exported with dynamic batch and
  time axes; the exporter writes ONNX LSTM nodes.
- ``control_flow``: a graph torch's tracer cannot write, built with onnx.helper: a Loop
  that runs an Elman RNN cell over time (trip count from the input's Shape, the cell's
  weights read from the outer scope, the hidden states as scan outputs), then an If on a
  scalar input choosing between two heads, as models with a sample-rate or mode switch
  (silero-vad) do.
"""

from __future__ import annotations

import numpy as np

from .torch_export import cached, export
from .zoo import IR_VERSION, OPSET

__all__ = ["lstm", "recurrent_classifier", "control_flow", "control_flow_feeds"]


def lstm(features=40, hidden=256, layers=2, classes=12, time=100, batch=1, seed=0):
    """Stacked LSTM classifier; input features [batch, time, features], output logits
    [batch, classes]; batch and time axes dynamic."""
    args = dict(features=features, hidden=hidden, layers=layers, classes=classes, time=time,
                batch=batch, seed=seed)

    def make():
        import torch
        from torch import nn

        class KeywordLSTM(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM(features, hidden, layers, batch_first=True)
                self.head = nn.Linear(hidden, classes)

            def forward(self, x):
                out, _ = self.rnn(x)
                return self.head(out[:, -1])

        torch.manual_seed(seed)
        example = (torch.randn(batch, time, features),)
        return export(KeywordLSTM(), example, ["features"], ["logits"],
                      {"features": {0: "batch", 1: "time"}, "logits": {0: "batch"}})

    return cached(lstm, args, make)


def recurrent_classifier(cell="GRU", features=40, hidden=256, layers=2, classes=12, time=100,
                         batch=1, bidirectional=False, seed=0):
    """``lstm``'s classifier with another cell: torch's GRU or RNN (tanh), optionally
    bidirectional; the exporter writes ONNX GRU or RNN nodes."""
    args = dict(cell=cell, features=features, hidden=hidden, layers=layers, classes=classes,
                time=time, batch=batch, bidirectional=bidirectional, seed=seed)

    def make():
        import torch
        from torch import nn

        class Classifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(nn, cell)(features, hidden, layers, batch_first=True,
                                             bidirectional=bidirectional)
                self.head = nn.Linear(hidden * (2 if bidirectional else 1), classes)

            def forward(self, x):
                out, _ = self.rnn(x)
                return self.head(out[:, -1])

        torch.manual_seed(seed)
        example = (torch.randn(batch, time, features),)
        return export(Classifier(), example, ["features"], ["logits"],
                      {"features": {0: "batch", 1: "time"}, "logits": {0: "batch"}})

    return cached(recurrent_classifier, args, make)


def _rnn_body(hidden: int):
    """The Loop body: (iteration, condition, h) -> (condition, h', h' as scan output).
    x_t is Gather(x_time_major, iteration); W, U and b come from the outer graph."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Gather", ["x_tm", "iter"], ["x_t"], axis=0),
        helper.make_node("MatMul", ["x_t", "W"], ["xw"]),
        helper.make_node("MatMul", ["h_in", "U"], ["hu"]),
        helper.make_node("Add", ["xw", "hu"], ["pre0"]),
        helper.make_node("Add", ["pre0", "b"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Identity", ["h_out"], ["h_scan"]),
    ]
    f32 = TensorProto.FLOAT
    return helper.make_graph(
        nodes, "rnn_cell",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", f32, ["batch", hidden])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", f32, ["batch", hidden]),
         helper.make_tensor_value_info("h_scan", f32, ["batch", hidden])])


def _head(name: str, gate: str, hidden: int, classes: int):
    """An If branch: logits of the last hidden state through a Gemm and ``gate``."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Gemm", ["h_last", f"{name}_w", f"{name}_b"], [f"{name}_z"]),
             helper.make_node(gate, [f"{name}_z"], [f"{name}_y"],
                              **({"axis": -1} if gate == "Softmax" else {}))]
    return helper.make_graph(nodes, name, [], [
        helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["batch", classes])])


def control_flow(features=64, hidden=256, classes=10, time=100, batch=1, seed=0):
    """Loop (an RNN over time) then If (one of two heads by ``mode``). Inputs x [batch,
    time, features] float (both axes dynamic), mode int64 scalar (0: softmax head, else:
    sigmoid head); outputs scores [batch, classes] and states [time, batch, hidden]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weight(name, *shape, scale=None):
        w = rng.normal(0, scale or 1 / np.sqrt(shape[0]), shape).astype(np.float32)
        return numpy_helper.from_array(w, name)

    inits = [weight("W", features, hidden),
             weight("U", hidden, hidden, scale=0.5 / np.sqrt(hidden)),
             weight("b", hidden, scale=0.1),
             weight("softmax_w", hidden, classes), weight("softmax_b", classes, scale=0.1),
             weight("sigmoid_w", hidden, classes), weight("sigmoid_b", classes, scale=0.1),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(True), "true")]
    nodes = [
        helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "one"], ["steps"], axis=0),
        helper.make_node("Gather", ["x_shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "hidden_dim"], ["h0_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["h0_shape"], ["h0"],
                         value=numpy_helper.from_array(np.zeros(1, np.float32))),
        helper.make_node("Loop", ["steps", "true", "h0"], ["h_last", "states"],
                         body=_rnn_body(hidden)),
        helper.make_node("Equal", ["mode", "zero"], ["use_softmax"]),
        helper.make_node("If", ["use_softmax"], ["scores"],
                         then_branch=_head("softmax", "Softmax", hidden, classes),
                         else_branch=_head("sigmoid", "Sigmoid", hidden, classes)),
    ]
    inits += [numpy_helper.from_array(np.array([0]), "axes0"),
              numpy_helper.from_array(np.array([hidden]), "hidden_dim")]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "control_flow",
        [helper.make_tensor_value_info("x", f32, ["batch", "time", features]),
         helper.make_tensor_value_info("mode", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("scores", f32, ["batch", classes]),
         helper.make_tensor_value_info("states", f32, ["time", "batch", hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="celosia.models.recurrent")
    model.ir_version = IR_VERSION
    return model


def control_flow_feeds(args: dict, rng) -> dict:
    x = rng.normal(size=(args.get("batch", 1), args["time"], args["features"]))
    return {"x": x.astype(np.float32), "mode": np.array(0, np.int64)}
