"""numpy definitions of ONNX's random operators: RandomNormal, RandomUniform, their *Like
forms, Bernoulli and Multinomial, drawn with numpy's Generator. ops.py merges ``KERNELS``
and ``SHAPE_RULES`` into its tables.

Their outputs are not functions of their inputs, so nothing may evaluate them ahead of a
run: ``NONDETERMINISTIC`` lists them, and constant folding (passes.fold_constants), the
importer's compile-time evaluation (frontend/onnx.py) and shape inference (the rules
below, so no kernel runs for a type) respect it.

Draws come from one Generator per node object (``stream``): reference.evaluate_node passes
it to the kernel. With a ``seed`` it starts from that seed, so a built model (a graph run
by run_graph, a CPU program's executor) gives the same sequence of draws, run after run,
as a fresh build of the model does: onnxruntime's behaviour for a session. Without one it
is seeded from the operating system: fresh draws in every run and every build.
onnxruntime's values cannot be matched (another generator): tests compare distributions.
"""

from __future__ import annotations

import weakref

import numpy as np

from .ir import NodeError, TensorType

__all__ = ["KERNELS", "SHAPE_RULES", "NONDETERMINISTIC", "stream"]

NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                              "RandomUniformLike", "Bernoulli", "Multinomial"})

_STREAMS: dict[int, np.random.Generator] = {}


def _generator(attrs) -> np.random.Generator:
    seed = attrs.get("seed")
    if seed is None:
        return np.random.default_rng()
    # ONNX's seed is a float: its 64 bits seed the generator (any float, 1.5 and -0.0 too).
    return np.random.default_rng(int(np.float64(seed).view(np.uint64)))


def stream(node) -> np.random.Generator:
    """The Generator of ``node`` (this object: a build's node), made on its first draw and
    dropped with the node."""
    key = id(node)
    g = _STREAMS.get(key)
    if g is None:
        g = _STREAMS[key] = _generator(node.attrs)
        weakref.finalize(node, _STREAMS.pop, key, None)
    return g


def _float_type(attrs, like=None):
    from onnx.helper import tensor_dtype_to_np_dtype

    code = attrs.get("dtype")
    if code is None:
        return np.dtype(np.float32) if like is None else np.dtype(like)
    return np.dtype(tensor_dtype_to_np_dtype(code))


def _floats(dtype, what):
    if dtype.kind != "f":
        raise ValueError(f"{what} draws floats, not {dtype}: give dtype a float type")
    return dtype


def _normal(attrs, shape, dtype, rng):
    rng = rng or _generator(attrs)
    y = rng.normal(attrs.get("mean", 0.0), attrs.get("scale", 1.0), size=shape)
    return y.astype(_floats(dtype, "RandomNormal"))


def _uniform(attrs, shape, dtype, rng):
    rng = rng or _generator(attrs)
    low, high = attrs.get("low", 0.0), attrs.get("high", 1.0)
    y = rng.uniform(low, high, size=shape)
    return y.astype(_floats(dtype, "RandomUniform"))


def random_normal(attrs, *, rng=None):
    return _normal(attrs, tuple(attrs["shape"]), _float_type(attrs), rng)


def random_uniform(attrs, *, rng=None):
    return _uniform(attrs, tuple(attrs["shape"]), _float_type(attrs), rng)


def random_normal_like(attrs, x, *, rng=None):
    return _normal(attrs, x.shape, _float_type(attrs, x.dtype), rng)


def random_uniform_like(attrs, x, *, rng=None):
    return _uniform(attrs, x.shape, _float_type(attrs, x.dtype), rng)


def bernoulli(attrs, p, *, rng=None):
    """1 where a uniform draw in [0, 1) is below the probability ``p``, else 0, as
    ``dtype`` (default: p's type)."""
    rng = rng or _generator(attrs)
    return (rng.random(p.shape) < p).astype(_float_type(attrs, p.dtype))


def multinomial(attrs, logits, *, rng=None):
    """[batch, sample_size] class indices drawn from each row's unnormalized log
    probabilities (a softmax of ``logits``), by inverse transform of uniform draws."""
    if logits.ndim != 2:
        raise ValueError(f"input {list(logits.shape)} must be [batch, classes]")
    rng = rng or _generator(attrs)
    n = attrs.get("sample_size", 1)
    x = logits.astype(np.float64)
    w = np.exp(x - x.max(axis=1, keepdims=True))
    cdf = np.cumsum(w, axis=1)
    u = rng.random((x.shape[0], n)) * cdf[:, -1:]
    picks = np.array([np.searchsorted(c, row, side="right") for c, row in zip(cdf, u)],
                     dtype=np.int64).reshape(x.shape[0], n)
    picks = np.minimum(picks, max(x.shape[1] - 1, 0))  # u == total by rounding
    return picks.astype(_float_type({"dtype": attrs.get("dtype", 6)}))


# Types from the attributes and input types: no kernel runs (and draws) for a type.


def _like_types(node, types):
    t = _float_type(node.attrs, types[0].dtype)
    return [TensorType(str(t), types[0].shape)]


def _shape_types(node, types):
    if any(d < 0 for d in node.attrs["shape"]):
        raise NodeError(node, f"shape {node.attrs['shape']} has a negative size")
    return [TensorType(str(_float_type(node.attrs)), tuple(node.attrs["shape"]))]


def _multinomial_types(node, types):
    x = types[0]
    if len(x.shape) != 2:
        raise NodeError(node, f"input {x} must be [batch, classes]")
    dtype = _float_type({"dtype": node.attrs.get("dtype", 6)})
    return [TensorType(str(dtype), (x.shape[0], node.attrs.get("sample_size", 1)))]


KERNELS = {
    "RandomNormal": random_normal, "RandomUniform": random_uniform,
    "RandomNormalLike": random_normal_like, "RandomUniformLike": random_uniform_like,
    "Bernoulli": bernoulli, "Multinomial": multinomial,
}

SHAPE_RULES = {"RandomNormal": _shape_types, "RandomUniform": _shape_types,
               "RandomNormalLike": _like_types, "RandomUniformLike": _like_types,
               "Bernoulli": _like_types, "Multinomial": _multinomial_types}
