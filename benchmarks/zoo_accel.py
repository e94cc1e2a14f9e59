"""`celosia bench zoo --accel`: per model, the int8 build on the accelerator.

The quantized graph is the one `--int8` measures (zoo_int8.py: six calibration feeds, the
test feed of seed 100); it is built for the default configuration (runtime/accel.py
``AccelModel.build``: partition, schedule search, programs in DRAM), run once on the cycle
model and compared bit for bit with the int8 CPU build of the same graph. Fields:

- ``ok_accel``: the build runs on the cycle model and its outputs are identical to the
  int8 CPU build's (``accel_error`` otherwise: the one-line error, the outputs that
  differ, or the time limit that stopped it).
- ``accel_mac_share``: the model's real multiply-adds (``zoo_int8.node_macs`` on the
  graph: no channel padding, no padded GEMM work, each multiply-add once however many
  int8 passes it takes; inside Loop/Scan/If bodies per run, ``zoo_int8.body_parts``) in
  nodes placed on the accelerator over all of them; ``accel_cpu_macs`` splits the rest by the
  reason its nodes stay on the CPU (numbers in a reason written N, so that depthwise
  convolutions of every width are one entry).
- ``cpu_accel_transitions``: values that cross per inference (packed into DRAM for the
  accelerator, or read back and unpacked for the CPU; ``AccelModel.summary``'s crossings).
- ``layout_share``: packing and unpacking at region borders over the latency (accelerator
  time at the configured clock + CPU time + layout time, all of one run).
- ``utilization``: the accelerator's real multiply-adds (the model's own) over cycles x
  MACs per cycle, and ``padding_overhead``: the GEMM core's multiply-adds on padding
  (channels padded to BLOCK, rows to BATCH groups) relative to the real ones
  (compiler/graph/macs.py; ``AccelModel.summary``).
- ``accel_cycles``, ``accel_latency_ms``, ``accel_build_s`` and ``accel_sim_wall_s`` (the
  wall seconds of the run on the cycle model).

The time figures (latency, layout share) are of a second, warm run when the first took
under 10 s: a first run's CPU and layout times include one-time costs.

A model gets ``time_limit`` seconds for its build and run together: the build and the run
report each layer and node they finish, and past the limit the next report stops the model,
which is recorded with what it was doing (a single node can overrun the limit by its own
time). Placement fields are kept when the build finished.
"""

from __future__ import annotations

import re
import time

from celosia.compiler.accel.recurrent import WIDE_BODY_OPS
from celosia.errors import CelosiaError

from .zoo_int8 import body_parts, node_macs

DEFAULT_TIME_LIMIT_S = 600.0
_REASONS_KEPT = 8
# Models whose run on the cycle model takes less than this run a second time, warm, for the
# time figures (latency, layout_share); cycles and crossings are the same in every run.
_WARM_RUN_UNDER_S = 10.0  # accel_cpu_macs: the reasons with the most multiply-adds


class _OverTime(Exception):
    """Raised from a progress report once a model's time limit has passed."""


def placement_record(model) -> dict:
    """The fields that need only the build: MAC share, nodes, where the CPU's MACs are."""
    graph, places = model.graph, model.placements
    total = accel = 0
    by_reason: dict[str, int] = {}
    for node in graph.nodes:
        # a control-flow node's multiply-adds are its bodies' nodes': on the accelerator
        # those with integer products (when the node is), the others with their reasons
        parts = body_parts(node, graph.types, graph.initializers)
        if parts:
            on_accel = places[node.name].target == "accel"
            items = [(m, on_accel and n.op in WIDE_BODY_OPS,
                      f"{p} ({n.op}) inside {node.op} {node.name!r}: " +
                      (n.attrs.get("float_reason") or places[node.name].reason))
                     for m, n, p in parts]
        else:
            items = [(node_macs(node, graph.types), places[node.name].target == "accel",
                      places[node.name].reason)]
        for m, on, why in items:
            total += m
            if on:
                accel += m
            elif m:  # numbers as N: "depthwise convolution (groups=N)" is one reason
                reason = re.sub(r"(?<![A-Za-z0-9])\d+", "N", why)
                by_reason[reason] = by_reason.get(reason, 0) + m
    top = sorted(by_reason.items(), key=lambda kv: -kv[1])[:_REASONS_KEPT]
    return {"accel_mac_share": accel / total if total else 0.0, "macs": total,
            "accel_macs": accel, "accel_nodes": len(model.programs),
            "cpu_nodes": len(graph.nodes) - len(model.programs),
            "accel_cpu_macs": {reason: m / total for reason, m in top}}


def measure(qgraph, feeds: dict, cpu_outputs: dict, *,
            time_limit: float = DEFAULT_TIME_LIMIT_S) -> dict:
    """The accelerator record of one quantized model (module doc); errors are results."""
    from celosia.runtime.accel import AccelModel, compare_outputs

    start = time.perf_counter()
    doing = {"stage": "build", "last": "starting"}

    def progress(line: str) -> None:
        doing["last"] = line
        if time.perf_counter() - start > time_limit:
            raise _OverTime()

    record: dict = {"ok_accel": False}
    try:
        model = AccelModel.build(qgraph, "default", progress=progress)
        record["accel_build_s"] = time.perf_counter() - start
        record.update(placement_record(model))
        doing["stage"] = "cycle-model run"
        t0 = time.perf_counter()
        got = model.run(feeds, target="cycle", progress=progress)
        record["accel_sim_wall_s"] = time.perf_counter() - t0
    except _OverTime:
        record["accel_error"] = (f"over the time limit of {time_limit:g} s in the "
                                 f"{doing['stage']}, after: {doing['last'][:120]}")
        return record
    except CelosiaError as e:
        record["accel_error"] = f"{type(e).__name__}: {e}"
        return record
    except Exception as e:  # a bug in celosia, kept as a result
        record["accel_error"] = f"internal error (a bug): {type(e).__name__}: {e}"
        return record
    same, detail = compare_outputs(got, cpu_outputs, exact=True)
    s = model.summary()
    if record["accel_sim_wall_s"] < _WARM_RUN_UNDER_S:
        # The first run's CPU and layout times include one-time costs (first calls into
        # each compiled segment) that can be several times a small model's latency.
        model.run(feeds, target="cycle")
        s = model.summary()
    cycles = s["cycles"] or 0
    record.update({
        "ok_accel": same, "accel_cycles": cycles, "accel_latency_ms": s["latency_ms"],
        "cpu_accel_transitions": s["crossings"], "layout_share": s["layout_share"],
        "utilization": s["utilization"] or 0.0, "padding_overhead": s["padding_overhead"],
    })
    if not same:
        record["accel_error"] = f"differs from the int8 CPU build: {detail['summary']}"
    return record


def totals(results: dict) -> dict:
    """How many models run on the accelerator bit-exact, the worst MAC share and layout
    share over them, and the longest simulation."""
    rs = [r for r in results.values() if "ok_accel" in r]
    ok = [r for r in rs if r["ok_accel"]]
    out = {"models_ok_accel": len(ok)}
    shares = [r["accel_mac_share"] for r in rs if "accel_mac_share" in r]
    if shares:
        out["accel_mac_share_min"] = float(min(shares))
    if ok:
        out["layout_share_max"] = float(max(r["layout_share"] for r in ok))
        out["accel_sim_wall_s_max"] = float(max(r["accel_sim_wall_s"] for r in ok))
    return out
