"""Einsum that is a matrix product (compiler/frontend/einsum.py): imported as Transpose ->
MatMul -> Transpose, the CPU build agrees with onnxruntime on every equation (products and
the ones left an Einsum), and an attention block written with einsum quantizes to QGemm and
QMatMul layers that run on the accelerator bit-exact with the all-CPU int8 build."""

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model, onnxruntime_run, vi

from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel
from celosia.runtime.cpu import CpuModel

# (equation, a shape, b shape, ops after import)
CASES = [("btd,de->bte", (2, 5, 8), (8, 6), ["MatMul"]),
         ("bhqd,bhkd->bhqk", (2, 3, 5, 4), (2, 3, 7, 4), ["Transpose", "MatMul"]),
         ("bhqk,bhkd->bhqd", (2, 3, 5, 7), (2, 3, 7, 4), ["MatMul"]),
         ("bqhd,bkhd->bhqk", (2, 5, 3, 4), (2, 7, 3, 4), ["Transpose", "Transpose", "MatMul"]),
         ("ij,kj->ik", (3, 4), (5, 4), ["Transpose", "MatMul"]),
         ("abc,cd->dab", (2, 3, 4), (4, 5), ["MatMul", "Transpose"]),
         ("bnd,nde->bne", (2, 3, 4), (3, 4, 5), ["Transpose", "MatMul", "Transpose"]),
         (" b i d , b j d -> b i j ", (1, 6, 8), (1, 6, 8), ["Transpose", "MatMul"]),
         # not a product of this form: left an Einsum (numpy's)
         ("bi,bj->bij", (2, 3), (2, 4), ["Einsum"]),
         ("ii,ij->j", (3, 3), (3, 3), ["Einsum"]),
         ("bij,bjk->bi", (2, 3, 4), (2, 4, 5), ["Einsum"]),
         ("...d,de->...e", (2, 3, 4), (4, 5), ["Einsum"])]


@pytest.mark.parametrize("case", CASES, ids=[c[0].replace(" ", "") for c in CASES])
def test_einsum_products_import_as_matmul(case):
    eq, sa, sb, ops = case
    m = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=eq)],
                   [vi("a", list(sa)), vi("b", list(sb))], [vi("y", None)])
    assert [n.op for n in import_onnx(m).nodes] == ops
    rng = np.random.default_rng(0)
    feeds = {"a": rng.normal(size=sa).astype(np.float32),
             "b": rng.normal(size=sb).astype(np.float32)}
    want = onnxruntime_run(m, feeds)["y"]
    got = CpuModel.build(m).run(feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _einsum_attention(seq=8, dim=32, heads=2, seed=0):
    """Projections and both attention products written with einsum, as research code
    exports them."""
    c = helper.make_node
    rng = np.random.default_rng(seed)
    hd = dim // heads
    w = {n: (rng.normal(size=(dim, heads, hd)) / np.sqrt(dim)).astype(np.float32)
         for n in ("wq", "wk", "wv")}
    w["wo"] = (rng.normal(size=(heads, hd, dim)) / np.sqrt(dim)).astype(np.float32)
    w["wo"] = w["wo"].reshape(dim, dim)
    w["scale"] = np.array(hd ** -0.5, np.float32)
    nodes = [c("Einsum", ["x", "wq"], ["q"], equation="btd,dhe->bthe"),  # stays Einsum
             c("MatMul", ["x", "wk2"], ["k0"]),
             c("Reshape", ["k0", "split"], ["k"]),
             c("MatMul", ["x", "wv2"], ["v0"]),
             c("Reshape", ["v0", "split"], ["v"]),
             c("Einsum", ["q", "k"], ["s0"], equation="bqhd,bkhd->bhqk"),
             c("Mul", ["s0", "scale"], ["s"]),
             c("Softmax", ["s"], ["p"], axis=-1),
             c("Einsum", ["p", "v"], ["o"], equation="bhqk,bkhd->bqhd"),
             c("Reshape", ["o", "merge"], ["o2"]),
             c("Einsum", ["o2", "wo"], ["y"], equation="btd,de->bte")]
    inits = {"wq": w["wq"], "wk2": w["wk"].reshape(dim, dim), "wv2": w["wv"].reshape(dim, dim),
             "wo": w["wo"], "scale": w["scale"],
             "split": np.array([1, seq, heads, hd], np.int64),
             "merge": np.array([1, seq, dim], np.int64)}
    model = make_model(nodes, [vi("x", [1, seq, dim])], [vi("y", [1, seq, dim])],
                       [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return model, lambda s: {"x": np.random.default_rng(s).normal(
        size=(1, seq, dim)).astype(np.float32)}


def test_einsum_attention_is_integer_and_on_the_accelerator():
    model, feeds = _einsum_attention()
    q = quantize_model(model, [feeds(s) for s in range(1, 5)])
    ops = [n.op for n in q.nodes]
    # the output projection a QGemm, both attention products QMatMuls; "btd,dhe->bthe"
    # (two free indices of the weight) stays a float Einsum, with that reason
    assert ops.count("QMatMul") == 2 and ops.count("QGemm") == 3 and "MatMul" not in ops, ops
    einsum = [n for n in q.nodes if n.op == "Einsum"]
    assert len(einsum) == 1 and "Einsum" in einsum[0].attrs["float_reason"]
    built = AccelModel.build(q)
    layers = [n.name for n in q.nodes if n.op in ("QMatMul", "QGemm")]
    assert all(built.placements[n].target == "accel" for n in layers), \
        {n: built.placements[n] for n in layers}
    cpu = built.cpu_build()
    for s in (10, 11):
        want = cpu.run(feeds(s))["y"]
        for target in ("fsim", "cycle"):
            np.testing.assert_array_equal(built.run(feeds(s), target=target)["y"], want)
