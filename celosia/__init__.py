"""celosia: an open VTA-style tensor accelerator stack in Python.

The contract every layer shares lives here: :class:`HwConfig` (config.py) and the ISA (isa.py).
"""

from .config import HwConfig, ConfigError, PRESETS
from .errors import CelosiaError, ProgramError, DeadlockError, SimulationLimitError
from .op import op  # @celosia.op: Python-defined operators (celosia/op.py, docs/op.md)

__all__ = ["HwConfig", "ConfigError", "PRESETS", "CelosiaError", "ProgramError",
           "DeadlockError", "SimulationLimitError", "op"]
__version__ = "0.1.0"
