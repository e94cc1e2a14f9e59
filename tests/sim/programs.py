"""Program images for tests: a small DRAM builder and a random generator of race-free programs.

``ProgramBuilder`` lays out data and instructions in a DRAM and makes a ``ProgramImage``.

``random_program(cfg, seed)`` makes a valid, race-free, deadlock-free program: random LOADs of
every loadable type (shapes, strides, paddings), micro-op kernels, GEMMs (with reset) and ALU
operations of every kind with immediate and tensor operands, STOREs, and dependency no-ops
(x_size = 0, empty micro-op ranges, iter_out = 0). Tokens are placed so that every cross-module
hand-off of an INP, WGT or OUT row is ordered: when an instruction touches a row that another
module used last and the two are not already ordered by earlier tokens (tracked with vector
clocks), the generator makes the producer's last instruction (or a dependency no-op) push a
token and the new instruction pop it, draining older tokens first. Extra random pushes and pops
make the token patterns varied. Every pop is preceded in program order by its push and every
queue holds between 0 and ``token_queue_depth`` tokens at every point of program order, so the
sequential schedule completes and therefore no schedule deadlocks.

Every row a program reads has been written earlier in the same program (an initialisation
phase loads a window of each buffer), so results never depend on initial SRAM contents.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from celosia.config import HwConfig
from celosia.image import ProgramImage
from celosia.isa import (
    AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop, encode_program,
    elem_bytes, encode_uops,
)

__all__ = ["ProgramBuilder", "RandomProgram", "random_program"]

LD, CP, ST = "load", "compute", "store"
_ORDER = {LD: 0, CP: 1, ST: 2}
_QUEUE = {(LD, CP): "load->compute", (CP, LD): "compute->load",
          (CP, ST): "compute->store", (ST, CP): "store->compute"}


class ProgramBuilder:
    """A DRAM under construction: data placed at fixed addresses, instructions appended."""

    def __init__(self, cfg: HwConfig, *, insn_addr: int = 0):
        self.cfg = cfg
        self.insn_addr = insn_addr
        self.mem = bytearray()
        self.top = 0
        self.insns: list = []

    def alloc(self, nbytes: int, align: int = 16) -> int:
        """Byte address of a fresh zeroed region."""
        addr = -(-self.top // align) * align
        self.top = addr + nbytes
        return addr

    def put(self, addr: int, data) -> None:
        raw = bytes(np.ascontiguousarray(data).view(np.uint8).reshape(-1)) \
            if isinstance(data, np.ndarray) else bytes(data)
        end = addr + len(raw)
        if end > len(self.mem):
            self.mem.extend(bytes(end - len(self.mem)))
        self.mem[addr:end] = raw
        self.top = max(self.top, end)

    def data(self, data, align: int = 16) -> int:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        addr = self.alloc(raw.size, align)
        self.put(addr, raw)
        return addr

    def uops(self, uops: list[Uop]) -> int:
        """Place micro-ops; returns their dram_base (in 4-byte micro-op elements)."""
        return self.data(encode_uops(uops, self.cfg), 4) // 4

    def emit(self, insn) -> int:
        self.insns.append(insn)
        return len(self.insns) - 1

    def image(self, *, dram_size: int | None = None, insn_addr: int | None = None) -> ProgramImage:
        """The image: instructions at ``insn_addr`` (default: after the data), DRAM of at least
        ``dram_size`` bytes."""
        prog = encode_program(self.insns, self.cfg)
        addr = insn_addr if insn_addr is not None else -(-self.top // 16) * 16
        size = max(addr + prog.size, self.top, dram_size or 0)
        dram = np.zeros(size, np.uint8)
        dram[:len(self.mem)] = np.frombuffer(bytes(self.mem), np.uint8)
        dram[addr:addr + prog.size] = prog
        return ProgramImage(dram, addr, len(self.insns))


@dataclass
class RandomProgram:
    image: ProgramImage
    insns: list
    seed: int


def _field_max(bits: int) -> int:
    return (1 << bits) - 1


class _Generator:
    def __init__(self, cfg: HwConfig, rng: random.Random, n_body: int):
        self.cfg, self.rng, self.n_body = cfg, rng, n_body
        self.nprng = np.random.default_rng(rng.getrandbits(32))
        small = cfg.acc_depth <= 256
        full = small and rng.random() < 0.4

        def window(depth, lo, hi):
            return depth if full else min(depth, rng.randint(lo, hi))

        self.win = {"inp": window(cfg.inp_depth, 4, 24), "wgt": window(cfg.wgt_depth, 2, 16),
                    "acc": window(cfg.acc_depth, 4, 24)}
        self.uop_slots = min(cfg.uop_depth, 96)
        self.uop_model: dict[int, Uop] = {}
        # DRAM layout: [program][sources][uop area][out area, ending at the end of DRAM].
        self.max_insns = 8 * n_body + 200
        b = self.builder = ProgramBuilder(cfg)
        b.alloc(16 * rng.randint(0, 3))
        self.insn_addr = b.alloc(16 * self.max_insns)
        self.src = {}
        for mt, n in ((MemType.INP, 3 * self.win["inp"] + 16), (MemType.WGT, 2 * self.win["wgt"] + 8),
                      (MemType.ACC, 2 * self.win["acc"] + 8), (MemType.ACC_8BIT, 2 * self.win["acc"] + 8)):
            eb = elem_bytes(cfg, mt)
            if mt == MemType.ACC:
                values = self.nprng.integers(-2**31, 2**31, n * eb // 4, dtype=np.int64)
                tame = self.nprng.random(values.size) < 0.5  # small values too, for SHR/MUL/MIN
                values[tame] = self.nprng.integers(-300, 300, int(tame.sum()))
                data = values.astype("<i4")
            else:
                data = self.nprng.integers(0, 256, n * eb, dtype=np.uint8)
            self.src[mt] = (b.data(data, eb) // eb, n)
        self.uop_area = b.alloc(4 * 4096, 4) // 4
        self.uop_used = 0
        ob = cfg.out_elem_bytes
        self.out_elems = 2 * self.win["acc"] + 8
        self.out_base = b.alloc(ob * self.out_elems, ob) // ob
        self.dram_size = (self.out_base + self.out_elems) * ob
        # Token bookkeeping.
        self.insns: list[list] = []  # [record, module]; records are replaced to add flags
        self.seq = {LD: [], CP: [], ST: []}  # program indices per module
        self.vc_after: list[dict] = []
        self.mod_vc = {m: dict.fromkeys(_ORDER, 0) for m in _ORDER}
        self.tokens = {q: deque() for q in _QUEUE.values()}  # pusher program index
        self.count_hist = {q: [] for q in _QUEUE.values()}
        self.rows: dict = {}  # (buf, row) -> [last writer (module, seq) or None, {module: seq}]
        self.p_push, self.p_pop = rng.choice([(0.0, 0.0), (0.2, 0.4), (0.5, 0.5), (0.7, 0.3)])

    # ---- tokens ---------------------------------------------------------------------------

    @staticmethod
    def _flag(kind: str, me: str, other: str) -> str:
        return f"{kind}_{'next' if _ORDER[other] > _ORDER[me] else 'prev'}"

    def _neighbours(self, m: str) -> list[str]:
        return [o for o in _ORDER if abs(_ORDER[o] - _ORDER[m]) == 1]

    def _emit(self, module: str, insn, reads=(), writes=(), *, must_pop=(), extra=True) -> int:
        """Append with the given pops plus, if ``extra``, random extra pops and pushes."""
        rng, depth = self.rng, self.cfg.token_queue_depth
        pops = set(must_pop)
        for p in self._neighbours(module):
            q = _QUEUE[(p, module)]
            if extra and p not in pops and self.tokens[q] and rng.random() < self.p_pop:
                pops.add(p)
        vc = dict(self.mod_vc[module])
        flags = {}
        for p in pops:
            q = _QUEUE[(p, module)]
            pusher = self.tokens[q].popleft()
            for m, v in self.vc_after[pusher].items():
                vc[m] = max(vc[m], v)
            flags[self._flag("pop", module, p)] = True
        vc[module] += 1
        index = len(self.insns)
        for p in self._neighbours(module):
            q = _QUEUE[(module, p)]
            if extra and len(self.tokens[q]) < depth and rng.random() < self.p_push:
                self.tokens[q].append(index)
                flags[self._flag("push", module, p)] = True
        self.insns.append([replace(insn, **flags), module])
        self.seq[module].append(index)
        self.vc_after.append(vc)
        self.mod_vc[module] = vc
        for q in self.count_hist:
            self.count_hist[q].append(len(self.tokens[q]))
        seq = vc[module]
        for loc in reads:
            self.rows.setdefault(loc, [None, {}])[1][module] = seq
        for loc in writes:
            self.rows[loc] = [(module, seq), {}]
        assert len(self.insns) <= self.max_insns
        return index

    def _ensure_token(self, p: str, q_mod: str, need: int) -> None:
        """Make the head of the p -> q_mod queue a token pushed by p's instruction number
        ``need`` (1-based) or later."""
        q = _QUEUE[(p, q_mod)]
        while self.tokens[q] and self.vc_after[self.tokens[q][0]][p] < need:
            self._emit(q_mod, self._noop(q_mod), must_pop=[p], extra=False)
        if self.tokens[q]:
            return
        last = self.seq[p][-1]
        record, _ = self.insns[last]
        flag = self._flag("push", p, q_mod)
        if not getattr(record, flag) and max(self.count_hist[q][last:]) < self.cfg.token_queue_depth \
                and self.rng.random() < 0.8:
            self.insns[last][0] = replace(record, **{flag: True})
            for i in range(last, len(self.insns)):
                self.count_hist[q][i] += 1
            self.tokens[q].append(last)
        else:  # a dependency no-op on p that pushes
            index = self._emit(p, self._noop(p), extra=False)
            self.insns[index][0] = replace(self.insns[index][0], **{flag: True})
            self.count_hist[q][index] += 1
            self.tokens[q].append(index)

    def add(self, module: str, insn, reads=(), writes=()) -> int:
        """Append an instruction, first adding the tokens that order it after every
        conflicting access by another module."""
        need = dict.fromkeys(_ORDER, 0)
        for loc in reads:
            w = self.rows.get(loc, [None])[0]
            if w and w[0] != module:
                need[w[0]] = max(need[w[0]], w[1])
        for loc in writes:
            w, readers = self.rows.get(loc, [None, {}])
            if w and w[0] != module:
                need[w[0]] = max(need[w[0]], w[1])
            for m, s in readers.items():
                if m != module:
                    need[m] = max(need[m], s)
        must = []
        for p, s in need.items():
            if s > self.mod_vc[module][p]:
                assert p in self._neighbours(module), (p, module)
                self._ensure_token(p, module, s)
                must.append(p)
        return self._emit(module, insn, reads, writes, must_pop=must)

    # ---- no-ops ---------------------------------------------------------------------------

    def _noop(self, module: str):
        rng = self.rng
        garbage = dict(sram_base=rng.randint(0, 0xFFFF), dram_base=rng.randint(0, 0xFFFFFFFF),
                       y_size=rng.randint(0, 0xFFFF), x_size=0, x_stride=rng.randint(0, 0xFFFF))
        pads = dict(y_pad_0=rng.randint(0, 15), y_pad_1=rng.randint(0, 15),
                    x_pad_0=rng.randint(0, 15), x_pad_1=rng.randint(0, 15))
        if module == LD:
            return MemInsn(opcode=Opcode.LOAD, mem_type=rng.choice([MemType.INP, MemType.WGT]),
                           **garbage, **pads)
        if module == ST:
            return MemInsn(opcode=Opcode.STORE, mem_type=MemType.OUT, **garbage)
        kind = rng.randrange(4)
        if kind == 0:
            return MemInsn(opcode=Opcode.LOAD, mem_type=rng.choice(
                [MemType.UOP, MemType.ACC, MemType.ACC_8BIT]), **garbage, **pads)
        bgn = rng.randrange(self.cfg.uop_depth)
        cls = GemmInsn if kind == 1 else AluInsn
        if kind == 3:  # a real range, executed zero times
            return cls(uop_bgn=0, uop_end=min(4, self.cfg.uop_depth), iter_out=0,
                       iter_in=rng.randint(0, 5))
        return cls(uop_bgn=bgn, uop_end=bgn, iter_out=rng.randint(0, 5), iter_in=rng.randint(0, 5))

    # ---- instructions -----------------------------------------------------------------------

    def _load_shape(self, room: int) -> dict:
        """A random LOAD shape writing at most ``room`` rows (room >= 1)."""
        rng = self.rng
        for _ in range(50):
            big = rng.random() < 0.15
            y = rng.choice([0, 1, 1, 2, 3, 4]) if not big else rng.randint(1, 6)
            x = rng.randint(1, 5)
            pads = [rng.choice([0, 0, 0, 1, 2, 15 if big else 3]) for _ in range(4)]
            rows = (pads[0] + y + pads[1]) * (pads[2] + x + pads[3])
            if 1 <= rows <= room:
                break
        else:
            y, x, pads = 1, max(1, min(room, rng.randint(1, 5))), [0, 0, 0, 0]
        return dict(y_size=y, x_size=x, y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2],
                    x_pad_1=pads[3])

    def _dram_rows(self, shape: dict, n_src: int) -> tuple[int, int]:
        """(dram offset, x_stride) for a block of y_size rows of x_size in n_src elements."""
        rng, y, x = self.rng, shape["y_size"], shape["x_size"]
        stride = rng.choice([x, x, x + rng.randint(1, 4), rng.randint(0, x), rng.randint(0, 0xFFFF)])
        if y > 1:
            stride = min(stride, (n_src - x) // (y - 1))
        span = (y - 1) * stride + x if y else 0
        return rng.randint(0, max(0, n_src - span)), stride

    @staticmethod
    def _rows_written(shape: dict, sram: int) -> int:
        return ((shape["y_pad_0"] + shape["y_size"] + shape["y_pad_1"])
                * (shape["x_pad_0"] + shape["x_size"] + shape["x_pad_1"]))

    def load(self, mt: MemType, sram: int | None = None, room: int | None = None) -> int:
        buf = {MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc", MemType.ACC_8BIT: "acc"}[mt]
        win = self.win[buf]
        if sram is None:
            sram = self.rng.randrange(win)
        shape = self._load_shape(room if room is not None else win - sram)
        base, n_src = self.src[mt]
        off, stride = self._dram_rows(shape, n_src)
        count = self._rows_written(shape, sram)
        insn = MemInsn(opcode=Opcode.LOAD, mem_type=mt, sram_base=sram, dram_base=base + off,
                       x_stride=stride, **shape)
        rows = [(buf, r) for r in range(sram, sram + count)] if buf != "acc" else []
        self.add(LD if buf in ("inp", "wgt") else CP, insn, writes=rows)
        return count

    def fill(self, mt: MemType) -> None:
        """Loads covering the whole window of a buffer (initialisation)."""
        buf = {MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc", MemType.ACC_8BIT: "acc"}[mt]
        pos = 0
        while pos < self.win[buf]:
            kind = mt if mt != MemType.ACC else self.rng.choice([MemType.ACC, MemType.ACC_8BIT])
            pos += self.load(kind, sram=pos, room=self.win[buf] - pos)

    def uop_kernel(self, uops: list[Uop]) -> tuple[int, int]:
        """Load micro-ops into the UOP buffer with a random LOAD shape; returns their range."""
        rng = self.rng
        n = len(uops)
        if n == 0:
            bgn = rng.randrange(self.uop_slots)
            return bgn, bgn
        # As one row, or as several rows with a DRAM stride and zero micro-ops as x padding
        # (a zero micro-op is (0, 0, 0), row 0 of every buffer, which is always in the window).
        rows = [d for d in range(1, n + 1) if n % d == 0 and rng.random() < 0.5] or [1]
        y = rng.choice(rows)
        x = n // y
        xp0, xp1 = (rng.choice([0, 0, 1]), rng.choice([0, 0, 2])) if y > 1 else (0, 0)
        gap = rng.choice([0, 0, 3])
        layout = []
        for r in range(y):
            layout += uops[r * x:(r + 1) * x] + [Uop(0, 0, 0)] * gap
        if self.uop_used + len(layout) > 4096:
            self.uop_used = 0
        dram = self.uop_area + self.uop_used
        self.builder.put(4 * dram, encode_uops(layout, self.cfg))
        self.uop_used += len(layout)
        total = y * (xp0 + x + xp1)
        bgn = rng.randrange(self.uop_slots - total + 1)
        self.add(CP, MemInsn(opcode=Opcode.LOAD, mem_type=MemType.UOP, sram_base=bgn,
                             dram_base=dram, y_size=y, x_size=x, x_stride=x + gap,
                             x_pad_0=xp0, x_pad_1=xp1))
        for r in range(y):
            row = [Uop(0, 0, 0)] * xp0 + uops[r * x:(r + 1) * x] + [Uop(0, 0, 0)] * xp1
            for k, u in enumerate(row):
                self.uop_model[bgn + r * (xp0 + x + xp1) + k] = u
        return bgn, bgn + total

    def _factors(self, iters: int, slack: int, bits: int) -> tuple[int, int]:
        """A factor for a loop of ``iters`` and the slack it leaves."""
        if iters <= 1:
            return self.rng.randint(0, _field_max(bits)), slack
        f = self.rng.randint(0, max(0, slack) // (iters - 1))
        return f, slack - f * (iters - 1)

    def _loops(self, uops, fields, windows, bits):
        """iter_out, iter_in and factors keeping every index of every field in its window;
        None if the micro-ops alone leave a window."""
        rng = self.rng
        top = {f: max((getattr(u, f) for u in uops), default=0) for f in fields}
        if any(top[f] >= windows[f] for f in fields):
            return None
        io = rng.choice([0, 1, 1, 2, 3]) if rng.random() < 0.1 else rng.choice([1, 2, 3])
        ii = rng.choice([1, 1, 2, 3, 4])
        out = {"iter_out": io, "iter_in": ii}
        for f in fields:
            slack = windows[f] - 1 - top[f]
            if rng.random() < 0.5:
                fo, slack = self._factors(io, slack, bits[f])
                fi, _ = self._factors(ii, slack, bits[f])
            else:
                fi, slack = self._factors(ii, slack, bits[f])
                fo, _ = self._factors(io, slack, bits[f])
            name = {"dst": "dst", "src": "src", "wgt": "wgt"}[f]
            out[f"{name}_factor_out"], out[f"{name}_factor_in"] = fo, fi
        return out

    def _kernel(self, fields, windows, loop_bits, fresh):
        """(uop_bgn, uop_end, loops, micro-ops) for a GEMM or ALU."""
        rng = self.rng
        if not fresh and self.uop_model and rng.random() < 0.5:
            slots = sorted(self.uop_model)
            bgn = rng.choice(slots)
            end = bgn
            while end in self.uop_model and end - bgn < 6 and rng.random() < 0.8:
                end += 1
            uops = [self.uop_model[k] for k in range(bgn, end)]
            loops = self._loops(uops, fields, windows, loop_bits)
            if loops is not None:
                return bgn, end, loops, uops
        n = rng.choice([0, 1, 2, 3, 4, 5, 6]) if rng.random() < 0.9 else rng.randint(7, 16)
        chain = rng.random() < 0.2
        uops = []
        for k in range(n):
            vals = {f: rng.randrange(windows[f]) if f in windows
                    else rng.randrange(1 << self.cfg.uop_wgt_bits)  # ALU ignores wgt
                    for f in ("dst", "src", "wgt")}
            if chain and k:  # micro-op k reads what micro-op k-1 wrote (ALU in-order rule)
                vals["src"] = min(uops[-1].dst, windows["src"] - 1)
                vals["dst"] = rng.choice([uops[-1].dst, vals["dst"]])
            uops.append(Uop(vals["dst"], vals["src"], vals["wgt"]))
        bgn, end = self.uop_kernel(uops)
        loops = self._loops(uops, fields, windows, loop_bits)
        if loops is None:  # only if windows are degenerate; run the kernel once
            loops = dict(iter_out=1, iter_in=1)
        return bgn, end, loops, [self.uop_model.get(k, Uop(0, 0, 0)) for k in range(bgn, end)]

    @staticmethod
    def _indices(uops, loops, field):
        fo, fi = loops.get(f"{field}_factor_out", 0), loops.get(f"{field}_factor_in", 0)
        return {getattr(u, field) + i * fo + j * fi
                for i in range(loops["iter_out"]) for j in range(loops["iter_in"]) for u in uops}

    def gemm(self, reset: bool | None = None) -> None:
        cfg = self.cfg
        windows = {"dst": self.win["acc"], "src": self.win["inp"], "wgt": self.win["wgt"]}
        bits = {"dst": cfg.log_acc_depth, "src": cfg.log_inp_depth, "wgt": cfg.log_wgt_depth}
        bgn, end, loops, uops = self._kernel(("dst", "src", "wgt"), windows, bits,
                                             fresh=False)
        reset = self.rng.random() < 0.2 if reset is None else reset
        reads = [] if reset else (
            [("inp", r) for r in self._indices(uops, loops, "src")]
            + [("wgt", r) for r in self._indices(uops, loops, "wgt")])
        writes = [("out", r) for r in self._indices(uops, loops, "dst")]
        self.add(CP, GemmInsn(uop_bgn=bgn, uop_end=end, reset=reset, **loops), reads, writes)

    def alu(self, op: AluOp | None = None, use_imm: bool | None = None) -> None:
        rng, cfg = self.rng, self.cfg
        windows = {"dst": self.win["acc"], "src": self.win["acc"]}
        bits = {"dst": cfg.log_acc_depth, "src": cfg.log_acc_depth}
        bgn, end, loops, uops = self._kernel(("dst", "src"), windows, bits, fresh=False)
        op = AluOp(rng.randrange(5)) if op is None else op
        use_imm = rng.random() < 0.5 if use_imm is None else use_imm
        if op == AluOp.SHR:
            imm = rng.choice([rng.randint(-40, 40), rng.randint(-3, 8), -32768, 32767])
        else:
            imm = rng.choice([rng.randint(-32768, 32767), rng.randint(-5, 5), -32768, 32767])
        writes = [("out", r) for r in self._indices(uops, loops, "dst")]
        self.add(CP, AluInsn(uop_bgn=bgn, uop_end=end, alu_op=op, use_imm=use_imm, imm=imm,
                             reset=rng.random() < 0.1, **loops), (), writes)

    def store(self, whole: bool = False) -> None:
        rng, win = self.rng, self.win["acc"]
        if whole:
            sram, y, x = 0, 1, win
        else:
            sram = rng.randrange(win)
            room = win - sram
            x = rng.randint(1, min(room, 6))
            y = rng.choice([0, 1, 1, 2, 3, 4])
            y = min(y, room // x)
        off, stride = self._dram_rows(dict(y_size=y, x_size=x), self.out_elems)
        if whole and rng.random() < 0.5:
            off = self.out_elems - x  # reach the last byte of DRAM
        insn = MemInsn(opcode=Opcode.STORE, mem_type=MemType.OUT, sram_base=sram,
                       dram_base=self.out_base + off, y_size=y, x_size=x, x_stride=stride)
        self.add(ST, insn, reads=[("out", r) for r in range(sram, sram + y * x)])

    def noop(self) -> None:
        module = self.rng.choice([LD, CP, ST])
        self.add(module, self._noop(module))

    # ---- the program ----------------------------------------------------------------------

    def program(self) -> RandomProgram:
        rng = self.rng
        init = [lambda: self.fill(MemType.INP), lambda: self.fill(MemType.WGT),
                lambda: self.fill(MemType.ACC)]
        rng.shuffle(init)
        for step in init:
            step()
        # Define every OUT row of the window: one ALU over all ACC rows of the window.
        bgn, end = self.uop_kernel([Uop(0, 0)])
        self.add(CP, AluInsn(uop_bgn=bgn, uop_end=end, alu_op=AluOp(rng.randrange(5)),
                             use_imm=True, imm=rng.randint(-3, 3), iter_out=self.win["acc"],
                             dst_factor_out=1), (),
                 [("out", r) for r in range(self.win["acc"])])
        actions = [
            (3, lambda: self.load(MemType.INP)), (3, lambda: self.load(MemType.WGT)),
            (2, lambda: self.load(rng.choice([MemType.ACC, MemType.ACC_8BIT]))),
            (6, self.gemm), (6, self.alu), (4, self.store),
            (2, self.noop),
        ]
        weights = [w for w, _ in actions]
        for _ in range(self.n_body):
            rng.choices(actions, weights)[0][1]()
        if rng.random() < 0.8:
            self.store(whole=True)
        self.add(CP, FinishInsn())
        insns = [record for record, _ in self.insns]
        b = self.builder
        b.insns = insns
        image = b.image(dram_size=self.dram_size, insn_addr=self.insn_addr)
        return RandomProgram(image, insns, 0)


def random_program(cfg: HwConfig, seed: int, *, n_body: int = 20) -> RandomProgram:
    """A random valid, race-free program for ``cfg`` (deterministic in ``seed``)."""
    gen = _Generator(cfg, random.Random(seed), n_body)
    prog = gen.program()
    prog.seed = seed
    return prog
