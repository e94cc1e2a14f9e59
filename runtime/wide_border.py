"""The border of one wide product (compiler/accel/wide.py) run per step or iteration from
the host (runtime/accel_recurrent.py): the 16-bit operand into the program's operand
buffer, the accumulators' byte planes back into the int32 (or, exact, int64) product.

A recurrent layer crosses this border twice per time step, so what it costs is most of the
layer's layout time. Where the executor lets the CPU see its DRAM (``Executor.dram_view``,
as runtime/accel.py's in-place nodes use it) the border works on the program's buffers in
place, with BATCH = 1 (the default configuration) in one pass each way:

- the operand: its digit planes are the int16's own bytes, the high byte as it is and the
  low one XOR 0x80 (``wide.split_activation``), written by one ufunc from the int16 array
  straight into the buffer's [digits, M, K] planes (no packed copy, no DRAM write);
- the result: the byte planes [planes, M, O] gathered by one transposing copy from the
  buffer into [M, O, planes] bytes, which read as little-endian int32 are the accumulators
  (no DRAM read copy); exact products put their accumulators together in int64 and add
  the activation's correction, as ``wide.combine_exact`` does.

Elsewhere (another BATCH, an executor without views) it packs and unpacks with
``wide.pack_wide_activation`` / ``unpack_acc32`` / ``combine_exact`` through
``write_dram`` / ``read_dram``. Both ways give the same bits (tests/runtime/
test_wide_border.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["WideBorder"]

# XOR of an int16's (low, high) bytes: the low byte minus 128 as int8, the high byte as is
_FLIP = np.array([0x80, 0], np.uint8).reshape(2, 1, 1)
# Gathering the result's byte planes: one transposing copy for 8 or 12 planes of up to this
# many elements, else a strided copy per plane (measured here: 4 planes of 1024 elements
# 2.5 us per plane against 4.5 us whole, 12 of 256 3.8 against 1.8, 4 of 102400 114 against
# 755).
_GATHER_WHOLE_MAX = 4096


class WideBorder:
    """One product's border on executor ``ex`` (module doc); ``record``: the product's
    program record (accel_recurrent ``_build_products``), ``correction``: the exact
    product's activation correction (``wide.exact_correction``) or None."""

    def __init__(self, ex, cfg, record: dict, correction=None):
        self.cfg = cfg
        self.a_addr, self.out_addr = record["a_addr"], record["out_addr"]
        self.a_shape, self.out_shape = tuple(record["a_shape"]), tuple(record["out_shape"])
        self.rows = self.a_shape[1] * cfg.batch        # operand rows, padding included
        self.o = record["o"]
        # 0: int32 accumulators; 1: exact, accumulators put together here; 2: exact, the
        # int64 product's bytes (compiler/accel/wide.py ``WideSpec.carry``)
        self.mode = int(record["spec"][5])
        self.exact = self.mode >= 1
        self.correction = correction
        self.a_bytes = int(np.prod(self.a_shape))
        self.out_bytes = int(np.prod(self.out_shape))
        digits, mb, kb, b, k = self.a_shape
        planes, _, ob, _, _ = self.out_shape
        self.digits, self.planes = digits, planes
        a_view = ex.dram_view(self.a_addr, self.a_bytes) if cfg.batch == 1 else None
        out_view = ex.dram_view(self.out_addr, self.out_bytes) if a_view is not None else None
        self.in_place = out_view is not None
        # (in place the border keeps only views of the DRAM, not the executor: borders are
        # kept per executor, weakly, by runtime/accel_recurrent.py)
        self.ex = None if self.in_place else ex
        if self.in_place:
            # BATCH = 1: the layouts are [digits, M, K] and [planes, M, O] byte planes
            self.a_planes = a_view.reshape(digits, mb, kb * k)
            self.out_planes = out_view.reshape(planes, mb * ob * k)
            self.out_cols = ob * k
            self._dest_key, self._dest_view = None, None
            self._gather_plan = None

    def put(self, a: np.ndarray) -> None:
        """The operand ``a`` [m, K] (int16, or int8) into the program's buffer."""
        if not self.in_place:
            from ..compiler.accel.wide import pack_wide_activation

            self.ex.write_dram(self.a_addr, pack_wide_activation(a, self.cfg, rows=self.rows))
            return
        m, kd = a.shape
        if a.dtype == np.int16 and self.digits == 2:
            lo_hi = np.ascontiguousarray(a, "<i2").view(np.uint8).reshape(m, kd, 2)
            # planes [high, low ^ 0x80] = reversed [low, high] bytes XOR [0x80, 0]
            np.bitwise_xor(lo_hi.transpose(2, 0, 1), _FLIP, out=self._dest(m, kd))
        elif a.dtype == np.int8 and self.digits == 1:
            np.copyto(self._dest(m, kd)[0], a.view(np.uint8))
        else:
            raise ValueError(f"a {a.dtype} operand for a program of {self.digits} digit "
                             f"planes")

    def _dest(self, m: int, kd: int) -> np.ndarray:
        """The [digits, m, kd] planes of the operand buffer (the low digit first, where
        the digits are reversed for the int16's byte order); kept per shape: a layer
        launches the same product every step."""
        key = (m, kd)
        if key != self._dest_key:
            if m > self.rows or kd > self.a_planes.shape[2]:
                raise ValueError(f"a [{m}, {kd}] operand for a [{self.rows}, "
                                 f"{self.a_planes.shape[2]}] buffer")
            planes = self.a_planes[::-1] if self.digits == 2 else self.a_planes
            self._dest_key, self._dest_view = key, planes[:, :m, :kd]
        return self._dest_view

    def take(self, m: int) -> np.ndarray:
        """The product's [m, O] result: int32 accumulators, or the exact int64 product (in
        place: a view of a buffer of this border's, valid until the product's next
        launch)."""
        if not self.in_place:
            from ..compiler.accel.wide import combine_exact, unpack_acc32, unpack_int64

            raw = self.ex.read_dram(self.out_addr, self.out_bytes).view(np.int8).reshape(
                self.out_shape)
            if self.mode == 2:
                return unpack_int64(raw, m, self.o)
            if self.exact:
                return combine_exact(raw, m, self.o, self.correction)
            return unpack_acc32(raw, m, self.o)
        _, words, whole, copies, result = self._gather(m)
        if whole is not None:
            np.copyto(words.T, whole)  # one transposing copy: 8 or 12 bytes an element
        else:
            for dst, src in copies:  # a strided copy per plane: faster for 4 planes
                np.copyto(dst, src)
        if self.mode != 1:
            return result
        acc = result
        total = acc[..., 0].astype(np.int64)
        for i in range(1, self.planes // 4):  # sum_i acc_i * 256**(n-1-i), Horner's rule
            total *= 256
            total += acc[..., i]
        if self.correction is not None:
            total += self.correction[:self.o]
        return total

    def _gather(self, m: int) -> tuple:
        """(m, the bytes' buffer [n, planes], the planes to copy at once or None, per plane
        (destination, source), the result's view of the buffer) for ``m`` result rows;
        kept per ``m``: a layer launches the same product every step, and what ``take``
        returns stays valid until the product's next launch."""
        if self._gather_plan is not None and self._gather_plan[0] == m:
            return self._gather_plan
        planes, cols = self.planes, self.out_cols
        n = cols * m  # the rows read back: padded rows are never looked at
        if n > self.out_planes.shape[1]:
            raise ValueError(f"{m} result rows of a buffer of {self.rows}")
        src = self.out_planes[:, :n]
        words = np.empty((n, planes), np.uint8)
        whole = src if planes >= 8 and n <= _GATHER_WHOLE_MAX else None
        copies = [] if whole is not None else [(words[:, r], src[r]) for r in range(planes)]
        if self.mode == 2:  # the int64's little-endian bytes
            result = words.view("<i8").reshape(m, cols)[:, :self.o]
        else:
            result = words.view("<i4").reshape(m, cols, planes // 4)[:, :self.o]
            if self.mode == 0:
                result = result[..., 0]
        self._gather_plan = (m, words, whole, copies, result)
        return self._gather_plan
