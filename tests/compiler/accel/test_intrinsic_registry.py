"""Tensor intrinsics registered by name (compiler/accel/intrin.py): a user-declared intrinsic
that computes what a micro-op does reaches the code generator and runs; one that does not
is refused with what is missing or what differs; a package registers one through an entry
point."""

from __future__ import annotations

import numpy as np
import pytest

from celosia import HwConfig
from celosia.compiler.accel import intrin
from celosia.compiler.accel.build import AcceleratorFunction, accelerator_pipeline
from celosia.compiler.accel.intrin import (TensorIntrinsic, get_intrinsic, intrinsic_names,
                                           register_intrinsic)
from celosia.compiler.tensor import te
from celosia.driver import Device
from celosia.errors import CompilerError
from plugin_helpers import write_distribution

from .test_passes import CFG, tiny_dense


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(intrin, "_factories", {})
    monkeypatch.setattr(intrin, "_origin", {})
    monkeypatch.setattr(intrin, "_entry_points_read", False)


def declared(cfg: HwConfig, *, call="uop_gemm", transposed=False, block=None):
    """The GEMM micro-op as a user would declare it: other names, the product's operands
    the other way round; optionally wrong (weights transposed, another BLOCK)."""
    n = block or cfg.block
    a = te.placeholder((cfg.batch, n), "int8", "activations")
    w = te.placeholder((n, n), "int8", "filters")
    r = te.reduce_axis(n, "red")
    if transposed:
        body = lambda row, col: te.sum(w[r, col].astype("int32") * a[row, r].astype("int32"),
                                       axis=[r])
    else:
        body = lambda row, col: te.sum(w[col, r].astype("int32") * a[row, r].astype("int32"),
                                       axis=[r])
    out = te.compute((cfg.batch, n), body, "mine")
    return TensorIntrinsic("mine", out, {a: "inp", w: "wgt", out: "acc"}, call)


def test_builtin_gemm_is_registered_through_its_entry_point(registry):
    assert "gemm" in intrinsic_names()
    assert intrin._origin["gemm"].startswith("entry point 'gemm'")
    assert get_intrinsic("gemm", CFG).call == "uop_gemm"


def test_a_user_declared_intrinsic_reaches_codegen_and_runs(registry):
    register_intrinsic("my_gemm", declared)
    mine = get_intrinsic("my_gemm", CFG)
    func = tiny_dense(intrinsic=mine)
    fn = AcceleratorFunction(accelerator_pipeline(func, CFG), CFG)
    rng = np.random.default_rng(0)
    data = rng.integers(-128, 128, (2, 2, 1, 16), dtype=np.int8)
    weight = rng.integers(-128, 128, (4, 2, 16, 16), dtype=np.int8)
    res = np.zeros((2, 4, 1, 16), np.int8)
    fn(Device(CFG, target="fsim", dram_size=1 << 20), data, weight, res)
    want = np.einsum("ikbx,jkox->ijbo", data.astype(np.int32), weight.astype(np.int32))
    np.testing.assert_array_equal(res, want.astype(np.int8))
    # the same program as with the built-in declaration
    assert str(func) == str(tiny_dense(intrinsic=get_intrinsic("gemm", CFG)))


@pytest.mark.parametrize("kwargs, message", [
    ({"call": "uop_conv"}, r"calls 'uop_conv', which the accelerator's code generator does "
                           r"not emit: its micro-ops are uop_gemm"),
    ({"transposed": True}, r"does not compute what uop_gemm does .*: it computes .*wgt\[r0,i1\]"
                           r".*the micro-op .*wgt\[i1,r0\]"),
    ({"block": 8}, r"its acc operand is int32\[1, 8\], the micro-op's int32\[1, 16\]"),
])
def test_an_intrinsic_the_hardware_cannot_run_says_why(registry, kwargs, message):
    register_intrinsic("wrong", lambda cfg: declared(cfg, **kwargs))
    with pytest.raises(CompilerError, match=message):
        get_intrinsic("wrong", CFG)


def test_registry_errors(registry):
    with pytest.raises(CompilerError, match="no tensor intrinsic named 'nope': registered "
                                            "are gemm"):
        get_intrinsic("nope", CFG)
    with pytest.raises(CompilerError, match="registered already"):
        register_intrinsic("gemm", declared)
    register_intrinsic("odd", lambda cfg: 3)
    with pytest.raises(CompilerError, match="returned 3, not a TensorIntrinsic"):
        get_intrinsic("odd", CFG)


def test_a_package_registers_an_intrinsic_through_an_entry_point(registry, tmp_path,
                                                                 monkeypatch):
    pkg = tmp_path / "my_intrinsics.py"
    pkg.write_text("from celosia.compiler.accel.intrin import gemm_intrinsic\n"
                   "def pe(cfg):\n    return gemm_intrinsic(cfg)\n")
    write_distribution(tmp_path, "my-intrinsics", "celosia.intrinsics",
                       {"pe": "my_intrinsics:pe", "gone": "not_installed:pe"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get_intrinsic("pe", CFG).call == "uop_gemm"
    with pytest.raises(CompilerError, match="'gone' = 'not_installed:pe' failed to import"):
        get_intrinsic("gone", CFG)
