"""int8 x int8 -> int32 matrix products on the CPU's dot-product instructions, for the GEMM
kernels of the simulators' datapath (datapath.py).

One generic kernel, independent of any program: ``C[b] = A[b] @ B[b]`` for a batch of int8
matrices ``A[b]`` (M x K, rows at any stride) and int8 weights ``B[b]`` (K x N), packed
once (``pack``), the sums in int32 modulo 2^32, as the accelerator's ACC adds them. It is
written in LLVM IR for AVX-512 VNNI (``vpdpbusd``, int8_forms.py's ``vnni512`` form: the
activations enter as ``x ^ 0x80 = x + 128``, unsigned, and each column's sum starts at
``-128 * sum(w)``, so every lane holds exactly ``sum(x * w)`` modulo 2^32; the instruction
never saturates), compiled by LLVM for the host the first time a process uses it and kept
for the process's life (and on disk, compiler/cpu/codegen.py's kernel cache), like numpy's
BLAS library: it is not a per-program cache and ``clear_caches`` leaves it.

Register tile: 6 rows x 4 vectors of 16 int32 lanes (24 accumulators) over the whole K;
narrower column tails and the last rows have their own tiles. On a host without AVX-512
VNNI ``available()`` is False and the datapath keeps its float32 products.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

__all__ = ["available", "pack", "matmul", "Packed", "ENV"]

# "0" turns the kernel off (the datapath then uses its float32 matrix products).
ENV = "CELOSIA_SIM_INT8"
_LANES = 16
_ROWS = 6
_VECTORS = 4
_lock = threading.Lock()
_state: dict = {}
_ARGS = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
         ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
         ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]


def available() -> bool:
    """Whether the kernel runs on this host (AVX-512 VNNI, and not turned off by
    $CELOSIA_SIM_INT8=0)."""
    if "available" not in _state:
        ok = os.environ.get(ENV, "1") != "0"
        if ok:
            try:
                from celosia.compiler.cpu.int8_forms import host_form

                ok = host_form() == "vnni512"
            except Exception:  # llvmlite missing or unusable: the float32 path
                ok = False
        _state["available"] = ok
    return _state["available"]


class Packed:
    """Weights ``B`` (nb, K, N) as the kernel reads them: ``data`` (nb, NV, K/4, 16, 4)
    int8, N padded with zero columns to NV x 16, and ``corr`` (nb, NV x 16) int32, each
    column's ``-128 * sum(w)`` modulo 2^32."""

    __slots__ = ("data", "corr", "n", "k")

    def __init__(self, words: np.ndarray):
        nb, n, k4 = words.shape
        nv = -(-n // _LANES)
        full = words
        if n != nv * _LANES:
            full = np.zeros((nb, nv * _LANES, k4), np.uint32)
            full[:, :n] = words
        # (nb, NV, 16, K/4) words -> (nb, NV, K/4, 16)
        data = np.ascontiguousarray(full.reshape(nb, nv, _LANES, k4).transpose(0, 1, 3, 2))
        self.data = data.view(np.int8).reshape(nb, nv, k4, _LANES, 4)
        self.n, self.k = n, 4 * k4
        # each column's sum, by the kernel itself: rows of x = -127 (x ^ 0x80 = 1) and no
        # correction give sum(w) modulo 2^32
        self.corr = np.zeros((nb, nv * _LANES), np.int32)
        ones = np.full((nb, 1, self.k), -127, np.int8)
        sums = np.empty((nb, 1, nv * _LANES), np.int32)
        matmul(ones, self, out=sums)
        np.multiply(sums.reshape(nb, -1), -128, out=self.corr)  # int32: modulo 2^32


def pack(wt: np.ndarray) -> Packed:
    """The weights of ``A @ B`` packed for ``matmul``, given as ``wt`` = B transposed: int8
    (nb, N, K) (K a multiple of 4), or its groups of four bytes as uint32 words (nb, N,
    K/4), rows at any stride (a view: the datapath's weight blocks are (out, in) rows)."""
    if wt.dtype == np.int8:
        if wt.shape[2] % 4:
            raise ValueError(f"igemm: K={wt.shape[2]} is not a multiple of 4")
        wt = np.ascontiguousarray(wt).view(np.uint32)
    elif wt.dtype != np.uint32:
        raise ValueError(f"igemm: weights must be int8 or uint32 words, not {wt.dtype}")
    return Packed(wt)


def matmul(a: np.ndarray, packed: Packed, out: np.ndarray | None = None) -> np.ndarray:
    """``A[b] @ B[b]`` (nb, M, N) int32, modulo 2^32, for int8 ``a`` (nb, M, K) whose
    rows are contiguous (any row and batch stride). ``out``, if given, is a C-contiguous
    int32 (nb, M, NV x 16) array it writes (the result is its first N columns)."""
    fn = _kernel()
    nb, m, k = a.shape
    data = packed.data
    if a.dtype != np.int8 or k != packed.k or data.shape[0] != nb or a.strides[2] != 1:
        raise ValueError(f"igemm: a {a.dtype}{a.shape} (strides {a.strides}) does not match "
                         f"the packed weights {data.shape[:1] + (packed.k, packed.n)}")
    nv = data.shape[1]
    width = nv * _LANES
    if out is None:
        out = np.empty((nb, m, width), np.int32)
    fn(a.ctypes.data, a.strides[1], a.strides[0], data.ctypes.data, data.strides[0],
       packed.corr.ctypes.data, packed.corr.strides[0], out.ctypes.data, width * 4,
       m * width * 4, nb, m, nv, k // 4)
    return out if width == packed.n else out[:, :, :packed.n]


# ---- the kernel ----------------------------------------------------------------------------


def _kernel():
    fn = _state.get("fn")
    if fn is None:
        with _lock:
            if "fn" not in _state:
                _state["fn"] = _compile()
            fn = _state["fn"]
    return fn


def _compile():
    from celosia.compiler.cpu.codegen import _load_or_compile
    from celosia.compiler.cpu.host import llvm_binding, target_machine

    llvm = llvm_binding()
    obj, _, _ = _load_or_compile(_module_ir(llvm.llvm_version_info[0] >= 22), True)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine())
    engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    engine.finalize_object()
    _state["engine"] = engine  # the code lives as long as the engine
    address = engine.get_function_address("celosia_sim_igemm")
    return ctypes.CFUNCTYPE(None, *_ARGS)(address)


def _tile(rows: int, vectors: int, byte_args: bool) -> str:
    """``tile_R_V(a, lda, b, bvs, corr, c, ldc, k4)``: ``rows`` rows of C from ``c``
    (ldc bytes apart) x ``vectors`` vectors of 16 columns, summed over the K/4 = k4 steps
    from ``corr``; b points at the first vector's packed weights, vectors ``bvs`` bytes
    apart, 64 bytes a step."""
    acc = "<16 x i32>"
    arg = "<64 x i8>" if byte_args else acc
    L = []
    e = L.append
    e(f"define internal void @tile_{rows}_{vectors}(ptr noalias %a, i64 %lda, ptr noalias %b, "
      f"i64 %bvs, ptr noalias %corr, ptr noalias %c, i64 %ldc, i64 %k4) alwaysinline {{")
    e("entry:")
    for v in range(vectors):
        e(f"  %cp{v} = getelementptr i32, ptr %corr, i64 {v * 16}")
        e(f"  %cv{v} = load {acc}, ptr %cp{v}, align 4")
        e(f"  %bo{v} = mul i64 %bvs, {v}")
    for r in range(rows):
        e(f"  %ao{r} = mul i64 %lda, {r}")
    e("  br label %loop")
    e("loop:")
    e("  %k = phi i64 [0, %entry], [%k1, %loop]")
    for r in range(rows):
        for v in range(vectors):
            e(f"  %s{r}_{v} = phi {acc} [%cv{v}, %entry], [%n{r}_{v}, %loop]")
    e("  %kb = shl i64 %k, 6")
    e("  %ka = shl i64 %k, 2")
    for v in range(vectors):
        e(f"  %bx{v} = add i64 %bo{v}, %kb")
        e(f"  %bp{v} = getelementptr i8, ptr %b, i64 %bx{v}")
        e(f"  %bw{v} = load {arg}, ptr %bp{v}, align 1")
    for r in range(rows):
        e(f"  %ax{r} = add i64 %ao{r}, %ka")
        e(f"  %ap{r} = getelementptr i8, ptr %a, i64 %ax{r}")
        e(f"  %ai{r} = load i32, ptr %ap{r}, align 1")
        e(f"  %au{r} = xor i32 %ai{r}, -2139062144")  # 0x80808080: x + 128 per byte
        e(f"  %ae{r} = insertelement {acc} poison, i32 %au{r}, i64 0")
        e(f"  %as{r} = shufflevector {acc} %ae{r}, {acc} poison, <16 x i32> zeroinitializer")
        src = f"%as{r}"
        if byte_args:
            e(f"  %asb{r} = bitcast {acc} %as{r} to {arg}")
            src = f"%asb{r}"
        for v in range(vectors):
            e(f"  %n{r}_{v} = call {acc} @llvm.x86.avx512.vpdpbusd.512({acc} %s{r}_{v}, "
              f"{arg} {src}, {arg} %bw{v})")
    e("  %k1 = add i64 %k, 1")
    e("  %more = icmp ult i64 %k1, %k4")
    e("  br i1 %more, label %loop, label %exit")
    e("exit:")
    for r in range(rows):
        e(f"  %co{r} = mul i64 %ldc, {r}")
        for v in range(vectors):
            e(f"  %cx{r}_{v} = add i64 %co{r}, {v * 64}")
            e(f"  %cq{r}_{v} = getelementptr i8, ptr %c, i64 %cx{r}_{v}")
            e(f"  store {acc} %n{r}_{v}, ptr %cq{r}_{v}, align 4")
    e("  ret void")
    e("}")
    return "\n".join(L)


def _module_ir(byte_args: bool) -> str:
    """The module: the tiles and ``celosia_sim_igemm(a, lda, sa, b, sb, corr, scorr, c,
    ldc, sc, nb, m, nv, k4)`` (strides in bytes; ``sb`` and ``scorr`` per batch)."""
    acc = "<16 x i32>"
    arg = "<64 x i8>" if byte_args else acc
    parts = [f"declare {acc} @llvm.x86.avx512.vpdpbusd.512({acc}, {arg}, {arg})"]
    for v in range(1, _VECTORS + 1):
        parts.append(_tile(_ROWS, v, byte_args))
        parts.append(_tile(1, v, byte_args))
    L = []
    e = L.append
    e("define void @celosia_sim_igemm(ptr %a, i64 %lda, i64 %sa, ptr %b, i64 %sb, ptr %corr, "
      "i64 %scorr, ptr %c, i64 %ldc, i64 %sc, i64 %nb, i64 %m, i64 %nv, i64 %k4) {")
    e("entry:")
    e("  %bvs = shl i64 %k4, 6")  # bytes of one vector's packed weights
    e(f"  %mfull = sub i64 %m, {_ROWS - 1}")
    e("  br label %batch")
    # batch loop
    e("batch:")
    e("  %bi = phi i64 [0, %entry], [%bi1, %batch_next]")
    e("  %ab = mul i64 %bi, %sa")
    e("  %pa = getelementptr i8, ptr %a, i64 %ab")
    e("  %bb = mul i64 %bi, %sb")
    e("  %pb = getelementptr i8, ptr %b, i64 %bb")
    e("  %cb = mul i64 %bi, %scorr")
    e("  %pcorr = getelementptr i8, ptr %corr, i64 %cb")
    e("  %ob = mul i64 %bi, %sc")
    e("  %pc = getelementptr i8, ptr %c, i64 %ob")
    e("  br label %col")
    # column loop: vectors n0, n0 + 4, ...
    e("col:")
    e("  %n0 = phi i64 [0, %batch], [%n1, %col_next]")
    e("  %left = sub i64 %nv, %n0")
    e("  %nvb = mul i64 %n0, %bvs")
    e("  %pbn = getelementptr i8, ptr %pb, i64 %nvb")
    e("  %ncb = shl i64 %n0, 6")  # 16 int32 columns a vector
    e("  %pcn = getelementptr i8, ptr %pcorr, i64 %ncb")
    e("  %pco = getelementptr i8, ptr %pc, i64 %ncb")
    e(f"  switch i64 %left, label %v{_VECTORS}_head [" + " ".join(
        f"i64 {v}, label %v{v}_head" for v in range(1, _VECTORS)) + "]")
    for v in range(1, _VECTORS + 1):
        # rows in blocks of _ROWS, then one at a time
        e(f"v{v}_head:")
        e(f"  br label %v{v}_rows")
        e(f"v{v}_rows:")
        e(f"  %v{v}_m = phi i64 [0, %v{v}_head], [%v{v}_m1, %v{v}_body]")
        e(f"  %v{v}_ok = icmp slt i64 %v{v}_m, %mfull")
        e(f"  br i1 %v{v}_ok, label %v{v}_body, label %v{v}_tail")
        e(f"v{v}_body:")
        e(f"  %v{v}_ao = mul i64 %v{v}_m, %lda")
        e(f"  %v{v}_pa = getelementptr i8, ptr %pa, i64 %v{v}_ao")
        e(f"  %v{v}_co = mul i64 %v{v}_m, %ldc")
        e(f"  %v{v}_pc = getelementptr i8, ptr %pco, i64 %v{v}_co")
        e(f"  call void @tile_{_ROWS}_{v}(ptr %v{v}_pa, i64 %lda, ptr %pbn, i64 %bvs, "
          f"ptr %pcn, ptr %v{v}_pc, i64 %ldc, i64 %k4)")
        e(f"  %v{v}_m1 = add i64 %v{v}_m, {_ROWS}")
        e(f"  br label %v{v}_rows")
        e(f"v{v}_tail:")
        e(f"  %v{v}_t = phi i64 [%v{v}_m, %v{v}_rows], [%v{v}_t1, %v{v}_tbody]")
        e(f"  %v{v}_tok = icmp slt i64 %v{v}_t, %m")
        e(f"  br i1 %v{v}_tok, label %v{v}_tbody, label %col_next")
        e(f"v{v}_tbody:")
        e(f"  %v{v}_tao = mul i64 %v{v}_t, %lda")
        e(f"  %v{v}_tpa = getelementptr i8, ptr %pa, i64 %v{v}_tao")
        e(f"  %v{v}_tco = mul i64 %v{v}_t, %ldc")
        e(f"  %v{v}_tpc = getelementptr i8, ptr %pco, i64 %v{v}_tco")
        e(f"  call void @tile_1_{v}(ptr %v{v}_tpa, i64 %lda, ptr %pbn, i64 %bvs, "
          f"ptr %pcn, ptr %v{v}_tpc, i64 %ldc, i64 %k4)")
        e(f"  %v{v}_t1 = add i64 %v{v}_t, 1")
        e(f"  br label %v{v}_tail")
    e("col_next:")
    e(f"  %n1 = add i64 %n0, {_VECTORS}")
    e("  %cmore = icmp slt i64 %n1, %nv")
    e("  br i1 %cmore, label %col, label %batch_next")
    e("batch_next:")
    e("  %bi1 = add i64 %bi, 1")
    e("  %bmore = icmp slt i64 %bi1, %nb")
    e("  br i1 %bmore, label %batch, label %done")
    e("done:")
    e("  ret void")
    e("}")
    parts.append("\n".join(L))
    return "\n\n".join(parts) + "\n"
