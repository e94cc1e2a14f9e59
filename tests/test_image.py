"""Program images: .npz round trip and clear ImageErrors."""

import numpy as np
import pytest

from celosia.errors import CelosiaError
from celosia.image import ImageError, ProgramImage


def _image():
    dram = np.arange(256, dtype=np.uint8)
    return ProgramImage(dram, 32, 4)


def test_save_load_round_trip(tmp_path):
    img = _image()
    path = tmp_path / "prog.npz"
    img.save(path)
    back = ProgramImage.load(path)
    assert np.array_equal(back.dram, img.dram) and back.dram.dtype == np.uint8
    assert (back.insn_addr, back.insn_count) == (32, 4)
    assert np.array_equal(back.program_bytes, img.dram[32:96])


def test_missing_file(tmp_path):
    with pytest.raises(ImageError, match="no such file"):
        ProgramImage.load(tmp_path / "nothing.npz")


def test_not_an_npz(tmp_path):
    path = tmp_path / "prog.npz"
    path.write_text("this is not a zip archive")
    with pytest.raises(ImageError, match="not a readable .npz program image"):
        ProgramImage.load(path)


def test_missing_keys(tmp_path):
    path = tmp_path / "prog.npz"
    np.savez(path, dram=np.zeros(64, np.uint8))
    with pytest.raises(ImageError, match="not a program image, missing insn_addr, insn_count"):
        ProgramImage.load(path)


def test_misaligned_insn_addr(tmp_path):
    with pytest.raises(ImageError, match="insn_addr=8 must be a non-negative multiple of 16"):
        ProgramImage(np.zeros(64, np.uint8), 8, 1)
    path = tmp_path / "prog.npz"
    np.savez(path, dram=np.zeros(64, np.uint8), insn_addr=np.int64(8), insn_count=np.int64(1))
    with pytest.raises(ImageError, match=f"{path}: insn_addr=8"):
        ProgramImage.load(path)


def test_program_outside_dram(tmp_path):
    with pytest.raises(ImageError, match=r"the program \[32, 96\) runs past the end of the "
                                          r"64-byte DRAM"):
        ProgramImage(np.zeros(64, np.uint8), 32, 4)
    with pytest.raises(ImageError, match="insn_count=0"):
        ProgramImage(np.zeros(64, np.uint8), 0, 0)


def test_bad_dram_array():
    with pytest.raises(ImageError, match="dram must be a 1-D uint8 array"):
        ProgramImage(np.zeros(64, np.int32), 0, 1)
    with pytest.raises(ImageError, match="dram must be a 1-D uint8 array"):
        ProgramImage(np.zeros((4, 16), np.uint8), 0, 1)


# ---- the loader checks before it trusts (issue #18) ----------------------------------------

_DRAM = np.zeros(64, np.uint8)


@pytest.mark.parametrize("members,phrase", [
    (dict(insn_count=np.float64("nan")), "member insn_count must be an integer, not the float nan"),
    (dict(insn_count=np.float64("inf")), "member insn_count must be an integer, not the float inf"),
    (dict(insn_count=np.float64(1.5)), "member insn_count must be an integer, not the float 1.5"),
    (dict(insn_count=np.str_("1")), "member insn_count must be an integer, not a string"),
    (dict(insn_addr=np.bool_(False)), "member insn_addr must be an integer, not a bool"),
    (dict(insn_addr=np.complex64(0)), "member insn_addr must be an integer, not a complex"),
    (dict(insn_count=np.arange(2)), "member insn_count must be one integer, not an array of "
                                    "shape (2,)"),
    (dict(insn_count=np.array([1], dtype=object)), "not a Python object"),
    (dict(insn_count=np.uint64(2**64 - 1)), "runs past the end of the 64-byte DRAM"),
    (dict(insn_addr=np.int64(-16)), "insn_addr=-16 must be a non-negative multiple of 16"),
    (dict(dram=_DRAM.view(np.int32)), "member dram must be a 1-D uint8 array, not dtype int32 "
                                      "of shape (16,)"),
    (dict(dram=_DRAM.reshape(4, 16)), "member dram must be a 1-D uint8 array"),
    (dict(dram=_DRAM.astype(object)), "member dram must be a 1-D uint8 array, not a Python object"),
])
def test_loader_rejects_bad_members(tmp_path, members, phrase):
    path = tmp_path / "prog.npz"
    np.savez(path, **{"dram": _DRAM, "insn_addr": np.int64(0), "insn_count": np.int64(1),
                      **members})
    with pytest.raises(ImageError) as info:
        ProgramImage.load(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and phrase in msg and "\n" not in msg


def test_loader_accepts_integral_floats_and_other_integer_types(tmp_path):
    path = tmp_path / "prog.npz"
    np.savez(path, dram=_DRAM, insn_addr=np.array([16], ">i4"), insn_count=np.float32(2))
    img = ProgramImage.load(path)
    assert (img.insn_addr, img.insn_count) == (16, 2) and img.dram.flags.writeable


def test_loader_file_kinds(tmp_path):
    np.save(tmp_path / "plain.npy", _DRAM)
    (tmp_path / "text.npz").write_text("dram = 0\n")
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "dir.npz").mkdir()
    import zipfile
    with zipfile.ZipFile(tmp_path / "other.npz", "w") as z:
        z.writestr("readme.txt", "hello")
        z.writestr("dram.npy", b"not an array")
        z.writestr("insn_addr.npy", b"")
        z.writestr("insn_count.npy", b"")
    expect = {"plain.npy": "a single .npy array, not a program image",
              "text.npz": "not a readable .npz program image: a text file",
              "empty.npz": "not a readable .npz program image: an empty file",
              "dir.npz": "is a directory",
              "other.npz": "member dram is not a .npy array"}
    for name, phrase in expect.items():
        with pytest.raises(ImageError, match=phrase):
            ProgramImage.load(tmp_path / name)


def test_loader_damaged_members(tmp_path):
    good = tmp_path / "good.npz"
    ProgramImage(np.arange(4096, dtype=np.uint32).view(np.uint8), 0, 1).save(good)
    raw = good.read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[:len(raw) // 2])
    with pytest.raises(ImageError, match="cut.npz: not a readable .npz program image"):
        ProgramImage.load(tmp_path / "cut.npz")
    import io
    import zipfile
    buf = io.BytesIO()
    np.save(buf, np.zeros(4096, np.uint8))
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("dram.npy", buf.getvalue()[:-100])
        z.writestr("insn_addr.npy", _npy(np.int64(0)))
        z.writestr("insn_count.npy", _npy(np.int64(1)))
    with pytest.raises(ImageError, match="member dram is truncated: its header promises 4,096 "
                                         "bytes of data, it holds 3,996"):
        ProgramImage.load(tmp_path / "short.npz")


def _npy(value) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, value)
    return buf.getvalue()


def test_loader_checks_the_dram_size_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "prog.npz"
    np.savez(path, dram=np.zeros(8192, np.uint8), insn_addr=np.int64(0), insn_count=np.int64(1))
    monkeypatch.setenv("CELOSIA_MAX_BYTES", "4096")
    with pytest.raises(CelosiaError, match=r"member dram \(uint8\[8192\]\) needs 8,192 bytes, "
                                           r"more than the limit of 4,096"):
        ProgramImage.load(path)


def test_constructor_rejects_non_integers():
    for bad in (1.0, np.float64("nan"), "1", True, None):
        with pytest.raises(ImageError, match="insn_count must be an integer"):
            ProgramImage(_DRAM, 0, bad)
