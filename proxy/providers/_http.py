"""What the HTTP adapters share: one POST over the pooled aiohttp session, and its reply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import aiohttp

from proxy.providers.base import ProviderTimeout, ProviderUnreachable


class ProviderMisconfigured(Exception):
    """A credential's target cannot be compiled into something callable (a missing base URL)."""


class AiohttpReply:
    __slots__ = ("_response", "content_type", "retry_after", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        headers = response.headers
        self.content_type = headers.get("Content-Type", "application/json").encode("latin-1")
        retry_after = headers.get("Retry-After")
        self.retry_after = retry_after.encode("latin-1") if retry_after else None

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise mapped(exc) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise mapped(exc) from exc

    def close(self) -> None:
        self._response.close()


def mapped(exc: BaseException) -> Exception:
    """aiohttp's failure as ours: the one place its exceptions are translated."""
    # Checked first: aiohttp's read and connect timeouts are ClientErrors too.
    if isinstance(exc, asyncio.TimeoutError):
        return ProviderTimeout(str(exc) or type(exc).__name__)
    return ProviderUnreachable(str(exc) or type(exc).__name__)


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str]
) -> AiohttpReply:
    """POST `body` and return once the status and headers are in; the body is left to read."""
    try:
        response = await session.post(
            url,
            data=body,
            headers=headers,
            # A redirect would turn the POST into a GET and could carry credentials elsewhere.
            allow_redirects=False,
        )
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise mapped(exc) from exc
    return AiohttpReply(response)
