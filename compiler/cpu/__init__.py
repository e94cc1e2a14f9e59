"""The CPU backend: graph nodes become LLVM machine code for the host.

Takes: an optimized float graph or a quantized graph (graph level).
Gives: a CpuProgram (lowering.py): compiled kernels, layout changes and numpy steps over a
planned arena, which ``celosia.runtime`` runs and saves.

- lowering.py: graph -> kernel specs and program steps.
- kernels.py: kernel specs (JSON-able) -> compiled kernels, through schedules.py's operators
  written in the tensor language (after TVM's x86 schedules).
- emit.py: loop IR -> LLVM IR text; codegen.py: LLVM IR -> object code, cached, and callable
  kernels; threads.py: the native thread pool parallel loops run on; host.py: the host
  target, thread count and cache folder both of them share.

May import: the graph level and the tensor level. Never the accelerator backend.
"""
