"""The compiled kernels of qops' QLut, QAdd, QMul and QMatMul (kernels_q.py) against
qops.py's numpy definitions, bit for bit: hypothesis draws the shapes (odd sizes, size-1
axes, numpy broadcasting of either operand, batches), the multipliers over the whole int32
range (products wrap), every shift from 1 to 31 and int8 data heavy in -128 and 127."""

import numpy as np
import pytest
from int8_data import int8s
from hypothesis import HealthCheck, given, settings, strategies as st

from celosia.compiler.cpu.kernels import compile_spec
from celosia.compiler.cpu.kernels_q import qparams
from celosia.compiler.graph import qops
from celosia.compiler.graph.ir import Node

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
INT32 = st.integers(-2**31, 2**31 - 1)
MULTIPLIER = st.one_of(INT32, st.integers(-300, 300), st.integers(1, 2**16))

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")




def _params(op, attrs):
    p = qparams(Node(op, ("a", "b"), ("y",), attrs))
    assert p is not None
    return p


@st.composite
def binary_cases(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    shapes = []
    for _ in range(2):  # each operand: some axes of size 1, maybe fewer leading axes
        ones = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
        s = tuple(1 if o else d for o, d in zip(ones, shape))
        shapes.append(s[draw(st.integers(0, rank - 1)):])
    out = np.broadcast_shapes(*shapes)
    op = draw(st.sampled_from(["QAdd", "QMul"]))
    ms = [draw(MULTIPLIER) for _ in range(2 if op == "QAdd" else 1)]
    attrs = {"multipliers": ms, "shift": draw(st.integers(1, 31))}
    if draw(st.booleans()):  # zero points: the "qaddz" / "qmulz" kernels
        attrs["zero_points"] = draw(st.lists(st.integers(-128, 127), min_size=3, max_size=3))
    return op, out, shapes, attrs, draw(st.integers(0, 2**32 - 1))


@SETTINGS
@given(binary_cases())
def test_qadd_qmul_kernels_equal_qops(case):
    op, out_shape, shapes, attrs, seed = case
    rng = np.random.default_rng(seed)
    a, b = (int8s(rng, s) for s in shapes)
    rank = len(out_shape)
    kinds = []
    for s in shapes:
        s = (1,) * (rank - len(s)) + s
        kinds.append("full" if s == out_shape else ["broadcast", list(s)])
    spec = {"op": op.lower() + ("z" if "zero_points" in attrs else ""),
            "shape": list(out_shape), "layout": "plain", "operands": kinds}
    kernel = compile_spec(spec)
    got = np.empty(out_shape, np.int8)
    padded = [x.reshape((1,) * (rank - x.ndim) + x.shape) for x in (a, b)]
    kernel(*padded, _params(op, attrs), got)
    want = (qops.qadd if op == "QAdd" else qops.qmul)(attrs, a, b)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op,attrs,saturates", [
    ("QAdd", {"multipliers": [2**31 - 1, -2**31], "shift": 1}, True),
    ("QAdd", {"multipliers": [3, 5], "shift": 2}, True),
    ("QMul", {"multipliers": [2**31 - 1], "shift": 31}, False),  # wraps
    ("QMul", {"multipliers": [2**20], "shift": 20}, True),
    ("QMul", {"multipliers": [-3], "shift": 9}, False),
    ("QAdd", {"multipliers": [2**22, -2**21 + 7], "shift": 22, "zero_points": [-20, 5, 3]},
     True),
    ("QAdd", {"multipliers": [2**31 - 1, 2**31 - 1], "shift": 31,
              "zero_points": [127, -128, -128]}, False),  # wraps
])
def test_every_int8_pair(op, attrs, saturates):
    """All 65536 pairs of int8 values: wrapping products, clipping to -128 and to 127."""
    a = np.repeat(np.arange(-128, 128, dtype=np.int8), 256).reshape(256, 256)
    b = np.ascontiguousarray(a.T)
    kernel = compile_spec({"op": op.lower() + ("z" if "zero_points" in attrs else ""),
                           "shape": [256, 256], "layout": "plain",
                           "operands": ["full", "full"]})
    got = np.empty((256, 256), np.int8)
    kernel(a, b, _params(op, attrs), got)
    want = (qops.qadd if op == "QAdd" else qops.qmul)(attrs, a, b)
    np.testing.assert_array_equal(got, want)
    if saturates:
        assert got.min() == -128 and got.max() == 127


def test_blocked_per_image_channel_gate():
    """SE's gate [N, C, 1, 1] on a blocked [N, C//c, H, W, c] value ("image_channel")."""
    rng = np.random.default_rng(3)
    n, cc, h, w, c = 2, 3, 5, 7, 16
    x, gate = int8s(rng, (n, cc, h, w, c)), int8s(rng, (n, cc, c))
    attrs = {"multipliers": [40000], "shift": 21}
    kernel = compile_spec({"op": "qmul", "shape": [n, cc, h, w, c], "layout": "blocked",
                           "operands": ["full", "image_channel"]})
    got = np.empty(x.shape, np.int8)
    kernel(x, gate, _params("QMul", attrs), got)
    np.testing.assert_array_equal(got, qops.qmul(attrs, x, gate[:, :, None, None, :]))


@SETTINGS
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.integers(0, 2**32 - 1))
def test_qlut_kernel_equals_qops(shape, seed):
    rng = np.random.default_rng(seed)
    x, table = int8s(rng, shape), int8s(rng, (256,), 0.0)
    got = np.empty(x.shape, np.int8)
    compile_spec({"op": "qlut", "shape": list(shape)})(x, table, got)
    np.testing.assert_array_equal(got, qops.qlut({}, x, table))


def test_qlut_reads_every_entry():
    x = np.arange(-128, 128, dtype=np.int8).reshape(4, 64)
    table = np.random.default_rng(1).permutation(np.arange(-128, 128)).astype(np.int8)
    got = np.empty(x.shape, np.int8)
    compile_spec({"op": "qlut", "shape": [4, 64]})(x, table, got)
    np.testing.assert_array_equal(got, qops.qlut({}, x, table))


@pytest.mark.parametrize("shape", [(2, 17000), (63,), (1, 3, 5, 7, 64)])
def test_qlut_vbmi_and_portable_kernels(shape):
    """Both QLut kernels: lut.py's (64 lookups at a time, parallel chunks of 16384, then
    single elements) where the host has AVX-512 VBMI, and the tensor-language one."""
    from celosia.compiler.cpu.codegen import compile_cpu
    from celosia.compiler.cpu.kernels import build_function
    from celosia.compiler.cpu.lut import vbmi_available

    rng = np.random.default_rng(len(shape))
    x, table = int8s(rng, shape), int8s(rng, (256,), 0.0)
    spec = {"op": "qlut", "shape": list(shape)}
    kernels = [compile_cpu(build_function(spec))]
    if vbmi_available():
        kernels.append(compile_spec(spec, use_cache=False))
        assert kernels[-1].name == "qlut" and "vpermi2var" in kernels[-1].llvm_ir
    for kernel in kernels:
        got = np.empty(x.shape, np.int8)
        kernel(x, table, got)
        np.testing.assert_array_equal(got, qops.qlut({}, x, table))


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 70), st.integers(1, 80),
       MULTIPLIER, st.integers(1, 31), st.integers(0, 2**32 - 1))
def test_qmatmul_kernel_equals_qops(z, m, k, n, multiplier, shift, seed):
    rng = np.random.default_rng(seed)
    a, b = int8s(rng, (z, m, k)), int8s(rng, (z, k, n))
    attrs = {"multiplier": multiplier, "shift": shift}
    got = np.empty((z, m, n), np.int8)
    compile_spec({"op": "qmatmul", "a": [z, m, k], "b": [z, k, n]})(
        a, b, _params("QMatMul", attrs), got)
    np.testing.assert_array_equal(got, qops.qmatmul(attrs, a, b))


def test_qmatmul_long_sums_saturate_at_both_ends():
    """K = 3000 of -128 * -128 and of -128 * 127: sums near +-2**25 (beyond float32's exact
    integers), requantized to 127 and -128."""
    a = np.full((2, 3, 3000), -128, np.int8)
    b = np.full((2, 3000, 5), -128, np.int8)
    b[:, :, 1::2] = 127
    attrs = {"multiplier": 1, "shift": 10}
    got = np.empty((2, 3, 5), np.int8)
    compile_spec({"op": "qmatmul", "a": [2, 3, 3000], "b": [2, 3000, 5]})(
        a, b, _params("QMatMul", attrs), got)
    want = qops.qmatmul(attrs, a, b)
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(got)) == {-128, 127}


def test_invalid_attributes_have_no_kernel_operand():
    """A shift qops refuses (0 or 32) or a wrong count of multipliers: no parameters, so the
    node stays a numpy step that raises qops' error at run time."""
    for op, attrs in [("QAdd", {"multipliers": [1, 2], "shift": 0}),
                      ("QMul", {"multipliers": [1, 2], "shift": 5}),
                      ("QMatMul", {"multiplier": 3, "shift": 32})]:
        assert qparams(Node(op, ("a", "b"), ("y",), attrs)) is None


def test_attributes_the_kernels_do_not_know_leave_the_node_to_numpy():
    """A zero point (or any attribute or input kernels_q.py does not read) means the node
    has no kernel, rather than a kernel that ignores it."""
    from celosia.compiler.cpu.kernels_q import understood

    add = {"multipliers": [1, 2], "shift": 4, "scale": 0.5}
    assert qparams(Node("QAdd", ("a", "b"), ("y",), add)) is not None
    assert qparams(Node("QAdd", ("a", "b"), ("y",), {**add, "offset": 3})) is None
    # zero points the kernels know (qaddz), but not ones outside int8
    assert list(qparams(Node("QAdd", ("a", "b"), ("y",), {**add, "zero_points": [1, 2, 3]}))
                ) == [1, 2, 4, 1, 2, 3]
    assert qparams(Node("QAdd", ("a", "b"), ("y",), {**add, "zero_points": [1, 2, 300]})) \
        is None
    assert qparams(Node("QAdd", ("a", "b", "zp"), ("y",), add)) is None
    assert not understood(Node("QLut", ("x", "t"), ("y",), {"scale": 1.0, "zero_point": 3}))
    assert understood(Node("QLut", ("x", "t"), ("y",), {"scale": 1.0}))
