"""`celosia bench cpu-qops`: the int8 CPU build of the zoo's small EfficientNet and BERT with
the compiled q-op kernels (QLut, QAdd, QMul, QMatMul: compiler/cpu/kernels_q.py, lut.py)
against the same build with those ops as numpy steps (qops.py), in one run.

Protocol (issue #13's): ``quantize_model`` with six calibration feeds (the entry's
``make_feeds``, seeds 1..6), ``CpuModel.from_graph``, one test feed (seed 100). Both builds
are checked to compute the same outputs, then run alternately (the machine is shared: each
round runs one then the other) and the medians and best times are reported, with the
speedup of the medians. ``--quick`` (the tests) runs 5 rounds instead of 100.
"""

from __future__ import annotations

import time

import numpy as np

MODELS = ("efficientnet", "bert")
CALIBRATION_SEEDS = range(1, 7)
TEST_SEED = 100


def _quantized(name: str):
    from celosia.compiler.pipeline import quantize_model
    from celosia.models.registry import entry

    e = entry(name)
    feeds = [e.make_feeds("small", seed=s) for s in CALIBRATION_SEEDS]
    calib = {k: np.stack([f[k] for f in feeds]) for k in feeds[0]}
    shapes = {k: list(v.shape) for k, v in feeds[0].items()} if e.dynamic else None
    graph = quantize_model(e.model("small"), calib, input_shapes=shapes)
    return graph, e.make_feeds("small", seed=TEST_SEED)


def _builds(graph):
    """(numpy q-ops build, kernels build): the first lowered with lowering_q's handlers
    taken away, as the CPU build was before them."""
    from celosia.compiler.cpu import lowering_q
    from celosia.runtime.cpu import CpuModel

    saved = dict(lowering_q.HANDLERS)
    lowering_q.HANDLERS.clear()
    try:
        before = CpuModel.from_graph(graph)
    finally:
        lowering_q.HANDLERS.update(saved)
    return before, CpuModel.from_graph(graph)


def _measure(name: str, rounds: int) -> dict:
    graph, feeds = _quantized(name)
    builds = _builds(graph)
    outs = [b.run(feeds) for b in builds]
    same = all(np.array_equal(outs[0][k], outs[1][k]) for k in outs[0])
    times = ([], [])
    for _ in range(rounds):
        for b, t in zip(builds, times):
            start = time.perf_counter()
            b.run(feeds)
            t.append(time.perf_counter() - start)
    numpy_steps = [sorted({s["op"] for s in b.program.steps if s["kind"] == "numpy"})
                   for b in builds]
    med = [float(np.median(t)) * 1e3 for t in times]
    return {"q_ops": sorted({n.op for n in graph.nodes if n.op.startswith("Q")}),
            "numpy_ms": med[0], "kernels_ms": med[1], "speedup": med[0] / med[1],
            "numpy_best_ms": min(times[0]) * 1e3, "kernels_best_ms": min(times[1]) * 1e3,
            "same_outputs": same, "numpy_steps_before": numpy_steps[0],
            "numpy_steps_after": numpy_steps[1]}


def run(quick: bool = False) -> dict:
    rounds = 5 if quick else 100
    details = {name: _measure(name, rounds) for name in MODELS}
    metrics = {f"{name}_speedup": d["speedup"] for name, d in details.items()}
    metrics.update({f"{name}_kernels_ms": d["kernels_ms"] for name, d in details.items()})
    return {"metrics": metrics, "models": details, "rounds": rounds}
