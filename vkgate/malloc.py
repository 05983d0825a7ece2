"""The C allocator's set-up for a long-running service process: large blocks go back when freed.

glibc's `malloc` maps a block of `M_MMAP_THRESHOLD` bytes or more (128 KiB at first) apart
from its heap and unmaps it when it is freed. But each time such a block is freed, glibc
raises the threshold to that block's size (up to 32 MiB): from then on, blocks that size come
from the heap, and a heap gives memory back to the system only from its top. A proxy handles
blocks of a few MiB now and then (a spend segment read back to be shipped, its gzip copy, a
large prompt), so its resident memory rose by the size of a few of them, once each thread had
its own heap: 10 MiB after its first 10,000 requests (`bench/memory.py`), none of it in use.

Setting the threshold keeps it where it is set (glibc stops adjusting it): 1 MiB, under a spend
segment's 2 MiB. Blocks under it are unaffected, so a prompt of a few hundred KiB is served as
before (400 KiB: 1.2 ms added either way, `bench/large_prompt.py`). A block over it is mapped
afresh each time, and its pages are faulted in anew: a 1 MiB prompt took 3.5 ms of proxy time
where it took 2.4 ms, a cost left to the rare prompts that size rather than 10 MiB kept by
every worker.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

MMAP_THRESHOLD_BYTES = 1024 * 1024
_M_MMAP_THRESHOLD = -3
"""`mallopt`'s parameter number for the threshold (glibc's malloc.h)."""
THRESHOLD_VARIABLE = "MALLOC_MMAP_THRESHOLD_"
"""glibc's own environment variable for the threshold: when set, it is left as it says."""


def return_large_blocks(
    env: Mapping[str, str], threshold_bytes: int = MMAP_THRESHOLD_BYTES
) -> bool:
    """Fix glibc's mmap threshold at `threshold_bytes`; whether it was set.

    Not set when the C library is not glibc (musl's allocator has no such threshold), or when
    the environment already sets glibc's own variable for it.
    """
    if THRESHOLD_VARIABLE in env or not _glibc():
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(threshold_bytes)))


def _glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False
