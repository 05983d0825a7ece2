"""OpenAI's API and every server that speaks it (Azure, vLLM, Ollama, Groq, …): one adapter.

Vendors differ only in what a `Dialect` declares; bodies go out as the client sent them, with
`model` patched by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

import msgspec

from proxy.providers._client import HttpClient
from proxy.providers.base import Operation, ProviderMisconfigured, Reply, Upstream
from vkgate.wire import ChainTarget

PATHS = {
    Operation.CHAT: "/chat/completions",
    Operation.EMBEDDINGS: "/embeddings",
    # Azure serves these under a deployment as well, at the same paths.
    Operation.SPEECH: "/audio/speech",
    Operation.TRANSCRIPTION: "/audio/transcriptions",
    Operation.TRANSLATION: "/audio/translations",
    Operation.IMAGE_GENERATION: "/images/generations",
    Operation.IMAGE_EDIT: "/images/edits",
}
AZURE_API_VERSION = "2024-10-21"
"""Azure's API version when a credential names none: a GA one that takes `stream_options`."""
AZURE_RESPONSES_API_VERSION = "2025-04-01-preview"
"""Azure's API version for the Responses API when the credential's own is older than the
first that serves it (`2025-03-01-preview`), as the usual chat versions are."""
_FIRST_AZURE_RESPONSES_VERSION = "2025-03-01"

UrlBuilder = Callable[[str, ChainTarget], dict[Operation, str]]


def _under_base(base: str, target: ChainTarget) -> dict[Operation, str]:
    urls = {operation: base + path for operation, path in PATHS.items()}
    if target.responses_api:
        urls[Operation.RESPONSES] = base + "/responses"
    return urls


def _azure_deployment(base: str, target: ChainTarget) -> dict[Operation, str]:
    # Azure routes by deployment, named in the path: the chain target's model is that name.
    deployment = base + "/openai/deployments/" + quote(target.model, safe="")
    query = "?api-version=" + quote(target.api_version or AZURE_API_VERSION, safe="")
    urls = {operation: deployment + path + query for operation, path in PATHS.items()}
    if target.responses_api:
        # The Responses API is not under the deployment: the body's `model` names it.
        version = target.api_version or ""
        if not version[:4].isdigit() or version[:10] < _FIRST_AZURE_RESPONSES_VERSION:
            version = AZURE_RESPONSES_API_VERSION
        urls[Operation.RESPONSES] = (
            base + "/openai/responses?api-version=" + quote(version, safe="")
        )
    return urls


@dataclass(frozen=True, slots=True)
class Dialect:
    kind: str
    default_base_url: str | None
    """None: a credential must name its own address, or it cannot be compiled."""
    auth_header: str = "Authorization"
    auth_prefix: str = "Bearer "
    stream_usage: bool = True
    urls: UrlBuilder = _under_base
    """The URL of each operation, from the base URL and the chain target."""


OPENAI = Dialect("openai", "https://api.openai.com/v1")
# Self-hosted servers often need no key and have no default address.
OPENAI_COMPATIBLE = Dialect("openai_compatible", None)
# `base_url` is the resource endpoint, https://<resource>.openai.azure.com.
AZURE_OPENAI = Dialect(
    "azure_openai", None, auth_header="api-key", auth_prefix="", urls=_azure_deployment
)


class OpenAIFormat:
    """The adapter for one dialect, sharing the process's one pooled client."""

    def __init__(self, dialect: Dialect, client: HttpClient) -> None:
        self.kind = dialect.kind
        self._dialect = dialect
        self._client = client

    def compile(self, target: ChainTarget) -> Upstream:
        base = (target.base_url or self._dialect.default_base_url or "").rstrip("/")
        if not base:
            raise ProviderMisconfigured(
                f"provider {target.provider_id} of kind {target.kind} has no base_url"
            )
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
            urls=self._dialect.urls(base, target),
            headers=headers,
            stream_usage=self._dialect.stream_usage,
            price=target.price,
        )

    async def send(
        self, upstream: Upstream, operation: Operation, body: bytes, headers: Mapping[str, str]
    ) -> Reply:
        return await self._client.post(upstream.urls[operation], body, headers)

    async def stored(
        self, upstream: Upstream, method: str, path: str, query: str, headers: Mapping[str, str]
    ) -> Reply:
        base, _, own = upstream.urls[Operation.RESPONSES].partition("?")
        joined = "&".join(part for part in (own, query) if part)
        url = base + path + ("?" + joined if joined else "")
        return await self._client.request(method, url, headers)
