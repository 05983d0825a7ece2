"""Hashing in pieces that keep the GIL gives the digest of the whole; a fingerprint is keyed."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from proxy.digests import bytes_fingerprint, sha256_held, text_fingerprint, update_held


@pytest.mark.parametrize("size", [0, 1, 2046, 2047, 2048, 4094, 4095, 4096, 100_001])
def test_a_digest_fed_in_pieces_is_the_digest_of_the_whole(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    assert sha256_held(data).digest() == hashlib.sha256(data).digest()
    digest = hashlib.sha256(b"prefix")
    update_held(digest, data)
    assert digest.hexdigest() == hashlib.sha256(b"prefix" + data).hexdigest()


def _fingerprint_in_new_process(env: dict[str, str]) -> str:
    code = (
        "from proxy.digests import KEYED, text_fingerprint, bytes_fingerprint\n"
        "print(KEYED, repr(text_fingerprint('a prompt')), repr(bytes_fingerprint(b'a prompt')))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_fingerprint_is_keyed_at_random_unless_the_hash_seed_is_fixed() -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    first, second = (_fingerprint_in_new_process(env) for _ in range(2))
    assert first.startswith("True ") and second.startswith("True ")
    # No one outside a process can tell what its fingerprint of a text will be.
    assert first != second
    # A fixed seed makes `hash()` anyone's to compute: a SHA-256 is kept instead.
    digest = hashlib.sha256(b"a prompt").digest()[:16]
    seeded = _fingerprint_in_new_process({**env, "PYTHONHASHSEED": "7"})
    assert seeded == f"False {digest!r} {digest!r}"


def test_a_messages_fingerprint_is_that_of_its_bytes() -> None:
    import msgspec

    message = msgspec.json.decode(b'[{"role":"user","content":"hi"}]', type=list[msgspec.Raw])[0]
    assert bytes_fingerprint(message) == bytes_fingerprint(b'{"role":"user","content":"hi"}')
    assert text_fingerprint("hi") == text_fingerprint("".join(["h", "i"]))
