"""SHA-256 over request-sized data without letting go of the GIL.

hashlib releases the GIL while it hashes 2 KiB or more. On the proxy's event loop that buys
nothing (no other thread has work to do in that time) and costs a hand-back: a wake-up at
best, and, when the spool's disk thread has taken the GIL meanwhile, the wait for it to give it
up again. Fed in pieces under that size, hashlib keeps the GIL, and hashing a prompt costs
the same however busy the other threads are.
"""

from __future__ import annotations

import hashlib
from typing import Any

_PIECE = 2047
"""Under CPython's HASHLIB_GIL_MINSIZE (2048): hashlib keeps the GIL for a piece this size."""


def update_held(digest: Any, data: bytes) -> None:
    """`digest.update(data)`, in pieces hashlib hashes holding the GIL."""
    if len(data) <= _PIECE:
        digest.update(data)
        return
    view = memoryview(data)
    for start in range(0, len(view), _PIECE):
        digest.update(view[start : start + _PIECE])


def sha256_held(data: bytes) -> Any:
    """`hashlib.sha256(data)`, computed holding the GIL."""
    digest = hashlib.sha256()
    update_held(digest, data)
    return digest
