"""Element-wise nodes whose operands numpy broadcasts (attention's mask on the scores, a
position embedding on a batch) as compiled kernels (``["broadcast", shape]`` operands),
bit-exact with numpy on seeded random inputs."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.runtime.cpu import CpuModel


@pytest.mark.parametrize("op,a_shape,b_shape,b_const", [
    ("Add", (2, 12, 7, 7), (2, 1, 1, 7), False),    # BERT's additive mask, batch 2
    ("Add", (3, 197, 24), (1, 197, 24), True),      # ViT's position embedding, batch 3
    ("Mul", (2, 5, 6), (5, 1), True),               # a column per row, a lower rank
    ("Sub", (4, 1, 9), (1, 3, 9), False),           # both broadcast: the output is larger
    ("Div", (2, 3, 33), (33,), False),              # a run-time vector on the last axis
    ("Max", (1, 1), (1, 1), False),                 # one element
    ("PRelu", (2, 8, 5, 5), (8, 1, 1), True),       # a per-channel slope (Conv-TasNet's)
    ("PRelu", (3, 7), (1,), True),                  # one slope
    ("PRelu", (4, 6), (4, 6), False),               # a run-time slope of the same shape
])
def test_broadcast_operands_are_one_kernel(op, a_shape, b_shape, b_const):
    rng = np.random.default_rng(len(a_shape) * 7 + len(b_shape))
    a = rng.normal(size=a_shape).astype(np.float32)
    b = (rng.normal(size=b_shape) + (3 if op == "Div" else 0)).astype(np.float32)
    inputs, feeds, inits = [vi("a", list(a_shape))], {"a": a}, []
    if b_const:
        inits.append(numpy_helper.from_array(b, "b"))
    else:
        inputs.append(vi("b", list(b_shape)))
        feeds["b"] = b
    m = make_model([helper.make_node(op, ["a", "b"], ["y"])], inputs, [vi("y", None)], inits)
    built = CpuModel.build(m, {k: v.shape for k, v in feeds.items()})
    assert [s["kind"] for s in built.program.steps if s["op"] == op] == ["kernel"]
    want = {"Add": np.add, "Mul": np.multiply, "Sub": np.subtract, "Div": np.divide,
            "Max": np.maximum, "PRelu": lambda x, s: np.where(x < 0, x * s, x)}[op](a, b)
    got = built.run(feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
