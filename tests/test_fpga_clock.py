"""fpga/clock.py: what place and route has shown of the clock a configuration claims, and
the reports that print it."""

import json
from dataclasses import replace

from celosia.config import PRESETS
from celosia.fpga.clock import RESULTS, clock_status


def _write(folder, name, cfg, **entries):
    data = {"config": name, "hw_config": cfg.to_dict(), **entries}
    (folder / f"{name}.json").write_text(json.dumps(data))


def test_met_not_met_and_unknown(tmp_path):
    cfg = PRESETS["small"]
    assert clock_status(cfg, tmp_path)["met"] is None
    assert "no place and route" in clock_status(cfg, tmp_path)["text"]
    _write(tmp_path, "small", cfg,
           **{"lfe5u-85f": {"part": "LFE5U-85F", "fmax_mhz": 95.0},
              "lfe5u-85f_before": {"part": "LFE5U-85F", "fmax_mhz": 300.0},  # history
              "xc7z020": {"part": "xc7z020", "fits": True}})  # synthesis only: no Fmax
    s = clock_status(cfg, tmp_path)
    assert (s["met"], s["fmax_mhz"], s["part"]) == (False, 95.0, "LFE5U-85F")
    assert s["text"] == "100 MHz (not met: Fmax 95.0 MHz on LFE5U-85F after place and route)"
    slower = replace(cfg, clock_mhz=90.0)  # the claimed clock is not part of the match
    assert clock_status(slower, tmp_path)["met"] is True
    assert clock_status(PRESETS["default"], tmp_path)["met"] is None  # another configuration


def test_unreadable_files_show_nothing(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    assert clock_status(PRESETS["small"], tmp_path)["met"] is None


def test_the_kept_results_agree_with_their_files():
    """fpga/results/small.json holds the small preset's place and route on the LFE5U-85F."""
    data = json.loads((RESULTS / "small.json").read_text())
    s = clock_status(PRESETS["small"])
    if {k: v for k, v in data["hw_config"].items() if k != "clock_mhz"} == \
            {k: v for k, v in PRESETS["small"].to_dict().items() if k != "clock_mhz"}:
        assert s["fmax_mhz"] == data["lfe5u-85f"]["fmax_mhz"]
        assert s["met"] == (data["lfe5u-85f"]["fmax_mhz"] >= PRESETS["small"].clock_mhz)
    else:
        assert s["met"] is None


def test_report_line_says_the_clock_and_the_time_at_fmax():
    from celosia.runtime.report import _clock

    summary = {"clock_mhz": 100.0, "accel_ms_at_fmax": 2.105,
               "clock": {"met": False, "text": "100 MHz (not met: Fmax 95.0 MHz on X after "
                                               "place and route)"}}
    assert _clock(summary).endswith("; 2.105 ms at its Fmax")
    assert _clock({"clock_mhz": 100.0}) == "100 MHz"


def test_an_accelerator_summary_carries_the_clock_and_the_time_at_fmax():
    """On the small preset (place and route kept in fpga/results/small.json), the summary
    says whether 100 MHz was met and, if not, the accelerator's time at the Fmax reached."""
    import numpy as np

    from celosia.runtime.accel import AccelModel
    from tests.runtime.test_accel import _residual_net

    model = AccelModel.build(_residual_net(), "small")
    x = np.random.default_rng(1).integers(-128, 128, (2, 3, 8, 8), dtype=np.int8)
    model.run({"x": x}, target="cycle")
    s = model.summary()
    want = clock_status(PRESETS["small"])
    assert s["clock"] == want
    if want["met"] is False:
        assert s["accel_ms_at_fmax"] == s["cycles"] / (want["fmax_mhz"] * 1e3)
        assert s["accel_ms_at_fmax"] > s["accel_ms"]
    else:
        assert s["accel_ms_at_fmax"] is None
