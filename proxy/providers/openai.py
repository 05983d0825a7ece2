"""OpenAI's API and every server that speaks it (vLLM, Ollama, Groq, Together, …): one adapter.

Vendors differ only in what a `Dialect` declares; bodies go out as the client sent them, with
`model` patched by the caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp
import msgspec

from proxy.providers.base import (
    Operation,
    ProviderTimeout,
    ProviderUnreachable,
    Upstream,
)
from vkgate.wire import ChainTarget

PATHS = {Operation.CHAT: "/chat/completions", Operation.EMBEDDINGS: "/embeddings"}


@dataclass(frozen=True, slots=True)
class Dialect:
    kind: str
    default_base_url: str | None
    auth_header: str = "Authorization"
    auth_prefix: str = "Bearer "
    stream_usage: bool = True


OPENAI = Dialect("openai", "https://api.openai.com/v1")
# Self-hosted servers often need no key and have no default address.
OPENAI_COMPATIBLE = Dialect("openai_compatible", None)


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
            raise _mapped(exc) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _mapped(exc) from exc

    def close(self) -> None:
        self._response.close()


def _mapped(exc: BaseException) -> Exception:
    if isinstance(exc, asyncio.TimeoutError):
        return ProviderTimeout(str(exc) or type(exc).__name__)
    return ProviderUnreachable(str(exc) or type(exc).__name__)


class OpenAIFormat:
    """The adapter for one dialect, sharing the process's one pooled session."""

    def __init__(self, dialect: Dialect, session: aiohttp.ClientSession) -> None:
        self.kind = dialect.kind
        self._dialect = dialect
        self._session = session

    def compile(self, target: ChainTarget) -> Upstream:
        base = (target.base_url or self._dialect.default_base_url or "").rstrip("/")
        headers = {"Content-Type": "application/json", **target.headers}
        if target.api_key:
            headers[self._dialect.auth_header] = self._dialect.auth_prefix + target.api_key
        return Upstream(
            provider_id=target.provider_id,
            provider_name=target.provider_name,
            kind=target.kind,
            model=target.model,
            model_json=msgspec.json.encode(target.model),
            adapter=self,
            urls={operation: base + path for operation, path in PATHS.items()},
            headers=headers,
            stream_usage=self._dialect.stream_usage,
            price=target.price,
        )

    async def send(
        self, upstream: Upstream, operation: Operation, body: bytes, headers: Mapping[str, str]
    ) -> AiohttpReply:
        try:
            response = await self._session.post(
                upstream.urls[operation],
                data=body,
                headers=headers,
                # A redirect would turn the POST into a GET and could carry credentials elsewhere.
                allow_redirects=False,
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _mapped(exc) from exc
        return AiohttpReply(response)
