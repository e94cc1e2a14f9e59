"""celosia: an open VTA-style tensor accelerator stack in Python.

The contract every layer shares lives here: :class:`HwConfig` (config.py) and the ISA (isa.py).
"""

from .config import HwConfig, ConfigError, PRESETS
from .errors import CelosiaError, ProgramError, DeadlockError, SimulationLimitError

__all__ = ["HwConfig", "ConfigError", "PRESETS", "CelosiaError", "ProgramError",
           "DeadlockError", "SimulationLimitError"]
__version__ = "0.1.0"
