"""Logic depth of a mapped Xilinx 7-series netlist (Yosys ``write_json`` after
``synth_xilinx -flatten``): the largest number of combinational cells on a path between
two timing boundaries.

Definition (what ``celosia fpga synth --part xc7z020`` reports as ``logic_depth``):

- boundaries (a path starts at their outputs and ends at their inputs): flip-flops
  (``FD*``), block RAMs (``RAMB*``), DSP48E1 slices with any of their A, B, M or P
  registers, the top module's ports and constants;
- combinational cells, each one level: LUTs, wide-function muxes (``MUXF7``/``MUXF8``),
  ``CARRY4`` (one level per cell of a carry chain), inverters and buffers, DSP48E1 slices
  without registers, and the read side of distributed RAMs and shift registers
  (``RAM32M``, ``RAM64X1D``, ``SRL16E``, ...): only their address inputs reach their data
  outputs in the same cycle; their write data and enables are registered inside them.

This replaces Yosys' ``ltp -noff``, whose ``-noff`` only recognises Yosys' internal flip-flop
cells, not the mapped FDRE/FDCE/...: on a mapped netlist it walks through every register
(reporting "Detected loop" at each feedback) and on a deeply pipelined design recursed
until the WebAssembly stack ran out. The walk here is iterative (Kahn's topological
order), so it needs no stack, and a real combinational loop is reported by name.
"""

from __future__ import annotations

import json
import re
from collections import Counter, deque
from pathlib import Path

__all__ = ["logic_depth", "LogicLoopError"]

_ADDRESS_PORT = re.compile(r"^(ADDR[A-Z]?|DPRA\d*|A\d*|RADR\d*)$")
_DSP_REGS = ("AREG", "BREG", "MREG", "PREG", "ACASCREG", "BCASCREG")


class LogicLoopError(ValueError):
    """The netlist has a combinational loop (the cells on it are named)."""


def _param(cell: dict, name: str) -> int:
    value = cell.get("parameters", {}).get(name, 0)
    if isinstance(value, str):  # Yosys writes parameters as binary strings
        try:
            return int(value, 2) if set(value) <= {"0", "1"} else 0
        except ValueError:
            return 0
    return int(value)


def _arcs(cell: dict) -> list[tuple[str, str]] | None:
    """(input port, output port) pairs through which ``cell`` is combinational in one cycle,
    or None for a boundary (a register)."""
    kind = cell["type"]
    dirs = cell.get("port_directions", {})
    ins = [p for p, d in dirs.items() if d == "input"]
    outs = [p for p, d in dirs.items() if d == "output"]
    if kind.startswith(("FD", "RAMB", "BUFG", "IBUF", "OBUF")):
        return None
    if kind.startswith("DSP48"):
        if any(_param(cell, reg) for reg in _DSP_REGS):
            return None
        return [(i, o) for i in ins for o in outs if i not in ("CLK",)]
    if kind.startswith(("RAM", "SRL")):  # distributed RAM / shift register: the read side
        return [(i, o) for i in ins if _ADDRESS_PORT.match(i) for o in outs]
    return [(i, o) for i in ins for o in outs]


def logic_depth(netlist: dict | str | Path, top: str | None = None) -> dict:
    """The longest combinational path of ``top`` (a flattened module) in a Yosys JSON netlist
    (a dict, or the path of a ``write_json`` file): ``{"depth": cells on it, "path": their
    names, start to end, "nets": a named net each of them drives (or None), "types": cells
    per type on it, "cells": combinational cells counted}``."""
    if not isinstance(netlist, dict):
        netlist = json.loads(Path(netlist).read_text())
    modules = netlist["modules"]
    if top is None:
        tops = [n for n, mod in modules.items() if int(mod.get("attributes", {}).get("top", 0) or 0)]
        if len(tops) != 1:
            raise ValueError(f"name the top module: the netlist has {len(modules)} modules "
                             f"and {len(tops)} marked top")
        top = tops[0]
    cells = modules[top]["cells"]
    # each combinational cell is a node; an edge joins a cell whose output bit feeds another's
    # arc input. Bits driven by a boundary (or a port or constant) start paths.
    driver: dict[int, str] = {}
    arcs: dict[str, list[tuple[str, str]]] = {}
    for name, cell in cells.items():
        a = _arcs(cell)
        if a is None:
            continue
        arcs[name] = a
        for _, out in a:
            for bit in cell["connections"].get(out, []):
                if isinstance(bit, int):
                    driver[bit] = name
    preds: dict[str, set[str]] = {name: set() for name in arcs}
    succs: dict[str, set[str]] = {name: set() for name in arcs}
    for name, a in arcs.items():
        conns = cells[name]["connections"]
        for port in {i for i, _ in a}:
            for bit in conns.get(port, []):
                src = driver.get(bit) if isinstance(bit, int) else None
                if src is not None and src not in preds[name]:
                    preds[name].add(src)
                    succs[src].add(name)
    level = {name: 1 for name in arcs}
    best_pred: dict[str, str | None] = {name: None for name in arcs}
    waiting = {name: len(p) for name, p in preds.items()}
    ready = deque(name for name, n in waiting.items() if n == 0)
    done = 0
    while ready:
        name = ready.popleft()
        done += 1
        for nxt in succs[name]:
            if level[name] + 1 > level[nxt]:
                level[nxt], best_pred[nxt] = level[name] + 1, name
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    if done < len(arcs):
        loop = sorted(n for n, w in waiting.items() if w > 0)
        raise LogicLoopError(f"combinational loop through {len(loop)} cells of {top}, e.g. "
                             + ", ".join(loop[:5]))
    if not arcs:
        return {"depth": 0, "path": [], "types": {}, "cells": 0, "nets": []}
    end = max(level, key=lambda n: (level[n], n))
    path = [end]
    while best_pred[path[-1]] is not None:
        path.append(best_pred[path[-1]])
    path.reverse()
    types = Counter(cells[n]["type"] for n in path)
    return {"depth": level[end], "path": path, "types": dict(sorted(types.items())),
            "cells": len(arcs), "nets": _net_names(modules[top], cells, path)}


def _net_names(module: dict, cells: dict, path: list[str]) -> list[str | None]:
    """A readable name of a net each cell of ``path`` drives (Yosys' mapped cells have
    generated names; the nets often keep the design's), or None."""
    names: dict[int, str] = {}
    for name, net in module.get("netnames", {}).items():
        if net.get("hide_name") or name.startswith("$"):
            continue
        for bit in net.get("bits", []):
            if isinstance(bit, int) and (bit not in names or len(name) < len(names[bit])):
                names[bit] = name
    out = []
    for cell_name in path:
        cell = cells[cell_name]
        found = None
        for port, direction in cell.get("port_directions", {}).items():
            if direction != "output":
                continue
            for bit in cell["connections"].get(port, []):
                if isinstance(bit, int) and bit in names:
                    found = names[bit]
                    break
            if found:
                break
        out.append(found)
    return out
