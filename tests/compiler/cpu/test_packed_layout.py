"""The compiled pack/unpack kernels (compiler/cpu/packed_layout.py) against the packed
layout's definition, on images with channels that are not multiples of BLOCK, pixel counts
that leave a tail after the last whole tile and after the last whole chunk, several images,
1-D images, memory that held anything, and both presets' blocks."""

import numpy as np
import pytest

from celosia.compiler.cpu.packed_layout import PIXELS, pack_fast, unpack_fast


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
