"""A layer read only through channel slices becomes one layer per slice.

YOLO's C2f computes ``cv1`` (a QConv, then its SiLU table) and splits the result in two
halves along channels (two Slices): one half goes straight into the block's channel Concat,
the other on into the bottlenecks. In the packed layout a channel slice of whole BLOCKs is
contiguous for one batch block, but the Concat wants its inputs inside its own output
(partition.concat_slices) while a slice's bytes lie in the layer's: both cannot hold. So
before partitioning (``split_sliced_layers``, ``AccelModel.build``) the layer is split into
one QConv (or QGemm) per slice, of the slice's output channels (their rows of the weights,
bias and multipliers; one shift for all, as before), each followed by its own copy of the
table when there was one, writing the slice's value. A layer's output channels are
computed independently of each other, so the new graph computes the same bits as the old
one (tests/runtime/test_accel_split.py checks it against run_graph), with the same work when
the slices cover the channels once.

Conditions: every reader of the sliced value is a Slice along axis 1 with step 1 and
constant bounds, the slices are disjoint; the value is a QConv/QGemm output (groups 1, no
residual), or a QLut of one read by nothing else; neither is a graph output.
"""

from __future__ import annotations

from ..graph.ir import Graph, Node, TensorType, constant

__all__ = ["split_sliced_layers"]


def _channel_range(node: Node, channels: int) -> tuple[int, int] | None:
    """[start, end) of a Slice along axis 1 with step 1 and constant bounds, else None."""
    a = node.attrs
    if node.op != "Slice" or len(node.inputs) != 1 or not node.outputs:
        return None
    try:
        axes, steps = [int(v) for v in a["axes"]], [int(v) for v in a.get("steps", [1])]
        starts, ends = [int(v) for v in a["starts"]], [int(v) for v in a["ends"]]
    except (KeyError, TypeError, ValueError):
        return None
    if axes != [1] or steps != [1] or len(starts) != 1 or len(ends) != 1:
        return None
    first, end, _ = slice(starts[0], ends[0]).indices(channels)
    return (first, end) if end > first else None


def split_sliced_layers(graph: Graph) -> Graph:
    """The graph with every layer read only through channel slices split (module doc); the
    graph itself when there is none."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    readers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i:
                readers.setdefault(i, []).append(n)
    outputs = set(graph.outputs)
    inits, types = dict(graph.initializers), dict(graph.types)
    replace: dict[str, list[Node]] = {}  # layer name -> its parts, at its place
    drop: set[str] = set()
    names = {n.name for n in graph.nodes}

    def fresh(base: str, taken: set) -> str:
        k, name = 0, base
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    for value, users in readers.items():
        t = graph.types.get(value)
        if t is None or t.dtype != "int8" or len(t.shape) < 2 or value in outputs or \
                not all(u.op == "Slice" for u in users):
            continue
        ranges = [_channel_range(u, t.shape[1]) for u in users]
        if any(r is None for r in ranges) or any(u.outputs[0] in outputs for u in users):
            continue
        covered = sorted(ranges)
        if any(a[1] > b[0] for a, b in zip(covered, covered[1:])):
            continue  # overlapping slices: a split would compute channels twice
        lut = producer.get(value)
        if lut is not None and lut.op == "QLut":
            if lut.inputs[1] not in graph.initializers or len(readers[lut.inputs[0]]) != 1 \
                    or lut.inputs[0] in outputs:
                continue
            layer = producer.get(lut.inputs[0])
        else:
            layer, lut = lut, None
        if layer is None or layer.op not in ("QConv", "QGemm") or layer.name in replace or \
                int(layer.attrs.get("group", 1)) != 1 or \
                (len(layer.inputs) > 4 and layer.inputs[4]) or \
                any(i not in graph.initializers for i in layer.inputs[1:4]):
            continue
        w, bias, mult = (graph.initializers[i] for i in layer.inputs[1:4])
        parts = []
        for k, (user, (a, b)) in enumerate(zip(users, ranges)):
            target = user.outputs[0]
            cs = {}
            for i, arr in (("w", w), ("b", bias), ("m", mult)):
                cs[i] = fresh(f"{layer.name}/part{k}/{i}", set(types))
                inits[cs[i]] = constant(arr[a:b])
                types[cs[i]] = TensorType(str(arr.dtype), tuple(arr[a:b].shape))
            out = target
            if lut is not None:
                out = fresh(f"{layer.outputs[0]}/part{k}", set(types))
                types[out] = TensorType("int8", types[target].shape)
            parts.append(Node(layer.op, (layer.inputs[0], cs["w"], cs["b"], cs["m"]), (out,),
                              dict(layer.attrs), fresh(f"{layer.name}/part{k}", names)))
            if lut is not None:
                parts.append(Node("QLut", (out, lut.inputs[1]), (target,), dict(lut.attrs),
                                  fresh(f"{lut.name}/part{k}", names)))
        replace[layer.name] = parts
        drop |= {user.name for user in users} | ({lut.name} if lut is not None else set())
    if not replace:
        return graph
    nodes = []
    for n in graph.nodes:
        if n.name in replace:
            nodes += replace[n.name]
        elif n.name not in drop:
            nodes.append(n)
    from ..graph.passes import remove_dead_code
    from ..graph.ir import verify_graph

    out = remove_dead_code(graph.with_nodes(nodes, inits, types))
    verify_graph(out)
    return out
