"""The handwritten-digits task that ``celosia demo`` runs end to end.

scikit-learn's digits (1,797 grey 8x8 images, values 0..16, ten classes) ship inside the
scikit-learn wheel, so the demo needs no download. This module fixes one deterministic
train / calibration / test split, so that the bundled CNN (``data/digits_cnn.onnx``, trained
by ``python -m celosia.models.train_digits``), its int8 calibration and every accuracy
reported by the demo and the tests refer to the same held-out images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from celosia.errors import CelosiaError

__all__ = ["MODEL_PATH", "TEST_SIZE", "CALIBRATION_SIZE", "load_split", "model_path",
           "accuracy"]

MODEL_PATH = Path(__file__).parent / "data" / "digits_cnn.onnx"
TEST_SIZE = 360
CALIBRATION_SIZE = 64


def load_split(seed: int = 0) -> dict:
    """The digits as {"train", "calibration", "test"}: (x, y) pairs.

    x is float32 [N, 1, 8, 8] in [0, 1] and y int64 labels. The images are shuffled with
    ``np.random.default_rng(seed)``; the last 360 are ``test`` and the others ``train``;
    ``calibration`` is the first 64 of ``train`` (for int8 calibration, not held out).
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images.astype(np.float32) / np.float32(16.0))[:, None, :, :]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    train, test = order[:-TEST_SIZE], order[-TEST_SIZE:]
    calibration = train[:CALIBRATION_SIZE]
    return {name: (x[idx], y[idx])
            for name, idx in (("train", train), ("calibration", calibration), ("test", test))}


def model_path() -> Path:
    """The bundled trained CNN; a CelosiaError saying how to make it if it is missing."""
    if not MODEL_PATH.is_file():
        raise CelosiaError(
            f"the digits model is missing: expected {MODEL_PATH}; create it with "
            "`python -m celosia.models.train_digits` (or reinstall celosia)")
    return MODEL_PATH


def accuracy(probs_or_logits, y) -> float:
    """Fraction of rows whose largest score is at the label's index."""
    scores = np.asarray(probs_or_logits)
    y = np.asarray(y)
    if scores.ndim != 2 or scores.shape[0] != y.shape[0]:
        raise ValueError(f"accuracy: scores of shape {scores.shape} do not match "
                         f"{y.shape[0]} labels; pass [N, classes] scores for N labels")
    return float(np.mean(scores.argmax(axis=1) == y))
