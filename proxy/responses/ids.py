"""Response ids the client sees: the provider's id, sealed with the credential and organization.

A stored response lives with the credential that created it, and any proxy replica must reach
that credential again for `previous_response_id`, `GET`, `DELETE`, `input_items` and `cancel`,
without a store on the request path. So the id a client gets carries it: `resp_` and, in
URL-safe base64, an AES-GCM sealing of the credential's provider id, the organization and the
provider's own response id, under a key derived (HKDF-SHA256) from `VKGATE_INTERNAL_SECRET`,
which every proxy shares. A client can neither read nor forge one, nor move one to another
organization.

Sealing is deterministic: the nonce is a keyed BLAKE2b of the plaintext (a synthetic IV, as in
SIV modes), so one provider id always gives the same client id: every event of a stream, the
plain answer and a later `GET` all say the same, with nothing remembered. It reveals only that
two ids are equal, which they are anyway.

Ids are opened under each of several secrets in turn (the current one first), so a secret can
be rotated with the previous one kept for opening.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from typing import NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PREFIX = "resp_"
_VERSION = 1
_STORED = 0x01
_INFO = b"vkgate response ids v1"
_AAD = b"vkgate:response-id:v1"
_NONCE = 12
_TAG = 16
_MAX_FIELD = 255
_RAW, _PREFIXED_HEX = 0, 1


class Sealed(NamedTuple):
    """What a client's response id says, once opened."""

    provider_id: str
    """The credential that answered."""
    organization_id: str
    upstream_id: str
    """The provider's own id of the response (for a translated one: of its message)."""
    stored: bool
    """Whether the provider keeps the response (the Responses API itself, not a translation)."""


class _Key(NamedTuple):
    aead: AESGCM
    mac: bytes


def _derive(secret: str) -> _Key:
    material = HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=_INFO).derive(
        secret.encode()
    )
    return _Key(AESGCM(material[:32]), material[32:])


_KNOWN = 4096
"""Credential and organization fields kept encoded: a proxy serves a bounded set of them, and a
response is sealed on every answer."""
_FLAGS = (bytes((_VERSION, 0)), bytes((_VERSION, _STORED)))


class ResponseIds:
    """Seals response ids under the first secret, opens them under any."""

    __slots__ = ("_keys", "_known")

    def __init__(self, secrets: Sequence[str]) -> None:
        """`secrets`: the current one first, then older ones still accepted for opening."""
        if not secrets:
            raise ValueError("response ids need at least one secret")
        self._keys = tuple(_derive(secret) for secret in secrets)
        self._known: dict[tuple[str, str], bytes] = {}

    def seal(
        self, provider_id: str, organization_id: str, upstream_id: str, *, stored: bool
    ) -> str:
        known = self._known.get((provider_id, organization_id))
        if known is None:
            if len(self._known) >= _KNOWN:
                self._known.clear()
            known = _field(provider_id) + _field(organization_id)
            self._known[provider_id, organization_id] = known
        plaintext = _FLAGS[stored] + known + _field(upstream_id)
        key = self._keys[0]
        nonce = hashlib.blake2b(plaintext, key=key.mac, digest_size=_NONCE).digest()
        sealed = nonce + key.aead.encrypt(nonce, plaintext, _AAD)
        return PREFIX + base64.urlsafe_b64encode(sealed).rstrip(b"=").decode("ascii")

    def open(self, client_id: str) -> Sealed | None:
        """What `client_id` says, or None for an id this gateway did not seal (or altered)."""
        if not client_id.startswith(PREFIX) or len(client_id) > 1024:
            return None
        text = client_id[len(PREFIX) :]
        try:
            data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(data) < _NONCE + _TAG + 2:
            return None
        nonce, body = data[:_NONCE], data[_NONCE:]
        for key in self._keys:
            try:
                plaintext = key.aead.decrypt(nonce, body, _AAD)
            except InvalidTag:
                continue
            return _parse(plaintext)
        return None


def _field(value: str) -> bytes:
    """One field, length-prefixed. Ids such as `prov_0193…` and `resp_67cc…` are sealed as their
    prefix and the bytes of their (lower-case) hex, half as long; anything else as UTF-8."""
    prefix, underscore, digits = value.partition("_")
    if underscore and digits and 0 < len(prefix) <= 16 and prefix.isascii() and prefix.isalpha():
        try:
            packed = bytes.fromhex(digits)
        except ValueError:
            packed = b""
        # fromhex also takes upper case and spaces: only what it gives back exactly is packed.
        if packed and len(packed) <= _MAX_FIELD and packed.hex() == digits:
            head = prefix.encode() + underscore.encode()
            return b"".join(
                (bytes((_PREFIXED_HEX, len(head))), head, bytes((len(packed),)), packed)
            )
    raw = value.encode()
    if len(raw) > 0xFFFF:
        raise ValueError("an id too long to seal")
    return bytes((_RAW,)) + len(raw).to_bytes(2, "big") + raw


def _parse(plaintext: bytes) -> Sealed | None:
    """The fields of an authenticated plaintext; None for a version this proxy does not know."""
    if len(plaintext) < 2 or plaintext[0] != _VERSION:
        return None
    stored = bool(plaintext[1] & _STORED)
    fields: list[str] = []
    at = 2
    try:
        for _ in range(3):
            kind = plaintext[at]
            if kind == _PREFIXED_HEX:
                size = plaintext[at + 1]
                prefix = plaintext[at + 2 : at + 2 + size].decode()
                at += 2 + size
                size = plaintext[at]
                fields.append(prefix + plaintext[at + 1 : at + 1 + size].hex())
                at += 1 + size
            else:
                size = int.from_bytes(plaintext[at + 1 : at + 3], "big")
                fields.append(plaintext[at + 3 : at + 3 + size].decode())
                at += 3 + size
    except (IndexError, UnicodeDecodeError):
        return None
    if at != len(plaintext):
        return None
    return Sealed(fields[0], fields[1], fields[2], stored)
