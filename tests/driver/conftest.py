"""Shared fixtures of the driver tests: devices on the functional simulator."""

import pytest

from celosia.driver import Device


@pytest.fixture(params=["default", "small"])
def dev(request):
    """A Device on fsim, once per preset (default: VTA's 1x16x16; small: 1x4x4)."""
    return Device(request.param, "fsim", dram_size=4 << 20)


@pytest.fixture
def dev_default():
    return Device("default", "fsim", dram_size=4 << 20)


@pytest.fixture
def dev_small():
    return Device("small", "fsim", dram_size=1 << 20)
