"""Quantized recurrent layers (QLSTM, QGRU, QRNN: compiler/graph/qrecurrent.py), and
control flow whose bodies hold integer products (QMatMulWide and those layers:
compiler/graph/qbody.py), on the accelerator: the integer products on the GEMM core, the
rest on the CPU.

A layer's node is one accelerator node whose values stay on the host (float in and out).
Building gives it one resident program per integer product (compiler/accel/wide.py, 16-bit
activations as two int8 GEMM passes): per direction, the input projection of every time
step at once ([T*B, I] x W^T) and the recurrence of one step ([B, H] x R^T; GRU: two).
Running it runs qrecurrent.py's definition, the same code as the CPU build's numpy step,
with ``products`` that pack the 16-bit operand's digit planes into DRAM, run the product's
program and read the int32 accumulators back: the gates, nonlinearities and cell update
run on the CPU between two steps, exactly as in the all-CPU build, so the outputs agree
bit for bit.

An If, Loop or Scan with such bodies is one accelerator node too, with a program per
product of every such node in its bodies (a QMatMulWide's in exact mode: the int64 product,
as its definition). Running it runs the node's control-flow kernel (graph/ops_control.py)
with a body runner that executes the body's nodes in order: the integer-product nodes with
their programs, the others with the numpy kernels (reference.evaluate_node), which is how
the CPU build runs such a node too (a numpy step: compiler/cpu/control.py), so the two
agree bit for bit.

Per step the border is small on purpose: with BATCH = 1 the packed operand of a [1, H]
state is its two digit rows (H bytes each), and the result four byte rows; packing them
and putting the bytes together is the layer's layout time, quantizing and dequantizing
(part of the definition) its CPU time.
"""

from __future__ import annotations

import time
import weakref

import numpy as np

__all__ = ["HOST_KINDS", "build_host_node", "run_host_node", "check_host_program",
           "host_bytes"]

# Program kinds of accelerator nodes whose values stay on the host: a recurrent layer, and
# control flow whose bodies hold integer products (QMatMulWide, recurrent layers).
HOST_KINDS = ("recurrent", "wide", "control")


def _key_str(key) -> str:
    return "/".join(map(str, key))


def _products_of(node, graph) -> dict:
    from ..compiler.accel.recurrent import layer_products, wide_products

    return wide_products(node, graph) if node.op in ("QMatMulWide", "QConvWide") else \
        layer_products(node, graph)


def _steps(node, graph, key) -> int:
    from ..compiler.accel.recurrent import time_steps

    return time_steps(node, graph)[0] if key[0] == "R" else 1


def _build_products(node, graph, cfg, dev, name: str) -> tuple[list, int]:
    """Per product of ``node`` (a recurrent layer or a QMatMulWide in ``graph``): its
    resident program and buffers; and the node's multiply-adds per run."""
    from ..compiler.accel.wide import (WideSpec, carry_correction, carry_plan, exact_in_int32,
                                       pack_wide_weight, wide_correction, wide_dense,
                                       wide_knobs)
    from .wide_border import warm_kernels

    b, k = cfg.batch, cfg.block
    products, macs = [], 0
    for key, (w, m) in _products_of(node, graph).items():
        o, kd = w.shape
        # the convolutions' and dense products' definition is exact, a recurrent layer's
        # with int16 weights too (its int8 one wraps in 32 bits, as Horner's rule does)
        exact = node.op in ("QMatMulWide", "QConvWide") or w.dtype == np.int16
        if exact and exact_in_int32(w):
            exact = False  # the 32-bit program's result is the exact product
        # exact products come back as the int64 itself, put together on the ALU, where no
        # accumulator can pass int32 (always, short of tens of thousands of inputs)
        init, problem = carry_plan(w) if exact else (0, "not exact")
        carry = problem is None
        spec = WideSpec(-(-m // b) * b, -(-kd // k) * k, -(-o // k) * k, 2,
                        1 if w.dtype == np.int8 else 2, exact=exact, carry=carry,
                        carry_init=init if carry else 1)
        knobs = wide_knobs(cfg, spec)
        fn = wide_dense(cfg, spec, knobs, name=f"{name}/{_key_str(key)}")
        specs = fn.arg_specs()
        a_buf = dev.alloc(int(np.prod(specs[0][2])), align=specs[0][3])
        bufs = [a_buf, dev.upload(pack_wide_weight(w, cfg), align=specs[1][3])]
        if carry and init:
            bufs.append(dev.upload(carry_correction(w, cfg, init), align=specs[2][3]))
        elif not exact:
            bufs.append(dev.upload(wide_correction(w, cfg), align=specs[2][3]))
        out_buf = dev.alloc(int(np.prod(specs[-1][2])), align=specs[-1][3])
        fn.bind(dev, bufs + [out_buf])
        prog = dev.build_program()
        macs += m * kd * o * _steps(node, graph, key)
        products.append({"key": list(key), "insn_addr": prog.insn_addr,
                         "insn_count": prog.insn_count, "m": m, "k": kd, "o": o,
                         # the last: 0 int32 (Horner), 1 exact (the host adds up the
                         # accumulators), 2 exact with carries (the int64's bytes)
                         "spec": [spec.m, spec.k, spec.o, spec.a_digits, spec.w_digits,
                                  2 if carry else int(exact)],
                         "knobs": [knobs.tile_m, knobs.tile_o, knobs.tile_k],
                         "a_addr": a_buf.addr, "a_shape": list(specs[0][2]),
                         "out_addr": out_buf.addr, "out_shape": list(specs[-1][2])})
        warm_kernels(products[-1], cfg)
    return products, macs


def build_host_node(node, graph, cfg, dev) -> dict:
    """The node's program record: per product, its resident program and buffers (for
    control flow, per integer-product node of its bodies)."""
    from ..compiler.accel.recurrent import body_nodes

    if node.op in ("If", "Loop", "Scan"):
        bodies, macs = [], 0
        for key, body, n in body_nodes(node):
            products, m = _build_products(n, body, cfg, dev, key)
            bodies.append({"key": key, "op": n.op, "products": products})
            macs += m
        return {"insn_addr": 0, "insn_count": 0, "kind": "control",
                "spec": {"nodes": len(bodies), "macs_per_call": "each body node's, once"},
                "knobs": {}, "macs": macs, "bodies": bodies}
    products, macs = _build_products(node, graph, cfg, dev, node.name)
    kind = "wide" if node.op in ("QMatMulWide", "QConvWide") else "recurrent"
    return {"insn_addr": 0, "insn_count": 0, "kind": kind,
            "spec": {"products": len(products)}, "knobs": {}, "macs": macs,
            "products": products}


def host_bytes(node, graph, cfg) -> int:
    """DRAM bytes of the node's buffers (weights, corrections, operands, results)."""
    from ..compiler.accel.recurrent import body_nodes

    pairs = [(n, body) for _, body, n in body_nodes(node)] if node.op in ("If", "Loop", "Scan") \
        else [(node, graph)]
    b, k = cfg.batch, cfg.block
    total = 0
    for n, g in pairs:
        for w, m in _products_of(n, g).values():
            mp, kp, op = -(-m // b) * b, -(-w.shape[1] // k) * k, -(-w.shape[0] // k) * k
            total += w.itemsize * op * kp + 12 * op * b + 2 * mp * kp + 12 * mp * op + 4096
    return total


# Per executor, per product record (by identity, the record kept): its border.
_BORDERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _Launcher:
    """Runs products on an executor: packs the 16-bit operand, runs the program, puts the
    result together; counts cycles, multiply-adds, launches and the border's time."""

    def __init__(self, ex, cfg):
        self.ex, self.cfg = ex, cfg
        self.stats = {"cycles": 0, "macs": 0, "layout_s": 0.0, "sim_s": 0.0, "launches": 0}

    def products(self, records: list, weights=None):
        """The ``products(key, a)`` function of one node; ``weights()``: {key: weight} of
        its exact products (asked only if one of them has its activation correction added
        on the host: programs without carries, from older .cel files)."""
        from ..compiler.accel.wide import exact_correction
        from .wide_border import WideBorder

        cfg, ex, stats = self.cfg, self.ex, self.stats
        # Per product, what each launch needs, made once per executor (a launch's border is
        # a few microseconds: dictionary look-ups and np.prod would be a good part of it,
        # and its buffers' views are the executor's DRAM).
        borders = _BORDERS.setdefault(ex, {})
        launch, exact = {}, None
        for p in records:
            key = tuple(p["key"])
            border = borders.get(id(p))
            if border is None or border[0] is not p:
                corr = None
                if p["spec"][5] == 1:  # exact, the accumulators put together here
                    exact = weights() if exact is None and weights else exact
                    corr = exact_correction(exact[key]) if exact and key in exact else None
                border = (p, WideBorder(ex, cfg, p, corr))
                if border[1].in_place:  # (one that copies holds the executor: not kept)
                    borders[id(p)] = border
            launch[key] = (border[1], p["insn_addr"], p["insn_count"], p["k"] * p["o"])
        clock = time.perf_counter

        def run(key, a):
            border, insn_addr, insn_count, macs = launch[key]
            fast = border.fast
            if fast is not None and a.shape == fast[0] and a.dtype == np.int16:
                # the product's own shape in place (runtime/wide_border.py): a copy into
                # the kernel's staging array and a C call each way (the copy as an
                # assignment: less code around it than np.copyto, on the cold caches each
                # simulated step leaves: docs/runtime.md "Crossings bound at both ends")
                t0 = clock()
                fast[1][...] = a
                fast[2]()
                t1 = clock()
                counters = ex.run(insn_addr, insn_count)
                t2 = clock()
                fast[3]()
                acc = fast[4]
            else:
                t0 = clock()
                border.put(a)
                t1 = clock()
                counters = ex.run(insn_addr, insn_count)
                t2 = clock()
                acc = border.take(a.shape[0])
            stats["layout_s"] += (t1 - t0) + (clock() - t2)
            stats["sim_s"] += t2 - t1
            stats["cycles"] += int(counters.get("cycles", 0))
            stats["macs"] += a.shape[0] * macs
            stats["launches"] += 1
            return acc

        return run

    def result(self) -> dict:
        s = self.stats
        return {"cycles": s["cycles"], "macs": s["macs"], "layout_ms": s["layout_s"] * 1e3,
                "sim_ms": s["sim_s"] * 1e3, "launches": s["launches"]}


def _run_node(node, inputs: list, products):
    """One integer-product node with its products on the accelerator: what
    reference.evaluate_node computes, the products excepted."""
    from ..compiler.graph.qrecurrent import q_recurrent
    from ..compiler.graph.qwide import conv_columns, qconv_wide, qmatmul_wide
    from ..compiler.graph.reference import apply_epilogue

    def conv_product(q):
        # im2col on the host (at the border, with the packing), then the product
        n = q.shape[0]
        acc = products(("M",), conv_columns(q, node.attrs))
        return np.moveaxis(acc.reshape(n, *out_shape, -1), -1, 1)

    with np.errstate(all="ignore"):
        if node.op in ("QMatMulWide", "QConvWide"):
            epilogue = node.attrs.get("epilogue")
            own = inputs[:4] if epilogue else inputs
            if node.op == "QConvWide":
                out_shape = _conv_out(node, inputs[0].shape)
                y = qconv_wide(node.attrs, *own, product=conv_product)
            else:
                y = qmatmul_wide(node.attrs, *own, product=lambda a, w: products(("M",), a))
            if epilogue:
                y = apply_epilogue(y, epilogue, inputs)
            return (y,)
        return q_recurrent(node.op, node.attrs, *inputs, products=products)


def _exact_weights(node, graph) -> dict | None:
    """{key: weight} of the node's products that are exact (their activation correction
    is added on the host), None if none is."""
    if node.op in ("QMatMulWide", "QConvWide"):
        w = np.asarray(graph.initializers[node.inputs[1]])
        return {("M",): w.reshape(w.shape[0], -1)}
    exact = {key: w for key, (w, _) in _products_of(node, graph).items() if w.dtype == np.int16}
    return exact or None


def _conv_out(node, x_shape) -> list[int]:
    from ..compiler.graph.ops import pool_output_shape

    a = node.attrs
    return pool_output_shape(x_shape[2:], a["kernel_shape"], a["strides"], a["dilations"],
                             a["pads"])


def run_host_node(node, prog: dict, inputs: list, ex, cfg, graph) -> tuple[tuple, dict]:
    """Run the node with its products on executor ``ex``; (outputs, {"cycles", "macs",
    "layout_ms", "sim_ms", "launches"})."""
    launcher = _Launcher(ex, cfg)
    if prog["kind"] != "control":
        outs = _run_node(node, inputs, launcher.products(
            prog["products"], lambda: _exact_weights(node, graph)))
        return outs, launcher.result()
    from ..compiler.accel.recurrent import body_keys
    from ..compiler.graph.ir import captured_inputs
    from ..compiler.graph.ops_control import CONTROL_KERNELS
    from ..compiler.graph.reference import evaluate_node

    keys = body_keys(node)
    by_key = {}
    for rec in prog["bodies"]:
        by_key[rec["key"]] = rec

    runners: dict = {}

    def runner(key, n, body):
        if key not in runners:
            rec = by_key[key]
            runners[key] = launcher.products(rec["products"],
                                             lambda: _exact_weights(n, body))
        return runners[key]

    def run(body, args, captured):
        head = keys[id(body)]
        env = dict(body.initializers)
        env.update(zip(body.outer, captured))
        env.update(zip(body.inputs, args))
        for n in body.nodes:
            ins = [env[i] if i else None for i in n.inputs]
            key = f"{head}/{n.name}"
            if key in by_key:
                results = _run_node(n, ins, runner(key, n, body))
            elif n.op in CONTROL_KERNELS:
                k = len(n.inputs) - len(captured_inputs(n))
                with np.errstate(all="ignore"):
                    got = CONTROL_KERNELS[n.op](n.attrs, run, ins[:k], ins[k:])
                results = got if isinstance(got, tuple) else (got,)
            else:
                results = evaluate_node(n, ins)
            for o, v in zip(n.outputs, results):
                if o:
                    env[o] = np.asarray(v)
        return [env[o] for o in body.outputs]

    k = len(node.inputs) - len(captured_inputs(node))
    with np.errstate(all="ignore"):
        got = CONTROL_KERNELS[node.op](node.attrs, run, inputs[:k], inputs[k:])
    outs = got if isinstance(got, tuple) else (got,)
    return tuple(np.asarray(v) for v in outs[:len(node.outputs)]), launcher.result()


def _check_products(f, node, graph, image_bytes: int) -> list[dict]:
    """A node's products in a .cel manifest (runtime/schema.py), against the node: one per
    product, programs and buffers inside the image."""
    from ..compiler.accel.wide import WideSpec, out_planes

    want = _products_of(node, graph)
    out = []
    for p in f.list():
        key = tuple(v.integer() if isinstance(v.value, int) else v.string()
                    for v in p["key"].list())
        if key not in want:
            raise p["key"].fail(f"is not a product of {node.op} node {node.name!r}")
        w, m = want[key]
        rec = {"key": list(key), "insn_addr": p["insn_addr"].integer(),
               "insn_count": p["insn_count"].integer(1), "m": p["m"].integer(),
               "k": p["k"].integer(), "o": p["o"].integer(),
               "spec": [v.integer() for v in p["spec"].list(6)],
               "knobs": [v.integer() for v in p["knobs"].list(3)],
               "a_addr": p["a_addr"].integer(),
               "a_shape": list(p["a_shape"].shape()), "out_addr": p["out_addr"].integer(),
               "out_shape": list(p["out_shape"].shape())}
        if (rec["m"], rec["o"], rec["k"]) != (m, *w.shape):
            raise p.fail(f"has m, o, k {rec['m']}, {rec['o']}, {rec['k']}, the product is "
                         f"{m}, {w.shape[0]}, {w.shape[1]}")
        # the result's byte planes: 4 (int32), 4 per accumulator (exact), 8 (carries)
        mode = rec["spec"][5]
        planes = out_planes(WideSpec(*rec["spec"][:5], exact=mode >= 1, carry=mode == 2)) \
            if mode in (0, 1, 2) else None
        if planes is None or len(rec["out_shape"]) != 5 or rec["out_shape"][0] != planes:
            raise p.fail(f"has spec {rec['spec']} (its last: 0 int32, 1 exact, 2 exact with "
                         f"carries) and result planes {rec['out_shape'][:1]}, which do not "
                         f"go together")
        for what, addr, size in (("instructions", rec["insn_addr"], 16 * rec["insn_count"]),
                                 ("operand", rec["a_addr"], int(np.prod(rec["a_shape"]))),
                                 ("result", rec["out_addr"], int(np.prod(rec["out_shape"])))):
            if addr < 0 or addr + size > image_bytes:
                raise p.fail(f"has its {what} at [{addr}, {addr + size}), outside the "
                             f"{image_bytes}-byte DRAM image")
        out.append(rec)
    if {tuple(r["key"]) for r in out} != set(want):
        raise f.fail(f"does not hold one program per product of {node.name!r}")
    return out


def check_host_program(f, node, graph, cfg, image_bytes: int) -> dict:
    """The products (or, for control flow, the body nodes and their products) of a host
    node's program in a .cel manifest."""
    from ..compiler.accel.recurrent import body_nodes

    if f["kind"].string() != "control":
        return {"products": _check_products(f["products"], node, graph, image_bytes)}
    found = {key: (body, n) for key, body, n in body_nodes(node)}
    bodies = []
    for b in f["bodies"].list():
        key = b["key"].string()
        if key not in found:
            raise b["key"].fail(f"names no integer-product node in the bodies of {node.name!r}")
        body, n = found[key]
        bodies.append({"key": key, "op": b["op"].string((n.op,)),
                       "products": _check_products(b["products"], n, body, image_bytes)})
    if {b["key"] for b in bodies} != set(found):
        raise f["bodies"].fail(f"does not hold every integer-product node of {node.name!r}'s "
                               f"bodies")
    return {"bodies": bodies}
