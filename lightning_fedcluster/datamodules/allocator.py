"""A fixed glibc mmap threshold, so that freed tensor memory goes back to the system.

glibc serves an allocation above its mmap threshold (128 KiB at start) with its own mapping,
returned to the system on free, and one below it from the heap, which only shrinks from its top.
Every free of a mapped chunk raises the threshold to that chunk's size (up to 32 MiB), so after
the first few freed tensors every activation, per-client split and minibatch copy of a
FashionMNIST-sized run comes from the heap. Their sizes vary with the clients' sizes, the freed
holes are rarely reused, and the heap grew by ~0.8 GB over two rounds of 300 clients (issue 17).
Setting the threshold once fixes it at 128 KiB and turns off the raising (and the matching
raise of the trim threshold), so RSS follows the live tensors. Values computed are unchanged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 128 * 2**10  # glibc's own starting value
_ENV = ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")  # the user chose the allocator's settings
_done = False


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at 128 KiB for this process (once); True if it is set.

    Does nothing off glibc or where the user set the threshold (or any glibc tunable) in the
    environment."""
    global _done
    if _done:
        return True
    if platform.libc_ver()[0] != "glibc" or any(name in os.environ for name in _ENV):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _done = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
    return _done
