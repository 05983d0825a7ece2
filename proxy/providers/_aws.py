"""AWS credentials and SigV4 signing for Bedrock, both by botocore.

A credential is either the keys an administrator stored (used as they are) or, when none were
stored, the workload's own AWS credential chain as botocore resolves it: environment variables,
a web identity token (IRSA on EKS), the container and instance metadata services, shared config
files. botocore refreshes temporary credentials when they near their expiry; that refresh blocks
on an HTTP call, so it runs in a thread (`Refreshing`), and every request is signed in-process
with the keys of the moment.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from proxy.providers._refresh import Loaded, Refreshing
from proxy.providers.base import ProviderMisconfigured
from vkgate.clock import Clock

SERVICE = "bedrock"
"""The SigV4 signing name of Bedrock's runtime API (`bedrock-runtime` is only its host)."""

ACCESS_KEY_ID = "aws_access_key_id"
SECRET_ACCESS_KEY = "aws_secret_access_key"
SESSION_TOKEN = "aws_session_token"

# botocore logs the canonical request it signs at DEBUG, security token included: whatever
# level the process logs at, that logger stays above it.
logging.getLogger("botocore.auth").setLevel(logging.INFO)


class Keys(NamedTuple):
    """A set of AWS keys, as botocore's signer reads them (botocore's `ReadOnlyCredentials`
    has the same fields; this one needs no botocore loaded)."""

    access_key: str
    secret_key: str
    token: str | None


# botocore is 20 MiB and a third of a second to import: loaded (in a thread) only by a process
# that calls Bedrock, on its first call.
_signing: Any = None


async def _load_signing() -> None:
    global _signing
    _signing = await asyncio.to_thread(importlib.import_module, "botocore.auth")


class _Signable:
    """What botocore's signer reads and writes of a request. Its own `AWSRequest` would do, but
    reading its `body` prepares the whole request first (a fifth of a signature's cost)."""

    __slots__ = ("body", "context", "headers", "url")
    method = "POST"
    params: dict[str, str] = {}

    def __init__(self, url: str, body: bytes, headers: dict[str, str]) -> None:
        self.url = url
        self.body = body
        self.headers = headers
        self.context: dict[str, Any] = {}


class WorkloadChain:
    """The workload's own credential chain, resolved on the first load (in a thread) and asked
    for its current keys on every later one: botocore refreshes them when they near expiry."""

    def __init__(self, region: str) -> None:
        self._region = region
        self._credentials: Any = None

    def __call__(self) -> Loaded[Keys]:
        if self._credentials is None:
            import botocore.exceptions
            import botocore.session

            session = botocore.session.Session()
            if not session.get_config_variable("region"):
                # STS is then called in the credential's own region, as IRSA expects.
                session.set_config_variable("region", self._region)
            credentials = session.get_credentials()
            if credentials is None:
                raise botocore.exceptions.NoCredentialsError()
            self._credentials = credentials
        frozen = self._credentials.get_frozen_credentials()
        # botocore keeps the expiry to itself: asked again every `Freshness.recheck_s`.
        return Loaded(Keys(frozen.access_key, frozen.secret_key, frozen.token), None)


def credentials_of(
    stored: Mapping[str, str], region: str, clock: Clock, provider_id: str
) -> Refreshing[Keys]:
    """The stored keys as they are, or the workload's chain when none were stored."""
    if not stored:
        return Refreshing(
            WorkloadChain(region), clock, what="AWS credentials", provider_id=provider_id
        )
    key_id, secret = stored.get(ACCESS_KEY_ID), stored.get(SECRET_ACCESS_KEY)
    if not key_id or not secret:
        raise ProviderMisconfigured(
            f"provider {provider_id}: stored AWS credentials need an access key id and a secret"
        )
    keys = Keys(key_id, secret, stored.get(SESSION_TOKEN) or None)
    return Refreshing(
        lambda: Loaded(keys, math.inf),
        clock,
        what="AWS credentials",
        provider_id=provider_id,
        initial=Loaded(keys, math.inf),
    )


class SigV4Signer:
    """Signs each Bedrock request with botocore's SigV4 signer and the keys of the moment.

    Signed: the method, the path as sent (botocore encodes it once more, as AWS expects of every
    service but S3), the body's SHA-256, and the `host`, `content-type`, `x-amz-date` and
    `x-amz-security-token` headers; the request id and trace headers travel unsigned.
    """

    __slots__ = ("_auth", "_credentials", "_region")

    def __init__(self, credentials: Refreshing[Keys], region: str) -> None:
        self._credentials = credentials
        self._region = region
        self._auth: Any = None

    async def sign(self, url: str, body: bytes, headers: dict[str, str]) -> None:
        keys = await self._credentials.get()
        if _signing is None:
            await _load_signing()
        auth = self._auth
        if auth is None or auth.credentials is not keys:
            auth = self._auth = _signing.SigV4Auth(keys, SERVICE, self._region)
        request = _Signable(
            url, body, {"host": headers["host"], "content-type": headers["content-type"]}
        )
        auth.add_auth(request)
        signed = request.headers
        headers["x-amz-date"] = signed["X-Amz-Date"]
        if keys.token:
            headers["x-amz-security-token"] = signed["X-Amz-Security-Token"]
        headers["authorization"] = signed["Authorization"]
