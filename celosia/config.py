"""HwConfig: the single source of truth for one accelerator configuration.

Everything that depends on the shape of the hardware (the RTL generator, the ISA field widths,
the simulators, the driver and the compiler) derives it from an `HwConfig`. Nothing else
hard-codes a block size, a buffer depth or a field width.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .errors import CelosiaError

__all__ = ["HwConfig", "ConfigError", "PRESETS"]


class ConfigError(CelosiaError, ValueError):
    """An invalid hardware configuration: names the parameter and the limit it broke."""


# Keys of VTA's vta_config.json, mapped to HwConfig fields.
_VTA_KEYS = {
    "LOG_INP_WIDTH": "log_inp_width",
    "LOG_WGT_WIDTH": "log_wgt_width",
    "LOG_ACC_WIDTH": "log_acc_width",
    "LOG_BATCH": "log_batch",
    "LOG_BLOCK": "log_block",
    "LOG_UOP_BUFF_SIZE": "log_uop_buff_size",
    "LOG_INP_BUFF_SIZE": "log_inp_buff_size",
    "LOG_WGT_BUFF_SIZE": "log_wgt_buff_size",
    "LOG_ACC_BUFF_SIZE": "log_acc_buff_size",
}
# Keys VTA's JSON may carry that do not describe the datapath (board, bitstream version).
_VTA_IGNORED_KEYS = {"TARGET", "HW_VER"}

# Fixed widths of the ISA (ISA.md section 2).
OPCODE_BITS = 3
LOOP_ITER_BITS = 14
MEM_SRAM_BITS = 16
MEM_DRAM_BITS = 32
MEM_SIZE_BITS = 16
MEM_PAD_BITS = 4
ALU_OPCODE_BITS = 3
ALU_IMM_BITS = 16
UOP_BITS = 32


def _check_int(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{name} must be between {lo} and {hi}, not {value}")


@dataclass(frozen=True, kw_only=True)
class HwConfig:
    """One accelerator configuration: VTA's nine LOG_* parameters plus timing parameters.

    Sizes are given as base-2 logarithms, as in VTA's ``vta_config.json``. Construct with
    keyword arguments, :meth:`from_dict`, :meth:`from_json` or :meth:`preset`; every value is
    checked when the object is made.
    """

    log_inp_width: int = 3
    log_wgt_width: int = 3
    log_acc_width: int = 5
    log_batch: int = 0
    log_block: int = 4
    log_uop_buff_size: int = 15
    log_inp_buff_size: int = 15
    log_wgt_buff_size: int = 18
    log_acc_buff_size: int = 17
    # Timing parameters (not part of VTA's JSON).
    bus_bytes: int = 8  # DRAM bus width, bytes per cycle (AXI data width)
    dram_latency: int = 32  # cycles from a read request to its first beat
    cmd_queue_depth: int = 8  # instructions each module's command queue holds
    token_queue_depth: int = 8  # tokens each dependency queue holds
    clock_mhz: float = 100.0

    def __post_init__(self) -> None:
        for name, want in (("log_inp_width", 3), ("log_wgt_width", 3), ("log_acc_width", 5)):
            value = getattr(self, name)
            _check_int(name, value, 0, 6)
            if value != want:
                raise ConfigError(
                    f"{name} must be {want} ({1 << want}-bit); celosia implements only "
                    f"8-bit inputs and weights with 32-bit accumulators, not {1 << value}-bit"
                )
        _check_int("log_batch", self.log_batch, 0, 4)
        _check_int("log_block", self.log_block, 1, 6)
        _check_int("log_uop_buff_size", self.log_uop_buff_size, 2, 24)
        _check_int("log_inp_buff_size", self.log_inp_buff_size, 0, 26)
        _check_int("log_wgt_buff_size", self.log_wgt_buff_size, 0, 26)
        _check_int("log_acc_buff_size", self.log_acc_buff_size, 0, 26)
        _check_int("bus_bytes", self.bus_bytes, 1, 128)
        if self.bus_bytes & (self.bus_bytes - 1):
            raise ConfigError(f"bus_bytes must be a power of two, not {self.bus_bytes}")
        _check_int("dram_latency", self.dram_latency, 0, 100_000)
        _check_int("cmd_queue_depth", self.cmd_queue_depth, 1, 1024)
        _check_int("token_queue_depth", self.token_queue_depth, 1, 1024)
        if isinstance(self.clock_mhz, bool) or not isinstance(self.clock_mhz, (int, float)):
            raise ConfigError(f"clock_mhz must be a number, not {self.clock_mhz!r}")
        if not 0 < self.clock_mhz <= 10_000:
            raise ConfigError(f"clock_mhz must be in (0, 10000], not {self.clock_mhz}")
        for buf, log_size, elem in (
            ("uop", self.log_uop_buff_size, 4),
            ("inp", self.log_inp_buff_size, self.inp_elem_bytes),
            ("wgt", self.log_wgt_buff_size, self.wgt_elem_bytes),
            ("acc", self.log_acc_buff_size, self.acc_elem_bytes),
        ):
            if (1 << log_size) < elem:
                raise ConfigError(
                    f"log_{buf}_buff_size={log_size} gives {1 << log_size} bytes, smaller than "
                    f"one {buf} element ({elem} bytes); raise log_{buf}_buff_size to at least "
                    f"{elem.bit_length() - 1}"
                )
            depth = (1 << log_size) // elem
            if depth > (1 << MEM_SRAM_BITS):
                raise ConfigError(
                    f"log_{buf}_buff_size={log_size} gives a depth of {depth} elements, more than "
                    f"the {MEM_SRAM_BITS}-bit sram_base field of LOAD/STORE can address "
                    f"({1 << MEM_SRAM_BITS})"
                )
        first = OPCODE_BITS + 4 + 1 + self.log_uop_depth + (self.log_uop_depth + 1) + 2 * LOOP_ITER_BITS
        if first > 64:
            raise ConfigError(
                f"GEMM/ALU fields of the first instruction word need {first} bits with "
                f"log_uop_buff_size={self.log_uop_buff_size}, more than 64; lower log_uop_buff_size"
            )
        gemm2 = 2 * self.log_acc_depth + 2 * self.log_inp_depth + 2 * self.log_wgt_depth
        if gemm2 > 64:
            raise ConfigError(
                f"GEMM fields of the second instruction word need {gemm2} bits "
                f"(2 x (log2 ACC depth {self.log_acc_depth} + log2 INP depth {self.log_inp_depth}"
                f" + log2 WGT depth {self.log_wgt_depth})), more than 64; shrink a buffer"
            )
        alu2 = 4 * self.log_acc_depth + ALU_OPCODE_BITS + 1 + ALU_IMM_BITS
        if alu2 > 64:
            raise ConfigError(
                f"ALU fields of the second instruction word need {alu2} bits "
                f"(4 x log2 ACC depth {self.log_acc_depth} + 20), more than 64; "
                f"lower log_acc_buff_size"
            )
        uop = self.uop_dst_bits + self.uop_src_bits + self.uop_wgt_bits
        if uop > UOP_BITS:
            raise ConfigError(
                f"a micro-op needs {uop} bits (dst {self.uop_dst_bits} + src {self.uop_src_bits}"
                f" + wgt {self.uop_wgt_bits}), more than {UOP_BITS}; shrink the ACC, INP or WGT "
                f"buffer"
            )

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "configuration") -> "HwConfig":
        """Build from VTA's format (LOG_* keys) or celosia's own (field names), or a mix."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, not {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        kwargs = {}
        for key, value in data.items():
            if key in _VTA_IGNORED_KEYS:
                continue
            if key in ("LOG_BLOCK_IN", "LOG_BLOCK_OUT"):
                other = "LOG_BLOCK_OUT" if key == "LOG_BLOCK_IN" else "LOG_BLOCK_IN"
                if data.get(other, value) != value or data.get("LOG_BLOCK", value) != value:
                    raise ConfigError(
                        f"{source}: LOG_BLOCK_IN and LOG_BLOCK_OUT must be equal (celosia has "
                        f"square blocks), not {data.get('LOG_BLOCK_IN')} and "
                        f"{data.get('LOG_BLOCK_OUT')}"
                    )
                kwargs["log_block"] = value
                continue
            name = _VTA_KEYS.get(key, key)
            if name not in names:
                raise ConfigError(
                    f"{source}: unknown key {key!r}; known keys are {sorted(_VTA_KEYS)} and "
                    f"{sorted(names)}"
                )
            kwargs[name] = value
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path: str | Path) -> "HwConfig":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def preset(cls, name: str) -> "HwConfig":
        try:
            return PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown preset {name!r}; presets are {sorted(PRESETS)}") from None

    @classmethod
    def load(cls, spec: "str | Path | HwConfig | None") -> "HwConfig":
        """A preset name, a JSON path, an HwConfig, or None for the default."""
        if spec is None:
            return PRESETS["default"]
        if isinstance(spec, HwConfig):
            return spec
        if isinstance(spec, str) and spec in PRESETS:
            return PRESETS[spec]
        path = Path(spec)
        if not path.exists():
            raise ConfigError(
                f"configuration {str(spec)!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
                f"nor an existing JSON file"
            )
        return cls.from_json(path)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_vta_dict(self) -> dict:
        """The nine parameters in VTA's vta_config.json format."""
        return {key: getattr(self, name) for key, name in _VTA_KEYS.items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    # ---- derived sizes ------------------------------------------------------------------

    @property
    def batch(self) -> int:
        return 1 << self.log_batch

    @property
    def block(self) -> int:
        return 1 << self.log_block

    block_in = block_out = block

    @property
    def inp_width(self) -> int:
        return 1 << self.log_inp_width

    @property
    def wgt_width(self) -> int:
        return 1 << self.log_wgt_width

    @property
    def acc_width(self) -> int:
        return 1 << self.log_acc_width

    @property
    def out_width(self) -> int:
        return self.inp_width

    @property
    def inp_elem_bytes(self) -> int:
        return self.batch * self.block * self.inp_width // 8

    @property
    def wgt_elem_bytes(self) -> int:
        return self.block * self.block * self.wgt_width // 8

    @property
    def acc_elem_bytes(self) -> int:
        return self.batch * self.block * self.acc_width // 8

    @property
    def out_elem_bytes(self) -> int:
        return self.batch * self.block * self.out_width // 8

    uop_elem_bytes = 4

    @property
    def uop_depth(self) -> int:
        return (1 << self.log_uop_buff_size) // 4

    @property
    def inp_depth(self) -> int:
        return (1 << self.log_inp_buff_size) // self.inp_elem_bytes

    @property
    def wgt_depth(self) -> int:
        return (1 << self.log_wgt_buff_size) // self.wgt_elem_bytes

    @property
    def acc_depth(self) -> int:
        return (1 << self.log_acc_buff_size) // self.acc_elem_bytes

    out_depth = acc_depth

    @property
    def log_uop_depth(self) -> int:
        return self.log_uop_buff_size - 2

    @property
    def log_inp_depth(self) -> int:
        return self.log_inp_buff_size - (self.inp_elem_bytes.bit_length() - 1)

    @property
    def log_wgt_depth(self) -> int:
        return self.log_wgt_buff_size - (self.wgt_elem_bytes.bit_length() - 1)

    @property
    def log_acc_depth(self) -> int:
        return self.log_acc_buff_size - (self.acc_elem_bytes.bit_length() - 1)

    # Micro-op field widths (ISA.md section 2).
    @property
    def uop_dst_bits(self) -> int:
        return self.log_acc_depth

    @property
    def uop_src_bits(self) -> int:
        return max(self.log_acc_depth, self.log_inp_depth)

    @property
    def uop_wgt_bits(self) -> int:
        return self.log_wgt_depth

    @property
    def macs_per_cycle(self) -> int:
        """Multiply-accumulates the GEMM core does for one micro-op."""
        return self.batch * self.block * self.block

    def describe(self) -> str:
        """A human-readable summary (``celosia config show``)."""
        lines = [
            f"GEMM core      {self.batch} x {self.block} x {self.block} "
            f"({self.macs_per_cycle} int8 MACs per cycle)",
            f"clock          {self.clock_mhz:g} MHz "
            f"(peak {2 * self.macs_per_cycle * self.clock_mhz / 1000:.1f} GOPS)",
            f"DRAM bus       {self.bus_bytes} bytes/cycle, latency {self.dram_latency} cycles",
            f"queues         command depth {self.cmd_queue_depth}, token depth {self.token_queue_depth}",
        ]
        for name, log_size, depth, elem in (
            ("UOP", self.log_uop_buff_size, self.uop_depth, 4),
            ("INP", self.log_inp_buff_size, self.inp_depth, self.inp_elem_bytes),
            ("WGT", self.log_wgt_buff_size, self.wgt_depth, self.wgt_elem_bytes),
            ("ACC", self.log_acc_buff_size, self.acc_depth, self.acc_elem_bytes),
        ):
            lines.append(
                f"{name} buffer     {1 << log_size:>8} bytes = {depth:>6} x {elem}-byte elements"
            )
        lines.append(f"OUT buffer     {self.acc_depth * self.out_elem_bytes:>8} bytes = "
                     f"{self.acc_depth:>6} x {self.out_elem_bytes}-byte elements")
        return "\n".join(lines)


PRESETS: dict[str, HwConfig] = {
    # VTA's default (PYNQ-Z1 class): 1x16x16 GEMM core, 8-byte bus, 100 MHz.
    "default": HwConfig(),
    # A small core for fast RTL tests: 1x4x4, small buffers.
    "small": HwConfig(
        log_block=2,
        log_uop_buff_size=10,
        log_inp_buff_size=9,
        log_wgt_buff_size=10,
        log_acc_buff_size=11,
        bus_bytes=8,
        dram_latency=8,
        cmd_queue_depth=4,
        token_queue_depth=4,
    ),
    # The largest core for the Lattice LFE5U-85F (ULX3S-85F class; docs/fpga.md): 1x8x8.
    # Multipliers decide the GEMM: each int8 product is one MULT18X18D (an 18x18 multiplier
    # cannot hold two, unlike a DSP48E1) and each 32-bit ALU lane needs three, so 1x8x8 takes
    # 64 + 24 of the part's 156 while 2x8x8 (176) and 1x16x16 (304) do not fit. The
    # buffers are then as large as the ISA's fields allow: a micro-op holds dst + src + wgt
    # row indices in 32 bits and an ALU instruction four ACC indices in 44, so ACC has 2048
    # rows (64 KiB, kept twice for compute's two read ports), INP 2048 (16 KiB) and WGT
    # 1024 (64 KiB), the default core's row counts, and UOP the largest a GEMM's 13-bit
    # uop_bgn addresses (8192 micro-ops). Placed and routed (docs/fpga.md): 119 of the 208
    # DP16KD block RAMs, 90 of the 156 MULT18X18D, about 20,100 of the 83,640 LUT4.
    "ecp5": HwConfig(
        log_block=3,
        log_uop_buff_size=15,
        log_inp_buff_size=14,
        log_wgt_buff_size=16,
        log_acc_buff_size=16,
    ),
}
