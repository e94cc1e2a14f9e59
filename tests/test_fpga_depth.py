"""The xc7z020 logic depth (fpga/depth.py) on hand-made and random mapped netlists, in
Yosys' JSON form: registers, block RAMs and registered DSPs end paths; LUTs, carry cells,
muxes and unregistered DSPs are one level each; distributed RAM only from its address."""

from __future__ import annotations

import functools
import random

import pytest

from celosia.fpga.depth import LogicLoopError, logic_depth

_DIRS = {
    "FDRE": {"C": "input", "CE": "input", "D": "input", "R": "input", "Q": "output"},
    "LUT1": {"I0": "input", "O": "output"},
    "LUT2": {"I0": "input", "I1": "input", "O": "output"},
    "LUT3": {"I0": "input", "I1": "input", "I2": "input", "O": "output"},
    "CARRY4": {"CI": "input", "DI": "input", "S": "input", "O": "output", "CO": "output"},
    "RAM32M": {"ADDRA": "input", "DIA": "input", "WE": "input", "WCLK": "input",
               "DOA": "output"},
    "DSP48E1": {"A": "input", "B": "input", "CLK": "input", "P": "output"},
}


def _cell(kind, params=None, **conns):
    return {"type": kind, "port_directions": _DIRS[kind], "parameters": params or {},
            "connections": {port: list(bits) for port, bits in conns.items()}}


def _netlist(cells, ports=None, netnames=None):
    return {"modules": {"top": {"attributes": {"top": "00000000000000000000000000000001"},
                                "ports": ports or {}, "cells": cells,
                                "netnames": netnames or {}}}}


def test_registers_end_paths_and_feedback_through_them_is_no_loop():
    # ff1 -> a -> c (carry) -> b -> ff2, and ff2 -> a2 -> ff2 (a counter's feedback)
    cells = {
        "ff1": _cell("FDRE", C=[1], CE=["1"], D=[20], R=["0"], Q=[2]),
        "a": _cell("LUT2", I0=[2], I1=[21], O=[3]),
        "c": _cell("CARRY4", CI=["0"], DI=[3], S=[3], O=[4], CO=[5]),
        "b": _cell("LUT1", I0=[4], O=[6]),
        "ff2": _cell("FDRE", C=[1], CE=["1"], D=[6], R=["0"], Q=[21]),
        "a2": _cell("LUT1", I0=[21], O=[20]),
    }
    nets = {"$auto$x": {"hide_name": 1, "bits": [3]}, "sum": {"hide_name": 0, "bits": [5, 4]},
            "count_q": {"hide_name": 0, "bits": [21]}}
    got = logic_depth(_netlist(cells, netnames=nets))
    assert got["depth"] == 3 and got["path"] == ["a", "c", "b"]
    assert got["nets"] == [None, "sum", None]  # hidden names are not shown
    assert got["types"] == {"CARRY4": 1, "LUT1": 1, "LUT2": 1} and got["cells"] == 4


def test_distributed_ram_is_combinational_only_from_its_address():
    cells = {
        "l1": _cell("LUT1", I0=[2], O=[3]),
        "l2": _cell("LUT1", I0=[3], O=[4]),
        "l3": _cell("LUT1", I0=[4], O=[5]),
        # the long chain reaches only the RAM's write data: no path through the RAM there
        "ram": _cell("RAM32M", ADDRA=[9], DIA=[5], WE=["1"], WCLK=[1], DOA=[10]),
        "addr": _cell("LUT1", I0=[2], O=[9]),
        "after": _cell("LUT1", I0=[10], O=[11]),
    }
    got = logic_depth(_netlist(cells), "top")
    assert got["depth"] == 3  # l1 l2 l3 (addr -> ram -> after is 3 as well)
    cells["ram"]["connections"]["ADDRA"] = [5]  # now the chain addresses it: 5 levels
    got = logic_depth(_netlist(cells), "top")
    assert got["depth"] == 5 and got["path"] == ["l1", "l2", "l3", "ram", "after"]


def test_dsp_is_a_level_only_without_registers():
    cells = {
        "l1": _cell("LUT1", I0=[2], O=[3]),
        "dsp": _cell("DSP48E1", {"PREG": "1"}, A=[3], B=[3], CLK=[1], P=[4]),
        "l2": _cell("LUT1", I0=[4], O=[5]),
    }
    assert logic_depth(_netlist(cells))["depth"] == 1
    cells["dsp"]["parameters"] = {"AREG": 0, "BREG": "0", "MREG": "00", "PREG": "0"}
    assert logic_depth(_netlist(cells))["depth"] == 3


def test_combinational_loop_is_named():
    cells = {"x": _cell("LUT1", I0=[3], O=[2]), "y": _cell("LUT1", I0=[2], O=[3]),
             "z": _cell("LUT1", I0=[3], O=[4])}
    with pytest.raises(LogicLoopError, match=r"combinational loop through 3 cells of top, "
                                             r"e\.g\. x, y, z"):
        logic_depth(_netlist(cells))


@pytest.mark.parametrize("seed", range(5))
def test_random_netlists_against_a_recursive_longest_path(seed):
    """Random DAGs of LUTs with registers cut in; the depth equals a direct recursion over
    the same graph (the longest chain of LUTs, restarting at every register)."""
    rng = random.Random(seed)
    n = 300
    cells, lut_inputs = {}, {}
    for k in range(n):  # cell k drives bit k + 10; inputs from earlier cells only
        is_ff = rng.random() < 0.2
        srcs = [rng.randrange(k) for _ in range(rng.randint(1, 3))] if k else []
        ins = [s + 10 for s in srcs] or ["0"]
        if is_ff:
            cells[f"c{k}"] = _cell("FDRE", C=[1], CE=["1"], D=ins[:1], R=["0"], Q=[k + 10])
        else:
            kind = f"LUT{len(ins)}"
            conns = {f"I{p}": [b] for p, b in enumerate(ins)}
            cells[f"c{k}"] = _cell(kind, O=[k + 10], **conns)
            lut_inputs[k] = [b - 10 for b in ins if isinstance(b, int)]

    @functools.lru_cache(maxsize=None)
    def depth(k):  # LUTs on the longest chain ending at LUT k
        return 1 + max((depth(s) for s in lut_inputs[k] if s in lut_inputs), default=0)

    want = max(depth(k) for k in lut_inputs)
    got = logic_depth(_netlist(cells))
    assert got["depth"] == want and len(got["path"]) == want
    for a, b in zip(got["path"], got["path"][1:]):  # a real chain: each drives the next
        assert int(a[1:]) in lut_inputs[int(b[1:])]
