"""`gemini` (Google AI Studio) and `vertex_ai`: Google's Gemini API, one adapter for both.

Both serve the same bodies (`generateContent`, `streamGenerateContent?alt=sse`, `countTokens`,
`embedContent`, `batchEmbedContents`); they differ in where a model's methods live and how a
request is authenticated, which each `Dialect` declares:

- `gemini`: `https://generativelanguage.googleapis.com/v1beta/models/<model>:<method>`, the
  credential's API key in `x-goog-api-key`;
- `vertex_ai`: `https://<location>-aiplatform.googleapis.com/v1/projects/<project>/locations/
  <location>/publishers/google/models/<model>:<method>` (`aiplatform.googleapis.com` for the
  `global` location), an OAuth access token of a stored service account or of the workload
  (`_google`) as a bearer.

A model named with a path (`tunedModels/…`, `publishers/…/models/…`, `projects/…`) is used as
that resource's name. Google's errors need no mapping: a quota is a 429 and an outage a 5xx.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

import msgspec
from cachetools import LRUCache

from proxy.providers._client import HttpClient
from proxy.providers._google import BearerSigner, tokens_of
from proxy.providers._refresh import Refreshing
from proxy.providers.base import (
    Operation,
    ProviderMisconfigured,
    Reply,
    Signer,
    Upstream,
    WireFormat,
)
from vkgate.clock import Clock
from vkgate.wire import ChainTarget

METHODS = {
    Operation.GENERATE_CONTENT: ":generateContent",
    Operation.STREAM_GENERATE_CONTENT: ":streamGenerateContent?alt=sse",
    Operation.COUNT_TOKENS: ":countTokens",
    Operation.EMBED_CONTENT: ":embedContent",
    Operation.BATCH_EMBED_CONTENTS: ":batchEmbedContents",
}
PROJECT = "project"
LOCATION = "location"
_CACHED_TOKENS = 1024
_encode = msgspec.json.Encoder().encode


def _studio_model(base: str, target: ChainTarget) -> str:
    model = target.model if "/" in target.model else "models/" + target.model
    return f"{base}/v1beta/{quote(model, safe='/@')}"


def _vertex_base(target: ChainTarget) -> str:
    location = _required(target, LOCATION)
    if location == "global":
        return "https://aiplatform.googleapis.com"
    return f"https://{location}-aiplatform.googleapis.com"


def _vertex_model(base: str, target: ChainTarget) -> str:
    project, location = _required(target, PROJECT), _required(target, LOCATION)
    model = target.model
    if model.startswith("projects/"):
        return f"{base}/v1/{quote(model, safe='/@')}"
    if not model.startswith("publishers/"):
        model = "publishers/google/models/" + model
    parent = f"projects/{quote(project, safe='')}/locations/{quote(location, safe='')}"
    return f"{base}/v1/{parent}/{quote(model, safe='/@')}"


def _required(target: ChainTarget, name: str) -> str:
    value = target.settings.get(name)
    if not value:
        raise ProviderMisconfigured(
            f"provider {target.provider_id} of kind {target.kind} has no {name}"
        )
    return value


@dataclass(frozen=True, slots=True)
class Dialect:
    kind: str
    base: Callable[[ChainTarget], str]
    """The default base URL, from the credential's settings."""
    model_url: Callable[[str, ChainTarget], str]
    """The model's URL (its methods follow it), from the base URL."""
    oauth: bool
    """Authenticated by an OAuth token (`_google`); else by the API key."""


GEMINI = Dialect(
    "gemini",
    lambda target: "https://generativelanguage.googleapis.com",
    _studio_model,
    oauth=False,
)
VERTEX_AI = Dialect("vertex_ai", _vertex_base, _vertex_model, oauth=True)


class GoogleGenAI:
    """The adapter for one dialect, sharing the process's one pooled client."""

    def __init__(self, dialect: Dialect, client: HttpClient, clock: Clock) -> None:
        self.kind = dialect.kind
        self._dialect = dialect
        self._client = client
        self._clock = clock
        self._tokens: LRUCache[tuple[str, ...], Refreshing[str]] = LRUCache(_CACHED_TOKENS)
        """Kept across compilations, so a policy edit fetches no new token; the workload's own
        credentials are shared by every credential that uses them."""

    def compile(self, target: ChainTarget) -> Upstream:
        dialect = self._dialect
        base = (target.base_url or dialect.base(target)).rstrip("/")
        model_url = dialect.model_url(base, target)
        headers = {
            **{name.lower(): value for name, value in target.headers.items()},
            "content-type": "application/json",
        }
        signer: Signer | None = None
        if dialect.oauth:
            signer = BearerSigner(self._tokens_for(target))
        elif target.api_key:
            headers["x-goog-api-key"] = target.api_key
        return Upstream(
            provider_id=target.provider_id,
            provider_name=target.provider_name,
            kind=target.kind,
            model=target.model,
            model_json=msgspec.json.encode(target.model),
            adapter=self,
            wire=WireFormat.GEMINI,
            urls={operation: model_url + method for operation, method in METHODS.items()},
            headers=headers,
            # Every answer and stream event of Gemini's carries its usage.
            stream_usage=False,
            price=target.price,
            signer=signer,
        )

    def _tokens_for(self, target: ChainTarget) -> Refreshing[str]:
        stored = target.credentials
        if stored:
            material = _encode(sorted(stored.items()))
            key: tuple[str, ...] = (target.provider_id, hashlib.sha256(material).hexdigest())
        else:
            key = ("workload",)
        tokens = self._tokens.get(key)
        if tokens is None:
            tokens = self._tokens[key] = tokens_of(stored, self._clock, target.provider_id)
        return tokens

    async def send(
        self, upstream: Upstream, operation: Operation, body: bytes, headers: Mapping[str, str]
    ) -> Reply:
        url = upstream.urls[operation]
        if upstream.signer is None:
            return await self._client.post(url, body, headers)
        signed = dict(headers)
        await upstream.signer.sign(url, body, signed)
        return await self._client.post(url, body, signed)
