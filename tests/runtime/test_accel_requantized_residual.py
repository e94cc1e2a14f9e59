"""A convolution's residual sum as a requantizing QAdd (each operand in its own scale, zero
points where the operands have them) and a table's input in the range of least table
error (compiler/graph/qtable.py): on a MobileNetV3-style model (HardSwish stem read by a
depthwise block and by the residual Add), the quantized graph has those forms, its CPU
build computes qops.py's bits, and the accelerator build is bit-exact with the CPU build on
fsim and the cycle model."""

import numpy as np
import pytest
from onnx import helper
from onnx_builders import make_model, vi

from celosia.compiler.graph.qtable import table_input_range
from celosia.compiler.graph.reference import run_graph
from celosia.compiler.pipeline import quantize_model
from celosia.runtime.accel import AccelModel, compare_outputs
from tests.runtime.test_accel_inplace import _conv

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _model(rng, cin, c, hw, n):
    """stem conv + HardSwish (h0); expand 1x1 + Relu, depthwise 3x3 + HardSwish, projection
    1x1, Add of h0 (r); a head conv reads r."""
    h = helper.make_node
    parts = [_conv(rng, "stem", "x", "s", 3, cin, gain=3.0),
             ([h("HardSwish", ["s"], ["h0"])], []),
             _conv(rng, "expand", "h0", "e", cin, c, k=1),
             ([h("Relu", ["e"], ["e1"])], []),
             _conv(rng, "dw", "e1", "d", c, c, group=c, gain=2.0),
             ([h("HardSwish", ["d"], ["d1"])], []),
             _conv(rng, "proj", "d1", "p", c, cin, k=1, gain=0.5),
             ([h("Add", ["p", "h0"], ["r"])], []),
             _conv(rng, "head", "r", "y", cin, 10, k=1)]
    nodes = [node for ns, _ in parts for node in ns]
    inits = [i for _, its in parts for i in its]
    shape = (n, 3, hw, hw)
    m = make_model(nodes, [vi("x", list(shape))], [vi("y", None)], inits)
    calib = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(4)]
    return m, calib, shape


@pytest.mark.parametrize("cin,c,hw,n", [(16, 40, 6, 1), (8, 20, 5, 2)])
def test_requantized_residual_is_bit_exact_on_the_accelerator(cin, c, hw, n):
    rng = np.random.default_rng(cin + c)
    m, calib, shape = _model(rng, cin, c, hw, n)
    q = quantize_model(m, calib, input_shapes={"x": shape})
    by_op = {}
    for nd in q.nodes:
        by_op.setdefault(nd.op, []).append(nd)
    # the residual: a QAdd of the projection (its own scale) and the stem's HardSwish
    # output, which keeps its zero point (only tables write it); no QConv takes a residual
    (add,) = by_op["QAdd"]
    assert all(len(nd.inputs) == 4 for nd in by_op["QConv"])
    proj = next(nd for nd in by_op["QConv"] if nd.outputs[0] in add.inputs)
    assert float(proj.attrs["scale"]) != float(add.attrs["scale"])
    za, zb, zo = add.attrs["zero_points"]
    assert za != 0 or zb != 0
    # the HardSwish inputs take a zero point (a range of least table error): the QConv
    # writing one adds it through its bias, so the table's zero entry is not at q = 0
    for lut in by_op["QLut"]:
        table = q.initializers[lut.inputs[1]]
        assert (table == table[0]).sum() > 1  # the flat part below -3 takes several steps
    feeds = {"x": rng.normal(0, 1, shape).astype(np.float32)}
    model = AccelModel.build(q)
    want = model.cpu_build().run(feeds)
    np.testing.assert_array_equal(want["y"], run_graph(q, feeds)["y"])
    places = model.placements
    assert places[add.name].target == "accel", places[add.name].reason
    for target in ("fsim", "cycle"):
        same, detail = compare_outputs(model.run(feeds, target=target), want, exact=True)
        assert same, f"{target}: {detail['summary']}"


def test_own_residual_scales_are_more_accurate_and_can_be_turned_off():
    """The projection's own scale against the shared one (one scale for the residual and
    the sum): closer to the float model on held-out inputs; ``own_residual_scales=False``
    gives the fused form back (a QConv with a residual input, no QAdd)."""
    from celosia.compiler.frontend.onnx import import_onnx
    from celosia.compiler.graph.passes import optimize
    from celosia.compiler.graph.quantize import quantize_graph

    rng = np.random.default_rng(7)
    m, calib, shape = _model(rng, 16, 32, 8, 1)
    g = optimize(import_onnx(m, {"x": shape}))
    tests = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(4)]
    errors = []
    for own in (True, False):
        q = quantize_graph(g, calib, own_residual_scales=own)
        ops = [nd.op for nd in q.nodes]
        assert ("QAdd" in ops) == own
        assert any(nd.op == "QConv" and len(nd.inputs) == 5 for nd in q.nodes) == (not own)
        errors.append(np.mean([np.sqrt(((run_graph(q, t)["y"] - run_graph(g, t)["y"]) ** 2
                                        ).mean()) for t in tests]))
    # With the quantizer's signed ranges (least-squared-error, zero points through Add) the
    # two forms are close on this model: own scales 0.0437, shared 0.0420 (seed 7); own
    # scales must not be worse by more than 5 %.
    assert errors[0] < 1.05 * errors[1], errors


@pytest.mark.parametrize("f,where", [
    (lambda v: v * np.clip(v + 3, 0, 6) / 6, -3.0),      # HardSwish: 0 below -3
    (lambda v: v / (1 + np.exp(-v)), -7.0),              # SiLU: about 0 far below
])
def test_table_input_range_clips_where_the_function_is_flat(f, where):
    """Pre-activations N(0, 2): the table's input range starts near where f stops
    changing, not at the calibrated minimum, keeps the maximum, and its error is below the
    symmetric range's."""
    rng = np.random.default_rng(1)
    x = rng.normal(0, 2, 60000).astype(np.float32)
    s, z, lo, hi = table_input_range(f, float(x.min()), float(x.max()))
    assert hi > 0.99 * float(x.max()), hi  # f still grows there: (almost) nothing clipped
    assert z > -128 + 10 and lo > x.min() + 0.5, (z, lo, x.min())
    assert lo >= where - 0.5, lo
    top = float(np.abs(x).max())
    s_sym = float(np.float32(top / 127))

    def err(s, z):
        q = np.clip(np.rint(x / np.float32(s)) + z, -128, 127)
        return float(np.mean((f((q - z) * np.float32(s)) - f(x)) ** 2))
    assert err(s, z) < 0.7 * err(s_sym, 0)


@pytest.mark.slow
def test_requantized_residual_on_the_rtl_agrees_with_the_cycle_model():
    """The small configuration on the RTL: the QAdd with zero points (its rounding row
    holding them, zo added after the shift) gives the all-CPU build's outputs and the
    cycle model's cycle counts."""
    rng = np.random.default_rng(11)
    m, calib, shape = _model(rng, 8, 12, 4, 1)
    q = quantize_model(m, calib, input_shapes={"x": shape})
    (add,) = [nd for nd in q.nodes if nd.op == "QAdd"]
    assert any(add.attrs["zero_points"][:2])
    model = AccelModel.build(q, "small")
    assert model.placements[add.name].target == "accel"
    feeds = {"x": rng.normal(0, 1, shape).astype(np.float32)}
    want = model.cpu_build().run(feeds)
    same, detail = compare_outputs(model.run(feeds, target="rtl"), want, exact=True)
    assert same, detail["summary"]
    rtl_cycles = [r["cycles"] for r in model.report if r["target"] == "accel"]
    model.run(feeds, target="cycle")
    assert [r["cycles"] for r in model.report if r["target"] == "accel"] == rtl_cycles
