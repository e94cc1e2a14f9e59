"""The model-based search of `celosia sweep` (``[search] method = "optuna"``, ``n``,
``seed``): Optuna's TPE sampler, multi-objective (latency summed over the workloads, and
the area measure), asks for ``workers`` configurations at a time, the engine evaluates
their points, and every trial is told its result in the order it was asked, so a seeded
search visits the same configurations on either engine and on ``--resume`` (points already
in DIR are read, not evaluated again).

Why Optuna rather than a search of our own: TPE handles categorical spaces like these
(each field a list of values) and multi-objective studies out of the box, its ask/tell
interface lets the sweep's own engines run the points (no second scheduler, unlike Ray
Tune), and it is one pure-Python wheel. ``n`` counts trials: TPE may propose a
configuration it has seen, which costs nothing (its rows are in DIR) but uses a trial.
A configuration that is invalid, does not fit, fails to compile or breaks a constraint is
a failed trial (TPE then avoids its neighbourhood).
"""

from __future__ import annotations

from celosia.errors import CelosiaError

__all__ = ["optuna_search"]


def _index(spec, point: dict) -> int:
    """The configuration's position in the grid (its config_index: rows sort as the grid)."""
    index = 0
    for k, values in spec.space.items():
        index = index * len(values) + values.index(point[k])
    return index


def optuna_search(spec, evaluate, workers: int) -> None:
    """``evaluate([(config index, point)])`` -> the rows of each point's workloads."""
    try:
        import optuna
    except ImportError:
        raise CelosiaError("search.method = \"optuna\" needs the optuna package: pip install "
                           "'celosia[sweep]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=min(10, spec.n))
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    nw = len(spec.workloads)
    asked = 0
    while asked < spec.n:
        batch = []
        for _ in range(min(max(1, workers), spec.n - asked)):
            trial = study.ask()
            point = {k: trial.suggest_categorical(k, values) for k, values in spec.space.items()}
            batch.append((trial, point))
            asked += 1
        rows = evaluate([(_index(spec, p), p) for _, p in batch])
        for i, (trial, _) in enumerate(batch):
            mine = rows[i * nw:(i + 1) * nw]
            if any(r is None for r in mine):  # not evaluated (--limit)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                return
            if all(r["feasible"] for r in mine):
                study.tell(trial, [sum(r["latency_ms"] for r in mine), mine[0][spec.area]])
            else:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
