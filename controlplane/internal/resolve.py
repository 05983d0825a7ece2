"""Resolving a presented key's SHA-256 to the virtual key it belongs to, with a short-lived JWT."""

from __future__ import annotations

import re
from datetime import timedelta

import jwt
from sqlalchemy import select

from controlplane.errors import ApiError
from controlplane.internal.bundle import refuse_if_unusable
from controlplane.models import VirtualKey, VirtualKeySecret
from controlplane.security import Hasher
from controlplane.state import Tx
from vkgate.clock import rfc3339
from vkgate.errors import ErrorCode
from vkgate.wire import ResolveKeyResponse

JWT_LIFETIME = timedelta(minutes=15)
JWT_ISSUER = "vkgate-controlplane"
_SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")


async def resolve(tx: Tx, hasher: Hasher, jwt_secret: str, key_sha256: str) -> ResolveKeyResponse:
    if not _SHA256_HEX.match(key_sha256):
        raise ApiError(
            ErrorCode.INVALID_REQUEST, "key_sha256 must be 64 hex digits", param="key_sha256"
        )
    secret = await tx.session.scalar(
        select(VirtualKeySecret).where(VirtualKeySecret.key_hash == hasher.of_sha256(key_sha256))
    )
    now = tx.clock.now()
    # A rotated-out key past its grace is indistinguishable from one never issued.
    if secret is None or (secret.valid_until is not None and secret.valid_until <= now):
        raise ApiError(ErrorCode.INVALID_API_KEY, "invalid virtual key")
    key = await tx.session.get(VirtualKey, secret.vk_id)
    if key is None:
        raise ApiError(ErrorCode.INVALID_API_KEY, "invalid virtual key")
    refuse_if_unusable(key, now)
    stops = [t for t in (key.expires_at, secret.valid_until) if t is not None]
    key_expires_at = min(stops) if stops else None
    expires_at = min(now + JWT_LIFETIME, key_expires_at) if key_expires_at else now + JWT_LIFETIME
    token = jwt.encode(
        {
            "iss": JWT_ISSUER,
            "sub": key.id,
            "org": key.organization_id,
            "project": key.project_id,
            "rev": key.revision,
            "iat": int(now.timestamp()),
            "exp": int(expires_at.timestamp()),
        },
        jwt_secret,
        algorithm="HS256",
    )
    return ResolveKeyResponse(
        jwt=token,
        vk_id=key.id,
        organization_id=key.organization_id,
        revision=key.revision,
        expires_at=rfc3339(expires_at),
        key_expires_at=rfc3339(key_expires_at) if key_expires_at else None,
    )
