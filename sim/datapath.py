"""The values every executor computes: on-chip buffers and the semantics of each instruction.

This is ISA.md section 4 as numpy code. The functional simulator runs it under the token
protocol; the cycle model runs the same code and adds time. One GEMM or ALU instruction
runs as batched array operations over all of its micro-op executions at once: GEMMs as
int8 matrix products (igemm.py, on hosts with AVX-512 VNNI) or float32 BLAS ones, both
exact (see Datapath._compile_gemm_grid), ALU instructions in place on views of ACC, in
time linear in their executions (alu.py).
Instructions are compiled into kernels once and the kernels kept for later runs of the same
program.

Every run is bounded: ``max_work`` caps its work, counted as one per instruction plus one
per micro-op iteration, and an instruction that would cross it raises
SimulationLimitError before it does anything.
"""

from __future__ import annotations

import functools
import os
import threading
from contextlib import contextmanager

import numpy as np
from numpy.lib.stride_tricks import as_strided

from celosia.config import HwConfig
from celosia.errors import CelosiaError, ProgramError, SimulationLimitError
from celosia.isa import (
    AluInsn, FinishInsn, GemmInsn, Insn, MemInsn, MemType, Module, Opcode, decode_uops,
    buffer_depth, elem_bytes, insn_layout, module_of,
)

from . import igemm
from .alu import as_rows, one_batch, plan_alu

__all__ = ["Datapath", "check_insn", "check_max_work", "work_of", "COUNTER_NAMES",
           "DEFAULT_MAX_WORK", "single_threaded_blas", "numpy_blas_controllers"]

# The default bound on one run's work (instructions plus micro-op iterations): six times
# the largest program of ResNet-18 at 224x224 (its first layer, 2.8 million), and the most
# the slowest patterns (chains of dependent ALU updates, about a microsecond each) can do
# in a few seconds.
DEFAULT_MAX_WORK = 1 << 24

# Counters every executor reports (bytes exclude padding, as VTA's simulator counts them).
COUNTER_NAMES = (
    "insn_count", "load_insns", "compute_insns", "store_insns", "gemm_insns", "alu_insns",
    "gemm_uops", "alu_uops", "macs",
    "uop_load_bytes", "inp_load_bytes", "wgt_load_bytes", "acc_load_bytes", "acc8_load_bytes",
    "out_store_bytes",
)

_LOAD_COUNTER = {
    MemType.UOP: "uop_load_bytes", MemType.INP: "inp_load_bytes", MemType.WGT: "wgt_load_bytes",
    MemType.ACC: "acc_load_bytes", MemType.ACC_8BIT: "acc8_load_bytes",
}
_MODULE_COUNTER = {Module.LOAD: "load_insns", Module.COMPUTE: "compute_insns",
                   Module.STORE: "store_insns"}
# Micro-op executions processed per batch: bounds the temporary arrays of one instruction.
_CHUNK = 1 << 18
# Instructions of at most this many executions are compiled into kernels that keep their
# index arrays; larger ones compute them in chunks on every run.
_KERNEL_EXECS = 1 << 20
# Kernels kept per datapath (by count, and by the bytes of their index arrays and float32
# weights), and instructions whose kernels are remembered by identity (a transformer's
# programs hold tens of thousands; an entry holds references only).
_KERNELS = 1 << 14
_KERNEL_BYTES = 256 << 20
_CACHED_INSNS = 1 << 17
_CACHED_MEM_KERNELS = 1 << 17
# The most bytes of float32 operands one tiles kernel forms (larger GEMMs: the general path).
_TILE_BYTES = 64 << 20
# int8 x int8 products a float32 matrix product may sum exactly (1024 x 2^14 = 2^24).
_EXACT_TERMS = 1024


# ---- BLAS threads -------------------------------------------------------------------------

_blas_lock = threading.Lock()
_blas = {"libs": None, "depth": 0, "saved": []}


def numpy_blas_controllers() -> list:
    """threadpoolctl's controllers of the BLAS numpy itself uses (the one its matmul calls;
    scipy and others may load BLAS libraries of their own later), or of every BLAS loaded
    if none sits in numpy's directories; [] without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController

        libs = ThreadpoolController().select(user_api="blas").lib_controllers
    except Exception:  # not installed, or an unknown BLAS: leave threads alone
        return []
    root = os.path.dirname(os.path.dirname(np.__file__))
    own = [lib for lib in libs if os.path.basename(os.path.dirname(lib.filepath)) in
           ("numpy.libs", ".libs") and lib.filepath.startswith(root)]
    return own or libs


@contextmanager
def single_threaded_blas():
    """Run the block with numpy's BLAS on one thread (restored afterwards).

    The GEMM matrices of one instruction are small (a few million multiply-adds): a second
    BLAS thread gains little on an idle machine, and on a busy one (the benchmark machines
    have 2 shared cores) OpenBLAS threads spin waiting for each other and a run takes several
    times longer. Uses threadpoolctl (a dependency of scikit-learn) when it is installed;
    nesting and concurrent runs are counted, so the count is restored once, by the last."""
    with _blas_lock:
        if _blas["libs"] is None:
            _blas["libs"] = numpy_blas_controllers()
        if _blas["depth"] == 0:
            _blas["saved"] = [lib.get_num_threads() for lib in _blas["libs"]]
            for lib, n in zip(_blas["libs"], _blas["saved"]):
                if n != 1:
                    lib.set_num_threads(1)
        _blas["depth"] += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas["depth"] -= 1
            if _blas["depth"] == 0:
                for lib, n in zip(_blas["libs"], _blas["saved"]):
                    if n != 1:
                        lib.set_num_threads(n)


@functools.lru_cache(maxsize=16)
def _mem_sizes(cfg: HwConfig) -> dict:
    """{memory type: (element bytes, buffer depth)} of a configuration."""
    return {mt: (elem_bytes(cfg, mt), buffer_depth(cfg, mt)) for mt in MemType}


def check_insn(insn: Insn, index: int, cfg: HwConfig, dram_size: int) -> None:
    """Every rule of ISA.md that the instruction's own fields decide (bounds of LOAD/STORE,
    micro-op ranges, flags on the wrong module). Rules that depend on micro-op contents are
    checked when the instruction executes."""
    module = module_of(insn)
    if module == Module.LOAD and (insn.pop_prev or insn.push_prev):
        raise ProgramError(index, "a load-module instruction has no previous module: "
                                  "pop_prev/push_prev must be 0")
    if module == Module.STORE and (insn.pop_next or insn.push_next):
        raise ProgramError(index, "a store instruction has no next module: "
                                  "pop_next/push_next must be 0")
    if isinstance(insn, MemInsn):
        _check_mem(insn, index, cfg, dram_size)
    elif isinstance(insn, (GemmInsn, AluInsn)):
        if insn.uop_end > cfg.uop_depth:
            raise ProgramError(index, f"uop_end={insn.uop_end} is past the end of the UOP buffer "
                                      f"({cfg.uop_depth} micro-ops)")
        if insn.uop_bgn > insn.uop_end:
            raise ProgramError(index, f"uop_bgn={insn.uop_bgn} is greater than "
                                      f"uop_end={insn.uop_end}")


def _check_mem(insn: MemInsn, index: int, cfg: HwConfig, dram_size: int) -> None:
    name = insn.opcode.name
    if insn.opcode == Opcode.LOAD and insn.mem_type == MemType.OUT:
        raise ProgramError(index, "LOAD of memory type OUT is illegal (OUT is written by GEMM/ALU)")
    if insn.opcode == Opcode.STORE:
        if insn.mem_type != MemType.OUT:
            raise ProgramError(index, f"STORE of memory type {insn.mem_type.name} is illegal "
                                      f"(only OUT is stored)")
        if insn.y_pad_0 or insn.y_pad_1 or insn.x_pad_0 or insn.x_pad_1:
            raise ProgramError(index, "STORE must have zero padding (y_pad_0, y_pad_1, x_pad_0, "
                                      "x_pad_1)")
    if insn.x_size == 0:
        return  # a pure dependency no-op: touches no memory
    eb, depth = _mem_sizes(cfg)[insn.mem_type]
    if insn.opcode == Opcode.LOAD:
        count = (insn.y_pad_0 + insn.y_size + insn.y_pad_1) * (insn.x_pad_0 + insn.x_size + insn.x_pad_1)
    else:
        count = insn.y_size * insn.x_size
    if insn.sram_base + count > depth:
        buf = {MemType.OUT: "OUT", MemType.ACC_8BIT: "ACC"}.get(insn.mem_type, insn.mem_type.name)
        raise ProgramError(
            index, f"{name} {insn.mem_type.name} touches {buf} rows [{insn.sram_base}, "
                   f"{insn.sram_base + count}), past the end of the {buf} buffer ({depth} rows)")
    if insn.y_size:
        last = (insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size) * eb
        if last > dram_size:
            raise ProgramError(
                index, f"{name} {insn.mem_type.name} reaches DRAM bytes up to {last}, past the end "
                       f"of the {dram_size}-byte DRAM (dram_base={insn.dram_base} elements of "
                       f"{eb} bytes, y_size={insn.y_size}, x_stride={insn.x_stride})")


def check_max_work(max_work) -> int:
    """``max_work`` as given, if it is a positive integer."""
    if isinstance(max_work, bool) or not isinstance(max_work, (int, np.integer)) or max_work < 1:
        raise CelosiaError(f"max_work must be a positive integer, not {max_work!r}")
    return int(max_work)


def work_of(insn: Insn) -> int:
    """An instruction's work: one, plus its micro-op iterations (GEMM and ALU)."""
    if isinstance(insn, (GemmInsn, AluInsn)):
        return 1 + insn.iter_out * insn.iter_in * max(insn.uop_end - insn.uop_bgn, 0)
    return 1


class Datapath:
    """On-chip buffers plus DRAM, and the functional semantics of every instruction.

    Each GEMM, ALU, LOAD and STORE is *compiled* the first time it runs into a kernel (index
    arrays, slices and array views over the buffers and DRAM; see ``_compile_*``) and the
    kernel is kept for the next run of the same instruction with the same micro-ops: a model
    runs the same program for every inference. A kernel depends only on the instruction's
    fields and its micro-op words, never on data, and every check that can fail (micro-op
    ranges, the work limit) runs before it, every time. ``work`` is the run's work so far
    (see work_of), never more than ``max_work``.
    """

    def __init__(self, cfg: HwConfig, dram: np.ndarray, *, max_work: int = DEFAULT_MAX_WORK):
        self.cfg = cfg
        self.dram = dram
        self.max_work = check_max_work(max_work)
        self.work = 0
        b, n = cfg.batch, cfg.block
        # Raw byte views (depth, element bytes) for DMA, typed views for arithmetic.
        self.uop_raw = np.zeros((cfg.uop_depth, 4), np.uint8)
        self.inp_raw = np.zeros((cfg.inp_depth, cfg.inp_elem_bytes), np.uint8)
        self.wgt_raw = np.zeros((cfg.wgt_depth, cfg.wgt_elem_bytes), np.uint8)
        self.acc_raw = np.zeros((cfg.acc_depth, cfg.acc_elem_bytes), np.uint8)
        self.out_raw = np.zeros((cfg.acc_depth, cfg.out_elem_bytes), np.uint8)
        self.uop = self.uop_raw.view("<u4").reshape(cfg.uop_depth)
        self.inp = self.inp_raw.view(np.int8).reshape(cfg.inp_depth, b, n)
        self.wgt = self.wgt_raw.view(np.int8).reshape(cfg.wgt_depth, n, n)
        self.acc = self.acc_raw.view("<i4").reshape(cfg.acc_depth, b, n)
        self.out = self.out_raw.view(np.int8).reshape(cfg.acc_depth, b, n)
        self._raw = {MemType.UOP: self.uop_raw, MemType.INP: self.inp_raw,
                     MemType.WGT: self.wgt_raw, MemType.ACC: self.acc_raw}
        self._macs_per_uop = cfg.macs_per_cycle
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        # Kernels: by instruction object (checked by identity and micro-op words), and by
        # the instruction's semantic fields (shared by equal instructions of a program).
        self._by_insn: dict = {}
        self._by_fields: dict = {}
        self._kernel_bytes = 0
        self._mem_by_insn: dict = {}
        lay = insn_layout(cfg).uop
        self._uop_fields = tuple((lay[f][0], (1 << lay[f][1]) - 1) for f in ("dst", "src"))

    def clear_kernels(self) -> None:
        """Forget every compiled kernel (the next run of any program compiles again)."""
        self._by_insn.clear()
        self._by_fields.clear()
        self._mem_by_insn.clear()
        self._kernel_bytes = 0

    def reset_counters(self) -> None:
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.work = 0

    # ---- dispatch ---------------------------------------------------------------------

    def execute(self, index: int, insn: Insn) -> None:
        work = self.work + work_of(insn)
        if work > self.max_work:
            iters = work_of(insn) - 1
            what = (f"{insn.opcode.name} of {iters:,} micro-op iterations" if iters
                    else insn.opcode.name)
            raise SimulationLimitError(
                f"instruction {index}: {what} would bring the run's work to {work:,} "
                f"(instructions plus micro-op iterations), past max_work={self.max_work:,}; "
                f"raise max_work (celosia exec --max-work N) if the program is meant to do "
                f"this much")
        self.work = work
        c = self.counters
        c["insn_count"] += 1
        c[_MODULE_COUNTER[module_of(insn)]] += 1
        if isinstance(insn, MemInsn):
            if insn.opcode == Opcode.LOAD:
                self.load(insn)
            else:
                self.store(insn)
        elif isinstance(insn, GemmInsn):
            c["gemm_insns"] += 1
            self.gemm(index, insn)
        elif isinstance(insn, AluInsn):
            c["alu_insns"] += 1
            self.alu(index, insn)
        else:
            assert isinstance(insn, FinishInsn)

    # ---- DMA --------------------------------------------------------------------------

    def _dram_rows(self, insn: MemInsn, eb: int) -> np.ndarray:
        """A (y_size, x_size * eb) strided view of the DRAM block an instruction touches."""
        start, row, stride = insn.dram_base * eb, insn.x_size * eb, insn.x_stride * eb
        if stride >= row and start + insn.y_size * stride <= self.dram.size:
            # a reshaped slice: the same view, without as_strided's cost per call
            return self.dram[start:start + insn.y_size * stride].reshape(-1, stride)[:, :row]
        return as_strided(self.dram[start:], shape=(insn.y_size, row), strides=(stride, 1))

    def _mem_kernel(self, insn: MemInsn):
        """(copies, counter, bytes) of a LOAD or STORE: ``dst[...] = src`` for each
        (dst, src) of ``copies`` in order, both views (src 0 for padding), or for a STORE
        whose rows overlap, src a (source, indices) gather."""
        entry = self._mem_by_insn.get(id(insn))
        if entry is not None and entry[0] is insn and entry[1] is self.dram:
            return entry[2]
        kernel = self._compile_load(insn) if insn.opcode == Opcode.LOAD \
            else self._compile_store(insn)
        if len(self._mem_by_insn) >= _CACHED_MEM_KERNELS:
            self._mem_by_insn.clear()
        self._mem_by_insn[id(insn)] = (insn, self.dram, kernel)
        return kernel

    def _compile_load(self, insn: MemInsn):
        if insn.x_size == 0:
            return (), None, 0
        cfg = self.cfg
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        width = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        if insn.mem_type == MemType.ACC_8BIT:
            eb = cfg.out_elem_bytes
            # Explicit lane counts: -1 cannot be inferred when y_size (or every row) is 0.
            block = self.acc[insn.sram_base:insn.sram_base + rows * width].reshape(rows, width, eb)
            data = (self._dram_rows(insn, eb).view(np.int8).reshape(insn.y_size, insn.x_size, eb)
                    if insn.y_size else None)
        else:
            eb = _mem_sizes(cfg)[insn.mem_type][0]
            raw = self._raw[insn.mem_type]
            block = raw[insn.sram_base:insn.sram_base + rows * width].reshape(rows, width, eb)
            data = (self._dram_rows(insn, eb).reshape(insn.y_size, insn.x_size, eb)
                    if insn.y_size else None)
        y0, y1 = insn.y_pad_0, insn.y_pad_0 + insn.y_size
        x0, x1 = insn.x_pad_0, insn.x_pad_0 + insn.x_size
        copies = []
        if insn.y_size == 0 or (x0 == 0 and x1 == width):
            if y0:
                copies.append((block[:y0], 0))
            if y1 < rows:
                copies.append((block[y1:], 0))
        else:  # padded rows and columns: clear the whole block, then copy the data
            copies.append((block, 0))
        if insn.y_size:
            copies.append((block[y0:y1, x0:x1], data))
        return tuple(copies), _LOAD_COUNTER[insn.mem_type], insn.x_size * insn.y_size * eb

    def _compile_store(self, insn: MemInsn):
        if insn.x_size == 0 or insn.y_size == 0:
            return (), None, 0
        eb = self.cfg.out_elem_bytes
        count = insn.y_size * insn.x_size
        src = self.out_raw[insn.sram_base:insn.sram_base + count].reshape(insn.y_size, -1)
        if insn.x_stride >= insn.x_size:
            return ((self._dram_rows(insn, eb), src),), "out_store_bytes", count * eb
        # Rows overlap in DRAM and later rows win, as in program order: byte o of the span
        # comes from the last row that covers it, row min(o // stride, y_size - 1).
        length, stride = insn.x_size * eb, insn.x_stride * eb
        span = (insn.y_size - 1) * stride + length
        o = np.arange(span, dtype=np.intp)
        r = np.minimum(o // stride, insn.y_size - 1) if stride else insn.y_size - 1
        start = insn.dram_base * eb
        gather = (src.reshape(-1), r * length + (o - r * stride))
        return ((self.dram[start:start + span], gather),), "out_store_bytes", count * eb

    def load(self, insn: MemInsn) -> None:
        copies, counter, nbytes = self._mem_kernel(insn)
        for dst, src in copies:
            dst[...] = src
        if counter is not None:
            self.counters[counter] += nbytes

    def store(self, insn: MemInsn) -> None:
        copies, counter, nbytes = self._mem_kernel(insn)
        for dst, src in copies:
            if isinstance(src, tuple):  # (source, indices): a gather
                np.take(*src, out=dst)
            else:
                dst[...] = src
        if counter is not None:
            self.counters[counter] += nbytes

    # ---- micro-coded instructions ----------------------------------------------------

    def _kernel(self, index: int, insn, kind: str):
        """The compiled kernel of a GEMM or ALU instruction (a function of no arguments);
        None when it executes nothing. Compiling checks every index the instruction will use (_uops)."""
        if insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn) == 0:
            return None
        words = self.uop[insn.uop_bgn:insn.uop_end].tobytes()
        entry = self._by_insn.get(id(insn))
        if entry is not None and entry[0] is insn and entry[1] == words:
            return entry[2]
        if kind == "GEMM":
            fields = (kind, insn.reset, insn.iter_out, insn.iter_in, insn.dst_factor_out,
                      insn.dst_factor_in, insn.src_factor_out, insn.src_factor_in,
                      insn.wgt_factor_out, insn.wgt_factor_in, words)
        else:
            fields = (kind, insn.alu_op, insn.use_imm, insn.imm, insn.iter_out, insn.iter_in,
                      insn.dst_factor_out, insn.dst_factor_in, insn.src_factor_out,
                      insn.src_factor_in, words)
        kernel = self._by_fields.get(fields)
        if kernel is None:
            compiled = (self._compile_one_uop(insn, kind)
                        if insn.uop_end - insn.uop_bgn == 1 and (kind == "ALU" or insn.reset)
                        else None)
            if compiled is None:
                uops = self._uops(index, insn, kind)
                compiled = (self._compile_gemm(insn, *uops) if kind == "GEMM"
                            else self._compile_alu(insn, *uops))
            kernel, nbytes = compiled
            if self._kernel_bytes + nbytes > _KERNEL_BYTES or len(self._by_fields) >= _KERNELS:
                self._by_fields.clear()
                self._by_insn.clear()
                self._kernel_bytes = 0
            self._by_fields[fields] = kernel
            self._kernel_bytes += nbytes
        if len(self._by_insn) >= _CACHED_INSNS:
            self._by_insn.clear()
        self._by_insn[id(insn)] = (insn, words, kernel)
        return kernel

    def _compile_one_uop(self, insn, kind: str):
        """(kernel, 0) of a GEMM reset or an ALU instruction of one micro-op whose rows are
        arithmetic progressions in range and run as one batch (the epilogues and resets of
        every tensorized program), built from the loop fields alone: the kernels
        ``_compile_gemm`` and ``_compile_alu`` build for it, without their index arrays.
        None for any other (they take it, and raise its errors)."""
        word = int(self.uop[insn.uop_bgn])
        (d_at, d_mask), (s_at, s_mask) = self._uop_fields
        depth = self.cfg.acc_depth
        n = insn.iter_out * insn.iter_in
        dst = _progression(word >> d_at & d_mask, insn, insn.dst_factor_out, insn.dst_factor_in)
        if dst is None or dst[2] >= depth:
            return None
        d0, step, last = dst
        if kind == "GEMM":
            rows = slice(d0, last + 1, step or 1)
            acc, out = self.acc, self.out

            def reset():
                acc[rows] = 0
                out[rows] = 0
            return reset, 0
        if step == 0 and n > 1:  # a row updated repeatedly: plan_alu's closed forms
            return None
        d = slice(d0, last + 1, step or 1)
        s = None
        if not insn.use_imm:
            src = _progression(word >> s_at & s_mask, insn, insn.src_factor_out,
                               insn.src_factor_in)
            if src is None or src[2] >= depth:
                return None
            s0, s_step, s_last = src
            # one batch: each row read is the row written, or one never written
            if not ((s0, s_step) == (d0, step) or n == 1 and s0 == d0
                    or s_last < d0 or s0 > last):
                return None
            s = slice(s0, s0 + 1) if s_step == 0 else slice(s0, s_last + 1, s_step)
        return one_batch(insn, d, s, self.acc, self.out)[0][0], 0

    def _uops(self, index: int, insn, kind: str):
        """The micro-op fields (dst, src, wgt) of an instruction, after checking every index
        it will use against its buffer."""
        cfg = self.cfg
        dst0, src0, wgt0 = decode_uops(self.uop[insn.uop_bgn:insn.uop_end], cfg)
        limits = [("dst", "ACC", cfg.acc_depth, insn.dst_factor_out, insn.dst_factor_in, dst0)]
        if kind == "GEMM":
            if not insn.reset:
                limits += [("src", "INP", cfg.inp_depth, insn.src_factor_out, insn.src_factor_in, src0),
                           ("wgt", "WGT", cfg.wgt_depth, insn.wgt_factor_out, insn.wgt_factor_in, wgt0)]
        elif not insn.use_imm:
            limits.append(("src", "ACC", cfg.acc_depth, insn.src_factor_out, insn.src_factor_in, src0))
        # The largest index of each kind is reached at the last iterations: check once.
        for field, buf, depth, f_out, f_in, base in limits:
            worst = int(base.max()) + (insn.iter_out - 1) * f_out + (insn.iter_in - 1) * f_in
            if worst >= depth:
                self._report_range(index, insn, kind, field, buf, depth, f_out, f_in, base)
        return dst0, src0, wgt0

    @staticmethod
    def _chunks(insn, dst0, src0, wgt0):
        """(dst, src, wgt) index arrays of all executions in order, in bounded chunks."""
        per_outer = insn.iter_in * dst0.size
        step = max(1, _CHUNK // per_outer)
        j = np.arange(insn.iter_in, dtype=np.int64)[:, None]
        for i0 in range(0, insn.iter_out, step):
            i = np.arange(i0, min(i0 + step, insn.iter_out), dtype=np.int64)[:, None, None]
            dst = (dst0 + i * insn.dst_factor_out + j * insn.dst_factor_in).reshape(-1)
            src = (src0 + i * insn.src_factor_out + j * insn.src_factor_in).reshape(-1)
            if isinstance(insn, GemmInsn):
                wgt = (wgt0 + i * insn.wgt_factor_out + j * insn.wgt_factor_in).reshape(-1)
            else:
                wgt = None
            yield dst, src, wgt

    @staticmethod
    def _indices(insn, dst0, src0, wgt0):
        """(dst, src, wgt) index arrays of all executions in order (wgt None for ALU)."""
        i = np.arange(insn.iter_out, dtype=np.int64)[:, None, None]
        j = np.arange(insn.iter_in, dtype=np.int64)[:, None]
        dst = (dst0 + i * insn.dst_factor_out + j * insn.dst_factor_in).reshape(-1)
        src = (src0 + i * insn.src_factor_out + j * insn.src_factor_in).reshape(-1)
        wgt = ((wgt0 + i * insn.wgt_factor_out + j * insn.wgt_factor_in).reshape(-1)
               if isinstance(insn, GemmInsn) else None)
        return dst, src, wgt

    @staticmethod
    def _report_range(index, insn, kind, field, buf, depth, f_out, f_in, base):
        """Raise for the first execution, in loop order, whose index is out of range.
        Factors are unsigned, so indices grow with both loops: the first outer iteration
        whose last inner one reaches ``depth``, then its first such inner iteration."""
        top = int(base.max())

        def first(reach: int, factor: int) -> int:  # least i >= 0 with reach + i*factor >= depth
            return 0 if factor == 0 or reach >= depth else -(-(depth - reach) // factor)

        ii = first(top + (insn.iter_in - 1) * f_in, f_out)
        jj = first(top + ii * f_out, f_in)
        idx = base + ii * f_out + jj * f_in
        u = int(np.flatnonzero(idx >= depth)[0])
        raise ProgramError(
            index, f"{kind} micro-op {insn.uop_bgn + u} at iteration (out {ii}, in {jj}) "
                   f"uses {buf} row {int(idx[u])} as {field}, outside the {buf} buffer "
                   f"({depth} rows)")

    # ---- GEMM -------------------------------------------------------------------------

    def gemm(self, index: int, insn: GemmInsn) -> None:
        kernel = self._kernel(index, insn, "GEMM")
        if kernel is None:
            return
        if not insn.reset:
            n = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
            self.counters["gemm_uops"] += n
            self.counters["macs"] += n * self._macs_per_uop
        kernel()

    def _compile_gemm(self, insn: GemmInsn, dst0, src0, wgt0):
        """(kernel, bytes it holds) of a GEMM: the grid kernel when it applies, else the
        general one (products grouped by weight row, summed per ACC row)."""
        total = insn.iter_out * insn.iter_in * dst0.size
        if insn.reset:
            if total > _KERNEL_EXECS:
                return (lambda: self._gemm_general(insn, dst0, src0, wgt0)), 0
            dst = self._indices(insn, dst0, src0, wgt0)[0]
            if not _increasing(dst):  # (increasing rows, the usual case, are distinct)
                dst = _distinct_rows(dst, self.cfg.acc_depth)
            rows = as_rows(dst)
            acc, out = self.acc, self.out

            def reset():
                acc[rows] = 0
                out[rows] = 0
            return reset, dst.nbytes
        grid = self._compile_gemm_grid(insn, dst0, src0, wgt0)
        if grid is None:
            grid = self._compile_gemm_tiles(insn, dst0, src0, wgt0)
        if grid is not None:
            return grid
        return (lambda: self._gemm_general(insn, dst0, src0, wgt0)), 0

    def _gemm_general(self, insn: GemmInsn, dst0, src0, wgt0) -> None:
        for dst, src, wgt in self._chunks(insn, dst0, src0, wgt0):
            if insn.reset:
                self.acc[dst] = 0
                self.out[dst] = 0
                continue
            # Addition mod 2^32 is order-free, so executions may be summed in any order.
            products, dst = _block_products(self.inp, self.wgt, src, wgt, dst)
            order = np.argsort(dst)
            d = dst[order]
            starts = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1])))
            self._accumulate(d[starts], np.add.reduceat(products[order].astype(np.int64), starts, axis=0))

    def _accumulate(self, rows: np.ndarray, sums: np.ndarray) -> None:
        """ACC[rows] += sums (int64, one row each; rows distinct) with 32-bit wrap, and the
        OUT side-write."""
        cfg = self.cfg
        new = (self.acc[rows].reshape(rows.size, -1).astype(np.int64)
               + sums.reshape(rows.size, -1)).astype(np.int32)
        self.acc[rows] = new.reshape(-1, cfg.batch, cfg.block)
        self.out[rows] = new.astype(np.int8).reshape(-1, cfg.batch, cfg.block)

    def _compile_gemm_grid(self, insn: GemmInsn, dst0, src0, wgt0):
        """The usual tensorized GEMM as a few large matrix products (int8, igemm.py, where
        the host runs it; else float32); None if it does not apply.

        It applies when the weight rows do not move with the loops and the micro-ops fall
        into G equal-sized groups of g sharing a dst row, whose R = iter_out x iter_in
        updated rows never collide (G x R distinct ACC rows). Then ACC row (group, r) gets
        exactly the g products of its group at iteration r, and
        ``ACC[rows] += X (R*BATCH, g*BLOCK) @ W (g*BLOCK, G*BLOCK)`` (im2col), with X the
        input rows side by side and W the group's weights stacked.

        Exactness: every product is an int8 x int8 in [-2^14, 2^14], and each float32 matrix
        product sums at most 1024 of them (K is cut into slices of 1024 // BLOCK micro-ops),
        so every partial sum BLAS forms (in float32 arithmetic, in any order and with or
        without FMA) is an integer of magnitude at most 1024 x 2^14 = 2^24: exact in
        float32's 24-bit significand (test_float32_alone_would_not_be_exact shows that the
        slicing is needed: 1041 products of 127 x 127 already round). Each
        slice's result is therefore the exact integer sum, converted to int32 exactly; the
        slices and the old ACC value are then added in int32, i.e. modulo 2^32. Sequential
        execution adds the same products to each row in program order with 32-bit
        wrap-around, and addition modulo 2^32 is associative and commutative, so the final
        ACC (and OUT, its low byte) is bit-identical whatever the order: a row accumulated by
        many micro-ops of the instruction gets all of them. GEMM reads only INP and WGT,
        which it never writes, so no execution sees another's result. The int8 products
        are exact modulo 2^32 at any length (int32 lanes, igemm.py), so they take all g
        micro-ops in one slice.
        """
        if insn.wgt_factor_out or insn.wgt_factor_in:
            return None
        cfg = self.cfg
        batch, block = cfg.batch, cfg.block
        k = dst0.size
        R = insn.iter_out * insn.iter_in
        if k * R > _KERNEL_EXECS or block > _EXACT_TERMS:
            return None
        order = np.argsort(dst0, kind="stable")
        d = dst0[order]
        starts = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1])))
        G = starts.size
        g = k // G
        if k % G or np.any(np.diff(np.append(starts, k)) != g):
            return None
        i = np.arange(insn.iter_out, dtype=np.int64)[:, None]
        j = np.arange(insn.iter_in, dtype=np.int64)[None, :]
        off_dst = (i * insn.dst_factor_out + j * insn.dst_factor_in).reshape(-1)
        rows = (d[starts][:, None] + off_dst[None, :]).reshape(-1)  # (G * R), group-major
        if not _increasing(rows) and _distinct_rows(rows, cfg.acc_depth).size != rows.size:
            return None
        off_src = (i * insn.src_factor_out + j * insn.src_factor_in).reshape(-1)
        src_g = src0[order].reshape(G, g)
        wgt_g = wgt0[order].reshape(G, g)
        # Usually every group reads the same input rows (all output channel blocks of a
        # convolution see the same input): gather them once and multiply by all groups'
        # weights side by side.
        shared = bool(np.all(src_g == src_g[:1]))
        int8 = _int8_products(cfg)
        per_slice = g if int8 else _EXACT_TERMS // block
        slices = []
        nbytes = rows.nbytes
        for u0 in range(0, g, per_slice):
            s = src_g[:1 if shared else G, u0:u0 + per_slice]
            x_rows = (off_src[None, :, None] + s[:, None, :]).reshape(-1)  # (G|1, R, gs)
            w_rows = wgt_g[:, u0:u0 + per_slice].reshape(-1)  # (G, gs)
            slices.append((s.shape[1], as_rows(x_rows), as_rows(w_rows)))
            # and the weights: float32, or packed int8
            nbytes += x_rows.nbytes + w_rows.nbytes + w_rows.size * block * block * (1 if int8 else 4)
        dst = as_rows(rows)
        # Rows in iteration-major order (r, group) that are consecutive (a dense layer's
        # output blocks side by side): ACC is then a view in that order, no gather.
        r_dst = None
        if not isinstance(dst, slice):
            r_dst = as_rows(rows.reshape(G, R).T.reshape(-1))
            r_dst = r_dst if isinstance(r_dst, slice) else None
        inp2 = self.inp_raw.view(np.int8)  # (depth, BATCH * BLOCK)
        wgt2 = self.wgt_raw.view(np.int8)  # (depth, BLOCK * BLOCK)
        acc, out = self.acc, self.out
        f32 = np.float32

        # Per slice, the last weights seen (their bytes) and their float32 W: the WGT
        # rows of a layer are loaded once and used by many GEMMs.
        w_memo = [[None, None] for _ in slices]

        def product_int8(gs, x, w, memo):
            key = w.tobytes()
            if key != memo[0]:  # the (out, in) blocks as 4-byte words, packed
                words = w.view(np.uint32)
                if shared:  # one B (gs*C, G*O): columns (group, out lane)
                    words = words.reshape(1, G, gs, block, block // 4)
                else:  # per group B (gs*C, O)
                    words = words.reshape(G, 1, gs, block, block // 4)
                memo[:] = key, igemm.pack(words)
            if shared:  # X (R*B, gs*C) @ W (gs*C, G*O)
                if batch == 1:
                    xi = x.reshape(1, R, gs * block)
                else:
                    xi = np.ascontiguousarray(
                        x.reshape(R, gs, batch, block).transpose(0, 2, 1, 3))
                    xi = xi.reshape(1, R * batch, gs * block)
                return igemm.matmul(xi, memo[1])[0]
            # per group: X (G, R*B, gs*C) @ W (G, gs*C, O)
            xi = np.ascontiguousarray(
                x.reshape(G, R, gs, batch, block).transpose(0, 1, 3, 2, 4))
            return igemm.matmul(xi.reshape(G, R * batch, gs * block), memo[1])

        def product_f32(gs, x, w, memo):
            key = w.tobytes()
            if key != memo[0]:  # W, C-contiguous (BLAS is faster on it than on W^T)
                w4 = w.reshape(G, gs, block, block)  # (group, micro-op, out lane, in)
                if shared:  # (gs*C, G*O): rows (micro-op, in lane)
                    wk = np.ascontiguousarray(w4.transpose(1, 3, 0, 2), dtype=f32)
                    memo[:] = key, wk.reshape(gs * block, G * block)
                else:  # (G, gs*C, O)
                    wk = np.ascontiguousarray(w4.transpose(0, 1, 3, 2), dtype=f32)
                    memo[:] = key, wk.reshape(G, gs * block, block)
            wk = memo[1]
            if shared:  # X (R*B, gs*C) @ W (gs*C, G*O)
                if batch == 1:
                    xf = x.reshape(R, gs * block).astype(f32)
                else:
                    xf = np.empty((R, batch, gs, block), f32)
                    np.copyto(xf, x.reshape(R, gs, batch, block).transpose(0, 2, 1, 3))
                    xf = xf.reshape(R * batch, gs * block)
                part = np.matmul(xf, wk)
            else:  # per group: X (G, R*B, gs*C) @ W (G, gs*C, O)
                xf = np.empty((G, R, batch, gs, block), f32)
                np.copyto(xf, x.reshape(G, R, gs, batch, block).transpose(0, 1, 3, 2, 4))
                part = np.matmul(xf.reshape(G, R * batch, gs * block), wk)
            return part.astype(np.int32)  # exact: |part| <= 2^24

        product = product_int8 if int8 else product_f32

        def gemm_grid():
            total = None
            for (gs, xs, ws), memo in zip(slices, w_memo):
                x = inp2[xs] if isinstance(xs, slice) else inp2.take(xs, axis=0)
                w = wgt2[ws] if isinstance(ws, slice) else wgt2.take(ws, axis=0)
                part = product(gs, x, w, memo)
                if total is None:
                    total = part
                else:
                    total += part  # int32 arrays wrap: addition modulo 2^32
            store(total)

        def store(total):
            """ACC[rows] += total (int32, modulo 2^32), and OUT its low byte."""
            if shared:  # (R, B, G, O) -> (G, R, B, O), the order of ``rows``
                total = total.reshape(R, batch, G, block).transpose(2, 0, 1, 3)
            else:
                total = total.reshape(G, R, batch, block)
            if isinstance(dst, slice):  # consecutive rows: a view of ACC
                a = acc[dst]
                view = a.reshape(G, R, batch, block)  # contiguous: still a view
                view += total  # in place, modulo 2^32
                np.copyto(out[dst], a, casting="unsafe")  # the low byte, as astype(int8)
            elif r_dst is not None:  # consecutive in (r, group) order: a view too
                a = acc[r_dst]
                view = a.reshape(R, G, batch, block)
                view += total.transpose(1, 0, 2, 3)
                np.copyto(out[r_dst], a, casting="unsafe")
            else:
                new = acc[dst] + total.reshape(G * R, batch, block)
                acc[dst] = new
                out[dst] = new.astype(np.int8)

        return gemm_grid, nbytes

    def _compile_gemm_tiles(self, insn: GemmInsn, dst0, src0, wgt0):
        """Any other GEMM of at most _KERNEL_EXECS executions as batched float32 matrix
        products (the grid kernel's exactness argument holds as it is); None if larger.

        The executions are indexed (group, i, j, u): the micro-ops fall into G groups of g
        (micro-ops sharing a dst row when such groups are equal-sized, else one micro-op
        each) and (i, j) are the two loops. The g products of execution (group, i, j) are
        summed into its dst row. Each of the three axes (group, i, j) plays a role by what
        depends on it: both the input rows (X) and the weight rows (W): a batch axis of the
        matrix product; only W: a column axis (N, weights side by side); only X, or
        neither: a row axis (M). Then ``part[b] = X[b] (M*BATCH, g*BLOCK) @ W[b] (g*BLOCK,
        N*BLOCK)`` for every batch index b, K cut into exact slices of 1024 products as in
        the grid kernel, gives the sum of every (group, i, j); sums of (group, i, j) that
        share a dst row (a loop factor of 0, repeated dst across groups) are added in
        int32, modulo 2^32, before they are added to ACC. The usual case is a dense layer
        whose weights move with one loop and input rows with the other: one product
        X (rows, K) @ W (K, columns) per instruction.
        """
        cfg = self.cfg
        batch, block = cfg.batch, cfg.block
        k = dst0.size
        I, J = insn.iter_out, insn.iter_in
        if k * I * J > _KERNEL_EXECS or block > _EXACT_TERMS:
            return None
        order = np.argsort(dst0, kind="stable")
        d = dst0[order]
        starts = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1])))
        G = starts.size
        if k % G or np.any(np.diff(np.append(starts, k)) != k // G):
            order, G = np.arange(k), k  # one micro-op per group; dst rows may repeat
        g = k // G
        dst_g = dst0[order].reshape(G, g)[:, 0]
        src_g = src0[order].reshape(G, g)
        wgt_g = wgt0[order].reshape(G, g)
        x_dep = (not bool(np.all(src_g == src_g[:1])), bool(insn.src_factor_out) and I > 1,
                 bool(insn.src_factor_in) and J > 1)
        w_dep = (not bool(np.all(wgt_g == wgt_g[:1])), bool(insn.wgt_factor_out) and I > 1,
                 bool(insn.wgt_factor_in) and J > 1)
        roles = ["b" if x and w else "n" if w else "m" for x, w in zip(x_dep, w_dep)]
        perm = [a for r in "bmn" for a, role in enumerate(roles) if role == r]
        sizes = (G, I, J)
        nb, mt, nt = (int(np.prod([sizes[a] for a in range(3) if roles[a] == r]))
                      for r in "bmn")
        i = np.arange(I, dtype=np.int64)[None, :, None, None]
        j = np.arange(J, dtype=np.int64)[None, None, :, None]

        def operand(base, f_out, f_in, drop: str, dep):
            """Row indices (nb, mt or nt, g) of one operand; the axes of role ``drop``
            (which it does not depend on) at index 0."""
            b = base if dep[0] else base[:1]
            full = b[:, None, None, :] + i * f_out + j * f_in  # (G|1, I, J, g)
            full = full[tuple(slice(0, 1) if roles[a] == drop else slice(None)
                              for a in range(3))]
            full = np.broadcast_to(full, tuple(1 if roles[a] == drop else sizes[a]
                                               for a in range(3)) + (g,))
            return full.transpose(*perm, 3).reshape(nb, -1, g)

        x_idx = operand(src_g, insn.src_factor_out, insn.src_factor_in, "n", x_dep)
        w_idx = operand(wgt_g, insn.wgt_factor_out, insn.wgt_factor_in, "m", w_dep)
        if (x_idx.size * batch + w_idx.size * block) * block * 4 > _TILE_BYTES:
            return None  # float32 operands too large (weights moving with every execution)
        rows = (dst_g[:, None, None] + i[..., 0] * insn.dst_factor_out
                + j[..., 0] * insn.dst_factor_in).transpose(*perm).reshape(-1)  # (b, m, n)
        int8 = _int8_products(cfg)
        per_slice = g if int8 else _EXACT_TERMS // block
        slices = []
        nbytes = rows.nbytes
        for u0 in range(0, g, per_slice):
            xs = np.ascontiguousarray(x_idx[:, :, u0:u0 + per_slice])
            ws = np.ascontiguousarray(w_idx[:, :, u0:u0 + per_slice])
            slices.append((xs.shape[2], as_rows(xs.reshape(-1)), as_rows(ws.reshape(-1))))
            nbytes += xs.nbytes + ws.nbytes + ws.size * block * block * (1 if int8 else 4)
        unique = _increasing(rows) or _distinct_rows(rows, cfg.acc_depth).size == rows.size
        if unique:
            dst, sum_order, sum_starts = as_rows(rows), None, None
        else:  # sums that share a dst row are added first (in int32: modulo 2^32)
            sum_order = np.argsort(rows, kind="stable")
            r = rows[sum_order]
            sum_starts = np.flatnonzero(np.concatenate(([True], r[1:] != r[:-1])))
            dst = as_rows(r[sum_starts])
            nbytes += sum_order.nbytes + sum_starts.nbytes
        inp2 = self.inp_raw.view(np.int8)  # (depth, BATCH * BLOCK)
        wgt2 = self.wgt_raw.view(np.int8)  # (depth, BLOCK * BLOCK)
        acc, out = self.acc, self.out
        f32 = np.float32
        w_memo = [[None, None] for _ in slices]

        def gemm_tiles():
            total = None
            for (gs, xs, ws), memo in zip(slices, w_memo):
                x = inp2[xs] if isinstance(xs, slice) else inp2.take(xs, axis=0)
                w = wgt2[ws] if isinstance(ws, slice) else wgt2.take(ws, axis=0)
                key = w.tobytes()
                if key != memo[0] and int8:  # B (nb, gs*C, nt*O) from (out, in) blocks
                    words = w.view(np.uint32).reshape(nb, nt, gs, block, block // 4)
                    memo[:] = key, igemm.pack(words)
                elif key != memo[0]:  # W (nb, gs*C, nt*O), C-contiguous (faster than W^T)
                    w5 = w.reshape(nb, nt, gs, block, block)  # (b, n, micro-op, out, in)
                    wk = np.ascontiguousarray(w5.transpose(0, 2, 4, 1, 3), dtype=f32)
                    memo[:] = key, wk.reshape(nb, gs * block, nt * block)
                if int8:
                    if batch == 1:
                        xi = x.reshape(nb, mt, gs * block)
                    else:
                        xi = np.ascontiguousarray(
                            x.reshape(nb, mt, gs, batch, block).transpose(0, 1, 3, 2, 4))
                        xi = xi.reshape(nb, mt * batch, gs * block)
                    part = igemm.matmul(xi, memo[1])
                elif batch == 1:
                    xf = x.reshape(nb, mt, gs * block).astype(f32)
                    part = np.matmul(xf, memo[1]).astype(np.int32)  # exact
                else:
                    xf = np.empty((nb, mt, batch, gs, block), f32)
                    np.copyto(xf, x.reshape(nb, mt, gs, batch, block).transpose(0, 1, 3, 2, 4))
                    xf = xf.reshape(nb, mt * batch, gs * block)
                    part = np.matmul(xf, memo[1]).astype(np.int32)  # exact
                if total is None:
                    total = part
                else:
                    total += part  # int32 arrays wrap: addition modulo 2^32
            # (nb, mt*B, nt*O) -> (nb*mt*nt, B, O), the order of ``rows``
            total = total.reshape(nb, mt, batch, nt, block).transpose(0, 1, 3, 2, 4)
            total = total.reshape(-1, batch, block)
            if sum_order is not None:
                total = np.add.reduceat(total[sum_order], sum_starts, axis=0, dtype=np.int32)
            if isinstance(dst, slice):  # consecutive rows: a view of ACC
                a = acc[dst]
                a += total  # in place, modulo 2^32
                np.copyto(out[dst], a, casting="unsafe")  # the low byte, as astype(int8)
            else:
                new = acc[dst] + total
                acc[dst] = new
                out[dst] = new.astype(np.int8)

        return gemm_tiles, nbytes

    # ---- ALU --------------------------------------------------------------------------

    def alu(self, index: int, insn: AluInsn) -> None:
        kernel = self._kernel(index, insn, "ALU")
        if kernel is None:
            return
        self.counters["alu_uops"] += insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        kernel()

    def _compile_alu(self, insn: AluInsn, dst0, src0, wgt0):
        """(kernel, bytes it holds) of an ALU instruction: the steps of alu.plan_alu over all
        of its executions, or for a long instruction, planned and run chunk by chunk."""
        total = insn.iter_out * insn.iter_in * dst0.size
        if total > _KERNEL_EXECS:
            return (lambda: self._alu_general(insn, dst0, src0)), 0
        dst, src, _ = self._indices(insn, dst0, src0, wgt0)
        steps, nbytes = plan_alu(insn, dst, src, self.acc, self.out)

        def alu_kernel():
            for step in steps:
                step()
        return alu_kernel, nbytes

    def _alu_general(self, insn: AluInsn, dst0, src0) -> None:
        for dst, src, _ in self._chunks(insn, dst0, src0, None):
            for step in plan_alu(insn, dst, src, self.acc, self.out)[0]:
                step()


def _int8_products(cfg: HwConfig) -> bool:
    """Whether the GEMM kernels multiply with igemm.py's int8 kernel (exact modulo 2^32 at
    any length: no K slices) rather than float32 BLAS: on a host that runs it, for blocks
    of whole 4-byte groups."""
    return cfg.block % 4 == 0 and igemm.available()


def _progression(base: int, insn, f_out: int, f_in: int):
    """(first, step, last) of the rows base + i * f_out + j * f_in over the instruction's
    loops (i outer, j inner), if they are an arithmetic progression (step >= 0: factors are
    unsigned); else None."""
    n_out, n_in = insn.iter_out, insn.iter_in
    if n_in == 1:
        step = f_out if n_out > 1 else 0
    elif n_out == 1 or f_out == n_in * f_in:
        step = f_in
    else:
        return None
    return base, step, base + (n_out * n_in - 1) * step


def _increasing(rows: np.ndarray) -> bool:
    """Whether row indices are strictly increasing (so distinct)."""
    return rows.size < 2 or bool((rows[1:] > rows[:-1]).all())


def _distinct_rows(rows: np.ndarray, depth: int) -> np.ndarray:
    """The distinct values of row indices in [0, depth), increasing: a mark per row of the
    buffer (np.unique sorts or hashes, several times slower for the few thousand rows of
    one instruction)."""
    mark = np.zeros(depth, np.bool_)
    mark[rows] = True
    return np.flatnonzero(mark)


def _block_products(inp: np.ndarray, wgt: np.ndarray, src: np.ndarray, wgt_idx: np.ndarray,
                    dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """INP[src[e]] x WGT[wgt_idx[e]]^T for every execution e, as (n, BATCH*BLOCK) float32,
    returned with ``dst`` permuted into the same (possibly reordered) execution order.

    Each product of one block is an exact integer in float32 (|sum| <= BLOCK * 2^14 < 2^24).
    Executions are grouped by weight row so that each group is one BLAS matrix product; when
    every weight row is used equally often (the usual tensorized loop nest), all groups go
    through one batched product.
    """
    n = src.size
    block = inp.shape[2]
    order = np.argsort(wgt_idx)
    w_sorted = wgt_idx[order]
    starts = np.flatnonzero(np.concatenate(([True], w_sorted[1:] != w_sorted[:-1])))
    groups = starts.size
    inp_f = inp.astype(np.float32) if inp.shape[0] <= 4 * n else None

    def gather(rows):
        return inp_f[rows] if inp_f is not None else inp[rows].astype(np.float32)

    if n % groups == 0 and np.all(np.diff(np.append(starts, n)) == n // groups):
        x = gather(src[order]).reshape(groups, -1, block)  # (groups, n/groups * B, C)
        w = wgt[w_sorted[starts]].astype(np.float32)  # (groups, O, C)
        out = np.matmul(x, w.transpose(0, 2, 1)).reshape(n, -1)
        return out, dst[order]
    out = np.empty((n, inp.shape[1] * block), np.float32)
    ends = np.append(starts[1:], n)
    for s, e in zip(starts.tolist(), ends.tolist()):
        rows = order[s:e]
        w = wgt[w_sorted[s]].astype(np.float32)  # (O, C)
        out[rows] = (gather(src[rows]).reshape(-1, block) @ w.T).reshape(e - s, -1)
    return out, dst
