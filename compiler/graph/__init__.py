"""The graph level: a model as operator nodes over named tensors, and what each node means.

Takes: a graph from the frontend (or built directly with ir.py).
Gives: an optimized float graph (passes.py: constant folding, fusion of conv/gemm epilogues,
dead code) or a quantized int8 graph (quantize.py: calibration and QDQ import), which the
backends compile.

- ir.py: the graph IR (Graph, Node, TensorType), its printer, verifier and errors.
- ops.py: the numpy definition of every ONNX operator the IR takes (the reference);
  ops_recurrent.py: LSTM, GRU, RNN; ops_control.py: If, Loop, Scan (whose bodies are
  graphs held by node attributes, run by reference.py).
- qops.py: celosia's own quantized operators (QConv, QGemm, requantization) in integer numpy.
- reference.py: the executor that runs a graph by those definitions (the oracle).
- dynamic.py: sizes only known at run time: nodes kept in ONNX's form, their kernels/types.
- passes.py, quantize.py: graph -> graph rewrites.

May import: nothing else in the compiler. The graph level knows no backend and no file format.
"""
