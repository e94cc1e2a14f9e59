"""Python-defined operators: ``@celosia.op(target="cpu")`` (docs/op.md).

    import celosia
    from celosia.op import te, create_schedule

    @celosia.op(target="cpu")
    def axpy(x, y, alpha=2.0):                  # x, y: placeholders of the call's tensors
        z = te.compute(x.shape, lambda *i: x[i] * alpha + y[i], "z")
        s = create_schedule(z)                   # optional: how (else a default schedule)
        s[z].vectorize(s[z].leaves[-1])
        return z, s

    axpy(a, b)                 # numpy arrays or PyTorch tensors (any __dlpack__ CPU tensor)
    axpy(a, b, out=c)          # written into c, no copy
    torch.ops.celosia.axpy(ta, tb)   # the torch.library custom op (torch.compile-able)

The decorated function is celosia's own tensor-expression language (compiler/tensor: te.py
computes, schedule.py schedules). It is called with one placeholder per tensor argument,
of that argument's shape and dtype, and the keyword constants of the call, and returns the
output tensor(s), optionally followed by a ``Schedule``; without one, each stage gets the
CPU backend's element-wise schedule (outer loops fused and parallel, the innermost
vectorised: ``schedule_elementwise``). The result is lowered and compiled by LLVM
(compiler/cpu/codegen.py) once per (shapes, dtypes, constants) seen, and cached (and the
machine code is also in the on-disk kernel cache).

Supported: one build per set of input shapes and dtypes (no symbolic shapes: a new shape is
a new build; under torch.compile, mark the inputs static or let dynamo specialise); dtype
polymorphism (the function sees each input's dtype and may branch on it; bool, int8, int16,
int32, int64, uint8, float32 - anything else, e.g. float64 or float16, is a CompilerError
naming the dtype); broadcasting written in the compute (``broadcast(x, i)`` reads ``x`` at
output index ``i`` with numpy's rules; ``broadcast_shape`` gives the result's shape), never
implicit. Targets: ``"cpu"`` and ``"accel"`` (a matrix product of int8
inputs with an element-wise int32 epilogue, matched to the GEMM intrinsic and the ALU and
run on fsim, the cycle model or the RTL: compiler/accel/te_op.py, op_accel.py, docs/op.md).

Calls read every input in its own memory (numpy arrays as they are, other tensors through
``np.from_dlpack``: no copy) when it is C-contiguous (others are copied once) and write each
output into the caller's ``out`` tensor when given (it must be C-contiguous, of the output's
dtype and shape, and not overlap an input), else into a new array of the first tensor
argument's kind (a torch tensor for torch inputs, numpy otherwise).
"""

from __future__ import annotations

import inspect
import sys
import threading

import numpy as np

from .errors import CelosiaError, CompilerError

from .compiler.tensor import te
from .compiler.tensor.expr import as_expr, cast, exp, max_expr, min_expr, select, sqrt
from .compiler.tensor.schedule import Schedule, create_schedule

__all__ = ["op", "Op", "te", "create_schedule", "broadcast", "broadcast_shape", "OpError",
           "select", "cast", "exp", "sqrt", "minimum", "maximum", "AccelMappingError"]

TARGETS = ("cpu", "accel")


def minimum(a, b):
    """The smaller of two expressions (elementwise; the ALU's MIN on the accelerator)."""
    return min_expr(a, b)


def maximum(a, b):
    """The larger of two expressions (elementwise; the ALU's MAX on the accelerator)."""
    return max_expr(a, b)


class OpError(CelosiaError, TypeError):
    """A wrong call of a ``celosia.op`` operator: says which argument and what to pass."""


class AccelMappingError(OpError, CompilerError):
    """The compute does not map onto the accelerator (target="accel"): says what does
    not and suggests target="cpu"."""


def broadcast_shape(*tensors) -> tuple:
    """The shape numpy's broadcasting gives ``tensors`` (te tensors or shapes)."""
    shapes = [t.shape if hasattr(t, "shape") else tuple(t) for t in tensors]
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError as e:
        raise CompilerError(f"broadcast_shape: {e}") from None


def broadcast(t: te.Tensor, index) -> object:
    """``t`` read at the output index ``index`` (a tuple of the compute's axes) with numpy's
    broadcasting: ``t``'s dimensions align to the right, a dimension of 1 reads index 0."""
    index = tuple(index)
    if t.ndim > len(index):
        raise CompilerError(f"broadcast: {t.name} has {t.ndim} dimensions, more than the "
                            f"{len(index)} of the index")
    idx = index[len(index) - t.ndim:]
    return t[tuple(as_expr(0) if d == 1 else i for d, i in zip(t.shape, idx))]


def _default_schedule(outputs) -> Schedule:
    from .compiler.cpu.schedules import schedule_elementwise

    s = schedule_elementwise(outputs[0])
    if len(outputs) > 1:  # the other outputs' stages, scheduled the same way
        s2 = create_schedule(list(outputs))
        for stage in s2.stages:
            if stage.is_placeholder:
                continue
            data = [iv for iv in stage.leaves if iv.kind == "data"]
            if data:
                stage.parallel(data[0])
        return s2
    return s


def _frozen(v):
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    raise OpError(f"constant argument {v!r} ({type(v).__name__}): an operator's non-tensor "
                  f"arguments are compile-time constants: bool, int, float, str or tuples")


def _is_tensor(x) -> bool:
    return isinstance(x, np.ndarray) or hasattr(x, "__dlpack__")


class Op:
    """A Python-defined operator (module docstring); made by ``@celosia.op``."""

    def __init__(self, fn, target, name: str, outputs: int, max_builds: int,
                 config=None, executor: str = "fsim", intrinsic: str = "gemm", tune: int = 0):
        self.fn, self.target, self.name = fn, target, name
        self.tune = tune
        self.targets = (target,) if isinstance(target, str) else tuple(target)
        self.last_target = None      # the target of the last call's build
        self.last_fallback = None    # why the accelerator did not take it (a fallback)
        self.config, self.executor, self.intrinsic = config, executor, intrinsic
        self._device = None      # the accelerator target's Device, made on the first build
        self.last_stats: dict = {}   # the accelerator's counters of the last call
        self.last_build = None       # the kernel of the last call (accel: an AccelKernel)
        self.num_outputs, self.max_builds = outputs, max_builds
        params = list(inspect.signature(fn).parameters.values())
        self.tensor_params = [p.name for p in params if p.default is inspect.Parameter.empty
                              and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.constant_params = {p.name: p.default for p in params
                                if p.default is not inspect.Parameter.empty}
        self._builds: dict = {}
        self._placed: dict = {}  # build key -> (target, why the accelerator did not take it)
        self._lock = threading.RLock()
        self._torch_op = None
        self.builds = 0          # compilations made (cache misses)
        self.last_pointers: list = []   # data addresses the last call's kernel ran on
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__
        if "torch" in sys.modules:  # registered now: torch.compile cannot register it later
            self._torch_op = _register_torch(self)

    def __repr__(self) -> str:
        return (f"celosia.op {self.name}({', '.join(self.tensor_params)}; target "
                f"{self.target!r}, {len(self._builds)} builds cached)")

    @property
    def device(self):
        """The accelerator target's ``Device`` (its ``executor`` on ``config``)."""
        if self._device is None:
            from .driver import Device

            self._device = Device(self.config, target=self.executor)
        return self._device

    # ---- building ------------------------------------------------------------------------

    def define(self, types, constants: dict | None = None):
        """The tensor expressions for inputs of ``types`` ([(shape, dtype)]): (placeholders,
        outputs, schedule or None)."""
        constants = {**self.constant_params, **(constants or {})}
        holders = [te.placeholder(tuple(shape), dtype, name)
                   for name, (shape, dtype) in zip(self.tensor_params, types)]
        result = self.fn(*holders, **constants)
        sched = None
        if isinstance(result, te.Tensor):
            outs = [result]
        elif isinstance(result, (tuple, list)):
            items = list(result)
            if items and isinstance(items[-1], Schedule):
                sched = items.pop()
            outs = items
        else:
            outs = []
        if not outs or not all(isinstance(t, te.Tensor) for t in outs):
            raise OpError(f"celosia.op {self.name}: the function must return te tensors "
                          f"(te.compute results), optionally followed by a Schedule; it "
                          f"returned {type(result).__name__}")
        if len(outs) != self.num_outputs:
            raise OpError(f"celosia.op {self.name}: the function returned {len(outs)} "
                          f"outputs; declare @celosia.op(outputs={len(outs)})")
        bad = [t.name for t in outs if t in holders]
        if bad:
            raise OpError(f"celosia.op {self.name}: output {bad[0]} is an input; return a "
                          f"te.compute of it")
        return holders, outs, sched

    def kernel(self, types, constants: dict | None = None):
        """The compiled kernel for inputs of ``types`` ([(shape, dtype)]), built once."""
        from .compiler.cpu.codegen import compile_cpu
        from .compiler.tensor.lower import lower

        key = (tuple((tuple(s), str(d)) for s, d in types),
               tuple(sorted((k, _frozen(v)) for k, v in (constants or {}).items())))
        with self._lock:
            hit = self._builds.get(key)
            if hit is not None:
                self._builds[key] = self._builds.pop(key)  # most recent last
                self.last_target, self.last_fallback = self._placed[key]
                return hit
            holders, outs, sched = self.define(types, constants)
            fallback = None
            for target in self.targets:
                if target == "accel":
                    try:
                        kernel = self._accel_kernel(holders, outs)
                    except AccelMappingError as e:
                        if target == self.targets[-1]:
                            raise
                        fallback = str(e)
                        continue
                else:
                    if sched is None:
                        sched = _default_schedule(outs)
                    used = [_in_schedule(sched, h) for h in holders]
                    kernel = compile_cpu(lower(sched, [h for h, u in zip(holders, used) if u]
                                               + list(outs), name=self.name))
                    if not all(used):  # an input the compute does not read is not passed
                        kernel = _skipping(kernel, used)
                break
            self._builds[key] = (kernel, [(t.shape, t.dtype) for t in outs])
            self._placed[key] = self.last_target, self.last_fallback = target, fallback
            self.builds += 1
            while len(self._builds) > self.max_builds:
                self._evict(next(iter(self._builds)))
            return self._builds[key]

    def _evict(self, key) -> None:
        old, _ = self._builds.pop(key)
        self._placed.pop(key, None)
        if hasattr(old, "free"):  # an accelerator build's DRAM
            old.free()

    def _accel_kernel(self, holders, outs):
        """The accelerator build (a schedule the function returns is for the CPU and is
        not used); when the device's DRAM is full, the other accelerator builds are
        dropped and it is tried once more."""
        from .compiler.accel.te_op import NotMappable
        from .driver.alloc import AllocationError
        from .op_accel import AccelKernel

        for attempt in (0, 1):
            try:
                return AccelKernel(self, holders, outs, self.device, self.intrinsic)
            except NotMappable as e:
                raise AccelMappingError(str(e)) from None
            except AllocationError as e:
                resident = [k for k, (kern, _) in self._builds.items() if hasattr(kern, "free")]
                if attempt or not resident:
                    raise OpError(f"celosia.op {self.name} (target accel): the build does not "
                                  f"fit the device's {self.device.executor.dram_size} bytes "
                                  f"of DRAM ({e}); use smaller shapes or target=\"cpu\"") from None
                for k in resident:
                    self._evict(k)

    # ---- calling -------------------------------------------------------------------------

    def _split(self, args, kwargs):
        if len(args) != len(self.tensor_params):
            raise OpError(f"celosia.op {self.name} takes {len(self.tensor_params)} tensors "
                          f"({', '.join(self.tensor_params)}), given {len(args)}")
        unknown = sorted(set(kwargs) - set(self.constant_params))
        if unknown:
            raise OpError(f"celosia.op {self.name}: unknown argument {unknown[0]!r}; its "
                          f"constants are {', '.join(self.constant_params) or 'none'}")
        return {k: _frozen(v) for k, v in kwargs.items()}

    def __call__(self, *args, out=None, **kwargs):
        """Run on tensors (numpy, torch, any CPU ``__dlpack__``); outputs in ``out`` when
        given (a tensor, or a list of them for several outputs). Torch tensors with no
        ``out`` go through the torch custom op, so ``torch.compile`` sees one operator."""
        if out is None and args and _is_torch(args[0]):
            return self.torch_op(*args, **kwargs)
        return self.run(*args, out=out, **kwargs)

    def run(self, *args, out=None, **kwargs):
        """Run directly (no torch dispatch); see ``__call__``."""
        from .runtime.dlpack import as_array

        constants = self._split(args, kwargs)
        arrays = []
        for name, x in zip(self.tensor_params, args):
            if not _is_tensor(x):
                raise OpError(f"celosia.op {self.name}: argument {name} is a "
                              f"{type(x).__name__}; pass a numpy array or a CPU tensor with "
                              f"__dlpack__ (constants go by keyword)")
            a = as_array(x, f"celosia.op {self.name}: argument {name}")
            te.check_dtype(a.dtype, f"celosia.op {self.name}: argument {name}")
            arrays.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
        if "accel" in self.targets:
            # one program runs on the device at a time, and no other call evicts this
            # call's build (freeing its DRAM) between its lookup and its run
            with self._lock:
                return self._run(args, arrays, constants, out)
        return self._run(args, arrays, constants, out)

    def _run(self, args, arrays, constants, out):
        from .runtime.dlpack import as_array

        kernel, out_types = self.kernel([(a.shape, a.dtype) for a in arrays], constants)
        if out is None:
            first = args[0] if args else None
            results = [_new_like(first, shape, dtype) for shape, dtype in out_types]
        else:
            results = list(out) if isinstance(out, (list, tuple)) else [out]
            if len(results) != len(out_types):
                raise OpError(f"celosia.op {self.name}: out has {len(results)} tensors; the "
                              f"operator gives {len(out_types)}")
        outs = []
        for k, (r, (shape, dtype)) in enumerate(zip(results, out_types)):
            a = as_array(r, f"celosia.op {self.name}: out[{k}]")
            if a.shape != tuple(shape) or a.dtype != np.dtype(dtype) or \
                    not a.flags.c_contiguous or not a.flags.writeable:
                raise OpError(f"celosia.op {self.name}: out[{k}] is "
                              f"{'a read-only ' if not a.flags.writeable else ''}"
                              f"{a.dtype}{list(a.shape)}"
                              f"{'' if a.flags.c_contiguous else ' (not C-contiguous)'}; "
                              f"output {k} is {dtype}{list(shape)}: pass a writable "
                              f"C-contiguous tensor of that dtype and shape")
            outs.append(a)
        kernel(*arrays, *outs)
        if not hasattr(kernel, "program"):  # not an accelerator build
            self.last_stats = {}
        self.last_pointers = [a.ctypes.data for a in (*arrays, *outs)]
        self.last_build = kernel
        return results[0] if len(results) == 1 else tuple(results)

    # ---- PyTorch --------------------------------------------------------------------------

    @property
    def torch_op(self):
        """The ``torch.library`` custom op ``celosia::<name>`` (registered on first use)."""
        if self._torch_op is None:
            import torch

            if torch.compiler.is_compiling():
                raise OpError(f"celosia.op {self.name} was defined before torch was imported "
                              f"and is first called inside torch.compile, where a custom op "
                              f"cannot be registered: import torch before defining it, or "
                              f"touch {self.name}.torch_op once before compiling")
            self._torch_op = _register_torch(self)
        return self._torch_op


def _in_schedule(sched: Schedule, t) -> bool:
    try:
        sched[t]
    except CompilerError:
        return False
    return True


def _skipping(kernel, used: list):
    """``kernel`` called with the op's arrays, leaving out the unused inputs'."""
    def call(*arrays):
        return kernel(*(a for a, u in zip(arrays, used + [True] * len(arrays)) if u))
    return call


def _is_torch(x) -> bool:
    t = type(x)
    return t.__module__.startswith("torch") and t.__name__ in ("Tensor", "Parameter",
                                                                "FakeTensor", "FunctionalTensor")


def _new_like(first, shape, dtype):
    if first is not None and _is_torch(first):
        import torch

        return torch.empty(tuple(shape), dtype=getattr(torch, "bool" if dtype == "bool"
                                                       else dtype))
    return np.empty(shape, dtype)


_SCHEMA_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}


def _register_torch(o: Op):
    import torch

    consts = []
    for k, v in o.constant_params.items():
        kind = _SCHEMA_TYPES.get(type(v))
        if kind is None:
            raise OpError(f"celosia.op {o.name}: constant {k}={v!r} has no torch.library type; "
                          f"torch ops take bool, int, float or str constants")
        consts.append(f"{kind} {k}={v!r}" if kind != "bool" else f"bool {k}={v}")
    params = [f"Tensor {n}" for n in o.tensor_params] + consts
    ret = "Tensor" if o.num_outputs == 1 else "(" + ", ".join(["Tensor"] * o.num_outputs) + ")"
    schema = f"({', '.join(params)}) -> {ret}"
    names = o.tensor_params + list(o.constant_params)

    def impl(*args):
        tensors = args[:len(o.tensor_params)]
        constants = dict(zip(names[len(o.tensor_params):], args[len(o.tensor_params):]))
        return o.run(*(t.contiguous() for t in tensors), **constants)

    def fake(*args):
        tensors = args[:len(o.tensor_params)]
        constants = dict(zip(names[len(o.tensor_params):], args[len(o.tensor_params):]))
        types = []
        for n, t in zip(o.tensor_params, tensors):
            try:
                shape = tuple(int(d) for d in t.shape)
            except Exception:  # noqa: BLE001 - a symbolic size
                raise OpError(f"celosia.op {o.name}: argument {n} has a symbolic shape "
                              f"{tuple(t.shape)}; the operator builds per static shape: "
                              f"torch.compile(..., dynamic=False)") from None
            types.append((shape, str(t.dtype).removeprefix("torch.")))
        _, outs, _ = o.define(types, constants)
        res = [tensors[0].new_empty(t.shape, dtype=getattr(torch, t.dtype)) for t in outs]
        return res[0] if len(res) == 1 else tuple(res)

    qualified = f"celosia::{o.name}"
    opdef = torch.library.custom_op(qualified, impl, mutates_args=(), device_types="cpu",
                                    schema=schema)
    opdef.register_fake(fake)
    return opdef


def op(fn=None, *, target: str | tuple = "cpu", name: str | None = None, outputs: int = 1,
       max_builds: int = 64, config=None, executor: str = "fsim", intrinsic: str = "gemm",
       tune: int = 0):
    """Decorate a tensor-expression function as an operator (module docstring).
    ``name``: the torch custom op's name (``celosia::<name>``; default the function's);
    ``outputs``: how many tensors it returns; ``max_builds``: builds kept (least recently
    used dropped). ``target``: "cpu", "accel", or a tuple tried in order per build
    (``("accel", "cpu")``: the CPU where the compute does not map; ``op.last_target`` and
    ``op.last_fallback`` say which and why). For the accelerator: ``config`` (a preset
    name such as "small" or "default", a JSON path or an HwConfig; default "default"),
    ``executor`` ("fsim", "cycle" or "rtl"), ``intrinsic`` (the registered tensor intrinsic the
    product is tensorized with), ``tune`` (measure that many of the best-estimated tilings
    on the cycle model per build and keep the fastest; 0: the best estimate)."""
    targets = (target,) if isinstance(target, str) else tuple(target)
    for t in targets:
        if t not in TARGETS:
            raise OpError(f"celosia.op: target {t!r} is not supported; targets: "
                          f"{', '.join(TARGETS)} (or a tuple of them, tried in order: "
                          f"(\"accel\", \"cpu\"))")
    if not targets or len(set(targets)) != len(targets):
        raise OpError(f"celosia.op: target {target!r}: name each target once")
    if "accel" in targets:
        from .config import HwConfig
        from .op_accel import EXECUTORS

        if executor not in EXECUTORS:
            raise OpError(f"celosia.op: executor {executor!r} is not supported for target "
                          f"accel; executors: {', '.join(EXECUTORS)}")
        config = HwConfig.load(config)
        if isinstance(tune, bool) or not isinstance(tune, int) or tune < 0:
            raise OpError(f"celosia.op: tune={tune!r}: give how many tilings to measure "
                          f"(0 for none)")
    elif config is not None or executor != "fsim" or intrinsic != "gemm" or tune:
        raise OpError("celosia.op: config, executor, intrinsic and tune are options of "
                      "target=\"accel\"; target \"cpu\" takes none of them")

    def wrap(f):
        return Op(f, target, name or f.__name__, outputs, max_builds, config, executor,
                  intrinsic, tune)
    return wrap(fn) if fn is not None else wrap
