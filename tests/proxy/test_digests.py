"""Hashing in pieces that keep the GIL gives the digest of the whole."""

from __future__ import annotations

import hashlib

import pytest

from proxy.digests import sha256_held, update_held


@pytest.mark.parametrize("size", [0, 1, 2046, 2047, 2048, 4094, 4095, 4096, 100_001])
def test_a_digest_fed_in_pieces_is_the_digest_of_the_whole(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    assert sha256_held(data).digest() == hashlib.sha256(data).digest()
    digest = hashlib.sha256(b"prefix")
    update_held(digest, data)
    assert digest.hexdigest() == hashlib.sha256(b"prefix" + data).hexdigest()
