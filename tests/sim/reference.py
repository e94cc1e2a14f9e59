"""A deliberately naive reference interpreter of the shared ISA.md, written from the page alone.

It shares nothing with celosia's codec or datapath: field positions are derived here from the
configuration's nine LOG_* numbers (ISA.md section 2), instructions are decoded from the raw
128-bit words, DMA moves one byte at a time and GEMM/ALU run one micro-op and one lane at a
time on plain Python ints. It is slow on purpose; use it on small programs.

Ordering follows ISA.md section 3 plus the token rules fsim documents (docs/isa.md, "Choices"):
bounded command queues filled in program order by fetch, bounded token queues, pops before an
instruction starts, pushes (all together) after it completes. The schedule is a seeded random
choice among the enabled actions, so running with several seeds checks that a program's result
does not depend on the schedule. With ``check_races`` every cross-module access to INP, WGT,
OUT and DRAM must be ordered by tokens (vector clocks), or :class:`RefRace` is raised.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

__all__ = ["RefIllegal", "RefDeadlock", "RefRace", "RefLayout", "run_reference"]

LOAD, STORE, GEMM, FINISH, ALU = 0, 1, 2, 3, 4
M_UOP, M_WGT, M_INP, M_ACC, M_OUT, M_ACC8 = 0, 1, 2, 3, 4, 5
A_MIN, A_MAX, A_ADD, A_SHR, A_MUL = 0, 1, 2, 3, 4
LD, CP, ST = "load", "compute", "store"
MODULES = (LD, CP, ST)
L2C, C2L, C2S, S2C = "load->compute", "compute->load", "compute->store", "store->compute"


class RefIllegal(Exception):
    def __init__(self, index, what):
        self.index = index
        self.what = what
        super().__init__(f"instruction {index}: {what}")


class RefDeadlock(Exception):
    def __init__(self, waiting):
        self.waiting = waiting  # [(module, index or None, text)]
        super().__init__("deadlock: " + "; ".join(f"{m}@{i}: {t}" for m, i, t in waiting))


class RefRace(Exception):
    pass


def _wrap32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _low8(v: int) -> int:
    v &= 0xFF
    return v - 256 if v >= 128 else v


def _sext(v: int, bits: int) -> int:
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


@dataclass
class RefLayout:
    """Sizes and field widths from the nine LOG_* parameters (ISA.md sections 1 and 2)."""

    batch: int
    block: int
    depth: dict  # buffer name -> rows
    elem: dict  # memory type -> bytes of one DRAM element
    lg: dict  # buffer name -> log2(depth)
    cmd_depth: int
    tok_depth: int

    @classmethod
    def of(cls, cfg) -> "RefLayout":
        batch, block = 2 ** cfg.log_batch, 2 ** cfg.log_block
        assert (cfg.log_inp_width, cfg.log_wgt_width, cfg.log_acc_width) == (3, 3, 5)
        inp_b, wgt_b, acc_b, out_b = batch * block, block * block, batch * block * 4, batch * block
        lg = {
            "uop": cfg.log_uop_buff_size - 2,
            "inp": cfg.log_inp_buff_size - (cfg.log_batch + cfg.log_block),
            "wgt": cfg.log_wgt_buff_size - 2 * cfg.log_block,
            "acc": cfg.log_acc_buff_size - (cfg.log_batch + cfg.log_block + 2),
        }
        depth = {k: 2 ** v for k, v in lg.items()}
        depth["out"] = depth["acc"]
        elem = {M_UOP: 4, M_WGT: wgt_b, M_INP: inp_b, M_ACC: acc_b, M_OUT: out_b, M_ACC8: out_b}
        return cls(batch, block, depth, elem, lg, cfg.cmd_queue_depth, cfg.token_queue_depth)


def _bits(word: int, lo: int, width: int) -> int:
    return (word >> lo) & ((1 << width) - 1)


def _decode(word: int, lay: RefLayout, index: int) -> dict:
    d = {"index": index, "op": _bits(word, 0, 3), "pop_prev": _bits(word, 3, 1),
         "pop_next": _bits(word, 4, 1), "push_prev": _bits(word, 5, 1), "push_next": _bits(word, 6, 1)}
    op = d["op"]
    if op in (LOAD, STORE):
        d["mtype"] = _bits(word, 7, 3)
        if d["mtype"] > 5:
            raise RefIllegal(index, f"memory type {d['mtype']}")
        d["sram"] = _bits(word, 10, 16)
        d["dram"] = _bits(word, 26, 32)
        for name, lo, w in (("y", 64, 16), ("x", 80, 16), ("stride", 96, 16), ("yp0", 112, 4),
                            ("yp1", 116, 4), ("xp0", 120, 4), ("xp1", 124, 4)):
            d[name] = _bits(word, lo, w)
    elif op in (GEMM, ALU):
        lu, la = lay.lg["uop"], lay.lg["acc"]
        pos = 7
        for name, w in (("reset", 1), ("bgn", lu), ("end", lu + 1), ("iout", 14), ("iin", 14)):
            d[name] = _bits(word, pos, w)
            pos += w
        assert pos <= 64
        ls = lay.lg["inp"] if op == GEMM else la
        pos = 64
        spec = [("dfo", la), ("dfi", la), ("sfo", ls), ("sfi", ls)]
        spec += [("wfo", lay.lg["wgt"]), ("wfi", lay.lg["wgt"])] if op == GEMM else \
            [("aluop", 3), ("use_imm", 1), ("imm", 16)]
        for name, w in spec:
            d[name] = _bits(word, pos, w)
            pos += w
        assert pos <= 128
        if op == ALU:
            d["imm"] = _sext(d["imm"], 16)
            if d["aluop"] > 4:
                raise RefIllegal(index, f"alu opcode {d['aluop']}")
    elif op != FINISH:
        raise RefIllegal(index, f"opcode {op}")
    return d


def _module(d: dict) -> str:
    if d["op"] == STORE:
        return ST
    if d["op"] == LOAD and d["mtype"] in (M_INP, M_WGT):
        return LD
    return CP


def _pops(m, d):
    return {LD: [C2L] * d["pop_next"], ST: [C2S] * d["pop_prev"],
            CP: [L2C] * d["pop_prev"] + [S2C] * d["pop_next"]}[m]


def _pushes(m, d):
    return {LD: [L2C] * d["push_next"], ST: [S2C] * d["push_prev"],
            CP: [C2L] * d["push_prev"] + [C2S] * d["push_next"]}[m]


_BUF_OF = {M_UOP: "uop", M_WGT: "wgt", M_INP: "inp", M_ACC: "acc", M_ACC8: "acc", M_OUT: "out"}


def _static_check(d: dict, lay: RefLayout, dram_size: int) -> None:
    i, op, m = d["index"], d["op"], _module(d)
    if m == LD and (d["pop_prev"] or d["push_prev"]):
        raise RefIllegal(i, "prev flag on load")
    if m == ST and (d["pop_next"] or d["push_next"]):
        raise RefIllegal(i, "next flag on store")
    if op in (LOAD, STORE):
        if op == LOAD and d["mtype"] == M_OUT:
            raise RefIllegal(i, "load OUT")
        if op == STORE and d["mtype"] != M_OUT:
            raise RefIllegal(i, "store non-OUT")
        if op == STORE and (d["yp0"] or d["yp1"] or d["xp0"] or d["xp1"]):
            raise RefIllegal(i, "store pads")
        if d["x"] == 0:
            return
        if op == LOAD:
            rows = (d["yp0"] + d["y"] + d["yp1"]) * (d["xp0"] + d["x"] + d["xp1"])
        else:
            rows = d["y"] * d["x"]
        if rows and d["sram"] + rows - 1 >= lay.depth[_BUF_OF[d["mtype"]]]:
            raise RefIllegal(i, "sram range")
        eb = lay.elem[d["mtype"]]
        for r in range(d["y"]):
            end = (d["dram"] + r * d["stride"] + d["x"]) * eb
            if end > dram_size:
                raise RefIllegal(i, "dram range")
    elif op in (GEMM, ALU):
        if d["end"] > lay.depth["uop"]:
            raise RefIllegal(i, "uop_end")
        if d["bgn"] > d["end"]:
            raise RefIllegal(i, "uop_bgn")


class _Machine:
    def __init__(self, dram: bytearray, lay: RefLayout, check_races: bool):
        self.dram = dram
        self.lay = lay
        self.bufs = {name: {} for name in ("uop", "inp", "wgt", "acc", "out")}
        self.counters = dict.fromkeys((
            "insn_count", "load_insns", "compute_insns", "store_insns", "gemm_insns", "alu_insns",
            "gemm_uops", "alu_uops", "macs", "uop_load_bytes", "inp_load_bytes", "wgt_load_bytes",
            "acc_load_bytes", "acc8_load_bytes", "out_store_bytes",
            "work"), 0)  # work: one per instruction and per micro-op iteration
        self.check_races = check_races
        self.access = {}  # location -> [last write (module, seq) or None, {module: seq of last read}]
        self.cur = None  # (module, seq, vc) of the instruction being executed

    # ---- race detection (vector clocks) -------------------------------------------------

    def _touch(self, loc, write: bool):
        if not self.check_races:
            return
        m, seq, vc = self.cur
        rec = self.access.setdefault(loc, [None, {}])
        last_w, reads = rec
        if last_w and last_w[0] != m and vc[last_w[0]] < last_w[1]:
            raise RefRace(f"{loc}: {m} instruction {self.cur_index} "
                          f"{'writes' if write else 'reads'} after an unordered write by {last_w}")
        if write:
            for rm, rseq in reads.items():
                if rm != m and vc[rm] < rseq:
                    raise RefRace(f"{loc}: {m} instruction {self.cur_index} writes after an "
                                  f"unordered read by {rm} #{rseq}")
            rec[0] = (m, seq)
            rec[1] = {}
        else:
            reads[m] = seq

    def _dram_byte(self, addr: int, write_value=None):
        self._touch(("dram", addr), write_value is not None)
        if write_value is None:
            return self.dram[addr]
        self.dram[addr] = write_value

    def _row(self, buf: str, idx: int, index: int, write: bool = False):
        if not 0 <= idx < self.lay.depth[buf]:
            raise RefIllegal(index, f"{buf} row {idx} out of range")
        if buf in ("inp", "wgt", "out"):
            self._touch((buf, idx), write)

    def _get(self, buf, idx, width):
        return self.bufs[buf].get(idx, [0] * width)

    def raw_buffers(self) -> dict:
        """The buffers as little-endian bytes (numpy only packs the plain ints for comparison)."""
        import numpy as np

        lanes = self.lay.batch * self.lay.block
        out = {}
        for name, dtype, width in (("uop", "<u4", 1), ("inp", "i1", lanes),
                                   ("wgt", "i1", self.lay.block ** 2), ("acc", "<i4", lanes),
                                   ("out", "i1", lanes)):
            arr = np.zeros((self.lay.depth[name], width), dtype)
            for row, value in self.bufs[name].items():
                arr[row] = value
            out[name] = arr.tobytes()
        return out

    # ---- semantics ----------------------------------------------------------------------

    def _element_from_dram(self, mtype: int, e: int) -> list[int]:
        eb = self.lay.elem[mtype]
        raw = [self._dram_byte(e * eb + k) for k in range(eb)]
        if mtype == M_UOP:
            return raw[0] | raw[1] << 8 | raw[2] << 16 | raw[3] << 24
        if mtype == M_ACC:
            return [_sext(raw[4 * k] | raw[4 * k + 1] << 8 | raw[4 * k + 2] << 16 | raw[4 * k + 3] << 24, 32)
                    for k in range(eb // 4)]
        return [_sext(b, 8) for b in raw]  # INP, WGT, ACC_8BIT: int8 each

    def load(self, d: dict):
        mtype, buf = d["mtype"], _BUF_OF[d["mtype"]]
        self.counters[{M_UOP: "uop_load_bytes", M_INP: "inp_load_bytes", M_WGT: "wgt_load_bytes",
                       M_ACC: "acc_load_bytes", M_ACC8: "acc8_load_bytes"}[mtype]] += \
            d["x"] * d["y"] * self.lay.elem[mtype]
        if d["x"] == 0:
            return
        width = {M_UOP: 1, M_INP: self.lay.batch * self.lay.block, M_WGT: self.lay.block ** 2,
                 M_ACC: self.lay.batch * self.lay.block, M_ACC8: self.lay.batch * self.lay.block}[mtype]
        zero = 0 if mtype == M_UOP else [0] * width
        row_w = d["xp0"] + d["x"] + d["xp1"]
        pos = d["sram"]
        for yy in range(d["yp0"] + d["y"] + d["yp1"]):
            r = yy - d["yp0"]
            for xx in range(row_w):
                c = xx - d["xp0"]
                if 0 <= r < d["y"] and 0 <= c < d["x"]:
                    value = self._element_from_dram(mtype, d["dram"] + r * d["stride"] + c)
                else:
                    value = zero
                self._row(buf, pos, d["index"], write=True)
                self.bufs[buf][pos] = value
                pos += 1

    def store(self, d: dict):
        eb = self.lay.elem[M_OUT]
        self.counters["out_store_bytes"] += d["x"] * d["y"] * eb
        for r in range(d["y"]):
            for c in range(d["x"]):
                idx = d["sram"] + r * d["x"] + c
                self._row("out", idx, d["index"])
                row = self._get("out", idx, eb)
                base = (d["dram"] + r * d["stride"] + c) * eb
                for k in range(eb):
                    self._dram_byte(base + k, row[k] & 0xFF)

    def _uop(self, k: int):
        word = self.bufs["uop"].get(k, 0)
        la, li, lw = self.lay.lg["acc"], max(self.lay.lg["acc"], self.lay.lg["inp"]), self.lay.lg["wgt"]
        return _bits(word, 0, la), _bits(word, la, li), _bits(word, la + li, lw)

    def gemm(self, d: dict):
        nb, n = self.lay.batch, self.lay.block
        for i in range(d["iout"]):
            for j in range(d["iin"]):
                for k in range(d["bgn"], d["end"]):
                    dst, src, wgt = self._uop(k)
                    a = dst + i * d["dfo"] + j * d["dfi"]
                    s = src + i * d["sfo"] + j * d["sfi"]
                    w = wgt + i * d["wfo"] + j * d["wfi"]
                    self.counters["work"] += 1
                    self._row("acc", a, d["index"], write=True)
                    if d["reset"]:
                        new = [0] * (nb * n)
                    else:
                        self._row("inp", s, d["index"])
                        self._row("wgt", w, d["index"])
                        inp = self._get("inp", s, nb * n)
                        wg = self._get("wgt", w, n * n)
                        old = self._get("acc", a, nb * n)
                        new = []
                        for b in range(nb):
                            for o in range(n):
                                total = old[b * n + o]
                                for c in range(n):
                                    total += inp[b * n + c] * wg[o * n + c]
                                new.append(_wrap32(total))
                        self.counters["gemm_uops"] += 1
                        self.counters["macs"] += nb * n * n
                    self.bufs["acc"][a] = new
                    self._row("out", a, d["index"], write=True)
                    self.bufs["out"][a] = [_low8(v) for v in new]

    def alu(self, d: dict):
        lanes = self.lay.batch * self.lay.block
        for i in range(d["iout"]):
            for j in range(d["iin"]):
                for k in range(d["bgn"], d["end"]):
                    dst, src, _ = self._uop(k)
                    a = dst + i * d["dfo"] + j * d["dfi"]
                    s = src + i * d["sfo"] + j * d["sfi"]
                    self.counters["work"] += 1
                    self._row("acc", a, d["index"], write=True)
                    x = self._get("acc", a, lanes)
                    if d["use_imm"]:
                        ys = [d["imm"]] * lanes
                    else:
                        self._row("acc", s, d["index"])
                        ys = self._get("acc", s, lanes)
                    new = [self._alu_lane(d["aluop"], xv, yv) for xv, yv in zip(x, ys)]
                    self.bufs["acc"][a] = new
                    self._row("out", a, d["index"], write=True)
                    self.bufs["out"][a] = [_low8(v) for v in new]
                    self.counters["alu_uops"] += 1

    @staticmethod
    def _alu_lane(op, x, y):
        if op == A_MIN:
            return x if x < y else y
        if op == A_MAX:
            return x if x > y else y
        if op == A_ADD:
            return _wrap32(x + y)
        if op == A_MUL:
            return _wrap32(x * y)
        if y >= 0:  # SHR
            return x >> min(y, 31)
        return _wrap32(x << min(-y, 31))

    def execute(self, d: dict, module: str):
        c = self.counters
        c["insn_count"] += 1
        c["work"] += 1
        c[{LD: "load_insns", CP: "compute_insns", ST: "store_insns"}[module]] += 1
        self.cur_index = d["index"]
        op = d["op"]
        if op == LOAD:
            self.load(d)
        elif op == STORE:
            self.store(d)
        elif op == GEMM:
            c["gemm_insns"] += 1
            self.gemm(d)
        elif op == ALU:
            c["alu_insns"] += 1
            self.alu(d)


def run_reference(dram, insn_addr: int, insn_count: int, cfg, *, schedule_seed: int | None = None,
                  check_races: bool = True, state: dict | None = None):
    """Run a program image; returns (final DRAM as bytes, counters). Raises RefIllegal,
    RefDeadlock or (with check_races) RefRace. If ``state`` is a dict, it receives the final
    on-chip buffers as raw little-endian bytes (uop, inp, wgt, acc, out)."""
    lay = RefLayout.of(cfg)
    mem = bytearray(bytes(dram))
    if insn_addr % 16 or insn_addr < 0:
        raise RefIllegal(None, "misaligned program")
    if insn_count < 1 or insn_addr + 16 * insn_count > len(mem):
        raise RefIllegal(None, "program outside DRAM")
    words = [int.from_bytes(mem[insn_addr + 16 * i:insn_addr + 16 * i + 16], "little")
             for i in range(insn_count)]
    insns = [_decode(w, lay, i) for i, w in enumerate(words)]
    for d in insns:
        if d["op"] == FINISH and d["index"] != insn_count - 1:
            raise RefIllegal(d["index"] + 1, "after FINISH")
        _static_check(d, lay, len(mem))
    if insns[-1]["op"] != FINISH:
        raise RefIllegal(insn_count - 1, "no FINISH at the end")

    machine = _Machine(mem, lay, check_races)
    rng = random.Random(schedule_seed) if schedule_seed is not None else None
    modules = [_module(d) for d in insns]
    cmdq = {m: deque() for m in MODULES}
    tokens = {q: deque() for q in (L2C, C2L, C2S, S2C)}
    pending = {m: [] for m in MODULES}
    vc = {m: {mm: 0 for mm in MODULES} for m in MODULES}
    pc = 0

    def enabled():
        acts = []
        if pc < insn_count and len(cmdq[modules[pc]]) < lay.cmd_depth:
            acts.append(("fetch", None))
        for m in MODULES:
            if pending[m]:
                if all(len(tokens[q]) < lay.tok_depth for q in pending[m]):
                    acts.append(("push", m))
            elif cmdq[m] and all(tokens[q] for q in _pops(m, insns[cmdq[m][0]])):
                acts.append(("start", m))
        return acts

    while True:
        acts = enabled()
        if not acts:
            if pc == insn_count and not any(cmdq.values()) and not any(pending.values()):
                if state is not None:
                    state.update(machine.raw_buffers())
                return bytes(mem), machine.counters
            waiting = []
            for m in MODULES:
                if pending[m]:
                    waiting.append((m, None, "full " + ",".join(pending[m])))
                elif cmdq[m]:
                    d = insns[cmdq[m][0]]
                    waiting.append((m, d["index"], "empty " + ",".join(
                        q for q in _pops(m, d) if not tokens[q])))
            if pc < insn_count:
                waiting.append(("fetch", pc, f"full {modules[pc]} command queue"))
            raise RefDeadlock(waiting)
        kind, m = rng.choice(acts) if rng else acts[0]
        if kind == "fetch":
            cmdq[modules[pc]].append(pc)
            pc += 1
        elif kind == "push":
            for q in pending[m]:
                tokens[q].append(dict(vc[m]))
            pending[m] = []
        else:
            d = insns[cmdq[m].popleft()]
            for q in _pops(m, d):
                tv = tokens[q].popleft()
                for mm in MODULES:
                    vc[m][mm] = max(vc[m][mm], tv[mm])
            vc[m][m] += 1
            machine.cur = (m, vc[m][m], dict(vc[m]))
            machine.execute(d, m)
            pending[m] = _pushes(m, d)
