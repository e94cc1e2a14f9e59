"""HwConfig: ISA.md's defaults, VTA's JSON format, celosia's own JSON, validation messages."""

import json
import re

import pytest

from celosia import PRESETS, ConfigError, HwConfig
from celosia.isa import MemType, buffer_depth, elem_bytes


def test_defaults_match_isa_md():
    cfg = HwConfig()
    assert cfg.to_vta_dict() == {
        "LOG_INP_WIDTH": 3, "LOG_WGT_WIDTH": 3, "LOG_ACC_WIDTH": 5, "LOG_BATCH": 0,
        "LOG_BLOCK": 4, "LOG_UOP_BUFF_SIZE": 15, "LOG_INP_BUFF_SIZE": 15,
        "LOG_WGT_BUFF_SIZE": 18, "LOG_ACC_BUFF_SIZE": 17}
    assert (cfg.batch, cfg.block_in, cfg.block_out) == (1, 16, 16)
    assert (cfg.uop_depth, cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth, cfg.out_depth) == \
        (8192, 2048, 1024, 2048, 2048)
    assert (cfg.uop_elem_bytes, cfg.inp_elem_bytes, cfg.wgt_elem_bytes, cfg.acc_elem_bytes,
            cfg.out_elem_bytes) == (4, 16, 256, 64, 16)
    assert [elem_bytes(cfg, t) for t in MemType] == [4, 256, 16, 64, 16, 16]
    assert [buffer_depth(cfg, t) for t in MemType] == [8192, 1024, 2048, 2048, 2048, 2048]
    assert (cfg.bus_bytes, cfg.clock_mhz, cfg.token_queue_depth) == (8, 100.0, 8)
    assert (cfg.uop_dst_bits, cfg.uop_src_bits, cfg.uop_wgt_bits) == (11, 11, 10)
    assert cfg.macs_per_cycle == 256


def test_presets():
    assert set(PRESETS) >= {"default", "small"}
    assert HwConfig.preset("default") == HwConfig()
    small = HwConfig.preset("small")
    assert (small.batch, small.block) == (1, 4)
    assert HwConfig.load("small") is small and HwConfig.load(None) == HwConfig()
    assert HwConfig.load(small) is small
    with pytest.raises(ConfigError, match="unknown preset 'huge'; presets are"):
        HwConfig.preset("huge")
    with pytest.raises(ConfigError, match="neither a preset .* nor an existing JSON file"):
        HwConfig.load("no-such-config")


def test_vta_json(tmp_path):
    """VTA's vta_config.json as shipped, with TARGET/HW_VER and split LOG_BLOCK_IN/OUT."""
    data = {"TARGET": "pynq", "HW_VER": "0.0.2", "LOG_INP_WIDTH": 3, "LOG_WGT_WIDTH": 3,
            "LOG_ACC_WIDTH": 5, "LOG_BATCH": 1, "LOG_BLOCK_IN": 3, "LOG_BLOCK_OUT": 3,
            "LOG_UOP_BUFF_SIZE": 14, "LOG_INP_BUFF_SIZE": 14, "LOG_WGT_BUFF_SIZE": 16,
            "LOG_ACC_BUFF_SIZE": 16}
    path = tmp_path / "vta_config.json"
    path.write_text(json.dumps(data))
    cfg = HwConfig.from_json(path)
    assert (cfg.batch, cfg.block, cfg.log_uop_buff_size, cfg.log_acc_buff_size) == (2, 8, 14, 16)
    assert HwConfig.load(str(path)) == cfg
    assert HwConfig.from_dict({"LOG_BATCH": 1}).batch == 2
    with pytest.raises(ConfigError, match="LOG_BLOCK_IN and LOG_BLOCK_OUT must be equal"):
        HwConfig.from_dict({"LOG_BLOCK_IN": 3, "LOG_BLOCK_OUT": 4})


def test_own_json_round_trip(tmp_path):
    cfg = HwConfig(log_block=3, log_batch=1, log_wgt_buff_size=16, bus_bytes=16, dram_latency=5, cmd_queue_depth=2,
                   token_queue_depth=3, clock_mhz=150.0)
    path = tmp_path / "cfg.json"
    path.write_text(cfg.to_json())
    assert HwConfig.from_json(path) == cfg
    assert HwConfig.from_dict(cfg.to_vta_dict()) == \
        HwConfig(log_block=3, log_batch=1, log_wgt_buff_size=16)
    for preset in PRESETS.values():
        assert HwConfig.from_dict(json.loads(preset.to_json())) == preset


def test_bad_json_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read configuration"):
        HwConfig.from_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        HwConfig.from_json(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object, not list"):
        HwConfig.from_json(bad)


@pytest.mark.parametrize("name,value,message", [
    ("log_inp_width", 4, "log_inp_width must be 3 (8-bit); celosia implements only"),
    ("log_wgt_width", 2, "log_wgt_width must be 3 (8-bit)"),
    ("log_acc_width", 4, "log_acc_width must be 5 (32-bit)"),
    ("log_acc_width", 9, "log_acc_width must be between 0 and 6, not 9"),
    ("log_batch", -1, "log_batch must be between 0 and 4, not -1"),
    ("log_block", 1.5, "log_block must be an integer, not 1.5"),
    ("log_block", True, "log_block must be an integer, not True"),
    ("bus_bytes", 12, "bus_bytes must be a power of two, not 12"),
    ("bus_bytes", 0, "bus_bytes must be between 1 and 128, not 0"),
    ("dram_latency", -3, "dram_latency must be between 0 and 100000, not -3"),
    ("cmd_queue_depth", 0, "cmd_queue_depth must be between 1 and 1024, not 0"),
    ("token_queue_depth", 0, "token_queue_depth must be between 1 and 1024, not 0"),
    ("clock_mhz", 0, "clock_mhz must be in (0, 10000], not 0"),
    ("clock_mhz", "fast", "clock_mhz must be a number, not 'fast'"),
])
def test_parameter_errors(name, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        HwConfig(**{name: value})


def test_buffer_smaller_than_one_element():
    with pytest.raises(ConfigError, match=r"log_wgt_buff_size=7 gives 128 bytes, smaller than one "
                                          r"wgt element \(256 bytes\); raise log_wgt_buff_size to "
                                          r"at least 8"):
        HwConfig(log_wgt_buff_size=7)


def test_buffer_deeper_than_sram_base_field():
    with pytest.raises(ConfigError, match="more than the 16-bit sram_base field"):
        HwConfig(log_inp_buff_size=21)


def test_fields_not_fitting_128_bits():
    # First word: 7 + reset 1 + uop_bgn 14 + uop_end 15 + 2 x 14 loop counts.
    with pytest.raises(ConfigError, match="first instruction word need 65 bits with "
                                          "log_uop_buff_size=16, more than 64"):
        HwConfig(log_uop_buff_size=16)
    HwConfig(log_uop_buff_size=15)
    with pytest.raises(ConfigError, match=re.escape(
            "GEMM fields of the second instruction word need 66 bits (2 x (log2 ACC depth 11 + "
            "log2 INP depth 11 + log2 WGT depth 11)), more than 64")):
        HwConfig(log_wgt_buff_size=19)
    with pytest.raises(ConfigError, match=re.escape(
            "ALU fields of the second instruction word need 68 bits (4 x log2 ACC depth 12 + 20)")):
        HwConfig(log_block=1, log_acc_buff_size=15, log_inp_buff_size=3, log_wgt_buff_size=4)


def test_uop_not_fitting_32_bits():
    with pytest.raises(ConfigError, match=re.escape(
            "a micro-op needs 33 bits (dst 11 + src 11 + wgt 11), more than 32")):
        HwConfig(log_wgt_buff_size=19, log_inp_buff_size=14)


def test_unknown_key():
    with pytest.raises(ConfigError, match="unknown key 'LOG_BLOCKS'; known keys are"):
        HwConfig.from_dict({"LOG_BLOCKS": 4})
    with pytest.raises(ConfigError, match="cfg.json: unknown key 'speed'"):
        HwConfig.from_dict({"speed": 1}, source="cfg.json")


def test_configs_are_immutable():
    cfg = HwConfig()
    with pytest.raises(AttributeError):
        cfg.log_block = 3
