"""Seeded mutation fuzzers of program images, for tests/fuzz.

Valid images come from tests/sim/programs.py's random race-free programs (:func:`base_images`,
made once per configuration). :func:`mutate_image` applies one to three mutations to a copy:
instruction words (bit flips, one field set to an edge value, loop counts blown up,
dependency flags), micro-op words, DRAM bytes, insn_addr and insn_count, the DRAM's size,
and instructions spliced. :func:`write_mutated_file` writes an image as a file a user might
hand over, valid or not: members with other dtypes, shapes and scalar values (NaN, Inf,
fractions, strings, bools, arrays), members missing, extra, renamed or not ``.npy``, the zip
truncated or with bytes flipped, and files of other kinds (an ``.npy``, text, empty, a
directory).

Every case is a function of its seed, so a failure names the seed that reproduces it.
"""

from __future__ import annotations

import io
import random
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from celosia import HwConfig
from celosia.isa import INSN_BYTES, insn_layout
from programs import random_program

__all__ = ["Case", "CONFIGS", "base_images", "mutate_image", "write_mutated_file", "make_case"]

CONFIGS = {"small": HwConfig.preset("small"), "default": HwConfig()}
_BASES = 8  # valid programs per configuration


@dataclass
class Case:
    """A (possibly invalid) image: DRAM bytes, where the program is, and what was done."""

    config: str
    dram: np.ndarray
    insn_addr: int
    insn_count: int
    what: list

    def describe(self) -> str:
        return f"config {self.config}, mutations: {'; '.join(self.what) or 'none'}"


@lru_cache(maxsize=None)
def base_images(config: str) -> tuple:
    """Valid images (dram, insn_addr, insn_count) of ``config``, made once: random programs
    (every instruction kind, odd shapes, tokens) and the driver's tiled GEMM and conv2d
    workloads (the tensorized GEMMs of real layers, requantizing ALU epilogues)."""
    cfg = CONFIGS[config]
    images = [random_program(cfg, 7000 + seed, n_body=12 + 4 * seed).image
              for seed in range(_BASES)]
    images += _workload_images(cfg)
    return tuple((img.dram, img.insn_addr, img.insn_count) for img in images)


def _workload_images(cfg: HwConfig) -> list:
    from celosia.benchmarks.workloads import conv2d_requant, gemm_requant
    from celosia.driver import Device

    rng = np.random.default_rng(1)
    bk = cfg.block
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, build in enumerate([
            lambda dev: gemm_requant(dev, rng.integers(-128, 128, (2 * bk, 4 * bk), np.int8),
                                     rng.integers(-128, 128, (3 * bk, 4 * bk), np.int8), 9),
            lambda dev: conv2d_requant(dev, rng.integers(-128, 128, (cfg.batch, bk, 6, 6),
                                                         np.int8),
                                       rng.integers(-128, 128, (2 * bk, bk, 3, 3), np.int8), 1, 8),
        ]):
            dev = Device(cfg, target="fsim", dram_size=1 << 20)
            build(dev)
            out.append(dev.save_image(Path(tmp) / f"workload{k}.npz"))
    return out


# ---- instruction-level mutations ---------------------------------------------------------


def _word(case: Case, index: int) -> int:
    a = case.insn_addr + index * INSN_BYTES
    return int.from_bytes(case.dram[a:a + INSN_BYTES].tobytes(), "little")


def _put_word(case: Case, index: int, word: int) -> None:
    a = case.insn_addr + index * INSN_BYTES
    case.dram[a:a + INSN_BYTES] = np.frombuffer(word.to_bytes(INSN_BYTES, "little"), np.uint8)


def _fields(cfg: HwConfig, word: int) -> dict:
    lay = insn_layout(cfg)
    op = word & 7
    return lay.mem if op in (0, 1) else lay.alu if op == 4 else lay.gemm


def _set_field(word: int, pos: int, width: int, value: int) -> int:
    mask = ((1 << width) - 1) << pos
    return (word & ~mask) | ((value << pos) & mask)


def _edge(rng: random.Random, width: int, current: int) -> int:
    top = (1 << width) - 1
    return rng.choice([0, 1, top, top - 1, rng.randrange(top + 1), current + 1, current - 1,
                       1 << rng.randrange(width), current * 2]) & top


def _program_indices(case: Case) -> list[int]:
    """Indices of the program's instructions that lie inside the DRAM."""
    n = (case.dram.size - case.insn_addr) // INSN_BYTES if case.insn_addr >= 0 else 0
    return list(range(max(0, min(case.insn_count, n))))


def _insn_bits(rng, case, cfg):
    idx = _program_indices(case)
    if not idx:
        return "no instruction to flip"
    i = rng.choice(idx)
    word = _word(case, i)
    bits = [rng.randrange(128) for _ in range(rng.randint(1, 4))]
    for b in bits:
        word ^= 1 << b
    _put_word(case, i, word)
    return f"instruction {i}: bits {bits} flipped"


def _insn_field(rng, case, cfg):
    idx = _program_indices(case)
    if not idx:
        return "no instruction to change"
    i = rng.choice(idx)
    word = _word(case, i)
    fields = _fields(cfg, word)
    name = rng.choice(sorted(fields))
    pos, width = fields[name]
    value = _edge(rng, width, (word >> pos) & ((1 << width) - 1))
    _put_word(case, i, _set_field(word, pos, width, value))
    return f"instruction {i}: {name}={value}"


def _loop_blowup(rng, case, cfg):
    """Large loop counts (and often zero factors): long runs and repeated rows."""
    loops = [i for i in _program_indices(case) if _word(case, i) & 7 in (2, 4)]
    if not loops:
        return "no GEMM/ALU to blow up"
    i = rng.choice(loops)
    word = _word(case, i)
    lay = _fields(cfg, word)
    changes = []
    for name in ("iter_out", "iter_in"):
        if rng.random() < 0.7:
            value = rng.choice([1 << rng.randint(4, 14), rng.randrange(1 << 14), (1 << 14) - 1])
            word = _set_field(word, *lay[name], value)
            changes.append(f"{name}={value}")
    for name in ("dst_factor_out", "dst_factor_in", "src_factor_out", "src_factor_in"):
        if rng.random() < 0.4:
            word = _set_field(word, *lay[name], 0)
            changes.append(f"{name}=0")
    _put_word(case, i, word)
    return f"instruction {i}: {', '.join(changes) or 'unchanged'}"


def _deps(rng, case, cfg):
    idx = _program_indices(case)
    if not idx:
        return "no instruction for a flag"
    i = rng.choice(idx)
    bit = rng.randrange(3, 7)
    _put_word(case, i, _word(case, i) ^ (1 << bit))
    return f"instruction {i}: dependency bit {bit} flipped"


def _uop_regions(case: Case, cfg: HwConfig) -> list[tuple[int, int]]:
    """DRAM byte ranges that LOAD UOP instructions of the program read."""
    lay = insn_layout(cfg).mem
    regions = []
    for i in _program_indices(case):
        w = _word(case, i)
        get = lambda name: (w >> lay[name][0]) & ((1 << lay[name][1]) - 1)  # noqa: E731
        if w & 7 == 0 and get("mem_type") == 0 and get("x_size"):
            start = get("dram_base") * 4
            end = start + 4 * ((max(get("y_size"), 1) - 1) * get("x_stride") + get("x_size"))
            if 0 <= start < min(end, case.dram.size):
                regions.append((start, min(end, case.dram.size)))
    return regions


def _uop_word(rng, case, cfg):
    regions = _uop_regions(case, cfg)
    if not regions:
        return "no micro-ops to change"
    start, end = rng.choice(regions)
    a = start + 4 * rng.randrange(max(1, (end - start) // 4))
    word = int.from_bytes(case.dram[a:a + 4].tobytes(), "little")
    lay = insn_layout(cfg).uop
    if rng.random() < 0.5:
        name = rng.choice(sorted(lay))
        pos, width = lay[name]
        word = _set_field(word, pos, width, _edge(rng, width, (word >> pos) & ((1 << width) - 1)))
        what = f"micro-op at byte {a}: {name} changed"
    else:
        word ^= 1 << rng.randrange(32)
        what = f"micro-op at byte {a}: a bit flipped"
    case.dram[a:a + 4] = np.frombuffer((word & 0xFFFFFFFF).to_bytes(4, "little"), np.uint8)
    return what


def _dram_bytes(rng, case, cfg):
    if case.dram.size == 0:
        return "empty DRAM"
    a = rng.randrange(case.dram.size)
    n = min(rng.choice([1, 4, 16, 64, 512]), case.dram.size - a)
    fill = rng.choice(["zero", "ones", "random"])
    if fill == "random":
        case.dram[a:a + n] = np.frombuffer(rng.randbytes(n), np.uint8)
    else:
        case.dram[a:a + n] = 0 if fill == "zero" else 255
    return f"DRAM bytes [{a}, {a + n}) set to {fill}"


def _insn_addr(rng, case, cfg):
    case.insn_addr = rng.choice([
        case.insn_addr + 16, case.insn_addr - 16, case.insn_addr + rng.randint(1, 15), 0,
        -16, case.dram.size, case.dram.size - 16, 16 * rng.randrange(case.dram.size // 16 + 1)])
    return f"insn_addr={case.insn_addr}"


def _insn_count(rng, case, cfg):
    room = (case.dram.size - case.insn_addr) // INSN_BYTES
    case.insn_count = rng.choice([case.insn_count - 1, case.insn_count + 1, 0, -1, 1, room,
                                  room + 1, rng.randint(1, 3 * max(case.insn_count, 1)), 1 << 40])
    return f"insn_count={case.insn_count}"


def _resize(rng, case, cfg):
    size = rng.choice([case.dram.size // 2, case.dram.size - 1, case.dram.size + 1,
                       case.dram.size + 4096, 16, 1])
    new = np.zeros(max(size, 0), np.uint8)
    n = min(size, case.dram.size)
    new[:n] = case.dram[:n]
    case.dram = new
    return f"DRAM resized to {size} bytes"


def _splice(rng, case, cfg):
    idx = _program_indices(case)
    if len(idx) < 2:
        return "too few instructions to splice"
    i, j = rng.sample(idx, 2)
    wi, wj = _word(case, i), _word(case, j)
    kind = rng.choice(["swap", "copy"])
    _put_word(case, i, wj)
    if kind == "swap":
        _put_word(case, j, wi)
    return f"instructions {i} and {j}: {kind}"


_MUTATIONS = [(_insn_bits, 3), (_insn_field, 5), (_loop_blowup, 3), (_deps, 2), (_uop_word, 3),
              (_dram_bytes, 2), (_insn_addr, 1), (_insn_count, 1), (_resize, 1), (_splice, 2)]


def mutate_image(rng: random.Random, config: str) -> Case:
    """A copy of one of ``config``'s base images with one to three mutations."""
    dram, addr, count = rng.choice(base_images(config))
    case = Case(config, dram.copy(), addr, count, [])
    funcs, weights = zip(*_MUTATIONS)
    for _ in range(rng.choice([1, 1, 2, 3])):
        case.what.append(rng.choices(funcs, weights)[0](rng, case, CONFIGS[config]))
    if rng.random() < 0.08:  # decoded with another configuration's field layout
        case.config = rng.choice([c for c in CONFIGS if c != config])
        case.what.append(f"run with the {case.config} configuration")
    return case


def make_case(seed: int) -> Case:
    """The executor case of a seed: a configuration, then mutations (1 in 16 unmutated)."""
    rng = random.Random(seed)
    config = rng.choice(sorted(CONFIGS))
    if rng.random() < 1 / 16:
        dram, addr, count = rng.choice(base_images(config))
        return Case(config, dram.copy(), addr, count, [])
    return mutate_image(rng, config)


# ---- file-level mutations ----------------------------------------------------------------


def _scalar_variant(rng: random.Random, value: int):
    return rng.choice([
        lambda: np.int64(value), lambda: np.int64(value).astype(np.int32),
        lambda: np.uint64(max(value, 0)), lambda: np.float64(value),
        lambda: np.float64("nan"), lambda: np.float64("inf"), lambda: np.float64("-inf"),
        lambda: np.float64(value + 0.5), lambda: np.float32(1e30), lambda: np.float64(-0.0),
        lambda: np.bool_(True), lambda: np.str_(str(value)), lambda: np.bytes_(b"12"),
        lambda: np.complex128(value), lambda: np.array([value]), lambda: np.array([value] * 2),
        lambda: np.array([], np.int64), lambda: np.array([[value]]), lambda: np.int8(-1),
        lambda: np.uint64(2**64 - 1), lambda: np.array([value], dtype=object),
        lambda: np.array(value, dtype=">i8"),
    ])()


def _dram_variant(rng: random.Random, dram: np.ndarray):
    return rng.choice([
        lambda: dram, lambda: dram.view(np.int8), lambda: dram[:dram.size // 4 * 4].view(np.int32),
        lambda: dram.astype(np.float32), lambda: dram.astype(bool), lambda: dram.reshape(1, -1),
        lambda: dram[:0], lambda: np.uint8(7), lambda: dram.astype(">u2"),
        lambda: dram.astype(object), lambda: dram[:16].astype("U1"),
    ])()


def _npy_bytes(value) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value, allow_pickle=True)
    return buf.getvalue()


def _members(rng: random.Random, case: Case) -> tuple[dict, list]:
    """({member name: bytes} of an image, some members varied; what was varied)."""
    dram = case.dram
    values = {"dram": dram, "insn_addr": np.int64(case.insn_addr),
              "insn_count": np.int64(min(max(case.insn_count, -2**63), 2**63 - 1))}
    what = []
    roll = rng.random()
    if roll < 0.15:
        values["dram"] = _dram_variant(rng, dram)
        what.append(f"dram as {values['dram'].dtype}{list(np.shape(values['dram']))}")
    elif roll < 0.45:
        name = rng.choice(["insn_addr", "insn_count"])
        values[name] = _scalar_variant(rng, int(values[name]))
        what.append(f"{name} as {values[name]!r}")
    members = {f"{k}.npy": _npy_bytes(v) for k, v in values.items()}
    roll = rng.random()
    name = rng.choice(sorted(members))
    if roll < 0.06:
        del members[name]
        what.append(f"{name} left out")
    elif roll < 0.10:
        members["extra.npy"] = _npy_bytes(np.arange(3))
        what.append("an extra member")
    elif roll < 0.13:  # a member without the .npy suffix (np.load accepts it too)
        members[name[:-4]] = members.pop(name)
        what.append(f"{name} without .npy")
    elif roll < 0.16:
        members[name] = rng.randbytes(rng.randint(0, 64))
        what.append(f"{name} random bytes")
    elif roll < 0.19:
        members[name] = members[name][:rng.randrange(len(members[name]) + 1)]
        what.append(f"{name} truncated")
    return members, what


def _zip_bytes(rng: random.Random, members: dict) -> bytes:
    buf = io.BytesIO()
    method = rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def write_mutated_file(rng: random.Random, case: Case, path: Path) -> str:
    """Write ``case`` to ``path`` as a user might, valid or not; returns what was done."""
    kind = rng.choices(["npz", "bytes", "other"], [70, 20, 10])[0]
    if kind == "other":
        other = rng.choice(["npy", "text", "empty", "random", "directory", "pickle"])
        if other == "npy":
            path.write_bytes(_npy_bytes(case.dram))
        elif other == "text":
            path.write_text("dram insn_addr insn_count\n1 2 3\n")
        elif other == "empty":
            path.write_bytes(b"")
        elif other == "random":
            path.write_bytes(rng.randbytes(rng.randint(1, 300)))
        elif other == "directory":
            path.mkdir()
        else:
            path.write_bytes(_npy_bytes(np.array([{"dram": 1}], dtype=object)))
        return f"file: {other}"
    members, what = _members(rng, case)
    data = _zip_bytes(rng, members)
    what = f"file: npz{' (' + ', '.join(what) + ')' if what else ''}"
    if kind == "bytes":
        b = bytearray(data)
        how = rng.choice(["truncate", "flip", "append", "prepend"])
        if how == "truncate":
            b = b[:rng.randrange(len(b))]
        elif how == "flip":
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif how == "append":
            b += rng.randbytes(rng.randint(1, 64))
        else:
            b = bytearray(rng.randbytes(rng.randint(1, 64))) + b
        data = bytes(b)
        path.write_bytes(data)
        return f"{what}, bytes {how}"
    path.write_bytes(data)
    return what
