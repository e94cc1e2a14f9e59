"""The sweep specification (a TOML file, docs/sweep.md): the space of hardware
configurations, the workloads, the objectives and constraints, and the search.

Everything is checked before any work starts: an unknown table or key, a field HwConfig does
not have, a value HwConfig's own validation rejects (each value is tried on the base
configuration), an empty range or space, an unknown workload, part or search method. The
error names the key (``space.log_block[2]``) and the reason.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from celosia.config import ConfigError, HwConfig

from .errors import SpecError

__all__ = ["SpecError", "Spec", "load_spec", "parse_spec", "config_hash", "METRICS"]




_FIELDS = {f.name: f for f in fields(HwConfig)}
# Metrics a row carries that objectives and constraints may name (smaller is better unless
# listed in _MAXIMIZE).
METRICS = ("latency_ms", "cycles", "throughput_gops", "utilization", "dram_bytes", "lut", "ff",
           "bram", "dsp", "fmax_mhz")
_MAXIMIZE = {"throughput_gops", "utilization", "fmax_mhz"}
_AREA = ("lut", "dsp", "bram", "ff")
_TABLES = {"space", "base", "workloads", "objectives", "constraints", "search"}
_CONSTRAINTS = {"part", "fits", "max_latency_ms", "max_cycles", "max_lut", "max_ff", "max_bram",
                "max_dsp", "min_utilization", "min_throughput_gops", "min_fmax_mhz",
                "max_dram_bytes"}


def config_hash(cfg: HwConfig) -> str:
    text = json.dumps(cfg.to_dict(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Spec:
    base: HwConfig
    space: dict  # field -> list of values (in the order given)
    workloads: list  # celosia.sweep.workloads.Workload
    objectives: list = field(default_factory=lambda: ["latency_ms", "lut"])
    area: str = "lut"
    constraints: dict = field(default_factory=dict)
    part: str = "xc7z020"
    method: str = "grid"
    n: int | None = None
    seed: int = 0
    text: str = ""  # the TOML as read (kept in DIR to check --resume)

    @property
    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.space.values())

    def configs(self) -> list[dict]:
        """The configurations the search visits, as {field: value} over the space's fields
        (grid: all, in order; random: ``n`` distinct ones drawn with ``seed``). The optuna
        method asks for its configurations batch by batch instead (search.py)."""
        names = list(self.space)
        if self.method == "grid":
            return [dict(zip(names, values))
                    for values in itertools.product(*(self.space[k] for k in names))]
        import numpy as np

        total = self.grid_size
        n = min(self.n, total)
        rng = np.random.default_rng(self.seed)
        if total <= 1 << 20:
            picks = sorted(rng.choice(total, size=n, replace=False).tolist())
        else:  # a huge grid: draw indices until n distinct ones
            seen: set = set()
            while len(seen) < n:
                seen.add(int(rng.integers(total)))
            picks = sorted(seen)
        out = []
        for index in picks:
            point = {}
            for k in reversed(names):
                index, i = divmod(index, len(self.space[k]))
                point[k] = self.space[k][i]
            out.append({k: point[k] for k in names})
        return out

    def config_of(self, point: dict) -> HwConfig:
        """The HwConfig of a point (raises ConfigError for a combination the ISA cannot
        encode: the sweep records it as a row with that reason)."""
        return replace(self.base, **point)


def load_spec(path: str | Path) -> Spec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read sweep spec {path}: {exc.strerror}") from None
    return parse_spec(text, source=str(path), root=path.parent)


def parse_spec(text: str, *, source: str = "spec", root: Path | None = None) -> Spec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not valid TOML ({exc})") from None
    unknown = set(data) - _TABLES
    if unknown:
        raise SpecError(f"{source}: unknown table {sorted(unknown)[0]!r}; tables are "
                        f"{', '.join(sorted(_TABLES))}")
    for name in _TABLES & set(data):
        if not isinstance(data[name], dict):
            raise SpecError(f"{source}: {name} must be a table ([{name}]), not "
                            f"{type(data[name]).__name__}")
    base = _base(data.get("base", {}), source)
    space = _space(data.get("space", {}), base, source)
    from .workloads import parse_workloads

    workloads = parse_workloads(data.get("workloads", {}), source, root or Path.cwd())
    spec = Spec(base=base, space=space, workloads=workloads, text=text)
    _objectives(spec, data.get("objectives", {}), source)
    _constraints(spec, data.get("constraints", {}), source)
    _search(spec, data.get("search", {}), source)
    return spec


def _base(table: dict, source: str) -> HwConfig:
    table = dict(table)
    preset = table.pop("preset", "default")
    try:
        cfg = HwConfig.preset(preset)
    except ConfigError as exc:
        raise SpecError(f"{source}: base.preset: {exc}") from None
    for key, value in table.items():
        if key not in _FIELDS:
            raise SpecError(f"{source}: base.{key}: unknown key; HwConfig's fields are "
                            f"{', '.join(_FIELDS)} (and preset)")
        try:
            cfg = replace(cfg, **{key: value})
        except ConfigError as exc:
            raise SpecError(f"{source}: base.{key} = {value!r}: {exc}") from None
    return cfg


def _range(key: str, r: dict, is_float: bool, source: str) -> list:
    allowed = {"start", "stop", "step", "factor"}
    extra = set(r) - allowed
    if extra:
        raise SpecError(f"{source}: space.{key}: unknown range key {sorted(extra)[0]!r}; a range "
                        f"is {{start, stop, step}} or {{start, stop, factor}} (stop included)")
    if "start" not in r or "stop" not in r:
        raise SpecError(f"{source}: space.{key}: a range needs start and stop")
    if "step" in r and "factor" in r:
        raise SpecError(f"{source}: space.{key}: give step or factor, not both")
    start, stop = r["start"], r["stop"]
    num = (int, float) if is_float else (int,)
    for name in ("start", "stop", "step", "factor"):
        v = r.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, num)):
            raise SpecError(f"{source}: space.{key}.{name} must be "
                            f"{'a number' if is_float else 'an integer'}, not {v!r}")
    values = []
    if "factor" in r:
        factor = r["factor"]
        if factor <= 1 or start <= 0:
            raise SpecError(f"{source}: space.{key}: factor must be > 1 and start > 0 "
                            f"(factor {factor}, start {start})")
        v = start
        while v <= stop:
            values.append(v)
            v = v * factor
    else:
        step = r.get("step", 1)
        if step <= 0:
            raise SpecError(f"{source}: space.{key}.step must be positive, not {step}")
        v = start
        while v <= stop + (1e-9 if is_float else 0):
            values.append(v)
            v = v + step
    if not values:
        raise SpecError(f"{source}: space.{key}: the range from {start} to {stop} is empty "
                        f"(stop is included; start must not exceed it)")
    return values


def _space(table: dict, base: HwConfig, source: str) -> dict:
    space = {}
    for key, value in table.items():
        if key not in _FIELDS:
            raise SpecError(f"{source}: space.{key}: unknown key; HwConfig's fields are "
                            f"{', '.join(_FIELDS)}")
        is_float = key == "clock_mhz"
        if isinstance(value, dict):
            values = _range(key, value, is_float, source)
        elif isinstance(value, list):
            values = value
        else:
            values = [value]
        if not values:
            raise SpecError(f"{source}: space.{key}: an empty list; give at least one value")
        seen = []
        for i, v in enumerate(values):
            if v in seen:
                raise SpecError(f"{source}: space.{key}[{i}] = {v!r} is listed twice")
            seen.append(v)
        space[key] = values
    # HwConfig's own validation: a value is rejected when no configuration of the space
    # that has it is valid (the base's error is the reason); a combination that is invalid
    # while each of its values is valid somewhere becomes a row with its reason.
    for key, values in space.items():
        others = [k for k in space if k != key]
        for i, v in enumerate(values):
            try:
                replace(base, **{key: v})
                continue
            except ConfigError as exc:
                error = exc
            except TypeError as exc:
                raise SpecError(f"{source}: space.{key}[{i}] = {v!r}: {exc}") from None
            combos = itertools.islice(itertools.product(*(space[k] for k in others)), 100_000)
            if not any(_valid(base, {key: v, **dict(zip(others, c))}) for c in combos):
                raise SpecError(f"{source}: space.{key}[{i}] = {v!r}: {error}" +
                                (" (with every combination of the other fields of the space)"
                                 if others else "")) from None
    return space


def _valid(base: HwConfig, point: dict) -> bool:
    try:
        replace(base, **point)
        return True
    except ConfigError:
        return False


def _objectives(spec: Spec, table: dict, source: str) -> None:
    extra = set(table) - {"minimize", "maximize", "area"}
    if extra:
        raise SpecError(f"{source}: objectives.{sorted(extra)[0]}: unknown key; keys are "
                        f"minimize, maximize, area")
    objectives = []
    for kind in ("minimize", "maximize"):
        names = table.get(kind, [])
        if isinstance(names, str):
            names = [names]
        for name in names:
            if name not in METRICS:
                raise SpecError(f"{source}: objectives.{kind}: unknown metric {name!r}; "
                                f"metrics are {', '.join(METRICS)}")
            if (name in _MAXIMIZE) != (kind == "maximize"):
                raise SpecError(f"{source}: objectives.{kind}: {name} is to be "
                                f"{'maximized' if name in _MAXIMIZE else 'minimized'}")
            objectives.append(name)
    if objectives:
        spec.objectives = objectives
    area = table.get("area", "lut")
    if area not in _AREA:
        raise SpecError(f"{source}: objectives.area: {area!r} is not an area measure; use one "
                        f"of {', '.join(_AREA)}")
    spec.area = area


def _constraints(spec: Spec, table: dict, source: str) -> None:
    from celosia.fpga.synth import SynthError, part

    for key, value in table.items():
        if key not in _CONSTRAINTS:
            raise SpecError(f"{source}: constraints.{key}: unknown key; keys are "
                            f"{', '.join(sorted(_CONSTRAINTS))}")
        if key == "part":
            try:
                spec.part = part(value).name
            except SynthError as exc:
                raise SpecError(f"{source}: constraints.part: {exc}") from None
        elif key == "fits":
            if not isinstance(value, bool):
                raise SpecError(f"{source}: constraints.fits must be true or false")
            spec.constraints[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise SpecError(f"{source}: constraints.{key} must be a non-negative number, "
                                f"not {value!r}")
            spec.constraints[key] = value
    spec.constraints.setdefault("fits", True)


def _search(spec: Spec, table: dict, source: str) -> None:
    extra = set(table) - {"method", "n", "seed"}
    if extra:
        raise SpecError(f"{source}: search.{sorted(extra)[0]}: unknown key; keys are method, "
                        f"n, seed")
    method = table.get("method", "grid")
    if method not in ("grid", "random", "optuna"):
        raise SpecError(f"{source}: search.method: {method!r}; methods are grid, random, "
                        f"optuna")
    spec.method = method
    n = table.get("n")
    if method != "grid":
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SpecError(f"{source}: search.n: method {method} needs n, the number of "
                            f"configurations to evaluate (a positive integer), not {n!r}")
        spec.n = n
    elif n is not None:
        raise SpecError(f"{source}: search.n: the grid visits every configuration; n goes "
                        f"with method = \"random\" or \"optuna\"")
    seed = table.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SpecError(f"{source}: search.seed must be an integer, not {seed!r}")
    spec.seed = seed
    if method == "optuna":
        import importlib.util

        if importlib.util.find_spec("optuna") is None:
            raise SpecError(f"{source}: search.method = \"optuna\" needs the optuna package: "
                            f"pip install 'celosia[sweep]' (or use grid or random)")
