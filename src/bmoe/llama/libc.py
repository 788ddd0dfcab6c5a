"""The C library's memory calls, declared once for the modules that manage pages (mremap_mover.py,
dense_anon.py, residency.py). Linux values for the flags Python's ``mmap`` module does not export."""

from __future__ import annotations

import ctypes
import os

MREMAP_MAYMOVE, MREMAP_FIXED, MREMAP_DONTUNMAP = 1, 2, 4  # linux/mman.h
MAP_FIXED, MAP_NORESERVE = 0x10, 0x4000
MADV_NOHUGEPAGE = 15
MAP_FAILED = ctypes.c_void_p(-1).value

libc = ctypes.CDLL(None, use_errno=True)
_sig = {
    "mmap": (
        [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long],
        ctypes.c_void_p,
    ),
    "munmap": ([ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int),
    "mprotect": ([ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int),
    "mremap": ([ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p),
    "madvise": ([ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int),
    "mincore": ([ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p], ctypes.c_int),
}
for _name, (_args, _res) in _sig.items():
    _fn = getattr(libc, _name)
    _fn.argtypes, _fn.restype = _args, _res


def errno_error(call: str, addr: int, n: int) -> OSError:
    """The OSError of a failed ``call`` on ``n`` bytes at ``addr``, from errno."""
    err = ctypes.get_errno()
    return OSError(err, f"{call} of {n} bytes at {addr:#x} failed: {os.strerror(err)}")
