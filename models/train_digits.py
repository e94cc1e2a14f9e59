"""Train the digits CNN that ``celosia demo`` runs, with numpy only, and write it as ONNX.

    python -m celosia.models.train_digits [--out PATH] [--epochs N] [--seed S]

The network is small on purpose but uses each path of the accelerator: convolutions (one
with stride 2), a residual Add, a dense layer, and a Softmax that stays on the CPU::

    image [N,1,8,8] -> conv1 3x3 1->16 + Relu            -> [N,16,8,8]
                    -> conv2 3x3 16->32 stride 2 + Relu  -> [N,32,4,4]
                    -> conv3 3x3 32->32, Add conv2's output, Relu
                    -> Flatten -> Gemm 512->10 = logits -> Softmax = probs

Training is plain numpy (im2col convolutions, hand-written backward pass, Adam, random
1-pixel shifts), so the bundled model can be rebuilt anywhere without torch; a given seed
always gives the same model. The default output is the file celosia.models.digits loads.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from .digits import MODEL_PATH, accuracy, load_split
from .zoo import IR_VERSION, OPSET

# name: (output channels, input channels, stride) of each 3x3 convolution (padding 1).
CONVS = {"conv1": (16, 1, 1), "conv2": (32, 16, 2), "conv3": (32, 32, 1)}
FEATURES, CLASSES = 32 * 4 * 4, 10
BATCH, LEARNING_RATE = 32, 3e-3


def init_params(rng: np.random.Generator) -> dict:
    """He-initialised weights in ONNX layouts (Conv: [out, in, 3, 3]; Gemm: [out, in])."""
    params = {}
    for name, (cout, cin, _) in CONVS.items():
        params[f"{name}.weight"] = rng.normal(0, np.sqrt(2 / (cin * 9)), (cout, cin, 3, 3))
        params[f"{name}.bias"] = np.zeros(cout)
    params["fc.weight"] = rng.normal(0, np.sqrt(1 / FEATURES), (CLASSES, FEATURES))
    params["fc.bias"] = np.zeros(CLASSES)
    return {k: v.astype(np.float32) for k, v in params.items()}


def im2col(x, stride):
    """[N,C,H,W] -> [N*Ho*Wo, C*9] patches of a 3x3, pad-1 window, columns ordered (c, i, j)
    like a Conv weight's [in, 3, 3]; one strided slice per window offset."""
    n, c, h, w = x.shape
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.empty((n, ho, wo, c, 3, 3), x.dtype)
    for i in range(3):
        for j in range(3):
            window = xp[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride]
            cols[..., i, j] = window.transpose(0, 2, 3, 1)
    return cols.reshape(n * ho * wo, c * 9)


def col2im(dcols, x_shape, stride):
    """The adjoint of im2col: sums each patch gradient back onto the pixels it came from."""
    n, c, h, w = x_shape
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    dcols = dcols.reshape(n, ho, wo, c, 3, 3)
    dxp = np.zeros((n, c, h + 2, w + 2), dcols.dtype)
    for i in range(3):
        for j in range(3):
            dxp[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride] += \
                dcols[..., i, j].transpose(0, 3, 1, 2)
    return dxp[:, :, 1:-1, 1:-1]


def conv(params, name, x):
    """Conv with bias; returns the [N,C,Ho,Wo] output and the im2col patches for backward."""
    cout, _, stride = CONVS[name]
    cols = im2col(x, stride)
    ho = (x.shape[2] - 1) // stride + 1
    out = cols @ params[f"{name}.weight"].reshape(cout, -1).T + params[f"{name}.bias"]
    return out.reshape(x.shape[0], ho, ho, cout).transpose(0, 3, 1, 2), cols


def forward(params, x):
    """logits [N,10] and the activations the backward pass needs."""
    a1, cols1 = conv(params, "conv1", x)
    a1 = np.maximum(a1, 0)
    a2, cols2 = conv(params, "conv2", a1)
    a2 = np.maximum(a2, 0)
    z3, cols3 = conv(params, "conv3", a2)
    a3 = np.maximum(z3 + a2, 0)
    features = a3.reshape(len(x), FEATURES)
    logits = features @ params["fc.weight"].T + params["fc.bias"]
    return logits, (x, cols1, a1, cols2, a2, cols3, a3, features)


def softmax(logits):
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def loss_and_grads(params, x, y):
    """Mean cross-entropy of a batch and its gradient for every parameter."""
    logits, (x, cols1, a1, cols2, a2, cols3, a3, features) = forward(params, x)
    probs = softmax(logits)
    n = len(y)
    loss = float(-np.log(probs[np.arange(n), y] + 1e-12).mean())
    dlogits = probs
    dlogits[np.arange(n), y] -= 1
    dlogits /= n
    grads = {"fc.weight": dlogits.T @ features, "fc.bias": dlogits.sum(axis=0)}
    da3 = (dlogits @ params["fc.weight"]).reshape(a3.shape) * (a3 > 0)
    # The residual Add sends da3 both into conv3 and straight back to conv2's output.
    da2 = da3 + conv_backward(params, grads, "conv3", da3, cols3, a2.shape)
    da1 = conv_backward(params, grads, "conv2", da2 * (a2 > 0), cols2, a1.shape)
    conv_backward(params, grads, "conv1", da1 * (a1 > 0), cols1, None)
    return loss, grads


def conv_backward(params, grads, name, dout, cols, x_shape):
    """Store the conv's weight and bias gradients; return the input gradient (unless
    x_shape is None: the network input needs none)."""
    cout = CONVS[name][0]
    dout = dout.transpose(0, 2, 3, 1).reshape(-1, cout)
    weight = params[f"{name}.weight"]
    grads[f"{name}.weight"] = (dout.T @ cols).reshape(weight.shape)
    grads[f"{name}.bias"] = dout.sum(axis=0)
    if x_shape is not None:
        return col2im(dout @ weight.reshape(cout, -1), x_shape, CONVS[name][2])


def shift(x, rng):
    """Each image moved by a random -1, 0 or +1 pixels in each direction (zero fill)."""
    n = len(x)
    xp = np.pad(x[:, 0], ((0, 0), (1, 1), (1, 1)))
    rows = rng.integers(0, 3, n)[:, None] + np.arange(8)
    cols = rng.integers(0, 3, n)[:, None] + np.arange(8)
    return xp[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]][:, None]


def predict(params, x):
    return forward(params, x)[0]


def train(split, epochs, seed, log=print):
    """Adam with a cosine-decayed learning rate; returns the trained parameters."""
    rng = np.random.default_rng(seed)
    params = init_params(rng)
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    (x_train, y_train), (x_test, y_test) = split["train"], split["test"]
    steps_per_epoch = -(-len(y_train) // BATCH)
    step, total = 0, epochs * steps_per_epoch
    for epoch in range(1, epochs + 1):
        start, losses = time.perf_counter(), []
        order = rng.permutation(len(y_train))
        for first in range(0, len(order), BATCH):
            batch = order[first:first + BATCH]
            loss, grads = loss_and_grads(params, shift(x_train[batch], rng), y_train[batch])
            losses.append(loss)
            step += 1
            lr = LEARNING_RATE * 0.5 * (1 + np.cos(np.pi * (step - 1) / total))
            for k, g in grads.items():
                m, v = moments[k]
                m += (1 - beta1) * (g - m)
                v += (1 - beta2) * (g * g - v)
                update = m / (1 - beta1 ** step) / (np.sqrt(v / (1 - beta2 ** step)) + eps)
                params[k] -= (lr * update).astype(np.float32)
        log(f"epoch {epoch:2d}/{epochs}  loss {np.mean(losses):.4f}  "
            f"train {accuracy(predict(params, x_train), y_train):.2%}  "
            f"test {accuracy(predict(params, x_test), y_test):.2%}  "
            f"({time.perf_counter() - start:.1f} s)")
    return params


def to_onnx(params):
    """The trained network as an ONNX model: input ``image`` [N,1,8,8] with a dynamic
    batch N; outputs ``probs`` and ``logits`` [N,10]."""
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node
    nodes = []
    x = "image"
    for i, (name, (_, _, stride)) in enumerate(CONVS.items(), start=1):
        nodes.append(node("Conv", [x, f"{name}.weight", f"{name}.bias"], [name], name=name,
                          kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride]))
        x = name
        if name == "conv3":
            nodes.append(node("Add", [x, "relu2"], ["add"], name="add"))
            x = "add"
        nodes.append(node("Relu", [x], [f"relu{i}"], name=f"relu{i}"))
        x = f"relu{i}"
    nodes += [node("Flatten", [x], ["flatten"], name="flatten", axis=1),
              node("Gemm", ["flatten", "fc.weight", "fc.bias"], ["logits"], name="fc",
                   transB=1),
              node("Softmax", ["logits"], ["probs"], name="softmax", axis=1)]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", CLASSES])
               for name in ("probs", "logits")]
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])], outputs,
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="celosia.models.train_digits")
    model.ir_version = IR_VERSION
    model.doc_string = ("Digits CNN (scikit-learn 8x8 digits, pixel values / 16), trained by "
                        "celosia.models.train_digits")
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m celosia.models.train_digits",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=MODEL_PATH,
                        help="where to write the ONNX model (default: the bundled model)")
    parser.add_argument("--epochs", type=int, default=20, help="passes over the train split")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the initial weights, batch order and shifts")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")

    import onnx

    split = load_split()
    print(f"digits: {len(split['train'][1])} train, {len(split['test'][1])} test images; "
          f"{args.epochs} epochs, seed {args.seed}")
    start = time.perf_counter()
    params = train(split, args.epochs, args.seed)
    elapsed = time.perf_counter() - start
    x_test, y_test = split["test"]
    model = to_onnx(params)
    onnx.checker.check_model(model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, args.out)
    print(f"fp32 test accuracy {accuracy(predict(params, x_test), y_test):.2%} "
          f"({elapsed:.1f} s of training); wrote {args.out} "
          f"({args.out.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
