"""The target plug-in API (runtime/targets.py): the built-in targets come from the entry
points, a target from outside the package (tests/runtime/plugins: a C-source code generator
installed as a distribution would be) takes part in partitioning and runs, models keep
their partitions across save and load, and a plug-in that breaks its contract gets an error
naming it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from celosia.cli import main as cli_main
from celosia.runtime import targets
from celosia.runtime.accel import AccelModel
from celosia.runtime.targets import Target, TargetError
from plugin_helpers import write_distribution

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture
def registry():
    """A clean registry that reads the entry points again, the out-of-tree plug-in's
    distribution on the path."""
    sys.path.insert(0, str(PLUGINS))
    targets._reset_for_tests()
    yield
    sys.path.remove(str(PLUGINS))
    sys.modules.pop("celosia_ctarget", None)
    targets._reset_for_tests()


def _model(path: Path) -> Path:
    """Two int8 convolutions (accelerator), a float Softmax (CPU), then float Mul, Sub and
    Relu (the C plug-in's operators)."""
    rng = np.random.default_rng(3)

    def init(name, a):
        return numpy_helper.from_array(np.asarray(a, np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["y0"]),
        helper.make_node("Softmax", ["y0"], ["sm"], axis=1),
        helper.make_node("Mul", ["sm", "s"], ["m"]),
        helper.make_node("Sub", ["m", "skip"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "three_targets",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8]),
         helper.make_tensor_value_info("skip", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
        [init("w1", rng.normal(0, 0.3, (16, 8, 3, 3))), init("b1", rng.normal(0, 0.1, 16)),
         init("w2", rng.normal(0, 0.3, (16, 16, 3, 3))), init("b2", rng.normal(0, 0.1, 16)),
         init("s", [3.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    out = path / "three.onnx"
    onnx.save(model, out)
    return out


def _feeds(seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(1, 8, 8, 8)).astype(np.float32),
            "skip": rng.normal(0, 0.05, size=(1, 16, 8, 8)).astype(np.float32)}


CALIBRATION = [_feeds(s) for s in range(4)]


def test_builtin_targets_are_registered_through_the_entry_points(registry):
    rows = {r["name"]: r for r in targets.available_targets()}
    assert {"accel", "cpu"} <= set(rows)
    for name in ("accel", "cpu"):
        assert rows[name]["origin"].startswith(f"entry point {name!r}"), rows[name]
    assert isinstance(targets.get_target("cpu"), targets.CpuTarget)


def test_an_out_of_tree_target_is_found_through_its_entry_point(registry):
    t = targets.get_target("csrc")
    assert type(t).__module__ == "celosia_ctarget"
    row = next(r for r in targets.available_targets() if r["name"] == "csrc")
    assert "celosia-ctarget" in row["origin"]


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    return _model(tmp_path_factory.mktemp("targets"))


def test_three_targets_partition_and_run_like_two(registry, onnx_path, tmp_path):
    three = AccelModel.from_onnx(onnx_path, "small", calibration=CALIBRATION,
                                 targets=("accel", "csrc", "cpu"))
    two = AccelModel.from_onnx(onnx_path, "small", calibration=CALIBRATION)
    where = {n.op + ":" + n.name: three.placements[n.name].target for n in three.graph.nodes}
    ops = {}
    for key, t in where.items():
        ops.setdefault(t, set()).add(key.split(":")[0])
    assert ops["accel"] == {"QConv"}
    assert ops["csrc"] == {"Mul", "Sub", "Relu"}
    assert {"Softmax", "Quantize", "Dequantize"} <= ops["cpu"]
    assert "csrc" not in {p.target for p in two.placements.values()}
    # the nodes csrc refused keep its reason
    refusals = three.build_info["refusals"]
    softmax = next(n.name for n in three.graph.nodes if n.op == "Softmax")
    assert "csrc generates C for" in refusals[softmax]["csrc"]
    cpu = two.cpu_build()
    for seed in (10, 11):
        feeds = _feeds(seed)
        ours = three.run(feeds, target="fsim")
        # IEEE float32 Mul, Sub and max(x, 0) in C and in the LLVM build: identical
        np.testing.assert_array_equal(ours["y"], two.run(feeds, target="fsim")["y"])
        np.testing.assert_array_equal(ours["y"], cpu.run(feeds)["y"])
        assert np.count_nonzero(ours["y"]) > 0
    rows = {r["node"]: r for r in three.report}
    assert {r["target"] for r in rows.values()} == {"accel", "csrc", "cpu"}
    # saved and loaded: the partition comes back through its target
    path = tmp_path / "three.cel"
    three.save(path)
    again = AccelModel.load(path)
    assert [(t, n) for t, n, _ in again.external] == [(t, n) for t, n, _ in three.external]
    feeds = _feeds(12)
    np.testing.assert_array_equal(again.run(feeds, target="fsim")["y"],
                                  three.run(feeds, target="fsim")["y"])
    # without the plug-in installed, loading says which target is missing
    sys.path.remove(str(PLUGINS))
    try:
        targets._reset_for_tests()
        with pytest.raises(TargetError, match="run on target 'csrc'.*no target named 'csrc'"):
            AccelModel.load(path)
    finally:
        sys.path.insert(0, str(PLUGINS))
        targets._reset_for_tests()


class Reference(Target):
    """An in-process target that takes int8 convolutions first (before the accelerator) and
    runs them with celosia's numpy reference."""

    name = "reference_conv"

    def supports(self, node, graph, config):
        return None if node.op == "QConv" else f"{node.op}: QConv only"

    def build(self, graph):
        return _RefModule(graph)

    def load(self, data):
        raise TargetError("not saved")


class _RefModule:
    def __init__(self, graph):
        self.graph = graph

    def run(self, feeds):
        from celosia.compiler.graph.reference import run_graph

        return run_graph(self.graph, feeds)

    def to_bytes(self):
        return b""


def test_a_target_before_the_accelerator_claims_its_nodes_first(registry, onnx_path):
    targets.register_target(Reference())
    try:
        model = AccelModel.from_onnx(onnx_path, "small", calibration=CALIBRATION,
                                     targets="reference_conv,accel,csrc")
        convs = [n.name for n in model.graph.nodes if n.op == "QConv"]
        assert {model.placements[c].target for c in convs} == {"reference_conv"}
        assert not model.programs  # nothing left for the accelerator
        feeds = _feeds(20)
        base = AccelModel.from_onnx(onnx_path, "small", calibration=CALIBRATION)
        np.testing.assert_array_equal(model.run(feeds, target="fsim")["y"],
                                      base.cpu_build().run(feeds)["y"])
    finally:
        targets.unregister_target("reference_conv")


class _Bad(Target):
    name = "bad"

    def __init__(self, how):
        self.how = how

    def supports(self, node, graph, config):
        if self.how == "answer":
            return 42
        return None if node.op == "Relu" and graph.types[node.outputs[0]].dtype == "float32" \
            else "no"

    def build(self, graph):
        if self.how == "build":
            raise RuntimeError("code generator crashed")
        return _BadModule(self.how, graph)

    def load(self, data):
        return _BadModule(self.how, None)


class _BadModule:
    def __init__(self, how, graph):
        self.how, self.graph = how, graph

    def run(self, feeds):
        if self.how == "shape":
            return {o: np.zeros(3, np.float32) for o in self.graph.outputs}
        return {}

    def to_bytes(self):
        return b""


@pytest.mark.parametrize("how, message", [
    ("answer", r"supports\(\) of node .* returned 42"),
    ("build", r"target 'bad' failed to build its partition .*code generator crashed"),
    ("shape", r"returned 'y' as float32\[3\], the graph says float32\[1,16,8,8\]"),
    ("missing", r"did not return output 'y'"),
])
def test_a_target_that_breaks_its_contract_is_named(registry, onnx_path, how, message):
    targets.register_target(_Bad(how))
    try:
        with pytest.raises(TargetError, match=message):
            model = AccelModel.from_onnx(onnx_path, "small", calibration=CALIBRATION,
                                         targets="accel,bad")
            model.run(_feeds(0), target="fsim")
    finally:
        targets.unregister_target("bad")


def test_registry_errors(registry, tmp_path, monkeypatch):
    with pytest.raises(TargetError, match="no target named 'nope': registered are .*accel"):
        targets.target_order("accel,nope")
    with pytest.raises(TargetError, match="built-in target"):
        targets.register_target(type("C", (targets.CpuTarget,), {})())
    with pytest.raises(TargetError, match="does not implement build"):
        targets.register_target(type("T", (Target,), {"name": "half",
                                                      "supports": lambda *a: None})())
    with pytest.raises(TargetError, match="not a celosia.runtime.targets.Target"):
        targets.register_target(object)
    # a distribution whose entry point does not import: listed with the reason, and a lookup
    # says why
    write_distribution(tmp_path, "broken-plugin", "celosia.targets",
                       {"broken": "no_such_module:T", "accel": "no_such_module:Accel"})
    monkeypatch.syspath_prepend(str(tmp_path))
    targets._reset_for_tests()
    with pytest.raises(TargetError, match="could not be loaded: .*broken-plugin failed to "
                                          "import: ModuleNotFoundError"):
        targets.get_target("broken")
    rows = targets.available_targets()
    assert any("built-in target's name" in r.get("error", "") for r in rows)
    assert isinstance(targets.get_target("accel"), targets.AccelTarget)


def test_cli_lists_targets_and_takes_them(registry, onnx_path, tmp_path, capsys):
    assert cli_main(["targets"]) == 0
    out = capsys.readouterr().out
    assert "accel" in out and "csrc" in out and "celosia-ctarget" in out
    np.savez(tmp_path / "calib.npz", x=np.stack([c["x"] for c in CALIBRATION]),
             skip=np.stack([c["skip"] for c in CALIBRATION]))
    cel = tmp_path / "m.cel"
    assert cli_main(["compile", str(onnx_path), "--target", "fsim", "--config", "small",
                     "--quantize", "int8", "--calibration", str(tmp_path / "calib.npz"),
                     "--targets", "accel,csrc", "-o", str(cel)]) == 0
    assert {t for t, _, _ in AccelModel.load(cel).external} == {"csrc"}
    assert cli_main(["compile", str(onnx_path), "--target", "fsim", "--config", "small",
                     "--quantize", "int8", "--calibration", str(tmp_path / "calib.npz"),
                     "--targets", "accel,nope", "-o", str(cel)]) == 2
    assert "no target named 'nope'" in capsys.readouterr().err


def test_the_docs_example_target_runs(registry, onnx_path):
    """docs/targets.md's example, executed as written."""
    import re

    text = (Path(__file__).parents[2] / "docs" / "targets.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "docs/targets.md", "exec"), {})
    try:
        model = AccelModel.from_onnx(onnx_path, "small", calibration=CALIBRATION,
                                     targets=("accel", "npelt"))
        taken = [n.op for n in model.graph.nodes if model.placements[n.name].target == "npelt"]
        assert taken == ["Relu"]
        feeds = _feeds(30)
        base = AccelModel.from_onnx(onnx_path, "small", calibration=CALIBRATION)
        np.testing.assert_array_equal(model.run(feeds, target="fsim")["y"],
                                      base.run(feeds, target="fsim")["y"])
    finally:
        targets.unregister_target("npelt")
