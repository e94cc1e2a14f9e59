"""Running compiled control flow (compiler/cpu/control.py): a ``control`` step's bodies,
each a program over an arena of its own, bound once; the step calls them.

    call = bind_control(executor, step)   # once, when the enclosing executor binds
    call()                                # each run: the If, the Loop or the Scan

A body's executor is a :class:`~.executor.GraphExecutor` whose ``outer`` values are the
enclosing executor's arrays (fixed addresses: bound, not copied). Its inputs are kept alive
to the end of the body's steps, so no output shares bytes with an input: copying the
carried values back after an iteration cannot overwrite an output not yet copied (a view
of an input, e.g. a condition passed on, is handled by copying the outputs first).

One iteration of a Loop: the iteration number and condition written into the body's
inputs, the body's calls, its scan outputs copied into their row of the node's outputs.
The carried values swap buffers: a twin executor of the body has its carried inputs at the
first's carried outputs and the other way round, and iterations alternate between the two
(``_twin``); when a carried output is not a step's own (an input passed on, a view), the
carried values are copied back into the inputs instead (``_carry``). A Scan copies its
slices into the body's inputs the same way (in reverse where a direction is 1).

Inside a body, small kernels run on the calling thread (``_serial``), each run of
consecutive kernel steps is one native call (runner.KernelRun, as in the main program),
and many numpy steps are copies or one numpy call into their output (fast_steps.py): per
iteration, the cost of waking the thread pool or of evaluate_node's dispatch is larger
than their work.
"""

from __future__ import annotations

import math

import numpy as np

from ..compiler.cpu.runner import BoundKernel, run_mode
from ..compiler.graph.ir import Node, NodeError
from .executor import STEP_BINDERS, GraphExecutor
from .fast_steps import bind_fast

__all__ = ["bind_control"]


class _BodyExecutor(GraphExecutor):
    """A body's program; ``external`` arrays (its outer values) are bound by name."""

    def __init__(self, program, external: dict):
        self._external = dict(external)
        super().__init__(program)

    def _bind(self, s: dict):
        self.arrays.update(self._external)  # before the first step binds (idempotent)
        kind, arr = s["kind"], self.arrays
        if kind == "view" and s["inputs"][0] in self._external:  # a view of an outer
            out, info = s["outputs"][0], self.program.values[s["outputs"][0]]
            self._external[out] = arr[s["inputs"][0]].reshape(info["shape"])
            arr[out] = self._external[out]
            return None
        if kind == "kernel":  # grouped with its neighbours into one native call (_plan)
            kernel = self.program.kernels[s["kernel"]]
            args = [arr[v] for v in s["inputs"]]
            spec = self.program.specs.get(s["kernel"], {})
            return BoundKernel(kernel, args, work=0 if _serial(spec, args) else None)
        if kind == "numpy":
            fast = bind_fast(s, arr)  # Slice, Pad, Gather...: copies (fast_steps.py)
            return fast if fast is not None else super()._bind(s)
        return super()._bind(s)


# A body kernel whose arrays total at most SERIAL_BYTES and whose work is at most
# SERIAL_MACS multiply-adds (or elements) runs on the calling thread: a loop's small
# kernels (an RNN cell's 1x256x256 product: 65k, about 2 us) cost less than waking the
# thread pool for them, once per iteration; a small but compute-heavy one (a convolution
# of small tensors) keeps the threads.
SERIAL_BYTES = 1 << 20
SERIAL_MACS = 1 << 18


def _serial(spec: dict, args: list) -> bool:
    if sum(a.nbytes for a in args) > SERIAL_BYTES:
        return False
    op = spec.get("op")
    data, w, a, b = (_dims(spec.get(k)) for k in ("data", "weight", "a", "b"))
    if op in ("dense", "qdense") and data and w and len(data) == 2 and len(w) == 3:
        work = data[0] * data[1] * w[0] * w[2]
    elif op == "batch_matmul" and a and b and len(b) == 3:
        work = math.prod(a) * b[2]
    elif w and len(w) >= 2 and w[0] * w[-1]:  # per output: the weights of one channel
        work = args[-1].size * math.prod(w) // (w[0] * w[-1])
    elif w is None and data is None:
        work = args[-1].size
    else:  # a spec of another shape: keep the threads
        return False
    return work <= SERIAL_MACS


def _dims(v) -> list | None:
    """A spec's shape field as a list of ints (None for anything else: specs in a .cel are
    not checked)."""
    if isinstance(v, list) and all(type(d) is int and 0 <= d < 1 << 40 for d in v):
        return v
    return None


_ROW_VIEWS = 1 << 16  # rows of a scan output kept as views


def _body_executor(parent: GraphExecutor, step: dict, body: dict,
                   bound: dict | None = None) -> _BodyExecutor:
    """A body's executor; ``bound``: more of its values bound to given arrays."""
    from ..compiler.cpu.lowering import CpuProgram

    p = parent.program
    captured = step["inputs"][len(step["inputs"]) - len(body["outer"]):] \
        if body["outer"] else []
    external = {name: parent.arrays[v] for name, v in zip(body["outer"], captured)}
    external.update(bound or {})
    # The inputs as outputs too: alive to the end, never sharing bytes with an output.
    kept = list(dict.fromkeys(body["outputs"] + body["inputs"]))
    program = CpuProgram(step["node"], list(body["inputs"]), kept, body["values"],
                         p.constants, body["steps"], p.specs, p.kernels)
    return _BodyExecutor(program, external)


def _calls(ex: GraphExecutor) -> list:
    """A body's steps as [(KernelRun, None) | (None, call)]: each run of consecutive
    kernel steps one native call (the executor's plan; a body has no run-time-shaped
    values to drop)."""
    return [(run, call) for run, call, _ in ex._plan]


def _go(calls: list, mode, pool) -> None:
    """One pass over a body's ``_calls`` (``mode, pool``: runner.run_mode())."""
    for run, call in calls:
        if run is not None:
            run(mode, pool)
        else:
            call()


def _scalar(a: np.ndarray):
    return a.reshape(-1)[0]


def bind_control(parent: GraphExecutor, step: dict):
    """The call that runs a ``control`` step of ``parent``."""
    bodies = {k: _body_executor(parent, step, b) for k, b in step["bodies"].items()}
    node = Node(step["op"], tuple(step["inputs"]), tuple(step["outputs"]), step["attrs"],
                step["node"])
    outs = [parent.arrays[o] if o else None for o in step["outputs"]]
    n_outer = len(next(iter(step["bodies"].values()))["outer"])
    own = step["inputs"][:len(step["inputs"]) - n_outer]
    ins = [parent.arrays[v] if v else None for v in own]
    bind = {"If": _bind_if, "Loop": _bind_loop, "Scan": _bind_scan}[step["op"]]
    return bind(node, step, bodies, ins, outs, parent)


def _bind_if(node, step, bodies, ins, outs, parent):
    branches = []
    for key in ("then_branch", "else_branch"):
        ex = bodies[key]
        results = [ex.arrays[o] for o in step["bodies"][key]["outputs"]]
        branches.append((_calls(ex), list(zip(outs, results))))
    cond = ins[0]

    def run():
        calls, copies = branches[0] if bool(_scalar(cond)) else branches[1]
        _go(calls, *run_mode())
        for y, r in copies:
            if y is not None:
                np.copyto(y, r)
    return run


def _carry(states_in: list, states_out: list):
    """The copies of the carried values into the body's inputs: straight when no output is
    another input's memory, else through a snapshot of the outputs."""
    pairs = [(i, o) for i, o in zip(states_in, states_out) if i is not o]
    crossed = any(np.shares_memory(o, i2) for k, (_, o) in enumerate(pairs)
                  for j, (i2, _) in enumerate(pairs) if j != k)
    if crossed:
        def carry():
            snapshot = [o.copy() for _, o in pairs]
            for (i, _), o in zip(pairs, snapshot):
                np.copyto(i, o)
        return carry

    def carry():
        for i, o in pairs:
            np.copyto(i, o)
    return carry


def _twin(parent: GraphExecutor, step: dict, ex: _BodyExecutor, first: int, out_first: int):
    """A second executor of a Loop's or Scan's body whose carried inputs are ``ex``'s
    carried outputs and whose carried outputs are ``ex``'s inputs, so iterations alternate
    between the two and the carried values swap buffers instead of being copied; None when
    a carried output is not a step's own output (a view, an input passed on, an output
    twice). ``first``/``out_first``: the body's first carried input/output."""
    b = step["bodies"]["body"]
    n = len(b["inputs"]) - (int(step["attrs"]["num_scan_inputs"]) if step["op"] == "Scan"
                            else 2)
    ins, outs = b["inputs"][first:first + n], b["outputs"][out_first:out_first + n]
    written = {o for st in b["steps"] if st["kind"] != "view" for o in st["outputs"]}
    if n == 0 or len(set(outs)) != n or not set(outs) <= written \
            or set(outs) & set(b["inputs"] + b["outer"]):
        return None
    return _body_executor(parent, step, b, {
        **{i: ex.arrays[o] for i, o in zip(ins, outs)},
        **{o: ex.arrays[i] for i, o in zip(ins, outs)}})


class _Pass:
    """One executor's arrays as an iteration uses them."""

    def __init__(self, ex: GraphExecutor, b: dict, first: int, n_state: int, out_first: int):
        self.calls = _calls(ex)
        self.inputs = [ex.arrays[v] for v in b["inputs"]]
        self.outputs = [ex.arrays[o] for o in b["outputs"]]
        self.states = self.inputs[first:first + n_state]
        self.new_states = self.outputs[out_first:out_first + n_state]


def _passes(parent, step, ex, first, out_first, n_state):
    """The executors iterations alternate between ([one] when the carried values are
    copied, with the copy) and that copy (None when they swap)."""
    b = step["bodies"]["body"]
    one = _Pass(ex, b, first, n_state, out_first)
    twin = _twin(parent, step, ex, first, out_first)
    if twin is None:
        return [one], _carry(one.states, one.new_states)
    return [one, _Pass(twin, b, first, n_state, out_first)], None


def _rows(y: np.ndarray):
    """``y``'s rows as views made once (``y[i]`` of the list is an array even for a 1-D
    ``y``), or an object indexing them on the fly when there are very many."""
    if len(y) <= _ROW_VIEWS:
        return [y[k, ...] for k in range(len(y))]
    return _RowsOf(y)


class _RowsOf:
    def __init__(self, y):
        self.y = y

    def __getitem__(self, i):
        return self.y[i, ...]

    def __len__(self):
        return len(self.y)


def _bind_loop(node, step, bodies, ins, outs, parent):
    b = step["bodies"]["body"]
    n_state = len(b["inputs"]) - 2
    passes, carry = _passes(parent, step, bodies["body"], 2, 1, n_state)
    trip_a, cond_a, initial = ins[0], ins[1], ins[2:]
    finals, stacks = outs[:n_state], outs[n_state:]
    plans = [(p.calls, p.inputs[0], p.inputs[1], p.outputs[0].reshape(-1),
              [(_rows(y), r) for y, r in zip(stacks, p.outputs[1 + n_state:])
               if y is not None]) for p in passes]
    rows = next((len(y) for y in stacks if y is not None), None)
    n_plans = len(plans)

    def run():
        trip = float("inf") if trip_a is None else int(_scalar(trip_a))
        go = True if cond_a is None else bool(_scalar(cond_a))
        for s, x in zip(passes[0].states, initial):
            np.copyto(s, x)
        i = 0
        mode, pool = run_mode()
        while go and i < trip:
            calls, it, cond_in, cond_out, scans = plans[i % n_plans]
            it[...] = i
            cond_in[...] = go
            _go(calls, mode, pool)
            go = bool(cond_out[0])
            if scans and i >= rows:
                raise NodeError(node, f"runs more than the {rows} iterations its scan "
                                      "outputs were built for")
            for y, r in scans:
                np.copyto(y[i], r)
            if carry:
                carry()
            i += 1
        if rows is not None and i != rows:
            raise NodeError(node, f"ran {i} iterations, its scan outputs were built for "
                                  f"{rows}")
        for y, s in zip(finals, passes[i % len(passes)].states):
            if y is not None:
                np.copyto(y, s)
    return run


def _bind_scan(node, step, bodies, ins, outs, parent):
    b = step["bodies"]["body"]
    a = step["attrs"]
    m = int(a["num_scan_inputs"])
    n_state = len(b["inputs"]) - m
    passes, carry = _passes(parent, step, bodies["body"], 0, 0, n_state)
    # Each sequence and stacked output with its scan axis first (views, no copy).
    seqs = [(np.moveaxis(x, ax, 0), d) for x, ax, d in
            zip(ins[n_state:], a["scan_input_axes"], a["scan_input_directions"])]
    places = [(np.moveaxis(y, ax, 0), d) for y, ax, d in
              zip(outs[n_state:], a["scan_output_axes"], a["scan_output_directions"])]
    plans = [(p.calls, p.inputs[n_state:],
              [(y, d, r) for (y, d), r, o in zip(places, p.outputs[n_state:], outs[n_state:])
               if o is not None]) for p in passes]
    finals = outs[:n_state]
    length = len(seqs[0][0]) if seqs else 0

    def run():
        for s, x in zip(passes[0].states, ins[:n_state]):
            np.copyto(s, x)
        mode, pool = run_mode()
        for t in range(length):
            calls, slices, stacks = plans[t % len(plans)]
            for dst, (x, d) in zip(slices, seqs):
                np.copyto(dst, x[length - 1 - t if d else t, ...])
            _go(calls, mode, pool)
            for y, d, r in stacks:
                np.copyto(y[length - 1 - t if d else t, ...], r)
            if carry:
                carry()
        for y, s in zip(finals, passes[length % len(passes)].states):
            if y is not None:
                np.copyto(y, s)
    return run


STEP_BINDERS["control"] = bind_control
