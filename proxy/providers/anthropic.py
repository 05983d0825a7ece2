"""`anthropic`: Anthropic's native Messages API, bodies passed through as the client sent them."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from proxy.providers._client import HttpClient
from proxy.providers.base import Operation, Reply, Upstream, WireFormat
from vkgate.wire import ChainTarget

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"
"""`anthropic-version` when a credential names none.

The long-standing version, not the newest (2026-10-21): a credential's `api_version` opts in to a
newer one once the bodies sent to it follow that version's schema.
"""


class AnthropicMessages:
    """The adapter for Anthropic's API, sharing the process's one pooled client."""

    kind = "anthropic"

    def __init__(self, client: HttpClient) -> None:
        self._client = client

    def compile(self, target: ChainTarget) -> Upstream:
        # The root, as Anthropic's SDK takes it: the API's own paths start with /v1.
        base = (target.base_url or DEFAULT_BASE_URL).rstrip("/")
        headers = {
            "content-type": "application/json",
            "anthropic-version": target.api_version or DEFAULT_VERSION,
            # Lower-cased so an extra `Anthropic-Version` replaces ours instead of doubling it.
            **{name.lower(): value for name, value in target.headers.items()},
        }
        if target.api_key:
            headers["x-api-key"] = target.api_key
        return Upstream(
            provider_id=target.provider_id,
            provider_name=target.provider_name,
            kind=target.kind,
            model=target.model,
            model_json=msgspec.json.encode(target.model),
            adapter=self,
            wire=WireFormat.ANTHROPIC,
            urls={Operation.MESSAGES: base + "/v1/messages"},
            headers=headers,
            # Anthropic always reports usage in a stream; there is no `stream_options` to add.
            stream_usage=False,
            price=target.price,
        )

    async def send(
        self, upstream: Upstream, operation: Operation, body: bytes, headers: Mapping[str, str]
    ) -> Reply:
        return await self._client.post(upstream.urls[operation], body, headers)
