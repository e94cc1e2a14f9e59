"""celosia.compiler: from an ONNX model to CPU machine code and accelerator programs.

A model takes one path through five stages, each a folder::

    frontend  ONNX file -> graph IR                                  (frontend/)
    graph     graph IR: meaning, passes, int8 quantization            (graph/)
    accel     graph -> placement, accelerator programs (driver calls)  (accel/)
    cpu       graph -> LLVM machine code for the host                  (cpu/)
    tensor    tensor expressions, schedules, loop IR, lowering         (tensor/)

and ``pipeline.py`` strings frontend and graph together (a model file to a quantized graph).

Imports point from a stage to the stages whose IR it consumes or emits, never back::

    pipeline -> frontend -> graph
    pipeline -> graph
    accel    -> graph, tensor        (accel and cpu never import each other)
    cpu      -> graph, tensor
    graph, tensor: no other stage

The graph level does not know which backends exist: a backend imports the graph IR and
decides what it takes (the accelerator's partitioner lives in accel/, the CPU's graph
lowering in cpu/), so a new target is a new folder beside them. Outside the compiler, the
runtime (celosia.runtime) imports the pipeline and the backends; nothing in the compiler
imports the runtime. ``STAGE_IMPORTS`` below is this table as data: a test
(tests/compiler/test_layout.py) walks every import and holds the package to it.
"""

# stage -> the stages it may import (besides itself).
STAGE_IMPORTS = {
    "tensor": set(),
    "graph": set(),
    "frontend": {"graph"},
    "accel": {"graph", "tensor"},
    "cpu": {"graph", "tensor"},
    "pipeline": {"frontend", "graph"},
}
