"""Digests of request-sized data on the event loop: SHA-256 without letting go of the GIL, and
the fingerprint a process keeps of the texts it has seen.

hashlib releases the GIL while it hashes 2 KiB or more. On the proxy's event loop that buys
nothing (no other thread has work to do in that time) and costs a hand-back: a wake-up at
best, and, when the spool's disk thread has taken the GIL meanwhile, the wait for it to give it
up again. Fed in pieces under that size, hashlib keeps the GIL, and hashing a prompt costs
the same however busy the other threads are.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import msgspec

_PIECE = 2047
"""Under CPython's HASHLIB_GIL_MINSIZE (2048): hashlib keeps the GIL for a piece this size."""


def update_held(digest: Any, data: bytes | msgspec.Raw) -> None:
    """`digest.update(data)`, in pieces hashlib hashes holding the GIL."""
    if len(data) <= _PIECE:
        digest.update(data)
        return
    view = memoryview(data)
    for start in range(0, len(view), _PIECE):
        digest.update(view[start : start + _PIECE])


def sha256_held(data: bytes | msgspec.Raw) -> Any:
    """`hashlib.sha256(data)`, computed holding the GIL."""
    digest = hashlib.sha256()
    update_held(digest, data)
    return digest


KEYED = os.environ.get("PYTHONHASHSEED", "random") == "random"
"""Whether `hash()` is keyed at random for this process (PEP 456: SipHash-1-3 under a key
drawn at start-up), as it is unless PYTHONHASHSEED fixes the key."""

Fingerprint = int | bytes
"""What a process remembers of a text it has seen, never the text: `hash()` of it, a 64-bit
SipHash under the process's own random key, which no client can compute, so none can make one
text share another's fingerprint; where PYTHONHASHSEED fixes that key, a SHA-256 cut to 16
bytes instead. `hash()` runs in the interpreter's own code, warm on any request path, where
hashlib's set-up through OpenSSL is cold and costs more than the hashing."""


def text_fingerprint(text: str) -> Fingerprint:
    if KEYED:
        return hash(text)
    return _sha256_16(text.encode("utf-8", "surrogatepass"))


def bytes_fingerprint(data: bytes | msgspec.Raw) -> Fingerprint:
    if KEYED:
        return hash(bytes(data))
    return _sha256_16(data)


def _sha256_16(data: bytes | msgspec.Raw) -> bytes:
    held: bytes = sha256_held(data).digest()
    return held[:16]
