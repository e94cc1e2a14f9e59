"""The compiled pack/unpack kernels (compiler/accel/layout_kernels.py) against the packed
layout's definition, on images with channels that are not multiples of BLOCK, pixel counts
that leave a tail after the last whole tile and after the last whole chunk, several images,
1-D images, memory that held anything, and both presets' blocks."""

import numpy as np
import pytest

from celosia.compiler.accel import partition
from celosia.compiler.accel.layout_kernels import PIXELS, pack_fast, unpack_fast
from celosia.compiler.accel.partition import pack_value, packed_shape, unpack_value
from celosia.config import HwConfig


def _packed_reference(x: np.ndarray, k: int) -> np.ndarray:
    """[N, C/k, P, k] with out[n, j, p, kk] = x[n, j*k + kk, p], 0 past C (BATCH 1)."""
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    cb = -(-c // k)
    padded = np.zeros((n, cb * k, flat.shape[2]), np.int8)
    padded[:, :c] = flat
    return padded.reshape(n, cb, k, -1).transpose(0, 1, 3, 2)


@pytest.mark.parametrize("k", [16, 8, 32])
@pytest.mark.parametrize("shape", [(1, 20, 37, 29), (2, 16, 9, 130), (1, 3, 70, 71),
                                   (1, 48, 1, PIXELS + 19), (3, 1, 5, 9)])
def test_kernels_are_the_packed_layout(shape, k):
    rng = np.random.default_rng(sum(shape) + k)
    x = rng.integers(-128, 128, shape, dtype=np.int8)
    want = _packed_reference(x, k)
    out = rng.integers(-128, 128, want.shape, dtype=np.int8)  # memory that held anything
    pack_fast(x, out, k)
    np.testing.assert_array_equal(out, want)
    back = np.zeros(shape, np.int8)
    unpack_fast(want, back, k)
    np.testing.assert_array_equal(back, x)


@pytest.mark.parametrize("preset", ["default", "small"])
@pytest.mark.parametrize("shape", [(1, 40, 33, 31), (1, 24, 1, 5000)])
def test_pack_value_takes_the_kernels_for_large_images(preset, shape, monkeypatch):
    """pack_value/unpack_value of an image past COMPILED_LAYOUT_BYTES give the bytes numpy's
    strided copies give (the threshold raised past it: numpy)."""
    cfg = HwConfig.load(preset)
    x = np.random.default_rng(len(shape)).integers(-128, 128, shape, dtype=np.int8)
    assert x.size >= partition.COMPILED_LAYOUT_BYTES
    fast = pack_value(x, cfg)
    into = np.full(packed_shape(shape, cfg), 5, np.int8)
    pack_value(x, cfg, out=into)
    monkeypatch.setattr(partition, "COMPILED_LAYOUT_BYTES", 1 << 40)
    slow = pack_value(x, cfg)
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(into, slow)
    monkeypatch.undo()
    np.testing.assert_array_equal(unpack_value(fast, shape), x)
