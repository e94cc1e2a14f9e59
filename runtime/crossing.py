"""Values crossing between the CPU and the accelerator, planned once per executor.

runtime/accel.py packs a value the CPU made into its DRAM buffer before an accelerator
node reads it, and unpacks a value the accelerator made when a CPU node (or the caller)
reads it. Both are the same conversion every run: the value's type, its packed shape, its
DRAM address and (with an executor that offers views of its DRAM, ``Executor.dram_view``)
the memory there do not change. A ``Crossing`` works out once what can be: the DRAM view in
the packed shape, the views that pair each part of the plain value with its bytes in the
packed layout (the whole channel blocks, the last partial block), the padding lanes, the
compiled kernel bound to the DRAM view (compiler/cpu/packed_layout.py, large images of
BATCH 1) and the host buffer it unpacks into. A run's crossing is then a few numpy copies
between precomputed views, or one C call whose only per-run argument is the pointer of the
CPU's array, instead of the set-up ``partition.pack_value`` / ``unpack_value`` and
``packed_layout.pack_fast`` / ``unpack_fast`` repeat at every call (slicing and reshaping,
a fresh array, binding the kernel: checking its arguments, 20-80 us a call on this
machine, about as much as the conversion of a small value itself).

A value the CPU writes into the host buffer the runtime keeps for it (``out``; runtime/
accel.py ``_segment_out``) is packed from the same memory every run, so that crossing is
bound to both ends once: the layout kernel of a large image, or copies between views of
both made once, called with no argument (no checks or pointer per run, which cost more
than the copy itself on the cold caches a run leaves; docs/runtime.md).

The bytes are those of ``pack_value`` / ``unpack_value`` (tests/runtime/test_crossing.py):
the padding lanes and rows are written as zeros on every pack, as ``pack_value`` does into
memory that held anything. What is not planned (the "matrices" layout, an executor without
views, a view value's root) keeps the general functions.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["Crossing", "Plan", "blocked_plan", "blocked_pairs", "nchw_plan", "pairs", "matrix_plan",
           "weight_plan", "staged_packer"]


class Plan:
    """A blocked layout's pieces (``blocked_plan``): ``pieces`` [(packed view, index into
    the plain value, split shape)], ``pads`` (views of the packed bytes no element maps
    to) and ``shape`` (the plain value as the pieces index it, e.g. NCHW for [N, C, L])."""

    def __init__(self, pieces: list, pads: list, shape: tuple, base: np.ndarray):
        self.pieces, self.pads, self.shape, self.base = pieces, pads, tuple(shape), base

    @functools.cached_property
    def zero_all(self) -> bool:
        """Whether ``pack`` zeroes the whole buffer (one memset) before writing the value
        rather than its padding views: when padding is a quarter of it or more (one channel
        of 16: a strided fill of 15 bytes in 16 took 3-4 times the memset)."""
        return sum(p.size for p in self.pads) * 4 >= self.base.size

    def pairs(self, plain: np.ndarray) -> list:
        """[(packed view, plain view)]: views of ``plain`` (any array of the value's
        elements) where its strides allow, copies otherwise (then only to read)."""
        x = plain.reshape(self.shape)
        return [(p, x[i].reshape(sh)) for p, i, sh in self.pieces]

    def pack(self, plain: np.ndarray, copy=np.copyto) -> None:
        """The packed bytes of ``plain``, padding zeroed."""
        x = plain.reshape(self.shape)
        if self.zero_all:
            self.base.fill(0)
        for p, i, sh in self.pieces:
            copy(p, x[i].reshape(sh))
        if not self.zero_all:
            for pad in self.pads:
                pad.fill(0)


def _image(shape: tuple) -> tuple:
    """A [N, C, L] value's shape as the image [N, C, 1, L] the packed layout treats it as;
    other shapes as they are."""
    shape = tuple(shape)
    return shape if len(shape) != 3 else (shape[0], shape[1], 1, shape[2])


def blocked_plan(packed: np.ndarray, shape: tuple, axes: list) -> Plan:
    """The pieces of a blocked layout: ``axes`` gives, per axis of the plain value (of
    ``shape``) in order, the axis of ``packed`` that holds it (an int) or the two that do,
    (outer block, index in the block), so that element i of that axis is ``packed[...,
    i // k, ..., i % k, ...]`` with k the inner axis' extent. Each piece is the same
    elements in both (the whole blocks of each blocked axis, then its last partial block:
    up to two pieces per blocked axis), together all of the value; the padding views are
    the packed elements no plain element maps to (past the end in a last partial block, or
    whole blocks past the end)."""
    perm = [a for ax in axes for a in ((ax,) if isinstance(ax, int) else ax)]
    whole = packed.transpose(perm)
    choices = []  # per plain axis: [(packed index, plain index, split shape)]
    pads = []
    at = 0  # the axis of ``whole`` the plain axis starts at
    for d, ax in enumerate(axes):
        size = shape[d]
        if isinstance(ax, int):
            choices.append([((slice(None),), slice(None), (size,))])
            at += 1
            continue
        k = whole.shape[at + 1]
        full, rem = divmod(size, k)
        options = []
        if full:
            options.append(((slice(0, full), slice(None)), slice(0, full * k), (full, k)))
        if rem:
            options.append(((slice(full, full + 1), slice(0, rem)), slice(full * k, size),
                            (1, rem)))
            pads.append(whole[(slice(None),) * at + (slice(full, full + 1), slice(rem, None))])
        used = full + (1 if rem else 0)
        if whole.shape[at] > used:  # whole blocks past the end (padding rows)
            pads.append(whole[(slice(None),) * at + (slice(used, None),)])
        choices.append(options)
        at += 2
    pieces = []

    def walk(d, pidx, xidx, split):
        if d == len(choices):
            pieces.append((whole[pidx], xidx, split))
            return
        for pi, xi, sh in choices[d]:
            walk(d + 1, pidx + pi, xidx + (xi,), split + sh)
    walk(0, (), (), ())
    return Plan(pieces, pads, shape, packed)


def blocked_pairs(packed: np.ndarray, plain: np.ndarray, axes: list) -> tuple[list, list]:
    """([(packed view, plain view)], [padding views]) of ``blocked_plan``: views of
    ``plain`` when it is C-contiguous (or any array whose blocked axes have one stride
    each)."""
    plan = blocked_plan(packed, plain.shape, axes)
    return plan.pairs(plain), plan.pads


def nchw_plan(packed: np.ndarray, shape: tuple, b: int, k: int) -> Plan | None:
    """The plan of an NCHW (or [N, C], or [N, C, L]) int8 value of ``shape`` and its
    packed layout ``packed`` ([N/b, C/k, *spatial, b, k], or [rows/b, C/k, b, k]:
    partition.packed_shape); None if the shapes do not fit that layout."""
    shape = _image(shape)
    n, c = shape[:2]
    spatial = tuple(shape[2:])
    nd = len(spatial)
    if n % b or packed.ndim != nd + 4 or packed.shape[-2:] != (b, k) or \
            packed.shape[1] != -(-c // k) or tuple(packed.shape[2:-2]) != spatial or \
            packed.shape[0] * b < n:
        return None
    return blocked_plan(packed, shape, [(0, nd + 2), (1, nd + 3), *range(2, 2 + nd)])


def pairs(packed: np.ndarray, plain: np.ndarray, b: int, k: int) -> tuple[list, list] | None:
    """([(packed view, plain view)], [padding views]) of ``nchw_plan``, or None."""
    plan = nchw_plan(packed, plain.shape, b, k)
    return None if plan is None else (plan.pairs(plain), plan.pads)


def matrix_plan(packed: np.ndarray, shape: tuple, b: int, k: int) -> Plan | None:
    """The plan of a [..., rows, cols] value in the "matrices" layout (G, S)
    (compiler/accel/matmul.py pack_matrices: per matrix [rows/b, cols/k, b, k], then
    padding up to the stride S); the bytes past each matrix are padding too. None if the
    shapes do not fit."""
    rows, cols = shape[-2:]
    return _grouped_plan(packed, math.prod(shape[:-2]), (-(-rows // b), -(-cols // k), b, k),
                         (rows, cols), [0, (1, 3), (2, 4)])


def weight_plan(packed: np.ndarray, shape: tuple, k: int) -> Plan | None:
    """The plan of a QMatMul's second operand b [..., K, N] in the weight layout (G, S)
    (matmul.pack_weights: per matrix b^T as [N/k, K/k, k, k], element [j, ko, oo, ki] =
    b[ko * k + ki, j * k + oo], then padding up to S). None if the shapes do not fit."""
    kdim, ndim = shape[-2:]
    return _grouped_plan(packed, math.prod(shape[:-2]), (-(-ndim // k), -(-kdim // k), k, k),
                         (kdim, ndim), [0, (2, 4), (1, 3)])


def _grouped_plan(packed: np.ndarray, g: int, blocks: tuple, matrix: tuple,
                  axes: list) -> Plan | None:
    """The plan of ``g`` matrices of shape ``matrix`` packed one per row of ``packed`` (G, S)
    as ``blocks`` (then padding up to S, which the plan zeroes too); ``axes`` as in
    ``blocked_plan`` for the plain [G, *matrix]. None if the shapes do not fit."""
    raw = math.prod(blocks)
    if packed.ndim != 2 or packed.shape[0] != g or packed.shape[1] < raw:
        return None
    plan = blocked_plan(packed[:, :raw].reshape(g, *blocks), (g, *matrix), axes)
    if packed.shape[1] > raw:
        plan.pads.append(packed[:, raw:])
    plan.base = packed
    return plan


def staged_packer(dram: np.ndarray, shape: tuple, cfg):
    """A function of b [..., K, N] int8 writing it into ``dram`` (a DRAM view of the
    weight layout's shape) as matmul.pack_weights does, the views made once; None if the
    shapes do not fit (then pack_weights does it)."""
    plan = weight_plan(dram, tuple(shape), cfg.block)
    if plan is None:
        return None
    shape = tuple(shape)

    def pack(x):
        x = np.asarray(x)
        if x.dtype != np.int8 or x.shape != shape:
            from ..compiler.accel.matmul import pack_weights

            pack_weights(x, cfg, out=dram)
            return
        plan.pack(x)

    def fixed(src: np.ndarray):
        """The packing of ``src`` (the value's host buffer kept from run to run) as a
        function of no arguments: the compiled weight-layout kernel bound to both
        (compiler/cpu/weight_layout.py: one C call; numpy's byte-strided transpose of an
        attention's [12, 32, 128] keys took 40-90 us in a run), else the copies between
        views of both made once."""
        if src.dtype != np.int8 or src.shape != shape or not src.flags.c_contiguous:
            return functools.partial(pack, src)
        k = cfg.block
        if 2 <= k <= 64 and not k & (k - 1) and dram.flags.c_contiguous and dram.ndim == 2:
            from ..compiler.cpu.weight_layout import weights_kernel

            g, kdim, ndim = dram.shape[0], shape[-2], shape[-1]
            return weights_kernel(g, kdim, ndim, k, dram.shape[1]).bind(
                src.reshape(g, kdim, ndim), dram, serial=True)
        return Crossing._copies(plan, src)
    pack.fixed = fixed
    return pack


def _in_order(plan: Plan, shape: tuple) -> np.ndarray | None:
    """The packed bytes as a C-contiguous array of the value's ``shape`` if they hold it in
    row-major order (one piece that reshapes without a copy: e.g. a "matrices" operand of
    BATCH 1 whose columns are whole blocks), else None."""
    if len(plan.pieces) != 1:
        return None
    flat = plan.pieces[0][0].view()
    try:
        flat.shape = shape  # (a view or an AttributeError, never a copy)
    except AttributeError:
        return None
    return flat if flat.flags.c_contiguous else None


class Crossing:
    """One value's way across the border on one executor (module doc): ``pack(x)`` writes
    int8 ``x`` into the value's DRAM buffer in the packed layout, ``unpack()`` returns the
    value read from it, into ``out`` (an array of the value's shape kept from run to run)
    when given at construction, else a fresh array. Both give the bytes of
    partition.pack_value / unpack_value."""

    def __init__(self, ex, addr: int, packed_shape, shape, cfg, *, layout=None,
                 out: np.ndarray | None = None):
        from ..compiler.accel.partition import _row_major
        from ..compiler.cpu.packed_layout import compiled_layout

        self.ex, self.addr, self.cfg, self.layout = ex, addr, cfg, layout
        self.packed_shape, self.shape = tuple(packed_shape), tuple(shape)
        self.out = out
        size = math.prod(self.packed_shape)
        raw = ex.dram_view(addr, size) if layout in (None, "matrices") else None
        self.dram = None if raw is None else raw.view(np.int8).reshape(self.packed_shape)
        self.image = image = _image(self.shape)
        b, k = cfg.batch, cfg.block
        self.kind = "general"  # pack_value / unpack_value through read_dram / write_dram
        self._packer = self._unpacker = None
        self._pack_out, self._bound_ok = None, False  # (set below where the plan allows)
        if self.dram is None:
            return
        if layout is None and _row_major(image, self.packed_shape, b, k):
            self.kind = "row_major"  # the packed bytes are the value's, in order
            self._row_pads = []
            self._flat = self.dram.reshape(self.shape)
        elif layout is None and len(image) == 4 and \
                compiled_layout(image, self.packed_shape, b, k):
            self.kind = "compiled"
        else:
            plan = (matrix_plan(self.dram, self.shape, b, k) if layout == "matrices" else
                    nchw_plan(self.dram, self.shape, b, k))
            if plan is None:
                self.dram = None
                return
            self.kind = "views"
            self._plan = plan
            flat = _in_order(plan, self.shape)
            if flat is not None:  # the value's bytes, in order, at the buffer's start
                self.kind, self._flat, self._row_pads = "row_major", flat, plan.pads
            self._out_pairs = plan.pairs(out) if out is not None else None
            if out is not None and not all(np.may_share_memory(d, out)
                                           for _, d in self._out_pairs):
                self._out_pairs = None  # (not views of ``out``: unpack into fresh arrays)
                self.out = out = None
        # the packing of ``out`` bound to both ends (made on its first pack), where the
        # layout kernel or views of ``out`` serve
        self._bound_ok = (out is not None and self.kind in ("views", "compiled") and
                          out.flags.c_contiguous and out.dtype == np.int8 and
                          out.shape == self.shape)
        if self.kind == "row_major":  # (the common cases as closures: no dispatch per run)
            # the DRAM bytes are the value: a view (a value's buffer is written once per
            # run, so it stays valid while the run reads it; run() copies outputs)
            self.unpack = lambda flat=self._flat: flat
        elif self._bound_ok and self.kind == "compiled":
            # both ends fixed (the DRAM view, the host buffer kept from run to run): the
            # layout kernel bound to them once, one C call per run with no argument (for
            # a large image; a small value's few numpy copies below cost less on cold
            # caches than a ctypes call: [64, 10], 16 us against 23 us after a flush)
            run = self._bound("unpack")

            def unpack(run=run, out=out):
                run()
                return out
            self.unpack = unpack
        elif self.kind == "views" and out is not None:
            # (an assignment to ``dst[...]`` rather than np.copyto: the same copy, with
            # less code around it: after a cache flush 7 us against 11 us for [64, 10])
            def unpack(todo=tuple(self._out_pairs), out=out):
                for src, dst in todo:
                    dst[...] = src
                return out
            self.unpack = unpack

    # ---- packing: host -> DRAM ------------------------------------------------------------

    def _bound(self, op: str):
        """The compiled layout kernel (packed_layout.layout_kernel, any size) of this value
        bound once to its DRAM view and its host buffer ``out``: a function of no arguments
        (one C call) converting ``out`` into the DRAM bytes ("pack") or back ("unpack")."""
        from ..compiler.cpu.packed_layout import layout_kernel

        n, c = self.image[:2]
        p = math.prod(self.image[2:])
        k = self.cfg.block
        kernel = layout_kernel(op, n, c, p, k)
        dram, plain = self.dram.reshape(n, -(-c // k), p, k), self.out.reshape(n, c, p)
        return kernel.bind(*((plain, dram) if op == "pack" else (dram, plain)), serial=True)

    @staticmethod
    def _copies(plan: Plan, out: np.ndarray):
        """``plan.pack(out)`` as a function of no arguments, the views of ``out`` made once
        (with its padding zeroed as ``Plan.pack`` zeroes it)."""
        todo = tuple(plan.pairs(out))
        pads, base = tuple(plan.pads), plan.base

        if plan.zero_all:
            def run(todo=todo, base=base):
                base.fill(0)
                for dst, src in todo:
                    dst[...] = src
        else:
            def run(todo=todo, pads=pads):
                for dst, src in todo:
                    dst[...] = src
                for pad in pads:
                    pad.fill(0)
        return run

    def pack(self, x: np.ndarray) -> None:
        if x is self.out and self._bound_ok:
            # the host buffer kept for this value, which the CPU segment that makes it
            # writes into (AccelModel._segment_out): a large image by the kernel bound to
            # both ends, a small value by the copies between views of both made once
            run = self._pack_out
            if run is None:
                run = self._pack_out = (self._bound("pack") if self.kind == "compiled" else
                                        self._copies(self._plan, out=x))
            run()
            return
        x = np.asarray(x)
        kind = self.kind
        if x.dtype != np.int8 or x.shape != self.shape:
            kind = "general"  # (pack_value converts or raises as before)
        if kind == "row_major":
            np.copyto(self._flat, x)
            for pad in self._row_pads:
                pad.fill(0)
        elif kind == "views":
            self._plan.pack(x)
        elif kind == "compiled":
            x = np.ascontiguousarray(x)
            if self._packer is None:
                self._packer = _Rebindable("pack", self.image, self.cfg.block, self.dram)
            self._packer(x.reshape(self.image))
        else:
            if self.dram is not None:
                _pack(x, self.cfg, self.layout, self.dram)
            else:
                self.ex.write_dram(self.addr, _pack(x, self.cfg, self.layout))

    # ---- unpacking: DRAM -> host ----------------------------------------------------------

    def unpack(self) -> np.ndarray:
        """(A "row_major" crossing, and a "views" one with ``out``, replace this with the
        closures __init__ makes.)"""
        kind = self.kind
        if kind == "views":  # into a fresh array
            out = np.empty(self.shape, np.int8)
            for src, dst in self._plan.pairs(out):
                np.copyto(dst, src)
            return out
        if kind == "compiled":
            out = np.empty(self.shape, np.int8) if self.out is None else self.out
            if self._unpacker is None:
                self._unpacker = _Rebindable("unpack", self.image, self.cfg.block, self.dram)
            self._unpacker(out.reshape(self.image))
            return out
        if self.dram is not None:
            raw = self.dram
        else:
            raw = self.ex.read_dram(self.addr, math.prod(self.packed_shape)).view(
                np.int8).reshape(self.packed_shape)
        return _unpack(raw, self.shape, self.layout, self.cfg, self.out)


class _Rebindable:
    """A compiled layout kernel (packed_layout.layout_kernel) bound once to a DRAM view,
    called with the host array: per call only that array's pointer changes (binding
    checks every argument, tens of microseconds, each time pack_fast/unpack_fast run)."""

    def __init__(self, op: str, image: tuple, k: int, dram: np.ndarray):
        from ..compiler.cpu.packed_layout import layout_kernel

        n, c = image[:2]
        p = math.prod(image[2:])
        self.op, self.plain_shape = op, (n, c, p)
        self.kernel = layout_kernel(op, n, c, p, k)
        self.dram = dram.reshape(n, -(-c // k), p, k)
        template = np.empty(self.plain_shape, np.int8)
        args = (template, self.dram) if op == "pack" else (self.dram, template)
        bound = self.kernel.bind(*args, serial=True)
        # a single-segment kernel binds to partial(fn, pointers, 0, extent): the plain
        # array's slot is rewritten per call
        self.bound = bound if isinstance(bound, functools.partial) else None
        self.slot = 0 if op == "pack" else 1

    def __call__(self, plain: np.ndarray) -> None:
        plain = plain.reshape(self.plain_shape)
        if self.bound is None or not plain.flags.c_contiguous or \
                np.may_share_memory(plain, self.dram):
            args = (plain, self.dram) if self.op == "pack" else (self.dram, plain)
            self.kernel.bind(*args, serial=True)()  # (checks and raises as it did)
            return
        self.bound.args[0][self.slot] = plain.ctypes.data
        self.bound()


def _pack(x: np.ndarray, cfg, layout: str | None = None, out: np.ndarray | None = None):
    """partition.pack_value, an image of BATCH 1 and 16 KiB or more by the compiled kernel
    (compiler/cpu/packed_layout.py); into ``out`` (DRAM) when given."""
    from ..compiler.accel.partition import pack_value, packed_shape
    from ..compiler.cpu.packed_layout import compiled_layout, pack_fast

    x = np.asarray(x)
    image = _image(x.shape)
    if layout is None and x.dtype == np.int8 and len(image) == 4:
        shape = packed_shape(image, cfg)
        if compiled_layout(image, shape, cfg.batch, cfg.block):
            out = np.empty(shape, np.int8) if out is None else out
            pack_fast(x.reshape(image), out, cfg.block)
            return out
    return pack_value(x, cfg, layout, out=out)


def _unpack(p: np.ndarray, shape: tuple, layout, cfg, out: np.ndarray | None = None):
    """partition.unpack_value, an image of BATCH 1 and 16 KiB or more by the compiled kernel
    into ``out`` (an array of ``shape`` kept from run to run) or a fresh one."""
    from ..compiler.accel.partition import unpack_value
    from ..compiler.cpu.packed_layout import compiled_layout, unpack_fast

    image = _image(shape)
    if layout is None and len(image) == 4 and \
            compiled_layout(image, p.shape, p.shape[-2], p.shape[-1]):
        out = np.empty(shape, np.int8) if out is None else out
        unpack_fast(p, out.reshape(image), p.shape[-1])
        return out
    return unpack_value(p, shape, layout, cfg)
