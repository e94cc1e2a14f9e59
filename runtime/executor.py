"""The graph executor of a CPU program: planned memory, one native call per run of kernel
steps, per-node times.

    executor = GraphExecutor(program)        # program.kernels compiled (or loaded)
    outputs = executor.run({"image": x})     # {output name: array}
    executor.last_profile                    # [{"node", "op", "kind", "ms", "shape"}, ...]

Memory. Every run-time value lives in one arena (a numpy byte array allocated once). A
value's storage is alive from the step that writes it to its last reader (a ``view`` shares
its source's storage and extends its life); storages whose lifetimes do not overlap share
bytes. Placement is greedy by size, largest first, at the lowest offset free for the whole
lifetime (as TVM's and TFLite's planners do). A kernel's inputs and output are alive at the
same step, so they never overlap (the kernels assume distinct arrays).

Since every value has a fixed address, each compiled step is bound once (its arguments
checked once, ``runner.BoundKernel``), and each run of consecutive kernel steps (views
between them cost nothing) is one table that native code walks: one ctypes call for all of
them (compiler/cpu/runner.py); numpy and concat steps run between those calls.

Ownership. Feeds are copied into their places in the arena and never written (a feed in
any layout or order is read through the copy); the outputs a run returns are fresh arrays
of their own, which later runs never touch. Both copies were measured before keeping them:
the input and output copies of small_cnn (batch 64) take about a microsecond each against
a 75-microsecond run (a 224x224 image: tens of microseconds against milliseconds), while
reading a feed in place would re-point every kernel, view and numpy step that reads it on
each run, and returning arena memory would let the next run overwrite a result.

Run-time-shaped segments. A value whose size is only known at run time (None in its
program shape: downstream of a node whose shape depends on values, compiler/graph/
dynamic.py) has no place in the arena: the numpy step that makes it stores a fresh array
for this run, steps read it by name, and it is dropped after its last reader. A numpy step
that turns such values back into a static one (a ReduceSum, a Shape) writes into the
arena after checking the size its type promises, so the static steps after it stay bound.
"""

from __future__ import annotations

import time

import numpy as np

from ..compiler.cpu.runner import BoundKernel, KernelRun, kernel_work, run_mode
from ..compiler.graph.ir import InputShapeError, Node, NodeError, TensorType
from ..compiler.graph.reference import KERNEL_ERRORS, evaluate_node, fits
from .fast_steps import bind_fast

__all__ = ["GraphExecutor", "plan_memory", "summarize_profile"]

ALIGN = 64  # bytes: a cache line, one AVX-512 vector
# step kind -> bind(executor, step) -> call: kinds other modules run (runtime/control.py
# registers "control"; it imports this module, so not the other way round).
STEP_BINDERS: dict = {}


def _nbytes(info: dict) -> int:
    return int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(info["dtype"]).itemsize


def run_time_shaped(info: dict) -> bool:
    """Whether a program value's size is only known at run time (not in the arena)."""
    return None in info["shape"]


def _type(info: dict) -> TensorType:
    return TensorType(info["dtype"], tuple(info["shape"]))


def _slice_offset(program, s: dict) -> int | None:
    """The byte offset of a numpy Slice step's output in its input when the output is one
    contiguous run of it (a slice of axis 1, step 1, of an array with one item along axis
    0: a blocked value split along whole channel blocks, batch 1), else None."""
    a = s["attrs"]
    info = program.values.get(s["inputs"][0]) if len(s["inputs"]) == 1 else None
    out = program.values.get(s["outputs"][0]) if len(s["outputs"]) == 1 else None
    if info is None or out is None or run_time_shaped(info) or len(info["shape"]) < 2 \
            or info["shape"][0] != 1 or out["dtype"] != info["dtype"]:
        return None
    try:  # attributes from a file may be anything: then no place (the step reports them)
        if [int(v) for v in a["axes"]] != [1] or [int(v) for v in a["steps"]] != [1]:
            return None
        first, end, _ = slice(int(a["starts"][0]), int(a["ends"][0])).indices(info["shape"][1])
    except (KeyError, TypeError, ValueError, IndexError, OverflowError):
        return None
    if list(out["shape"]) != [1, max(end - first, 0), *info["shape"][2:]]:
        return None
    row = int(np.prod(info["shape"][2:], dtype=np.int64)) * np.dtype(info["dtype"]).itemsize
    return first * row


def _concatenates(values: dict, s: dict) -> bool:
    """Whether a Concat step's values (all static, one item on axis 0) add up along axis 1
    to its output, of one dtype (a file's numpy step is not checked before it runs)."""
    if len(s["outputs"]) != 1 or not s["inputs"] or not all(s["inputs"]):
        return False
    parts = [values.get(v) for v in s["inputs"]]
    out = values.get(s["outputs"][0])
    if out is None or any(p is None for p in parts):
        return False
    shape = out["shape"]
    return not any(run_time_shaped(i) for i in (out, *parts)) and len(shape) >= 2 \
        and shape[0] == 1 and all(p["dtype"] == out["dtype"] and len(p["shape"]) == len(shape)
                                  and p["shape"][2:] == shape[2:] and p["shape"][0] == 1
                                  for p in parts) \
        and sum(p["shape"][1] for p in parts) == shape[1]


def in_place(program) -> dict:
    """{value: (value whose storage holds it, byte offset)} for values that need no copy
    of their own: the output of a contiguous Slice (``_slice_offset``) lives in its input,
    and an input of a channel Concat of batch 1 lives in the Concat's output, so its
    producer writes straight into the concatenation (YOLO's C2f and SPPF). A value gets at
    most one place; graph inputs, views and run-time-shaped values keep their own. The
    executor skips the copies this makes redundant."""
    values, steps = program.values, program.steps
    made = {o: s["kind"] for s in steps for o in s["outputs"] if o}
    place = {}
    for s in steps:
        if s["kind"] == "numpy" and s["op"] == "Slice":
            off = _slice_offset(program, s)
            if off is not None:
                place[s["outputs"][0]] = (s["inputs"][0], off)
    sliced = set(place)
    for s in steps:
        if not (s["kind"] == "concat" or (s["kind"] == "numpy" and s["op"] == "Concat"
                                          and s["attrs"].get("axis") == 1)) \
                or not _concatenates(values, s):
            continue
        out = s["outputs"][0]

        def free(v):
            return v not in place and made.get(v) in ("kernel", "numpy", "concat") \
                and s["inputs"].count(v) <= 1 and v not in program.outputs \
                and not run_time_shaped(values[v])
        ins, off, k = s["inputs"], 0, 0
        while k < len(ins):
            v = ins[k]
            src, o = place.get(v, ("", 0))
            if v in sliced and o == 0 and free(src):
                # slices covering their source in order (a C2f's halves): the source
                # itself goes into the concatenation, the slices stay views of it
                run, end = k, off
                while run < len(ins) and place.get(ins[run], ("",))[0] == src \
                        and ins[run] in sliced and place[ins[run]][1] == end - off:
                    end += _nbytes(values[ins[run]])
                    run += 1
                if end - off == _nbytes(values[src]):
                    place[src] = (out, off)
                    off, k = end, run
                    continue
            if free(v):
                place[v] = (out, off)
            off += _nbytes(values[v])
            k += 1
    return place


def plan_memory(program) -> tuple[dict, int, int]:
    """({value: byte offset in the arena}, arena bytes, bytes without reuse). Constants
    are not in the arena. A view, and a value placed by ``in_place``, shares the storage of
    the value it lives in (at an offset), whose lifetime covers all of them."""
    n_steps = len(program.steps)
    parent = dict(in_place(program))  # value -> (value it lives in, byte offset)
    ours = set(program.inputs) | {o for s in program.steps for o in s["outputs"] if o}
    for s in program.steps:
        # (a view of a body's outer value is bound to that value by runtime/control.py)
        if s["kind"] == "view" and s["outputs"][0] not in parent and s["inputs"][0] in ours:
            parent[s["outputs"][0]] = (s["inputs"][0], 0)

    def root_of(v):
        off = 0
        while v in parent:
            v, o = parent[v]
            off += o
        return v, off
    root, first, last = {}, {}, {}

    def touch(v, k, writes):
        r, off = root_of(v)
        root[v] = (r, off)
        first[r] = min(first.get(r, k), k) if writes else first.get(r, k)
        last[r] = max(last.get(r, k), k)
    for v in program.inputs:
        if not run_time_shaped(program.values[v]):
            touch(v, -1, True)
    for k, s in enumerate(program.steps):
        for v in s["inputs"]:
            if v in root:
                touch(v, k, False)
        for o in s["outputs"]:
            if o and not run_time_shaped(program.values[o]):
                touch(o, k, True)
    for o in program.outputs:
        if o in root:  # else a constant (a graph folded to a value): read from constants
            last[root[o][0]] = n_steps
    storages = sorted(first, key=lambda v: (-_nbytes(program.values[v]), first[v]))
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets = {}
    for v in storages:
        size = -(-_nbytes(program.values[v]) // ALIGN) * ALIGN
        busy = sorted((o, e) for o, e, f, l in placed if f <= last[v] and first[v] <= l)
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, e)
        placed.append((offset, offset + size, first[v], last[v]))
        offsets[v] = offset
    total = max((e for _, e, _, _ in placed), default=0)
    unshared = sum(-(-_nbytes(program.values[v]) // ALIGN) * ALIGN for v in storages)
    return {v: offsets[r] + off for v, (r, off) in root.items()}, total, unshared


def summarize_profile(profile: list[dict], top: int = 5) -> dict:
    """Total milliseconds, per-kind and per-op totals, what each kind of step runs ({kind:
    {op: steps}}: which operators are compiled kernels and which numpy), and the slowest
    nodes."""
    total = sum(p["ms"] for p in profile)
    by_op: dict = {}
    by_kind: dict = {}
    kinds: dict = {}
    for p in profile:
        by_op[p["op"]] = by_op.get(p["op"], 0.0) + p["ms"]
        by_kind[p["kind"]] = by_kind.get(p["kind"], 0.0) + p["ms"]
        steps = kinds.setdefault(p["kind"], {})
        steps[p["op"]] = steps.get(p["op"], 0) + 1
    ops = sorted(by_op.items(), key=lambda kv: -kv[1])
    slow = sorted(profile, key=lambda p: -p["ms"])[:top]
    return {"total_ms": total, "steps": len(profile),
            "by_kind_ms": by_kind, "kinds": kinds,
            "top_ops": [{"op": op, "ms": ms, "share": ms / total if total else 0.0}
                        for op, ms in ops[:top]],
            "slowest_nodes": [{"node": p["node"], "op": p["op"], "ms": p["ms"]} for p in slow]}


class GraphExecutor:
    """Runs a CPU program (compiled kernels in ``program.kernels``) on planned memory."""

    def __init__(self, program):
        self.program = program
        offsets, self.arena_bytes, self.unshared_bytes = plan_memory(program)
        self._arena = np.empty(self.arena_bytes + ALIGN, np.uint8)
        base = (-self._arena.ctypes.data) % ALIGN
        self.arrays: dict = {}
        for v, off in offsets.items():
            info = self.program.values[v]
            start = base + off
            self.arrays[v] = self._arena[start:start + _nbytes(info)].view(info["dtype"]) \
                .reshape(info["shape"])
        for name, a in program.constants.items():
            self.arrays[name] = a
        self._dynamic = {v for v, info in program.values.items() if run_time_shaped(info)}
        self._drop = self._last_readers()
        self._calls = [self._bind(s) for s in program.steps]
        self._plan = self._group()
        # (name, its arena array, dtype, shape) of each input when all have static shapes:
        # a run whose feeds match them exactly skips the full check (feeds_match).
        self._feed_types = None if self._dynamic & set(program.inputs) else [
            (n, self.arrays[n], np.dtype(program.values[n]["dtype"]),
             tuple(program.values[n]["shape"])) for n in program.inputs]
        self.last_profile: list[dict] = []

    def _last_readers(self) -> list[list[str]]:
        """Per step, the run-time-shaped values it is the last reader of (dropped after)."""
        last = {}
        for k, s in enumerate(self.program.steps):
            for v in s["inputs"]:
                if v in self._dynamic:
                    last[v] = k
        drop = [[] for _ in self.program.steps]
        for v, k in last.items():
            if v not in self.program.outputs:
                drop[k].append(v)
        return drop

    # ---- steps ------------------------------------------------------------------------------

    def _bind(self, s: dict):
        kind, arr = s["kind"], self.arrays
        if kind == "kernel":
            arrays = [arr[v] for v in s["inputs"]]
            spec = self.program.specs.get(s["kernel"], {})
            return BoundKernel(self.program.kernels[s["kernel"]], arrays,
                               work=kernel_work(spec, arrays))
        if kind == "view":
            return None  # the output already is the input's memory
        if kind in STEP_BINDERS:  # e.g. "control": If/Loop/Scan bodies (runtime/control.py)
            return STEP_BINDERS[kind](self, s)
        if kind == "numpy" and self._dynamic & set(s["inputs"] + s["outputs"]):
            return self._bind_run_time_shaped(
                Node(s["op"], tuple(s["inputs"]), tuple(s["outputs"]), s["attrs"], s["node"]))
        ins = [arr[v] if v else None for v in s["inputs"]]
        outs = [arr[o] if o else None for o in s["outputs"]]
        if kind == "concat" or (kind == "numpy" and s["op"] == "Concat"
                                and s["attrs"].get("axis") == 1
                                and _concatenates(self.program.values, s)):
            return self._bind_concat(ins, outs[0])
        offset = _slice_offset(self.program, s) if kind == "numpy" and s["op"] == "Slice" else None
        if offset is not None and outs[0].ctypes.data == ins[0].ctypes.data + offset:
            return None  # the output lives in the input (in_place)
        if kind == "numpy":
            fast = bind_fast(s, arr)  # a few copies between views, or one numpy call
            if fast is not None:
                return fast
            node = Node(s["op"], tuple(s["inputs"]), tuple(s["outputs"]), s["attrs"], s["node"])

            def run():
                try:
                    results = evaluate_node(node, ins)
                except KERNEL_ERRORS + (KeyError, AttributeError, OverflowError) as e:
                    # (attributes from a file may be of the wrong kind)
                    raise NodeError(node, f"failed at run time: {type(e).__name__}: "
                                          f"{e}") from None
                for o, y, r in zip(node.outputs, outs, results):
                    if y is None:
                        continue
                    if np.shape(r) != y.shape:  # (copyto would broadcast it silently)
                        raise NodeError(node, f"gives {o!r} of shape {list(np.shape(r))} at "
                                              f"run time, where the program holds "
                                              f"{list(y.shape)}: the .cel does not fit its "
                                              f"model; rebuild it")
                    try:
                        np.copyto(y, r, casting="same_kind")
                    except TypeError as e:
                        raise NodeError(node, f"gives {o!r} as {np.asarray(r).dtype}, where "
                                              f"the program holds {y.dtype}: {e}") from None
            return run
        raise ValueError(f"unknown step kind {kind!r}")

    def _group(self) -> list[tuple]:
        """The steps as (KernelRun, None, drops) for each run of consecutive kernel steps
        (views between them cost nothing) and (None, call, drops) for every other step;
        drops: run-time-shaped values whose last reader is in it."""
        plan, pending, drops = [], [], []
        for call, drop in zip(self._calls, self._drop):
            if isinstance(call, BoundKernel):
                pending.append(call)
            elif call is not None:
                if pending:
                    plan.append((KernelRun(pending), None, []))
                    pending = []
                plan.append((None, call, drops + drop))
                drops = []
                continue
            drops = drops + drop
        if pending or drops:
            plan.append((KernelRun(pending) if pending else None, None, drops))
        return plan

    @staticmethod
    def _bind_concat(ins: list, out: np.ndarray):
        """Copies of the inputs along axis 1 that do not live in ``out`` already
        (in_place); None when all do."""
        copies, first = [], 0
        for a in ins:
            part = out[:, first:first + a.shape[1]]
            first += a.shape[1]
            if not (a.ctypes.data == part.ctypes.data and part.flags.c_contiguous):
                copies.append((part, a))
        if not copies:
            return None

        def run():
            for part, a in copies:
                np.copyto(part, a)
        return run

    def _bind_run_time_shaped(self, node: Node):
        """A numpy step of a run-time-shaped segment: inputs looked up when it runs."""
        arr, values, arena = self.arrays, self.program.values, self._arena

        def run():
            ins = [arr[v] if v else None for v in node.inputs]
            try:
                results = evaluate_node(node, ins)
            except KERNEL_ERRORS as e:
                raise NodeError(node, f"failed at run time: {e}") from None
            for o, r in zip(node.outputs, results):
                if not o:
                    continue
                t = _type(values[o])
                if not fits(r.shape, t) or str(r.dtype) != t.dtype:
                    raise NodeError(node, f"gives {o!r} as {r.dtype}"
                                          f"[{','.join(map(str, r.shape))}] at run time, where "
                                          f"the model types it {t}")
                if o in self._dynamic:  # its own array (a view could see the arena change)
                    arr[o] = r.copy() if np.may_share_memory(r, arena) else r
                else:
                    np.copyto(arr[o], r)
        return run

    # ---- running ----------------------------------------------------------------------------

    def check_feeds(self, feeds: dict) -> None:
        p = self.program
        unknown = sorted(set(feeds) - set(p.inputs))
        if unknown:
            raise InputShapeError(f"unknown input{'s' if len(unknown) > 1 else ''} "
                                  f"{', '.join(map(repr, unknown))}: the model's inputs are "
                                  f"{', '.join(self.describe_inputs())}")
        for name in p.inputs:
            t = _type(p.values[name])
            if name not in feeds:
                raise InputShapeError(f"input {name!r} ({t}) was not given")
            a = feeds[name]
            if not isinstance(a, np.ndarray):
                raise InputShapeError(f"input {name!r} must be a numpy array, not "
                                      f"{type(a).__name__}")
            if not fits(a.shape, t) or str(a.dtype) != t.dtype:
                # (CpuModel.check_shapes says first whether a rebuild could take it)
                raise InputShapeError(
                    f"input {name!r} is {a.dtype}[{','.join(map(str, a.shape))}] but the model "
                    f"was built for {t}: pass an array of that shape and type")

    def describe_inputs(self) -> list[str]:
        return [f"{n} ({_type(self.program.values[n])})" for n in self.program.inputs]

    def feeds_match(self, feeds: dict) -> bool:
        """Whether ``feeds`` are exactly the model's inputs, numpy arrays of their dtypes
        and shapes (the common case, checked in about a microsecond per input; anything
        else goes through ``check_feeds``, which says what is wrong)."""
        types = self._feed_types
        if types is None or len(feeds) != len(types):
            return False
        for name, _, dtype, shape in types:
            a = feeds.get(name)
            if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape:
                return False
        return True

    def run(self, feeds: dict, *, profile: bool = False, progress=None,
            direct: frozenset = frozenset(), out: dict | None = None) -> dict:
        """Outputs by name, fresh arrays of their own: the next run does not overwrite
        them. The feeds are copied into the arena, never written. With ``profile`` (or
        ``progress``, a function called with one line per step) each step is timed into
        ``last_profile``. ``direct``: inputs the kernels read, and outputs they write, in
        the caller's arrays this run (runtime/dlpack.py binds them): not copied. ``out``:
        arrays the outputs are returned in (written, unless ``direct``)."""
        if self._feed_types is not None and self.feeds_match(feeds):
            for name, place, _, _ in self._feed_types:
                if name not in direct:
                    np.copyto(place, feeds[name])
        else:
            self.check_feeds(feeds)
            for name in self.program.inputs:
                if name in self._dynamic:  # read, never written, by numpy steps: no copy
                    self.arrays[name] = feeds[name]
                elif name not in direct:
                    np.copyto(self.arrays[name], feeds[name])
        try:
            mode, pool = run_mode()
            if profile or progress:
                self._run_timed(progress, mode, pool)
            else:
                arrays = self.arrays
                for run, call, drops in self._plan:
                    if run is not None:
                        run(mode, pool)
                    else:
                        call()
                    for v in drops:
                        arrays.pop(v, None)
            if out:
                for o, a in out.items():
                    if o not in direct:
                        np.copyto(a, self.arrays[o])
            return {o: out[o] if out and o in out else self.arrays[o].copy()
                    for o in self.program.outputs}
        finally:
            for v in self._dynamic:
                self.arrays.pop(v, None)

    def _run_timed(self, progress, mode, pool) -> None:
        records, n = [], len(self._calls)
        clock = time.perf_counter
        for k, (s, call) in enumerate(zip(self.program.steps, self._calls)):
            t0 = clock()
            if isinstance(call, BoundKernel) and mode is not None:
                pool.run_steps(1, call.records[mode])  # as in a run: one native call
            elif call is not None:
                call()
            ms = (clock() - t0) * 1e3
            out = s["outputs"][0] if s["outputs"] else ""
            shape = list(self.arrays[out].shape) if out in self.arrays else \
                self.program.values[out]["shape"] if out else []
            for v in self._drop[k]:
                self.arrays.pop(v, None)
            rec = {"node": s["node"], "op": s["op"], "kind": s["kind"], "ms": ms,
                   "shape": shape}
            records.append(rec)
            if progress:
                progress(f"[{k + 1:>{len(str(n))}}/{n}] {s['node']:<24} {s['op']:<18} "
                         f"{s['kind']:<7} {ms:8.3f} ms  {rec['shape']}")
        self.last_profile = records

