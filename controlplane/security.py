"""Secrets at rest: AES-GCM for provider credentials, peppered HMACs for keys and tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vkgate.keys import VIRTUAL_KEY_PREFIX, key_sha256

ADMIN_TOKEN_PREFIX = "vka-"
_CIPHER_VERSION = b"\x01"
_NONCE_BYTES = 12


class Cipher:
    """AES-256-GCM; the row id is bound as associated data so a ciphertext cannot be moved."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def encrypt(self, plaintext: str, *, context: str) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, plaintext.encode(), context.encode())
        return _CIPHER_VERSION + nonce + sealed

    def decrypt(self, blob: bytes, *, context: str) -> str:
        if blob[:1] != _CIPHER_VERSION:
            raise ValueError("unknown ciphertext version")
        nonce, sealed = blob[1 : 1 + _NONCE_BYTES], blob[1 + _NONCE_BYTES :]
        try:
            return self._aead.decrypt(nonce, sealed, context.encode()).decode()
        except InvalidTag:
            raise ValueError("credential does not decrypt under VKGATE_ENCRYPTION_KEY") from None


class Hasher:
    """HMAC-SHA256 under `VKGATE_KEY_PEPPER`: a stolen database alone cannot test key guesses."""

    def __init__(self, pepper: str) -> None:
        self._pepper = pepper.encode()

    def of_sha256(self, sha256_hex: str) -> str:
        return hmac.new(self._pepper, sha256_hex.lower().encode(), hashlib.sha256).hexdigest()

    def of_secret(self, presented: str) -> str:
        return self.of_sha256(key_sha256(presented))


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
