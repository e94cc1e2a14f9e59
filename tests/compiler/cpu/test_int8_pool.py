"""The int8 max-pooling kernel (compiler/cpu/int8_pool.py) bit for bit against graph/ops.py's
MaxPool on seeded random geometries: channel blocks of 1 to 64, kernels, strides,
dilations, per-side padding (windows all padding included), ceil mode, batches, data heavy
in -128 (the padding value) and 127."""

import numpy as np
import pytest
from int8_data import int8s

from celosia.compiler.cpu.kernels import compile_spec
from celosia.compiler.graph.ops import max_pool, pool_output_shape


def _blocked(a, block):
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


@pytest.mark.parametrize("seed", range(4))
def test_int8_maxpool_is_bit_exact(seed, tmp_path, monkeypatch):
    monkeypatch.setenv("CELOSIA_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(seed)
    for _ in range(12):
        cb = int(rng.choice([1, 3, 16, 32, 64]))
        c = cb * int(rng.integers(1, 3))
        kernel = [int(v) for v in rng.integers(1, 5, 2)]
        strides = [int(v) for v in rng.integers(1, 4, 2)]
        dil = [int(v) for v in rng.integers(1, 3, 2)]
        pads = [int(rng.integers(0, (kernel[i % 2] - 1) * dil[i % 2] + 1)) for i in range(4)]
        size = [int(rng.integers(0, 12)) + max(1, (kernel[i] - 1) * dil[i] + 1 - pads[i]
                                                - pads[i + 2]) for i in range(2)]
        attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dil, "pads": pads,
                 "ceil_mode": int(rng.integers(0, 2))}
        x = int8s(rng, (int(rng.integers(1, 3)), c, *size))
        want = max_pool(attrs, x)
        want = want[0] if isinstance(want, tuple) else want
        oh, ow = pool_output_shape(x.shape[2:], kernel, strides, dil, pads, attrs["ceil_mode"])
        assert want.shape[2:] == (oh, ow)
        n = x.shape[0]
        spec = {"op": "maxpool", "dtype": "int8", "data": [n, c // cb, *size, cb],
                "out": [n, c // cb, oh, ow, cb], "kernel": kernel, "strides": strides,
                "pads": pads, "dilations": dil}
        out = np.full(spec["out"], 99, np.int8)
        compile_spec(spec)(_blocked(x, cb), out)
        np.testing.assert_array_equal(out, _blocked(want, cb), err_msg=str(attrs))
