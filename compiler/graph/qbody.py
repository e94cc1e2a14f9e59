"""Quantizing inside control-flow bodies (If branches, Loop and Scan bodies).

``quantize_graph`` quantizes the nodes of a graph; a body is a graph of its own that runs
once per iteration (or once, for the branch taken), so ``quantize_bodies`` rewrites each
body, after the enclosing graph's calibration run has shown what each body sees:

1. ``inline_constant_captures``: a constant of the enclosing graph that a body reads
   (an RNN cell's weights read from the outer scope) becomes a constant of the body, so a
   MatMul there has a constant weight like any other layer.
2. Calibration: the float graph runs on the calibration samples, and every call of a body
   records its inputs and outer values (at most ``MAX_BODY_SAMPLES`` per body, evenly
   spread over the calls); the body's own values are then measured by running the body
   on those records.
3. In the body, a MatMul or Gemm with a constant weight becomes ``QMatMulWide`` (qwide.py:
   16-bit activation, int16 per-row weights, the exact integer product), a Conv of group 1
   ``QConvWide`` (the same, per output channel), an LSTM, GRU or
   RNN with constant weights ``QLSTM``/``QGRU``/``QRNN`` (qrecurrent.py); everything else
   keeps its float form and carries ``float_reason``. Bodies of bodies are rewritten the
   same way. The body's inputs and outputs keep their float types, so the node holding it
   does not change.

Why 16-bit products and int16 weights: a body's result is carried into the next iteration
(an Elman cell's h) 100 times in a row, where 8-bit steps accumulate; onnxruntime's
quantize_static leaves bodies in float, so a body's products have to be nearly exact to
keep the model as close to fp32 as onnxruntime's (docs/graph.md, "Control-flow bodies").
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, Node, TensorType, captured_inputs, constant, own_inputs, subgraphs
from .ops_control import CONTROL_KERNELS
from .qrecurrent import (X_HEADROOM, Q_RECURRENT_OPS, calibrated_values, h_range,
                         quantized_layer, recurrent_problem)
from .reference import evaluate_node
from .residual import fresh_name

__all__ = ["inline_constant_captures", "quantize_bodies", "hoist_loop_products", "wide_layer",
           "dense_input",
           "MAX_BODY_SAMPLES",
           "BODY_WEIGHT_BITS", "WIDE_OPS"]

MAX_BODY_SAMPLES = 48
BODY_WEIGHT_BITS = 16
_WEIGHT_MAX = {8: 127, 16: 32639}
_CONTROL = ("If", "Loop", "Scan")
# The integer-product nodes a quantized body holds (the accelerator runs their products).
WIDE_OPS = ("QMatMulWide", "QConvWide", *Q_RECURRENT_OPS)


# ---- 1. constants of the enclosing graph into the bodies -----------------------------------


def inline_constant_captures(graph: Graph) -> Graph:
    """Each body reads the enclosing graph's constants as constants of its own (module
    doc, 1); bodies of bodies too."""
    nodes = []
    for node in graph.nodes:
        bodies = subgraphs(node)
        if not bodies:
            nodes.append(node)
            continue
        captured = captured_inputs(node)
        outer = bodies[0][1].outer
        keep = [k for k, v in enumerate(captured) if v not in graph.initializers]
        changed = {}
        for attr, body in bodies:
            inits = dict(body.initializers)
            for k, v in enumerate(captured):
                if v in graph.initializers:
                    inits[outer[k]] = graph.initializers[v]
            body = Graph(body.name, body.inputs, body.outputs, body.nodes, inits,
                         dict(body.types), tuple(outer[k] for k in keep))
            changed[attr] = inline_constant_captures(body)
        node = Node(node.op, (*own_inputs(node), *(captured[k] for k in keep)),
                    node.outputs, {**node.attrs, **changed}, node.name)
        nodes.append(node)
    return graph.with_nodes(nodes)


# ---- 2. what each body sees -------------------------------------------------------------


def _body_key(path: str, node: Node, attr: str) -> str:
    return f"{path}{node.name}/{attr}"


def _run(graph: Graph, env: dict, seen: dict, path: str) -> None:
    """Run ``graph``'s nodes on ``env``; every body call's (inputs, outer values) goes to
    ``seen`` under its body key."""
    for node in graph.nodes:
        ins = [env[i] if i else None for i in node.inputs]
        if node.op in CONTROL_KERNELS and subgraphs(node):
            n = len(node.inputs) - len(captured_inputs(node))
            keys = {id(body): _body_key(path, node, attr) for attr, body in subgraphs(node)}

            def run(body, args, captured, keys=keys):
                key = keys[id(body)]
                feeds = {**dict(zip(body.inputs, args)), **dict(zip(body.outer, captured))}
                seen.setdefault(key, []).append(feeds)
                inner = {**body.initializers, **feeds}
                _run(body, inner, seen, key + "/")
                return [inner[o] for o in body.outputs]

            with np.errstate(all="ignore"):
                results = CONTROL_KERNELS[node.op](node.attrs, run, ins[:n], ins[n:])
        else:
            results = evaluate_node(node, ins)
        for o, v in zip(node.outputs, results):
            if o:
                env[o] = v


def _spread(records: list, count: int) -> list:
    if len(records) <= count:
        return records
    picks = np.linspace(0, len(records) - 1, count).round().astype(int)
    return [records[k] for k in picks]


def _maxabs(body: Graph, records: list, names: set) -> dict:
    """max |x| of ``names`` over the body run on ``records``."""
    out = dict.fromkeys(names, 0.0)
    for feeds in records:
        env = {**body.initializers, **feeds}
        _run(body, env, {}, "")
        for v in names:
            if v in env:
                out[v] = max(out[v], float(np.abs(np.asarray(env[v], np.float64)).max(initial=0)))
    return out


# ---- 3. the rewrite -----------------------------------------------------------------------


def _dense_form(body: Graph, node: Node):
    """(x, weight [O, K], bias [O] or None, epilogue index shift) of a MatMul/Gemm with a
    constant weight, or why it stays float."""
    inits, types = body.initializers, body.types
    if node.op not in ("MatMul", "Gemm", "Conv"):
        return None
    x, w = node.inputs[0], node.inputs[1]
    if w not in inits or x in inits:
        return "its weight is computed at run time (the integer form needs a constant one)"
    if types[x].dtype != "float32" or not types[node.outputs[0]].static:
        return "its input is not float32 of sizes known before run time"
    wt = np.asarray(inits[w], np.float64)
    if node.op == "Conv":
        if int(node.attrs.get("group", 1)) != 1:
            return f"a grouped convolution (group={node.attrs['group']}): the integer form takes group 1"
        bias = None
        if len(node.inputs) > 2 and node.inputs[2]:
            if node.inputs[2] not in inits:
                return "its bias is computed at run time"
            bias = np.asarray(inits[node.inputs[2]], np.float32)
        return x, wt, bias, 1
    if node.op == "MatMul":
        if wt.ndim != 2 or len(types[x].shape) < 2:
            return f"a MatMul with a {wt.ndim}-D weight (the integer form takes [K, O])"
        return x, wt.T, None, 2
    a = node.attrs
    if a.get("transA") or len(types[x].shape) != 2:
        return "a Gemm with transA (the integer form takes x [N, K])"
    wt = (wt if a.get("transB") else wt.T) * float(a.get("alpha", 1.0))
    bias = None
    if len(node.inputs) > 2 and node.inputs[2]:
        c = node.inputs[2]
        if c not in inits:
            return "its C is computed at run time"
        cv = np.asarray(inits[c], np.float64) * float(a.get("beta", 1.0))
        if cv.size not in (1, wt.shape[0]) or cv.ndim > 1 and cv.shape[0] != 1:
            return f"its C of shape {list(cv.shape)} is not one value per output column"
        bias = np.broadcast_to(cv.reshape(-1), (wt.shape[0],)).astype(np.float32)
    return x, wt, bias, 1


def _per_row(w: np.ndarray, bits: int):
    """Per output row (axis 0; a conv's output channel) scales and integer weights."""
    flat = w.reshape(w.shape[0], -1)
    top = np.abs(flat).max(axis=1)
    s = np.where(top > 0, top / _WEIGHT_MAX[bits], 1.0).astype(np.float32)
    q = np.clip(np.rint(flat / s[:, None]), -_WEIGHT_MAX[bits], _WEIGHT_MAX[bits])
    return q.astype(np.int8 if bits == 8 else np.int16).reshape(w.shape), s


def wide_layer(graph: Graph, n: Node, x_max: float, bits: int = BODY_WEIGHT_BITS,
               taken: set | None = None):
    """(QMatMulWide/QConvWide node, {name: constant}) of a MatMul/Gemm/Conv with a
    constant weight (``_dense_form``), its 16-bit input range ``x_max`` times the
    headroom; None if it has no such form."""
    form = _dense_form(graph, n)
    if not isinstance(form, tuple):
        return None
    taken = set(graph.types) if taken is None else taken
    x, w, bias, shift = form
    w_q, w_s = _per_row(w, bits)
    consts, names = {}, []
    for what, arr in (("w_q", w_q), ("w_scale", w_s),
                      *((("bias", bias),) if bias is not None else ())):
        name = fresh_name(f"{n.name}/{what}", taken)
        consts[name] = arr
        names.append(name)
    own = 2 if n.op == "MatMul" else 3
    attrs = {"x_scale": float(np.float32(max(x_max * X_HEADROOM, 1e-30) / 32767))}
    if n.op == "Conv":
        attrs.update({k: v for k, v in n.attrs.items()
                      if k in ("kernel_shape", "strides", "pads", "dilations", "group")})
    if n.attrs.get("epilogue"):
        attrs["epilogue"] = [tuple(s[:-1]) + (s[-1] + shift,) if s[0] in ("Add", "Mul")
                             else tuple(s) for s in n.attrs["epilogue"]]
    ins = [x, *names, *([""] if bias is None else []), *n.inputs[own:]]
    op = "QConvWide" if n.op == "Conv" else "QMatMulWide"
    return Node(op, tuple(ins), n.outputs, attrs, n.name), consts


def _quantize_body(body: Graph, records: list, seen: dict, key: str, bits: int) -> Graph:
    """The body with its products in integer form (module doc, 3)."""
    records = _spread(records, MAX_BODY_SAMPLES)
    forms = {n.name: _dense_form(body, n) for n in body.nodes}
    wanted = {f[0] for f in forms.values() if isinstance(f, tuple)}
    for n in body.nodes:
        if n.op in Q_RECURRENT_OPS.values() and recurrent_problem(body, n) is None:
            wanted |= set(calibrated_values(n))
    maxabs = _maxabs(body, records, wanted) if wanted and records else {}
    inits, types = dict(body.initializers), dict(body.types)
    taken = set(types)
    nodes = []
    for n in body.nodes:
        form = forms[n.name]
        if subgraphs(n):
            n = n.with_attrs(**{attr: _quantize_body(g, seen.get(_body_key(key + "/", n, attr),
                                                                 []), seen,
                                                     _body_key(key + "/", n, attr), bits)
                                for attr, g in subgraphs(n)})
        elif isinstance(form, tuple) and records:
            n, consts = wide_layer(body, n, maxabs.get(form[0], 0.0), bits, taken)
            for name, arr in consts.items():
                inits[name], types[name] = constant(arr), TensorType(str(arr.dtype), arr.shape)
        elif n.op in Q_RECURRENT_OPS.values() and records and recurrent_problem(body, n) is None:
            known = {**maxabs, **{v: float(np.abs(inits[v]).max(initial=0))
                                  for v in n.inputs if v in inits}}
            op, ins, attrs = quantized_layer(n, body, known.get(n.inputs[0], 0.0),
                                             h_range(n, known), bits)
            names = ("", "W_q", "R_q", "W_scale", "R_scale")
            args = []
            for k, v in enumerate(ins):
                if isinstance(v, str):
                    args.append(v)
                else:
                    name = fresh_name(f"{n.name}/{names[k]}", taken)
                    inits[name], types[name] = constant(v), TensorType(str(v.dtype), v.shape)
                    args.append(name)
            n = Node(op, tuple(args), n.outputs, attrs, n.name)
        elif form is not None or n.op in Q_RECURRENT_OPS.values():
            why = form if isinstance(form, str) else recurrent_problem(body, n)
            if not records:
                why = ("its body never ran on the calibration samples (a branch not taken): "
                       "no range for its 16-bit input; calibrate with inputs that take it")
            n = n.with_attrs(float_reason=why)
        nodes.append(n)
    used = {i for n in nodes for i in n.inputs}
    inits = {k: v for k, v in inits.items() if k in used or k in body.outputs}
    return Graph(body.name, body.inputs, body.outputs, tuple(nodes), inits, types, body.outer)


def quantize_bodies(graph: Graph, samples: list[dict], *, bits: int = BODY_WEIGHT_BITS
                    ) -> Graph:
    """Every body of ``graph`` (a float graph with its constant captures inlined) with its
    products in integer form, calibrated on what it sees when ``graph`` runs on
    ``samples``."""
    if not any(subgraphs(n) for n in graph.nodes):
        return graph
    seen: dict[str, list] = {}
    for feeds in samples:
        _run(graph, {**graph.initializers, **feeds}, seen, "")
    nodes = []
    for n in graph.nodes:
        if subgraphs(n):
            n = n.with_attrs(**{attr: _quantize_body(g, seen.get(_body_key("", n, attr), []),
                                                     seen, _body_key("", n, attr), bits)
                                for attr, g in subgraphs(n)})
        nodes.append(n)
    return graph.with_nodes(nodes)


# ---- 4. a Loop body's input projections, hoisted -----------------------------------------


def hoist_loop_products(graph: Graph) -> Graph:
    """A Loop body's ``QMatMulWide(Gather(x, iteration), W)`` of an outer value ``x``
    becomes one QMatMulWide of all of ``x`` before the Loop, and a Gather of its rows in the
    body (the product's Add/Mul epilogue steps as nodes after it): exactly the same values
    (``quantize16`` is element-wise, a product row depends only on its input row), in one
    accelerator launch instead of one per iteration."""
    from .passes import remove_dead_code

    nodes, inits, types = [], dict(graph.initializers), dict(graph.types)
    changed = False
    for node in graph.nodes:
        if node.op != "Loop":
            nodes.append(node)
            continue
        body = node.attrs["body"]
        captured = dict(zip(body.outer, captured_inputs(node)))
        producers = {o: n for n in body.nodes for o in n.outputs if o}
        readers: dict = {}
        for n in body.nodes:
            for v in n.inputs:
                readers.setdefault(v, []).append(n)
        b_nodes, b_types, outer = list(body.nodes), dict(body.types), list(body.outer)
        extra = []
        for mm in body.nodes:
            epilogue = mm.attrs.get("epilogue", ())
            if mm.op != "QMatMulWide" or any(len(e) != 2 or e[0] not in ("Add", "Mul")
                                             for e in epilogue):
                continue
            gather = producers.get(mm.inputs[0])
            if gather is None or gather.op != "Gather" or gather.attrs.get("axis", 0) != 0 \
                    or len(readers.get(mm.inputs[0], ())) != 1 \
                    or gather.inputs[1] != body.inputs[0] or gather.inputs[0] not in captured \
                    or any(v and v not in body.initializers for v in mm.inputs[1:4]):
                continue
            x = captured[gather.inputs[0]]
            xt, out_t = types[x], body.types[mm.outputs[0]]
            if not xt.static:
                continue
            base = mm.name  # a body node's name carries its path
            names = []
            for v in mm.inputs[1:4]:
                if not v:
                    names.append("")
                    continue
                name = base + "/" + v.rsplit("/", 1)[-1]
                inits[name], types[name] = body.initializers[v], body.types[v]
                names.append(name)
            y = base + "/all"
            types[y] = TensorType("float32", (*xt.shape[:-1], out_t.shape[-1]))
            nodes.append(Node("QMatMulWide", (x, *names), (y,),
                              {"x_scale": mm.attrs["x_scale"]}, base + "/hoisted"))
            inner = f"{mm.name}/hoisted"
            outer.append(inner)
            extra.append(y)
            b_types[inner] = types[y]
            out = mm.outputs[0]
            rows = f"{out}/rows" if epilogue else out
            new = [Node("Gather", (inner, gather.inputs[1]), (rows,), {"axis": 0}, gather.name)]
            b_types[rows] = out_t
            for e, (op, arg) in enumerate(epilogue):  # the fused steps as nodes again
                made = out if e == len(epilogue) - 1 else f"{out}/{e}"
                new.append(Node(op, (new[-1].outputs[0], mm.inputs[arg]), (made,), {},
                                f"{mm.name}/{op.lower()}{e}"))
                b_types[made] = out_t
            at = b_nodes.index(mm)
            b_nodes = [n for n in b_nodes[:at] if n is not gather] + new + b_nodes[at + 1:]
        if not extra:
            nodes.append(node)
            continue
        changed = True
        body = Graph(body.name, body.inputs, body.outputs, tuple(b_nodes), body.initializers,
                     b_types, tuple(outer))
        nodes.append(Node(node.op, (*node.inputs, *extra), node.outputs,
                          {**node.attrs, "body": remove_dead_code(body)}, node.name))
    if not changed:
        return graph
    return remove_dead_code(graph.with_nodes(nodes, inits, types))


def dense_input(graph: Graph, n: Node) -> str | None:
    """The data input of a MatMul/Gemm/Conv that has an integer wide form, or None."""
    form = _dense_form(graph, n)
    return form[0] if isinstance(form, tuple) else None
