"""Whole models built with onnx.helper (no torch, no downloads): random weights, real
architectures. Used by the tests and benchmarks that compare celosia's CPU and accelerator
builds with onnxruntime.

- ``small_cnn``: a CNN for the 8x8 digits of scikit-learn (1x1x8x8 -> 10 probabilities).
- ``resnet18``: torchvision's ResNet-18 (11,689,512 parameters at 1000 classes).
- ``resnet50``: torchvision's ResNet-50 (25,557,032 parameters at 1000 classes).
- ``mobilenet_v2``: torchvision's MobileNetV2 (3,504,872 parameters at 1000 classes).

Parameters count as in PyTorch: weights, biases and BatchNorm scale and shift, not the BN
running statistics (buffers). Weights are He-initialised and BN statistics are close to
identity so activations keep an order-one scale through the depth of the network.
"""

from __future__ import annotations

import numpy as np

__all__ = ["small_cnn", "resnet18", "resnet50", "mobilenet_v2", "parameter_count", "OPSET",
           "IR_VERSION"]

OPSET = 17
# onnx 1.23 stamps IR version 14, which onnxruntime 1.31 does not load.
IR_VERSION = 10
_BUFFERS = ("running_mean", "running_var")


class _Net:
    """Accumulates nodes and initializers; each method returns its output's name."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []
        self.count = 0

    def _name(self, prefix):
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, name, array):
        from onnx import numpy_helper
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op, inputs, prefix=None, n_out=1, **attrs):
        from onnx import helper
        base = self._name(prefix or op.lower())
        outs = [base] if n_out == 1 else [f"{base}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=base, **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(self, x, cin, cout, k, stride=1, pad=0, groups=1, bias=False):
        name = self._name("conv")
        fan_in = cin // groups * k * k
        w = self.rng.normal(0, np.sqrt(2.0 / fan_in), (cout, cin // groups, k, k))
        inputs = [x, self.const(f"{name}.weight", w.astype(np.float32))]
        if bias:
            inputs.append(self.const(f"{name}.bias",
                                     self.rng.normal(0, 0.1, cout).astype(np.float32)))
        return self.node("Conv", inputs, "conv", kernel_shape=[k, k], strides=[stride] * 2,
                         pads=[pad] * 4, group=groups)

    def bn(self, x, c, gamma=(0.7, 1.2)):
        name = self._name("bn")
        r = self.rng
        params = {"weight": r.uniform(*gamma, c), "bias": r.normal(0, 0.1, c),
                  "running_mean": r.normal(0, 0.1, c), "running_var": r.uniform(0.8, 1.5, c)}
        inputs = [x] + [self.const(f"{name}.{k}", v.astype(np.float32))
                        for k, v in params.items()]
        return self.node("BatchNormalization", inputs, "bn", epsilon=1e-5)

    def relu6(self, x):
        lo = self.const(self._name("zero"), np.array(0, np.float32))
        hi = self.const(self._name("six"), np.array(6, np.float32))
        return self.node("Clip", [x, lo, hi], "relu6")

    def linear(self, x, cin, cout):
        name = self._name("fc")
        w = self.rng.normal(0, np.sqrt(1.0 / cin), (cout, cin)).astype(np.float32)
        b = self.rng.normal(0, 0.01, cout).astype(np.float32)
        return self.node("Gemm", [x, self.const(f"{name}.weight", w),
                                  self.const(f"{name}.bias", b)], "fc", transB=1)

    def flatten_like_torch(self, x):
        """x.view(x.size(0), -1) as torch exports it: Shape -> Gather -> Unsqueeze ->
        Concat -> Reshape (constant folding removes the arithmetic)."""
        shape = self.node("Shape", [x])
        n = self.node("Gather", [shape, self.const(self._name("zero_i"), np.array(0))], axis=0)
        n1 = self.node("Unsqueeze", [n, self.const(self._name("axes"), np.array([0]))])
        target = self.node("Concat", [n1, self.const(self._name("minus1"), np.array([-1]))],
                           axis=0)
        return self.node("Reshape", [x, target])

    def model(self, name, x, shape, y, out_shape):
        from onnx import TensorProto, helper
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, out_shape)], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="celosia.models.zoo")
        m.ir_version = IR_VERSION
        return m


def parameter_count(model) -> int:
    """Trainable parameters, as PyTorch counts them (BN running statistics excluded)."""
    from onnx import numpy_helper
    return sum(int(np.prod(numpy_helper.to_array(t).shape)) for t in model.graph.initializer
               if not t.name.endswith(_BUFFERS) and "." in t.name)


def small_cnn(batch: int = 1, seed: int = 0):
    """8x8 digits: conv3x3(8)+BN+ReLU, maxpool 2, conv3x3(16)+ReLU, flatten, dense(10),
    softmax."""
    net = _Net(seed)
    x = "image"
    h = net.node("Relu", [net.bn(net.conv(x, 1, 8, 3, pad=1), 8)])
    h = net.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = net.node("Relu", [net.conv(h, 8, 16, 3, pad=1, bias=True)])
    h = net.flatten_like_torch(h)
    y = net.node("Softmax", [net.linear(h, 16 * 4 * 4, 10)], axis=1)
    return net.model("small_cnn", x, [batch, 1, 8, 8], y, [batch, 10])


def resnet18(batch: int = 1, image_size: int = 224, num_classes: int = 1000, seed: int = 0):
    """torchvision's resnet18 (BasicBlock x [2, 2, 2, 2]); any image size >= 32."""
    net = _Net(seed)
    x = "image"
    h = net.node("Relu", [net.bn(net.conv(x, 3, 64, 7, 2, 3), 64)])
    h = net.node("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = net.node("Relu", [net.bn(net.conv(h, cin, cout, 3, stride, 1), cout)])
            y = net.bn(net.conv(y, cout, cout, 3, 1, 1), cout)
            shortcut = h
            if stride != 1 or cin != cout:
                shortcut = net.bn(net.conv(h, cin, cout, 1, stride), cout)
            h = net.node("Relu", [net.node("Add", [y, shortcut])])
            cin = cout
    h = net.node("Flatten", [net.node("GlobalAveragePool", [h])], axis=1)
    y = net.linear(h, 512, num_classes)
    return net.model("resnet18", x, [batch, 3, image_size, image_size], y,
                     [batch, num_classes])


def resnet50(batch: int = 1, image_size: int = 224, num_classes: int = 1000, seed: int = 0):
    """torchvision's resnet50 (Bottleneck x [3, 4, 6, 3], expansion 4, the stride on the
    3x3 convolution as in torchvision's "v1.5"); any image size >= 32. The last BN of each
    block starts small (gamma ~ 0.2, like a zero-init residual's early training) so the
    residual sum keeps an order-one scale over 16 blocks."""
    net = _Net(seed)
    x = "image"
    h = net.node("Relu", [net.bn(net.conv(x, 3, 64, 7, 2, 3), 64)])
    h = net.node("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        cout = width * 4
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = net.node("Relu", [net.bn(net.conv(h, cin, width, 1), width)])
            y = net.node("Relu", [net.bn(net.conv(y, width, width, 3, stride, 1), width)])
            y = net.bn(net.conv(y, width, cout, 1), cout, gamma=(0.1, 0.3))
            shortcut = h
            if stride != 1 or cin != cout:
                shortcut = net.bn(net.conv(h, cin, cout, 1, stride), cout)
            h = net.node("Relu", [net.node("Add", [y, shortcut])])
            cin = cout
    h = net.node("Flatten", [net.node("GlobalAveragePool", [h])], axis=1)
    y = net.linear(h, cin, num_classes)
    return net.model("resnet50", x, [batch, 3, image_size, image_size], y,
                     [batch, num_classes])


def mobilenet_v2(batch: int = 1, image_size: int = 224, num_classes: int = 1000,
                 seed: int = 0):
    """torchvision's mobilenet_v2 (width 1.0): inverted residuals with depthwise convs and
    ReLU6 (Clip); any image size >= 32."""
    net = _Net(seed)
    x = "image"
    h = net.relu6(net.bn(net.conv(x, 3, 32, 3, 2, 1), 32))
    cin = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for k in range(n):
            stride = s if k == 0 else 1
            hidden = cin * t
            y = h
            if t != 1:
                y = net.relu6(net.bn(net.conv(y, cin, hidden, 1), hidden))
            y = net.relu6(net.bn(net.conv(y, hidden, hidden, 3, stride, 1, groups=hidden),
                                 hidden))
            y = net.bn(net.conv(y, hidden, c, 1), c)
            h = net.node("Add", [h, y]) if stride == 1 and cin == c else y
            cin = c
    h = net.relu6(net.bn(net.conv(h, cin, 1280, 1), 1280))
    h = net.node("Flatten", [net.node("GlobalAveragePool", [h])], axis=1)
    y = net.linear(h, 1280, num_classes)
    return net.model("mobilenet_v2", x, [batch, 3, image_size, image_size], y,
                     [batch, num_classes])
