"""Program images: .npz round trip and clear ImageErrors."""

import numpy as np
import pytest

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
