"""The board top under Verilator, its UART bridged to a TCP socket: a board for the board
executor (``--target board:socket:HOST:PORT``) without a board.

    python -m celosia.fpga.board_sim --config small [--divisor 4] [--ram-kib N] [--port P]

builds (or takes from the cache) the Verilated board top (fpga/board.py: the same module a
bitstream is made of, with a UART divisor fit for simulation) and the harness
(fpga/board_harness/board_harness.cpp, which models the host's side of the UART), prints
``listening on HOST:PORT`` and serves connections one after another until it is ended.
``BoardSimulation`` does the same from Python (a subprocess; tests use it).

Builds are cached under ``$CELOSIA_CACHE/board`` (default ``~/.cache/celosia/board``),
keyed on the sources, the configuration, the RAM size, the divisor and Verilator.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from celosia.config import HwConfig
from celosia.errors import CelosiaError

__all__ = ["build_board_library", "BoardSimulation", "SIM_DIVISOR", "main"]

_HARNESS = Path(__file__).parent / "board_harness" / "board_harness.cpp"
TOP = "celosia_board"
#: clocks per UART bit under Verilator: the fastest the receiver takes
SIM_DIVISOR = 4


def _cache_dir() -> Path:
    base = os.environ.get("CELOSIA_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "celosia") / "board"


def _key(cfg: HwConfig, ram_bytes: int, divisor: int) -> str:
    import amaranth

    import celosia
    import celosia.hw
    from celosia.sim.rtl import verilator_root

    h = hashlib.sha256()
    here = Path(__file__).parent
    sources = sorted(Path(celosia.hw.__file__).parent.glob("*.py"))
    sources += [here / n for n in ("board.py", "bridge.py", "uart.py", "protocol.py",
                                   "board_sim.py")]
    sources += [Path(celosia.__file__).parent / n for n in ("config.py", "isa.py")]
    sources.append(_HARNESS)
    for path in sources:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(cfg.to_json().encode())
    h.update((verilator_root() / "__init__.py").read_bytes())
    h.update(f"amaranth={amaranth.__version__} ram={ram_bytes} div={divisor}".encode())
    return h.hexdigest()[:20]


def build_board_library(cfg: HwConfig, ram_bytes: int, divisor: int = SIM_DIVISOR,
                        jobs: int | None = None) -> Path:
    """The harness library of the board top for (cfg, ram_bytes, divisor), built if not
    cached."""
    from amaranth.back import verilog

    from celosia.sim.rtl import _run, verilator_root

    from .board import BoardTop

    key = _key(cfg, ram_bytes, divisor)
    out_dir = _cache_dir() / key
    lib = out_dir / "libcelosia_board.so"
    if lib.exists():
        return lib
    root = verilator_root()
    text = verilog.convert(BoardTop(cfg, ram_bytes=ram_bytes, divisor=divisor), name=TOP,
                           emit_src=False)
    _cache_dir().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=_cache_dir()))
    try:
        (work / "board.v").write_text(text)
        shutil.copy(_HARNESS, work / _HARNESS.name)
        env = dict(os.environ, VERILATOR_ROOT=str(root))
        env.pop("CXXFLAGS", None)
        jobs = jobs or 1
        cmd = [str(root / "bin" / "verilator"), "--cc", "board.v", "--top-module", TOP,
               "--Mdir", "obj", "--build", "-j", str(jobs), "-Wno-fatal", "-Wno-lint",
               "-Wno-style", "-O3", "--x-assign", "fast", "--x-initial", "fast",
               "--noassert", "-MAKEFLAGS", "OPT_FAST=-O2", "-MAKEFLAGS", "OPT_SLOW=-O1",
               "-MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include", "-CFLAGS", "-fPIC"]
        _run(cmd, work, env)
        obj = work / "obj"
        link = [os.environ.get("CXX", "g++"), "-shared", "-fPIC", "-O2", "-std=c++17",
                f"-I{obj}", f"-I{root / 'include'}", f"-I{root / 'include' / 'vltstd'}",
                _HARNESS.name, str(obj / f"V{TOP}__ALL.a"), str(obj / "libverilated.a"),
                "-o", lib.name, "-lpthread", "-latomic"]
        _run(link, work, env)
        final = work / "final"
        final.mkdir()
        shutil.move(str(work / lib.name), final / lib.name)
        (final / "board.v").write_text(text)
        try:
            os.rename(final, out_dir)
        except OSError:
            if not lib.exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return lib


def serve(cfg: HwConfig, ram_bytes: int, divisor: int, host: str, port: int,
          connections: int = 0) -> int:
    lib = build_board_library(cfg, ram_bytes, divisor)
    dll = ctypes.CDLL(str(lib))
    dll.board_create.argtypes = [ctypes.c_uint]
    dll.board_create.restype = ctypes.c_void_p
    dll.board_listen.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint)]
    dll.board_listen.restype = ctypes.c_int
    dll.board_serve.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
    dll.board_serve.restype = ctypes.c_int
    handle = dll.board_create(divisor)
    bound = ctypes.c_uint(0)
    fd = dll.board_listen(host.encode(), port, ctypes.byref(bound))
    if fd < 0:
        raise CelosiaError(f"cannot listen on {host}:{port}: {os.strerror(ctypes.get_errno())}")
    print(f"listening on {host}:{bound.value}", flush=True)
    return dll.board_serve(handle, fd, connections)


class BoardSimulation:
    """The simulated board in a subprocess; ``target`` is the Device target reaching it.

    ``with BoardSimulation(cfg) as sim: Device(cfg, target=sim.target)``. The first use of a
    (configuration, RAM, divisor) builds the Verilator model (a minute or two)."""

    def __init__(self, cfg: HwConfig | str = "small", *, ram_bytes: int | None = None,
                 divisor: int = SIM_DIVISOR, build_timeout: float = 900.0):
        from .board import board, check_fit, ram_bytes_for

        self.config = HwConfig.load(cfg)
        spec = board("ulx3s-85f")
        self.ram_bytes = ram_bytes or ram_bytes_for(self.config, spec)
        check_fit(self.config, self.ram_bytes, spec)
        build_board_library(self.config, self.ram_bytes, divisor)  # here, not in the child
        cmd = [sys.executable, "-m", "celosia.fpga.board_sim", "--config", "-",
               "--ram-bytes", str(self.ram_bytes), "--divisor", str(divisor), "--port", "0"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.proc.stdin.write(self.config.to_json())
        self.proc.stdin.close()
        deadline = time.monotonic() + build_timeout
        line = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                break
        if not line.startswith("listening on "):
            self.close()
            raise CelosiaError(f"the simulated board did not start (got {line!r})")
        self.address = line.split()[-1]
        self.target = f"board:socket:{self.address}"

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None and proc.stdout:
            proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m celosia.fpga.board_sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small",
                   help="a preset, a JSON file, or - (JSON on standard input)")
    p.add_argument("--ram-bytes", type=int, help="board RAM (default: what fits the ULX3S-85F)")
    p.add_argument("--divisor", type=int, default=SIM_DIVISOR, help="UART clocks per bit")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--connections", type=int, default=0,
                   help="stop after this many connections (default: never)")
    args = p.parse_args(argv)
    try:
        from .board import board, check_fit, ram_bytes_for

        cfg = (HwConfig.from_dict(json.loads(sys.stdin.read())) if args.config == "-"
               else HwConfig.load(args.config))
        spec = board("ulx3s-85f")
        ram = args.ram_bytes or ram_bytes_for(cfg, spec)
        check_fit(cfg, ram, spec)
        return serve(cfg, ram, args.divisor, args.host, args.port, args.connections)
    except CelosiaError as exc:
        print(f"celosia board_sim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
