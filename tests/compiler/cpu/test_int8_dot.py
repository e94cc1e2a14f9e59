"""The int8 dot-product kernels (compiler/cpu/int8_dot.py) in every form this CPU runs
(int8_forms.py: AVX-512 VNNI, VNNI on ymm, AVX2 vpmaddwd), bit for bit against qops.py's
QConv and QMatMul: hypothesis draws the geometry (kernels, strides, dilations, per-side
padding, groups, channel counts that fill no vector, input and output channel blocks,
batches), the padding value, the register tile (padded vectors and tails included), the
residual and the requantization over the whole int32 range, with int8 data heavy in -128
and 127. Then the lowering: QConv, QGemm and QMatMul graphs and a quantized ResNet built
with each form forced equal the reference executor, and the form is recorded."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from int8_data import int8s

from celosia.compiler.cpu import int8_forms
from celosia.compiler.cpu.host import HostTarget
from celosia.compiler.cpu.int8_dot import compile_dot, dot_tile
from celosia.compiler.cpu.int8_forms import (FORMS, chosen_form, fold_columns, form,
                                             pack_dot_weight, per_channel, runs_here, tap_sums,
                                             unsigned_bias)
from celosia.compiler.graph import qops
from celosia.compiler.graph.ir import Graph, Node, TensorType, constant
from celosia.compiler.graph.reference import infer_node, run_graph
from celosia.compiler.pipeline import quantize_model
from celosia.errors import CompilerError
from celosia.models import zoo as models
from celosia.runtime.cpu import CpuModel


RUNNABLE = [n for n in FORMS if runs_here(n)]
pytestmark = [pytest.mark.usefixtures("private_cache"),  # tests/conftest.py
              pytest.mark.skipif(not RUNNABLE,
                                 reason="this CPU has no int8 dot-product form (no AVX2)")]
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
INT32 = st.integers(-2**31, 2**31 - 1)


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def conv_cases(draw):
    if draw(st.sampled_from([False, False, False, True])):  # depthwise (x1 or x2)
        g, cg, mg = draw(st.integers(2, 24)), 1, draw(st.integers(1, 2))
    else:
        g = draw(st.sampled_from([1, 1, 2, 3]))
        cg, mg = draw(st.integers(1, 20)), draw(st.integers(1, 40))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    strides = [draw(st.integers(1, 3)) for _ in range(2)]
    dil = [draw(st.integers(1, 2)) for _ in range(2)]
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    h = draw(st.integers(max(1, (kh - 1) * dil[0] + 1 - pads[0] - pads[2]), 12))
    w = draw(st.integers(max(1, (kw - 1) * dil[1] + 1 - pads[1] - pads[3]), 16))
    c, m = g * cg, g * mg
    return dict(n=draw(st.integers(1, 2)), c=c, m=m, g=g, h=h, w=w, k=(kh, kw),
                strides=strides, dil=dil, pads=pads,
                pad_value=draw(st.sampled_from([0, 0, -128, 127, -3, 55])),
                cb=draw(st.sampled_from(_divisors(c))), ob=draw(st.sampled_from(_divisors(m))),
                residual=draw(st.booleans()), skip=draw(st.booleans()),
                shift=draw(st.integers(0, 31)),
                lo=draw(st.integers(-128, 0)), hi=draw(st.integers(0, 127)),
                tile=draw(st.one_of(st.none(), st.tuples(st.integers(1, 4), st.integers(1, 16)))),
                big=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


def _reference(case, x, wt, bias, mult, residual):
    """qops.qconv (its padding reads ``pad_value``)."""
    attrs = {"kernel_shape": list(case["k"]), "strides": case["strides"],
             "pads": case["pads"], "dilations": case["dil"], "group": case["g"],
             "shift": case["shift"], "lo": case["lo"], "hi": case["hi"],
             "pad_value": case["pad_value"]}
    return qops.qconv(attrs, x, wt, bias, mult, residual)


def _blocked(a, block):
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def run_conv(name, case):
    rng = np.random.default_rng(case["seed"])
    f = FORMS[name]
    n, c, m, g = case["n"], case["c"], case["m"], case["g"]
    x = int8s(rng, (n, c, case["h"], case["w"]))
    wt = int8s(rng, (m, c // g, *case["k"]))
    if case["big"]:  # sums and products that wrap int32
        bias, mult = (rng.integers(-2**31, 2**31, m).astype(np.int32) for _ in range(2))
    else:  # outputs spread over the int8 range: an error of one in a sum shows
        bias = rng.integers(-2**12, 2**12, m).astype(np.int32)
        mult = rng.integers(1, 64, m).astype(np.int32)
    want0 = _reference(case, x, wt, bias, mult, None)
    oh, ow = want0.shape[2:]
    residual = int8s(rng, want0.shape) if case["residual"] else None
    want = _reference(case, x, wt, bias, mult, residual)
    vectors, columns = case["tile"] or dot_tile(f, m // g, ow)
    columns = min(columns, ow)
    ob = case["ob"]
    spec = {"op": "qdot", "form": name, "data": [n, c // case["cb"], case["h"], case["w"],
                                                  case["cb"]],
            "channels": c, "groups": g, "out": [n, m // ob, oh, ow, ob], "out_channels": m,
            "kernel": list(case["k"]), "strides": case["strides"], "pads": case["pads"],
            "dilations": case["dil"], "pad_value": case["pad_value"],
            "tile": [vectors, columns], "residual": case["residual"],
            "skip_padding": case["skip"], "fold_columns": case.get("fold", False)}
    kernel = compile_dot(spec)
    wk = fold_columns(wt) if case.get("fold") else wt  # the weights as the kernel reduces them
    args = [_blocked(x, case["cb"]), pack_dot_weight(wk, g, f, vectors),
            per_channel(unsigned_bias(bias, wk, f), g, f, vectors),
            per_channel(mult, g, f, vectors),
            np.array([case["shift"], case["lo"], case["hi"], 0], np.int32)]
    if case["skip"]:
        args.append(tap_sums(wk, g, f, vectors, case["pad_value"]))
    if residual is not None:
        args.append(_blocked(residual, ob))
    out = np.full((n, m // ob, oh, ow, ob), 99, np.int8)
    kernel(*args, out)
    got = out.transpose(0, 1, 4, 2, 3).reshape(want.shape)
    np.testing.assert_array_equal(got, want, err_msg=str(spec))


@pytest.mark.parametrize("name", RUNNABLE)
@SETTINGS
@given(case=conv_cases())
def test_conv_forms_are_bit_exact(name, case):
    run_conv(name, case)


@pytest.mark.parametrize("name", RUNNABLE)
def test_wrapping_sums_and_extreme_operands(name):
    """Every activation and weight -128 (u = 0 for VNNI: the bias correction carries the
    whole sum) or 127, and a 1x1 window of 2**17 + 64 channels of (-128) * (-128), whose
    sum overflows int32: it must wrap as qops' does. Multiplier 1 and shift 0, so every
    bit of the sum shows."""
    for (c, fill), skip in itertools.product(((2**17 + 64, -128), (96, 127), (96, -128)),
                                             (False, True)):
        case = dict(n=1, c=c, m=16, g=1, h=2, w=3, k=(1, 1) if c > 96 else (3, 3),
                    strides=[1, 1], dil=[1, 1], pads=[1, 1, 1, 1], pad_value=fill, cb=16,
                    ob=16, residual=False, shift=0, lo=-128, hi=127, tile=None, big=False,
                    seed=1)
        rng = np.random.default_rng(0)
        f = FORMS[name]
        x = np.full((1, c, 2, 3), fill, np.int8)
        wt = np.full((16, c, *case["k"]), fill, np.int8)
        acc = qops.wrap(np.int64(c) * case["k"][0] * case["k"][1] * fill * fill)
        bias = (qops.wrap(-acc + rng.integers(-100, 100, 16))).astype(np.int32)
        mult = np.ones(16, np.int32)
        want = _reference(case, x, wt, bias, mult, None)
        oh, ow = want.shape[2:]
        v, r = dot_tile(f, 16, ow)
        spec = {"op": "qdot", "form": name, "data": [1, c // 16, 2, 3, 16], "channels": c,
                "groups": 1, "out": [1, 1, oh, ow, 16], "out_channels": 16,
                "kernel": list(case["k"]), "strides": [1, 1], "pads": [1, 1, 1, 1],
                "dilations": [1, 1], "pad_value": fill, "tile": [v, r], "residual": False,
                "skip_padding": skip}
        out = np.empty((1, 1, oh, ow, 16), np.int8)
        args = [_blocked(x, 16), pack_dot_weight(wt, 1, f, v),
                per_channel(unsigned_bias(bias, wt, f), 1, f, v),
                per_channel(mult, 1, f, v), np.array([0, -128, 127, 0], np.int32)]
        if skip:
            args.append(tap_sums(wt, 1, f, v, fill))
        compile_dot(spec)(*args, out)
        got = out.transpose(0, 1, 4, 2, 3).reshape(want.shape)
        np.testing.assert_array_equal(got, want)
        assert len(np.unique(got)) > 10  # the window sums land in range, not clipped


@pytest.mark.parametrize("name", RUNNABLE)
def test_skipped_padding_taps_are_bit_exact(name):
    """``skip_padding``: border rows and column blocks multiply only their in-bounds taps
    and add the padding's products from ``tap_sums``. Seeded random geometries where
    padding is most of the window (rows and columns all padding, several border blocks
    with narrow tiles, tails, strides, dilations, groups, any pad_value), each against
    qops.qconv."""
    from celosia.compiler.cpu.int8_dot import Geometry

    rng = np.random.default_rng(14)
    blocks = 0
    for seed in range(40):
        g = int(rng.choice([1, 1, 2]))
        kh, kw = (int(v) for v in rng.integers(1, 6, 2))
        dil = [int(v) for v in rng.integers(1, 3, 2)]
        pads = [int(v) for v in rng.integers(0, 5, 4)]
        h = int(rng.integers(max(1, (kh - 1) * dil[0] + 1 - pads[0] - pads[2]), 10))
        w = int(rng.integers(max(1, (kw - 1) * dil[1] + 1 - pads[1] - pads[3]), 20))
        cg, mg = int(rng.integers(1, 24)), int(rng.integers(1, 40))
        case = dict(n=int(rng.integers(1, 3)), c=g * cg, m=g * mg, g=g, h=h, w=w, k=(kh, kw),
                    strides=[int(v) for v in rng.integers(1, 4, 2)], dil=dil, pads=pads,
                    pad_value=int(rng.choice([0, -128, 127, 9])), cb=1, ob=g * mg,
                    residual=bool(seed % 2), skip=True, shift=int(rng.integers(0, 12)),
                    lo=-128, hi=127, big=seed % 5 == 0, seed=seed,
                    tile=(int(rng.integers(1, 4)), int(rng.integers(1, 5))))
        run_conv(name, case)
        oh = (h + pads[0] + pads[2] - (kh - 1) * dil[0] - 1) // case["strides"][0] + 1
        ow = (w + pads[1] + pads[3] - (kw - 1) * dil[1] - 1) // case["strides"][1] + 1
        geo = Geometry({"op": "qdot", "form": name, "data": [case["n"], g * cg, h, w, 1],
                        "channels": g * cg, "groups": g, "out": [case["n"], 1, oh, ow, g * mg],
                        "out_channels": g * mg, "kernel": [kh, kw],
                        "strides": case["strides"], "pads": pads, "dilations": dil,
                        "tile": [case["tile"][0], min(case["tile"][1], ow)],
                        "residual": False, "skip_padding": True})
        blocks += len(geo.border_blocks) > 1 and geo.row_border
    assert blocks >= 10  # the draws reach several border blocks and border rows


@pytest.mark.parametrize("name", RUNNABLE)
def test_folded_kernel_columns_are_bit_exact(name):
    """``fold_columns``: a kernel row's columns and channels reduced as one run of the
    densely staged row (the last step reading past the window against zero weights, the
    staged input's end included). Seeded random few-channel convolutions (1-7 channels,
    kernels 2-7 wide, strides, row dilation, padding skipped or read, any pad_value)
    against qops.qconv."""
    rng = np.random.default_rng(7)
    for seed in range(30):
        kh, kw = int(rng.integers(1, 8)), int(rng.integers(2, 8))
        dil = [int(rng.integers(1, 3)), 1]
        pads = [int(v) for v in rng.integers(0, 4, 4)]
        h = int(rng.integers(0, 8)) + max(1, (kh - 1) * dil[0] + 1 - pads[0] - pads[2])
        w = int(rng.integers(0, 25)) + max(1, kw - pads[1] - pads[3])
        c, m = int(rng.integers(1, 8)), int(rng.integers(1, 40))
        case = dict(n=int(rng.integers(1, 3)), c=c, m=m, g=1, h=h, w=w, k=(kh, kw),
                    strides=[int(v) for v in rng.integers(1, 4, 2)], dil=dil, pads=pads,
                    pad_value=int(rng.choice([0, -128, 127, -5])), cb=int(rng.choice(
                        _divisors(c))), ob=m, residual=bool(seed % 2), skip=seed % 3 > 0,
                    fold=True, shift=int(rng.integers(0, 12)), lo=-128, hi=127,
                    big=seed % 4 == 0, seed=seed,
                    tile=None if seed % 2 else (int(rng.integers(1, 4)),
                                                int(rng.integers(1, 9))))
        run_conv(name, case)


@pytest.mark.parametrize("name", RUNNABLE)
def test_plain_images_stage_bit_exact(name):
    """A plain image of 2-4 channels (blocks of 1) wider than the stage's run of 64
    pixels: its planes are interleaved 64 pixels at a time, the rest one at a time, with
    folded kernel columns or without, padding or none, column strides."""
    rng = np.random.default_rng(11)
    for seed, (c, fold) in enumerate(itertools.product((2, 3, 4), (True, False))):
        kh, kw = int(rng.integers(1, 8)), int(rng.integers(2, 8))
        pads = [int(v) for v in rng.integers(0, 4, 4)]
        case = dict(n=int(rng.integers(1, 3)), c=c, m=int(rng.integers(1, 40)), g=1,
                    h=int(rng.integers(kh, kh + 4)), w=int(rng.integers(64, 200)), k=(kh, kw),
                    strides=[int(v) for v in rng.integers(1, 3, 2)], dil=[1, 1], pads=pads,
                    pad_value=int(rng.choice([0, -128, 127])), cb=1, ob=1, residual=False,
                    skip=bool(seed % 2), fold=fold, shift=8, lo=-128, hi=127, big=False,
                    seed=seed, tile=None)
        run_conv(name, case)


@st.composite
def matmul_cases(draw):
    z, m = draw(st.integers(1, 4)), draw(st.integers(1, 20))
    return dict(z=z, m=m, k=draw(st.integers(1, 70)), n=draw(st.integers(1, 40)),
                multiplier=draw(st.one_of(INT32, st.integers(1, 2**15))),
                shift=draw(st.integers(1, 31)),
                tile=draw(st.one_of(st.none(), st.tuples(st.integers(1, 4),
                                                         st.integers(1, m)))),
                seed=draw(st.integers(0, 2**32 - 1)))


@pytest.mark.parametrize("name", RUNNABLE)
@SETTINGS
@given(case=matmul_cases())
def test_matmul_forms_are_bit_exact(name, case):
    """QMatMul: the right operand packed by the kernel at run time (column sums for VNNI's
    bias), any K and N (tails of a group of rows and of a vector of columns)."""
    rng = np.random.default_rng(case["seed"])
    z, m, k, n = case["z"], case["m"], case["k"], case["n"]
    a, b = int8s(rng, (z, m, k)), int8s(rng, (z, k, n))
    attrs = {"multiplier": case["multiplier"], "shift": case["shift"]}
    vectors, columns = case["tile"] or dot_tile(FORMS[name], n, m)
    kernel = compile_dot({"op": "qdot_matmul", "form": name, "a": [z, m, k], "b": [z, k, n],
                          "tile": [vectors, columns]})
    out = np.full((z, m, n), 99, np.int8)
    kernel(a, b, np.array([case["multiplier"], case["shift"]], np.int32), out)
    np.testing.assert_array_equal(out, qops.qmatmul(attrs, a, b))


def test_geometry_errors_name_what_is_wrong():
    spec = {"op": "qdot", "form": RUNNABLE[0], "data": [1, 1, 5, 5, 16], "channels": 16,
            "groups": 1, "out": [1, 1, 4, 5, 16], "out_channels": 16, "kernel": [3, 3],
            "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "pad_value": 0,
            "tile": [1, 5], "residual": False}
    with pytest.raises(CompilerError, match=r"output 4x5 is not what the geometry gives \(5x5\)"):
        compile_dot(spec)
    with pytest.raises(CompilerError, match="tile of 9 columns is wider than the output"):
        compile_dot({**spec, "out": [1, 1, 5, 5, 16], "tile": [1, 9]})


# ---- choosing the form -------------------------------------------------------------------------


def test_form_choice_follows_the_host_and_the_option(monkeypatch):
    monkeypatch.delenv(int8_forms.ENV, raising=False)
    assert chosen_form() == int8_forms.host_form()
    assert chosen_form("none") is None
    monkeypatch.setenv(int8_forms.ENV, RUNNABLE[-1])
    assert chosen_form() == RUNNABLE[-1]
    assert chosen_form(RUNNABLE[0]) == RUNNABLE[0]  # the option before the environment
    with pytest.raises(CompilerError, match="int8 form 'vnni' is not one of vnni512, "
                                            "vnni256, avx2"):
        chosen_form("vnni")
    # An AVX2-only host: its best is avx2, and VNNI is refused with what it lacks.
    avx2_only = HostTarget("x86_64-unknown-linux-gnu", "haswell", "+avx,+avx2,+fma,-avx512f")
    monkeypatch.setattr(int8_forms, "host_target", lambda: avx2_only)
    assert int8_forms.host_form() == "avx2"
    with pytest.raises(CompilerError, match="needs CPU features \\+avx512vnni \\+avx512bw, "
                                            "which this CPU \\(haswell\\) lacks; it runs avx2"):
        form("vnni512")
    no_avx2 = HostTarget("x86_64-unknown-linux-gnu", "x86-64", "+sse2,-avx2")
    monkeypatch.setattr(int8_forms, "host_target", lambda: no_avx2)
    assert int8_forms.host_form() is None


# ---- through the lowering ----------------------------------------------------------------------


def _graph(nodes, inputs, consts, outputs):
    types = dict(inputs)
    types.update({k: TensorType(str(v.dtype), tuple(v.shape)) for k, v in consts.items()})
    for node in nodes:
        types.update(zip(node.outputs, infer_node(
            node, [types[i] for i in node.inputs], [consts.get(i) for i in node.inputs])))
    return Graph("t", tuple(inputs), tuple(outputs), tuple(nodes),
                 {k: constant(v) for k, v in consts.items()}, types)


def _qconv(name, x, c, m, k, rng, **attrs):
    a = {"kernel_shape": [k, k], "strides": [1, 1], "pads": [k // 2] * 4, "dilations": [1, 1],
         "group": 1, "shift": 12, "lo": -128, "hi": 127, "scale": 0.1, **attrs}
    consts = {f"{name}.w": int8s(rng, (m, c // a["group"], k, k)),
              f"{name}.b": rng.integers(-2**16, 2**16, m).astype(np.int32),
              f"{name}.m": rng.integers(1, 2**10, m).astype(np.int32)}
    return Node("QConv", (x, *consts), (name,), a, name), consts


@pytest.mark.parametrize("name", RUNNABLE)
def test_qconv_chain_and_qgemm_through_the_lowering(name):
    """An image (3 channels, plain), a stride-2 stem, a grouped layer padded with -7 (an
    input zero point), a 1x1 layer with a residual, then a QGemm with a residual and a second one of 1000 outputs (no whole
    vector): every QConv and QGemm a ``qdot`` kernel, outputs equal to run_graph."""
    rng = np.random.default_rng(3)
    nodes, consts = [], {}
    for node, cs in (_qconv("c1", "x", 3, 32, 7, rng, strides=[2, 2]),
                     _qconv("c2", "c1", 32, 48, 3, rng, group=2, pads=[0, 1, 2, 1],
                            pad_value=-7),
                     _qconv("c3", "c2", 48, 48, 1, rng, lo=-5, hi=100)):
        nodes.append(node)
        consts.update(cs)
    nodes[-1] = Node("QConv", nodes[-1].inputs + ("c2",), ("c3",), nodes[-1].attrs, "c3")
    nodes.append(Node("Flatten", ("c3",), ("flat",), {"axis": 1}, "flat"))
    k = 48 * 6 * 6
    consts.update({"fc.w": int8s(rng, (k, k)), "fc.b": np.zeros(k, np.int32),
                   "fc.m": rng.integers(1, 300, k).astype(np.int32),
                   "out.w": int8s(rng, (1000, k)),
                   "out.b": rng.integers(-2**20, 2**20, 1000).astype(np.int32),
                   "out.m": rng.integers(1, 2**8, 1000).astype(np.int32)})
    q = {"shift": 16, "lo": -128, "hi": 127, "scale": 0.1}
    nodes.append(Node("QGemm", ("flat", "fc.w", "fc.b", "fc.m", "flat"), ("fc",), q, "fc"))
    nodes.append(Node("QGemm", ("fc", "out.w", "out.b", "out.m"), ("y",), q, "out"))
    g = _graph(nodes, {"x": TensorType("int8", (1, 3, 12, 12))}, consts, ["c1", "y"])
    feeds = {"x": int8s(rng, (1, 3, 12, 12))}
    built = CpuModel.from_graph(g, int8_form=name)
    got, want = built.run(feeds), run_graph(g, feeds)
    for v in want:
        np.testing.assert_array_equal(got[v], want[v], err_msg=v)
    steps = {s["node"]: s for s in built.program.steps if s["op"] in ("QConv", "QGemm")}
    for node in ("c1", "c2", "c3", "fc", "out"):
        assert built.program.specs[steps[node]["kernel"]]["op"] == "qdot", node
        assert built.program.specs[steps[node]["kernel"]]["form"] == name
    assert built.build_info["int8_form"] == name


@pytest.mark.parametrize("name", RUNNABLE)
def test_qmatmul_through_the_lowering(name):
    """Attention's shapes: [2, 3, M, K] @ [2, 3, K, N] as one ``qdot_matmul`` kernel."""
    rng = np.random.default_rng(5)
    inputs = {"a": TensorType("int8", (2, 3, 10, 24)), "b": TensorType("int8", (2, 3, 24, 17))}
    node = Node("QMatMul", ("a", "b"), ("y",), {"multiplier": 12345, "shift": 15,
                                                 "scale": 0.1}, "mm")
    g = _graph([node], inputs, {}, ["y"])
    feeds = {k: int8s(rng, t.shape) for k, t in inputs.items()}
    built = CpuModel.from_graph(g, int8_form=name)
    np.testing.assert_array_equal(built.run(feeds)["y"], run_graph(g, feeds)["y"])
    (step,) = [s for s in built.program.steps if s["op"] == "QMatMul" and s["kind"] == "kernel"]
    assert built.program.specs[step["kernel"]]["op"] == "qdot_matmul"


@pytest.mark.parametrize("name", RUNNABLE)
def test_quantized_resnet_with_each_form_equals_run_graph(name, tmp_path):
    """A quantized ResNet-18: equal to run_graph, and again after a .cel round trip, whose
    kernel specs and build record say the form."""
    rng = np.random.default_rng(0)
    g = quantize_model(models.resnet18(image_size=32),
                       {"image": rng.normal(size=(2, 3, 32, 32)).astype(np.float32)})
    x = {"image": rng.normal(size=(1, 3, 32, 32)).astype(np.float32)}
    built = CpuModel.from_graph(g, int8_form=name)
    (got,), (want,) = built.run(x).values(), run_graph(g, x).values()
    np.testing.assert_array_equal(got, want)
    built.save(tmp_path / "r.cel")
    loaded = CpuModel.load(tmp_path / "r.cel")
    again = loaded.run(x)[g.outputs[0]]
    if not np.array_equal(again, want):  # say what differs, for a failure seen on one CPU only
        same_objects = all(loaded.program.kernels[k].obj == built.program.kernels[k].obj
                           for k in built.program.kernels)
        same_constants = all(np.array_equal(loaded.program.constants[k], v)
                             for k, v in built.program.constants.items())
        rerun = np.array_equal(loaded.run(x)[g.outputs[0]], want)
        built_again = np.array_equal(built.run(x)[g.outputs[0]], want)
        pytest.fail(f"the loaded model differs from run_graph (same object code: "
                    f"{same_objects}, same constants: {same_constants}, equal on a second run: "
                    f"{rerun}, the built model still equal: {built_again}, "
                    f"{int8_forms.host_target()})")
    assert loaded.build_info["int8_form"] == name
    specs = [loaded.program.specs[s["kernel"]] for s in loaded.program.steps
             if s["op"] in ("QConv", "QGemm")]
    assert specs and {(s["op"], s["form"]) for s in specs} == {("qdot", name)}


@pytest.mark.slow
def test_bench_cpu_resnet18_int8_quick():
    """`celosia bench cpu-resnet18-int8 --quick`: bit-exact with the reference executor (it
    raises otherwise), the host's form, and faster than the fp32 build by a margin the
    float-FMA int8 kernels never had (they ran at 1-2.5x fp32's time). The goals (0.4 of
    fp32, 0.6 of onnxruntime's int8) are for the full run on a quiet machine."""
    from celosia.benchmarks import run_benchmark

    result = run_benchmark("cpu-resnet18-int8", quick=True)
    m = result["metrics"]
    assert result["bit_exact_vs_reference"]
    assert result["int8_form"] == int8_forms.host_form()
    assert m["ratio_vs_fp32"] < 0.8
    # the fraction is the bound over the latency, both measured in this run (the peak a
    # loaded machine measures can be low, so no timing limit here: that is the full run's)
    assert m["fraction_of_peak"] == pytest.approx(m["bound_ms"] / m["latency_ms"])
    assert m["fraction_of_peak"] > 0
    assert result["repetitions"] == 9
    # onnxruntime's QUInt8 QDQ model built by CpuModel.build: every layer integer, bit-exact
    # (it raises otherwise), a few output steps from onnxruntime at most (measured on eight
    # images: 2 steps at most, 73 % identical)
    assert result["qdq_build"]["float"] == 0 and m["qdq_latency_ms"] > 0
    assert result["qdq_vs_onnxruntime"]["max_steps"] <= 3
    for t in result["timings"].values():
        assert t["iqr_ms"][0] <= t["median_ms"] <= t["iqr_ms"][1]


@pytest.mark.parametrize("name", RUNNABLE)
def test_each_form_runs_its_own_instructions(name):
    """The machine code has the form's instruction and, for avx2 on an AVX-512 host, no
    AVX-512 at all (else LLVM fuses vpmaddwd + vpaddd into VNNI's vpdpwssd and the test of
    the form would not run an AVX2 host's code)."""
    spec = {"op": "qdot", "form": name, "data": [1, 2, 6, 6, 16], "channels": 32, "groups": 1,
            "out": [1, 2, 6, 6, 16], "out_channels": 32, "kernel": [3, 3], "strides": [1, 1],
            "pads": [1, 1, 1, 1], "dilations": [1, 1], "pad_value": 0, "tile": [1, 6],
            "residual": False}
    asm = compile_dot(spec, use_cache=False).assembly()
    if name == "avx2":
        assert "vpmaddwd" in asm and "vpdpwssd" not in asm and "zmm" not in asm
    else:
        dots = [line for line in asm.splitlines() if "vpdpbusd" in line]
        register = "zmm" if name == "vnni512" else "ymm"
        assert dots and all(register in line for line in dots)
