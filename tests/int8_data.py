"""Random int8 test data shared by the int8 kernel tests (tests/ is on sys.path: conftest)."""

import numpy as np


def int8s(rng, shape, extremes=0.3):
    """Random int8 with about ``extremes`` of the values -128 or 127."""
    a = rng.integers(-128, 128, shape)
    u = rng.random(shape)
    a[u < extremes / 2] = -128
    a[u > 1 - extremes / 2] = 127
    return a.astype(np.int8)
