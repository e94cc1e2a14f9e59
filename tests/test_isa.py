"""The ISA codec: encode/decode round trips over random instructions for several
configurations, field positions checked against ISA.md and against the independent decoder of
tests/sim/reference.py, range errors, micro-ops and the disassembler."""

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celosia import HwConfig
from celosia.isa import (
    AluInsn, AluOp, DecodeError, EncodeError, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop,
    decode, decode_program, insn_layout, decode_uops, disassemble, encode, encode_program, encode_uops,
)

sys.path.insert(0, str(Path(__file__).resolve().parent / "sim"))
from reference import RefLayout, _decode as ref_decode  # noqa: E402

CONFIGS = {
    "default": HwConfig(),
    "small": HwConfig.preset("small"),
    "batch2-block8": HwConfig(log_batch=1, log_block=3, log_inp_buff_size=12,
                              log_wgt_buff_size=13, log_acc_buff_size=13, log_uop_buff_size=10),
    "block32": HwConfig(log_block=5, log_uop_buff_size=12),
    "tiny": HwConfig(log_block=1, log_uop_buff_size=4, log_inp_buff_size=3, log_wgt_buff_size=4,
                     log_acc_buff_size=5),
}
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


def flags():
    return st.fixed_dictionaries({k: st.booleans() for k in
                                  ("pop_prev", "pop_next", "push_prev", "push_next")})


def bits(n):
    return st.integers(0, (1 << n) - 1)


def mem_insns(cfg):
    return st.builds(
        lambda f, **kw: MemInsn(**f, **kw), flags(),
        opcode=st.sampled_from([Opcode.LOAD, Opcode.STORE]), mem_type=st.sampled_from(list(MemType)),
        sram_base=bits(16), dram_base=bits(32), y_size=bits(16), x_size=bits(16),
        x_stride=bits(16), y_pad_0=bits(4), y_pad_1=bits(4), x_pad_0=bits(4), x_pad_1=bits(4))


def _loop_fields(cfg, src_bits):
    return dict(uop_bgn=bits(cfg.log_uop_depth), uop_end=bits(cfg.log_uop_depth + 1),
                iter_out=bits(14), iter_in=bits(14), dst_factor_out=bits(cfg.log_acc_depth),
                dst_factor_in=bits(cfg.log_acc_depth), src_factor_out=bits(src_bits),
                src_factor_in=bits(src_bits), reset=st.booleans())


def gemm_insns(cfg):
    return st.builds(lambda f, **kw: GemmInsn(**f, **kw), flags(),
                     wgt_factor_out=bits(cfg.log_wgt_depth), wgt_factor_in=bits(cfg.log_wgt_depth),
                     **_loop_fields(cfg, cfg.log_inp_depth))


def alu_insns(cfg):
    return st.builds(lambda f, **kw: AluInsn(**f, **kw), flags(),
                     alu_op=st.sampled_from(list(AluOp)), use_imm=st.booleans(),
                     imm=st.integers(-32768, 32767), **_loop_fields(cfg, cfg.log_acc_depth))


def insns(cfg):
    return st.one_of(mem_insns(cfg), gemm_insns(cfg), alu_insns(cfg),
                     flags().map(lambda f: FinishInsn(**f)))


_REF_NAMES = {  # celosia field -> name in reference.py's decoder
    "sram_base": "sram", "dram_base": "dram", "y_size": "y", "x_size": "x", "x_stride": "stride",
    "y_pad_0": "yp0", "y_pad_1": "yp1", "x_pad_0": "xp0", "x_pad_1": "xp1", "mem_type": "mtype",
    "uop_bgn": "bgn", "uop_end": "end", "iter_out": "iout", "iter_in": "iin",
    "dst_factor_out": "dfo", "dst_factor_in": "dfi", "src_factor_out": "sfo",
    "src_factor_in": "sfi", "wgt_factor_out": "wfo", "wgt_factor_in": "wfi", "alu_op": "aluop",
    "use_imm": "use_imm", "imm": "imm", "reset": "reset", "pop_prev": "pop_prev",
    "pop_next": "pop_next", "push_prev": "push_prev", "push_next": "push_next",
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip(name):
    cfg = CONFIGS[name]
    lay = RefLayout.of(cfg)

    @SETTINGS
    @given(st.lists(insns(cfg), min_size=1, max_size=6))
    def check(program):
        for insn in program:
            word = encode(insn, cfg)
            assert 0 <= word < 1 << 128
            assert decode(word, cfg) == insn
            # The independent decoder (written from ISA.md) reads the same fields.
            ref = ref_decode(word, lay, 0)
            assert ref["op"] == insn.opcode
            for field, ref_name in _REF_NAMES.items():
                if hasattr(insn, field) and not (field == "reset" and isinstance(insn, AluInsn)):
                    assert ref[ref_name] == int(getattr(insn, field)), field
            if isinstance(insn, MemInsn):
                assert word >> 58 & 0x3F == 0  # bits [63:58] are zero
            elif not isinstance(insn, FinishInsn):
                assert word >> 63 & 1 == 0
        raw = encode_program(program, cfg)
        assert raw.dtype == np.uint8 and raw.size == 16 * len(program)
        assert decode_program(raw, cfg) == program

    check()


def test_default_field_positions_match_isa_md():
    """Bit positions of ISA.md section 2's tables (default configuration)."""
    lay = insn_layout(HwConfig())
    assert lay.mem["mem_type"] == (7, 3) and lay.mem["sram_base"] == (10, 16)
    assert lay.mem["dram_base"] == (26, 32) and lay.mem["y_size"] == (64, 16)
    assert lay.mem["x_size"] == (80, 16) and lay.mem["x_stride"] == (96, 16)
    assert [lay.mem[k] for k in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")] == \
        [(112, 4), (116, 4), (120, 4), (124, 4)]
    assert lay.gemm["reset"] == (7, 1) and lay.gemm["uop_bgn"] == (8, 13)
    assert lay.gemm["uop_end"] == (21, 14) and lay.gemm["iter_out"] == (35, 14)
    assert lay.gemm["iter_in"] == (49, 14)
    assert [lay.gemm[k] for k in ("dst_factor_out", "dst_factor_in", "src_factor_out",
                                  "src_factor_in", "wgt_factor_out", "wgt_factor_in")] == \
        [(64, 11), (75, 11), (86, 11), (97, 11), (108, 10), (118, 10)]
    assert lay.alu["alu_op"] == (108, 3) and lay.alu["use_imm"] == (111, 1)
    assert lay.alu["imm"] == (112, 16)
    assert lay.uop == {"dst": (0, 11), "src": (11, 11), "wgt": (22, 10)}


def test_decode_rejects_undefined_opcode_and_memory_type():
    cfg = HwConfig()
    for op in (5, 6, 7):
        with pytest.raises(DecodeError, match=f"opcode {op} is not defined"):
            decode(op, cfg, 3)
    for mt in (6, 7):
        with pytest.raises(DecodeError, match=f"memory type {mt} is not defined") as info:
            decode(mt << 7, cfg, 9)
        assert info.value.index == 9


@pytest.mark.parametrize("name", ["default", "small"])
def test_encode_rejects_out_of_range_fields(name):
    cfg = CONFIGS[name]
    lay = insn_layout(cfg)
    base = {"mem": MemInsn(opcode=Opcode.LOAD, mem_type=MemType.INP), "gemm": GemmInsn(),
            "alu": AluInsn()}
    for kind, insn in base.items():
        for field, (_, width) in getattr(lay, kind).items():
            if field in ("opcode", "mem_type", "alu_op", "imm") or width == 1:
                continue
            for bad in (1 << width, -1):
                with pytest.raises(EncodeError, match=f"{field}={bad} does not fit its {width}-bit"):
                    encode(insn.with_deps(**{field: bad}), cfg)
            encode(insn.with_deps(**{field: (1 << width) - 1}), cfg)
    for imm in (-32769, 32768):
        with pytest.raises(EncodeError, match=f"imm={imm} does not fit a signed 16-bit"):
            encode(AluInsn(imm=imm), cfg)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_uop_round_trip(name):
    cfg = CONFIGS[name]

    @SETTINGS
    @given(st.lists(st.builds(Uop, bits(cfg.uop_dst_bits), bits(cfg.uop_src_bits),
                              bits(cfg.uop_wgt_bits)), max_size=20))
    def check(uops):
        words = encode_uops(uops, cfg)
        assert words.dtype == np.uint32 and words.size == len(uops)
        dst, src, wgt = decode_uops(words, cfg)
        assert [Uop(int(d), int(s), int(w)) for d, s, w in zip(dst, src, wgt)] == uops
        # ISA.md: dst in the low bits, then src, then wgt.
        for u, w in zip(uops, words.tolist()):
            assert w == u.dst | u.src << cfg.uop_dst_bits | \
                u.wgt << (cfg.uop_dst_bits + cfg.uop_src_bits)

    check()


def test_uop_encode_rejects_out_of_range():
    cfg = HwConfig()
    for uop, field in ((Uop(2048, 0, 0), "dst"), (Uop(0, 2048, 0), "src"), (Uop(0, 0, 1024), "wgt"),
                       (Uop(-1, 0, 0), "dst")):
        with pytest.raises(EncodeError, match=f"micro-op {field}="):
            encode_uops([uop], cfg)


def test_disassembler_one_line_per_instruction():
    cfg = HwConfig()

    @SETTINGS
    @given(st.lists(insns(cfg), min_size=1, max_size=12), st.integers(0, 1000))
    def check(program, start):
        text = disassemble(program, start)
        lines = text.split("\n")
        assert len(lines) == len(program)
        for i, (line, insn) in enumerate(zip(lines, program)):
            assert line.split(":")[0].strip() == str(start + i)
            name = insn.opcode.name
            assert name in line
            if any(insn.deps):
                assert "[" in line

    check()
