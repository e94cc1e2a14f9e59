"""Protobuf-level mutations of a valid ONNX model: each takes a ModelProto (changed in place)
and a random.Random and says what it did; ``mutate`` applies one to three of them and
returns the bytes to import, with a description that reproduces the case in a report.

Values are drawn from the edges where importers break: 0, -1, 2^31, 2^62, NaN, infinities,
type codes onnx does not know, bytes that are not UTF-8.
"""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

EDGE_INTS = [0, 1, -1, 2, 3, -2, 7, 2**31, -(2**31), 2**62, 65536]
EDGE_FLOATS = [0.0, -1.0, 1e30, -1e-30, float("nan"), float("inf"), float("-inf"), 0.5]
EDGE_STRINGS = [b"", b"NOTSET", b"SAME_UPPER", b"VALID", b"reflect", b"edge", b"\xff\xfe\x00",
                b"constant", b"x" * 300,
                # values of the operators of issue #12, valid for some and not others
                b"linear", b"cubic", b"align_corners", b"tf_crop_and_resize", b"floor",
                b"not_larger", b"tanh", b"CRD", b"RIGHT", b"add", b"max", b"ij,jk->ik",
                b"i...,j->...", b"ii->i"]
ATTR_NAMES = ["axis", "axes", "perm", "strides", "pads", "kernel_shape", "dilations", "group",
              "to", "alpha", "beta", "mode", "keepdims", "transA", "value", "split",
              "num_outputs", "auto_pad", "ceil_mode", "epsilon", "start", "end", "allowzero",
              "noop_with_empty_axes", "block_size", "output_dtype", "seed", "bogus",
              # attributes of the operators of issue #12
              "output_padding", "output_shape", "coordinate_transformation_mode",
              "nearest_mode", "cubic_coeff_a", "exclude_outside", "antialias",
              "keep_aspect_ratio_policy", "num_groups", "stash_type", "p", "approximate",
              "fmod", "direction", "select_last_index", "largest", "sorted", "exclusive",
              "reverse", "batch_dims", "reduction", "upper", "blocksize", "equation",
              "detect_negative", "lambd", "bias"]
_TYPED = [AttributeProto.INT, AttributeProto.INTS, AttributeProto.FLOAT, AttributeProto.FLOATS,
          AttributeProto.STRING, AttributeProto.STRINGS, AttributeProto.TENSOR]


def _pick(rng, seq):
    return seq[rng.randrange(len(seq))] if len(seq) else None


def _value_names(m):
    g = m.graph
    names = [i.name for i in g.input] + [t.name for t in g.initializer]
    return names + [o for n in g.node for o in n.output if o]


def _random_attr(rng, name):
    kind = _pick(rng, _TYPED)
    if kind == AttributeProto.INT:
        return helper.make_attribute(name, _pick(rng, EDGE_INTS))
    if kind == AttributeProto.INTS:
        return helper.make_attribute(name, [_pick(rng, EDGE_INTS)
                                            for _ in range(rng.randrange(0, 5))],
                                     attr_type=AttributeProto.INTS)
    if kind == AttributeProto.FLOAT:
        return helper.make_attribute(name, _pick(rng, EDGE_FLOATS))
    if kind == AttributeProto.FLOATS:
        return helper.make_attribute(name, [_pick(rng, EDGE_FLOATS) for _ in range(3)])
    if kind == AttributeProto.STRING:
        return helper.make_attribute(name, _pick(rng, EDGE_STRINGS))
    if kind == AttributeProto.STRINGS:
        return helper.make_attribute(name, [_pick(rng, EDGE_STRINGS) for _ in range(2)])
    return helper.make_attribute(name, _random_tensor(rng))


def _random_tensor(rng):
    shape = [rng.choice([0, 1, 2, 3]) for _ in range(rng.randrange(0, 3))]
    dtype = rng.choice([np.float32, np.int64, np.int8, np.bool_, np.float64])
    return onnx.numpy_helper.from_array(np.ones(shape, dtype))


# ---- the mutations ---------------------------------------------------------------------------


def attr_value(m, rng):
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return add_attr(m, rng)
    n = _pick(rng, nodes)
    a = _pick(rng, n.attribute)
    # Half the time a plausible value (a valid model more often, to compare with
    # onnxruntime), else one from the edges.
    ints = [0, 1, 2, 3, -1] if rng.random() < 0.5 else EDGE_INTS
    if a.type == AttributeProto.INT:
        a.i = _pick(rng, ints) if rng.random() < 0.7 else a.i + rng.choice([-1, 1])
    elif a.type == AttributeProto.INTS and len(a.ints):
        k = rng.randrange(len(a.ints))
        a.ints[k] = _pick(rng, ints)
        if rng.random() < 0.3:
            a.ints.append(_pick(rng, EDGE_INTS)) if rng.random() < 0.5 else a.ints.pop()
    elif a.type == AttributeProto.FLOAT:
        a.f = _pick(rng, EDGE_FLOATS)
    elif a.type == AttributeProto.STRING:
        a.s = _pick(rng, EDGE_STRINGS)
    elif a.type == AttributeProto.TENSOR:
        a.t.CopyFrom(_random_tensor(rng))
    else:
        n.attribute.remove(a)
        n.attribute.append(_random_attr(rng, a.name))
    return f"attr_value {n.name}.{a.name}"


def attr_type(m, rng):
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return add_attr(m, rng)
    n = _pick(rng, nodes)
    a = _pick(rng, n.attribute)
    if rng.random() < 0.3:  # the type code alone: a field that disagrees, or an unknown code
        a.type = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 14])
    else:
        n.attribute.remove(a)
        n.attribute.append(_random_attr(rng, a.name))
    return f"attr_type {n.name}.{a.name}"


def remove_attr(m, rng):
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return add_attr(m, rng)
    n = _pick(rng, nodes)
    a = _pick(rng, n.attribute)
    n.attribute.remove(a)
    return f"remove_attr {n.name}.{a.name}"


def add_attr(m, rng):
    n = _pick(rng, m.graph.node)
    if n is None:
        return "add_attr (no node)"
    name = _pick(rng, ATTR_NAMES)
    n.attribute.append(_random_attr(rng, name))
    return f"add_attr {n.name}.{name}"


def drop_input(m, rng):
    nodes = [n for n in m.graph.node if n.input]
    if not nodes:
        return add_input(m, rng)
    n = _pick(rng, nodes)
    k = rng.randrange(len(n.input))
    if rng.random() < 0.5:
        del n.input[k]
    else:
        n.input[k] = ""
    return f"drop_input {n.name}[{k}]"


def add_input(m, rng):
    n = _pick(rng, m.graph.node)
    if n is None:
        return "add_input (no node)"
    name = _pick(rng, _value_names(m)) if rng.random() < 0.8 else "nowhere"
    n.input.append(name or "")
    return f"add_input {n.name} {name}"


def change_outputs(m, rng):
    n = _pick(rng, m.graph.node)
    if n is None:
        return "change_outputs (no node)"
    if len(n.output) > 1 and rng.random() < 0.5:
        n.output.pop()
        return f"drop_output {n.name}"
    n.output.append(rng.choice(["extra_out", "", n.output[0] if n.output else "z"]))
    return f"add_output {n.name}"


def input_dims(m, rng):
    vis = [v for v in m.graph.input if v.type.tensor_type.shape.dim]
    if not vis:
        return init_dims(m, rng)
    v = _pick(rng, vis)
    dims = v.type.tensor_type.shape.dim
    d = dims[rng.randrange(len(dims))]
    choice = rng.random()
    if choice < 0.15:
        dims.add().dim_value = 1
    elif choice < 0.3:
        del dims[-1]
    elif choice < 0.4:
        d.dim_param = "N"
    else:
        d.dim_value = _pick(rng, EDGE_INTS + [d.dim_value + 1])
    return f"input_dims {v.name}"


def elem_type(m, rng):
    code = rng.choice([0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 21, 23, 99, -3])
    targets = [("input", v) for v in m.graph.input] + \
              [("init", t) for t in m.graph.initializer]
    kind, t = _pick(rng, targets) or (None, None)
    if t is None:
        return "elem_type (nothing)"
    if kind == "input":
        t.type.tensor_type.elem_type = code
    else:
        t.data_type = code
    return f"elem_type {t.name}={code}"


def init_dims(m, rng):
    t = _pick(rng, m.graph.initializer)
    if t is None:
        return input_dims(m, rng) if any(v.type.tensor_type.shape.dim for v in m.graph.input) \
            else "init_dims (nothing)"
    choice = rng.random()
    if choice < 0.2 or not len(t.dims):
        t.dims.append(_pick(rng, [1, 2, -1, 0]))
    elif choice < 0.4:
        t.dims.pop()
    else:
        t.dims[rng.randrange(len(t.dims))] = _pick(rng, EDGE_INTS)
    return f"init_dims {t.name}"


def init_data(m, rng):
    t = _pick(rng, m.graph.initializer)
    if t is None:
        return elem_type(m, rng)
    choice = rng.random()
    if choice < 0.3 and t.raw_data:
        t.raw_data = t.raw_data[:rng.randrange(len(t.raw_data))]
    elif choice < 0.5:  # values that go wrong downstream: NaN, huge, negative, zero
        try:
            a = onnx.numpy_helper.to_array(t).copy()
        except Exception:  # an earlier mutation broke it already
            return "init_data (unreadable)"
        if a.size:
            flat = a.reshape(-1)
            k = rng.randrange(flat.size)
            if a.dtype.kind == "f":
                flat[k] = rng.choice([0, -1, 1e30, np.nan, 2**40, -7])
            elif a.dtype.kind in "iu":
                info = np.iinfo(a.dtype)
                flat[k] = rng.choice([0, 1, 5, info.max, info.min])
            else:
                flat[k] = not flat[k]
            t.CopyFrom(onnx.numpy_helper.from_array(a, t.name))
    elif choice < 0.65:
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for key, value in (("location", rng.choice(["../../etc/passwd", "w.bin", "/dev/zero"])),
                           ("offset", rng.choice(["0", "-5", "x"]))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    elif choice < 0.8:
        t.float_data.extend([1.0, 2.0])
    else:
        data = bytearray(t.raw_data)
        for _ in range(min(4, len(data))):
            data[rng.randrange(len(data))] = rng.randrange(256)
        t.raw_data = bytes(data)
    return f"init_data {t.name}"


def reorder_nodes(m, rng):
    nodes = list(m.graph.node)
    if len(nodes) < 2:
        return delete_node(m, rng)
    i, j = rng.sample(range(len(nodes)), 2)
    nodes[i], nodes[j] = nodes[j], nodes[i]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return f"reorder_nodes {i}<->{j}"


def delete_node(m, rng):
    if not m.graph.node:
        return "delete_node (no node)"
    k = rng.randrange(len(m.graph.node))
    name = m.graph.node[k].name
    del m.graph.node[k]
    return f"delete_node {name}"


def change_op(m, rng):
    from celosia.compiler.frontend.onnx import SUPPORTED_OPS
    n = _pick(rng, m.graph.node)
    if n is None:
        return "change_op (no node)"
    old, n.op_type = n.op_type, _pick(rng, SUPPORTED_OPS)
    return f"change_op {n.name} {old}->{n.op_type}"


def opset(m, rng):
    version = rng.choice([1, 6, 9, 10, 11, 12, 13, 16, 18, 21, 22, 25, 99, 0])
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = version
    return f"opset {version}"


def rename_value(m, rng):
    names = _value_names(m)
    if not names:
        return "rename_value (nothing)"
    old = _pick(rng, names)
    new = rng.choice(["renamed", names[0], ""])
    for n in m.graph.node:
        for seq in (n.output,) if rng.random() < 0.5 else (n.input, n.output):
            for k, v in enumerate(seq):
                if v == old:
                    seq[k] = new
    return f"rename_value {old}->{new}"


MUTATIONS = [attr_value, attr_type, remove_attr, add_attr, drop_input, add_input,
             change_outputs, input_dims, elem_type, init_dims, init_data, reorder_nodes,
             delete_node, change_op, opset, rename_value]
# Attributes and inputs are what the tracebacks came from: drawn more often.
WEIGHTS = [4, 3, 2, 2, 2, 2, 1, 2, 1, 2, 2, 1, 1, 1, 1, 1]


def flip_bytes(data: bytes, rng) -> tuple[bytes, str]:
    buf = bytearray(data)
    count = rng.choice([1, 2, 4, 8])
    # Flip in the structure (first bytes and small models), not only inside weights.
    span = min(len(buf), 4096) if rng.random() < 0.7 else len(buf)
    for _ in range(count):
        buf[rng.randrange(span)] ^= 1 << rng.randrange(8)
    return bytes(buf), f"flip_bytes x{count}"


def mutate(data: bytes, seed: int) -> tuple[bytes, str]:
    """The bytes of a mutated model and what was done to it."""
    rng = random.Random(seed)
    if rng.random() < 0.12:
        return flip_bytes(data, rng)
    m = onnx.load_from_string(data)
    done = [rng.choices(MUTATIONS, WEIGHTS)[0](m, rng) for _ in range(rng.choice([1, 1, 2, 3]))]
    return m.SerializeToString(), "; ".join(done)
