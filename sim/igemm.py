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
        """``words``: uint32 (nb, N1, K1, N2, K2), C-contiguous: column n1 * N2 + n2 of B,
        its bytes 4 * (k1 * K2 + k2) ... + 3."""
        nb, n1, k1, n2, k2 = words.shape
        n, k4 = n1 * n2, k1 * k2
        nv = -(-n // _LANES)
        data = np.zeros((nb, nv, k4, _LANES), np.uint32)
        self.corr = np.zeros((nb, nv * _LANES), np.int32)
        _kernel()  # compiled with the pack function
        _state["pack"](words.ctypes.data, nb, n1, k1, n2, k2, nv, data.ctypes.data,
                       self.corr.ctypes.data)
        self.data = data.view(np.int8).reshape(nb, nv, k4, _LANES, 4)
        self.n, self.k = n, 4 * k4


def pack(wt: np.ndarray) -> Packed:
    """The weights of ``A @ B`` packed for ``matmul``, given as ``wt`` = B transposed: int8
    (nb, N, K) (K a multiple of 4), any strides; or as 4-byte words, uint32 (nb, N1, K1,
    N2, K2) C-contiguous, column n1 * N2 + n2 and step k1 * K2 + k2 (the datapath's weight
    blocks: (group, micro-op, out lane, in lanes / 4), no copy)."""
    if wt.dtype == np.int8:
        if wt.ndim != 3 or wt.shape[2] % 4:
            raise ValueError(f"igemm: weights {wt.shape}: K is not a multiple of 4")
        nb, n, k = wt.shape
        wt = np.ascontiguousarray(wt).view(np.uint32).reshape(nb, 1, 1, n, k // 4)
    elif wt.dtype != np.uint32 or wt.ndim != 5:
        raise ValueError(f"igemm: weights must be int8 (nb, N, K) or uint32 words (nb, N1, "
                         f"K1, N2, K2), not {wt.dtype}{wt.shape}")
    return Packed(np.ascontiguousarray(wt))


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
    _state["pack"] = ctypes.CFUNCTYPE(None, ctypes.c_void_p, *[ctypes.c_int64] * 6,
                                      ctypes.c_void_p, ctypes.c_void_p)(
        engine.get_function_address("celosia_sim_igemm_pack"))
    return ctypes.CFUNCTYPE(None, *_ARGS)(engine.get_function_address("celosia_sim_igemm"))


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
    parts.append(_pack_ir())
    return "\n\n".join(parts) + "\n"


def _pack_ir() -> str:
    """``celosia_sim_igemm_pack(src, nb, n1, k1, n2, k2, nv, dst, corr)``: weights given
    as 4-byte words ``src`` (nb, N1, K1, N2, K2), C-contiguous, column n = n1 * N2 + n2
    of B, step k = k1 * K2 + k2 (K/4 steps), into ``dst`` (nb, NV, K/4, 16) words (zeroed
    by the caller: columns past N stay zero) and each column's ``-128 * sum(w)`` into
    ``corr`` (nb, NV x 16) (zeroed by the caller), modulo 2^32. Scalar loops: a layer's
    weights are packed once per run."""
    L = []
    e = L.append
    loops = ["b", "i1", "i2", "j1", "j2"]  # batch, n1, n2, k1, k2
    e("define void @celosia_sim_igemm_pack(ptr noalias %src, i64 %nb, i64 %n1, i64 %k1, "
      "i64 %n2, i64 %k2, i64 %nv, ptr noalias %dst, ptr noalias %corr) {")
    e("entry:")
    for v in loops + ["s"]:
        e(f"  %{v}.p = alloca i64")
    e("  %sum.p = alloca i32")
    e("  %k4 = mul i64 %k1, %k2")
    e("  %rowk = mul i64 %k4, %n2")       # words of one n1 block: K1 x N2 x K2
    e("  %perb = mul i64 %rowk, %n1")     # words of one batch
    e("  %cols = shl i64 %nv, 4")
    e("  %dperb = mul i64 %cols, %k4")    # packed words of one batch
    e("  store i64 0, ptr %b.p")
    e("  br label %b.head")
    extents = {"b": "%nb", "i1": "%n1", "i2": "%n2", "j1": "%k1", "j2": "%k2"}
    after = {"b": "done", "i1": "b.next", "i2": "i1.next", "j1": "col.end", "j2": "j1.next"}
    # loop heads
    for v in loops:
        e(f"{v}.head:")
        e(f"  %{v}.v = load i64, ptr %{v}.p")
        e(f"  %{v}.ok = icmp slt i64 %{v}.v, {extents[v]}")
        e(f"  br i1 %{v}.ok, label %{v}.body, label %{after[v]}")
        e(f"{v}.next:")
        e(f"  %{v}.w = load i64, ptr %{v}.p")
        e(f"  %{v}.w1 = add i64 %{v}.w, 1")
        e(f"  store i64 %{v}.w1, ptr %{v}.p")
        e(f"  br label %{v}.head")
    e("b.body:")
    e("  store i64 0, ptr %i1.p")
    e("  br label %i1.head")
    e("i1.body:")
    e("  store i64 0, ptr %i2.p")
    e("  br label %i2.head")
    e("i2.body:")  # one column: n = i1 * N2 + i2
    e("  %cb = load i64, ptr %b.p")
    e("  %c1 = load i64, ptr %i1.p")
    e("  %c2 = load i64, ptr %i2.p")
    e("  %cn0 = mul i64 %c1, %n2")
    e("  %n = add i64 %cn0, %c2")
    e("  %sb0 = mul i64 %cb, %perb")
    e("  %sn0 = mul i64 %c1, %rowk")
    e("  %sn1 = mul i64 %c2, %k2")
    e("  %sa = add i64 %sb0, %sn0")
    e("  %colsrc = add i64 %sa, %sn1")       # word of (b, n, k = 0)
    e("  %db0 = mul i64 %cb, %dperb")
    e("  %nvec = lshr i64 %n, 4")
    e("  %nlane = and i64 %n, 15")
    e("  %dv = mul i64 %nvec, %k4")
    e("  %dv16 = shl i64 %dv, 4")
    e("  %dd = add i64 %db0, %dv16")
    e("  %coldst = add i64 %dd, %nlane")      # word of (b, vector, k4 = 0, lane)
    e("  store i32 0, ptr %sum.p")
    e("  store i64 0, ptr %j1.p")
    e("  br label %j1.head")
    e("j1.body:")
    e("  store i64 0, ptr %j2.p")
    e("  br label %j2.head")
    e("j2.body:")
    e("  %q1 = load i64, ptr %j1.p")
    e("  %q2 = load i64, ptr %j2.p")
    e("  %qs0 = mul i64 %q1, %n2")
    e("  %qs1 = mul i64 %qs0, %k2")           # k1 * N2 * K2
    e("  %qs2 = add i64 %qs1, %q2")
    e("  %si = add i64 %colsrc, %qs2")
    e("  %sp = getelementptr i32, ptr %src, i64 %si")
    e("  %w = load i32, ptr %sp, align 4")
    e("  %qk0 = mul i64 %q1, %k2")
    e("  %qk = add i64 %qk0, %q2")            # k4
    e("  %qd0 = shl i64 %qk, 4")
    e("  %di = add i64 %coldst, %qd0")
    e("  %dp = getelementptr i32, ptr %dst, i64 %di")
    e("  store i32 %w, ptr %dp, align 4")
    for byte in range(4):  # the four signed bytes' sum
        e(f"  %w{byte}s = shl i32 %w, {24 - 8 * byte}")
        e(f"  %w{byte} = ashr i32 %w{byte}s, 24")
    e("  %w01 = add i32 %w0, %w1")
    e("  %w23 = add i32 %w2, %w3")
    e("  %wsum = add i32 %w01, %w23")
    e("  %old = load i32, ptr %sum.p")
    e("  %new = add i32 %old, %wsum")
    e("  store i32 %new, ptr %sum.p")
    e("  br label %j2.next")
    e("col.end:")
    e("  %tot = load i32, ptr %sum.p")
    e("  %neg = mul i32 %tot, -128")
    e("  %ci0 = mul i64 %cb, %cols")
    e("  %ci = add i64 %ci0, %n")
    e("  %cp = getelementptr i32, ptr %corr, i64 %ci")
    e("  store i32 %neg, ptr %cp, align 4")
    e("  br label %i2.next")
    e("done:")
    e("  ret void")
    e("}")
    return "\n".join(L)
