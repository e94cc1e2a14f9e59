"""QLut (qops.py: ``y = table[x + 128]``, int8 -> int8) as 64 table lookups per
instruction pair on CPUs with AVX-512 VBMI, written directly in LLVM IR.

The tensor-language kernel (kernels_q.py) reads the table with a per-lane gather, which
x86 has no byte form of: LLVM makes it one scalar load per element (0.36 ms for a 1.2M
element activation, EfficientNet-B0's largest, 0.3 ns an element). The table is 256
bytes, four 64-byte registers, and ``vpermi2b`` looks 64 bytes up in a 128-byte table of
two registers with an index's low 7 bits: with ``u = x + 128`` (as a byte, ``x ^ 0x80``),
the lower half of the table answers where ``u < 128`` (``x < 0``) and the upper half
where ``x >= 0``, so each 64 values cost two ``vpermi2b`` and a blend. The elements after
the last whole vector are looked up one at a time, as qops does.

Spec: ``{"op": "qlut", "shape": [...]}``, data int8[shape], table int8[256], out
int8[shape] (the kernel of kernels_q.py's, compiled this way when the host has VBMI).
Chunks of ``CHUNK`` elements are the parallel loop (one segment, ``fn(buffers, begin,
end)``, run by the native pool: threads.py).
"""

from __future__ import annotations

import math
import time

from llvmlite import ir

from ..tensor.tir import Buffer
from .codegen import CpuKernel, SavedSegment, _load_or_compile
from .host import host_target

__all__ = ["vbmi_available", "compile_lut", "CHUNK"]

CHUNK = 16384  # elements per parallel iteration (a multiple of the 64-byte vector)
_I8, _I64, _V = ir.IntType(8), ir.IntType(64), ir.VectorType(ir.IntType(8), 64)
_PERMUTE = "llvm.x86.avx512.vpermi2var.qi.512"


def vbmi_available() -> bool:
    return "+avx512vbmi" in host_target().features.split(",")


def _module(size: int, symbol: str) -> str:
    module = ir.Module(name="qlut")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer().as_pointer(),
                                                            _I64, _I64]), symbol)
    permute = ir.Function(module, ir.FunctionType(_V, [_V, _V, _V]), _PERMUTE)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x, table, out = (b.load(b.gep(fn.args[0], [ir.Constant(_I64, k)])) for k in range(3))

    def vec(ptr, at):
        return b.bitcast(b.gep(ptr, [at]), _V.as_pointer())
    quarters = [b.load(vec(table, ir.Constant(_I64, 64 * q)), align=1) for q in range(4)]
    flip = ir.Constant(_V, [ir.Constant(_I8, 0x80)] * 64)
    zero = ir.Constant(_V, [ir.Constant(_I8, 0)] * 64)
    begin = b.mul(fn.args[1], ir.Constant(_I64, CHUNK))
    end = b.mul(fn.args[2], ir.Constant(_I64, CHUNK))
    size_c = ir.Constant(_I64, size)
    end = b.select(b.icmp_signed("<", end, size_c), end, size_c)
    # whole vectors: [begin, vend); then single elements: [vend, end)
    vend = b.and_(end, ir.Constant(_I64, ~63))
    vend = b.select(b.icmp_signed("<", vend, begin), begin, vend)

    def vector_step(i):
        v = b.load(vec(x, i), align=1)
        u = b.xor(v, flip)
        low = b.call(permute, [quarters[0], u, quarters[1]])
        high = b.call(permute, [quarters[2], u, quarters[3]])
        b.store(b.select(b.icmp_signed(">=", v, zero), high, low), vec(out, i), align=1)

    def scalar_step(i):
        index = b.add(b.sext(b.load(b.gep(x, [i])), _I64), ir.Constant(_I64, 128))
        b.store(b.load(b.gep(table, [index])), b.gep(out, [i]))
    counted_loop(b, begin, vend, 64, vector_step)
    counted_loop(b, vend, end, 1, scalar_step)
    b.ret_void()
    return str(module)


def counted_loop(b: ir.IRBuilder, lo, hi, step: int, body) -> None:
    """LLVM IR of ``for i in range(lo, hi, step): body(i)`` (i64 values) at ``b``; ``b``
    ends after the loop. Shared by the hand-written kernels (lut.py, packed_layout.py,
    int8_emit.py)."""
    pre = b.block
    head, work, done = (b.append_basic_block(n) for n in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(_I64)
    i.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", i, hi), work, done)
    b.position_at_end(work)
    body(i)
    i.add_incoming(b.add(i, ir.Constant(_I64, step)), b.block)
    b.branch(head)
    b.position_at_end(done)


def compile_lut(spec: dict, *, use_cache: bool = True) -> CpuKernel:
    """The compiled ``qlut`` kernel of a spec (the host must have AVX-512 VBMI)."""
    start = time.perf_counter()
    shape = tuple(spec["shape"])
    size = math.prod(shape)
    symbol = "qlut_seg0"
    llvm_ir = _module(size, symbol)
    obj, path, hit = _load_or_compile(llvm_ir, use_cache)
    params = [Buffer("data", shape, "int8"), Buffer("table", (256,), "int8"),
              Buffer("out", shape, "int8")]
    return CpuKernel(None, llvm_ir, obj, [], [SavedSegment(symbol, -(-size // CHUNK))], path,
                     hit, time.perf_counter() - start, name="qlut", params=params, written=[2])
