"""Secrets at rest: AES-GCM for provider credentials, peppered HMACs for keys and tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vkgate.keys import VIRTUAL_KEY_PREFIX, key_sha256

ADMIN_TOKEN_PREFIX = "vka-"
_CIPHER_VERSION = b"\x01"
_NONCE_BYTES = 12


class Cipher:
    """AES-256-GCM under a keyring: written under the current key, read under any of them.

    The row id is bound as associated data, so a ciphertext cannot be moved to another row. The
    format names no key (a release before the keyring reads what this one writes): a blob is
    tried under each key, the current first, and GCM's tag tells the right one at once.
    """

    def __init__(self, key: bytes, *, previous: Sequence[bytes] = ()) -> None:
        self._keys = (AESGCM(key), *(AESGCM(k) for k in previous))

    def encrypt(self, plaintext: str, *, context: str) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._keys[0].encrypt(nonce, plaintext.encode(), context.encode())
        return _CIPHER_VERSION + nonce + sealed

    def decrypt(self, blob: bytes, *, context: str) -> str:
        return self.opened(blob, context=context)[0]

    def opened(self, blob: bytes, *, context: str) -> tuple[str, bool]:
        """The plaintext, and whether the current key sealed it (False: a previous one did)."""
        if blob[:1] != _CIPHER_VERSION:
            raise ValueError("unknown ciphertext version")
        nonce, sealed = blob[1 : 1 + _NONCE_BYTES], blob[1 + _NONCE_BYTES :]
        for position, aead in enumerate(self._keys):
            try:
                return aead.decrypt(nonce, sealed, context.encode()).decode(), position == 0
            except InvalidTag:
                continue
        raise ValueError(
            "credential does not decrypt under VKGATE_ENCRYPTION_KEY"
            + (" or VKGATE_ENCRYPTION_KEYS_PREVIOUS" if len(self._keys) > 1 else "")
        )


class Hasher:
    """HMAC-SHA256 under `VKGATE_KEY_PEPPER`: a stolen database alone cannot test key guesses.

    Hashes are made under the current pepper; one made under a previous pepper
    (`VKGATE_KEY_PEPPERS_PREVIOUS`) is still found by `candidates`, so a key or token keeps
    working while the pepper rotates, and is re-hashed under the current one when presented.
    """

    def __init__(self, pepper: str, *, previous: Sequence[str] = ()) -> None:
        self._peppers = (pepper.encode(), *(p.encode() for p in previous))
        self.pepper_ids = tuple(_hmac(p, "vkgate pepper id")[:16] for p in self._peppers)
        """A short name of each pepper, the current one's first, stored beside each hash so
        `vkgate secrets status` can count what is still under a previous one; it reveals
        nothing of the pepper."""

    @property
    def pepper_id(self) -> str:
        return self.pepper_ids[0]

    def of_sha256(self, sha256_hex: str) -> str:
        return _hmac(self._peppers[0], sha256_hex)

    def of_secret(self, presented: str) -> str:
        return self.of_sha256(key_sha256(presented))

    def candidates(self, sha256_hex: str) -> tuple[str, ...]:
        """The hash under every pepper, the current one's first."""
        return tuple(_hmac(pepper, sha256_hex) for pepper in self._peppers)

    def candidates_of_secret(self, presented: str) -> tuple[str, ...]:
        return self.candidates(key_sha256(presented))


def _hmac(pepper: bytes, sha256_hex: str) -> str:
    return hmac.new(pepper, sha256_hex.lower().encode(), hashlib.sha256).hexdigest()


def new_virtual_key() -> str:
    """`vk-` and 32 random bytes, URL-safe base64 without padding (43 characters)."""
    return VIRTUAL_KEY_PREFIX + _random_text(32)


def new_admin_token() -> str:
    return ADMIN_TOKEN_PREFIX + _random_text(32)


def new_id(prefix: str) -> str:
    """`prefix_` + 12 hex digits of milliseconds + 12 random: ids sort in creation order."""
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(6)}"


def _random_text(n_bytes: int) -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(n_bytes)).rstrip(b"=").decode()
