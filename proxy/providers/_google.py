"""OAuth access tokens for Vertex AI, by google-auth: a stored service account, or the workload's.

A stored service-account key is exchanged for a token at its own `token_uri` (a signed JWT
grant); without one, google-auth's application default credentials are used (the
`GOOGLE_APPLICATION_CREDENTIALS` file, GKE workload identity through the metadata server, …).
Either way the exchange blocks on HTTP, so it runs in a thread (`Refreshing`), well before the
token expires; requests only read the token of the moment.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from proxy.providers._refresh import Loaded, Refreshing
from proxy.providers.base import ProviderMisconfigured
from vkgate.clock import Clock

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
SERVICE_ACCOUNT_JSON = "service_account_json"

# google-auth logs token requests and answers at DEBUG (tokens among them): kept above it.
logging.getLogger("google.auth").setLevel(logging.INFO)
logging.getLogger("google.oauth2").setLevel(logging.INFO)


class TokenLoader:
    """Fetches a new access token each time it is called (in a thread)."""

    def __init__(self, info: dict[str, Any] | None) -> None:
        self._info = info
        self._credentials: Any = None
        self._request: Any = None

    def __call__(self) -> Loaded[str]:
        if self._credentials is None:
            # Imported here, in the loader's thread: google-auth and its HTTP client are 30 MiB
            # and a third of a second, which only a process that calls Vertex AI pays.
            import google.auth
            import google.auth.transport.requests
            from google.oauth2 import service_account

            if self._info is not None:
                self._credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
                    self._info, scopes=SCOPES
                )
            else:
                self._credentials, _ = google.auth.default(scopes=SCOPES)
            self._request = google.auth.transport.requests.Request()
        credentials = self._credentials
        credentials.refresh(self._request)
        lifetime = None
        expiry = credentials.expiry
        if expiry is not None:
            # google-auth's expiry is UTC (naive), from the system's clock: the lifetime left is
            # taken on that clock, then counted on ours.
            if expiry.tzinfo is None:
                expiry = expiry.replace(tzinfo=UTC)
            lifetime = (expiry - datetime.now(UTC)).total_seconds()
        # The header's value, made once per token rather than once per request.
        return Loaded(f"Bearer {credentials.token}", lifetime)


def tokens_of(stored: dict[str, str], clock: Clock, provider_id: str) -> Refreshing[str]:
    """Bearer tokens from the stored service account, or from the workload's credentials."""
    info = None
    text = stored.get(SERVICE_ACCOUNT_JSON)
    if text:
        try:
            info = json.loads(text)
        except ValueError:
            raise ProviderMisconfigured(
                f"provider {provider_id}: the stored service account is not JSON"
            ) from None
    return Refreshing(TokenLoader(info), clock, what="Google access token", provider_id=provider_id)


class BearerSigner:
    """Puts the token of the moment in each request's `authorization` header."""

    __slots__ = ("_tokens",)

    def __init__(self, tokens: Refreshing[str]) -> None:
        self._tokens = tokens

    async def sign(self, url: str, body: bytes, headers: dict[str, str]) -> None:
        headers["authorization"] = await self._tokens.get()
