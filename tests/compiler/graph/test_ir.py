"""The graph IR: import from ONNX, printer, verifier, and the errors a user can cause."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from celosia.compiler.graph.ir import (DynamicShapeError, Graph, GraphError, InputShapeError, ModelLoadError, Node, TensorType, UnsupportedOperatorError, UnsupportedOpsetError, print_graph, verify_graph)
from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.reference import run_graph
from celosia.errors import CelosiaError
from celosia.models import zoo as models
from onnx_builders import make_model, vi


def conv_model(shape=(1, 3, 8, 8), **attrs):
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    return make_model([node], [vi("x", list(shape))], [vi("y", None)], [w])


# ---- import and printer ----------------------------------------------------------------------


def test_printer_one_line_per_node():
    g = import_onnx(conv_model(strides=[2, 2], pads=[1, 1, 1, 1]))
    assert print_graph(g).splitlines() == [
        "graph g(%x: float32[1,3,8,8]) {",
        "  %w = const float32[4,3,3,3]",
        "  %y = Conv(%x, %w) {kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1], "
        "dilations=[1,1], group=1} : float32[1,4,4,4]",
        "  return %y",
        "}"]


def test_auto_pad_becomes_explicit_pads():
    g = import_onnx(conv_model(shape=(1, 3, 7, 7), strides=[2, 2], auto_pad="SAME_UPPER"))
    (conv,) = g.nodes
    assert conv.attrs["pads"] == [1, 1, 1, 1] and g.types["y"].shape == (1, 4, 4, 4)
    g = import_onnx(conv_model(shape=(1, 3, 6, 6), strides=[2, 2], auto_pad="SAME_LOWER"))
    assert g.nodes[0].attrs["pads"] == [1, 1, 0, 0]


def test_shape_arithmetic_gets_static_types():
    g = import_onnx(models.small_cnn())
    reshape = next(n for n in g.nodes if n.op == "Reshape")
    assert reshape.attrs["shape"] == [1, 256] and reshape.inputs == ("relu9",)
    assert g.types["concat16"] == TensorType("int64", (2,))


def test_opset11_softmax_is_rewritten_to_the_2d_form():
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    g = import_onnx(make_model([node], [vi("x", [2, 3, 4])], [vi("y", None)], opset=11))
    assert [n.op for n in g.nodes] == ["Flatten", "Softmax", "Reshape"]
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    y = run_graph(g, {"x": x})["y"]
    flat = np.exp(x.reshape(2, 12)) / np.exp(x.reshape(2, 12)).sum(1, keepdims=True)
    np.testing.assert_allclose(y, flat.reshape(2, 3, 4), rtol=1e-6)


def test_old_opset_is_upgraded():
    node = helper.make_node("Relu", ["x"], ["y"])
    g = import_onnx(make_model([node], [vi("x", [2])], [vi("y", None)], opset=9))
    assert [n.op for n in g.nodes] == ["Relu"]


def test_input_shapes_resolve_dynamic_dims():
    m = conv_model(shape=("N", 3, "H", "W"))
    g = import_onnx(m, {"x": (2, 3, 10, 10)})
    assert g.types["y"].shape == (2, 4, 8, 8)


# ---- errors: what, where, what to do ---------------------------------------------------------


def test_truncated_file(tmp_path):
    path = tmp_path / "resnet.onnx"
    data = models.resnet18(image_size=32).SerializeToString()
    path.write_bytes(data[:len(data) // 3])
    with pytest.raises(ModelLoadError, match="resnet.onnx.*truncated"):
        import_onnx(path)


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        import_onnx(tmp_path / "absent.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\xff\x00not a model" * 10)
    with pytest.raises(ModelLoadError, match="junk.onnx"):
        import_onnx(tmp_path / "junk.onnx")


def test_unsupported_operators_listed_in_one_message():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("StringNormalizer", ["a"], ["b"], name="norm"),
             helper.make_node("TfIdfVectorizer", ["b"], ["c"], name="tfidf"),
             helper.make_node("Foo", ["c"], ["y"], name="custom", domain="com.example")]
    m = make_model(nodes, [vi("x", [1, 4])], [vi("y", None)])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOperatorError) as e:
        import_onnx(m)
    assert [n[:2] for n in e.value.nodes] == [("norm", "StringNormalizer"),
                                             ("tfidf", "TfIdfVectorizer"), ("custom", "Foo")]
    assert "3 unsupported nodes: StringNormalizer: 1 node ('norm'); TfIdfVectorizer: 1 " \
           "node ('tfidf'); " \
           "Foo (domain com.example): 1 node ('custom')" in str(e.value)
    assert "re-export the model without these operators" in str(e.value)


def test_unsupported_operators_grouped_by_operator():
    nodes = [helper.make_node("Relu", ["x"], ["a0"], name="ok")]
    nodes += [helper.make_node("StringNormalizer", [f"a{k}"], [f"a{k + 1}"], name=f"norm{k}")
              for k in range(49)]
    m = make_model(nodes, [vi("x", [1, 4])], [vi("a49", None)])
    with pytest.raises(UnsupportedOperatorError) as e:
        import_onnx(m)
    text = str(e.value)
    assert ("49 unsupported nodes: StringNormalizer: 49 nodes ('norm0', 'norm1', 'norm2' and "
            "46 more)") in text
    assert "norm3" not in text and len(e.value.nodes) == 49


def test_unsupported_opset():
    node = helper.make_node("Relu", ["x"], ["y"])
    m = make_model([node], [vi("x", [2])], [vi("y", None)], opset=99)
    with pytest.raises(UnsupportedOpsetError, match="opset 99.*re-export"):
        import_onnx(m)


def test_dynamic_shape_asks_for_input_shape():
    with pytest.raises(DynamicShapeError,
                       match=r"'x' is \[N,3,\?,\?\].*--input-shape x=1,3,32,32") as e:
        import_onnx(conv_model(shape=("N", 3, None, None)))
    assert import_onnx(conv_model(shape=("N", 3, None, None)), e.value.suggested)


def test_wrong_input_shape_at_import_and_at_run_time():
    with pytest.raises(InputShapeError,
                       match=r"'x' has 4 dims in the model \(\[1,3,8,8\]\); the given shape "
                             r"\[1,3,9\] has 3: the model takes only --input-shape x=1,3,8,8"):
        import_onnx(conv_model(), {"x": (1, 3, 9)})
    with pytest.raises(InputShapeError, match="no input named"):
        import_onnx(conv_model(), {"image": (1, 3, 8, 8)})
    g = import_onnx(conv_model())
    with pytest.raises(InputShapeError, match=r"float32\[1,3,9,9\] but the graph was built for "
                                              r"float32\[1,3,8,8\]"):
        run_graph(g, {"x": np.zeros((1, 3, 9, 9), np.float32)})
    with pytest.raises(InputShapeError, match="was not given"):
        run_graph(g, {})


def test_invalid_node_names_the_node():
    w = numpy_helper.from_array(np.ones((4, 5, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")
    m = make_model([node], [vi("x", [1, 3, 8, 8])], [vi("y", None)], [w])
    with pytest.raises(GraphError, match="node 'conv1' \\(Conv\\): input has 3 channels"):
        import_onnx(m)


def test_run_time_shape_input_keeps_the_onnx_form():
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="r")
    m = make_model([node], [vi("x", [2, 3]), vi("s", [2], TensorProto.INT64)], [vi("y", None)])
    g = import_onnx(m)
    (r,) = g.nodes
    assert r.inputs == ("x", "s") and r.attrs["runtime_shape"] == 1
    assert str(g.types["y"]) == "float32[?,?]"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_graph(g, {"x": x, "s": np.array([3, -1])})["y"],
                                  x.reshape(3, 2))
    g = import_onnx(m, bind_inputs={"s": np.array([3, 2])})
    assert g.types["y"].shape == (3, 2)


def test_errors_are_celosia_errors():
    for cls in (ModelLoadError, UnsupportedOpsetError, DynamicShapeError, InputShapeError):
        assert issubclass(cls, CelosiaError)


# ---- verifier --------------------------------------------------------------------------------


def _graph(nodes, types=None):
    t = TensorType("float32", (2,))
    types = types or {"x": t, "a": t, "y": t}
    return Graph("g", ("x",), ("y",), tuple(nodes), {}, types)


def test_verifier_accepts_and_rejects():
    verify_graph(_graph([Node("Relu", ("x",), ("a",), {}, "n0"),
                         Node("Relu", ("a",), ("y",), {}, "n1")]))
    with pytest.raises(GraphError, match="reads 'a' before it is defined"):
        verify_graph(_graph([Node("Relu", ("a",), ("y",), {}, "n1"),
                             Node("Relu", ("x",), ("a",), {}, "n0")]))
    with pytest.raises(GraphError, match="redefines 'a'"):
        verify_graph(_graph([Node("Relu", ("x",), ("a",), {}, "n0"),
                             Node("Relu", ("x",), ("a",), {}, "n1"),
                             Node("Relu", ("a",), ("y",), {}, "n2")]))
    with pytest.raises(GraphError, match="output 'y' is never defined"):
        verify_graph(_graph([Node("Relu", ("x",), ("a",), {}, "n0")]))


def test_run_time_failure_names_the_node():
    node = helper.make_node("Gather", ["x", "i"], ["y"], name="lookup")
    g = import_onnx(make_model([node], [vi("x", [3]), vi("i", [1], TensorProto.INT64)],
                               [vi("y", None)]))
    with pytest.raises(GraphError, match="node 'lookup' \\(Gather\\): failed at run time"):
        run_graph(g, {"x": np.zeros(3, np.float32), "i": np.array([7])})
