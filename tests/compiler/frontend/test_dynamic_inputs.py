"""Inputs as models declare them: dims of -1, 0, a name or no value are dynamic and take the
size given; a fixed dim must match; every shape a message proposes is one that imports (each
test follows the hint it prints)."""

import ast
import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from celosia.compiler.frontend.inputs import FILL_SIZES
from celosia.compiler.frontend.onnx import declared_inputs, import_onnx
from celosia.compiler.graph.ir import DynamicShapeError, InputShapeError
from celosia.compiler.graph.reference import run_graph
from onnx_builders import make_model, vi


def conv_model(shape, pads=(1, 1, 1, 1)):
    """Conv 3x3 (3 -> 4 channels) then Relu; ``shape`` as the model declares its input."""
    w = numpy_helper.from_array(
        np.random.default_rng(1).normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=list(pads)),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return make_model(nodes, [vi("x", list(shape))], [vi("y", None)], [w])


def hinted(message: str) -> dict:
    """The shapes a message proposes, read from its Python form; the command-line form
    must say the same."""
    shapes = ast.literal_eval(re.search(r"input_shapes=(\{.*?\})\)", message).group(1))
    flags = dict(f.split("=") for f in re.findall(r"--input-shape (\S+)", message))
    assert {n: ",".join(map(str, s)) for n, s in shapes.items()} == flags, message
    return shapes


def check_against_onnxruntime(model, shapes, seed=0, reference=None):
    """Import with ``shapes``, run on random inputs, compare with onnxruntime running
    ``reference`` (the model itself unless given)."""
    graph = import_onnx(model, shapes)
    rng = np.random.default_rng(seed)
    feeds = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    ours = run_graph(graph, feeds)
    ref = reference or model
    theirs = ort.InferenceSession(ref.SerializeToString()).run(None, feeds)
    for a, b in zip(ours.values(), theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return graph


# ---- dynamic batch dims of every kind --------------------------------------------------------


@pytest.mark.parametrize("batch", [-1, 0, "N", None], ids=["minus1", "zero", "param", "unnamed"])
def test_a_dynamic_batch_takes_the_given_size(batch):
    m = conv_model([batch, 3, 8, 8])
    declared = declared_inputs(m)["x"]
    assert declared[0] == "float32" and declared[1][1:] == [3, 8, 8]
    assert isinstance(declared[1][0], str)  # dynamic: "-1", "0", "N" or "?"
    # onnxruntime takes a dim_value of 0 literally: its reference names the dim instead.
    reference = conv_model(["N", 3, 8, 8]) if batch == 0 else None
    for n in (1, 3):
        g = check_against_onnxruntime(m, {"x": (n, 3, 8, 8)}, reference=reference)
        assert g.types["x"].shape == (n, 3, 8, 8) and g.types["y"].shape == (n, 4, 8, 8)
    with pytest.raises(DynamicShapeError, match=r"'x' is \[.*,3,8,8\]") as e:
        import_onnx(m)
    assert hinted(str(e.value)) == {"x": (1, 3, 8, 8)} == e.value.suggested
    assert "`celosia run` and CpuModel.open take the sizes from the arrays" in str(e.value)


def test_paddle_style_input_takes_the_given_shape():
    m = conv_model([-1, 3, -1, -1])
    check_against_onnxruntime(m, {"x": (1, 3, 48, 192)})  # refused before: [-1,3,?,?]
    with pytest.raises(DynamicShapeError, match=r"'x' is \[-1,3,-1,-1\]") as e:
        import_onnx(m)
    check_against_onnxruntime(m, hinted(str(e.value)))


def test_a_contradicted_fixed_dim_names_the_dim_and_what_the_model_declares():
    m = conv_model([-1, 3, -1, -1])
    with pytest.raises(InputShapeError) as e:
        import_onnx(m, {"x": (2, 4, 48, 192)})
    text = str(e.value)
    assert "input 'x' is [-1,3,-1,-1] in the model; the given shape [2,4,48,192] has 4 at " \
           "dim 1 where the model fixes 3" in text
    # The proposal keeps the sizes given for the dynamic dims.
    assert hinted(text) == {"x": (2, 3, 48, 192)}
    check_against_onnxruntime(m, hinted(text))


def test_a_shape_of_another_rank_is_refused_with_a_shape_that_imports():
    m = conv_model(["N", 3, "H", "W"])
    with pytest.raises(InputShapeError, match=r"has 4 dims in the model \(\[N,3,H,W\]\); the "
                                              r"given shape \[3,8,8\] has 3") as e:
        import_onnx(m, {"x": (3, 8, 8)})
    check_against_onnxruntime(m, hinted(str(e.value)))


def test_a_static_model_takes_only_its_own_shape():
    m = conv_model([1, 3, 8, 8])
    with pytest.raises(InputShapeError, match=r"has 9 at dim 2 where the model fixes 8, 9 at "
                                              r"dim 3 where the model fixes 8: the model takes "
                                              r"only --input-shape x=1,3,8,8") as e:
        import_onnx(m, {"x": (1, 3, 9, 9)})
    assert hinted(str(e.value)) == {"x": (1, 3, 8, 8)}
    check_against_onnxruntime(m, hinted(str(e.value)))


def test_proposed_sizes_are_ones_that_import():
    # No padding and two 3x3 convolutions: a 1x1 image does not fit, 32x32 does.
    w = numpy_helper.from_array(np.ones((3, 3, 3, 3), np.float32) / 27, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="c1"),
             helper.make_node("Conv", ["a", "w"], ["y"], name="c2")]
    m = make_model(nodes, [vi("x", ["N", 3, "H", "W"])], [vi("y", None)], [w])
    with pytest.raises(DynamicShapeError) as e:
        import_onnx(m)
    shapes = hinted(str(e.value))
    assert shapes["x"][0] == 1 and min(shapes["x"][2:]) >= 5
    check_against_onnxruntime(m, shapes)


def test_named_dims_shared_by_inputs_get_one_size():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    m = make_model(nodes, [vi("a", ["batch", "seq"]), vi("b", ["batch", "seq"])],
                   [vi("y", None)])
    with pytest.raises(DynamicShapeError, match="inputs have dynamic dims") as e:
        import_onnx(m)
    shapes = hinted(str(e.value))
    assert shapes["a"] == shapes["b"]
    check_against_onnxruntime(m, shapes)


def test_no_false_hint_when_no_size_tried_imports():
    # The model reshapes its input to a fixed [1,7,7]: only L = 49 imports, which no
    # proposal tries; the message says so instead of proposing a shape that fails.
    assert 49 not in FILL_SIZES
    shape = numpy_helper.from_array(np.array([1, 7, 7], np.int64), "s")
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="r")]
    m = make_model(nodes, [vi("x", [1, "L"])], [vi("y", None)], [shape])
    with pytest.raises(DynamicShapeError) as e:
        import_onnx(m)
    text = str(e.value)
    assert "none of the sizes celosia tried imports" in text and "cannot reshape" in text
    assert "input_shapes={'" not in text and "--input-shape x=" not in text
    assert e.value.suggested is None
    assert import_onnx(m, {"x": (1, 49)}).types["y"].shape == (1, 7, 7)


def test_unknown_input_names_are_listed():
    with pytest.raises(InputShapeError, match=r"no input named \['image'\]; the model's "
                                              r"inputs are \['x'\]"):
        import_onnx(conv_model([-1, 3, 8, 8]), {"image": (1, 3, 8, 8)})
