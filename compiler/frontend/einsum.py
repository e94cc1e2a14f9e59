"""Einsum of two float32 operands that is a (batched) matrix product, as Transpose ->
MatMul -> Transpose: the compiled dense kernels on the CPU build, a QGemm (constant
operand) or QMatMul (two run-time operands) for the quantizer, and so the accelerator.
Before, every Einsum was a numpy step the quantizer left float ("no int8 form of Einsum").

The equation's indices fall into: batch indices B (in both operands and the output), one
contracted index k (in both operands, not in the output), the first operand's free indices
I (at least one) and the second's free index j (exactly one). The operands are laid out as
``a: I[:-1] + B + [I[-1], k]`` and ``b: B + [k, j]`` so that MatMul's broadcasting lines up
B (the trailing batch axes of both); the product is ``I[:-1] + B + [I[-1], j]``, transposed
to the output's order. ``btd,de->bte`` (a dense layer), ``bhqd,bhkd->bhqk`` (attention
scores) and ``bhqk,bhkd->bhqd`` are such products. Anything else (an ellipsis, a repeated
index, a sum over an index of one operand, several contracted or second-operand free
indices, three operands, other dtypes) stays an Einsum node.
"""

from __future__ import annotations

from ..graph.ir import Node

__all__ = ["einsum_as_matmul"]


def _terms(equation: str):
    """(a, b, out) index strings, or None when the equation is not of the form handled."""
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    left, out = eq.split("->")
    terms = left.split(",")
    if len(terms) != 2:
        return None
    a, b = terms
    if not all(t.isalpha() and len(set(t)) == len(t) for t in (a, b)) or \
            not (out.isalpha() or out == "") or len(set(out)) != len(out):
        return None
    return a, b, out


def einsum_as_matmul(ctx, node: Node) -> list[Node]:
    """The nodes replacing an Einsum (module doc); ``[node]`` when it is not a product."""
    terms = _terms(str(node.attrs.get("equation", "")))
    if terms is None or len(node.inputs) != 2 or len(node.outputs) != 1:
        return [node]
    a, b, out = terms
    ta, tb = (ctx.types.get(v) for v in node.inputs)
    if ta is None or tb is None or ta.dtype != "float32" or tb.dtype != "float32" or \
            len(ta.shape) != len(a) or len(tb.shape) != len(b):
        return [node]
    if any(c not in a and c not in b for c in out):
        return [node]
    batch = [c for c in out if c in a and c in b]
    contracted = [c for c in a if c in b and c not in out]
    free_a = [c for c in a if c not in b]
    free_b = [c for c in b if c not in a]
    if len(contracted) != 1 or not free_a or len(free_b) != 1 or \
            any(c not in out for c in free_a + free_b):
        return [node]
    (k,), (j,) = contracted, free_b
    layout_a = free_a[:-1] + batch + [free_a[-1], k]
    layout_b = batch + [k, j]
    product = free_a[:-1] + batch + [free_a[-1], j]
    y = node.outputs[0]
    nodes: list[Node] = []

    def arranged(v: str, have: str, want: list, tag: str) -> str:
        perm = [have.index(c) for c in want]
        if perm == list(range(len(perm))):
            return v
        name = f"{y}/einsum_{tag}"
        nodes.append(Node("Transpose", (v,), (name,), {"perm": perm},
                          f"{node.name}/transpose_{tag}"))
        return name

    xa = arranged(node.inputs[0], a, layout_a, "a")
    xb = arranged(node.inputs[1], b, layout_b, "b")
    perm = [product.index(c) for c in out]
    if perm == list(range(len(perm))):
        nodes.append(Node("MatMul", (xa, xb), (y,), {}, node.name))
    else:
        mid = f"{y}/einsum_product"
        nodes.append(Node("MatMul", (xa, xb), (mid,), {}, node.name))
        nodes.append(Node("Transpose", (mid,), (y,), {"perm": perm},
                          f"{node.name}/transpose_out"))
    return nodes
