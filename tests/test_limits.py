import pytest

from celosia.errors import CelosiaError
from celosia.limits import DEFAULT_MAX_BYTES, ResourceLimitError, check_bytes, max_bytes


def test_default_and_environment(monkeypatch):
    monkeypatch.delenv("CELOSIA_MAX_BYTES", raising=False)
    assert max_bytes() == DEFAULT_MAX_BYTES
    monkeypatch.setenv("CELOSIA_MAX_BYTES", "1000")
    assert max_bytes() == 1000
    check_bytes(1000, "x")
    with pytest.raises(ResourceLimitError, match=r"x needs 1,001 bytes.*CELOSIA_MAX_BYTES"):
        check_bytes(1001, "x")


@pytest.mark.parametrize("bad", ["0", "-5", "1e9", "lots"])
def test_bad_limit_is_a_clear_error(monkeypatch, bad):
    monkeypatch.setenv("CELOSIA_MAX_BYTES", bad)
    with pytest.raises(CelosiaError, match="CELOSIA_MAX_BYTES must be a positive integer"):
        max_bytes()
