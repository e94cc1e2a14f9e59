"""Hand-built programs for the RTL tests (any configuration)."""

from __future__ import annotations

import numpy as np

from celosia.config import HwConfig
from celosia.image import ProgramImage
from celosia.isa import (
    AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop, encode_program,
    encode_uops,
)


def gemm_program(cfg: HwConfig, *, m_rows: int = 4, k_blocks: int = 2, n_blocks: int = 2,
                 shift: int = 3, seed: int = 0, dram_size: int = 1 << 16) -> ProgramImage:
    """(M x K) int8 @ (K x N)^T int8 >> shift, sized by cfg.

    Like the lead's /tmp/smoke.py, except that the load->compute token is pushed by the
    WGT load (the last of the two loads): pushing it after the INP load, as smoke.py does,
    lets the GEMM race the WGT load on a timed executor."""
    rng = np.random.default_rng(seed)
    b = cfg.block
    k, n = k_blocks * b, n_blocks * b
    a = rng.integers(-128, 128, (m_rows, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    dram = np.zeros(dram_size, np.uint8)
    inp_addr, wgt_addr = 0x400, 0x1000
    uop_addr, out_addr, insn_addr = 0x3000, 0x3800, 0x3C00
    assert cfg.inp_elem_bytes == b and cfg.batch == 1
    dram[inp_addr:inp_addr + a.size] = a.view(np.uint8).reshape(-1)
    wb = w.reshape(n_blocks, b, k_blocks, b).transpose(0, 2, 1, 3)
    dram[wgt_addr:wgt_addr + wb.size] = np.ascontiguousarray(wb).view(np.uint8).reshape(-1)
    uops = [Uop(dst=no, src=ko, wgt=no * k_blocks + ko)
            for no in range(n_blocks) for ko in range(k_blocks)]
    ng = len(uops)
    uops += [Uop(dst=no, src=0) for no in range(n_blocks)]
    uw = encode_uops(uops, cfg)
    dram[uop_addr:uop_addr + uw.nbytes] = uw.view(np.uint8)
    nu = len(uops)
    eb_w = cfg.wgt_elem_bytes
    insns = [
        MemInsn(opcode=Opcode.LOAD, mem_type=MemType.UOP, sram_base=0, dram_base=uop_addr // 4,
                y_size=1, x_size=nu, x_stride=nu),
        GemmInsn(reset=True, uop_bgn=0, uop_end=ng, iter_out=m_rows, dst_factor_out=n_blocks),
        MemInsn(opcode=Opcode.LOAD, mem_type=MemType.INP, sram_base=0,
                dram_base=inp_addr // cfg.inp_elem_bytes, y_size=1, x_size=m_rows * k_blocks,
                x_stride=m_rows * k_blocks),
        MemInsn(opcode=Opcode.LOAD, mem_type=MemType.WGT, sram_base=0, dram_base=wgt_addr // eb_w,
                y_size=1, x_size=n_blocks * k_blocks, x_stride=1, push_next=True),
        GemmInsn(uop_bgn=0, uop_end=ng, iter_out=m_rows, dst_factor_out=n_blocks,
                 src_factor_out=k_blocks, pop_prev=True),
        AluInsn(alu_op=AluOp.SHR, use_imm=True, imm=shift, uop_bgn=ng, uop_end=nu,
                iter_out=m_rows, dst_factor_out=n_blocks, push_next=True),
        MemInsn(opcode=Opcode.STORE, mem_type=MemType.OUT, sram_base=0,
                dram_base=out_addr // cfg.out_elem_bytes, y_size=1, x_size=m_rows * n_blocks,
                x_stride=m_rows * n_blocks, pop_prev=True, push_prev=True),
        FinishInsn(pop_next=True),
    ]
    p = encode_program(insns, cfg)
    dram[insn_addr:insn_addr + p.size] = p
    return ProgramImage(dram, insn_addr, len(insns))


def gemm_reference(cfg: HwConfig, image: ProgramImage, *, m_rows=4, k_blocks=2, n_blocks=2,
                   shift=3, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    b = cfg.block
    a = rng.integers(-128, 128, (m_rows, k_blocks * b), dtype=np.int8)
    w = rng.integers(-128, 128, (n_blocks * b, k_blocks * b), dtype=np.int8)
    return ((a.astype(np.int64) @ w.T.astype(np.int64)) >> shift).astype(np.int8)
