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

The bytes are those of ``pack_value`` / ``unpack_value`` (tests/runtime/test_crossing.py):
the padding lanes and rows are written as zeros on every pack, as ``pack_value`` does into
memory that held anything. What is not planned (the "matrices" layout, an executor without
views, a view value's root) keeps the general functions.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["Crossing", "pairs"]


def pairs(packed: np.ndarray, plain: np.ndarray, b: int, k: int) -> tuple[list, list]:
    """([(packed view, plain view)], [padding views of packed]) of an NCHW (or [N, C], or
    [N, C, L]) int8 value ``plain`` and its packed layout ``packed`` ([N/b, C/k, *spatial,
    b, k], or [rows, C/k, b, k]): each pair the same elements in both, together all of the
    value; the padding views the packed bytes no element maps to (channels past C in the
    last block, row groups past N/b). None if the shapes do not fit that layout."""
    shape = plain.shape if plain.ndim != 3 else (plain.shape[0], plain.shape[1], 1,
                                                 plain.shape[2])
    n, c = shape[:2]
    spatial = tuple(shape[2:])
    if n % b or packed.ndim != len(spatial) + 4 or packed.shape[-2:] != (b, k) or \
            packed.shape[1] != -(-c // k) or tuple(packed.shape[2:-2]) != spatial or \
            packed.shape[0] * b < n:
        return None
    x = plain.reshape(shape)
    axes = (0, len(spatial) + 2, 1, len(spatial) + 3, *range(2, 2 + len(spatial)))
    whole = packed.transpose(axes)  # (rows/b, b, C/k, k, *spatial)
    view = whole[:n // b]
    full = c // k
    out, pad = [], []
    if full:
        out.append((view[:, :, :full], x[:, :full * k].reshape(n // b, b, full, k, *spatial)))
    if c > full * k:
        out.append((view[:, :, full:full + 1, :c - full * k],
                    x[:, full * k:].reshape(n // b, b, 1, c - full * k, *spatial)))
        pad.append(view[:, :, full:, c - full * k:])
    if whole.shape[0] > n // b:
        pad.append(whole[n // b:])
    return out, pad


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
        raw = ex.dram_view(addr, size) if layout is None else None
        self.dram = None if raw is None else raw.view(np.int8).reshape(self.packed_shape)
        image = self.shape if len(self.shape) != 3 else (self.shape[0], self.shape[1], 1,
                                                         self.shape[2])
        self.image = image
        b, k = cfg.batch, cfg.block
        self.kind = "general"  # pack_value / unpack_value through read_dram / write_dram
        self._packer = self._unpacker = None
        if self.dram is None:
            return
        if _row_major(image, self.packed_shape, b, k):
            self.kind = "row_major"  # the packed bytes are the value's, in order
            self._flat = self.dram.reshape(self.shape)
        elif len(image) == 4 and compiled_layout(image, self.packed_shape, b, k):
            self.kind = "compiled"
        else:
            plan = pairs(self.dram, np.empty(self.shape, np.int8), b, k)
            if plan is None:
                self.dram = None
                return
            self.kind = "views"
            self._pad = plan[1]
            self._out_pairs = (pairs(self.dram, out, b, k)[0] if out is not None else None)
        if self.kind == "row_major":  # (the common cases as closures: no dispatch per run)
            self.unpack = lambda flat=self._flat: flat
        elif self.kind == "views" and out is not None:
            def unpack(copy=np.copyto, todo=tuple(self._out_pairs), out=out):
                for src, dst in todo:
                    copy(dst, src)
                return out
            self.unpack = unpack

    # ---- packing: host -> DRAM ------------------------------------------------------------

    def pack(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        kind = self.kind
        if x.dtype != np.int8 or x.shape != self.shape:
            kind = "general"  # (pack_value converts or raises as before)
        if kind == "row_major":
            np.copyto(self._flat, x)
        elif kind == "views":
            for dst, src in pairs(self.dram, x, self.cfg.batch, self.cfg.block)[0]:
                np.copyto(dst, src)
            for pad in self._pad:
                pad.fill(0)
        elif kind == "compiled":
            x = np.ascontiguousarray(x)
            if self._packer is None:
                self._packer = _Rebindable("pack", self.image, self.cfg.block, self.dram)
            self._packer(x.reshape(self.image))
        else:
            from .accel import _pack

            if self.dram is not None:
                _pack(x, self.cfg, self.layout, self.dram)
            else:
                self.ex.write_dram(self.addr, _pack(x, self.cfg, self.layout))

    # ---- unpacking: DRAM -> host ----------------------------------------------------------

    def unpack(self) -> np.ndarray:
        kind = self.kind
        if kind == "row_major":
            # the DRAM bytes are the value: a view (a value's buffer is written once per
            # run, so it stays valid while the run reads it; run() copies outputs)
            return self._flat
        if kind == "views":
            out = self.out
            if out is None:
                out = np.empty(self.shape, np.int8)
                for src, dst in pairs(self.dram, out, self.cfg.batch, self.cfg.block)[0]:
                    np.copyto(dst, src)
            else:
                for src, dst in self._out_pairs:
                    np.copyto(dst, src)
            return out
        if kind == "compiled":
            out = np.empty(self.shape, np.int8) if self.out is None else self.out
            if self._unpacker is None:
                self._unpacker = _Rebindable("unpack", self.image, self.cfg.block, self.dram)
            self._unpacker(out.reshape(self.image))
            return out
        from .accel import _unpack

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
