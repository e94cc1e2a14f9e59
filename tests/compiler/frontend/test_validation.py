"""The frontend's validation (issue #18): the operator table (specs.py), onnx's checker and
strict inference (validate.py), tensor reading (tensors.py) and size limits, each error one
line naming the file, the node and what to do."""

import re

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from celosia.compiler.frontend.onnx import MIN_OPSET, SUPPORTED_OPS, import_onnx
from celosia.compiler.frontend.specs import SPECS, check_ranks, check_value, read_node
from celosia.compiler.frontend.tensors import TensorTooLargeError, read_tensor
from celosia.compiler.graph.ir import GraphError, ModelLoadError, Node, NodeError
from celosia.compiler.graph.reference import run_graph
from celosia.limits import ResourceLimitError


def model(nodes, inputs, outputs=("y",), inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


W = init("w", np.ones((4, 3, 3, 3), np.float32))


def conv(**attrs):
    return model([helper.make_node("Conv", ["x", "w"], ["y"], name="c", **attrs)],
                 [vi("x", [1, 3, 8, 8])], inits=[W])


def with_attr(m, name, value, **kw):
    node = m.graph.node[0]
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value, **kw))
    return m


def error(m, shapes=None, cls=GraphError) -> str:
    with pytest.raises(cls) as e:
        import_onnx(m.SerializeToString() if isinstance(m, onnx.ModelProto) else m, shapes)
    text = str(e.value)
    assert "\n" not in text and text.startswith("<bytes>: "), text
    return text


# ---- the table -------------------------------------------------------------------------------


def test_every_supported_operator_has_a_spec_with_every_schema_attribute():
    assert set(SPECS) == set(SUPPORTED_OPS)
    for op in SUPPORTED_OPS:
        for version in range(MIN_OPSET, onnx.defs.onnx_opset_version() + 1):
            try:
                schema = onnx.defs.get_schema(op, version)
            except onnx.defs.SchemaError:  # not yet an operator at that opset (CastLike)
                continue
            missing = set(schema.attributes) - set(SPECS[op].attrs)
            assert not missing, f"{op} (opset {version}) attributes {missing} not in SPECS"


def test_every_spec_takes_the_inputs_and_outputs_of_every_schema():
    """The table's arity covers each version's (a superset over opsets), except
    BatchNormalization's training outputs of opsets 9 to 13 (celosia takes inference
    models)."""
    for op in SUPPORTED_OPS:
        for kind, names in (("input", SPECS[op].inputs), ("output", SPECS[op].outputs)):
            parts = names.split()
            variadic = bool(parts) and parts[-1].rstrip("?").endswith("...")
            fixed = parts[:-1] if variadic else parts
            least = (len(fixed) + 1 if variadic and not parts[-1].endswith("?") else
                     max((k + 1 for k, p in enumerate(fixed) if not p.endswith("?")),
                         default=0))
            most = None if variadic else len(parts)
            for version in range(MIN_OPSET if op != "Upsample" else 7,
                                 onnx.defs.onnx_opset_version() + 1):
                try:
                    schema = onnx.defs.get_schema(op, version)
                except onnx.defs.SchemaError:
                    continue
                lo, hi = ((schema.min_input, schema.max_input) if kind == "input"
                          else (schema.min_output, schema.max_output))
                if (op, kind) == ("BatchNormalization", "output") and version < 14:
                    hi = 3
                assert least <= lo and (most is None or most >= hi), (op, version, kind)


def test_issue_12_operators_attribute_rules():
    """Ranges, choices and cross-attribute rules of the operators of issue #12, by the
    table alone (read_node, check_ranks)."""
    def read(op, inputs=("x",), outputs=("y",), **attrs):
        return read_node(helper.make_node(op, list(inputs), list(outputs), name="n",
                                          **attrs), "n", "<m>")
    bad = [
        (("Resize", ("x", "", "s")), {"mode": "bicubic"}, "'mode' = 'bicubic' is not one of"),
        (("Resize", ("x", "", "s")), {"coordinate_transformation_mode": "half"}, "not one of"),
        (("Resize", ("x", "", "s")), {"antialias": 2}, "'antialias' = 2 is not one of 0, 1"),
        (("Gelu",), {"approximate": "erf"}, "'approximate' = 'erf' is not one of 'none'"),
        (("LpNormalization",), {"p": 3}, "'p' = 3 is not one of 1, 2"),
        (("LayerNormalization", ("x", "s")), {"stash_type": 7},
         "'stash_type' = 7 is not one of 1, 10, 11"),
        (("GroupNormalization", ("x", "s", "b")), {"num_groups": 0}, "at least 1"),
        (("GroupNormalization", ("x", "s", "b")), {}, "'num_groups' is required"),
        (("DepthToSpace",), {"blocksize": 2, "mode": "RCD"}, "not one of 'DCR', 'CRD'"),
        (("SpaceToDepth",), {}, "'blocksize' is required"),
        (("ScatterND", ("x", "i", "u")), {"reduction": "sum"}, "not one of 'none', 'add'"),
        (("GatherND", ("x", "i")), {"batch_dims": -1}, "'batch_dims' = -1: every value"),
        (("BitShift", ("x", "y")), {}, "'direction' is required"),
        (("Mod", ("a", "b")), {"fmod": 2}, "'fmod' = 2 is not one of 0, 1"),
        (("ConvTranspose", ("x", "w")), {"strides": [1, 0]}, "'strides' = [1, 0]: every"),
        (("ConvTranspose", ("x", "w")), {"output_shape": [0, 3]}, "at least 1"),
        (("TopK", ("x", "k"), ("v",)), {}, "has 1 output but TopK takes 2 (values, indices)"),
        (("Einsum", ("a", "b")), {}, "'equation' is required"),
        (("Upsample",), {"mode": "cubic"}, "not one of 'nearest', 'linear', 'bilinear'"),
    ]
    for args, attrs, message in bad:
        with pytest.raises(NodeError, match=re.escape(message)):
            read(*args, **attrs)
    # Lengths, axes and bounds need the input's rank.
    for op, inputs, attrs, rank, message in [
        ("ConvTranspose", ("x", "w"), {"output_padding": [1, 0], "strides": [1, 2]}, 4,
         "'output_padding' = [1, 0]: value 1 at 0 must be less than 1, the largest of "
         "strides = [1, 2] and dilations = absent (1) there"),
        ("ConvTranspose", ("x", "w"), {"output_padding": [0]}, 4,
         "'output_padding' has 1 values but the input has rank 4, which needs 2"),
        ("ConvTranspose", ("x", "w"), {"output_shape": [1, 1, 6, 6]}, 4,
         "'output_shape' has 4 values"),
        ("Resize", ("x", "", "s"), {"axes": [1, -2]}, 3, "names an axis twice"),
        ("ArgMax", ("x",), {"axis": 3}, 3, "axis 3 is out of range for rank 3"),
        ("OneHot", ("i", "d", "v"), {"axis": -3}, 1, "axis -3 is out of range for rank 2"),
        ("LayerNormalization", ("x", "s"), {"axis": -4}, 3, "out of range for rank 3"),
    ]:
        with pytest.raises(NodeError, match=re.escape(message)):
            check_ranks(read(op, inputs, **attrs), rank)
    ok = read("ConvTranspose", ("x", "w"), strides=[2, 1], dilations=[1, 3],
              output_padding=[1, 2])
    check_ranks(ok, 4)  # below the stride on one axis, the dilation on the other
    check_ranks(read("OneHot", ("i", "d", "v"), axis=-2), 1)  # an axis of the output


def test_compile_time_inputs_held_to_the_table():
    """check_value: TopK's k, OneHot's depth, CumSum's axis, Resize's sizes."""
    node = Node("TopK", ("x", "k"), ("v", "i"), {}, "t")
    assert check_value(node, 1, np.array([0]), 2).tolist() == [0]
    for value, message in [(np.array([-1]), r"input 1 \(k\) = -1: every value must be at "
                                            "least 0"),
                           (np.array([1, 2]), r"input 1 \(k\) must hold one value, not \[2\]")]:
        with pytest.raises(NodeError, match=message):
            check_value(node, 1, value, 2)
    check_value(node, 0, np.array([-5.0]), 2)  # no rule for x
    with pytest.raises(NodeError, match=r"input 1 \(axis\) = -3: axis -3 is out of range"):
        check_value(Node("CumSum", ("x", "a"), ("y",), {}, "c"), 1, np.array(-3), 2)
    with pytest.raises(NodeError, match="not finite"):
        check_value(Node("OneHot", ("i", "d", "v"), ("y",), {}, "o"), 1,
                    np.array(np.nan, np.float32), 1)
    with pytest.raises(NodeError, match=r"input 3 \(sizes\) = \[2, -1\]"):
        check_value(Node("Resize", ("x", "", "", "s"), ("y",), {}, "r"), 3,
                    np.array([2, -1]), 2)


def test_deprecated_group_normalization_18_is_taken():
    """onnx's checker rejects every GroupNormalization-18 node (deprecated); onnxruntime
    runs them, and so does celosia. The node stands in as an Identity for onnx's checks
    only: the model is left as it was, the table still holds the node, and the checker
    still sees the rest."""
    scale = init("s", np.array([1.0, 2.0], np.float32))
    bias = init("b", np.array([0.0, 1.0], np.float32))

    def group_norm(**attrs):
        return model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"],
                                       name="g", **attrs)],
                     [vi("x", [1, 4, 3])], inits=[scale, bias], opset=18)
    m = group_norm(num_groups=2)
    before = m.SerializeToString()
    g = import_onnx(m)
    assert m.SerializeToString() == before and g.types["y"].shape == (1, 4, 3)
    x = np.random.default_rng(0).normal(size=(1, 4, 3)).astype(np.float32)
    groups = x.reshape(1, 2, 6)
    want = ((groups - groups.mean(-1, keepdims=True))
            / np.sqrt(groups.var(-1, keepdims=True) + 1e-5)).reshape(1, 4, 3)
    want = want * np.repeat([1.0, 2.0], 2)[:, None] + np.repeat([0.0, 1.0], 2)[:, None]
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    assert "'num_groups' = 0: every value must be at least 1" in error(group_norm(num_groups=0))
    m = group_norm(num_groups=2)
    m.graph.node.append(helper.make_node("Relu", ["nowhere"], ["z"], name="r"))
    assert "node 'r' (Relu)" in error(m) and "(onnx checker)" in error(m)


def test_dynamic_input_dims_reach_onnx_as_unknown():
    """A -1 input dim (dynamic) is unknown to onnx's inference, which took it for a size
    and aborted the process on a Slice of it; the model keeps its -1."""
    m = model([helper.make_node("Slice", ["x", "s", "e"], ["y"], name="s")], [vi("x", [-1, 5])],
              inits=[init("s", np.array([1])), init("e", np.array([3]))])
    before = m.SerializeToString()
    g = import_onnx(m, {"x": (4, 5)})
    assert g.types["y"].shape == (2, 5) and m.SerializeToString() == before


@pytest.mark.parametrize("attrs, message", [
    ({"strides": [0, 1]}, "'strides' = \\[0, 1\\]: every value must be at least 1"),
    ({"pads": [1, -1, 0, 0]}, "'pads' = .*at least 0"),
    ({"dilations": [1, 0]}, "'dilations'.*at least 1"),
    ({"group": 0}, "'group' = 0"),
    ({"kernel_shape": [3, 0]}, "'kernel_shape'.*at least 1"),
    ({"auto_pad": "SAME"}, "'auto_pad' = 'SAME' is not one of 'NOTSET', 'SAME_UPPER'"),
])
def test_conv_attribute_ranges(attrs, message):
    text = error(conv(**attrs), cls=NodeError)
    assert "node 'c' (Conv): attribute" in text
    assert re.search(message, text), text


def test_lengths_and_axes_against_the_rank():
    """check_ranks: after onnx's inference at import (which may say it first), on its own."""
    node = Node("Conv", ("x", "w"), ("y",), {"strides": [1, 1, 1], "pads": [0] * 4}, "c")
    with pytest.raises(NodeError, match="'strides' has 3 values but the input has rank 4, "
                                        "which needs 2"):
        check_ranks(node, 4)
    node = Node("Softmax", ("x",), ("y",), {"axis": 2}, "s")
    with pytest.raises(NodeError, match=r"axis 2 is out of range for rank 2 \(\[-2, 1\]\)"):
        check_ranks(node, 2)
    check_ranks(Node("Flatten", ("x",), ("y",), {"axis": 2}, "f"), 2)  # axis == rank is fine
    with pytest.raises(NodeError, match="names an axis twice"):
        check_ranks(Node("Unsqueeze", ("x",), ("y",), {"axes": [0, -3]}, "u"), 1)
    assert "strides has incorrect size" in error(conv(strides=[1, 1, 1]))


def test_attribute_kinds_and_names():
    assert "'strides' is an int but Conv takes a list of ints" in error(
        with_attr(conv(), "strides", 2))
    m = model([helper.make_node("Softmax", ["x"], ["y"], name="s")], [vi("x", [2, 3])])
    assert "'axis' is a list of strings but Softmax takes an int" in error(
        with_attr(m, "axis", ["a", "b"]))
    m = model([helper.make_node("Softmax", ["x"], ["y"], name="s")], [vi("x", [2, 3])])
    assert "Softmax has no attribute 'alpha'" in error(with_attr(m, "alpha", 1.0))
    m = model([helper.make_node("Pad", ["x", "p"], ["y"], name="p")], [vi("x", [2, 3])],
              inits=[init("p", np.zeros(4, np.int64))])
    assert "attribute 'mode' is not UTF-8 text" in error(with_attr(m, "mode", b"\xff\xfe"))
    m = model([helper.make_node("Pad", ["x", "p"], ["y"], name="p")], [vi("x", [2, 3])],
              inits=[init("p", np.zeros(4, np.int64))])
    attr = helper.make_attribute("mode", "edge")
    attr.type = 0
    m.graph.node[0].attribute.append(attr)
    assert "attribute 'mode' has no valid type" in error(m)


def test_axes_in_range_and_unique():
    m = model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[0, 0, 1])],
              [vi("x", [2, 3, 4])])
    assert "'perm' = [0, 0, 1] names a value twice" in error(m)
    m = model([helper.make_node("Softmax", ["x"], ["y"], name="s", axis=2)], [vi("x", [2, 3])])
    assert "node 's' (Softmax): 'axis' must be in [-2 , 1]" in error(m)  # onnx's inference
    m = model([helper.make_node("Flatten", ["x"], ["y"], name="f", axis=2)], [vi("x", [2, 3])])
    assert import_onnx(m).types["y"].shape == (6, 1)  # Flatten takes axis == rank


def test_arity():
    m = model([helper.make_node("MatMul", ["x"], ["y"], name="m")], [vi("x", [2, 3])])
    assert "node 'm' (MatMul): has 1 input but MatMul takes 2 (a, b)" in error(m)
    m = model([helper.make_node("Gemm", ["x", "b", "c", "c"], ["y"], name="g")],
              [vi("x", [3, 4])], inits=[init("b", np.ones((4, 5), np.float32)),
                                         init("c", np.ones(5, np.float32))])
    assert "has 4 inputs but Gemm takes 2 to 3 (a, b, c?)" in error(m)
    m = model([helper.make_node("Add", ["x", ""], ["y"], name="a")], [vi("x", [3])])
    assert "input 1 (b) is required but empty" in error(m)
    m = model([helper.make_node("Split", ["x"], ["y", "z", "w"], name="s", num_outputs=2)],
              [vi("x", [4])], outputs=("y", "z", "w"), opset=18)
    assert "'num_outputs' = 2 does not match its 3 outputs" in error(m)
    m = model([helper.make_node("MaxPool", ["x"], ["y"], name="p")], [vi("x", [1, 1, 4, 4])])
    assert "attribute 'kernel_shape' is required" in error(m)


def test_read_node_without_onnx_checker():
    """The table holds by itself (the checker runs after it, on top)."""
    node = helper.make_node("Concat", ["a", "b"], ["y"], name="c")
    with pytest.raises(NodeError, match="'axis' is required"):
        read_node(node, "c", "<m>")
    node = helper.make_node("Cast", ["a"], ["y"], name="c", to=TensorProto.STRING)
    with pytest.raises(NodeError, match="'to' = 8 is not an element type celosia supports"):
        read_node(node, "c", "<m>")
    node = helper.make_node("LeakyRelu", ["a"], ["y"], name="l", alpha=float("nan"))
    with pytest.raises(NodeError, match="'alpha' = nan is not a finite number"):
        read_node(node, "l", "<m>")
    node = helper.make_node("Constant", [], ["y"], name="k", value=helper.make_tensor(
        "t", TensorProto.FLOAT, [2], [1.0, 2.0]))
    assert read_node(node, "k", "<m>").attrs["value"].tolist() == [1.0, 2.0]


# ---- onnx's checker and inference --------------------------------------------------------------


def test_onnx_verdicts_name_the_node():
    m = model([helper.make_node("Gemm", ["x", "b"], ["y"], name="g")], [vi("x", [2, 3, 4])],
              inits=[init("b", np.ones((4, 5), np.float32))])
    text = error(m)
    assert text.startswith("<bytes>: node 'g' (Gemm): ") and "rank 2" in text and \
        "(onnx shape inference)" in text
    m = model([helper.make_node("Relu", ["nowhere"], ["y"])], [vi("x", [2])])
    text = error(m)
    assert "node 'Relu_0' (Relu)" in text and "topologically sorted" in text
    assert m.graph.node[0].name == ""  # the names given for the check are taken back


def test_shapeless_outputs_are_accepted_and_left_alone():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])])
    import_onnx(m)
    assert not m.graph.output[0].type.HasField("tensor_type")


def test_element_types_and_input_dims():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", [2, 3], 0)])
    assert "input 'x' has element type" in error(m) and "UNDEFINED" in error(m)
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", [2, 3], 1234)])
    assert "code 1234 (not an ONNX element type)" in error(m)
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", [2, -3])])
    assert "input 'x' is [2,-3]: a size is negative" in error(m)


def test_names_that_are_not_utf8():
    data = model([helper.make_node("Relu", ["x"], ["y"], name="rrrr")],
                 [vi("x", [2])]).SerializeToString().replace(b"rrrr", b"r\xffrr")
    assert "model.graph.node[0].name is not UTF-8 text" in error(data, cls=ModelLoadError)


# ---- tensors and sizes -------------------------------------------------------------------------


def test_initializer_dims_and_data():
    t = init("t", np.ones(4, np.float32))
    t.dims[0] = -1
    m = model([helper.make_node("Add", ["x", "t"], ["y"], name="a")], [vi("x", [4])], inits=[t])
    assert "Negative dimension" in error(m) or "a size is negative" in error(m)
    with pytest.raises(ModelLoadError, match="initializer 't' has dims \\[-1\\]"):
        read_tensor(t, "initializer 't'", "<m>")
    t = init("t", np.ones(4, np.float32))
    t.raw_data = t.raw_data[:10]
    with pytest.raises(ModelLoadError, match="holds 10 bytes of data but its dims need 16"):
        read_tensor(t, "initializer 't'", "<m>")


def test_external_data_stays_in_the_model_folder(tmp_path):
    a = np.arange(6, dtype=np.float32)
    (tmp_path / "w.bin").write_bytes(b"\0" * 8 + a.tobytes())
    t = init("t", np.zeros(6, np.float32))
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "8"), ("length", "24")):
        e = t.external_data.add()
        e.key, e.value = k, v
    m = model([helper.make_node("Add", ["x", "t"], ["y"], name="a")], [vi("x", [6])], inits=[t])
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    g = import_onnx(path)
    np.testing.assert_array_equal(g.initializers["t"], a)
    stored = m.graph.initializer[0].external_data  # make_graph copied t
    stored[0].value = "../../../etc/passwd"
    onnx.save(m, path)
    with pytest.raises(ModelLoadError, match="not a file inside the model's folder"):
        import_onnx(path)
    stored[0].value = "w.bin"
    stored[2].value = "400"
    onnx.save(m, path)
    with pytest.raises(ModelLoadError, match="does not hold its 24 bytes"):
        import_onnx(path)


def test_sizes_checked_before_allocation(monkeypatch):
    monkeypatch.setenv("CELOSIA_MAX_BYTES", str(1 << 20))
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", [2**31, 2])])
    text = error(m, cls=TensorTooLargeError)
    assert "input 'x' float32[2147483648,2] needs 17,179,869,184 bytes" in text
    assert issubclass(TensorTooLargeError, ResourceLimitError)
    cases = {
        "Expand": (["x", "s"], [init("s", np.array([1 << 12, 1 << 12]))], {}),
        "Tile": (["x", "s"], [init("s", np.array([1 << 20]))], {}),
        "ConstantOfShape": (["s"], [init("s", np.array([1 << 40]))], {}),
        "Range": (["a", "b", "c"], [init("a", np.float32(0)), init("b", np.float32(1e12)),
                                    init("c", np.float32(1))], {}),
        "Add": (["x", "t"], [init("t", np.ones((1 << 12, 1), np.float32))], {}),
        "Pad": (["x", "p"], [init("p", np.array([0, 1 << 20]))], {}),
    }
    for op, (inputs, inits, attrs) in cases.items():
        nodes = [helper.make_node(op, inputs, ["y"], name="n", **attrs)]
        text = error(model(nodes, [vi("x", [1 << 12])], inits=inits),
                     cls=TensorTooLargeError)
        assert f"node 'n' ({op}) output" in text and "CELOSIA_MAX_BYTES" in text, text


def test_group_divides_the_output_channels():
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="c", group=2)],
              [vi("x", [1, 2, 5, 5])], inits=[init("w", np.ones((3, 1, 3, 3), np.float32))])
    assert "node 'c' (Conv): weight float32[3,1,3,3] has 3 output channels, which group=2 " \
           "does not divide" in error(m)


def test_valid_models_still_import_and_run():
    m = conv(strides=[2, 2], pads=[1, 1, 1, 1])
    g = import_onnx(m)
    y = run_graph(g, {"x": np.ones((1, 3, 8, 8), np.float32)})["y"]
    assert y.shape == (1, 4, 4, 4) and y[0, 0, 1, 1] == 27


def test_attribute_kind_table_is_complete():
    from celosia.compiler.frontend.specs import _KINDS
    assert set(_KINDS) == {v for k, v in AttributeProto.AttributeType.items() if v}
