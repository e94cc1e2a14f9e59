"""A MatMul of a run-time value by batched constant matrices (rank >= 3: DeBERTa's
relative-position keys once constant-folded, per-head weights): a QMatMul whose second
operand is quantized at build time (one symmetric scale), close to float and bit-exact on
the accelerator (fsim, cycle model) with the all-CPU int8 build. Before, it stayed float:
"its weight has 3 axes"."""

import numpy as np
from onnx import helper, numpy_helper
from onnx_builders import make_model, vi

from celosia.compiler.graph.reference import run_graph
from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel


def test_batched_constant_matrices_are_a_qmatmul(tmp_path):
    rng = np.random.default_rng(0)
    heads, seq, dim, n = 4, 8, 16, 12
    c = helper.make_node
    inits = {"w": (rng.normal(size=(heads * dim, heads * dim)) / 8).astype(np.float32),
             "shape": np.array([seq, heads, dim], np.int64),
             "keys": rng.normal(size=(heads, dim, n)).astype(np.float32)}
    nodes = [c("MatMul", ["x", "w"], ["p"]), c("Reshape", ["p", "shape"], ["r"]),
             c("Transpose", ["r"], ["q"], perm=[1, 0, 2]),
             c("MatMul", ["q", "keys"], ["y"], name="position_scores")]
    model = make_model(nodes, [vi("x", [seq, heads * dim])], [vi("y", [heads, seq, n])],
                       [numpy_helper.from_array(v, k) for k, v in inits.items()])

    def feeds(s):
        return {"x": np.random.default_rng(s).normal(size=(seq, heads * dim)).astype(np.float32)}

    q = quantize_model(model, [feeds(s) for s in range(1, 6)])
    mm = [n for n in q.nodes if n.op == "QMatMul"]
    assert len(mm) == 1 and mm[0].inputs[1] in q.initializers
    assert q.initializers[mm[0].inputs[1]].dtype == np.int8
    assert not any(n.op == "MatMul" for n in q.nodes)
    want = run_graph(import_onnx(model), feeds(10))["y"]
    built = AccelModel.build(q)
    assert built.placements[mm[0].name].target == "accel", built.placements[mm[0].name]
    got = built.cpu_build().run(feeds(10))["y"]
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.999, cos
    for target in ("fsim", "cycle"):
        np.testing.assert_array_equal(built.run(feeds(10), target=target)["y"], got)
    built.save(tmp_path / "m.cel")  # the artifact round trip
    loaded = AccelModel.load(tmp_path / "m.cel")
    np.testing.assert_array_equal(loaded.run(feeds(10), target="cycle")["y"], got)
