"""sim/igemm.py's int8 x int8 -> int32 kernel against numpy's int64 products, modulo 2^32:
random shapes (row tails, column tails, batches), rows at a stride, weights as int8 or as
4-byte words, extreme values whose sums wrap."""

import numpy as np
import pytest

from celosia.sim import igemm

pytestmark = pytest.mark.skipif(not igemm.available(),
                                reason="this host does not run the int8 kernel (AVX-512 VNNI)")


def _reference(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """a (nb, M, K) @ w (nb, K, N) in int64, as int32 modulo 2^32."""
    full = np.matmul(a.astype(np.int64), w.astype(np.int64))
    return ((full + 2**31) % 2**32 - 2**31).astype(np.int32)


def test_random_shapes():
    rng = np.random.default_rng(11)
    for _ in range(40):
        nb, m = int(rng.integers(1, 4)), int(rng.integers(1, 40))
        k, n = 4 * int(rng.integers(1, 80)), int(rng.integers(1, 150))
        a = rng.integers(-128, 128, (nb, m, k), dtype=np.int8)
        w = rng.integers(-128, 128, (nb, k, n), dtype=np.int8)
        got = igemm.matmul(a, igemm.pack(w.transpose(0, 2, 1)))
        assert got.shape == (nb, m, n)
        np.testing.assert_array_equal(got, _reference(a, w))


def test_strided_rows_and_word_weights():
    rng = np.random.default_rng(12)
    big = rng.integers(-128, 128, (3, 30, 200), dtype=np.int8)
    a = big[:, 1::3, 8:136]  # rows 600 bytes apart, batches 6000
    wt = rng.integers(-128, 128, (3, 70, 128), dtype=np.int8)  # (nb, N, K): B transposed
    words = wt.view(np.uint32)  # the same weights as 4-byte words
    want = _reference(a, wt.transpose(0, 2, 1))
    np.testing.assert_array_equal(igemm.matmul(a, igemm.pack(wt)), want)
    np.testing.assert_array_equal(igemm.matmul(a, igemm.pack(words)), want)


@pytest.mark.parametrize("x, w", [(-128, -128), (-128, 127), (127, -128), (127, 127)])
def test_extremes_wrap(x, w):
    """Sums of 2^17 extreme products pass 2^31: the result is the sum modulo 2^32, as ACC's."""
    k = 1 << 17
    a = np.full((1, 7, k), x, np.int8)
    wt = np.full((1, 17, k), w, np.int8)
    np.testing.assert_array_equal(igemm.matmul(a, igemm.pack(wt)),
                                  _reference(a, wt.transpose(0, 2, 1)))


def test_bad_operands():
    w = igemm.pack(np.zeros((1, 16, 8), np.int8))
    with pytest.raises(ValueError, match="does not match"):
        igemm.matmul(np.zeros((1, 4, 12), np.int8), w)
    with pytest.raises(ValueError, match="multiple of 4"):
        igemm.pack(np.zeros((1, 16, 6), np.int8))
