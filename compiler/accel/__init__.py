"""The accelerator backend: graph nodes become programs for the GEMM core and ALU.

Takes: a quantized graph (from the graph level) and a :class:`celosia.HwConfig`.
Gives: a placement of every node (partition.py: accelerator regions, and a reason for each
node left to the CPU) and, per accelerator layer, an AcceleratorFunction: instruction stream
and micro-ops emitted through ``celosia.driver``'s stream builder.

The path inside, in order (build.py's ``accelerator_pipeline``): operators as tensor
expressions with fused ALU epilogues (ops.py) -> lowering (tensor level) -> tensorize against
the GEMM intrinsic (intrin.py, tensorize.py) -> DMA injection (dma.py) -> virtual threads
(vthread.py) -> SRAM placement (storage.py) -> dependency tokens and driver calls
(codegen.py); tune.py searches each layer's schedule on the cycle model.

May import: the graph level, the tensor level, and below the compiler ``celosia.config``,
``celosia.isa``, ``celosia.driver`` and (for the schedule search) ``celosia.sim``. Never the
CPU backend.
"""
