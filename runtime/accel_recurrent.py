"""Quantized recurrent layers (QLSTM, QGRU, QRNN: compiler/graph/qrecurrent.py) on the
accelerator: the integer products on the GEMM core, the rest on the CPU.

A layer's node is one accelerator node whose values stay on the host (float in and out).
Building gives it one resident program per integer product (compiler/accel/wide.py, 16-bit
activations as two int8 GEMM passes): per direction, the input projection of every time
step at once ([T*B, I] x W^T) and the recurrence of one step ([B, H] x R^T; GRU: two).
Running it runs qrecurrent.py's definition, the same code as the CPU build's numpy step,
with ``products`` that pack the 16-bit operand's digit planes into DRAM, run the product's
program and read the int32 accumulators back: the gates, nonlinearities and cell update
run on the CPU between two steps, exactly as in the all-CPU build, so the outputs agree
bit for bit.

Per step the border is small on purpose: with BATCH = 1 the packed operand of a [1, H]
state is its two digit rows (H bytes each), and the result four byte rows; packing them
and putting the bytes together is the layer's layout time, quantizing and dequantizing
(part of the definition) its CPU time.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["build_recurrent", "run_recurrent", "check_recurrent_program"]


def _key_str(key) -> str:
    return "/".join(map(str, key))


def build_recurrent(node, graph, cfg, dev) -> dict:
    """The node's program record: per product, its resident program and buffers."""
    from ..compiler.accel.wide import (WideSpec, pack_wide_weight, wide_correction,
                                       wide_dense, wide_knobs)

    b, k = cfg.batch, cfg.block
    products = []
    macs = 0
    from ..compiler.accel.recurrent import layer_products, time_steps

    for key, (w, m) in layer_products(node, graph).items():
        o, kd = w.shape
        spec = WideSpec(-(-m // b) * b, -(-kd // k) * k, -(-o // k) * k, 2,
                        1 if w.dtype == np.int8 else 2)
        knobs = wide_knobs(cfg, spec)
        fn = wide_dense(cfg, spec, knobs, name=f"{node.name}/{_key_str(key)}")
        specs = fn.arg_specs()
        a_buf = dev.alloc(int(np.prod(specs[0][2])), align=specs[0][3])
        bufs = [a_buf, dev.upload(pack_wide_weight(w, cfg), align=specs[1][3]),
                dev.upload(wide_correction(w, cfg), align=specs[2][3])]
        out_buf = dev.alloc(int(np.prod(specs[-1][2])), align=specs[-1][3])
        fn.bind(dev, bufs + [out_buf])
        prog = dev.build_program()
        steps = 1 if key[0] == "W" else time_steps(node, graph)[0]
        macs += m * kd * o * steps
        products.append({"key": list(key), "insn_addr": prog.insn_addr,
                         "insn_count": prog.insn_count, "m": m, "k": kd, "o": o,
                         "spec": [spec.m, spec.k, spec.o, spec.a_digits, spec.w_digits],
                         "knobs": [knobs.tile_m, knobs.tile_o, knobs.tile_k],
                         "a_addr": a_buf.addr, "a_shape": list(specs[0][2]),
                         "out_addr": out_buf.addr, "out_shape": list(specs[-1][2])})
    return {"insn_addr": 0, "insn_count": 0, "kind": "recurrent",
            "spec": {"products": len(products)}, "knobs": {}, "macs": macs,
            "products": products}


def recurrent_bytes(node, graph, cfg) -> int:
    """DRAM bytes of the layer's buffers (weights, corrections, operands, results)."""
    from ..compiler.accel.recurrent import layer_products

    b, k = cfg.batch, cfg.block
    total = 0
    for w, m in layer_products(node, graph).values():
        mp, kp, op = -(-m // b) * b, -(-w.shape[1] // k) * k, -(-w.shape[0] // k) * k
        total += (w.itemsize * op * kp + 4 * op * b + 2 * mp * kp + 4 * mp * op + 4096)
    return total


def run_recurrent(node, prog: dict, inputs: list, ex, cfg) -> tuple[tuple, dict]:
    """Run the layer with its products on executor ``ex``; (outputs, {"cycles", "macs",
    "layout_ms", "launches"})."""
    from ..compiler.accel.wide import pack_wide_activation, unpack_acc32
    from ..compiler.graph.qrecurrent import q_recurrent

    # Per product, what each launch needs, computed once (a launch's border is a few
    # microseconds: dictionary look-ups and np.prod would be a good part of it).
    launch = {tuple(p["key"]): (p["a_addr"], p["a_shape"][1] * cfg.batch, p["insn_addr"],
                                p["insn_count"], p["out_addr"], int(np.prod(p["out_shape"])),
                                tuple(p["out_shape"]), p["o"], p["k"])
              for p in prog["products"]}
    stats = {"cycles": 0, "macs": 0, "layout_s": 0.0, "sim_s": 0.0, "launches": 0}
    clock = time.perf_counter

    def products(key, a):
        a_addr, rows, insn_addr, insn_count, out_addr, nbytes, out_shape, o, k = launch[key]
        t0 = clock()
        ex.write_dram(a_addr, pack_wide_activation(a, cfg, rows=rows))
        t1 = clock()
        counters = ex.run(insn_addr, insn_count)
        t2 = clock()
        raw = ex.read_dram(out_addr, nbytes)
        acc = unpack_acc32(raw.view(np.int8).reshape(out_shape), a.shape[0], o)
        stats["layout_s"] += (t1 - t0) + (clock() - t2)
        stats["sim_s"] += t2 - t1
        stats["cycles"] += int(counters.get("cycles", 0))
        stats["macs"] += a.shape[0] * k * o
        stats["launches"] += 1
        return acc

    outs = q_recurrent(node.op, node.attrs, *inputs, products=products)
    return outs, {"cycles": stats["cycles"], "macs": stats["macs"],
                  "layout_ms": stats["layout_s"] * 1e3, "sim_ms": stats["sim_s"] * 1e3,
                  "launches": stats["launches"]}


def check_recurrent_program(f, node, graph, cfg, image_bytes: int) -> list[dict]:
    """The products of a recurrent program in a .cel manifest (runtime/schema.py), checked
    against the node: one per product of the layer, programs and buffers inside the image."""
    from ..compiler.accel.recurrent import layer_products

    want = layer_products(node, graph)
    out = []
    for p in f["products"].list():
        key = tuple(v.integer() if isinstance(v.value, int) else v.string()
                    for v in p["key"].list())
        if key not in want:
            raise p["key"].fail(f"is not a product of {node.op} node {node.name!r}")
        w, m = want[key]
        rec = {"key": list(key), "insn_addr": p["insn_addr"].integer(),
               "insn_count": p["insn_count"].integer(1), "m": p["m"].integer(),
               "k": p["k"].integer(), "o": p["o"].integer(),
               "spec": [v.integer() for v in p["spec"].list(5)],
               "knobs": [v.integer() for v in p["knobs"].list(3)], "a_addr": p["a_addr"].integer(),
               "a_shape": list(p["a_shape"].shape()), "out_addr": p["out_addr"].integer(),
               "out_shape": list(p["out_shape"].shape())}
        if (rec["m"], rec["o"], rec["k"]) != (m, *w.shape):
            raise p.fail(f"has m, o, k {rec['m']}, {rec['o']}, {rec['k']}, the product is "
                         f"{m}, {w.shape[0]}, {w.shape[1]}")
        for what, addr, size in (("instructions", rec["insn_addr"], 16 * rec["insn_count"]),
                                 ("operand", rec["a_addr"], int(np.prod(rec["a_shape"]))),
                                 ("result", rec["out_addr"], int(np.prod(rec["out_shape"])))):
            if addr < 0 or addr + size > image_bytes:
                raise p.fail(f"has its {what} at [{addr}, {addr + size}), outside the "
                             f"{image_bytes}-byte DRAM image")
        out.append(rec)
    if {tuple(r["key"]) for r in out} != set(want):
        raise f["products"].fail(f"does not hold one program per product of {node.name!r}")
    return out
