"""QMatMul (a product of two run-time int8 values, attention's Q x K^T and P x V) on the
accelerator's GEMM core.

``QMatMul(a int8[..., M, K], b int8[..., K, N])`` (compiler/graph/qops.py) is, for each
index of the broadcast leading axes (batch x heads), one [M, K] x [K, N] product: the
dense operator of compiler/accel/ops.py with ``a`` as its data and ``b^T`` as its weight.
Both operands exist only at run time, so the weight is packed at run time: the runtime
packs ``b`` into the weight layout (``pack_weights``) before the node's program runs
(runtime/accel.py counts that as layout time), reading it back from DRAM first when the
accelerator made it.

The epilogue reproduces qmatmul bit for bit: ``(acc * multiplier + 2**(shift-1)) >> shift``
clipped to int8 is the dense epilogue with the multiplier as a per-channel scale tensor
and the rounding term as a bias added after it (``Epilogue.bias_last``); both are
constants packed at build time, and the ALU wraps at 32 bits as qmatmul does.

One program per node: the compiled dense function is bound once per matrix (G of them)
into one instruction stream, each binding to its matrices' slices of the operand buffers.

Layouts (BATCH = b, BLOCK = k; M, K, N padded to multiples of b, k, k):
    a, 2-D          the dense data layout (M/b, K/k, b, k), shared with QGemm
    a, >= 3-D       "matrices": (GA, S), matrix g's dense data layout in row g, S its bytes
                    rounded up to the DRAM alignment of the dense data argument
    output          as ``a`` (its own leading shape, rows M, columns N)
    b (weights)     (GB, S): matrix g's b^T in the dense weight layout (N/k, K/k, k, k)
"""

from __future__ import annotations

import math

import numpy as np

from celosia.config import HwConfig

from ..graph.ir import Graph, Node
from .ops import DenseSpec, Epilogue, pack_bias, pad_channels

__all__ = ["matmul_problem", "matmul_epilogue", "MatMulShape", "matmul_shape", "value_layout",
           "matrices_shape", "pack_matrices", "unpack_matrices", "weights_shape",
           "pack_weights", "matmul_constants"]


def _ceil(n: int, k: int) -> int:
    return -(-n // k) * k


def _align(elem_bytes: int) -> int:
    # compiler/accel/build.py: an argument lies at a multiple of max(64, its element's bytes)
    return max(64, elem_bytes)


class MatMulShape:
    """The geometry of one QMatMul node: leading shapes of a, b and the output, and the
    per-matrix dense spec sizes (padded)."""

    def __init__(self, a_shape, b_shape, cfg: HwConfig):
        k = cfg.block
        self.a_lead, self.b_lead = tuple(a_shape[:-2]), tuple(b_shape[:-2])
        self.lead = tuple(np.broadcast_shapes(self.a_lead, self.b_lead))
        self.m, self.k, self.n = int(a_shape[-2]), int(a_shape[-1]), int(b_shape[-1])
        self.kp, self.np_ = _ceil(self.k, k), _ceil(self.n, k)
        self.count = math.prod(self.lead)  # matrices computed

    def indices(self) -> tuple[np.ndarray, np.ndarray]:
        """For each output matrix g (C order over ``lead``): the index of its a and b
        matrices in their own (C order) leading shapes (broadcasting)."""
        def idx(lead):
            full = np.arange(math.prod(lead), dtype=np.int64).reshape(lead)
            pad = (1,) * (len(self.lead) - len(lead))
            return np.broadcast_to(full.reshape(pad + tuple(lead)), self.lead).reshape(-1)
        return idx(self.a_lead), idx(self.b_lead)

    def spec(self, epilogue: Epilogue) -> DenseSpec:
        return DenseSpec(n=self.m, k=self.kp, o=self.np_, epilogue=epilogue)


def matmul_shape(node: Node, graph: Graph, cfg: HwConfig) -> MatMulShape:
    return MatMulShape(graph.types[node.inputs[0]].shape, graph.types[node.inputs[1]].shape, cfg)


def matmul_problem(node: Node, graph: Graph, cfg: HwConfig) -> str | None:
    """Why a QMatMul cannot run on the accelerator, or None."""
    unknown = [v for v in node.inputs + node.outputs if v and not graph.types[v].static]
    if unknown:
        return f"the size of {unknown[0]!r} ({graph.types[unknown[0]]}) is only known at run time"
    if len(node.inputs) != 2:
        return f"QMatMul with {len(node.inputs)} inputs (the accelerator takes a and b)"
    a_t = graph.types[node.inputs[0]]
    if a_t.shape[-2] % cfg.batch:
        return (f"QMatMul rows M={a_t.shape[-2]} of {node.inputs[0]!r} are not a multiple of "
                f"BATCH={cfg.batch}")
    shift = int(node.attrs["shift"])
    if not 1 <= shift <= 31:
        return f"QMatMul shift {shift} is outside [1, 31]"
    return None


def matmul_epilogue(node: Node) -> Epilogue:
    """qmatmul's requantization on the ALU: * multiplier (scale tensor), + 2**(shift-1)
    (bias tensor, added after the multiply), >> shift, clip to [-128, 127]."""
    return Epilogue(bias=True, scale=True, bias_last=True, shift=int(node.attrs["shift"]),
                    lo=-128, hi=127)


def matmul_constants(node: Node, shape: MatMulShape, cfg: HwConfig):
    """(bias, scale) packed: the rounding term and the multiplier on every output channel."""
    shift, mult = int(node.attrs["shift"]), int(node.attrs["multiplier"])
    b = cfg.batch
    bias = pack_bias(np.full(shape.np_, 1 << (shift - 1), np.int32), b, cfg.block)
    scale = pack_bias(np.full(shape.np_, mult, np.int64).astype(np.int32), b, cfg.block)
    return bias, scale


# ---- layouts ---------------------------------------------------------------------------------


def value_layout(shape: tuple[int, ...]) -> str:
    """The layout a QMatMul reads its ``a`` operand or writes its output in."""
    return "rows" if len(shape) == 2 else "matrices"


def _matrix_bytes(rows: int, cols: int, cfg: HwConfig) -> tuple[int, int]:
    """(packed bytes of one [rows, cols] matrix in the dense data layout, its row stride)."""
    b, k = cfg.batch, cfg.block
    raw = _ceil(rows, b) * _ceil(cols, k)
    return raw, _ceil(raw, _align(b * k))


def matrices_shape(shape: tuple[int, ...], cfg: HwConfig) -> tuple[int, int]:
    """The packed shape of a [..., rows, cols] value in the "matrices" layout."""
    return (math.prod(shape[:-2]), _matrix_bytes(shape[-2], shape[-1], cfg)[1])


def pack_matrices(x: np.ndarray, cfg: HwConfig, out: np.ndarray | None = None) -> np.ndarray:
    """[..., rows, cols] int8 -> (G, S): each matrix in the dense data layout, padded;
    ``out``: int8 memory of that shape to write it into (a view of DRAM), else fresh."""
    b, k = cfg.batch, cfg.block
    rows, cols = x.shape[-2:]
    raw, stride = _matrix_bytes(rows, cols, cfg)
    m = pad_channels(x.reshape(-1, rows, cols), 2, k)
    g, _, cp = m.shape
    packed = m.reshape(g, rows // b, b, cp // k, k).transpose(0, 1, 3, 2, 4)
    if out is None:
        if stride == raw:
            return np.ascontiguousarray(packed).reshape(g, raw)
        out = np.zeros((g, stride), x.dtype)
    elif stride != raw:
        out[:, raw:] = 0
    out[:, :raw].reshape(packed.shape)[...] = packed
    return out


def unpack_matrices(p: np.ndarray, shape: tuple[int, ...], cfg: HwConfig) -> np.ndarray:
    """The "matrices" layout -> the [..., rows, cols] value of ``shape``."""
    b, k = cfg.batch, cfg.block
    rows, cols = shape[-2:]
    raw, _ = _matrix_bytes(rows, cols, cfg)
    cp = _ceil(cols, k)
    m = p[:, :raw].reshape(-1, rows // b, cp // k, b, k).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(m.reshape(*shape[:-2], rows, cp)[..., :cols])


def _weight_bytes(kdim: int, ndim: int, cfg: HwConfig) -> tuple[int, int]:
    k = cfg.block
    raw = _ceil(kdim, k) * _ceil(ndim, k)
    return raw, _ceil(raw, _align(k * k))


def weights_shape(b_shape: tuple[int, ...], cfg: HwConfig) -> tuple[int, int]:
    """The packed shape of QMatMul's ``b`` [..., K, N] in the weight layout: (GB, S)."""
    return (math.prod(b_shape[:-2]), _weight_bytes(b_shape[-2], b_shape[-1], cfg)[1])


def pack_weights(x: np.ndarray, cfg: HwConfig, out: np.ndarray | None = None) -> np.ndarray:
    """b [..., K, N] int8 -> (GB, S): each matrix's b^T in the dense weight layout
    (N/k, K/k, k, k), K and N zero-padded to BLOCK; ``out``: int8 memory of that shape to
    write it into (a view of DRAM), else fresh."""
    k = cfg.block
    kdim, ndim = x.shape[-2:]
    raw, stride = _weight_bytes(kdim, ndim, cfg)
    m = pad_channels(pad_channels(x.reshape(-1, kdim, ndim), 1, k), 2, k)
    g, kp, np_ = m.shape
    # weight[g, j, ko, oo, ki] = b[g, ko*k + ki, j*k + oo]
    packed = m.reshape(g, kp // k, k, np_ // k, k).transpose(0, 3, 1, 4, 2)
    if out is None:
        out = np.zeros((g, stride), np.int8)
    elif stride != raw:
        out[:, raw:] = 0
    out[:, :raw].reshape(packed.shape)[...] = packed
    return out


# ---- binding ---------------------------------------------------------------------------------


def _slice(buf, offset: int, nbytes: int):
    """A view of ``nbytes`` of a DRAM buffer from ``offset`` (for binding one matrix); it
    is never freed on its own (the buffer it views is)."""
    from celosia.driver.alloc import DramBuffer

    if offset + nbytes > buf.nbytes:
        raise ValueError(f"bytes [{offset}, {offset + nbytes}) are outside {buf!r}")
    return DramBuffer(buf.addr + offset, nbytes, buf._allocator, buf._executor, buf._config)


def bind_matmul(fn, dev, shape: MatMulShape, a_buf, a_packed, w_buf, w_packed, bias_buf,
                scale_buf, out_buf, out_packed) -> list:
    """Emit one QMatMul's program into ``dev``'s stream: the dense function ``fn`` of one
    matrix once per output matrix, on its slices of the a, weight and output buffers
    (``*_packed``: their packed shapes; a 2-D value holds one matrix). Returns the scratch
    buffers (``AcceleratorFunction.bind_many``)."""
    specs = fn.arg_specs()
    sizes = [math.prod(s) * np.dtype(d).itemsize for _, d, s, _ in specs]

    def stride(packed):  # bytes from one matrix to the next ("matrices": one row each)
        return packed[1] if len(packed) == 2 else 0

    ia, ib = shape.indices()
    calls = [[_slice(a_buf, int(ia[g]) * stride(a_packed), sizes[0]),
              _slice(w_buf, int(ib[g]) * stride(w_packed), sizes[1]), bias_buf, scale_buf,
              _slice(out_buf, g * stride(out_packed), sizes[-1])] for g in range(shape.count)]
    return fn.bind_many(dev, calls)
