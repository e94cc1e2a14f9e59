"""Vectorisable math for the CPU backend, emitted inline as LLVM IR.

``llvm.exp.v16f32`` has no vector implementation without a vector math library: LLVM
scalarises it into 16 calls of libm's ``expf``, which made a standalone Sigmoid kernel 42%
of EfficientNet-B0's time. ``emit_exp`` computes ``exp`` on scalars and vectors with
plain arithmetic instead (Cephes' ``expf``, as SIMD libraries and onnxruntime's MLAS do):

    n = rint(x * log2(e)),  r = x - n * ln(2)   (ln 2 in two parts: r is exact)
    exp(r) ~ a degree-6 polynomial on |r| <= ln(2)/2 (about 1 ulp)
    exp(x) = exp(r) * 2**n1 * 2**n2,  n1 = n >> 1, n2 = n - n1

each power of two made by placing ``n + 127`` in a float's exponent bits. Splitting ``n``
keeps both factors normal over the whole float32 range of results, subnormal ones
included (x down to about -103.9), so no range needs a special case. Above 88.7228
(exp overflows float32) the result is +inf, below -104 it is 0, NaN stays NaN: numpy's
float32 ``exp`` within 2 ulp (tests/compiler/cpu/test_fastmath.py).
"""

from __future__ import annotations

from llvmlite import ir

__all__ = ["emit_exp"]

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
         1.6666665459e-1, 5.0000001201e-1)
_HI, _LO = 88.72283905206835, -104.0


def _const(ty, value):
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [ir.Constant(ty.element, value)] * ty.count)
    return ir.Constant(ty, value)


def _with_element(ty, element):
    return ir.VectorType(element, ty.count) if isinstance(ty, ir.VectorType) else element


def _intrinsic(b: ir.IRBuilder, name: str, x):
    suffix = f"v{x.type.count}f32" if isinstance(x.type, ir.VectorType) else "f32"
    full = f"llvm.{name}.{suffix}"
    fn = b.module.globals.get(full) or ir.Function(b.module, ir.FunctionType(x.type, [x.type]),
                                                   full)
    return b.call(fn, [x])


def _pow2(b: ir.IRBuilder, n, fty):
    """2**n for int32 n in [-126, 127]: n + 127 in a float's exponent field."""
    ity = n.type
    bits = b.shl(b.add(n, _const(ity, 127)), _const(ity, 23))
    return b.bitcast(bits, fty)


def emit_exp(b: ir.IRBuilder, x):
    """``exp(x)`` of a float32 scalar or vector value (see the module docstring)."""
    fty = x.type
    ity = _with_element(fty, _I32)
    c = lambda v: _const(fty, v)  # noqa: E731
    # Clamp into the range the reduction handles (NaN passes both selects unchanged).
    xc = b.select(b.fcmp_ordered(">", x, c(_HI)), c(_HI), x)
    xc = b.select(b.fcmp_ordered("<", xc, c(_LO)), c(_LO), xc)
    n = _intrinsic(b, "rint", b.fmul(xc, c(_LOG2E)))
    r = b.fsub(b.fsub(xc, b.fmul(n, c(_LN2_HI))), b.fmul(n, c(_LN2_LO)))
    p = c(_POLY[0])
    for coef in _POLY[1:]:
        p = b.fadd(b.fmul(p, r), c(coef))
    y = b.fadd(b.fadd(b.fmul(p, b.fmul(r, r)), r), c(1.0))
    # NaN's n would be poison as an integer: use 0 there, the select below returns NaN.
    n = b.select(b.fcmp_unordered("uno", n, n), c(0.0), n)
    ni = b.fptosi(n, ity)
    n1 = b.ashr(ni, _const(ity, 1))
    n2 = b.sub(ni, n1)
    y = b.fmul(b.fmul(y, _pow2(b, n1, fty)), _pow2(b, n2, fty))
    y = b.select(b.fcmp_ordered(">", x, c(_HI)), c(float("inf")), y)
    y = b.select(b.fcmp_ordered("<", x, c(_LO)), c(0.0), y)
    return b.select(b.fcmp_unordered("uno", x, x), x, y)
