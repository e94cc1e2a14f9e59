"""The DRAM allocator: alignment, reuse, coalescing, exhaustion, misuse."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from celosia.driver import AllocationError, Device, DramAllocator, DramBuffer
from celosia.errors import CelosiaError
from celosia.isa import MemType


def test_alignment_and_no_overlap():
    dev = Device("small", dram_size=1 << 16)
    bufs = [dev.alloc(n, align) for n, align in
            [(1, 1), (3, 16), (100, 64), (5, 256), (17, 4096), (1, 2)]]
    for buf, align in zip(bufs, [1, 16, 64, 256, 4096, 2]):
        assert buf.addr % align == 0
    spans = sorted((b.addr, b.addr + b.nbytes) for b in bufs)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert dev.allocator.high_water == max(end for _, end in spans)


def test_reuse_after_free():
    dev = Device("small", dram_size=1 << 16)
    a = dev.alloc(1000)
    dev.alloc(64)
    dev.free(a)
    c = dev.alloc(900)
    assert c.addr == a.addr  # first fit takes the freed hole


def test_coalescing():
    dev = Device("small", dram_size=3 * 1024)
    a, b, c = (dev.alloc(1024) for _ in range(3))
    with pytest.raises(AllocationError):
        dev.alloc(1)
    dev.free(a)
    dev.free(c)
    assert dev.allocator.largest_hole == 1024
    dev.free(b)  # merges with both neighbours
    assert dev.allocator.largest_hole == 3 * 1024
    assert dev.alloc(3 * 1024).addr == 0


def test_out_of_memory_message():
    dev = Device("small", dram_size=4096)
    dev.alloc(3000)
    with pytest.raises(CelosiaError, match=r"requested 2000 bytes.*only 1096 of 4096 bytes are free"):
        dev.alloc(2000)


def test_double_free_and_use_after_free():
    dev = Device("small", dram_size=4096)
    buf = dev.alloc(64)
    dev.free(buf)
    with pytest.raises(AllocationError, match="double free"):
        dev.free(buf)
    with pytest.raises(AllocationError, match="was freed"):
        buf.write(np.zeros(4, np.int8))
    other = Device("small", dram_size=4096).alloc(64)
    with pytest.raises(AllocationError, match="not allocated by this device"):
        dev.free(other)


@pytest.mark.parametrize("nbytes,align,match", [
    (0, 64, "nbytes must be a positive integer"), (-5, 64, "nbytes"), (1.5, 64, "nbytes"),
    (16, 48, "align must be a positive power of two"), (16, 0, "align"),
])
def test_bad_alloc_arguments(nbytes, align, match):
    with pytest.raises(AllocationError, match=match):
        Device("small", dram_size=4096).alloc(nbytes, align)


def test_write_read_bounds_and_elem_offset():
    dev = Device("default", dram_size=1 << 16)
    buf = dev.alloc(64, align=64)
    buf.write(np.arange(16, dtype=np.int32))
    np.testing.assert_array_equal(buf.read(np.int32, (4, 4)).reshape(-1), np.arange(16))
    np.testing.assert_array_equal(buf.read(np.int32, 2, offset=8), [2, 3])
    assert buf.read().size == 64
    with pytest.raises(AllocationError, match=r"bytes \[60, 68\) do not fit"):
        buf.write(np.zeros(2, np.int32), offset=60)
    with pytest.raises(AllocationError, match="do not fit"):
        buf.read(np.int32, 17)
    assert buf.elem_offset(MemType.ACC) == buf.addr // 64
    assert buf.elem_offset(MemType.UOP) == buf.addr // 4
    odd = dev.alloc(16, align=16)
    assert odd.addr == 64
    with pytest.raises(AllocationError, match="not aligned to the 256-byte WGT element"):
        odd.elem_offset(MemType.WGT)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 700), st.sampled_from([1, 8, 64, 256])),
                max_size=40))
def test_random_alloc_free_against_model(ops):
    """Live blocks never overlap, stay aligned, and free bytes add up."""
    size = 8192
    alloc = DramAllocator(size)
    live = []
    for do_free, n, align in ops:
        if do_free and live:
            handle, addr, nbytes = live.pop(n % len(live))
            alloc.free(handle)
            continue
        try:
            buf = alloc.alloc(n, align, lambda a, k: _make(alloc, a, k))
        except AllocationError:
            continue
        assert buf.addr % align == 0
        live.append((buf, buf.addr, n))
        spans = sorted((a, a + k) for _, a, k in live)
        assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))
        assert spans[-1][1] <= size
    assert alloc.free_bytes == size - sum(k for _, _, k in live)
    for handle, _, _ in live:
        alloc.free(handle)
    assert alloc.free_bytes == size and alloc.largest_hole == size


def _make(alloc, addr, nbytes):
    return DramBuffer(addr, nbytes, alloc, None, None)
