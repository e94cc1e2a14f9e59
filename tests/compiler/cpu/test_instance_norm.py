"""InstanceNormalization with a scale of ones and a bias of zeros (torch's GroupNorm export)
runs the compiled LayerNorm kernel over rows of N*C, matching onnxruntime; with another
scale or bias it stays the numpy step, matching too."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, onnxruntime_run, vi

from celosia.runtime.cpu import CpuModel


@pytest.mark.parametrize("shape,groups,plain", [((1, 32, 100), 32, True), ((2, 32, 50), 4, True),
                                                ((1, 16, 6, 7), 4, True),
                                                ((2, 8, 5), 8, False)])
def test_group_norm_export(shape, groups, plain):
    rng = np.random.default_rng(groups)
    n, c = shape[:2]
    ones = np.ones(groups, np.float32) if plain else rng.normal(size=groups).astype(np.float32)
    inits = {"grouped": np.array([n, groups, -1], np.int64),
             "back": np.array(shape, np.int64), "s": ones,
             "z": np.zeros(groups, np.float32),
             "g": rng.normal(size=(c,) + (1,) * (len(shape) - 2)).astype(np.float32),
             "b": rng.normal(size=(c,) + (1,) * (len(shape) - 2)).astype(np.float32)}
    c_ = helper.make_node
    nodes = [c_("Reshape", ["x", "grouped"], ["r"]),
             c_("InstanceNormalization", ["r", "s", "z"], ["i"], epsilon=1e-5),
             c_("Reshape", ["i", "back"], ["u"]), c_("Mul", ["u", "g"], ["m"]),
             c_("Add", ["m", "b"], ["y"])]
    model = make_model(nodes, [vi("x", list(shape))], [vi("y", list(shape))],
                       [numpy_helper.from_array(v, k) for k, v in inits.items()])
    x = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
    built = CpuModel.build(model)
    kinds = {s["kind"] for s in built.program.steps if s["op"] == "InstanceNormalization"}
    assert ("kernel" in kinds) == plain and ("numpy" in kinds) != plain, kinds
    want = onnxruntime_run(model, {"x": x})["y"]
    np.testing.assert_allclose(built.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
