"""The CPU's int8 dot-product instructions, as the forms int8_dot.py's kernels are written in.

A form is how one vector register of int32 accumulators takes the products of int8
activations and weights: each 32-bit lane sums ``group`` products of adjacent input channels,
one activation group broadcast to every lane against ``lanes`` output channels' weights.

- ``vnni512``: AVX-512 VNNI ``vpdpbusd`` on zmm, 16 lanes x 4 bytes. It multiplies
  *unsigned* bytes by signed bytes, so activations enter as ``u = x + 128`` (``x ^ 0x80``)
  and each output channel's bias loses ``128 * sum(w)``: ``sum(u * w) - 128 * sum(w) =
  sum(x * w)`` exactly, modulo 2**32 as every sum here is (``wrap``). A padded input
  position holds ``pad_value + 128``, so it contributes ``pad_value * w`` as it should.
  Each of the four u8 x s8 products fits in int16 and the instruction adds them to the
  lane without saturation (the ``vpdpbusds`` form would saturate): bit-exact.
- ``vnni256``: the same on ymm, 8 lanes (AVX-VNNI, or AVX-512 VNNI with VL).
- ``avx2``: ``vpmaddwd`` on ymm, 8 lanes x 2 int16: activations and weights widened to
  int16, each pair of products summed into int32 (|x * w| <= 2**14: never saturates),
  then ``vpaddd``. ``vpmaddubsw`` (u8 x s8 pairs into int16) would do twice the work per
  instruction but saturates (255 * 127 * 2 > 32767), which breaks bit-exactness.

``host_form()`` picks the best the host has (None without AVX2: the tensor-language
kernels of kernels.py remain); ``$CELOSIA_INT8_FORM`` or a build's ``int8_form`` option
forces one (tests run every form on one machine). The chosen form is part of each kernel's
spec, so a saved model records it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from celosia.errors import CompilerError

from .host import host_target

__all__ = ["DotForm", "FORMS", "host_form", "chosen_form", "form", "pack_dot_weight",
           "unsigned_bias", "tap_sums", "fold_columns", "folds_columns"]


@dataclass(frozen=True)
class DotForm:
    name: str
    lanes: int          # int32 accumulators per vector register
    group: int          # products each lane sums per instruction (adjacent input channels)
    operand: str        # the activations' and weights' type in the kernel: int8 or int16
    unsigned: bool      # activations enter as x + 128 (vpdpbusd's unsigned operand)
    registers: int      # vector registers the register tile may use
    needs: tuple        # LLVM host features required

    @property
    def bytes(self) -> int:
        """Bytes of one operand element."""
        return 1 if self.operand == "int8" else 2


FORMS = {
    "vnni512": DotForm("vnni512", 16, 4, "int8", True, 32, ("+avx512vnni", "+avx512bw")),
    "vnni256": DotForm("vnni256", 8, 4, "int8", True, 16, ("+avx512vnni", "+avx512vl")),
    "avx2": DotForm("avx2", 8, 2, "int16", False, 16, ("+avx2",)),
}
# vnni256 on an AVX-VNNI host (no AVX-512): the same intrinsic, VEX-encoded.
_ALTERNATIVES = {"vnni256": (("+avxvnni",),)}
_PREFERENCE = ("vnni512", "vnni256", "avx2")
ENV = "CELOSIA_INT8_FORM"


def _has(name: str, features: set) -> bool:
    options = (FORMS[name].needs,) + _ALTERNATIVES.get(name, ())
    return any(all(f in features for f in need) for need in options)


def host_form() -> str | None:
    """The fastest form the host CPU runs, or None (no AVX2)."""
    features = set(host_target().features.split(","))
    return next((n for n in _PREFERENCE if _has(n, features)), None)


def form(name: str) -> DotForm:
    """The form ``name``; an error says which exist and which this CPU runs."""
    if name not in FORMS:
        raise CompilerError(f"int8 form {name!r} is not one of {', '.join(FORMS)} (or 'none' "
                            f"for the tensor-language kernels)")
    features = set(host_target().features.split(","))
    if not _has(name, features):
        runs = [n for n in FORMS if _has(n, features)]
        raise CompilerError(f"int8 form {name!r} needs CPU features {' '.join(FORMS[name].needs)}"
                            f", which this CPU ({host_target().cpu}) lacks; it runs "
                            f"{', '.join(runs) or 'none of them'}")
    return FORMS[name]


def runs_here(name: str) -> bool:
    """Whether this CPU has the features of the form ``name``."""
    return name in FORMS and _has(name, set(host_target().features.split(",")))


def chosen_form(option: str | None = None) -> str | None:
    """The form a build uses: ``option`` ("auto", a form's name or "none"), else
    $CELOSIA_INT8_FORM, else the host's best. None: no dot-product kernels."""
    choice = option or os.environ.get(ENV) or "auto"
    if choice == "auto":
        return host_form()
    if choice == "none":
        return None
    return form(choice).name


# ---- operands -------------------------------------------------------------------------------


def tile_channels(f: DotForm, vectors: int) -> int:
    return f.lanes * vectors


def pack_dot_weight(w: np.ndarray, groups: int, f: DotForm, vectors: int) -> np.ndarray:
    """OIHW int8 weights ``[M, C // groups, KH, KW]`` as the kernels read them:
    ``[groups, tiles, KH, KW, Cp // group, vectors, lanes, group]`` of the form's operand
    type, where a tile is ``vectors`` registers of ``lanes`` output channels (each group's
    output channels padded with zero weights to whole tiles) and ``Cp`` the group's input
    channels padded with zeros to a multiple of ``group``."""
    m, cg, kh, kw = w.shape
    mg = m // groups
    tile = f.lanes * vectors
    tiles = -(-mg // tile)
    cp = -(-cg // f.group) * f.group
    full = np.zeros((groups, tiles * tile, cp, kh, kw), np.int16 if f.bytes == 2 else np.int8)
    full[:, :mg, :cg] = w.reshape(groups, mg, cg, kh, kw)
    full = full.reshape(groups, tiles, vectors, f.lanes, cp // f.group, f.group, kh, kw)
    return np.ascontiguousarray(full.transpose(0, 1, 6, 7, 4, 2, 3, 5))


def per_channel(v: np.ndarray, groups: int, f: DotForm, vectors: int) -> np.ndarray:
    """A per-output-channel int32 vector ``[M]`` padded per group to whole tiles:
    ``[groups, tiles * lanes * vectors]`` (zeros in the padding)."""
    v = np.asarray(v).astype(np.int64).reshape(groups, -1)
    tile = f.lanes * vectors
    mg = v.shape[1]
    out = np.zeros((groups, -(-mg // tile) * tile), np.int64)
    out[:, :mg] = v
    return wrap32(out)


def tap_sums(w: np.ndarray, groups: int, f: DotForm, vectors: int,
             pad_value: int) -> np.ndarray:
    """What one padded tap adds to each output channel's sum: the staged padding value
    (``pad_value + 128`` for an unsigned form, else ``pad_value``) times the sum of the
    tap's weights over the group's input channels, modulo 2**32, as the kernels read it
    when they skip padded taps (``skip_padding``): ``[groups, tiles, KH, KW, vectors *
    lanes]`` int32, zeros in the padded output channels."""
    m, cg, kh, kw = w.shape
    mg = m // groups
    tile = f.lanes * vectors
    tiles = -(-mg // tile)
    value = pad_value + 128 if f.unsigned else pad_value
    sums = w.astype(np.int64).sum(axis=1) * value                 # [M, KH, KW]
    full = np.zeros((groups, tiles * tile, kh, kw), np.int64)
    full[:, :mg] = sums.reshape(groups, mg, kh, kw)
    full = full.reshape(groups, tiles, tile, kh, kw).transpose(0, 1, 3, 4, 2)
    return np.ascontiguousarray(wrap32(full))


def fold_columns(w: np.ndarray) -> np.ndarray:
    """OIHW weights of one group as a ``fold_columns`` kernel reads them (int8_dot.py):
    ``[M, KW * C, KH, 1]``, input channel ``kx * C + c`` of kernel row ``ky`` being
    ``w[:, c, ky, kx]`` (a kernel row's taps in the order their pixels are staged)."""
    m, c, kh, kw = w.shape
    return np.ascontiguousarray(w.transpose(0, 3, 1, 2).reshape(m, kw * c, kh, 1))


def folds_columns(f: DotForm, channels: int, groups: int, kernel_w: int,
                  dilation_w: int) -> bool:
    """Whether a convolution takes ``fold_columns``: one group, no column dilation, and
    fewer reduction steps per kernel row than KW taps of channels padded to ``group``
    (3-channel images: 6 steps instead of 7 for a 7-wide kernel; 1 channel: 2 of 7)."""
    if groups != 1 or dilation_w != 1 or kernel_w == 1:
        return False
    return -(-kernel_w * channels // f.group) < kernel_w * -(-channels // f.group)


def wrap32(v) -> np.ndarray:
    """int64 values as the int32 equal to them modulo 2**32."""
    return ((np.asarray(v, np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def unsigned_bias(bias: np.ndarray, w: np.ndarray, f: DotForm) -> np.ndarray:
    """The bias an unsigned form adds (``bias - 128 * sum(w)`` per output channel, modulo
    2**32: see the module docstring), or the bias itself."""
    b = np.asarray(bias).astype(np.int64)
    if f.unsigned:
        b = b - 128 * w.reshape(w.shape[0], -1).astype(np.int64).sum(axis=1)
    return b
