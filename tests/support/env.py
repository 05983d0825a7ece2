"""Test secrets and settings: fixed, obviously fake values that pass start-up validation."""

from __future__ import annotations

import base64

INTERNAL_SECRET = "test-internal-secret-0123456789abcdef"
JWT_SECRET = "test-jwt-secret-0123456789abcdef0123"
KEY_PEPPER = "test-key-pepper-0123456789abcdef0123"
ENCRYPTION_KEY = base64.urlsafe_b64encode(bytes(range(32))).decode()
ADMIN_TOKEN = "test-admin-token-0123456789abcdef0123"


def secrets_env(database_url: str) -> dict[str, str]:
    return {
        "VKGATE_DATABASE_URL": database_url,
        "VKGATE_INTERNAL_SECRET": INTERNAL_SECRET,
        "VKGATE_JWT_SECRET": JWT_SECRET,
        "VKGATE_KEY_PEPPER": KEY_PEPPER,
        "VKGATE_ENCRYPTION_KEY": ENCRYPTION_KEY,
        "VKGATE_ADMIN_TOKEN": ADMIN_TOKEN,
    }
