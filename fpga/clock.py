"""Whether the clock a configuration claims has been met: the place-and-route results kept in
fpga/results/ (written by `celosia fpga synth --out fpga/results/NAME.json`).

Every latency celosia reports converts cycles at ``HwConfig.clock_mhz``, the clock the user
claims. ``clock_status`` says what place and route has shown for that configuration: in a
results file whose ``hw_config`` equals the configuration's (its clock aside), the entries
named after a part (``lfe5u-85f``; a name with ``_`` is a kept earlier result, such as
``lfe5u-85f_before_pipelining``) that carry an ``fmax_mhz``. The best of them decides: met when
its Fmax reaches the claimed clock, not met otherwise (the time at that Fmax is then the one to
trust), unknown when no such result exists (synthesis alone gives no Fmax).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["RESULTS", "clock_status"]

RESULTS = Path(__file__).parent / "results"


def _routed(cfg, results: Path) -> list[tuple[float, str]]:
    want = {k: v for k, v in cfg.to_dict().items() if k != "clock_mhz"}
    found = []
    for path in sorted(Path(results).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # not a results file: nothing shown
        if not isinstance(data, dict):
            continue
        hw = {k: v for k, v in (data.get("hw_config") or {}).items() if k != "clock_mhz"}
        if hw != want:
            continue
        for key, entry in data.items():
            fmax = entry.get("fmax_mhz") if isinstance(entry, dict) else None
            if "_" not in key and isinstance(fmax, (int, float)) and fmax > 0:
                found.append((float(fmax), str(entry.get("part", key))))
    return found


def clock_status(cfg, results: Path = RESULTS) -> dict:
    """{"clock_mhz", "met" (True, False or None: no place and route), "fmax_mhz", "part",
    "text"} of ``cfg`` (module doc)."""
    clock = float(cfg.clock_mhz)
    routed = _routed(cfg, results)
    if not routed:
        return {"clock_mhz": clock, "met": None, "fmax_mhz": None, "part": None,
                "text": f"{clock:g} MHz, a clock no place and route of this configuration "
                        f"has shown (celosia fpga synth)"}
    fmax, part = max(routed)
    met = fmax >= clock
    verdict = "met" if met else "not met"
    return {"clock_mhz": clock, "met": met, "fmax_mhz": fmax, "part": part,
            "text": f"{clock:g} MHz ({verdict}: Fmax {fmax:.1f} MHz on {part} after place "
                    f"and route)"}
