"""Frontend: a model file becomes the graph IR.

Takes: an ONNX model (path, bytes or ModelProto) and the shapes of its dynamic inputs.
Gives: a :class:`celosia.compiler.graph.ir.Graph` with static inputs and canonical attributes
(onnx.py: opset and operator checks, shape inference, shape-like inputs turned constant, or
kept where only known at run time; inputs.py: declared and given input shapes, hints).
May import: the graph level (the IR it builds and the numpy definitions it folds constants
with). Nothing imports the frontend but ``celosia.compiler.pipeline`` and the runtime.
"""
