"""Issue 28's shared pieces that the GPU tests use only on a GPU machine, checked on the CPU here:
``backend.kernel_struct``, the struct argument that ``contract_tiles`` takes by value (its layout is
C's for members of 8 bytes each: consecutive little-endian words, no padding)."""
from __future__ import annotations

import numpy as np

from terrain_io.backend import kernel_struct


class _DevicePointer:
    def __init__(self, ptr):
        self.ptr = ptr


class _DeviceArray:  # what kernel_struct reads of a CuPy array: .data.ptr
    def __init__(self, ptr):
        self.data = _DevicePointer(ptr)


def test_kernel_struct_is_consecutive_eight_byte_words():
    fields = (_DeviceArray(0x7F00_0000_1000), _DeviceArray(2**63 + 8), np.int64(-3), 2048, np.int32(7), 0)
    arg = kernel_struct(*fields)
    assert isinstance(arg, np.ndarray) and arg.size == 1  # CuPy passes a one-element NumPy array by value
    assert arg.nbytes == 8 * len(fields)
    raw = arg.tobytes()
    want = [0x7F00_0000_1000, 2**63 + 8, 2**64 - 3, 2048, 7, 0]
    assert [int.from_bytes(raw[8 * i: 8 * i + 8], "little") for i in range(len(fields))] == want
