"""`celosia sweep` (celosia/sweep): the spec's checks, the rows against the cycle model, the
engines giving identical rows, resume, dead workers, the outputs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest

from celosia.cli import main
from celosia.config import HwConfig
from celosia.sweep import SpecError, parse_spec, run_sweep
from celosia.sweep.resources import analytic, fit
from celosia.sweep.results import pareto_front
from celosia.sweep.task import CRASH_ENV

# 8 configurations x 2 small layers around the ecp5 preset (1x8x8): a few seconds.
SMALL = """
[base]
preset = "ecp5"
[space]
log_block = [3, 4]
bus_bytes = {start = 8, stop = 16, factor = 2}
dram_latency = [16, 32]
[workloads]
layers = ["conv:7x7x32->32:k3:s1", "conv:8x8x16->32:k1:s2"]
[constraints]
part = "xc7z020"
"""


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CELOSIA_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _rows(out):
    rows = pq.read_table(out / "results.parquet").to_pylist()
    for r in rows:
        # the point's wall and CPU time: the columns that are the machine's, not the design's
        r.pop("eval_s"), r.pop("eval_cpu_s")
    return rows


# ---- the spec -----------------------------------------------------------------------------


def _with(change: str) -> str:
    """SMALL with the table ``change`` starts with replaced by ``change``."""
    table = change.split("\n")[0]
    sections = ["[" + s for s in SMALL.split("\n[")[1:]]
    kept = [s for s in sections if s.split("\n")[0] != table]
    return "\n".join(kept) + "\n" + change + "\n"


@pytest.mark.parametrize("change, key, reason", [
    ("[space]\nlog_blok = [3]", "space.log_blok", "unknown key"),
    ("[spaces]\nlog_block = [3]", "'spaces'", "unknown table"),
    ("[space]\nlog_block = [3, 7]", "space.log_block[1] = 7", "between 1 and 6"),
    ("[space]\nbus_bytes = [8, 12]", "space.bus_bytes[1] = 12", "power of two"),
    ("[space]\nlog_uop_buff_size = [15, 24]", "space.log_uop_buff_size[1]", "sram_base"),
    ("[space]\nbus_bytes = []", "space.bus_bytes", "empty list"),
    ("[space]\ndram_latency = {start = 32, stop = 16, step = 8}", "space.dram_latency",
     "empty"),
    ("[space]\ndram_latency = {start = 8, stop = 16, stride = 8}", "space.dram_latency",
     "unknown range key 'stride'"),
    ("[space]\nlog_inp_width = [4]", "space.log_inp_width[0]", "8-bit inputs"),
    ("[workloads]\nlayers = ['resnet18-conv:12']", "workloads.layers[0]", "resnet18-conv:2"),
    ("[workloads]\nlayers = ['conv:7x7->3']", "workloads.layers[0]", "not a layer"),
    ("[workloads]\nmodels = ['resnet19']", "workloads.models[0]", "no zoo model"),
    ("[workloads]\nonnx = ['missing.onnx']", "workloads.onnx[0]", "no such file"),
    ("[workloads]\n", "workloads.layers", "no workload"),
    ("[constraints]\npart = 'xc7z045'", "constraints.part", "unknown FPGA part"),
    ("[constraints]\nmax_luts = 5", "constraints.max_luts", "unknown key"),
    ("[objectives]\nminimize = ['utilization']", "objectives.minimize", "maximized"),
    ("[search]\nmethod = 'random'", "search.n", "needs n"),
    ("[search]\nmethod = 'anneal'", "search.method", "methods are grid, random, optuna"),
    ("[search]\nmethod = 'optuna'", "search.n", "needs n"),
    ("[base]\npreset = 'huge'", "base.preset", "unknown preset"),
])
def test_invalid_spec_names_key_and_reason(change, key, reason):
    with pytest.raises(SpecError) as info:
        parse_spec(_with(change))
    assert key in str(info.value) and reason in str(info.value), str(info.value)


def test_invalid_spec_is_rejected_before_any_work(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(SMALL.replace("dram_latency = [16, 32]", "dram_latency = [16, -1]"))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "space.dram_latency[1] = -1" in err and "between 0 and" in err
    assert not (tmp_path / "out").exists()


def test_grid_and_random_points():
    spec = parse_spec(SMALL)
    grid = spec.configs()
    assert len(grid) == 8 == spec.grid_size
    assert grid[0] == {"log_block": 3, "bus_bytes": 8, "dram_latency": 16}
    assert len({json.dumps(p, sort_keys=True) for p in grid}) == 8
    rnd = parse_spec(SMALL + "[search]\nmethod = 'random'\nn = 5\nseed = 3\n")
    picks = rnd.configs()
    assert len(picks) == 5 and all(p in grid for p in picks)
    assert len({json.dumps(p, sort_keys=True) for p in picks}) == 5
    assert picks == rnd.configs()  # the seed decides
    assert parse_spec(SMALL + "[search]\nmethod = 'random'\nn = 50\n").configs() == grid


def test_analytic_resources_match_the_synthesised_cores():
    """docs/fpga.md's measured figures that the estimate is built to reproduce."""
    small, default = HwConfig.preset("small"), HwConfig.preset("default")
    assert analytic(default, "xc7z020") == {"lut": 20485, "ff": 19414, "bram": 137, "dsp": 179}
    assert analytic(small, "lfe5u-85f") == {"lut": 14092, "ff": 7635, "bram": 15, "dsp": 30}
    d = analytic(default, "lfe5u-85f")
    assert (d["dsp"], d["bram"]) == (306, 274)
    assert fit(d, "lfe5u-85f") == (False, "dsp 306 > 156; bram 274 > 208")
    # the ecp5 preset's multipliers: 64 products + 3 x 8 ALU lanes (+ 2)
    assert analytic(HwConfig.preset("ecp5"), "lfe5u-85f")["dsp"] == 90
    # less buffer, less BRAM; fewer MACs, fewer LUT
    smaller = replace(default, log_inp_buff_size=14)
    assert analytic(smaller, "xc7z020")["bram"] < analytic(default, "xc7z020")["bram"]
    assert analytic(small, "xc7z020")["lut"] < analytic(default, "xc7z020")["lut"]


def test_pareto_front():
    pts = [(1, 5), (2, 3), (2, 4), (3, 3), (4, 1), (5, 1)]
    assert pareto_front(pts) == [0, 1, 4]


# ---- running sweeps -----------------------------------------------------------------------


def test_rows_are_the_cycle_model_of_each_configuration(tmp_path):
    """Every row's cycles are what the compiled layer gives on the cycle model (a Device
    with target "cycle", what `celosia run --target cycle` runs programs on) with the
    schedule the row names, and its utilisation is the layer's own MACs per cycle."""
    from celosia.compiler.accel.ops import ConvKnobs
    from celosia.compiler.accel.tune import measure_conv
    from celosia.sweep.workloads import conv_specs

    spec = parse_spec(SMALL)
    summary = run_sweep(spec, tmp_path / "out", workers=2, progress=False)
    rows = _rows(tmp_path / "out")
    assert len(rows) == 16 and summary["status"] == {"ok": 16}
    for r in rows:
        cfg = HwConfig.from_dict({k: r[k] for k in HwConfig().to_dict()})
        w = next(w for w in spec.workloads if w.name == r["workload"])
        real, padded = conv_specs(cfg, w.params)
        stats = measure_conv(cfg, padded, ConvKnobs(**json.loads(r["schedule"])))
        assert r["cycles"] == stats["cycles"] > 0
        assert r["dram_read_bytes"] == stats["dram_read_bytes"]
        assert r["macs"] == real.macs
        assert r["utilization"] == pytest.approx(real.macs / (r["cycles"] * cfg.macs_per_cycle))
        assert r["latency_ms"] == pytest.approx(r["cycles"] / (cfg.clock_mhz * 1e3))
        # the stall breakdown: compute's busy and stall cycles are within the run
        assert 0 < r["compute_busy_cycles"] <= r["cycles"]
        assert r["resource_source"] == "analytic" and r["fits"] and r["feasible"]
    # the outputs
    out = tmp_path / "out"
    s = json.loads((out / "summary.json").read_text())
    assert s["points"] == 16 and s["configurations"] == 8 and s["pareto_front"]
    assert s["default"]["config"] == {"log_block": 3, "bus_bytes": 8, "dram_latency": 32}
    assert (out / "pareto.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "Pareto front" in report and "| log_block | bus_bytes | dram_latency |" in report
    # the front: no feasible configuration beats a front member on both area and latency
    for f in s["pareto_front"]:
        for c in [c for c in summary["pareto_front"]]:
            assert not (c["area"] < f["area"] and c["latency_ms"] < f["latency_ms"])


def test_local_and_ray_give_identical_rows(tmp_path):
    pytest.importorskip("ray")
    spec = parse_spec(SMALL)
    run_sweep(spec, tmp_path / "local", engine="local", workers=2, progress=False)
    run_sweep(spec, tmp_path / "ray", engine="ray", workers=2, progress=False)
    local, ray = _rows(tmp_path / "local"), _rows(tmp_path / "ray")
    assert len(local) == 16 and local == ray


def test_limit_then_resume_gives_the_same_rows(tmp_path):
    spec = parse_spec(SMALL)
    run_sweep(spec, tmp_path / "full", workers=2, progress=False)
    out = tmp_path / "part"
    first = run_sweep(spec, out, workers=2, limit=5, progress=False)
    assert first["points"] == 5
    with pytest.raises(Exception, match="--resume"):
        run_sweep(spec, out, workers=2, progress=False)
    # a killed run's torn last line is ignored
    with open(out / "rows.jsonl", "a") as f:
        f.write('{"key": "torn')
    second = run_sweep(spec, out, workers=2, resume=True, progress=False)
    assert second["this_run"]["skipped_done"] == 5 and second["this_run"]["evaluated"] == 11
    rows = _rows(out)
    assert len({r["key"] for r in rows}) == len(rows) == 16
    assert rows == _rows(tmp_path / "full")
    again = run_sweep(spec, out, workers=2, resume=True, progress=False)
    assert again["this_run"]["evaluated"] == 0 and _rows(out) == rows
    # the schedule searches are kept in DIR and shipped to the workers
    assert len(list((out / "cache").glob("*/tune/conv-*.json"))) == 16
    # another spec cannot resume this directory
    with pytest.raises(Exception, match="spec differs"):
        run_sweep(parse_spec(SMALL.replace("[16, 32]", "[16, 24]")), out, resume=True,
                  progress=False)


def test_dead_worker_loses_only_its_point(tmp_path, monkeypatch):
    text = SMALL.replace("log_block = [3, 4]", "log_block = [3]")
    spec = parse_spec(text)
    # dies once: retried, and the row is as good as any
    monkeypatch.setenv(CRASH_ENV, f"conv:8x8x16->32:k1:s2@{tmp_path / 'marker'}")
    run_sweep(spec, tmp_path / "once", workers=2, progress=False)
    assert (tmp_path / "marker").exists()
    monkeypatch.delenv(CRASH_ENV)
    run_sweep(spec, tmp_path / "clean", workers=2, progress=False)
    assert _rows(tmp_path / "once") == _rows(tmp_path / "clean")
    # dies every time: that workload's points are failed rows, the others are fine
    monkeypatch.setenv(CRASH_ENV, "conv:8x8x16->32:k1:s2")
    summary = run_sweep(spec, tmp_path / "always", workers=2, progress=False)
    rows = _rows(tmp_path / "always")
    assert summary["status"] == {"ok": 4, "failed": 4}
    for r in rows:
        if r["workload"] == "conv:8x8x16->32:k1:s2":
            assert r["status"] == "failed" and "died" in r["reason"] and r["cycles"] is None
        else:
            assert r["status"] == "ok" and r["cycles"] > 0


def test_points_that_cannot_run_are_rows_with_their_reason(tmp_path):
    text = """
[base]
preset = "ecp5"
[space]
log_block = [3, 4]
log_wgt_buff_size = [9, 16, 18]
[workloads]
layers = ["conv:7x7x32->32:k3:s1"]
[constraints]
part = "lfe5u-85f"
max_latency_ms = 0.05
"""
    summary = run_sweep(parse_spec(text), tmp_path / "out", workers=2, progress=False)
    rows = {(r["log_block"], r["log_wgt_buff_size"]): r for r in _rows(tmp_path / "out")}
    assert len(rows) == 6
    # 1x8x8 with 256 KiB of weights: its GEMM fields need 68 bits (valid with 1x16x16)
    r = rows[(3, 18)]
    assert r["status"] == "invalid_config" and "more than 64" in r["reason"]
    assert r["cycles"] is None and not r["feasible"]
    # 1x16x16 on the LFE5U-85F: too many multipliers, not simulated
    for wgt in (9, 16, 18):
        r = rows[(4, wgt)]
        assert r["status"] == "does_not_fit" and "dsp 306 > 156" in r["reason"]
        assert r["cycles"] is None and not r["feasible"]
    # a 512-byte weight buffer (8 rows of 8x8) cannot hold one 3x3 kernel's 9 blocks: no
    # schedule fits
    r = rows[(3, 9)]
    assert r["status"] == "compile_failed" and "no schedule" in r["reason"], r["reason"]
    assert r["cycles"] is None and not r["feasible"]
    ok = rows[(3, 16)]
    assert ok["status"] == "ok" and ok["cycles"] > 0
    assert ok["feasible"] == (ok["latency_ms"] <= 0.05)
    if not ok["feasible"]:
        assert "latency_ms" in ok["violations"]
    assert summary["status"] == {"does_not_fit": 3, "compile_failed": 1, "ok": 1,
                                 "invalid_config": 1}


def test_cli_sweep_and_model_workload_against_celosia_run(tmp_path, capsys):
    """A zoo model's row: its cycles equal what `celosia run --target cycle` reports for
    the same quantized model (same calibration feeds) at that configuration."""
    import onnx

    from celosia.models.registry import entry

    spec = tmp_path / "s.toml"
    spec.write_text("""
[space]
bus_bytes = [8, 16]
[workloads]
models = ["small_cnn"]
""")
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "2", "-q"]) == 0
    assert "2 points evaluated" in capsys.readouterr().out
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    e = entry("small_cnn")
    onnx.save(e.model("small"), tmp_path / "m.onnx")
    samples = [e.make_feeds("small", seed=s) for s in range(6)]
    np.savez(tmp_path / "calib.npz", **{k: np.concatenate([s[k] for s in samples])
                                        for k in samples[0]})
    np.savez(tmp_path / "x.npz", **e.make_feeds("small", seed=100))
    for r in rows:
        cfg = tmp_path / f"cfg{r['bus_bytes']}.json"
        cfg.write_text(json.dumps({k: r[k] for k in HwConfig().to_dict()}))
        report = tmp_path / f"report{r['bus_bytes']}.json"
        assert main(["run", str(tmp_path / "m.onnx"), "--target", "cycle", "--quantize",
                     "int8", "--calibration", str(tmp_path / "calib.npz"), "--config",
                     str(cfg), "--input", str(tmp_path / "x.npz"), "--report",
                     str(report)]) == 0
        want = json.loads(report.read_text())["summary"]
        assert r["cycles"] == want["cycles"] > 0
        assert r["macs"] == want["macs"] and r["accel_nodes"] == want["accel_nodes"]


def test_synthesis_report_replaces_the_estimate():
    """With --synth a point's resources (and Fmax) are the synthesis report's; a failed
    synthesis falls back to the estimate and says why. (The real Yosys run takes minutes:
    here the report is given, as the driver gives it from DIR/cache.)"""
    from celosia.sweep.task import run_point
    from celosia.sweep.workloads import Workload

    cfg = HwConfig.preset("ecp5")
    w = Workload("conv:8x8x16->16:k1:s1", "conv", dict(h=8, w=8, c=16, o=16, k=1, stride=1,
                                                          pad=0))
    payload = {"key": "k", "config": cfg.to_dict(), "workload": w, "part": "lfe5u-85f",
               "constraints": {"fits": True, "min_fmax_mhz": 100}}
    report = {"part": "LFE5U-85F", "lut": 30000, "ff": 9000, "bram": 120, "dsp": 90,
              "fits": True, "fmax_mhz": 87.5}
    row = run_point({**payload, "synth": report})["row"]
    assert (row["lut"], row["ff"], row["bram"], row["dsp"]) == (30000, 9000, 120, 90)
    assert row["resource_source"] == "yosys (lfe5u-85f)" and row["fmax_mhz"] == 87.5
    assert row["status"] == "ok" and not row["feasible"]
    assert row["violations"] == "fmax_mhz 87.5 < 100"
    row = run_point({**payload, "synth": {"error": "yosys failed (exit 1)"}})["row"]
    assert row["resource_source"] == "analytic (synthesis failed: yosys failed (exit 1))"
    assert row["lut"] == analytic(cfg, "lfe5u-85f")["lut"]
    # the same cycles either way: resources do not change the design point's timing
    assert row["cycles"] == run_point(payload)["row"]["cycles"] > 0


def test_optuna_search_is_reproducible_and_resumable(tmp_path):
    """TPE (seeded) proposes configurations batch by batch; its rows are the grid's rows of
    the same configurations, a second run visits the same ones, and a run cut by --limit
    and resumed replays the same search."""
    pytest.importorskip("optuna")
    text = SMALL + "[search]\nmethod = 'optuna'\nn = 6\nseed = 1\n"
    spec = parse_spec(text)
    run_sweep(parse_spec(SMALL), tmp_path / "grid", workers=2, progress=False)
    grid = {r["key"]: r for r in _rows(tmp_path / "grid")}
    a = run_sweep(spec, tmp_path / "a", workers=2, progress=False)
    rows = _rows(tmp_path / "a")
    assert 2 <= a["configurations"] <= 6 and len(rows) == 2 * a["configurations"]
    for r in rows:  # the same point as the grid's, row for row (its index is the grid's)
        assert r == grid[r["key"]]
    run_sweep(spec, tmp_path / "b", workers=2, progress=False)
    assert _rows(tmp_path / "b") == rows
    run_sweep(spec, tmp_path / "c", workers=2, limit=3, progress=False)
    run_sweep(spec, tmp_path / "c", workers=2, resume=True, progress=False)
    assert _rows(tmp_path / "c") == rows


def test_onnx_workload(tmp_path):
    """An ONNX file (static shapes) is calibrated and run on standard-normal inputs; its row
    times the accelerator nodes as a zoo model's does."""
    import onnx

    from celosia.models.registry import entry

    onnx.save(entry("small_cnn").model("small"), tmp_path / "m.onnx")
    (tmp_path / "s.toml").write_text("[space]\nbus_bytes = [8]\n"
                                     "[workloads]\nonnx = ['m.onnx']\n")
    from celosia.sweep import load_spec

    spec = load_spec(tmp_path / "s.toml")
    summary = run_sweep(spec, tmp_path / "out", workers=1, progress=False)
    (row,) = _rows(tmp_path / "out")
    assert summary["status"] == {"ok": 1} and row["workload"] == "onnx:m.onnx"
    assert row["cycles"] > 0 and row["accel_nodes"] > 0 and row["macs"] > 0
    assert 0 < row["compute_busy_cycles"] <= row["cycles"] and row["dram_bytes"] > 0


def test_unreachable_ray_address_is_a_clear_error(tmp_path):
    pytest.importorskip("ray")
    with pytest.raises(Exception, match="no Ray cluster answers there"):
        run_sweep(parse_spec(SMALL), tmp_path / "out", engine="ray", address="127.0.0.1:1",
                  progress=False)


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_schedule_search_measures_through_an_engine(engine):
    """A conv and a dense search measuring their pools on an engine choose the same
    schedules, with the same counters, as searches measuring one candidate after
    another here."""
    if engine == "ray":
        pytest.importorskip("ray")
    from celosia.compiler.accel import tune
    from celosia.compiler.accel.ops import ConvSpec, DenseSpec, Epilogue
    from celosia.compiler.accel.tune_dense import tune_dense
    from celosia.sweep.measure import through

    cfg = HwConfig()
    conv = ConvSpec(1, 64, 14, 14, 64, 3, 3, 1, 1, Epilogue(shift=8, relu=True))
    dense = DenseSpec(16, 256, 128, Epilogue(shift=8))
    want = (tune.tune_conv(cfg, conv, use_cache=False), tune_dense(cfg, dense, use_cache=False))
    pools = []
    with through(engine, workers=2):
        mapper = tune._MEASURE_MAP

        def counting(measure, knobs):
            pools.append(len(knobs))
            return mapper(measure, knobs)

        tune.set_measure_map(counting)
        got = (tune.tune_conv(cfg, conv, use_cache=False),
               tune_dense(cfg, dense, use_cache=False))
    assert tune._MEASURE_MAP is None  # restored
    assert got == want
    assert pools and all(n > 1 for n in pools)  # the pools went to the engine


def test_killed_run_resumes_with_the_same_rows(tmp_path):
    """The command killed (SIGKILL) mid-sweep, then resumed: every point once, the rows
    of an uninterrupted sweep."""
    import subprocess
    import sys
    import time

    spec = tmp_path / "s.toml"
    spec.write_text(SMALL)
    out = tmp_path / "out"
    code = ("import sys; from celosia.cli import main; "
            f"sys.exit(main(['sweep', {str(spec)!r}, '--out', {str(out)!r}, '--workers', '2', "
            "'-q']))")
    proc = subprocess.Popen([sys.executable, "-c", code])
    rows = out / "rows.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if rows.exists() and len(rows.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    done = len(rows.read_text().splitlines())
    assert 4 <= done < 16, done  # killed part way
    summary = run_sweep(parse_spec(SMALL), out, workers=2, resume=True, progress=False)
    assert summary["this_run"]["skipped_done"] >= 4
    run_sweep(parse_spec(SMALL), tmp_path / "full", workers=2, progress=False)
    resumed = _rows(out)
    assert len({r["key"] for r in resumed}) == len(resumed) == 16
    assert resumed == _rows(tmp_path / "full")


@pytest.mark.slow
def test_rtl_sample_cycles_equal_the_cycle_model(tmp_path):
    """--rtl-sample: sampled layer points run on the RTL too (a cold Verilator build of the
    small core, about a minute), with the same cycles."""
    text = """
[base]
preset = "small"
[space]
dram_latency = [8, 16]
[workloads]
layers = ["conv:6x6x8->8:k3:s1", "conv:4x4x8->4:k1:s1"]
"""
    summary = run_sweep(parse_spec(text), tmp_path / "out", workers=1, rtl_sample=3,
                        progress=False)
    rows = _rows(tmp_path / "out")
    assert summary["status"] == {"ok": 4}
    checked = [r for r in rows if r.get("rtl_cycles") is not None]
    assert len(checked) == 3
    for r in checked:
        assert r["rtl_match"] and r["rtl_cycles"] == r["cycles"] > 0
