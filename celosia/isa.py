"""The instruction set (shared ISA.md): records, encoding to bytes, decoding, disassembly.

Instructions are frozen dataclasses; opcodes, memory types and ALU operations are enums.
Field positions come from :class:`InsnLayout`, derived from an :class:`HwConfig`, so one
codec serves every valid configuration.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, fields, replace
from typing import Iterable, Union

import numpy as np

from .config import (
    ALU_IMM_BITS,
    ALU_OPCODE_BITS,
    LOOP_ITER_BITS,
    MEM_DRAM_BITS,
    MEM_PAD_BITS,
    MEM_SIZE_BITS,
    MEM_SRAM_BITS,
    HwConfig,
)
from .errors import CelosiaError, ProgramError

__all__ = [
    "Opcode", "MemType", "AluOp", "Module", "insn_layout", "elem_bytes", "buffer_depth",
    "MemInsn", "GemmInsn", "AluInsn", "FinishInsn", "Insn", "Uop",
    "InsnLayout", "EncodeError", "DecodeError",
    "encode", "decode", "decoder", "encode_program", "decode_program", "disassemble", "module_of",
    "encode_uops", "decode_uops", "INSN_BYTES",
]

INSN_BYTES = 16


class Opcode(enum.IntEnum):
    LOAD = 0  # DRAM -> on-chip buffer, with zero padding
    STORE = 1  # OUT buffer -> DRAM
    GEMM = 2  # micro-coded matrix multiply-accumulate into ACC
    FINISH = 3  # end of program (compute module)
    ALU = 4  # micro-coded element-wise operation on ACC


class MemType(enum.IntEnum):
    UOP = 0  # micro-op buffer (compute)
    WGT = 1  # weight buffer (load)
    INP = 2  # input buffer (load)
    ACC = 3  # accumulator buffer, int32 from DRAM (compute)
    OUT = 4  # output buffer, int8 (store; never loaded)
    ACC_8BIT = 5  # accumulator buffer, int8 from DRAM sign-extended (compute)


class AluOp(enum.IntEnum):
    MIN = 0  # min(x, y)
    MAX = 1  # max(x, y)
    ADD = 2  # x + y, 32-bit wrap
    SHR = 3  # arithmetic shift right by y; left by -y when y < 0
    MUL = 4  # low 32 bits of x * y


class Module(enum.IntEnum):
    """The three instruction-executing modules, in pipeline order (prev -> next)."""

    LOAD = 0
    COMPUTE = 1
    STORE = 2


class EncodeError(CelosiaError, ValueError):
    """A field value does not fit its width in this configuration."""


class DecodeError(ProgramError):
    """Bytes that are not a valid instruction (bad opcode or memory type)."""


@dataclass(frozen=True, kw_only=True)
class _InsnBase:
    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False

    @property
    def deps(self) -> tuple[bool, bool, bool, bool]:
        return (self.pop_prev, self.pop_next, self.push_prev, self.push_next)

    def with_deps(self, **flags: bool):
        return replace(self, **flags)


@dataclass(frozen=True, kw_only=True)
class MemInsn(_InsnBase):
    """LOAD or STORE of a 2D block of elements, with zero padding on LOAD."""

    opcode: Opcode
    mem_type: MemType
    sram_base: int = 0
    dram_base: int = 0
    y_size: int = 0
    x_size: int = 0
    x_stride: int = 0
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0

    def __post_init__(self):
        if self.opcode not in (Opcode.LOAD, Opcode.STORE):
            raise ValueError(f"MemInsn opcode must be LOAD or STORE, not {self.opcode!r}")
        object.__setattr__(self, "opcode", Opcode(self.opcode))
        object.__setattr__(self, "mem_type", MemType(self.mem_type))


@dataclass(frozen=True, kw_only=True)
class _LoopInsn(_InsnBase):
    uop_bgn: int = 0
    uop_end: int = 0
    iter_out: int = 1
    iter_in: int = 1
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0


@dataclass(frozen=True, kw_only=True)
class GemmInsn(_LoopInsn):
    """ACC[dst] += INP[src] x WGT[wgt]^T over two loops and a micro-op range."""

    reset: bool = False
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0
    opcode = Opcode.GEMM


@dataclass(frozen=True, kw_only=True)
class AluInsn(_LoopInsn):
    """ACC[dst] = op(ACC[dst], ACC[src] or imm) over two loops and a micro-op range."""

    alu_op: AluOp = AluOp.ADD
    use_imm: bool = False
    imm: int = 0
    reset: bool = False  # encoded in bit 7 like GEMM's; ignored by executors (ISA.md)
    opcode = Opcode.ALU

    def __post_init__(self):
        object.__setattr__(self, "alu_op", AluOp(self.alu_op))


@dataclass(frozen=True, kw_only=True)
class FinishInsn(_InsnBase):
    opcode = Opcode.FINISH


Insn = Union[MemInsn, GemmInsn, AluInsn, FinishInsn]


@dataclass(frozen=True)
class Uop:
    """One micro-op: ACC row, source row (INP for GEMM, ACC for ALU), WGT row."""

    dst: int
    src: int
    wgt: int = 0


def module_of(insn: Insn) -> Module:
    """Which module executes an instruction (ISA.md section 3)."""
    if isinstance(insn, MemInsn):
        if insn.opcode == Opcode.STORE:
            return Module.STORE
        if insn.mem_type in (MemType.INP, MemType.WGT):
            return Module.LOAD
    return Module.COMPUTE


# ---- bit layout ---------------------------------------------------------------------------


@dataclass(frozen=True)
class InsnLayout:
    """(bit offset, width) of every field for one configuration; offsets count from bit 0
    of the 128-bit instruction."""

    mem: dict
    gemm: dict
    alu: dict
    uop: dict

    @classmethod
    def for_config(cls, cfg: HwConfig) -> "InsnLayout":
        def pack(start: int, spec: list[tuple[str, int]]) -> dict:
            out, pos = {}, start
            for name, width in spec:
                out[name] = (pos, width)
                pos += width
            return out

        common = [("opcode", 3), ("pop_prev", 1), ("pop_next", 1), ("push_prev", 1), ("push_next", 1)]
        mem = pack(0, common + [("mem_type", 3), ("sram_base", MEM_SRAM_BITS), ("dram_base", MEM_DRAM_BITS)])
        mem |= pack(64, [
            ("y_size", MEM_SIZE_BITS), ("x_size", MEM_SIZE_BITS), ("x_stride", MEM_SIZE_BITS),
            ("y_pad_0", MEM_PAD_BITS), ("y_pad_1", MEM_PAD_BITS),
            ("x_pad_0", MEM_PAD_BITS), ("x_pad_1", MEM_PAD_BITS),
        ])
        loop = common + [
            ("reset", 1), ("uop_bgn", cfg.log_uop_depth), ("uop_end", cfg.log_uop_depth + 1),
            ("iter_out", LOOP_ITER_BITS), ("iter_in", LOOP_ITER_BITS),
        ]
        a, i, w = cfg.log_acc_depth, cfg.log_inp_depth, cfg.log_wgt_depth
        gemm = pack(0, loop) | pack(64, [
            ("dst_factor_out", a), ("dst_factor_in", a), ("src_factor_out", i), ("src_factor_in", i),
            ("wgt_factor_out", w), ("wgt_factor_in", w),
        ])
        alu = pack(0, loop) | pack(64, [
            ("dst_factor_out", a), ("dst_factor_in", a), ("src_factor_out", a), ("src_factor_in", a),
            ("alu_op", ALU_OPCODE_BITS), ("use_imm", 1), ("imm", ALU_IMM_BITS),
        ])
        uop = pack(0, [("dst", cfg.uop_dst_bits), ("src", cfg.uop_src_bits), ("wgt", cfg.uop_wgt_bits)])
        return cls(mem=mem, gemm=gemm, alu=alu, uop=uop)

    def fields_of(self, opcode: Opcode) -> dict:
        if opcode in (Opcode.LOAD, Opcode.STORE):
            return self.mem
        if opcode == Opcode.ALU:
            return self.alu
        return self.gemm


@functools.cache
def insn_layout(cfg: HwConfig) -> InsnLayout:
    """The bit layout of every instruction field for this configuration."""
    return InsnLayout.for_config(cfg)


def elem_bytes(cfg: HwConfig, mem_type) -> int:
    """Bytes of one element of a LOAD/STORE memory type (dram_base counts these)."""
    return {
        MemType.UOP: 4,
        MemType.WGT: cfg.wgt_elem_bytes,
        MemType.INP: cfg.inp_elem_bytes,
        MemType.ACC: cfg.acc_elem_bytes,
        MemType.OUT: cfg.out_elem_bytes,
        MemType.ACC_8BIT: cfg.out_elem_bytes,
    }[MemType(mem_type)]


def buffer_depth(cfg: HwConfig, mem_type) -> int:
    """Elements in the on-chip buffer a memory type addresses."""
    return {
        MemType.UOP: cfg.uop_depth,
        MemType.WGT: cfg.wgt_depth,
        MemType.INP: cfg.inp_depth,
        MemType.ACC: cfg.acc_depth,
        MemType.OUT: cfg.acc_depth,
        MemType.ACC_8BIT: cfg.acc_depth,
    }[MemType(mem_type)]


# ---- encoding -----------------------------------------------------------------------------


def _field_values(insn: Insn) -> dict:
    values = {f.name: getattr(insn, f.name) for f in fields(insn)}
    values["opcode"] = insn.opcode
    return values


def encode(insn: Insn, cfg: HwConfig) -> int:
    """The instruction as a 128-bit integer (bit 0 = LSB of the first little-endian word)."""
    if isinstance(insn, FinishInsn):
        spec = {k: v for k, v in insn_layout(cfg).gemm.items() if k in
                ("opcode", "pop_prev", "pop_next", "push_prev", "push_next")}
    else:
        spec = insn_layout(cfg).fields_of(insn.opcode)
    word = 0
    for name, value in _field_values(insn).items():
        if name not in spec:
            continue
        pos, width = spec[name]
        value = int(value)
        if name == "imm":
            lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
            if not lo <= value <= hi:
                raise EncodeError(f"imm={value} does not fit a signed {width}-bit field [{lo}, {hi}]")
            value &= (1 << width) - 1
        elif not 0 <= value < (1 << width):
            raise EncodeError(
                f"{type(insn).__name__}.{name}={value} does not fit its {width}-bit field "
                f"(0..{(1 << width) - 1}) in this configuration"
            )
        word |= value << pos
    return word


def _get(word: int, spec: dict, name: str) -> int:
    pos, width = spec[name]
    return (word >> pos) & ((1 << width) - 1)


_DEPS = ("pop_prev", "pop_next", "push_prev", "push_next")
_OPCODES = tuple(Opcode)
_MEM_TYPES = tuple(MemType)
_ALU_OPS = tuple(AluOp)


@functools.cache
def _decoders(cfg: HwConfig) -> tuple:
    """Per instruction kind (LOAD/STORE, GEMM, ALU), a function of the 128-bit word giving
    the dict of every field of its record, generated from the configuration's layout (one
    expression per field: a program is decoded on its first run, and a loop over the
    layout costs twice as much); and the (shift, mask) of mem_type and alu_op, which
    ``decode`` checks first."""
    lay = insn_layout(cfg)

    def source(name, spec, special):
        items = [f"'{d}': bool(word >> {3 + k} & 1)" for k, d in enumerate(_DEPS)]
        for field, (pos, width) in spec.items():
            if field == "opcode" or field in _DEPS:
                continue
            value = f"word >> {pos} & {(1 << width) - 1}"
            items.append(f"'{field}': {special.get(field, '{}').format(value)}")
        return f"def {name}(word):\n    return {{{', '.join(items)}}}\n"

    half = 1 << (ALU_IMM_BITS - 1)
    code = (source("mem", lay.mem, {"mem_type": "MEM_TYPES[{}]"})
            + source("gemm", lay.gemm, {"reset": "bool({})"})
            + source("alu", lay.alu, {"reset": "bool({})", "use_imm": "bool({})",
                                      "alu_op": "ALU_OPS[{}]",
                                      "imm": f"(({{}}) ^ {half}) - {half}"}))  # signed
    namespace = {"MEM_TYPES": _MEM_TYPES, "ALU_OPS": _ALU_OPS}
    exec(compile(code, f"<celosia.isa decoders for {cfg}>", "exec"), namespace)
    mt_at, mt_w = lay.mem["mem_type"]
    op_at, op_w = lay.alu["alu_op"]
    return (namespace["mem"], namespace["gemm"], namespace["alu"],
            (mt_at, (1 << mt_w) - 1), (op_at, (1 << op_w) - 1))


def _record(cls, values: dict):
    """An instruction record of ``values`` (every field, already checked and typed): the
    frozen dataclass without its __init__, which costs several times the decoding itself
    (a program is decoded on its first run; ``decode`` builds the same records as the
    constructors would, so they compare and hash equal)."""
    insn = object.__new__(cls)
    insn.__dict__.update(values)
    return insn


def decode(word: int, cfg: HwConfig, index: int | None = None) -> Insn:
    """The instruction a 128-bit integer holds; DecodeError for a bad opcode or memory type."""
    return decoder(cfg)(word, index)


@functools.cache
def decoder(cfg: HwConfig):
    """``decode`` for one configuration: a function (word, index=None) -> Insn (to decode
    many words, look it up once: the configuration's hash costs as much as a decode)."""
    mem, gemm, alu, (mt_at, mt_mask), (op_at, op_mask) = _decoders(cfg)

    def decode_word(word: int, index: int | None = None) -> Insn:
        opcode = word & 0b111
        if opcode <= Opcode.STORE:
            mt = (word >> mt_at) & mt_mask
            if mt > MemType.ACC_8BIT:
                raise DecodeError(index, f"memory type {mt} is not defined (valid: 0-5)")
            values = mem(word)
            values["opcode"] = _OPCODES[opcode]
            return _record(MemInsn, values)
        if opcode == Opcode.GEMM:
            return _record(GemmInsn, gemm(word))
        if opcode == Opcode.ALU:
            op = (word >> op_at) & op_mask
            if op > AluOp.MUL:
                raise DecodeError(index, f"ALU opcode {op} is not defined (valid: 0-4)")
            return _record(AluInsn, alu(word))
        if opcode == Opcode.FINISH:
            return _record(FinishInsn, {d: bool(word >> 3 + k & 1) for k, d in enumerate(_DEPS)})
        raise DecodeError(index, f"opcode {opcode} is not defined (valid: 0-4)")
    return decode_word


def encode_program(insns: Iterable[Insn], cfg: HwConfig) -> np.ndarray:
    """Instructions as bytes: a uint8 array of 16 bytes per instruction."""
    words = [encode(insn, cfg) for insn in insns]
    out = bytearray()
    for word in words:
        out += word.to_bytes(INSN_BYTES, "little")
    return np.frombuffer(bytes(out), dtype=np.uint8).copy()


def decode_program(data: bytes | np.ndarray, cfg: HwConfig) -> list[Insn]:
    raw = bytes(np.asarray(data, dtype=np.uint8).reshape(-1))
    if len(raw) % INSN_BYTES:
        raise DecodeError(None, f"program of {len(raw)} bytes is not a whole number of "
                                f"{INSN_BYTES}-byte instructions")
    return [
        decode(int.from_bytes(raw[i:i + INSN_BYTES], "little"), cfg, i // INSN_BYTES)
        for i in range(0, len(raw), INSN_BYTES)
    ]


def encode_uops(uops: Iterable[Uop], cfg: HwConfig) -> np.ndarray:
    """Micro-ops as a uint32 array (one little-endian word each)."""
    spec = insn_layout(cfg).uop
    out = []
    for u in uops:
        word = 0
        for name in ("dst", "src", "wgt"):
            pos, width = spec[name]
            value = int(getattr(u, name))
            if not 0 <= value < (1 << width):
                raise EncodeError(f"micro-op {name}={value} does not fit its {width}-bit field")
            word |= value << pos
        out.append(word)
    return np.array(out, dtype=np.uint32)


def decode_uops(words: np.ndarray, cfg: HwConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dst, src, wgt) index arrays of an array of micro-op words (vectorised)."""
    spec = insn_layout(cfg).uop
    w = np.asarray(words, dtype=np.uint32).astype(np.int64)
    return tuple(
        (w >> spec[name][0]) & ((1 << spec[name][1]) - 1) for name in ("dst", "src", "wgt")
    )


# ---- disassembly --------------------------------------------------------------------------


def _dep_text(insn: Insn) -> str:
    names = [n for n, on in zip(("pop_prev", "pop_next", "push_prev", "push_next"), insn.deps) if on]
    return f"  [{' '.join(names)}]" if names else ""


def format_insn(insn: Insn) -> str:
    """One readable line for an instruction."""
    if isinstance(insn, MemInsn):
        text = (f"{insn.opcode.name:<6}{insn.mem_type.name:<9}sram={insn.sram_base} "
                f"dram={insn.dram_base} y={insn.y_size} x={insn.x_size} stride={insn.x_stride}")
        if any((insn.y_pad_0, insn.y_pad_1, insn.x_pad_0, insn.x_pad_1)):
            text += (f" pad(y {insn.y_pad_0},{insn.y_pad_1} x {insn.x_pad_0},{insn.x_pad_1})")
        if insn.x_size == 0:
            text += "  (nop)"
    elif isinstance(insn, FinishInsn):
        text = "FINISH"
    else:
        loops = (f"uop[{insn.uop_bgn}:{insn.uop_end}) "
                 f"out {insn.iter_out}x(dst {insn.dst_factor_out}, src {insn.src_factor_out}")
        if isinstance(insn, GemmInsn):
            loops += (f", wgt {insn.wgt_factor_out}) in {insn.iter_in}x(dst {insn.dst_factor_in}, "
                      f"src {insn.src_factor_in}, wgt {insn.wgt_factor_in})")
            text = f"GEMM  {'reset ' if insn.reset else ''}{loops}"
        else:
            loops += f") in {insn.iter_in}x(dst {insn.dst_factor_in}, src {insn.src_factor_in})"
            operand = f"imm {insn.imm}" if insn.use_imm else "tensor"
            text = f"ALU   {insn.alu_op.name:<4}{operand:<10}{loops}"
    return text + _dep_text(insn)


def disassemble(insns: Iterable[Insn], start: int = 0) -> str:
    return "\n".join(f"{i:6d}: {format_insn(insn)}" for i, insn in enumerate(insns, start))
