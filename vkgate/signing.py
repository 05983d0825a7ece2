"""HMAC signing of internal API requests, shared by the proxy (signs) and control plane (verifies).

Signature = hex HMAC-SHA256(secret, METHOD \\n PATH?QUERY \\n TIMESTAMP \\n hex(sha256(body))).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from enum import StrEnum

TIMESTAMP_HEADER = "X-Vkgate-Timestamp"
SIGNATURE_HEADER = "X-Vkgate-Signature"
MAX_SKEW_SECONDS = 300
# Checked before any arithmetic or comparison: `int()` takes "1_7" and 400-digit numbers (which
# overflow float arithmetic), and `compare_digest` raises on non-ASCII text. Either would turn a
# forged header into a 500 instead of a 401.
_TIMESTAMP = re.compile(r"[0-9]{1,15}")
_SIGNATURE = re.compile(r"[0-9a-fA-F]{64}")


class SignatureProblem(StrEnum):
    MISSING = "missing"
    MALFORMED = "malformed"
    SKEW = "skew"
    MISMATCH = "mismatch"


def canonical(method: str, path_and_query: str, timestamp: str, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return f"{method.upper()}\n{path_and_query}\n{timestamp}\n{digest}".encode()


def sign(secret: str, method: str, path_and_query: str, timestamp: int, body: bytes) -> str:
    message = canonical(method, path_and_query, str(timestamp), body)
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signed_headers(
    secret: str, method: str, path_and_query: str, body: bytes, now: float
) -> dict[str, str]:
    timestamp = int(now)
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, method, path_and_query, timestamp, body),
    }


def verify(
    secret: str,
    method: str,
    path_and_query: str,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    now: float,
    *,
    previous: Sequence[str] = (),
) -> SignatureProblem | None:
    """None when the request is authentic and fresh, else what is wrong with it.

    A signature made with one of the `previous` secrets is as good as one made with `secret`:
    while a new secret rolls across the replicas, some sign with the old one.
    """
    if not timestamp or not signature:
        return SignatureProblem.MISSING
    if not _TIMESTAMP.fullmatch(timestamp) or not _SIGNATURE.fullmatch(signature):
        return SignatureProblem.MALFORMED
    sent_at = int(timestamp)
    if abs(now - sent_at) > MAX_SKEW_SECONDS:
        return SignatureProblem.SKEW
    presented = signature.lower()
    for candidate in (secret, *previous):
        expected = sign(candidate, method, path_and_query, sent_at, body)
        if hmac.compare_digest(expected, presented):
            return None
    return SignatureProblem.MISMATCH
