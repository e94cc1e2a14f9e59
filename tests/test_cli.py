"""The `celosia` command line: exec, disasm, config, bench, demo, and its error handling."""

import json
import subprocess
import sys

import numpy as np
import pytest

from celosia.benchmarks.workloads import gemm_requant, gemm_requant_reference
from celosia.cli import main
from celosia.driver import Device
from celosia.image import ProgramImage
from celosia.isa import MemInsn, MemType, Opcode, FinishInsn, encode_program
from celosia.sim.base import run_image
from celosia.sim.datapath import DEFAULT_MAX_WORK


@pytest.fixture(scope="module")
def gemm_image(tmp_path_factory):
    """A driver-built GEMM program saved as an image, with its expected output."""
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (32, 64), dtype=np.int8)
    w = rng.integers(-128, 128, (48, 64), dtype=np.int8)
    dev = Device("default", dram_size=1 << 20)
    workload = gemm_requant(dev, a, w, 10)
    path = tmp_path_factory.mktemp("img") / "gemm.npz"
    dev.save_image(path)
    out_addr = workload.buffers[-1].addr
    return path, out_addr, gemm_requant_reference(a, w, 10)


def test_exec_fsim_writes_dram_and_stats(gemm_image, tmp_path, capsys):
    path, out_addr, want = gemm_image
    assert main(["exec", str(path), "--target", "fsim", "--out", str(tmp_path / "o.npz"),
                 "--stats", str(tmp_path / "s.json")]) == 0
    dram = np.load(tmp_path / "o.npz")["dram"]
    got = dram[out_addr:out_addr + want.size].view(np.int8)
    # Output blocks are (row, column block, BLOCK): unpack to (rows, N).
    got = got.reshape(32, 3, 16).reshape(32, 48)
    np.testing.assert_array_equal(got, want)
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["target"] == "fsim"
    assert stats["macs"] == 32 * 48 * 64
    assert stats["gemm_uops"] == 32 * 3 * 4
    for key in ("insn_count", "alu_uops", "inp_load_bytes", "wgt_load_bytes", "out_store_bytes"):
        assert key in stats
    assert "ran on fsim" in capsys.readouterr().out


def test_exec_matches_run_image(gemm_image, tmp_path):
    path = gemm_image[0]
    dram, _ = run_image(ProgramImage.load(path), "fsim")
    main(["exec", str(path), "--out", str(tmp_path / "o.npz"), "-q"])
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["dram"], dram)


def _illegal_image(tmp_path):
    from celosia import HwConfig
    cfg = HwConfig()
    insns = [MemInsn(opcode=Opcode.LOAD, mem_type=MemType.INP, sram_base=2040, x_size=16,
                     y_size=1, x_stride=16), FinishInsn()]
    dram = np.zeros(4096, np.uint8)
    dram[:32] = encode_program(insns, cfg)
    path = tmp_path / "bad.npz"
    ProgramImage(dram, 0, 2).save(path)
    return path


def test_exec_illegal_program_is_one_line_without_traceback(tmp_path):
    path = _illegal_image(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "celosia.cli", "exec", str(path), "--out",
                           str(tmp_path / "o.npz")], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "instruction 0" in lines[0] and "INP buffer" in lines[0]
    assert "Traceback" not in proc.stderr


def test_exec_missing_image_and_unknown_target(tmp_path, capsys):
    assert main(["exec", str(tmp_path / "nope.npz"), "--out", str(tmp_path / "o.npz")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["exec", str(_illegal_image(tmp_path)), "--max-cycles", "10",
                 "--out", str(tmp_path / "o.npz")]) == 2
    assert "timed targets" in capsys.readouterr().err


def _runaway_image(tmp_path):
    """Issue #18: an ALU with both loop extents 8192 on one ACC row (67M updates)."""
    from celosia import HwConfig
    from celosia.isa import AluInsn, Uop, encode_uops

    cfg = HwConfig()
    insns = [MemInsn(opcode=Opcode.LOAD, mem_type=MemType.UOP, dram_base=16, x_size=1,
                     y_size=1, x_stride=1),
             AluInsn(uop_bgn=0, uop_end=1, iter_out=8192, iter_in=8192, use_imm=True, imm=1),
             FinishInsn()]
    dram = np.zeros(128, np.uint8)
    dram[:48] = encode_program(insns, cfg)
    dram[64:68] = encode_uops([Uop(0, 0)], cfg).view(np.uint8)
    path = tmp_path / "runaway.npz"
    ProgramImage(dram, 0, 3).save(path)
    return path


@pytest.mark.parametrize("target", ["fsim", "cycle"])
def test_exec_work_limit(tmp_path, capsys, target):
    path = _runaway_image(tmp_path)
    out = str(tmp_path / "o.npz")
    assert main(["exec", str(path), "--target", target, "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("celosia exec: error: instruction 1: ALU of 67,108,864 micro-op "
                          "iterations") and "--max-work N" in err and "\n" not in err
    assert main(["exec", str(path), "--target", target, "--out", out, "--max-work", "100"]) == 2
    assert "past max_work=100;" in capsys.readouterr().err
    assert main(["exec", str(path), "--target", target, "--out", out, "--max-work", "0"]) == 2
    assert "--max-work must be a positive integer, not 0" in capsys.readouterr().err


def test_exec_limit_options_per_target(tmp_path, capsys):
    path = _runaway_image(tmp_path)
    out = str(tmp_path / "o.npz")
    assert main(["exec", str(path), "--target", "fsim", "--max-cycles", "5", "--out", out]) == 2
    assert "fsim has no cycles: bound its work with --max-work N" in capsys.readouterr().err
    assert main(["exec", str(path), "--target", "rtl", "--max-work", "5", "--out", out]) == 2
    assert "bound the rtl target with --max-cycles N" in capsys.readouterr().err
    help_text = build_parser_help()
    assert "--max-work N" in help_text and f"{DEFAULT_MAX_WORK}" in help_text


def build_parser_help() -> str:
    from celosia.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices["exec"]
    return " ".join(sub.format_help().split())


def test_exec_unwritable_output_is_one_line(gemm_image, tmp_path, capsys):
    path = gemm_image[0]
    assert main(["exec", str(path), "--out", str(tmp_path / "no" / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("celosia exec: error: cannot write --out ") and err.count("\n") == 1


@pytest.mark.parametrize("command", ["exec", "disasm"])
def test_bad_image_files_are_one_line(tmp_path, capsys, command):
    """The image loader's failures of issue #18 (NaN, Inf and text insn_count, a plain .npy)."""
    dram = np.zeros(64, np.uint8)
    cases = {"nan": np.float64("nan"), "inf": np.float64("inf"), "text": np.str_("2")}
    for name, count in cases.items():
        np.savez(tmp_path / f"{name}.npz", dram=dram, insn_addr=np.int64(0), insn_count=count)
    np.save(tmp_path / "plain.npy", dram)
    for name in [*cases, "plain"]:
        path = tmp_path / (f"{name}.npz" if name in cases else "plain.npy")
        argv = [command, str(path)] + (["--out", str(tmp_path / "o.npz")] if command == "exec" else [])
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"celosia {command}: error: {path}: ") and err.count("\n") == 1


def test_disasm(gemm_image, capsys):
    assert main(["disasm", str(gemm_image[0])]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].strip().endswith("FINISH")
    assert any("GEMM" in line for line in lines) and any("STORE" in line for line in lines)


def test_config_show_formats(tmp_path, capsys):
    assert main(["config", "show"]) == 0
    assert "1 x 16 x 16" in capsys.readouterr().out
    assert main(["config", "show", "--config", "small", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["log_block"] == 2
    assert main(["config", "show", "--format", "vta"]) == 0
    vta = json.loads(capsys.readouterr().out)
    assert vta["LOG_BLOCK"] == 4 and vta["LOG_ACC_BUFF_SIZE"] == 17
    cfg = tmp_path / "vta_config.json"
    cfg.write_text(json.dumps({**vta, "LOG_BLOCK": 3, "LOG_INP_BUFF_SIZE": 14,
                               "LOG_WGT_BUFF_SIZE": 16, "LOG_ACC_BUFF_SIZE": 16,
                               "TARGET": "sim", "HW_VER": "0.0.2"}))
    assert main(["config", "show", "--config", str(cfg)]) == 0
    assert "1 x 8 x 8" in capsys.readouterr().out
    cfg.write_text(json.dumps({"LOG_INP_WIDTH": 4}))
    assert main(["config", "show", "--config", str(cfg)]) == 2
    assert "log_inp_width" in capsys.readouterr().err


def test_bench_list_and_quick_run(tmp_path, capsys):
    assert main(["bench", "--list"]) == 0
    assert "fsim" in capsys.readouterr().out
    out = tmp_path / "b.json"
    assert main(["bench", "fsim", "--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["metrics"]["gemm256_gmacs_per_s_cold"] > 0
    assert result["metrics"]["conv56_gmacs_per_s_warm"] > 0
    assert result["machine"]["cores"] >= 1
    assert main(["bench", "nope"]) == 2


def test_demo(tmp_path, capsys):
    """The README's main job: the digits CNN, int8 on the cycle model, against fp32."""
    assert main(["demo", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "int8 accelerator vs int8 all-CPU build of the same graph: bit-exact" in out
    assert "Softmax left in float: the quantizer has no int8 form" in out
    report = json.loads((tmp_path / "demo.json").read_text())
    acc = report["accuracy"]
    assert acc["fp32_cpu"] >= 0.97 and acc["int8_accelerator"] >= acc["fp32_cpu"] - 0.01
    assert acc["fp32_onnxruntime"] == pytest.approx(acc["fp32_cpu"], abs=0.003)
    assert report["int8_bit_exact_vs_cpu"] and report["summary"]["cycles"] > 0
    assert {r["node"] for r in report["nodes"] if r["target"] == "accel"} == \
        {"conv1", "conv2", "conv3", "flatten", "fc"}  # the Flatten: a view, no program
    assert (tmp_path / "demo_timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_exec_cycle_with_trace_and_timeline(gemm_image, tmp_path):
    path = gemm_image[0]
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["exec", str(path), "--target", "cycle", "--out", str(tmp_path / "o.npz"),
                 "--stats", str(tmp_path / "s.json"), "--trace", str(trace),
                 "--timeline", str(png), "-q"]) == 0
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["cycles"] > 0 and 0 < stats["gemm_utilization"] <= 1
    assert json.loads(trace.read_text())["traceEvents"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    fsim_dram, _ = run_image(ProgramImage.load(path), "fsim")
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["dram"], fsim_dram)


def test_workloads_align_weights_to_their_element_size():
    """A conv whose input size is not a multiple of 256 bytes still places its weights on a
    WGT element boundary."""
    from celosia.benchmarks.workloads import conv2d_requant, conv2d_requant_reference
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (1, 32, 6, 6), dtype=np.int8)
    k = rng.integers(-128, 128, (32, 32, 3, 3), dtype=np.int8)
    dev = Device("default", dram_size=1 << 20)
    workload = conv2d_requant(dev, x, k, 1, 8)
    dev.synchronize()
    np.testing.assert_array_equal(workload.result(), conv2d_requant_reference(x, k, 1, 8))
