"""compiler/graph/macs.py: the model's own multiply-adds per node, and the two figures on
them (utilisation, padding overhead), against hand counts."""

import pytest

from celosia.compiler.graph.ir import Node, TensorType
from celosia.compiler.graph.macs import node_macs, padding_overhead, utilization


def _types(**shapes):
    return {k: TensorType("float32", v) for k, v in shapes.items()}


def test_convolutions_count_the_models_own_channels():
    # ResNet-18's stem: 3 -> 64, 7x7, stride 2, 224 -> 112: 118 M multiply-adds
    t = _types(x=(1, 3, 224, 224), w=(64, 3, 7, 7), y=(1, 64, 112, 112))
    assert node_macs(Node("Conv", ("x", "w"), ("y",), {}, "stem"), t) == \
        112 * 112 * 64 * 3 * 7 * 7 == 118_013_952
    # grouped: Cin / groups per output; a batch of 2; 1-D
    t = _types(x=(2, 32, 10, 10), w=(64, 8, 3, 3), y=(2, 64, 10, 10))
    assert node_macs(Node("QConv", ("x", "w"), ("y",), {"group": 4}, "g"), t) == \
        2 * 10 * 10 * 64 * 8 * 9
    t = _types(x=(1, 4, 50), w=(6, 4, 5), y=(1, 6, 46))
    assert node_macs(Node("Conv", ("x", "w"), ("y",), {}, "c1d"), t) == 46 * 6 * 4 * 5


def test_products_count_batch_rows_and_reduction():
    t = _types(a=(2, 3, 10, 8), b=(2, 3, 8, 12), y=(2, 3, 10, 12))
    assert node_macs(Node("MatMul", ("a", "b"), ("y",), {}, "mm"), t) == 2 * 3 * 10 * 12 * 8
    t = _types(a=(5, 7), w=(7, 9), y=(5, 9))
    assert node_macs(Node("QGemm", ("a", "w"), ("y",), {}, "fc"), t) == 5 * 9 * 7
    t = _types(a=(7, 5), w=(7, 9), y=(5, 9))  # transA: K is the first axis of A
    assert node_macs(Node("Gemm", ("a", "w"), ("y",), {"transA": 1}, "fc"), t) == 5 * 9 * 7


def test_nodes_without_multiply_adds_count_none():
    t = _types(x=(1, 16, 8, 8), y=(1, 16, 4, 4))
    assert node_macs(Node("MaxPool", ("x",), ("y",), {}, "p"), t) == 0
    assert node_macs(Node("QAdd", ("x", "x"), ("y",), {}, "a"), t) == 0


def test_the_figures():
    # 3 input channels padded to 16: the GEMM core does 16/3 of the real work
    real = 112 * 112 * 64 * 3 * 49
    assert padding_overhead(real * 16 // 3, real) == pytest.approx(13 / 3)
    assert padding_overhead(1000, 1000) == 0.0
    assert padding_overhead(0, 0) is None  # no real work: no ratio
    assert utilization(256 * 50, 100, 256) == 0.5
    assert utilization(10, None, 256) is None and utilization(10, 0, 256) is None
