"""celosia.driver: the host side of the accelerator (VTA's runtime API in Python).

- :class:`Device` (device.py): an executor plus a DRAM allocator and the stream builder
  (``load_2d``, ``store_2d``, ``gemm``, ``alu``, ``dep_push``, ``dep_pop``, ``synchronize``;
  ``build_program`` and ``run_program`` for programs that stay resident in DRAM).
- :class:`DramBuffer`, :class:`DramAllocator` (alloc.py): aligned physical DRAM buffers.
- :class:`UopKernel`, :class:`UopKernelBuilder`, :class:`UopCache` (uops.py): micro-op
  kernels recorded once per key, and their residency in the on-chip UOP buffer.
- :class:`InsnStream` (stream.py): pending pops, pushes, NOPs, micro-op loads, FINISH.

A minimal program (one ACC row from DRAM, shifted right by 0, stored as int8):

>>> import numpy as np
>>> from celosia.driver import Device
>>> from celosia.isa import AluOp, MemType, Module
>>> dev = Device("default", dram_size=1 << 16)
>>> src = dev.upload(np.arange(16, dtype=np.int32) * 50)
>>> dst = dev.alloc(16)
>>> dev.load_2d(src, 0, 1, 1, 1, sram_index=0, mem_type=MemType.ACC)
>>> kernel = dev.alu("copy", lambda k: k.push(dst=0, src=0), AluOp.SHR, imm=0)
>>> dev.dep_push(Module.COMPUTE, Module.STORE)
>>> dev.dep_pop(Module.COMPUTE, Module.STORE)
>>> dev.store_2d(0, dst, 0, 1, 1, 1)
>>> print(dev.disassemble())
     0: LOAD  ACC      sram=0 dram=0 y=1 x=1 stride=1
     1: LOAD  UOP      sram=0 dram=0 y=1 x=1 stride=1
     2: ALU   SHR imm 0     uop[0:1) out 1x(dst 0, src 0) in 1x(dst 0, src 0)  [push_next]
     3: STORE OUT      sram=0 dram=4 y=1 x=1 stride=1  [pop_prev]
>>> dev.synchronize()["alu_uops"]
1
>>> dst.read(np.int8, 16)[:6]
array([   0,   50,  100, -106,  -56,   -6], dtype=int8)
"""

from .alloc import AllocationError, DramAllocator, DramBuffer
from .device import Device, Program
from .stream import InsnStream, nop
from .uops import KernelError, KernelMode, UopCache, UopKernel, UopKernelBuilder, UopLoop

__all__ = [
    "Device", "Program", "DramBuffer", "DramAllocator", "AllocationError",
    "UopKernel", "UopKernelBuilder", "UopLoop", "UopCache", "KernelMode", "KernelError",
    "InsnStream", "nop",
]
