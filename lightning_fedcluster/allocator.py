"""Give the memory glibc keeps in its heap after tensors are freed back to the system.

glibc serves an allocation above its mmap threshold (128 KiB at start) with a mapping returned
on free, but every free of such a mapping raises the threshold to its size (up to 32 MiB). After
the first freed tensors, activations, minibatch copies and no-grad pass outputs come from the
heap, which only shrinks from its top; their sizes vary with the clients' sizes, the freed holes
are rarely reused, and the heap grew by ~0.8 GB over two rounds of a 300-client
FashionMNIST-sized run (``benchmarks/results/memory.md``). ``malloc_trim`` hands the free pages
inside the heap back. A trim's pages count as free afterwards, and a turn that reuses them faults
them in again, so the heap is trimmed again only once its free bytes have grown by the bound.
Off glibc (or before 2.33, without ``mallinfo2``) nothing is done.
Fixing the threshold instead (``mallopt``) cost ~9x the system time in page faults, since every
activation then gets fresh pages; a trim between clients when much is free costs little. Values
computed are unchanged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

TRIM_FREE_BYTES = 64 * 2**20  # trim once the arenas hold more free memory than this


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):  # not glibc, or older than 2.33 (no mallinfo2)
        return None
    return libc


_LIBC = _glibc()


def free_heap_bytes() -> int:
    """Bytes glibc's arenas hold free (mallinfo2's fordblks); 0 off glibc."""
    return int(_LIBC.mallinfo2().fordblks) if _LIBC is not None else 0


_trimmed_free = [0]  # the arenas' free bytes after the last trim (the lowest seen since)


def release_free_heap(min_free_bytes: int = TRIM_FREE_BYTES) -> bool:
    """``malloc_trim(0)`` when the arenas hold more than ``min_free_bytes`` free beyond what they
    held after the last trim; True if it ran. Called before every client's turn, so RSS follows
    the live tensors. A trim's pages stay counted as free, and a turn that reuses them faults them
    in again (as costly as the turn's no-grad pass on a small CNN), so a steady heap is trimmed
    once, and again only when it grows by ``min_free_bytes``."""
    if _LIBC is None:
        return False
    free = free_heap_bytes()
    _trimmed_free[0] = min(_trimmed_free[0], free)
    if free - _trimmed_free[0] <= min_free_bytes:
        return False
    _LIBC.malloc_trim(0)
    _trimmed_free[0] = free_heap_bytes()
    return True
