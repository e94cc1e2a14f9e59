"""Models that ship with celosia or are built by it, offline: the demo's digits CNN
(digits.py, its training script train_digits.py, the trained file in data/) and
architectures with random weights built with onnx.helper (zoo.py) for tests and benchmarks.
Nothing in the stack imports this package; it only feeds models to it."""
