"""Export plain-torch modules to ONNX the way users' models arrive, and cache the files.

Real models come from PyTorch's legacy (TorchScript) exporter at opset 17, some with a
dynamic batch axis; :func:`export` does exactly that. Exporting takes a second or more per
model (and importing torch a few), so :func:`cached` keeps each file under
``$CELOSIA_CACHE/models`` (default ``~/.cache/celosia/models``), keyed by the builder, its
arguments, the torch and onnx versions and the source of the modules that define the
architecture and the export: editing a builder makes a new file rather than reusing a
stale one.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import tempfile
import warnings
from pathlib import Path

from .zoo import IR_VERSION, OPSET

__all__ = ["export", "cached", "cache_dir", "calibrate_batchnorm", "torch_version"]


def cache_dir() -> Path:
    root = os.environ.get("CELOSIA_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "celosia") / "models"


def _key(builder, args: dict, extra: dict, uses: tuple) -> str:
    # The exporter's settings (this module), the builder's module and any other module
    # that defines part of the architecture.
    modules = [inspect.getmodule(_key), inspect.getmodule(builder), *uses]
    source = "".join(inspect.getsource(m) for m in modules)
    record = {"builder": f"{builder.__module__}.{builder.__qualname__}", "args": args,
              "source": hashlib.sha256(source.encode()).hexdigest(), **extra}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def torch_version() -> str | None:
    """The installed torch's version, read without importing torch (seconds saved on every
    cache hit)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def cached(builder, args: dict, make, uses: tuple = ()):
    """The ONNX model ``make()`` returns, from the cache when it was made before with the
    same builder, arguments, sources and versions of torch and onnx. ``make`` returns a
    ModelProto; ``uses``: further modules whose source the model depends on."""
    import onnx

    versions = {"onnx": onnx.__version__, "torch": torch_version()}
    name = builder.__name__
    path = cache_dir() / f"{name}-{_key(builder, args, versions, uses)[:20]}.onnx"
    if path.exists():
        try:
            return onnx.load(str(path))
        except Exception:  # a file cut short by a crash elsewhere: make it again
            pass
    model = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside and renamed: parallel test processes never read half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(model.SerializeToString())
    os.replace(tmp, path)
    return model


def export(module, example_inputs: tuple, input_names: list[str], output_names: list[str],
           dynamic_axes: dict | None = None):
    """``module`` (eval mode) through torch.onnx.export(dynamo=False, opset 17), as a
    ModelProto with an IR version onnxruntime 1.3x loads."""
    import onnx
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        # The legacy exporter warns that it is deprecated, and about tracing Python
        # conditions on sizes; both are what users' exports see too.
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), example_inputs, buf, dynamo=False,
                          opset_version=OPSET, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes,
                          do_constant_folding=True)
    model = onnx.load_from_string(buf.getvalue())
    model.ir_version = min(model.ir_version, IR_VERSION)
    return model


def calibrate_batchnorm(module, make_input, passes: int = 4):
    """Give every BatchNorm the statistics of the activations it sees: a few forward passes
    in training mode, averaged (momentum None) rather than 10% steps from identity. Random
    weights with identity statistics make deep networks' outputs vanish or blow up, and then
    comparing outputs means little."""
    import torch

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    module.train()
    with torch.no_grad():
        for _ in range(passes):
            module(*make_input())
    for m in norms:
        m.momentum = 0.1
    return module.eval()
