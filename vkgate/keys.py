"""The virtual key format, and the one transformation of a key that may leave the proxy."""

from __future__ import annotations

import hashlib

VIRTUAL_KEY_PREFIX = "vk-"
DISPLAY_PREFIX_LENGTH = 11  # "vk-" and eight characters: enough to tell keys apart in a table


def key_sha256(presented_key: str) -> str:
    """Hex SHA-256 of the presented key: what the proxy sends to `resolve-key` instead of it."""
    return hashlib.sha256(presented_key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    return key[:DISPLAY_PREFIX_LENGTH]
