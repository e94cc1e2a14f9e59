"""Row-wise kernels of the transformer models, written directly in LLVM IR: LayerNormalization
and Softmax over the trailing elements of each row.

Both reduce along a row and then write it again, which the tensor language (sums only, a
vector lane per output element) cannot schedule well: a row of a few hundred floats is
read into L1 once and swept two or three times there with explicit vectors. Rows are the
parallel loop (one segment, ``fn(buffers, begin, end)`` as every kernel, run by the
native pool: threads.py).

Specs (float32, ``[rows, cols]`` row-major; the lowering flattens the leading axes):

    {"op": "layernorm", "rows": R, "cols": D, "epsilon": 1e-5, "bias": True}
        data [R, D], scale [D], (bias [D]), out [R, D]
    {"op": "softmax", "rows": R, "cols": D}      data [R, D], out [R, D]
    {"op": "logsoftmax", ...}                      the same shapes as softmax's
    {"op": "softmax", "rows": A, "cols": C, "inner": B}
        data [A, C, B], out [A, C, B]: Softmax over the middle axis (a segmentation or
        audio model's classes in NCHW / NCL), W neighbouring positions of B at a time as
        the lanes of one vector (strided by B along C), the last B % W one at a time;
        the parallel loop is over (a, group of positions)

Numerics follow graph/ops_nn.py's and graph/ops.py's numpy kernels step for step:
LayerNorm is two passes (the mean, then the mean of squared deviations: no cancellation
as one-pass E[x^2] - E[x]^2 has), ``y = (x - mean) * (1 / sqrt(var + eps)) * scale + bias``;
Softmax ``e = exp(x - max)``, ``e / sum(e)`` (LogSoftmax ``(x - max) - log(sum(e))``, the
log of each row's sum by llvm.log), exp inline (fastmath.py, within 2 ulp of
numpy's) and 0 where ``x - max < -60`` (numpy's is below 1e-26 there; this way no value
is ever subnormal). Sums run in W lanes (W = 16 with AVX-512, else 8) plus a scalar tail
for ``D % W`` columns, then the lanes are added pairwise: a different order than numpy's
pairwise sum, within float32 rounding (the tests hold it to a few ulp of the output's
scale). No multiply-add contraction (no fast-math flags): each step rounds as numpy's.
"""

from __future__ import annotations

import time

from llvmlite import ir

from celosia.errors import CompilerError

from ..tensor.tir import Buffer
from .codegen import CpuKernel, SavedSegment, _load_or_compile
from .fastmath import emit_exp
from .host import host_target

__all__ = ["ROWWISE_OPS", "compile_rowwise", "vector_lanes"]

ROWWISE_OPS = ("layernorm", "softmax", "logsoftmax")
_FLUSH = -60.0  # Softmax: exp(x - max) below exp(_FLUSH) is 0 (see _softmax_row)
_F32, _I64, _I8P = ir.FloatType(), ir.IntType(64), ir.IntType(8).as_pointer()


def vector_lanes() -> int:
    """Floats per vector register of the host: 16 with AVX-512, else 8."""
    return 16 if "+avx512f" in host_target().features.split(",") else 8


def _const(ty, v):
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [ir.Constant(ty.element, v)] * ty.count)
    return ir.Constant(ty, v)


class _Row:
    """Builder helpers over one function: counted loops with carried values, vector or
    scalar loads and stores at a column, horizontal reductions."""

    def __init__(self, b: ir.IRBuilder, lanes: int):
        self.b, self.lanes = b, lanes
        self.vty = ir.VectorType(_F32, lanes)

    def loop(self, lo, hi, step, init: list, body):
        """``for i in range(lo, hi, step)`` (i64 constants or values), carrying ``init``
        through ``body(i, carried) -> carried``; returns the carried values at exit."""
        b = self.b
        pre = b.block
        head = b.append_basic_block("head")
        work = b.append_basic_block("body")
        done = b.append_basic_block("done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(_I64)
        i.add_incoming(lo, pre)
        phis = [b.phi(v.type) for v in init]
        for p, v in zip(phis, init):
            p.add_incoming(v, pre)
        b.cbranch(b.icmp_signed("<", i, hi), work, done)
        b.position_at_end(work)
        new = body(i, phis)
        nxt = b.add(i, step)
        for p, v in zip(phis, new):
            p.add_incoming(v, b.block)
        i.add_incoming(nxt, b.block)
        b.branch(head)
        b.position_at_end(done)
        return phis

    def columns(self, cols: int, init_vec: list, init_scalar: list, body):
        """``body(column i64, ty, carried) -> carried`` over the columns: W at a time on
        vectors of ``ty``, then one at a time on scalars; returns (vector carried, scalar
        carried)."""
        w = self.lanes
        whole = cols // w * w
        c = lambda v: ir.Constant(_I64, v)  # noqa: E731
        vec = self.loop(c(0), c(whole), c(w), init_vec,
                        lambda j, acc: body(j, self.vty, acc)) if whole else init_vec
        sca = self.loop(c(whole), c(cols), c(1), init_scalar,
                        lambda j, acc: body(j, _F32, acc)) if cols > whole else init_scalar
        return vec, sca

    def load(self, ptr, j, ty):
        addr = self.b.gep(ptr, [j])
        if isinstance(ty, ir.VectorType):
            return self.b.load(self.b.bitcast(addr, ty.as_pointer()), align=4)
        return self.b.load(addr, align=4)

    def store(self, value, ptr, j):
        addr = self.b.gep(ptr, [j])
        if isinstance(value.type, ir.VectorType):
            addr = self.b.bitcast(addr, value.type.as_pointer())
        self.b.store(value, addr, align=4)

    def horizontal(self, vec, combine):
        """The lanes of ``vec`` combined pairwise (halves, then quarters, ...)."""
        b, n = self.b, self.lanes
        while n > 1:
            n //= 2
            lo = b.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(ir.IntType(32), n),
                                                       list(range(n))))
            hi = b.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(ir.IntType(32), n),
                                                       list(range(n, 2 * n))))
            vec = combine(lo, hi)
        return b.extract_element(vec, ir.Constant(ir.IntType(32), 0))


def _maximum(b):
    # NaN: either pick is fine, a NaN anywhere in the row makes the whole row NaN below
    # (as numpy's max propagates it).
    return lambda x, y: b.select(b.fcmp_ordered(">", y, x), y, x)


def _sum_columns(r: _Row, cols: int, term):
    """The sum over the row of ``term(column, ty)``: W lanes, then the tail."""
    b = r.b
    (vacc,), (sacc,) = r.columns(cols, [_const(r.vty, 0.0)], [_const(_F32, 0.0)],
                                 lambda j, ty, acc: [b.fadd(acc[0], term(j, ty))])
    return b.fadd(r.horizontal(vacc, b.fadd), sacc)


def _layernorm_row(r: _Row, spec: dict, x, out, scale, bias):
    b, cols = r.b, spec["cols"]
    mean = b.fmul(_sum_columns(r, cols, lambda j, ty: r.load(x, j, ty)),
                  _const(_F32, 1.0 / cols))

    def dev(j, ty):
        d = b.fsub(r.load(x, j, ty), _splat(b, mean, ty))
        return b.fmul(d, d)
    var = b.fdiv(_sum_columns(r, cols, dev), _const(_F32, float(cols)))
    std = _sqrt(b, b.fadd(var, _const(_F32, float(spec["epsilon"]))))
    inv = b.fdiv(_const(_F32, 1.0), std)

    def write(j, ty, acc):
        y = b.fmul(b.fsub(r.load(x, j, ty), _splat(b, mean, ty)), _splat(b, inv, ty))
        y = b.fmul(y, r.load(scale, j, ty))
        if bias is not None:
            y = b.fadd(y, r.load(bias, j, ty))
        r.store(y, out, j)
        return acc
    r.columns(cols, [], [], write)


def _flushed_exp(b, z, ty):
    """exp(z) of Softmax's shifted scores (z <= 0), 0 below e^-60 (1e-26, less than a
    float32 ulp of a row's sum), where it is not computed: subnormal results, and their
    products, cost ~100 cycles each (a random ViT's scores span hundreds: 20x slower),
    masked scores (-10000) too."""
    low = b.fcmp_ordered("<", z, _const(ty, _FLUSH))
    return b.select(low, _const(ty, 0.0), emit_exp(b, b.select(low, _const(ty, _FLUSH), z)))


def _softmax_row(r: _Row, spec: dict, x, out):
    b, cols = r.b, spec["cols"]
    ninf = float("-inf")
    (vmax,), (smax,) = r.columns(cols, [_const(r.vty, ninf)], [_const(_F32, ninf)],
                                 lambda j, ty, acc: [_maximum(b)(acc[0], r.load(x, j, ty))])
    top = _maximum(b)(r.horizontal(vmax, _maximum(b)), smax)

    def exps(j, ty):
        e = _flushed_exp(b, b.fsub(r.load(x, j, ty), _splat(b, top, ty)), ty)
        r.store(e, out, j)
        return e
    total = _sum_columns(r, cols, exps)
    if spec["op"] == "logsoftmax":
        lse = _log(b, total)

        def shift(j, ty, acc):
            z = b.fsub(r.load(x, j, ty), _splat(b, top, ty))
            r.store(b.fsub(z, _splat(b, lse, ty)), out, j)
            return acc
        r.columns(cols, [], [], shift)
        return
    inv = b.fdiv(_const(_F32, 1.0), total)

    def scale(j, ty, acc):
        r.store(b.fmul(r.load(out, j, ty), _splat(b, inv, ty)), out, j)
        return acc
    r.columns(cols, [], [], scale)


def _softmax_columns(r: _Row, spec: dict, x, out, ty):
    """Softmax over C of the ``ty`` (W lanes or one) positions at ``x`` / ``out``, whose
    elements along C are ``inner`` apart: the same steps as ``_softmax_row``, per lane."""
    b, c = r.b, ir.Constant(_I64, spec["cols"])
    stride = ir.Constant(_I64, spec["inner"])
    one = ir.Constant(_I64, 1)
    zero = ir.Constant(_I64, 0)
    at = lambda k: b.mul(k, stride)  # noqa: E731
    (top,) = r.loop(zero, c, one, [_const(ty, float("-inf"))],
                    lambda k, acc: [_maximum(b)(acc[0], r.load(x, at(k), ty))])

    def exps(k, acc):
        e = _flushed_exp(b, b.fsub(r.load(x, at(k), ty), top), ty)
        r.store(e, out, at(k))
        return [b.fadd(acc[0], e)]
    (total,) = r.loop(zero, c, one, [_const(ty, 0.0)], exps)
    if spec["op"] == "logsoftmax":
        lse = _log(b, total)

        def shift(k, acc):
            r.store(b.fsub(b.fsub(r.load(x, at(k), ty), top), lse), out, at(k))
            return acc
        r.loop(zero, c, one, [], shift)
        return
    inv = b.fdiv(_const(ty, 1.0), total)

    def scale(k, acc):
        r.store(b.fmul(r.load(out, at(k), ty), inv), out, at(k))
        return acc
    r.loop(zero, c, one, [], scale)


def _column_groups(spec: dict, lanes: int) -> tuple[int, int]:
    """(vector groups, single positions) per outer index of a strided softmax."""
    inner = spec["inner"]
    return inner // lanes, inner % lanes


def _splat(b, v, ty):
    if not isinstance(ty, ir.VectorType):
        return v
    undef = ir.Constant(ty, ir.Undefined)
    one = b.insert_element(undef, v, ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(one, undef, ir.Constant(ir.VectorType(ir.IntType(32), ty.count),
                                                   [0] * ty.count))


def _log(b, v):
    """llvm.log of a float or a vector of floats (a libm call per lane: once per row)."""
    name = "llvm.log.f32" if v.type == _F32 else f"llvm.log.v{v.type.count}f32"
    fn = b.module.globals.get(name) or ir.Function(
        b.module, ir.FunctionType(v.type, [v.type]), name)
    return b.call(fn, [v])


def _sqrt(b, v):
    fn = b.module.globals.get("llvm.sqrt.f32") or ir.Function(
        b.module, ir.FunctionType(_F32, [_F32]), "llvm.sqrt.f32")
    return b.call(fn, [v])


def _params(spec: dict) -> list[Buffer]:
    rows, cols = spec["rows"], spec["cols"]
    if spec["op"] in ("softmax", "logsoftmax"):
        shape = (rows, cols, spec["inner"]) if spec.get("inner", 1) > 1 else (rows, cols)
        return [Buffer("data", shape, "float32"), Buffer("out", shape, "float32")]
    return ([Buffer("data", (rows, cols), "float32"), Buffer("scale", (cols,), "float32")]
            + ([Buffer("bias", (cols,), "float32")] if spec["bias"] else [])
            + [Buffer("out", (rows, cols), "float32")])


def _module(spec: dict, symbol: str) -> str:
    """The LLVM IR of one parallel segment over the rows."""
    module = ir.Module(name=spec["op"])
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I8P.as_pointer(), _I64, _I64]),
                     symbol)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    r = _Row(b, vector_lanes())
    n_params = len(_params(spec))
    ptrs = [b.bitcast(b.load(b.gep(fn.args[0], [ir.Constant(_I64, k)])), _F32.as_pointer())
            for k in range(n_params)]
    cols = ir.Constant(_I64, spec["cols"])
    if spec.get("inner", 1) > 1:  # (a, group of positions) -> one column softmax
        groups, single = _column_groups(spec, r.lanes)
        per = ir.Constant(_I64, groups + single)

        def item(i, acc):
            a, g = b.sdiv(i, per), b.srem(i, per)
            base = b.mul(a, ir.Constant(_I64, spec["cols"] * spec["inner"]))
            vector = b.icmp_signed("<", g, ir.Constant(_I64, groups))
            pos = b.select(vector, b.mul(g, ir.Constant(_I64, r.lanes)),
                           b.add(g, ir.Constant(_I64, groups * (r.lanes - 1))))
            x, out = (b.gep(p, [b.add(base, pos)]) for p in (ptrs[0], ptrs[-1]))
            with b.if_else(vector) as (then, otherwise):
                with then:
                    _softmax_columns(r, spec, x, out, r.vty)
                with otherwise:
                    _softmax_columns(r, spec, x, out, _F32)
            return acc
        r.loop(fn.args[1], fn.args[2], ir.Constant(_I64, 1), [], item)
        b.ret_void()
        return str(module)

    def row(i, acc):
        offset = b.mul(i, cols)
        x, out = b.gep(ptrs[0], [offset]), b.gep(ptrs[-1], [offset])
        if spec["op"] in ("softmax", "logsoftmax"):
            _softmax_row(r, spec, x, out)
        else:
            _layernorm_row(r, spec, x, out, ptrs[1], ptrs[2] if spec["bias"] else None)
        return acc
    r.loop(fn.args[1], fn.args[2], ir.Constant(_I64, 1), [], row)
    b.ret_void()
    return str(module)


def _check(spec: dict) -> None:
    if spec.get("op") not in ROWWISE_OPS:
        raise CompilerError(f"no row-wise kernel for spec op {spec.get('op')!r}")
    for key in ("rows", "cols", "inner"):
        if key == "inner" and key not in spec:
            continue
        if not isinstance(spec.get(key), int) or spec[key] < 1:
            raise CompilerError(f"{spec['op']} spec: {key!r} must be a positive integer, "
                                f"not {spec.get(key)!r}")


def compile_rowwise(spec: dict, *, use_cache: bool = True) -> CpuKernel:
    """The compiled kernel of a ``layernorm`` or ``softmax`` spec."""
    _check(spec)
    start = time.perf_counter()
    symbol = f"{spec['op']}_seg0"
    llvm_ir = _module(spec, symbol)
    obj, path, hit = _load_or_compile(llvm_ir, use_cache)
    params = _params(spec)
    extent = spec["rows"]
    if spec.get("inner", 1) > 1:
        extent *= sum(_column_groups(spec, vector_lanes()))
    return CpuKernel(None, llvm_ir, obj, [], [SavedSegment(symbol, extent)], path, hit,
                     time.perf_counter() - start, name=spec["op"], params=params,
                     written=[len(params) - 1])
