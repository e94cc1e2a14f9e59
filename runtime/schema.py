"""The manifest of a CPU build (``celosia-cpu``), checked field by field before anything
is built from it, and the JSON form of node attributes.

``check_cpu`` turns a manifest (a :class:`~.artifact.Field`) into plain checked data or
raises Invalid naming the field. Besides types it checks what the executor relies on
without checking it again: every name a step reads is a value, a constant or an earlier
step's output; a kernel step's arrays match the kernel's parameters one for one (dtype,
shape, and the parameters it writes are the step's outputs); a view keeps its input's
bytes; a concat's shapes add up; the arena and the kernels' temporaries fit the byte
limit. The accelerator's manifest (runtime/accel.py) reuses these pieces.
"""

from __future__ import annotations

import numpy as np

from ..compiler.graph.ir import Graph, GraphError, Node, TensorType, constant, verify_graph
from ..limits import check_bytes
from .artifact import Field, check_array, nbytes
from .schema_control import check_control_step

__all__ = ["encode", "decode", "encode_graph", "build_info", "check_cpu", "check_config",
           "check_graph", "check_accel", "check_segments", "check_external", "external_targets",
           "KERNEL_DTYPES", "STEP_KINDS"]

STEP_KINDS = ("kernel", "view", "numpy", "concat", "control")
KERNEL_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "float32", "bool"})
_MAX_DEPTH = 64


# ---- JSON for attributes of numpy steps ------------------------------------------------------


def encode(v):
    """Attributes as JSON: arrays become {"__ndarray__", "dtype", "shape"}."""
    if isinstance(v, np.ndarray):
        return {"__ndarray__": v.tolist(), "dtype": str(v.dtype), "shape": list(v.shape)}
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, Graph):
        return {"__graph__": encode_graph(v)}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    if isinstance(v, dict):
        return {k: encode(x) for k, x in v.items()}
    return v


def decode(f: Field, depth: int = 0):
    """The inverse of ``encode`` on a manifest field, checking each array's dtype, shape
    and size."""
    if depth > _MAX_DEPTH:
        raise f.fail(f"nests deeper than {_MAX_DEPTH} levels")
    v = f.value
    if isinstance(v, dict):
        if "__ndarray__" in v:
            dtype, shape = check_array(f, "array")
            try:
                a = np.array(v["__ndarray__"], dtype=dtype)
            except (ValueError, TypeError, OverflowError) as e:
                raise f.fail(f"holds no {dtype} array ({str(e).splitlines()[0]})") from None
            if a.size != int(np.prod(shape, dtype=object)):
                raise f.fail(f"holds {a.size} elements, its shape {list(shape)} says "
                             f"{int(np.prod(shape, dtype=object))}")
            return a.reshape(shape)
        if "__graph__" in v:
            return _decode_graph(f["__graph__"], depth + 1)
        return {k: decode(x, depth + 1) for k, x in f.items()}
    if isinstance(v, list):
        return [decode(x, depth + 1) for x in f.list()]
    return v


def encode_graph(g: Graph) -> dict:
    """A graph held by a node's attribute (If's branches, Loop's and Scan's bodies) as
    JSON-able data; its nodes' attributes (and nested bodies) encoded like a step's."""
    return {"name": g.name, "inputs": list(g.inputs), "outputs": list(g.outputs),
            "outer": list(g.outer),
            "nodes": [{"op": n.op, "inputs": list(n.inputs), "outputs": list(n.outputs),
                       "attrs": encode(n.attrs), "name": n.name} for n in g.nodes],
            "initializers": {k: encode(a) for k, a in g.initializers.items()},
            "types": {k: [t.dtype, list(t.shape)] for k, t in g.types.items()}}


def _decode_graph(f: Field, depth: int) -> Graph:
    """The inverse of ``encode_graph``, every field checked and the body verified."""
    nodes = []
    for n in f["nodes"].list():
        attrs = decode(n["attrs"], depth + 1)
        if not isinstance(attrs, dict):
            raise n["attrs"].fail("is not an object")
        nodes.append(Node(n["op"].string(), tuple(n["inputs"].names()),
                          tuple(n["outputs"].names()), attrs, n["name"].string()))
    inits = {}
    for k, a in f["initializers"].items():
        value = decode(a, depth + 1)
        if not isinstance(value, np.ndarray):
            raise a.fail("is not an array")
        inits[k] = constant(value)
    types = {}
    for k, t in f["types"].items():
        dtype, shape = t.list(2)
        types[k] = TensorType(dtype.dtype(), tuple(None if d.value is None else d.integer()
                                                   for d in shape.list()))
    graph = Graph(f["name"].string(), tuple(f["inputs"].names()), tuple(f["outputs"].names()),
                  tuple(nodes), inits, types, tuple(f["outer"].names()))
    try:
        verify_graph(graph)
    except GraphError as e:
        raise f.fail(f"is not a valid body ({e})") from None
    return graph


def build_info(root: Field) -> dict:
    """The build figures (shown in reports only, and written back as JSON): any JSON object
    of bounded depth, kept as it is."""
    def depth(v, level=0):
        if level > _MAX_DEPTH:
            raise root["build"].fail(f"nests deeper than {_MAX_DEPTH} levels")
        for x in v.values() if isinstance(v, dict) else v if isinstance(v, list) else ():
            depth(x, level + 1)
    depth(root["build"].obj())
    return root["build"].value


# ---- the CPU program -------------------------------------------------------------------------


def check_cpu(root: Field, constants: dict) -> dict:
    """{"program": {...}, "kernels": {key: record}} from a checked manifest; ``constants``:
    {name: (dtype, shape)} of the constants (already read), which steps may read."""
    prog = root["program"]
    values = {}
    arena = 0
    for name, f in prog["values"].items():
        if isinstance(f.value, dict) and any(d is None for d in f["shape"].value or ()):
            # A size only known at run time (docs/graph.md): the value lives outside the
            # arena, and the executor checks its size when it is made.
            dims = f["shape"].list()
            shape = tuple(None if d.value is None else d.integer() for d in dims)
            values[name] = {"dtype": f["dtype"].dtype(), "shape": list(shape)}
            continue
        dtype, shape = check_array(f, "value")
        values[name] = {"dtype": dtype, "shape": list(shape)}
        arena += nbytes(dtype, shape) + 64
    check_bytes(arena, f"{prog.path}.values (the arena)")
    kernels = {key: _kernel(key, f) for key, f in root["kernels"].items()}
    known = {**{k: (v["dtype"], tuple(v["shape"])) for k, v in values.items()}, **constants}
    inputs, outputs = prog["inputs"].names(), prog["outputs"].names()
    for k, name in enumerate(inputs):
        if name not in values:
            raise prog["inputs"].list()[k].fail(f"{name!r} is not among the program's values")
    defined = set(inputs)
    steps = [_step(f, known, values, kernels, defined) for f in prog["steps"].list()]
    for k, name in enumerate(outputs):
        if name not in defined:
            raise prog["outputs"].list()[k].fail(f"{name!r} is made by no step")
    specs = {key: f.obj() for key, f in prog["specs"].items()}
    return {"program": {"name": prog["name"].string(), "inputs": inputs, "outputs": outputs,
                        "values": values, "steps": steps, "specs": specs},
            "kernels": kernels}


def _kernel(key: str, f: Field) -> dict:
    if len(key) != 64 or key.strip("0123456789abcdef"):
        raise f.fail("is not named by a kernel key (64 hex digits)")
    params, temps = [], []
    for rows, into in ((f["params"], params), (f["temps"], temps)):
        for row in rows.list():
            n, s, d = row.list(3)
            name, shape, dtype = n.string(), s.shape(), d.dtype()
            check_bytes(nbytes(dtype, shape), f"{row.path} (buffer {dtype}{list(shape)})")
            if dtype not in KERNEL_DTYPES:
                raise row.fail(f"has dtype {dtype}; kernels take "
                               f"{', '.join(sorted(KERNEL_DTYPES))}")
            into.append([name, list(shape), dtype])
    check_bytes(sum(nbytes(d, s) for _, s, d in temps), f"{f.path}.temps")
    written = [w.integer(0, len(params) - 1) for w in f["written"].list()]
    if len(set(written)) != len(written):
        raise f["written"].fail("names a parameter twice")
    # A parallel loop runs over one axis (or fused axes) of some buffer, so its extent is
    # at most the largest buffer's element count: a bound against a wild extent.
    most = max((int(np.prod(s, dtype=object)) for _, s, _ in params + temps), default=0)
    segments = []
    for seg in f["segments"].list():
        symbol, extent = seg.list(2)
        segments.append([symbol.string(), None if extent.value is None
                         else extent.integer(0, max(most, 1))])
    if not segments:
        raise f["segments"].fail("is empty: a kernel has at least one function")
    target = f["target"].obj()
    return {"name": f["name"].string(), "params": params, "temps": temps, "written": written,
            "segments": segments, "target": target}


def _step(f: Field, known: dict, values: dict, kernels: dict, defined: set,
          depth: int = 0) -> dict:
    kind = f["kind"].string(STEP_KINDS)
    step = {"kind": kind, "node": f["node"].string(), "op": f["op"].string(),
            "inputs": f["inputs"].names(), "outputs": f["outputs"].names()}
    ins, outs = step["inputs"], step["outputs"]
    for k, name in enumerate(outs):
        if name and name not in values:
            raise f["outputs"].list()[k].fail(f"{name!r} is not among the program's values")
        if name in defined:
            raise f["outputs"].list()[k].fail(f"{name!r} is written twice")
    for k, name in enumerate(ins):
        if name and name not in known:
            raise f["inputs"].list()[k].fail(f"{name!r} is neither a value nor a constant")
        if name and name in values and name not in defined and name not in outs:
            raise f["inputs"].list()[k].fail(f"{name!r} is read before any step makes it")
    # (a kernel may write several outputs: a recurrent layer's Y, Y_h and Y_c)
    if kind == "kernel" and (not all(ins) or not outs or not all(outs)):
        raise f.fail("a kernel step has named inputs and outputs")
    if kind in ("view", "concat") and (not all(ins) or len(outs) != 1 or not outs[0]):
        raise f.fail(f"a {kind} step has named inputs and one output")
    if kind == "kernel":
        _kernel_step(f, step, known, kernels)
    elif kind == "view":
        _view_step(f, ins, outs, known, defined)
    elif kind == "concat":
        _concat_step(f, ins, outs, known)
    elif kind == "control":  # If/Loop/Scan with compiled bodies: runtime/schema_control.py
        check_control_step(f, step, known, values, kernels, depth, _step, decode)
    else:
        from ..compiler.graph.reference import OPERATORS

        if step["op"] not in OPERATORS:
            raise f["op"].fail(f"{step['op']!r} is not an operator celosia runs")
        step["attrs"] = decode(f["attrs"])
        if not isinstance(step["attrs"], dict):
            raise f["attrs"].fail("is not an object")
    defined.update(o for o in outs if o)
    return step


def _kernel_step(f: Field, step: dict, known: dict, kernels: dict) -> None:
    key = f["kernel"].string()
    if key not in kernels:
        raise f["kernel"].fail("names no kernel of the manifest")
    step["kernel"] = key
    rec, ins = kernels[key], step["inputs"]
    if len(ins) != len(rec["params"]):
        raise f["inputs"].fail(f"has {len(ins)} arrays, kernel {rec['name']} takes "
                               f"{len(rec['params'])}")
    for k, (name, (pname, shape, dtype)) in enumerate(zip(ins, rec["params"])):
        if known[name] != (dtype, tuple(shape)):
            have = known[name]
            raise f["inputs"].list()[k].fail(
                f"{name!r} is {have[0]}{list(have[1])}, kernel {rec['name']}'s parameter "
                f"{pname!r} is {dtype}{shape}")
    if sorted({ins[w] for w in rec["written"]}) != sorted(step["outputs"]):
        raise f.fail(f"writes {step['outputs']}, kernel {rec['name']} writes "
                     f"{[ins[w] for w in rec['written']]}")


def _view_step(f: Field, ins: list, outs: list, known: dict, defined: set) -> None:
    if len(ins) != 1 or ins[0] not in defined:
        raise f["inputs"].fail("a view step views one value made earlier")
    (din, sin), (dout, sout) = known[ins[0]], known[outs[0]]
    if din != dout or nbytes(din, sin) != nbytes(dout, sout):
        raise f.fail(f"views {din}{list(sin)} as {dout}{list(sout)}: not the same bytes")


def _concat_step(f: Field, ins: list, outs: list, known: dict) -> None:
    dtype, shape = known[outs[0]]
    parts = [known[i] for i in ins]
    ok = len(shape) >= 2 and all(
        d == dtype and len(s) == len(shape) and s[:1] + s[2:] == shape[:1] + shape[2:]
        for d, s in parts) and sum(s[1] for _, s in parts) == shape[1]
    if not ok:
        raise f.fail(f"concatenates {[f'{d}{list(s)}' for d, s in parts]} into "
                     f"{dtype}{list(shape)} along axis 1: the shapes do not add up")


# ---- the accelerator build -------------------------------------------------------------------


def check_config(root: Field):
    """The HwConfig a build was made for (its own checks, errors named after the field)."""
    from ..config import ConfigError, HwConfig

    f = root["config"]
    try:
        return HwConfig.from_dict(f.obj(), source=f.path)
    except (ConfigError, TypeError, ValueError) as e:
        raise f.fail(f"is not a configuration ({str(e).splitlines()[0]})") from None


def check_graph(root: Field, initializers: dict):
    """The quantized graph: names, types, nodes and attributes; the graph verifier; and
    each node's output types as the operator defines them (so attributes that do not fit
    their operator are an error here, not at run time). ``initializers``: the arrays,
    read from their members already."""
    from ..compiler.graph.ir import Graph, GraphError, Node, TensorType, verify_graph
    from ..compiler.graph.reference import OPERATORS, infer_node

    g = root["graph"]
    types = {}
    for name, f in g["types"].items():
        dtype, shape = check_array(f, "value")
        types[name] = TensorType(dtype, shape)
    nodes, names = [], set()
    for f in g["nodes"].list():
        op = f["op"].string()
        if op not in OPERATORS:
            raise f["op"].fail(f"{op!r} is not an operator celosia runs")
        attrs = decode(f["attrs"])
        if not isinstance(attrs, dict):
            raise f["attrs"].fail("is not an object")
        if "epilogue" in attrs:
            attrs["epilogue"] = _epilogue(f["attrs"]["epilogue"])
        node = Node(op, tuple(f["inputs"].names()), tuple(f["outputs"].names()), attrs,
                    f["name"].string())
        if node.name in names:
            raise f["name"].fail(f"node {node.name!r} appears twice")
        names.add(node.name)
        nodes.append(node)
    graph = Graph(g["name"].string(), tuple(g["inputs"].names()), tuple(g["outputs"].names()),
                  tuple(nodes), dict(initializers), types)
    try:
        verify_graph(graph)
        for node in nodes:
            got = infer_node(node, [types.get(i) if i else None for i in node.inputs],
                             [initializers.get(i) if i else None for i in node.inputs])
            want = [types[o] for o in node.outputs if o]
            if [t for t, o in zip(got, node.outputs) if o] != want:
                raise GraphError(f"node {node.name!r} ({node.op}) makes "
                                 f"{', '.join(map(str, got))}, typed {', '.join(map(str, want))}")
    except GraphError as e:
        raise g.fail(str(e)) from None
    except (ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError,
            ZeroDivisionError) as e:  # an operator's own checks on attributes it cannot use
        raise g.fail(f"a node's attributes do not fit its operator ({type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return graph


def _epilogue(f: Field) -> tuple:
    steps = []
    for step in f.list():
        parts = step.list()
        if not parts:
            raise step.fail("is an empty epilogue step")
        parts[0].string()
        steps.append(tuple(p.value for p in parts))
    return tuple(steps)


def check_accel(root: Field, graph, cfg, image_bytes: int) -> dict:
    """Placements, programs and value buffers of an accelerator build, against its graph
    and DRAM image (``image_bytes`` long)."""
    from ..compiler.accel.partition import (ALIAS_OPS, PLACED_OPS, RECURRENT_OPS, Placement,
                                            concat_slices, dram_reads, packed_shape, root_of)
    from ..compiler.accel.recurrent import is_host_node
    from .accel_recurrent import HOST_KINDS, check_host_program

    nodes = {n.name: n for n in graph.nodes}
    placements = {}
    # the built-in targets, and the plug-in targets that have partitions (check_external)
    known = ("accel", "cpu", *external_targets(root))
    for name, f in root["placements"].items():
        target, reason = f.list(2)
        placements[name] = Placement(target.string(known), reason.string())
    if set(placements) != set(nodes):
        missing = sorted(set(nodes) - set(placements)) or sorted(set(placements) - set(nodes))
        raise root["placements"].fail(f"does not place exactly the graph's nodes "
                                      f"({', '.join(map(repr, missing[:3]))})")
    accel = {n for n, p in placements.items() if p.target == "accel"}
    programs = {}
    for name, f in root["programs"].items():
        if name not in accel:
            raise f.fail("is a program for a node not placed on the accelerator")
        kind = f["kind"].string()
        op = nodes[name].op
        if (kind == "view") != (op in ALIAS_OPS) or (kind == "concat") != (op in PLACED_OPS) \
                or (kind in HOST_KINDS) != is_host_node(nodes[name]):
            raise f["kind"].fail(f"is {kind!r} for a {op} node (views are the accelerator's "
                                 f"{', '.join(ALIAS_OPS)} nodes, placements its Concat nodes, "
                                 f"recurrent and control programs its {', '.join(RECURRENT_OPS)}"
                                 f" nodes and control flow with integer products, "
                                 f"and only they)")
        if kind == "fused" and op != "MaxPool":
            raise f["kind"].fail(f"is 'fused' for a {op} node: only a MaxPool is run by the "
                                 f"program of the layer before it (compiler/accel/fuse_pool.py)")
        # A view or a placement runs no program (compiler/accel/partition.py), a recurrent
        # layer one per product (listed in its products), a fused MaxPool none (its QConv's
        # program stores its output).
        addr, count = f["insn_addr"].integer(), \
            f["insn_count"].integer(int(kind not in ("view", "concat", "fused", *HOST_KINDS)))
        if addr % 16 or addr + 16 * count > image_bytes:
            raise f.fail(f"has its {count} instructions at {addr}, not 16-byte aligned "
                         f"inside the {image_bytes}-byte DRAM image")
        programs[name] = {"insn_addr": addr, "insn_count": count, "kind": kind,
                          "spec": f["spec"].obj(), "knobs": f["knobs"].obj(),
                          "macs": f["macs"].integer(), "region": f["region"].integer()}
        if kind in HOST_KINDS:
            programs[name].update(check_host_program(f, nodes[name], graph, cfg, image_bytes))
        if f.get("staged") is not None:
            programs[name]["staged"] = [_staged(s, nodes[name], graph, cfg, image_bytes)
                                        for s in f["staged"].list()]
        elif nodes[name].op == "QMatMul" and nodes[name].inputs[1] not in graph.initializers:
            raise f.fail("is a QMatMul program without the weight operand it packs at run time "
                         "(staged)")
    if set(programs) != accel:
        raise root["programs"].fail("does not hold one program per accelerator node")
    values = {}
    for name, f in root["values"].items():
        layout = f["layout"].string(("matrices",)) if f.get("layout") is not None else None
        if name not in graph.types or (len(graph.types[name].shape) not in (2, 3, 4)
                                       if layout is None else len(graph.types[name].shape) < 3):
            raise f.fail("is not a 2-D, 3-D or 4-D value of the graph (or, in the matrices "
                         "layout, one of 3 or more axes)")
        addr, shape = f["addr"].integer(), f["shape"].shape()
        # A view's bytes are those of its root, another value of the graph.
        of = f["of"].string() if f.get("of") is not None else None
        if of is not None and (of not in graph.types or len(graph.types[of].shape) not in (2, 3, 4)
                               or int(np.prod(graph.types[of].shape)) !=
                               int(np.prod(graph.types[name].shape))):
            raise f["of"].fail(f"names {of!r}, not a 2-D, 3-D or 4-D value of the graph of the "
                               f"same size")
        want = packed_shape(graph.types[of or name].shape, cfg, layout)
        if shape != want:
            raise f["shape"].fail(f"is {list(shape)}, the packed shape of "
                                  f"{of or name!r} is {list(want)}")
        size = int(np.prod(shape, dtype=object))
        if addr + size > image_bytes:
            raise f.fail(f"lies at [{addr}, {addr + size}), outside the {image_bytes}-byte "
                         f"DRAM image")
        values[name] = {"addr": addr, "shape": list(shape),
                        **({"layout": layout} if layout else {}), **({"of": of} if of else {})}
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    for name, v in values.items():
        want = root_of(name, producer, placements)
        if v.get("of", name) != want:
            raise root["values"][name].fail(
                f"says it is the bytes of {v.get('of', name)!r}, but the graph and placements "
                f"make it those of {want!r}")
        if "of" in v and (v["of"] not in values or values[v["of"]]["addr"] != v["addr"]):
            raise root["values"][name].fail(
                f"is a view of {v['of']!r}, which has no buffer of its own at {v['addr']}")
    # a fused MaxPool's input: pooled in the accumulator, never stored (fuse_pool.py)
    unstored = {nodes[n].inputs[0] for n, p in programs.items() if p["kind"] == "fused"}
    for name in sorted(accel):
        node = nodes[name]
        if is_host_node(node):  # its values stay on the host
            continue
        for v in (*dram_reads(node), node.outputs[0]):
            if v and v not in values and v not in unstored:
                raise root["values"].fail(f"has no buffer for {v!r}, which accelerator node "
                                          f"{name!r} uses")
    for v, (outer, offset) in concat_slices(graph, placements, cfg).items():
        if values[v]["addr"] != values[outer]["addr"] + offset:
            raise root["values"][v].fail(
                f"lies at {values[v]['addr']}, not at byte {offset} of {outer!r} (at "
                f"{values[outer]['addr']}), its slice of the Concat")
    return {"placements": placements, "programs": programs, "values": values}


def _staged(f: Field, node, graph, cfg, image_bytes: int) -> dict:
    """One operand an accelerator node's program has packed at run time: a QMatMul's second
    input in the weight layout, or a QConv's input as its windows (compiler/accel/im2col.py),
    at a buffer inside the DRAM image."""
    from ..compiler.accel import im2col
    from ..compiler.accel.matmul import weights_shape

    value, layout = f["value"].string(), f["layout"].string(("weights", im2col.LAYOUT))
    if layout == im2col.LAYOUT:
        if node.op != "QConv" or value != node.inputs[0] or \
                im2col.fits(node, graph, cfg) is None:
            raise f["value"].fail(f"is not the input of a QConv node whose windows the "
                                  f"accelerator can take ({node.name!r})")
        want = im2col.windows_of(node, graph).packed_shape(cfg)
    elif node.op != "QMatMul" or len(node.inputs) < 2 or value != node.inputs[1]:
        raise f["value"].fail(f"is not the second input of QMatMul node {node.name!r}")
    else:
        want = weights_shape(graph.types[value].shape, cfg)
    addr, shape = f["addr"].integer(), f["shape"].shape()
    if shape != want:
        raise f["shape"].fail(f"is {list(shape)}, {value!r}'s "
                              f"{'weight' if layout == 'weights' else layout} layout is {list(want)}")
    size = int(np.prod(shape, dtype=object))
    if addr + size > image_bytes:
        raise f.fail(f"lies at [{addr}, {addr + size}), outside the {image_bytes}-byte DRAM image")
    return {"value": value, "addr": addr, "shape": list(shape), "layout": layout}


def check_in_place(root: Field, graph, placements: dict) -> set[str]:
    """The CPU nodes computed in place on the packed layout (partition.packed_nodes):
    each one such a node can be (an artifact written before they existed has none, and
    runs those nodes as other CPU nodes)."""
    from ..compiler.accel.partition import packed_nodes

    f = root.get("in_place")
    if f is None:
        return set()
    names = set(f.names())
    can = packed_nodes(graph, placements) if any(p.target == "accel"
                                                 for p in placements.values()) else set()
    if not names <= can:
        raise f.fail(f"names {sorted(names - can)[:3]}, which cannot run in place on the "
                     f"packed layout (an element-wise int8 CPU node of operands made in DRAM)")
    return names


def external_targets(root: Field) -> list[str]:
    """The plug-in targets named by an accelerator build's partitions (runtime/targets.py);
    none in a file without any."""
    f = root.get("external")
    if f is None:
        return []
    names = []
    for p in f.list():
        name = p["target"].string()
        if not name.isidentifier():
            raise p["target"].fail(f"is {name!r}, not a target's name (an identifier)")
        names.append(name)
    return names


def check_external(root: Field, graph, placements: dict) -> list[tuple[str, list[str]]]:
    """The partitions of plug-in targets: each a run of consecutive nodes placed on its
    target, every such node in exactly one."""
    order = {n.name: k for k, n in enumerate(graph.nodes)}
    seen, parts = set(), []
    f = root.get("external")
    for p in (f.list() if f is not None else ()):
        target = p["target"].string()
        names = p["nodes"].names()
        if target in ("accel", "cpu") or not names or \
                any(n not in order or placements[n].target != target or n in seen
                    for n in names) or \
                [order[n] for n in names] != list(range(order[names[0]],
                                                        order[names[0]] + len(names))):
            raise p.fail(f"is not a run of consecutive nodes placed on plug-in target "
                         f"{target!r}, each in one partition")
        seen.update(names)
        parts.append((target, names))
    stray = [n for n, pl in placements.items() if pl.target not in ("accel", "cpu")
             and n not in seen]
    if stray:
        raise root["placements"].fail(f"places {stray[0]!r} on {placements[stray[0]].target!r}, "
                                      f"but no partition of that target holds it")
    return parts


def check_segments(root: Field, graph, placements: dict) -> list[list[str]]:
    """The CPU segments' node names: consecutive CPU nodes, each node at most once."""
    order = {n.name: k for k, n in enumerate(graph.nodes)}
    seen, segments = set(), []
    for f in root["segments"].list():
        names = f.names()
        if not names or any(n not in order or placements[n].target != "cpu" or n in seen
                            for n in names) or \
                [order[n] for n in names] != list(range(order[names[0]],
                                                        order[names[0]] + len(names))):
            raise f.fail("is not a run of consecutive CPU nodes of the graph, each in one "
                         "segment")
        seen.update(names)
        segments.append(names)
    return segments
