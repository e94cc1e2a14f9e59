"""Targets as plug-ins: one registry for the code generators a model is partitioned between.

A *target* says which graph nodes it takes (``supports``: None, or the reason it does not),
compiles a partition of consecutive nodes it took into a module (``build``), and reloads
such a module from a saved model (``load``). A module runs on host arrays (``run``) and
serializes itself (``to_bytes``). This is the Bring-Your-Own-Codegen contract of TVM in
celosia's terms::

    from celosia.runtime.targets import Target, register_target

    class MyTarget(Target):
        name = "mychip"
        def supports(self, node, graph, config):
            return None if node.op == "Relu" else f"{node.op}: mychip runs Relu only"
        def build(self, graph):           # graph: a partition, a Graph of its own
            return MyModule(...)          # .run(feeds) -> {output: array}, .to_bytes()
        def load(self, data):
            return MyModule.from_bytes(data)

    register_target(MyTarget())           # or, from a package: an entry point (below)
    AccelModel.build(qgraph, cfg, targets=("accel", "mychip", "cpu"))

**Registration.** Targets come from Python entry points in the group ``celosia.targets``
(``[project.entry-points."celosia.targets"] mychip = "mypkg:MyTarget"``: a Target subclass,
an instance, or a function returning one), read once, when a target is first looked up, and
from ``register_target`` calls. The built-in ``accel`` and ``cpu`` targets are registered
through the same entry points (celosia's own pyproject.toml), so ``available_targets()``
lists them beside any installed plug-in, and a plug-in cannot take either name.

**Partitioning** (``place``): ``targets`` is an order of preference, the CPU last (it takes
every node, so it is added when left out). A node goes to the first target that takes it.
The accelerator decides with the graph around each node (a pooling or view goes there only
when its input is made there: compiler/accel/partition.py ``annotate``), so a plug-in's
claims are settled first and the accelerator places the rest around them: a plug-in before
``accel`` in the order claims every node it takes; a plug-in after it claims nodes the
accelerator left on the CPU (not those the CPU computes in place on the accelerator's
packed layout, which belong to an accelerator region), and the accelerator places again
around those claims until nothing changes. A node no target takes stays on the CPU with
the accelerator's reason, and each plug-in's own reason is kept in ``refusals``.

**Running** (runtime/accel.py): each maximal run of consecutive nodes placed on one plug-in
becomes a partition (a Graph of those nodes, its inputs the values it reads from outside,
its outputs those read after it), built once by the target; at run time the partition's
inputs are brought to the host (read back from the accelerator's DRAM where it made them)
and its outputs stay on the host. A saved model (.cel) keeps each partition's bytes and the
target's name; loading it needs that target registered, or says which is missing.

Tensor intrinsics are registered in the same way in the group ``celosia.intrinsics``
(``register_intrinsic``): compiler/accel/intrin.py's TensorIntrinsic, named, for the
accelerator's tensorize to match against.
"""

from __future__ import annotations

import importlib.metadata
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import CelosiaError

__all__ = ["Target", "TargetError", "register_target", "unregister_target", "get_target",
           "available_targets", "place", "Placed", "BUILTIN", "ENTRY_POINT_GROUP",
           "CpuTarget", "AccelTarget", "check_outputs", "target_order", "plugin_errors"]

ENTRY_POINT_GROUP = "celosia.targets"
BUILTIN = ("accel", "cpu")


class TargetError(CelosiaError):
    """A target that is unknown, badly registered, or that broke its contract."""


@contextmanager
def plugin_errors(message: str):
    """Inside the block, anything but a TargetError that a plug-in raises becomes one:
    ``message``, then what it raised."""
    try:
        yield
    except TargetError:
        raise
    except Exception as e:
        raise TargetError(f"{message}: {type(e).__name__}: {e}") from e


class Target:
    """A code generator for the nodes it takes (module doc). Subclasses set ``name`` (a short
    identifier) and implement ``supports``, ``build`` and ``load``."""

    name: str = ""
    description: str = ""

    def supports(self, node, graph, config) -> str | None:
        """None when this target runs ``node`` (of ``graph``, for the HwConfig ``config``),
        else the reason it does not (shown to the user)."""
        raise NotImplementedError

    def build(self, graph):
        """Compile a partition (a Graph of nodes this target took) into a module with
        ``run(feeds: dict) -> dict`` and ``to_bytes() -> bytes``."""
        raise NotImplementedError

    def load(self, data: bytes):
        """The module ``build`` made, from its ``to_bytes()``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<target {self.name!r}>"


class CpuTarget(Target):
    """The host CPU: every node, compiled with LLVM (runtime/cpu.py)."""

    name = "cpu"
    description = "the host CPU: every operator, LLVM-compiled kernels (runtime/cpu.py)"

    def supports(self, node, graph, config) -> str | None:
        return None

    def build(self, graph):
        from .cpu import CpuModel

        return CpuModel.from_graph(graph)

    def load(self, data: bytes):
        from .cpu import CpuModel

        return CpuModel.load(data)


class AccelTarget(Target):
    """The configured accelerator: int8 convolutions, dense layers, products, pooling and
    element-wise nodes (compiler/accel/partition.py). Its partitions are the accelerator
    regions of an AccelModel, built and run by runtime/accel.py itself."""

    name = "accel"
    description = ("the configured accelerator: int8 conv/dense/matmul with fused epilogues, "
                   "pooling and element-wise nodes on the ALU (compiler/accel/partition.py)")

    def supports(self, node, graph, config) -> str | None:
        from ..compiler.accel.partition import annotate

        # The node in the graph around it, as the partitioner places it.
        placement = annotate(graph, config)[node.name]
        return None if placement.target == "accel" else placement.reason

    def build(self, graph):
        raise TargetError("the accelerator's partitions are built by AccelModel.build "
                          "(runtime/accel.py), not one by one")

    def load(self, data: bytes):
        raise TargetError("the accelerator's partitions are loaded with their AccelModel")


# ---- the registry ----------------------------------------------------------------------------

_lock = threading.RLock()
_registered: dict[str, Target] = {}
_origins: dict[str, str] = {}  # name -> where it came from ("entry point X of dist Y", ...)
_broken: dict[str, str] = {}   # entry point name -> why it could not be registered
_loaded = False


def _as_target(obj, where: str) -> Target:
    if isinstance(obj, type) and issubclass(obj, Target):
        obj = obj()
    elif callable(obj) and not isinstance(obj, Target):
        obj = obj()
    if not isinstance(obj, Target):
        raise TargetError(f"{where} gives {obj!r}, not a celosia.runtime.targets.Target "
                          f"(subclass it, or return an instance)")
    name = getattr(obj, "name", "")
    if not isinstance(name, str) or not name.isidentifier():
        raise TargetError(f"{where}: the target's name {name!r} is not an identifier: set "
                          f"the class attribute `name`")
    for method in ("supports", "build", "load"):
        if getattr(type(obj), method) is getattr(Target, method):
            raise TargetError(f"{where}: target {name!r} does not implement {method}()")
    return obj


def _load_entry_points() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(ep, "dist", None)
            where = (f"entry point {ep.name!r} = {ep.value!r} of "
                     f"{dist.name if dist is not None else 'an unknown distribution'}")
            if ep.name in BUILTIN and not ep.value.startswith(__name__ + ":"):
                _broken[f"{ep.name} ({where})"] = (f"{where} registers {ep.name!r}, a "
                                                   f"built-in target's name, and was ignored")
                continue
            try:
                obj = ep.load()
            except Exception as e:  # a broken plug-in must not break celosia
                _broken[ep.name] = f"{where} failed to import: {type(e).__name__}: {e}"
                continue
            try:
                target = _as_target(obj, where)
            except TargetError as e:
                _broken[ep.name] = str(e)
                continue
            if target.name != ep.name:
                _broken[ep.name] = (f"{where} names its target {target.name!r}: the entry "
                                    f"point's name must be the target's")
                continue
            if target.name in _registered and _origins[target.name] != where:
                _broken[ep.name] = (f"{where} and {_origins[target.name]} both register "
                                    f"{target.name!r}; the first was kept")
                continue
            _registered[target.name] = target
            _origins[target.name] = where
        for name, cls in (("accel", AccelTarget), ("cpu", CpuTarget)):
            if name not in _registered:  # (an install without its entry points' metadata)
                _registered[name] = cls()
                _origins[name] = "built in"


def register_target(target, *, replace: bool = False) -> Target:
    """Register a target (a Target instance or subclass) in this process; returns it."""
    _load_entry_points()
    target = _as_target(target, "register_target")
    with _lock:
        if target.name in BUILTIN:
            raise TargetError(f"{target.name!r} is a built-in target: give yours another name")
        if target.name in _registered and not replace:
            raise TargetError(f"a target named {target.name!r} is registered already "
                              f"({_origins[target.name]}): pass replace=True to replace it")
        _registered[target.name] = target
        _origins[target.name] = "register_target"
        _broken.pop(target.name, None)
    return target


def unregister_target(name: str) -> None:
    """Remove a target registered with ``register_target`` (not a built-in one)."""
    with _lock:
        if name in BUILTIN:
            raise TargetError(f"{name!r} is a built-in target and stays registered")
        _registered.pop(name, None)
        _origins.pop(name, None)


def get_target(name: str) -> Target:
    """The registered target called ``name``; an error naming what is registered (and why a
    plug-in of that name failed to load) otherwise."""
    _load_entry_points()
    with _lock:
        if name in _registered:
            return _registered[name]
        if name in _broken:
            raise TargetError(f"target {name!r} could not be loaded: {_broken[name]}")
        raise TargetError(
            f"no target named {name!r}: registered are {', '.join(sorted(_registered))}. "
            f"Install the package that provides it (an entry point in the group "
            f"{ENTRY_POINT_GROUP!r}) or call celosia.runtime.targets.register_target")


def available_targets() -> list[dict]:
    """Every registered target: name, description, origin; and plug-ins that failed to
    load, with the reason (``error``)."""
    _load_entry_points()
    with _lock:
        rows = [{"name": n, "description": t.description, "origin": _origins[n]}
                for n, t in sorted(_registered.items())]
        rows += [{"name": n, "description": "", "origin": "", "error": why}
                 for n, why in sorted(_broken.items()) if n not in _registered]
    return rows


def _reset_for_tests() -> None:
    """Forget every registration (the entry points are read again on the next lookup)."""
    global _loaded
    with _lock:
        _registered.clear()
        _origins.clear()
        _broken.clear()
        _loaded = False


# ---- partitioning ----------------------------------------------------------------------------

@dataclass
class Placed:
    """``place``'s answer: a Placement per node, and each plug-in's reasons for the nodes it
    did not take (node -> {target: reason})."""

    placements: dict
    refusals: dict = field(default_factory=dict)


def target_order(targets) -> tuple[str, ...]:
    if isinstance(targets, str):
        targets = [t for t in targets.split(",") if t]
    order = tuple(dict.fromkeys(str(t).strip() for t in targets))
    if not order:
        raise TargetError("no targets given: name at least one, e.g. accel,cpu")
    for name in order:
        get_target(name)
    if order[-1] != "cpu":
        order = tuple(t for t in order if t != "cpu") + ("cpu",)
    return order


def place(graph, config, targets=BUILTIN, *, annotate=None) -> Placed:
    """Each node to the first target of ``targets`` that takes it (module doc)."""
    from ..compiler.accel.partition import Placement, annotate as accel_annotate
    from ..compiler.accel.partition import packed_nodes

    annotate = annotate or accel_annotate
    order = target_order(targets)
    accelerate = "accel" in order
    plugins = [get_target(t) for t in order if t not in BUILTIN]
    # without the accelerator, every plug-in claims before the (all-CPU) rest
    before = [t for t in plugins if order.index(t.name) < order.index("accel")] \
        if accelerate else plugins
    after = [t for t in plugins if t not in before]
    refusals: dict[str, dict[str, str]] = {}
    answers: dict[tuple[str, str], str | None] = {}

    def asks(target, node):
        key = (target.name, node.name)
        if key not in answers:
            with plugin_errors(f"target {target.name!r} failed deciding on node "
                               f"{node.name!r} ({node.op})"):
                why = target.supports(node, graph, config)
            if why is not None and not isinstance(why, str):
                raise TargetError(f"target {target.name!r}: supports() of node {node.name!r} "
                                  f"returned {why!r}; return None (it takes the node) or a "
                                  f"reason (str)")
            answers[key] = why
            if why is not None:
                refusals.setdefault(node.name, {})[target.name] = why
        return answers[key] is None

    claimed: dict[str, object] = {}
    for node in graph.nodes:
        for t in before:
            if asks(t, node):
                claimed[node.name] = Placement(t.name, f"taken by target {t.name!r}")
                break
    if not accelerate:
        out = {n.name: claimed.get(n.name) or Placement("cpu", "all-CPU build")
               for n in graph.nodes}
        return Placed(out, refusals)
    out = annotate(graph, config, claimed=claimed)
    for _ in range(len(graph.nodes) + 1):
        if not after:
            break
        packed = packed_nodes(graph, out)
        more = {}
        for node in graph.nodes:
            if out[node.name].target != "cpu" or node.name in packed:
                continue
            for t in after:
                if asks(t, node):
                    more[node.name] = Placement(t.name, f"taken by target {t.name!r} (the "
                                                        f"accelerator: {out[node.name].reason})")
                    break
        if not more:
            break
        claimed.update(more)
        out = annotate(graph, config, claimed=claimed)
    return Placed(out, refusals)


def check_outputs(target: str, names, wanted, results) -> dict:
    """A module's results, checked against the partition's outputs (names and types)."""
    import numpy as np

    if not isinstance(results, dict):
        raise TargetError(f"target {target!r}: its module for nodes {names[0]!r}.. returned "
                          f"{type(results).__name__}, not a dict of outputs")
    out = {}
    for v, t in wanted.items():
        if v not in results:
            raise TargetError(f"target {target!r}: its module for nodes {names[0]!r}.. did not "
                              f"return output {v!r}")
        a = np.asarray(results[v])
        if tuple(a.shape) != tuple(t.shape) or str(a.dtype) != t.dtype:
            raise TargetError(f"target {target!r}: its module for nodes {names[0]!r}.. returned "
                              f"{v!r} as {a.dtype}{list(a.shape)}, the graph says {t}")
        out[v] = a
    return out
