"""The host link of a board top (docs/board.md): a framed protocol over a UART.

Shared by the RTL (fpga/bridge.py) and the host (driver/board.py); plain Python, no
Amaranth. Every multi-byte field is little-endian.

Request (host -> board)::

    0xA5  CMD  ADDR[4]  LEN[2]  PAYLOAD[LEN if CMD is a write, else 0]  SUM

Reply (board -> host)::

    0x5A  STATUS  DATA[n if STATUS == OK, else 0]  SUM

``SUM`` makes the bytes after the sync byte add up to 0 modulo 256 (the sync byte is not
counted). Commands:

==========  ====  ============================================  ==========================
command     CMD   request                                       reply DATA
==========  ====  ============================================  ==========================
INFO        0x00  ADDR = 0, LEN = 0                             RAM bytes u32, config id u32
REG_WRITE   0x01  ADDR = register byte offset, LEN = 4, value    (none)
REG_READ    0x02  ADDR = register byte offset, LEN = 0           value u32
MEM_WRITE   0x03  ADDR = byte address, LEN = n (1..65535), n B   (none)
MEM_READ    0x04  ADDR = byte address, LEN = n (1..65535)        n bytes
MEM_ZERO    0x06  ADDR = byte address, LEN = n (1..65535)        (none)
==========  ====  ============================================  ==========================

MEM_ZERO writes n zero bytes (one per clock) after its checksum is checked: the host sends
runs of zeros in a DRAM image this way instead of byte by byte.

A request that breaks a rule is answered with a non-zero STATUS (below) and no DATA; the
payload of a write is always consumed, so the link stays in step. A REG_WRITE acts only
after its checksum is checked; a MEM_WRITE writes bytes as they arrive, so a MEM_WRITE
answered BAD_SUM may have written some of them (the host sends it again). A gap of
``GAP_BYTE_TIMES`` byte times inside a request drops it without an answer (the board
then waits for a sync byte again), so a host that lost its place recovers by waiting.
"""

from __future__ import annotations

import struct
import zlib

__all__ = ["SYNC_REQ", "SYNC_RSP", "Cmd", "Status", "STATUS_TEXT", "checksum", "request",
           "config_id", "MAX_BLOCK", "GAP_BYTE_TIMES", "WRITE_CMDS", "reply_length"]

SYNC_REQ = 0xA5
SYNC_RSP = 0x5A
MAX_BLOCK = 0xFFFF
#: a request whose bytes stop for this many byte times is dropped by the board
GAP_BYTE_TIMES = 256


class Cmd:
    INFO = 0x00
    REG_WRITE = 0x01
    REG_READ = 0x02
    MEM_WRITE = 0x03
    MEM_READ = 0x04
    MEM_ZERO = 0x06


#: commands whose request carries LEN payload bytes (odd command codes)
WRITE_CMDS = (Cmd.REG_WRITE, Cmd.MEM_WRITE)


class Status:
    OK = 0
    BAD_SUM = 1      # the request's checksum is wrong
    BAD_CMD = 2      # unknown command, or a LEN the command does not allow
    BUSY = 3         # a memory access while the accelerator runs
    RANGE = 4        # memory past the board's RAM, or a register offset out of the map


STATUS_TEXT = {
    Status.BAD_SUM: "the request arrived corrupted (bad checksum)",
    Status.BAD_CMD: "unknown command or bad length",
    Status.BUSY: "memory access while the accelerator is running",
    Status.RANGE: "address outside the board's RAM or register map",
}


def checksum(data: bytes) -> int:
    """The byte that makes ``data`` plus it sum to 0 modulo 256."""
    return -sum(data) & 0xFF


def request(cmd: int, addr: int = 0, length: int = 0, payload: bytes = b"") -> bytes:
    """One request frame."""
    body = struct.pack("<BIH", cmd, addr, length) + payload
    return bytes([SYNC_REQ]) + body + bytes([checksum(body)])


def reply_length(cmd: int, length: int) -> int:
    """Bytes of DATA in an OK reply to (cmd, LEN)."""
    return {Cmd.INFO: 8, Cmd.REG_READ: 4, Cmd.MEM_READ: length}.get(cmd, 0)


def config_id(config) -> int:
    """32 bits that identify a hardware configuration (CRC-32 of its JSON): the board
    reports the id of the configuration it was built for (INFO)."""
    return zlib.crc32(config.to_json().encode()) & 0xFFFFFFFF
