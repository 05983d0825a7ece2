"""Resolving a presented key's SHA-256 to the virtual key it belongs to, with a short-lived JWT."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

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


@dataclass(frozen=True, slots=True)
class Resolution:
    answer: ResolveKeyResponse
    stale_hash: tuple[int, str, str] | None = None
    """(secret row, its hash, the current pepper's) when the key was found under a previous
    pepper: the caller moves it to the current one (controlplane/rehash.py)."""


async def resolve(tx: Tx, hasher: Hasher, jwt_secret: str, key_sha256: str) -> Resolution:
    if not _SHA256_HEX.match(key_sha256):
        raise ApiError(
            ErrorCode.INVALID_REQUEST, "key_sha256 must be 64 hex digits", param="key_sha256"
        )
    hashes = hasher.candidates(key_sha256)
    # One query whatever the number of peppers: at most one row can match (each hash is
    # unique, and an HMAC under two peppers does not collide).
    query = select(VirtualKeySecret)
    if len(hashes) == 1:
        query = query.where(VirtualKeySecret.key_hash == hashes[0])
    else:
        query = query.where(VirtualKeySecret.key_hash.in_(hashes))
    secret = await tx.session.scalar(query)
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
    answer = ResolveKeyResponse(
        jwt=token,
        vk_id=key.id,
        organization_id=key.organization_id,
        revision=key.revision,
        expires_at=rfc3339(expires_at),
        key_expires_at=rfc3339(key_expires_at) if key_expires_at else None,
    )
    stale = None if secret.key_hash == hashes[0] else (secret.id, secret.key_hash, hashes[0])
    return Resolution(answer, stale)


def verify_jwt(token: str, secrets: Sequence[str], *, now: datetime) -> dict[str, Any]:
    """The claims of a JWT `resolve` made, checked against each of `secrets` (the current
    `VKGATE_JWT_SECRET` first, then `VKGATE_JWT_SECRET_PREVIOUS`): while the secret rotates, a
    JWT made before still verifies for the rest of its life (at most `JWT_LIFETIME`).

    Raises `jwt.InvalidTokenError`: no secret's signature, another issuer, or expired at `now`.
    """
    for secret in secrets[:-1]:
        try:
            return _decode(token, secret, now)
        except jwt.InvalidSignatureError:
            continue
    return _decode(token, secrets[-1], now)


def _decode(token: str, secret: str, now: datetime) -> dict[str, Any]:
    claims: dict[str, Any] = jwt.decode(
        token,
        secret,
        algorithms=["HS256"],
        issuer=JWT_ISSUER,
        options={"require": ["exp", "iss", "sub"], "verify_exp": False},
    )
    # Checked here against the caller's clock, not the machine's.
    if claims["exp"] <= now.timestamp():
        raise jwt.ExpiredSignatureError("the resolution's JWT has expired")
    return claims
