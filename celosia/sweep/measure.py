"""The compiler's schedule searches measuring their candidates on a sweep engine.

    from celosia.sweep.measure import through
    with through("ray", workers=4):            # or "local"; address= joins a cluster
        model = AccelModel.from_onnx(...)      # every conv and dense search inside

Each search (compiler/accel/tune.py ``search_cached``: conv, dense) measures its pool of
best-estimated candidates at once, one cycle-model run per worker, instead of one after
another; it then keeps the same candidate it would have kept (the fastest, the first in
rank order among equals), so the compiled model is the same. A measurement whose function
cannot be sent to a worker (not picklable) runs here, as before; a candidate whose worker
dies twice counts as one that does not compile.
"""

from __future__ import annotations

import contextlib
import os
import pickle

from celosia.errors import CompilerError

__all__ = ["through"]


def _measure_one(payload: dict) -> dict:
    try:
        return {"i": payload["i"], "stats": payload["fn"](payload["knobs"])}
    except CompilerError as exc:
        return {"i": payload["i"], "error": str(exc)}


@contextlib.contextmanager
def through(engine: str = "local", workers: int | None = None, address: str | None = None):
    from celosia.compiler.accel import tune

    from .run import _Session

    session = _Session(engine, workers or os.cpu_count() or 1, address)

    def mapper(measure, knobs_list):
        try:
            pickle.dumps(measure)
        except (pickle.PicklingError, AttributeError, TypeError):
            return None  # (search_cached measures in this process then)
        out: list = [None] * len(knobs_list)
        payloads = [{"i": i, "fn": measure, "knobs": k} for i, k in enumerate(knobs_list)]
        for payload, result, reason in session.run(_measure_one, payloads):
            i = payload["i"]
            if result is None:
                out[i] = CompilerError(f"the measurement of {payload['knobs']}: {reason}")
            elif "error" in result:
                out[i] = CompilerError(result["error"])
            else:
                out[i] = result["stats"]
        return out

    previous = tune.set_measure_map(mapper)
    try:
        yield session
    finally:
        tune.set_measure_map(previous)
        session.close()
