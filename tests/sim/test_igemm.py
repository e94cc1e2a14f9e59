"""sim/igemm.py's int8 x int8 -> int32 kernel against numpy's int64 products, modulo 2^32:
random shapes (row tails, column tails, batches), rows at a stride, weights as int8 or as
the datapath's blocks of 4-byte words, extreme values whose sums wrap."""

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


def test_strided_rows():
    rng = np.random.default_rng(12)
    big = rng.integers(-128, 128, (3, 30, 200), dtype=np.int8)
    a = big[:, 1::3, 8:136]  # rows 600 bytes apart, batches 6000
    wt = rng.integers(-128, 128, (3, 70, 128), dtype=np.int8)  # (nb, N, K): B transposed
    np.testing.assert_array_equal(igemm.matmul(a, igemm.pack(wt[:, :, ::-1][:, :, ::-1])),
                                  _reference(a, wt.transpose(0, 2, 1)))


def test_word_blocks():
    """Weights as the datapath holds them: (group, micro-op, out lane, in lanes / 4) words
    of (out, in) blocks, B's column (group, out lane) and step (micro-op, in lanes / 4)."""
    rng = np.random.default_rng(13)
    for _ in range(20):
        nb, g, gs = int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.integers(1, 9))
        block = int(rng.choice([4, 8, 16, 32]))
        blocks = rng.integers(-128, 128, (nb, g, gs, block, block), dtype=np.int8)
        # B[b, (u, c), (g, o)] = blocks[b, g, u, o, c]
        w = blocks.transpose(0, 2, 4, 1, 3).reshape(nb, gs * block, g * block)
        a = rng.integers(-128, 128, (nb, int(rng.integers(1, 20)), gs * block), dtype=np.int8)
        words = blocks.view(np.uint32)  # (nb, g, gs, block, block / 4)
        np.testing.assert_array_equal(igemm.matmul(a, igemm.pack(words)), _reference(a, w))


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
