"""The narrow interface every provider adapter implements, and what it hands back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from proxy.limits.cost import Rates
from vkgate.wire import ChainTarget, Price


class Operation(StrEnum):
    CHAT = "chat"
    """OpenAI's chat completions."""
    MESSAGES = "messages"
    """Anthropic's Messages API."""
    EMBEDDINGS = "embeddings"
    SPEECH = "audio speech"
    TRANSCRIPTION = "audio transcription"
    TRANSLATION = "audio translation"
    IMAGE_GENERATION = "image generation"
    IMAGE_EDIT = "image edit"
    RESPONSES = "responses"
    """OpenAI's Responses API, served by the provider itself (its URL is where the provider's
    stored responses live too)."""
    # Bedrock's runtime API (`bedrock`):
    CONVERSE = "converse"
    CONVERSE_STREAM = "converse_stream"
    INVOKE = "invoke"
    """InvokeModel: a model's own body (Bedrock's embedding models)."""
    # Google's Gemini API (`gemini`, `vertex_ai`):
    GENERATE_CONTENT = "generate_content"
    STREAM_GENERATE_CONTENT = "stream_generate_content"
    COUNT_TOKENS = "count_tokens"
    EMBED_CONTENT = "embed_content"
    BATCH_EMBED_CONTENTS = "batch_embed_contents"


class WireFormat(StrEnum):
    """The request/response schema a client or a provider speaks."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    RESPONSES = "responses"
    """OpenAI's Responses API, as a client speaks it. A provider that serves it speaks OpenAI's
    format with `Operation.RESPONSES` among its URLs; any other is translated for."""
    CONVERSE = "converse"
    """Bedrock's Converse API (and InvokeModel for embeddings)."""
    GEMINI = "gemini"
    """Google's Gemini API, as AI Studio and Vertex AI serve it."""


class ProviderUnreachable(Exception):
    """The request never reached the provider, or its connection failed before any answer."""


class ProviderTimeout(Exception):
    """The provider took longer than a configured timeout."""


class ProviderMisconfigured(Exception):
    """A credential's target cannot be compiled into something callable (a missing base URL)."""


class Reply(Protocol):
    """A provider's answer once its status and headers are in; the body follows."""

    status: int
    content_type: bytes
    retry_after: bytes | None

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    @property
    def drained(self) -> bool:
        """Whether `chunks` has yielded the whole body: the provider's answer has ended and
        nothing of it is left to yield. A stream's last bytes then go out with its end."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Upstream:
    """One credential of an alias's chain, compiled once per bundle for the hot path."""

    provider_id: str
    provider_name: str
    kind: str
    model: str
    model_json: bytes
    """`model` as a JSON string, ready to patch into a request body."""
    adapter: Provider
    wire: WireFormat = WireFormat.OPENAI
    """The schema this provider speaks: a client speaking another one is translated."""
    urls: Mapping[Operation, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Holds the provider's credential: kept out of reprs, so out of logs and tracebacks."""
    stream_usage: bool = True
    """Whether the provider reports usage in a stream when asked (`stream_options`)."""
    price: Price | None = None
    rates: Rates | None = None
    """`price` as integer rates, for budgets; None when the model has no known price."""
    max_output_tokens: int | None = None
    """The model's output cap, when known: what a budget reserves absent `max_tokens`."""
    signer: Signer | None = field(default=None, repr=False)
    """Signs each request, for a credential that is no fixed header (SigV4, OAuth tokens)."""


class Signer(Protocol):
    """Adds what authenticates one request to its headers: a SigV4 signature, a bearer token
    of the moment. Raises ProviderUnreachable when no credential can be had."""

    async def sign(self, url: str, body: bytes, headers: dict[str, str]) -> None: ...


@runtime_checkable
class StoresResponses(Protocol):
    """A provider adapter that can reach the responses a credential's provider stores."""

    async def stored(
        self, upstream: Upstream, method: str, path: str, query: str, headers: Mapping[str, str]
    ) -> Reply:
        """`method` on `path` (`/resp_…`, `/resp_…/input_items`) under the Responses API's URL,
        with the client's `query` string added to the URL's own."""
        ...


class Provider(Protocol):
    kind: str

    def compile(self, target: ChainTarget) -> Upstream:
        """Everything per-credential worked out once: URLs, headers, the patched model."""
        ...

    async def send(
        self, upstream: Upstream, operation: Operation, body: bytes, headers: Mapping[str, str]
    ) -> Reply:
        """Send `body` and return once the provider's status and headers arrived.

        Raises ProviderUnreachable or ProviderTimeout; never the transport's own exceptions.
        """
        ...
