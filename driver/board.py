"""The board executor: a board top (fpga/board.py) driven over its UART host link with the
same Executor interface as fsim, the cycle model and the RTL (docs/board.md).

``--target board:PORT``: PORT is a serial device (``/dev/ttyUSB0``; the ULX3S's FTDI
port) or ``socket:HOST:PORT`` (the Verilator board of fpga/board_sim.py, or a serial line
exposed over TCP). The serial port is opened with the standard library's termios (raw
mode, 8N1, no flow control), so no pyserial is needed; that is POSIX only.

Every read waits at most ``timeout`` seconds (plus the line time of the bytes it waits
for), and a run at most ``run_timeout`` seconds, so a board that is absent, unprogrammed
or stuck is a one-line error, never a hang. A request the board received corrupted
(answered BAD_SUM) is sent again, up to ``retries`` times, and so is a read whose answer
arrived corrupted; a corrupted answer to a write is an error (it is not known whether the
write happened).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time

import numpy as np

from celosia.config import HwConfig
from celosia.errors import CelosiaError, SimulationLimitError
from celosia.fpga.protocol import (SYNC_RSP, STATUS_TEXT, Cmd, Status, config_id,
                                   reply_length, request)
from celosia.sim.base import Executor, make_executor

__all__ = ["BoardExecutor", "BoardError", "BoardTimeoutError", "BoardLink", "open_link",
           "make_any_executor", "BLOCK"]

#: bytes per MEM_WRITE / MEM_READ request
BLOCK = 1024
_ZERO_RUN = 63 * BLOCK  # bytes per MEM_ZERO request (LEN is 16 bits)


class BoardError(CelosiaError):
    """The board answered wrongly, or its link failed."""


class BoardTimeoutError(BoardError):
    """The board did not answer in time."""


class BoardLink:
    """A byte stream to a board: ``write(bytes)``, ``read(n, deadline)``, ``drain()``."""

    def __init__(self, port: str, *, baud: int = 115200):
        self.port = port
        self.baud = baud
        self.byte_time = 10.0 / baud  # seconds per byte on the line (0 for a socket)
        self._sock = None
        self._fd = None
        if port.startswith("socket:"):
            host, _, num = port[len("socket:"):].rpartition(":")
            try:
                self._sock = socket.create_connection((host or "127.0.0.1", int(num)), timeout=5)
            except (OSError, ValueError) as exc:
                raise BoardError(f"cannot connect to the board at {port}: {exc}; is the "
                                 f"simulated board (python -m celosia.fpga.board_sim) "
                                 f"running there?") from None
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.setblocking(False)
            self.byte_time = 0.0
        else:
            self._open_serial(port, baud)

    def _open_serial(self, port: str, baud: int) -> None:
        import termios
        import tty

        speed = getattr(termios, f"B{baud}", None)
        if speed is None:
            raise BoardError(f"the serial port cannot be set to {baud} baud (termios has no "
                             f"B{baud}); use a standard rate such as 115200")
        try:
            fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as exc:
            raise BoardError(f"cannot open the board's serial port {port}: {exc.strerror}; "
                             f"check the cable and the device name (ls /dev/ttyUSB*), and "
                             f"that you may use it (the dialout group)") from None
        try:
            tty.setraw(fd)
            attrs = termios.tcgetattr(fd)
            attrs[4] = attrs[5] = speed
            attrs[2] &= ~(termios.CSTOPB | termios.PARENB | getattr(termios, "CRTSCTS", 0))
            attrs[2] |= termios.CLOCAL | termios.CREAD | termios.CS8
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
            termios.tcflush(fd, termios.TCIOFLUSH)
        except termios.error as exc:
            os.close(fd)
            raise BoardError(f"{port} is not a serial port ({exc})") from None
        self._fd = fd

    def fileno(self) -> int:
        return self._sock.fileno() if self._sock is not None else self._fd

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            select.select([], [self.fileno()], [], 5.0)
            try:
                n = (self._sock.send(view) if self._sock is not None
                     else os.write(self._fd, view))
            except BlockingIOError:
                continue
            except OSError as exc:
                raise BoardError(f"writing to the board at {self.port} failed: {exc}") from None
            view = view[n:]

    def read(self, n: int, deadline: float) -> bytes:
        """Exactly ``n`` bytes, or BoardTimeoutError once ``deadline`` (monotonic) passes."""
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BoardTimeoutError(f"{len(out)} of {n} bytes")
            ready, _, _ = select.select([self.fileno()], [], [], left)
            if not ready:
                continue
            try:
                chunk = (self._sock.recv(n - len(out)) if self._sock is not None
                         else os.read(self._fd, n - len(out)))
            except BlockingIOError:
                continue
            except OSError as exc:
                raise BoardError(f"reading from the board at {self.port} failed: {exc}") from None
            if not chunk:
                raise BoardError(f"the board at {self.port} closed the connection")
            out += chunk
        return bytes(out)

    def drain(self) -> int:
        """Drop bytes already waiting (a late answer to an earlier request)."""
        dropped = 0
        while select.select([self.fileno()], [], [], 0)[0]:
            try:
                chunk = (self._sock.recv(65536) if self._sock is not None
                         else os.read(self._fd, 65536))
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            dropped += len(chunk)
        return dropped

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_link(port: str, baud: int = 115200) -> BoardLink:
    return BoardLink(port, baud=baud)


class BoardExecutor(Executor):
    """Runs program images on a board top over its UART link (docs/board.md).

    Options: ``port`` (required), ``baud`` (serial ports; the bitstream's rate, 115200 by
    default), ``timeout`` (seconds a request waits for its answer, beyond the line time of
    its bytes), ``run_timeout`` (seconds a program may run), ``retries`` (sending a
    request again after a corrupted transfer), ``precheck`` (check the program's static
    rules on the host first, so that errors name the same instruction as fsim; it reads
    the program back). ``dram_size`` None (default) uses the board's whole RAM.
    """

    name = "board"
    models_time = True

    def __init__(self, config: HwConfig, dram_size: int | None = None, *, port: str,
                 baud: int = 115200, timeout: float = 2.0, run_timeout: float = 60.0,
                 retries: int = 2, precheck: bool = True, link: BoardLink | None = None):
        if not isinstance(port, str) or not port:
            raise CelosiaError(f"the board target needs a port (board:/dev/ttyUSB0 or "
                               f"board:socket:HOST:PORT), not {port!r}")
        for name, value in (("timeout", timeout), ("run_timeout", run_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise CelosiaError(f"the board target's {name} must be a positive number of "
                                   f"seconds, not {value!r}")
        self.port, self.timeout, self.run_timeout = port, float(timeout), float(run_timeout)
        self.retries, self.precheck = int(retries), precheck
        self.config = config
        self.link = link or BoardLink(port, baud=baud)
        try:
            info = self._transact(Cmd.INFO)
        except BaseException:
            self.link.close()
            raise
        self.ram_bytes, board_id = struct.unpack("<II", info)
        if board_id != config_id(config):
            self.link.close()
            raise BoardError(
                f"the board at {port} was built for another configuration (id {board_id:08x}, "
                f"this one's is {config_id(config):08x}): build and load its bitstream with "
                f"`celosia fpga build --board ulx3s-85f --config CFG`, or pass the board's "
                f"configuration")
        if dram_size is None:
            dram_size = self.ram_bytes
        if isinstance(dram_size, (int, np.integer)) and not isinstance(dram_size, bool) \
                and dram_size > self.ram_bytes:
            self.link.close()
            raise BoardError(
                f"a DRAM of {int(dram_size)} bytes was asked for (the program image or "
                f"dram_size), but the board at {port} has {self.ram_bytes} bytes of RAM: use "
                f"dram_size <= {self.ram_bytes} (Device's default for a board), or a board top "
                f"with more RAM (celosia fpga build --ram-kib)")
        super().__init__(config, dram_size)

    def close(self) -> None:
        self.link.close()

    def __del__(self):
        link = getattr(self, "link", None)
        if link is not None:
            link.close()

    # ---- the protocol ------------------------------------------------------------------

    def _transact(self, cmd: int, addr: int = 0, length: int = 0,
                  payload: bytes = b"") -> bytes:
        frame = request(cmd, addr, length, payload)
        want = reply_length(cmd, length)
        line = self.link.byte_time * (len(frame) + want + 3)
        idempotent = not (cmd == Cmd.REG_WRITE and addr == 0)  # a second start is not
        for attempt in range(self.retries + 1):
            if attempt:  # let the rest of a corrupted answer arrive, then drop it
                time.sleep(0.05 + line)
            self.link.drain()
            self.link.write(frame)
            deadline = time.monotonic() + self.timeout + 2 * line
            try:
                head = self.link.read(2, deadline)
                if head[0] != SYNC_RSP:
                    problem = f"a reply that does not start with 0x{SYNC_RSP:02x} ({head.hex()})"
                else:
                    status = head[1]
                    data = self.link.read(want if status == Status.OK else 0, deadline)
                    tail = self.link.read(1, deadline)
                    if (status + sum(data) + tail[0]) & 0xFF:
                        problem = "a reply with a bad checksum"
                    elif status == Status.BAD_SUM:
                        problem = "a bad checksum on its side (the request arrived corrupted)"
                    elif status != Status.OK:
                        raise BoardError(
                            f"the board at {self.port} refused {_CMD_NAMES.get(cmd, cmd)} "
                            f"(address 0x{addr:x}, {length} bytes): "
                            f"{STATUS_TEXT.get(status, f'status {status}')}")
                    else:
                        return data
            except BoardTimeoutError as exc:
                raise BoardTimeoutError(
                    f"the board at {self.port} did not answer within "
                    f"{self.timeout + 2 * line:.3g} s ({_CMD_NAMES.get(cmd, cmd)}, got {exc}): "
                    f"check that it is powered, programmed with the celosia bitstream "
                    f"(celosia fpga build --board ulx3s-85f) and connected"
                    + (f" at {self.link.baud} baud" if self.link.byte_time else "")) from None
            if not idempotent and problem.startswith("a reply"):
                break
        raise BoardError(f"the board at {self.port} sent {problem} "
                         f"({_CMD_NAMES.get(cmd, cmd)}, {attempt + 1} tries): check the cable "
                         f"and that both ends use the same baud rate")

    def reg_read(self, name: str) -> int:
        from celosia.hw.regs import reg

        r = reg(name)
        value = struct.unpack("<I", self._transact(Cmd.REG_READ, r.offset))[0]
        if r.width == 64:
            value |= struct.unpack("<I", self._transact(Cmd.REG_READ, r.offset + 4))[0] << 32
        return value

    def reg_write(self, name: str, value: int) -> None:
        from celosia.hw.regs import reg

        r = reg(name)
        for half in range(r.width // 32):
            word = (value >> (32 * half)) & 0xFFFFFFFF
            self._transact(Cmd.REG_WRITE, r.offset + 4 * half, 4, struct.pack("<I", word))

    # ---- Executor ----------------------------------------------------------------------

    def write_dram(self, addr: int, data) -> None:
        """Blocks of BLOCK bytes; runs of all-zero blocks go as MEM_ZERO requests."""
        raw = np.frombuffer(memoryview(np.ascontiguousarray(data)).cast("B"), np.uint8)
        self._check_range(addr, raw.size)
        zero_from = None  # start of a run of zero blocks not sent yet

        def flush_zeros(end):
            start = zero_from
            while start is not None and start < end:
                n = min(end - start, _ZERO_RUN)
                self._transact(Cmd.MEM_ZERO, addr + start, n)
                start += n

        for off in range(0, raw.size, BLOCK):
            chunk = raw[off:off + BLOCK]
            if not chunk.any():
                zero_from = off if zero_from is None else zero_from
                continue
            flush_zeros(off)
            zero_from = None
            self._transact(Cmd.MEM_WRITE, addr + off, chunk.size, chunk.tobytes())
        flush_zeros(raw.size)

    def read_dram(self, addr: int, nbytes: int) -> np.ndarray:
        self._check_range(addr, nbytes)
        out = np.empty(nbytes, np.uint8)
        for off in range(0, nbytes, BLOCK):
            n = min(BLOCK, nbytes - off)
            out[off:off + n] = np.frombuffer(self._transact(Cmd.MEM_READ, addr + off, n),
                                             np.uint8)
        return out

    def run(self, insn_addr: int, insn_count: int) -> dict:
        if self.precheck:
            from celosia.isa import INSN_BYTES
            from celosia.sim.fsim import load_program

            shadow = np.zeros(self.dram_size, np.uint8)
            if insn_count >= 1 and 0 <= insn_addr and \
                    insn_addr + insn_count * INSN_BYTES <= self.dram_size:
                n = insn_count * INSN_BYTES
                shadow[insn_addr:insn_addr + n] = self.read_dram(insn_addr, n)
            load_program(shadow, insn_addr, insn_count, self.config)
        self.reg_write("insn_count", insn_count)
        self.reg_write("insn_addr", insn_addr)
        self.reg_write("dram_size", self.dram_size)
        self.reg_write("control", 1)
        deadline = time.monotonic() + self.run_timeout
        pause = 0.0005
        while not self.reg_read("control") & 2:
            if time.monotonic() > deadline:
                raise SimulationLimitError(
                    f"the program on the board at {self.port} did not finish within "
                    f"{self.run_timeout:g} s (run_timeout; {self.reg_read('cycles')} cycles so "
                    f"far; {self._where()}): raise run_timeout, or reset the board if it is "
                    f"stuck")
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        code = self.reg_read("error_code")
        if code:
            self._raise(code)
        return self.counters()


def _borrow():
    """The RTL executor's readers of the register file: the same registers, so the same
    counters, error reports and deadlock reports."""
    from celosia.sim.rtl import RtlSimulator

    for name in ("counters", "_module_status", "_where", "_raise", "_deadlock_report"):
        setattr(BoardExecutor, name, getattr(RtlSimulator, name))


_borrow()

_CMD_NAMES = {Cmd.INFO: "INFO", Cmd.REG_WRITE: "REG_WRITE", Cmd.REG_READ: "REG_READ",
              Cmd.MEM_WRITE: "MEM_WRITE", Cmd.MEM_READ: "MEM_READ", Cmd.MEM_ZERO: "MEM_ZERO"}


def make_any_executor(target: str, config: HwConfig, dram_size: int | None, **options):
    """``make_executor`` (sim/base.py) plus ``board:PORT``. ``dram_size`` None: the board's
    RAM for a board, 64 MiB for a simulator."""
    if isinstance(target, str) and target.startswith("board:"):
        return BoardExecutor(config, dram_size, port=target[len("board:"):], **options)
    return make_executor(target, config, 64 << 20 if dram_size is None else dram_size,
                         **options)
