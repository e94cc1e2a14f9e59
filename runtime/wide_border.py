"""The border of one wide product (compiler/accel/wide.py) run per step or iteration from
the host (runtime/accel_recurrent.py): the 16-bit operand into the program's operand
buffer, the accumulators' byte planes back into the int32 (or, exact, int64) product.

A recurrent layer crosses this border twice per time step, so what it costs is most of the
layer's layout time. Where the executor lets the CPU see its DRAM (``Executor.dram_view``,
as runtime/accel.py's in-place nodes use it) the border works on the program's buffers in
place, with BATCH = 1 (the default configuration), by one compiled kernel each way
(compiler/cpu/wide_layout.py; bound to the buffers once, one C call per launch):

- the operand: its digit planes are the int16's bytes, the high byte as it is and the low
  one XOR 0x80 (``wide.split_activation``), written from the int16 array (copied into a
  staging array of the kernel's) straight into the buffer's [digits, M, K] planes (no
  packed copy, no DRAM write);
- the result: the byte planes [planes, M, O] gathered from the buffer into [M, O, planes]
  bytes, which read as little-endian int32 are the accumulators, or as int64 the exact
  product of a carry program (no DRAM read copy, nothing else to do); exact products
  without carries (older .cel files) put their accumulators together in int64 and add the
  activation's correction, as ``wide.combine_exact`` does.

Elsewhere (another BATCH, an executor without views) it packs and unpacks with
``wide.pack_wide_activation`` / ``unpack_acc32`` / ``combine_exact`` through
``write_dram`` / ``read_dram``. Both ways give the same bits (tests/runtime/
test_wide_border.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["WideBorder", "warm_kernels"]


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
        self.fast = None
        # (in place the border keeps only views of the DRAM, not the executor: borders are
        # kept per executor, weakly, by runtime/accel_recurrent.py)
        self.ex = None if self.in_place else ex
        if self.in_place:
            # BATCH = 1: the layouts are [digits, M, K] and [planes, M, O] byte planes
            self.a_planes = a_view.reshape(digits, mb, kb * k)
            self.out_planes = out_view.reshape(planes, mb * ob * k)
            self.out_cols = ob * k
            self._digits_plan = self._gather_plan = None
            # the kernels of the product's own shape, ready before its first launch
            m = min(record.get("m", self.rows), self.rows)
            self._gather(m)
            if self.digits == 2:
                stage, digits = self._digits(m, record["k"])
                if self.mode != 1:
                    # ``fast``: (operand shape, staging array, digits kernel, gather kernel,
                    # result) of a launch of the product's own shape, for the launcher's
                    # loop to run without method calls
                    self.fast = ((m, record["k"]), stage, digits, *self._gather(m))

    def put(self, a: np.ndarray) -> None:
        """The operand ``a`` [m, K] (int16, or int8) into the program's buffer."""
        if not self.in_place:
            from ..compiler.accel.wide import pack_wide_activation

            self.ex.write_dram(self.a_addr, pack_wide_activation(a, self.cfg, rows=self.rows))
            return
        if a.dtype == np.int16 and self.digits == 2:
            stage, digits = self._digits(*a.shape)
            np.copyto(stage, a)
            digits()
        elif a.dtype == np.int8 and self.digits == 1:
            m, kd = a.shape
            np.copyto(self.a_planes[0, :m, :kd], a.view(np.uint8))
        else:
            raise ValueError(f"a {a.dtype} operand for a program of {self.digits} digit "
                             f"planes")

    def _digits(self, m: int, kd: int) -> tuple:
        """(an int16 [m, kd] staging array, the bound kernel writing its digit planes into
        the operand buffer: compiler/cpu/wide_layout.py); kept per shape: a layer launches
        the same product every step."""
        if self._digits_plan is None or self._digits_plan[0] != (m, kd):
            from ..compiler.cpu.wide_layout import digits_kernel

            rows, kp = self.a_planes.shape[1:]
            if m > rows or kd > kp:
                raise ValueError(f"a [{m}, {kd}] operand for a [{rows}, {kp}] buffer")
            stage = np.empty((m, kd), np.int16)
            fn = digits_kernel(m, kd, rows, kp).bind(stage.view(np.int8),
                                                     self.a_planes.view(np.int8), serial=True)
            self._digits_plan = ((m, kd), stage, fn)
        return self._digits_plan[1:]

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
        gather, result = self._gather(m)
        gather()
        if self.mode != 1:
            return result
        from ..compiler.accel.wide import sum_accumulators

        return sum_accumulators(result, self.correction)

    def _gather(self, m: int) -> tuple:
        """(the bound kernel gathering the byte planes of ``m`` result rows into each
        element's bytes side by side: compiler/cpu/wide_layout.py, the result's view of
        those bytes); kept per ``m``: what ``take`` returns stays valid until the
        product's next launch."""
        if self._gather_plan is None or self._gather_plan[0] != m:
            from ..compiler.cpu.wide_layout import gather_kernel

            planes, cols = self.planes, self.out_cols
            n = cols * m  # the rows read back: padded rows are never looked at
            if n > self.out_planes.shape[1]:
                raise ValueError(f"{m} result rows of a buffer of {self.rows}")
            words = np.empty((n, planes), np.uint8)
            fn = gather_kernel(planes, self.out_planes.shape[1], n).bind(
                self.out_planes.view(np.int8), words.view(np.int8), serial=True)
            if self.mode == 2:  # the int64's little-endian bytes
                result = words.view("<i8").reshape(m, cols)[:, :self.o]
            else:
                result = words.view("<i4").reshape(m, cols, planes // 4)[:, :self.o]
                if self.mode == 0:
                    result = result[..., 0]
            self._gather_plan = (m, fn, result)
        return self._gather_plan[1:]


def warm_kernels(record: dict, cfg) -> None:
    """Compile (or load from the disk cache) the kernels of a product's own shape at build
    time, so that a run's layout time is the conversions', not their compilation's (as
    runtime/accel.py does for its layout kernels)."""
    if cfg.batch != 1:
        return
    from ..compiler.cpu.wide_layout import digits_kernel, gather_kernel

    digits, mb, kb, _, k = record["a_shape"]
    planes, _, ob, _, _ = record["out_shape"]
    m = min(record["m"], mb)
    if digits == 2:
        digits_kernel(m, record["k"], mb, kb * k)
    gather_kernel(planes, mb * ob * k, m * ob * k)
