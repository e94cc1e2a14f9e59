"""CPU operators and their schedules (cpu_schedules.py), compiled with LLVM, against numpy
on random inputs."""

import numpy as np
import pytest

from celosia.compiler.tensor import te
from celosia.compiler.cpu.codegen import compile_cpu
from celosia.compiler.cpu.schedules import (add, channel_block, conv2d_nchwc, dense,
                                            global_avg_pool_nchwc, max_pool2d_nchwc,
                                            pack_conv_weight, pack_dense_weight, pack_nchwc,
                                            relu, schedule_conv2d_nchwc, schedule_dense,
                                            schedule_elementwise, unpack_nchwc)
from celosia.errors import CompilerError
from celosia.compiler.tensor.lower import lower

RTOL = 1e-5

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _close(got, want):
    # Sums in another order: relative 1e-5, plus an absolute term for results near zero.
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())


def conv2d_reference(x, w, b, stride, padding, residual=None, activation=None):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding,) * 2, (padding,) * 2))
    oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for dy in range(kh):
        for dx in range(kw):
            patch = xp[:, :, dy:dy + stride * oh:stride, dx:dx + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, dy, dx])
    if b is not None:
        out += b[None, :, None, None]
    if residual is not None:
        out += residual
    if activation == "relu":
        out = np.maximum(out, 0)
    return out


def _conv_kernel(n, ic, h, w, oc, k, stride, padding, *, bias=False, residual=False,
                 activation=None):
    cb, ob = channel_block(ic), channel_block(oc)
    x = te.placeholder((n, ic // cb, h, w, cb), "float32", "x")
    wt = te.placeholder((oc // ob, ic // cb, k, k, cb, ob), "float32", "w")
    b = te.placeholder((oc // ob, ob), "float32", "b") if bias else None
    oh, ow = (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1
    r = te.placeholder((n, oc // ob, oh, ow, ob), "float32", "r") if residual else None
    extra = [t for t in (b, r) if t is not None]
    y = conv2d_nchwc(x, wt, stride=stride, padding=padding, bias=b, residual=r,
                     activation=activation)
    return compile_cpu(lower(schedule_conv2d_nchwc(y), [x, wt] + extra + [y])), cb, ob, y.shape


@pytest.mark.parametrize("n,ic,h,w,oc,k,stride,padding", [
    (1, 16, 14, 14, 32, 3, 1, 1),   # 3x3, pad 1
    (1, 16, 15, 15, 16, 3, 2, 1),   # stride 2, odd size
    (2, 32, 8, 8, 16, 1, 1, 0),     # 1x1, batch 2
    (1, 16, 14, 14, 32, 1, 2, 0),   # 1x1 stride 2 (a ResNet shortcut)
    (1, 3, 20, 20, 16, 7, 2, 3),    # 7x7 stride 2 on 3 channels (a ResNet stem)
    (1, 8, 10, 12, 24, 3, 1, 0),    # no padding, a non-square image, 8-wide blocks
])
def test_conv2d_matches_numpy(n, ic, h, w, oc, k, stride, padding):
    rng = np.random.default_rng(ic + oc + k)
    kernel, cb, ob, shape = _conv_kernel(n, ic, h, w, oc, k, stride, padding)
    x = rng.standard_normal((n, ic, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, ic, k, k)).astype(np.float32)
    y = np.zeros(shape, np.float32)
    kernel(pack_nchwc(x, cb), pack_conv_weight(wt, cb, ob), y)
    _close(unpack_nchwc(y), conv2d_reference(x, wt, None, stride, padding))


def test_conv2d_with_fused_bias_residual_and_relu():
    rng = np.random.default_rng(1)
    n, ic, h, oc = 1, 16, 12, 16
    kernel, cb, ob, shape = _conv_kernel(n, ic, h, h, oc, 3, 1, 1, bias=True, residual=True,
                                         activation="relu")
    x = rng.standard_normal((n, ic, h, h)).astype(np.float32)
    wt = rng.standard_normal((oc, ic, 3, 3)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    res = rng.standard_normal((n, oc, h, h)).astype(np.float32)
    y = np.zeros(shape, np.float32)
    kernel(pack_nchwc(x, cb), pack_conv_weight(wt, cb, ob), b.reshape(oc // ob, ob),
           pack_nchwc(res, ob), y)
    _close(unpack_nchwc(y), conv2d_reference(x, wt, b, 1, 1, res, "relu"))


def test_grouped_conv2d_as_one_call_per_group():
    rng = np.random.default_rng(2)
    groups, n, ic, h, oc = 2, 1, 32, 9, 32
    icg, ocg = ic // groups, oc // groups
    kernel, cb, ob, shape = _conv_kernel(n, icg, h, h, ocg, 3, 1, 1)
    x = rng.standard_normal((n, ic, h, h)).astype(np.float32)
    wt = rng.standard_normal((oc, icg, 3, 3)).astype(np.float32)
    outs = []
    for g in range(groups):
        y = np.zeros(shape, np.float32)
        kernel(pack_nchwc(x[:, g * icg:(g + 1) * icg], cb),
               pack_conv_weight(wt[g * ocg:(g + 1) * ocg], cb, ob), y)
        outs.append(unpack_nchwc(y))
    want = np.concatenate([conv2d_reference(x[:, g * icg:(g + 1) * icg],
                                            wt[g * ocg:(g + 1) * ocg], None, 1, 1)
                           for g in range(groups)], axis=1)
    _close(np.concatenate(outs, axis=1), want)


@pytest.mark.parametrize("m,k,n,bias,activation", [
    (16, 64, 64, True, "relu"), (1, 100, 40, True, None), (6, 33, 16, False, "relu6")])
def test_dense_matches_numpy(m, k, n, bias, activation):
    rng = np.random.default_rng(m + k + n)
    nb = channel_block(n)
    a = te.placeholder((m, k), "float32", "a")
    w = te.placeholder((n // nb, k, nb), "float32", "w")
    b = te.placeholder((n,), "float32", "b") if bias else None
    y = dense(a, w, bias=b, activation=activation)
    kernel = compile_cpu(lower(schedule_dense(y), [a, w] + ([b] if bias else []) + [y]))
    av = rng.standard_normal((m, k)).astype(np.float32)
    wv = rng.standard_normal((n, k)).astype(np.float32)
    bv = rng.standard_normal(n).astype(np.float32)
    got = np.zeros((m, n), np.float32)
    kernel(av, pack_dense_weight(wv, nb), *([bv] if bias else []), got)
    want = av.astype(np.float64) @ wv.T.astype(np.float64) + (bv if bias else 0)
    want = {"relu": np.maximum(want, 0), "relu6": np.clip(want, 0, 6), None: want}[activation]
    _close(got, want)


@pytest.mark.parametrize("kernel_size,stride,padding", [(3, 2, 1), (2, 2, 0)])
def test_max_pool_matches_numpy(kernel_size, stride, padding):
    rng = np.random.default_rng(3)
    n, c, h = 1, 32, 11
    x = te.placeholder((n, c // 16, h, h, 16), "float32", "x")
    y = max_pool2d_nchwc(x, kernel=kernel_size, stride=stride, padding=padding)
    kernel = compile_cpu(lower(schedule_elementwise(y), [x, y]))
    xv = rng.standard_normal((n, c, h, h)).astype(np.float32)
    got = np.zeros(y.shape, np.float32)
    kernel(pack_nchwc(xv, 16), got)
    xp = np.pad(xv, ((0, 0), (0, 0), (padding,) * 2, (padding,) * 2), constant_values=-np.inf)
    oh = (h + 2 * padding - kernel_size) // stride + 1
    want = np.full((n, c, oh, oh), -np.inf, np.float32)
    for dy in range(kernel_size):
        for dx in range(kernel_size):
            want = np.maximum(want, xp[:, :, dy:dy + stride * oh:stride, dx:dx + stride * oh:stride])
    np.testing.assert_array_equal(unpack_nchwc(got), want)


def test_global_avg_pool_relu_and_add_match_numpy():
    rng = np.random.default_rng(4)
    shape = (2, 2, 7, 7, 16)
    a = te.placeholder(shape, "float32", "a")
    b = te.placeholder(shape, "float32", "b")
    s = add(a, b, activation="relu")
    pooled = global_avg_pool_nchwc(s)
    kernel = compile_cpu(lower(schedule_elementwise(pooled), [a, b, pooled]))
    av = rng.standard_normal(shape).astype(np.float32)
    bv = rng.standard_normal(shape).astype(np.float32)
    got = np.zeros(pooled.shape, np.float32)
    kernel(av, bv, got)
    _close(got, np.maximum(av + bv, 0).mean(axis=(2, 3)))
    r = relu(a)
    got = np.zeros(shape, np.float32)
    compile_cpu(lower(schedule_elementwise(r), [a, r]))(av, got)
    np.testing.assert_array_equal(got, np.maximum(av, 0))


def test_operator_errors_say_what_to_change():
    x = te.placeholder((1, 2, 8, 8, 8), "float32", "x")
    w = te.placeholder((1, 4, 3, 3, 4, 16), "float32", "w")
    with pytest.raises(CompilerError, match="expects 16 input channels in blocks of 4"):
        conv2d_nchwc(x, w)
    w = te.placeholder((1, 2, 3, 3, 8, 16), "float32", "w")
    with pytest.raises(CompilerError, match="stride must be a positive integer, not 0"):
        conv2d_nchwc(x, w, stride=0)
    with pytest.raises(CompilerError, match="activation must be one of"):
        conv2d_nchwc(x, w, activation="gelu")
    with pytest.raises(CompilerError, match="reg_n 5 must divide the output width 6"):
        schedule_conv2d_nchwc(conv2d_nchwc(x, w), reg_n=5)
    with pytest.raises(CompilerError, match="not made by dense"):
        schedule_dense(relu(x))


def _error_vs_scale(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_long_float_sums_are_chunked_for_accuracy():
    """A 4096-input dense layer and a 3x3 convolution over 512 channels (4608 products per
    output) against float64: summed in chunks (FLOAT_TERMS) their error stays near 2e-7 of
    the output's scale; one running float32 sum gave 1.4e-6 and 2.1e-6 on these inputs."""
    from celosia.compiler.cpu.schedules import _dense_chunk, _float_chunk

    assert _dense_chunk(4096) == 64 and _float_chunk(32, 3 * 3 * 16) == 1
    assert _dense_chunk(1009) == 1009 and _dense_chunk(1018) == 1018  # no divisor 8..32
    rng = np.random.default_rng(7)
    m, k, n = 8, 4096, 64
    a = te.placeholder((m, k), "float32", "a")
    w = te.placeholder((n // 16, k, 16), "float32", "w")
    y = dense(a, w)
    kernel = compile_cpu(lower(schedule_dense(y), [a, w, y]))
    av = rng.standard_normal((m, k)).astype(np.float32)
    wv = rng.standard_normal((n, k)).astype(np.float32)
    got = np.zeros((m, n), np.float32)
    kernel(av, pack_dense_weight(wv, 16), got)
    assert _error_vs_scale(got, av.astype(np.float64) @ wv.T.astype(np.float64)) < 6e-7

    kernel, cb, ob, shape = _conv_kernel(1, 512, 8, 8, 16, 3, 1, 1)
    x = rng.standard_normal((1, 512, 8, 8)).astype(np.float32)
    wt = rng.standard_normal((16, 512, 3, 3)).astype(np.float32)
    out = np.zeros(shape, np.float32)
    kernel(pack_nchwc(x, cb), pack_conv_weight(wt, cb, ob), out)
    assert _error_vs_scale(unpack_nchwc(out), conv2d_reference(x, wt, None, 1, 1)) < 6e-7
