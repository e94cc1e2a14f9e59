"""A celosia target from outside its package: float32 element-wise nodes as C source,
compiled with the system C compiler (TVM's BYOC example, a C code generator, in celosia's
terms). It lives beside the tests as an installed distribution would (a .dist-info folder
with its entry point in the group ``celosia.targets``) and uses only celosia's public
target API (celosia.runtime.targets)."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sysconfig
import tempfile

import numpy as np

from celosia.runtime.targets import Target, TargetError

# op -> C expression of its operands a, b
BINARY = {"Add": "a + b", "Sub": "a - b", "Mul": "a * b",
          "Max": "(a > b || b != b) ? a : b", "Min": "(a < b || b != b) ? a : b"}
UNARY = {"Relu": "a > 0.0f ? a : (a != a ? a : 0.0f)", "Neg": "-a", "Abs": "fabsf(a)"}


class CSourceTarget(Target):
    name = "csrc"
    description = "float32 element-wise nodes as C source, compiled with the system C compiler"

    def supports(self, node, graph, config):
        if node.op not in BINARY and node.op not in UNARY:
            return f"{node.op}: csrc generates C for {', '.join(sorted({*BINARY, *UNARY}))}"
        if len(node.outputs) != 1:
            return f"{node.op} with {len(node.outputs)} outputs"
        y = graph.types[node.outputs[0]]
        for v in node.inputs:
            t = graph.types[v]
            if t.dtype != "float32":
                return f"{node.op} of {t.dtype} {v!r}: csrc takes float32 only"
            if t.shape != y.shape and not (graph.is_constant(v) and int(np.prod(t.shape)) == 1):
                return f"{node.op} broadcasting {v!r} {t.shape} to {y.shape}"
        if not y.static:
            return f"{node.op}: output size known only at run time"
        return None

    def build(self, graph):
        slots = {}  # value -> slot in the buffer table
        for v in (*graph.inputs, *graph.initializers,
                  *(o for n in graph.nodes for o in n.outputs)):
            slots.setdefault(v, len(slots))
        lines = ["#include <math.h>", "#include <stddef.h>",
                 "void run(float *const *buf) {"]
        for n in graph.nodes:
            y = n.outputs[0]
            size = int(np.prod(graph.types[y].shape))
            ops = [(f"buf[{slots[v]}][0]" if int(np.prod(graph.types[v].shape)) == 1 and size != 1
                    else f"buf[{slots[v]}][i]") for v in n.inputs]
            expr = (BINARY.get(n.op) or UNARY[n.op])
            lines.append(f"  for (size_t i = 0; i < {size}; ++i) {{")
            lines.append(f"    float a = {ops[0]};")
            if len(ops) > 1:
                lines.append(f"    float b = {ops[1]};")
            lines.append(f"    buf[{slots[y]}][i] = {expr};")
            lines.append("  }")
        lines.append("}")
        spec = {"source": "\n".join(lines) + "\n",
                "slots": [[v, list(graph.types[v].shape)] for v in slots],
                "inputs": list(graph.inputs), "outputs": list(graph.outputs),
                "constants": {k: np.asarray(a, np.float32).ravel().tolist()
                              for k, a in graph.initializers.items()}}
        return CModule(spec)

    def load(self, data):
        return CModule(json.loads(data.decode()))


def _compile(source: str) -> str:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc = cc.split()[0]
    if shutil.which(cc) is None:
        raise TargetError(f"csrc needs a C compiler: {cc!r} was not found (set CC)")
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    out = os.path.join(tempfile.gettempdir(), f"celosia-csrc-{key}.so")
    if not os.path.exists(out):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "part.c")
            with open(src, "w") as f:
                f.write(source)
            tmp = os.path.join(d, "part.so")
            subprocess.run([cc, "-O2", "-ffp-contract=off", "-fPIC", "-shared", src, "-o",
                            tmp, "-lm"], check=True, capture_output=True)
            os.replace(tmp, out)
    return out


class CModule:
    def __init__(self, spec: dict):
        self.spec = spec
        self.lib = ctypes.CDLL(_compile(spec["source"]))
        self.fn = self.lib.run
        self.fn.restype = None
        self.consts = {k: np.asarray(v, np.float32) for k, v in spec["constants"].items()}

    def run(self, feeds):
        bufs = []
        out = {}
        for v, shape in self.spec["slots"]:
            if v in feeds:
                a = np.ascontiguousarray(feeds[v], np.float32)
            elif v in self.consts:
                a = self.consts[v]
            else:
                a = np.empty(shape, np.float32)
                out[v] = a
            bufs.append(a)
        table = (ctypes.c_void_p * len(bufs))(*[a.ctypes.data for a in bufs])
        self.fn(table)
        return {v: out[v] for v in self.spec["outputs"]}

    def to_bytes(self) -> bytes:
        return json.dumps(self.spec).encode()
