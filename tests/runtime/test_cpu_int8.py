"""Quantized graphs built for the CPU (CpuModel.from_graph): every integer kernel bit-exact
against graph_int's numpy definition on random and adversarial data (-128/127 everywhere,
bias and multipliers that wrap int32, shifts 0 and 31, clamps), whole quantized models
identical to graph_numpy.run_graph, the .cel round trip, and the report of kernel and
numpy steps."""

from functools import partial

import numpy as np
import pytest
from int8_data import int8s as _int8s

from celosia.compiler.cpu import kernels as graph_cpu_kernels
from celosia.compiler.cpu.int8_forms import ENV, chosen_form
from celosia.compiler.cpu.lowering_int8 import dot_reason
from celosia.compiler.graph.ir import Graph, Node, NodeError, TensorType, constant
from celosia.compiler.frontend.onnx import import_onnx
from celosia.compiler.graph.passes import optimize
from celosia.compiler.graph.reference import infer_node, run_graph
from celosia.compiler.pipeline import quantize_model
from celosia.models import digits, zoo as models
from celosia.runtime.cpu import ArtifactError, CpuModel

I32 = np.iinfo(np.int32)

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


# ---- data ------------------------------------------------------------------------------------


int8s = partial(_int8s, extremes=0.5)  # (tests/int8_data.py)


def int32s(rng, shape):
    """int32 over the whole range (products and sums with them wrap), extremes included."""
    a = rng.integers(I32.min, I32.max, shape, endpoint=True)
    u = rng.random(shape)
    a[u < 0.15] = I32.min
    a[u > 0.85] = I32.max
    return a.astype(np.int32)


def requant_params(rng, channels):
    """(bias, multiplier): even channels over the whole int32 range (the sums wrap, outputs
    mostly clip), odd ones small (outputs spread over the int8 range at shifts near 17, so
    an error of one in a sum shows)."""
    bias, mult = int32s(rng, (channels,)), int32s(rng, (channels,))
    bias[1::2] = rng.integers(-2**15, 2**15, channels // 2)
    mult[1::2] = rng.integers(1, 256, channels // 2)
    return bias, mult


def graph_of(nodes, inputs: dict, consts: dict, outputs) -> Graph:
    """A graph of ``nodes`` with typed ``inputs`` ({name: TensorType}) and initializers."""
    types = dict(inputs)
    types.update({k: TensorType(str(v.dtype), tuple(v.shape)) for k, v in consts.items()})
    for node in nodes:
        out = infer_node(node, [types[i] if i else None for i in node.inputs],
                         [consts.get(i) for i in node.inputs])
        types.update(zip(node.outputs, out))
    return Graph("t", tuple(inputs), tuple(outputs), tuple(nodes),
                 {k: constant(v) for k, v in consts.items()}, types)


def _same_but_softmax(graph: Graph, got: dict, want: dict) -> None:
    """Outputs equal bit for bit, but a float Softmax's (a compiled kernel with its own
    exp): within float32 rounding."""
    softmax = {n.outputs[0] for n in graph.nodes if n.op == "Softmax"}
    for name in want:
        if name in softmax:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7,
                                       err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def same_as_numpy(graph: Graph, feeds: dict, kernels=()):
    """Build ``graph`` for the CPU, check its outputs equal run_graph's bit for bit and that
    the ops in ``kernels`` became kernel steps; returns the built model. A float Softmax
    at the end (a compiled kernel with its own exp) is held to float32 rounding instead."""
    built = CpuModel.from_graph(graph)
    got, want = built.run(feeds), run_graph(graph, feeds)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
    _same_but_softmax(graph, got, want)
    kinds = {s["op"]: s["kind"] for s in built.program.steps}
    for op in kernels:
        assert kinds[op] == "kernel", (op, kinds)
    return built


def qconv_graph(rng, c, m, hw, kernel, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1),
                group=1, shift=17, lo=-128, hi=127, residual=False, batch=1, pad_value=None):
    """x (int8 input) -> QConv [-> with an int8 residual input] -> y."""
    a = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads),
         "dilations": list(dilations), "group": group, "shift": shift, "lo": lo, "hi": hi,
         "scale": 0.1}
    if pad_value is not None:
        a["pad_value"] = pad_value
    bias, mult = requant_params(rng, m)
    consts = {"w": int8s(rng, (m, c // group, *kernel)), "b": bias, "mult": mult}
    inputs = {"x": TensorType("int8", (batch, c, *hw))}
    ins = ["x", "w", "b", "mult"]
    if residual:
        out = infer_node(Node("QConv", tuple(ins), ("y",), a), [inputs["x"]] + [
            TensorType(str(v.dtype), v.shape) for v in consts.values()], [None] * 4)[0]
        inputs["r"] = out
        ins.append("r")
    g = graph_of([Node("QConv", tuple(ins), ("y",), a, "qconv")], inputs, consts, ["y"])
    feeds = {k: int8s(rng, t.shape) for k, t in inputs.items()}
    return g, feeds


# ---- QConv -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [
    dict(c=32, m=32, hw=(9, 11), kernel=(3, 3), pads=(1, 1, 1, 1), residual=True, shift=0),
    dict(c=16, m=48, hw=(10, 9), kernel=(3, 2), strides=(2, 1), pads=(0, 2, 1, 1),
         dilations=(2, 1), shift=31, lo=0, hi=127),
    dict(c=32, m=64, hw=(7, 7), kernel=(1, 1), strides=(2, 2), residual=False, lo=-3, hi=9),
    dict(c=48, m=48, hw=(9, 8), kernel=(3, 3), strides=(2, 2), pads=(1, 0, 2, 1), group=48,
         residual=True, batch=2),
    dict(c=32, m=32, hw=(6, 6), kernel=(3, 3), pads=(1, 1, 1, 1), group=2),
    dict(c=6, m=9, hw=(5, 5), kernel=(3, 3), pads=(1, 1, 1, 1), group=3),
    dict(c=3, m=16, hw=(15, 15), kernel=(7, 7), strides=(2, 2), pads=(3, 3, 3, 3), lo=0),
    dict(c=16, m=16, hw=(12, 12), kernel=(9, 9), pads=(4, 4, 4, 4), shift=20),
], ids=["3x3-residual-shift0", "asymmetric-dilated-shift31", "1x1-stride2-clamp",
        "depthwise-batch2", "groups2", "groups3-thin-blocks", "thin-7x7-stem",
        "9x9-smaller-block"])
@pytest.mark.parametrize("int8_form", ["none", "auto"])
def test_qconv_kernels_are_bit_exact(case, int8_form, monkeypatch):
    """Both kernel families: the float-FMA ones ("none") and the host's int8 dot-product
    instructions ("auto"; tests/compiler/cpu/test_int8_dot.py forces each form)."""
    monkeypatch.setenv(ENV, int8_form)
    rng = np.random.default_rng(len(str(case)))
    g, feeds = qconv_graph(rng, **case)
    built = same_as_numpy(g, feeds, kernels=["QConv"])
    ops = {spec["op"] for spec in built.program.specs.values()}
    form, group = chosen_form(), case.get("group", 1)
    if form and dot_reason(form, case["c"], case["m"], group) is None:
        assert "qdot" in ops
    else:
        assert ("qdwconv" if group == case["c"] else "qconv") in ops


@pytest.mark.parametrize("case", [
    dict(c=32, m=32, hw=(9, 11), kernel=(3, 3), pads=(1, 1, 1, 1), residual=True,
         pad_value=-128),
    dict(c=16, m=48, hw=(10, 9), kernel=(3, 2), strides=(2, 1), pads=(0, 2, 1, 1),
         dilations=(2, 1), shift=31, pad_value=127),
    dict(c=48, m=48, hw=(9, 8), kernel=(3, 3), strides=(2, 2), pads=(1, 0, 2, 1), group=48,
         batch=2, pad_value=-37),
    dict(c=6, m=9, hw=(5, 5), kernel=(3, 3), pads=(1, 1, 1, 1), group=3, pad_value=5),
    dict(c=32, m=32, hw=(19,), kernel=(5,), strides=(2,), pads=(2, 3), dilations=(1,),
         pad_value=-90),
    dict(c=32, m=32, hw=(7, 7), kernel=(1, 1), pad_value=-128),
], ids=["3x3", "asymmetric-dilated-strided", "depthwise-batch2", "groups3", "1d", "no-pads"])
def test_qconv_pad_value_is_bit_exact(case):
    """QConv's pad_value (the padding reads it): the compiled kernels against qops.py, and
    qops.py against the same convolution of the input padded by hand with that value."""
    from celosia.compiler.graph.qops import qconv

    rng = np.random.default_rng(len(str(case)))
    g, feeds = qconv_graph(rng, **case)
    built = same_as_numpy(g, feeds, kernels=["QConv"])
    (node,) = g.nodes
    a, z = node.attrs, case["pad_value"]
    nd = len(case["kernel"])
    x = feeds["x"]
    widths = [(0, 0), (0, 0)] + [(a["pads"][i], a["pads"][i + nd]) for i in range(nd)]
    padded = np.pad(x, widths, constant_values=z)
    consts = [np.asarray(g.initializers[v]) for v in node.inputs[1:4]]
    extra = [feeds["r"]] if "r" in feeds else []
    want = qconv({**a, "pads": [0] * 2 * nd, "pad_value": 0}, padded, *consts, *extra)
    np.testing.assert_array_equal(built.run(feeds)["y"], want)
    specs = [s for s in built.program.specs.values() if s["op"] in ("qconv", "qdwconv")]
    assert all(s.get("pad_value", False) == any(a["pads"]) for s in specs), specs


def test_qconv_sums_beyond_float32_and_int32_exactly():
    """Windows of 128 channels x 3x3 of products 128 * 128 and 127 * 127 (odd) sum to more
    than 2**24, beyond the integers a float32 holds: the float32 chunks must stay below it.
    A 1x1 layer of 2**17 + 16 channels of -128 overflows int32: the sum wraps, as
    graph_int's. The bias brings the centre's sum back to -8..7 (multiplier 1, shift 0), so
    an error of one in it shows in the output."""
    a = dict(strides=[1, 1], dilations=[1, 1], group=1, shift=0, lo=-128, hi=127, scale=1.0)
    for c, kernel in ((128, 3), (2**17 + 16, 1)):
        attrs = dict(a, kernel_shape=[kernel, kernel], pads=[kernel // 2] * 4)
        x = np.full((1, c, 3, 3), -128, np.int8)
        w = np.full((16, c, kernel, kernel), -128, np.int8)
        if kernel == 3:
            x[:, ::3], w[:, ::3] = 127, 127
        centre = int(np.sum(x[0, :, 1 - kernel // 2:2 + kernel // 2, 1 - kernel // 2:
                              2 + kernel // 2].astype(np.int64) * w[0].astype(np.int64)))
        assert (centre > 2**24 and centre % 2) if kernel == 3 else centre >= 2**31
        bias = (-centre + 2**31) % 2**32 - 2**31 + np.arange(-8, 8)
        consts = {"w": w, "b": bias.astype(np.int32), "mult": np.full(16, 1, np.int32)}
        node = Node("QConv", ("x", "w", "b", "mult"), ("y",), attrs, "qconv")
        g = graph_of([node], {"x": TensorType("int8", (1, c, 3, 3))}, consts, ["y"])
        built = same_as_numpy(g, {"x": x}, kernels=["QConv"])
        np.testing.assert_array_equal(built.run({"x": x})["y"][0, :, 1, 1], np.arange(-8, 8))


# ---- QGemm, pooling, conversions ---------------------------------------------------------------


@pytest.mark.parametrize("k,residual,shift", [(96, True, 0), (1500, False, 31), (40, False, 15)])
def test_qgemm_is_bit_exact(k, residual, shift):
    rng = np.random.default_rng(k)
    n, o = 3, 40
    a = {"shift": shift, "lo": -100 if residual else -128, "hi": 127, "scale": 0.1}
    bias, mult = requant_params(rng, o)
    consts = {"w": int8s(rng, (o, k)), "b": bias, "mult": mult}
    inputs = {"x": TensorType("int8", (n, k))}
    if residual:
        inputs["r"] = TensorType("int8", (n, o))
    node = Node("QGemm", ("x", "w", "b", "mult") + (("r",) if residual else ()), ("y",), a, "fc")
    g = graph_of([node], inputs, consts, ["y"])
    same_as_numpy(g, {k2: int8s(rng, t.shape) for k2, t in inputs.items()}, kernels=["QGemm"])


def test_int8_maxpool_relu_and_global_average_pool_are_bit_exact():
    """QConv (blocked int8) -> MaxPool (padding fills -128; ceil mode, dilation) -> Relu ->
    QGlobalAveragePool with shifts 1 and 31 and a multiplier that wraps, all kernels."""
    rng = np.random.default_rng(3)
    g, _ = qconv_graph(rng, 16, 32, (11, 11), (3, 3), pads=(1, 1, 1, 1), lo=-120, hi=100)
    pool = Node("MaxPool", ("y",), ("p",), {"kernel_shape": [3, 3], "strides": [2, 2],
                                           "pads": [1, 0, 1, 1], "dilations": [2, 1],
                                           "ceil_mode": 1}, "pool")
    relu = Node("Relu", ("p",), ("r",), {}, "relu")
    gaps = [Node("QGlobalAveragePool", (v,), (f"{v}_avg",),
                 {"multiplier": m, "shift": s, "scale": 0.1}, f"gap_{v}")
            for v, m, s in (("p", 2**23 // 25, 23), ("r", 3, 1), ("y", 2**31 - 5, 31))]
    consts = {k: np.asarray(v) for k, v in g.initializers.items()}
    g2 = graph_of(list(g.nodes) + [pool, relu] + gaps, {"x": g.types["x"]}, consts,
                  ["r", "p_avg", "r_avg", "y_avg"])
    x = int8s(rng, g.types["x"].shape)
    built = same_as_numpy(g2, {"x": x}, kernels=["QConv", "MaxPool", "Relu",
                                                  "QGlobalAveragePool"])
    assert {s["kind"] for s in built.program.steps} <= {"kernel", "view"}


def test_quantize_and_dequantize_are_bit_exact():
    """Quantize: ties to even, +-inf, NaN (0, as numpy's cast), huge and subnormal values,
    plain and blocked (after a float Conv); Dequantize of int8 and int32."""
    rng = np.random.default_rng(4)
    scale = 0.0374
    special = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -128.5, -129.5, np.inf,
                        -np.inf, np.nan, 3e38, -3e38, 1e-45, -1e-45, 0.0, -0.0], np.float32)
    x = (rng.normal(size=(2, 16, 5, 6)) * 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[:special.size] = special * np.float32(0.25)  # exactly the ties of scale 0.25
    flat[special.size:2 * special.size] = special
    w = rng.normal(size=(16, 16, 1, 1)).astype(np.float32)
    nodes = [Node("Quantize", ("x",), ("xq",), {"scale": 0.25}, "q_plain"),
             Node("Dequantize", ("xq",), ("xd",), {"scale": 0.5}, "dq_int8"),
             Node("Conv", ("x", "w"), ("c",), {"kernel_shape": [1, 1], "strides": [1, 1],
                                               "pads": [0] * 4, "dilations": [1, 1],
                                               "group": 1}, "conv"),
             Node("Quantize", ("c",), ("cq",), {"scale": scale}, "q_blocked"),
             Node("Dequantize", ("i32",), ("id",), {"scale": 1e-7}, "dq_int32")]
    g = graph_of(nodes, {"x": TensorType("float32", x.shape),
                         "i32": TensorType("int32", (7, 33))}, {"w": w},
                 ["xq", "xd", "cq", "id"])
    feeds = {"x": x, "i32": int32s(rng, (7, 33))}
    built = same_as_numpy(g, feeds, kernels=["Quantize", "Dequantize", "Conv"])
    blocked = [s for s in built.program.steps if s["node"] == "q_blocked"][0]
    assert "@nchw16c" in blocked["inputs"][0] and "@nchw16c" in blocked["outputs"][0]


def test_what_has_no_kernel_stays_numpy(monkeypatch):
    """A QConv window of more than 1024 taps per channel (the float-FMA kernels would not
    sum it exactly; the int8 dot-product ones sum in int32 and take it) and invalid
    requantization (shift 32) run as numpy steps: the same outputs, and the numpy error at
    run time."""
    rng = np.random.default_rng(5)
    g, feeds = qconv_graph(rng, 2, 16, (34, 33), (33, 33))
    for form, kind in (("none", "numpy"), ("auto", "kernel" if chosen_form("auto") else "numpy")):
        monkeypatch.setenv(ENV, form)
        built = same_as_numpy(g, feeds)
        assert [s["kind"] for s in built.program.steps if s["op"] == "QConv"] == [kind]
    g, feeds = qconv_graph(rng, 16, 16, (5, 5), (3, 3), shift=32)
    built = CpuModel.from_graph(g)
    assert [s["kind"] for s in built.program.steps if s["op"] == "QConv"] == ["numpy"]
    with pytest.raises(NodeError, match="shift 32 must be in"):
        built.run(feeds)


# ---- whole quantized models --------------------------------------------------------------------


def _quantized(model, shape, seed=0, samples=2):
    rng = np.random.default_rng(seed)
    calib = rng.normal(size=(samples, *shape)).astype(np.float32)
    return quantize_model(model, calibration={"image": calib})


@pytest.mark.parametrize("name,build,shape", [
    ("small_cnn", lambda: models.small_cnn(batch=4), (4, 1, 8, 8)),
    ("resnet18", lambda: models.resnet18(image_size=32), (1, 3, 32, 32)),
    ("mobilenet_v2", lambda: models.mobilenet_v2(image_size=32), (1, 3, 32, 32)),
])
def test_whole_quantized_models_equal_run_graph(name, build, shape):
    g = _quantized(build(), shape)
    x = np.random.default_rng(9).normal(size=shape).astype(np.float32) * 2
    built = same_as_numpy(g, {"image": x}, kernels=["Quantize", "QConv", "QGemm", "Dequantize"])
    assert built.origin == {"from": "graph", "quantized": True}
    numpy_ops = {s["op"] for s in built.program.steps if s["kind"] == "numpy"}
    assert numpy_ops == set()  # small_cnn's final Softmax is a kernel too


@pytest.fixture(scope="module")
def digits_int8():
    calib, _ = digits.load_split()["calibration"]
    graph = quantize_model(str(digits.model_path()), calibration={"image": calib},
                           input_shapes={"image": (16, 1, 8, 8)})
    return graph, CpuModel.from_graph(graph, source=digits.model_path().read_bytes())


def test_digits_cnn_int8_equals_run_graph_and_reports_its_steps(digits_int8):
    graph, built = digits_int8
    x, y = digits.load_split()["test"]
    feeds = {"image": x[:16]}
    got, want = built.run(feeds, profile=True), run_graph(graph, feeds)
    _same_but_softmax(graph, got, want)
    assert digits.accuracy(got["probs"], y[:16]) >= 0.9
    report = built.report()
    kinds = report["summary"]["kinds"]
    assert {"QConv", "QGemm", "Quantize", "Dequantize"} <= set(kinds["kernel"])
    assert set(kinds.get("numpy", {})) <= {"Softmax"}
    assert report["origin"] == {"from": "graph", "quantized": True}
    rows = {r["node"]: r["kind"] for r in report["nodes"]}
    assert all(rows[n.name] == "kernel" for n in graph.nodes if n.op == "QConv")


def test_quantized_cel_round_trip_loads_without_compiling(digits_int8, tmp_path, monkeypatch):
    graph, built = digits_int8
    built.save(tmp_path / "q.cel")

    def no_compile(*a, **k):
        raise AssertionError("loading a .cel must not compile")
    monkeypatch.setattr(graph_cpu_kernels, "compile_spec", no_compile)
    monkeypatch.setattr(graph_cpu_kernels, "build_function", no_compile)
    monkeypatch.setattr("celosia.compiler.cpu.codegen._compile_object", no_compile)
    loaded = CpuModel.load(tmp_path / "q.cel")
    x = digits.load_split()["test"][0][:16]
    want = run_graph(graph, {"image": x})
    got = loaded.run({"image": x})
    _same_but_softmax(graph, got, want)
    assert loaded.origin == {"from": "graph", "quantized": True}
    assert loaded.source == digits.model_path().read_bytes()
    assert loaded.input_types == {"image": ("float32", (16, 1, 8, 8))}


def test_float_build_goes_through_from_graph_and_old_cel_versions(tmp_path):
    """CpuModel.build is import + optimize + from_graph (origin "onnx"); files of an older
    format version (1, 2: no checksums) or an unknown one are refused, saying to rebuild."""
    import json
    import zipfile

    m = models.small_cnn()
    built = CpuModel.build(m)
    again = CpuModel.from_graph(optimize(import_onnx(m)))
    assert built.origin == {"from": "onnx", "quantized": False,
                            "inputs": {"image": [1, 1, 8, 8]}}  # as the model declares them
    assert [s["op"] for s in built.program.steps] == [s["op"] for s in again.program.steps]
    assert set(built.program.specs) == set(again.program.specs)
    built.save(tmp_path / "m.cel")
    for version in (1, 2, 7):
        with zipfile.ZipFile(tmp_path / "m.cel") as z:
            members = {n: z.read(n) for n in z.namelist() if n != "manifest.sha256"}
        manifest = json.loads(members["manifest.json"])
        manifest["version"] = version
        members["manifest.json"] = json.dumps(manifest).encode()
        with zipfile.ZipFile(tmp_path / f"v{version}.cel", "w") as z:
            for n, d in members.items():
                z.writestr(n, d)
    for version in (1, 2):
        with pytest.raises(ArtifactError, match=rf"v{version}.cel: format version {version}, "
                                                r"written by an older celosia.*celosia compile"):
            CpuModel.load(tmp_path / f"v{version}.cel")
    with pytest.raises(ArtifactError, match=r"format version 7, this celosia reads version 3"):
        CpuModel.load(tmp_path / "v7.cel")
