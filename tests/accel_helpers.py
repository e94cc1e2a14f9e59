"""Helpers shared by the accelerator build's tests (tests/conftest.py puts this folder on
sys.path): crossings counted from a placement, and .cel manifests edited in place."""

from __future__ import annotations

import json
import zipfile


def crossings(graph, places) -> int:
    """Values that cross per inference, from the placement alone: a value an accelerator
    node reads from DRAM (partition.dram_reads) that the CPU (or the caller) makes, and a
    value made on the accelerator that a CPU node or the caller reads. A view on the
    accelerator (Reshape, Flatten, ...) is its input's bytes: reading it reads its root. A
    CPU node computed in place on the packed layout (partition.packed_nodes) reads and
    writes DRAM values where they are: no crossing."""
    from celosia.compiler.accel.partition import packed_nodes
    from celosia.compiler.accel.partition import ALIAS_OPS, dram_reads

    on_accel = {n.name for n in graph.nodes if places[n.name].target == "accel"}
    in_place = packed_nodes(graph, places) if on_accel else set()
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    made_on_accel = {n.outputs[0] for n in graph.nodes if n.name in on_accel | in_place}

    def root(v):
        while v in producer and producer[v].op in ALIAS_OPS and producer[v].name in on_accel:
            v = producer[v].inputs[0]
        return v

    packed, read = set(), set()
    for n in graph.nodes:
        if n.name in on_accel:
            packed |= {v for v in dram_reads(n) if v not in made_on_accel}
        elif n.name not in in_place:
            read |= {root(v) for v in n.inputs if v in made_on_accel}
    read |= {root(v) for v in made_on_accel & set(graph.outputs)}
    return len(packed) + len(read)


def edit_manifest(path, edit, out=None):
    """Write the .cel at ``path`` with its manifest changed by ``edit(doc)`` and its digest
    resealed to ``out`` (default: ``path`` itself); the path written."""
    from celosia.runtime.artifact import seal

    with zipfile.ZipFile(path) as z:
        table = {n: z.read(n) for n in z.namelist()}
    doc = json.loads(table["manifest.json"])
    edit(doc)
    table["manifest.json"] = json.dumps(doc).encode()
    table["manifest.sha256"] = seal(table["manifest.json"])
    out = path if out is None else out
    with zipfile.ZipFile(out, "w") as z:
        for n, d in table.items():
            z.writestr(n, d)
    return out


def sim_programs():
    """tests/sim/programs.py (the shared random program generator), imported once under its
    own name (tests/sim is not a package on sys.path)."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "celosia_test_sim_programs"
    if name not in sys.modules:
        path = Path(__file__).resolve().parent / "sim" / "programs.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def after_accel_conv(g, nodes, outputs, channels: int, rng):
    """``g``'s nodes ``nodes`` fed by a 1x1 int8 convolution (``first``: ``x0`` -> ``x``,
    ``channels`` in and out), so that their input ``x`` is made on the accelerator: the
    graph with input ``x0`` and ``outputs``."""
    import numpy as np

    from celosia.compiler.graph.ir import Graph, Node, TensorType, constant

    first = Node("QConv", ("x0", "w0", "b0", "m0"), ("x",),
                 dict(kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0],
                      dilations=[1, 1], group=1, shift=8, lo=-128, hi=127, scale=0.1), "first")
    inits = {**g.initializers,
             "w0": constant(rng.integers(-128, 128, (channels, channels, 1, 1), dtype=np.int8)),
             "b0": constant(np.zeros(channels, np.int32)),
             "m0": constant(np.ones(channels, np.int32))}
    types = {**g.types, "x0": g.types["x"],
             **{n: TensorType(str(np.asarray(inits[n]).dtype), np.asarray(inits[n]).shape)
                for n in ("w0", "b0", "m0")}}
    return Graph("g", ("x0",), tuple(outputs), (first, *nodes), inits, types)
