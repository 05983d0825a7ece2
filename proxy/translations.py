"""Which translator takes a client's format to a provider's, and back: one table.

A client speaks OpenAI's chat completions or Anthropic's Messages API; a credential speaks one
of those, Bedrock's Converse API or Google's Gemini API. Each pair of different formats has its
pure translator module in `proxy.translate`; this table binds each to the credential it serves
(its model, its kind's quirks) and to the ids an answer needs when the provider gives none.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy import usage as U
from proxy.providers.base import Operation, Upstream, WireFormat
from proxy.translate import (
    _converse,
    _gemini,
    anthropic_converse,
    anthropic_gemini,
    anthropic_openai,
    openai_anthropic,
    openai_converse,
    openai_embeddings,
    openai_gemini,
)
from proxy.usage import TokenUsage

if TYPE_CHECKING:
    from proxy.formats import StreamPipe

_MAX_TOKENS = {"openai": "max_completion_tokens", "azure_openai": "max_completion_tokens"}
"""OpenAI's own API (and Azure's) refuses `max_tokens` for reasoning models."""

UsageReader = Callable[[bytes], tuple[TokenUsage | None, str | None]]
USAGE: dict[WireFormat, UsageReader] = {
    WireFormat.OPENAI: U.openai_answer,
    WireFormat.ANTHROPIC: U.anthropic_answer,
    WireFormat.CONVERSE: _converse.usage_of,
    WireFormat.GEMINI: _gemini.usage_of,
}
"""How the usage and served model are read off a plain answer of each provider format."""


def openai_id() -> str:
    """An id for an answer whose provider gives none, in OpenAI's `chatcmpl-` form."""
    return "chatcmpl-" + os.urandom(12).hex()


def anthropic_id() -> str:
    return "msg_" + os.urandom(12).hex()


@dataclass(frozen=True, slots=True)
class Translation:
    """A client format spoken to a credential of another."""

    request: Callable[[bytes, Upstream], bytes]
    """The client's request for the credential (a 400 naming a field it cannot take)."""
    response: Callable[[bytes, int, Upstream], bytes]
    """The provider's plain answer, given the time the request was made (`created`)."""
    error: Callable[[int, bytes], bytes]
    """The provider's error body (its HTTP status given)."""
    stream: Callable[[int, bool, Upstream], StreamPipe]
    """The pipe a stream goes through, given `created` and whether the client asked for a
    usage chunk."""


TRANSLATIONS: dict[tuple[WireFormat, WireFormat], Translation] = {
    (WireFormat.OPENAI, WireFormat.ANTHROPIC): Translation(
        request=lambda body, up: openai_anthropic.request(body, up.model),
        response=lambda data, created, up: openai_anthropic.response(data, created),
        error=openai_anthropic.error,
        stream=lambda created, usage, up: openai_anthropic.StreamTranslator(created, usage),
    ),
    (WireFormat.ANTHROPIC, WireFormat.OPENAI): Translation(
        request=lambda body, up: anthropic_openai.request(
            body, up.model, max_tokens_field=_MAX_TOKENS.get(up.kind, "max_tokens")
        ),
        response=lambda data, created, up: anthropic_openai.response(data),
        error=anthropic_openai.error,
        stream=lambda created, usage, up: anthropic_openai.StreamTranslator(),
    ),
    (WireFormat.OPENAI, WireFormat.CONVERSE): Translation(
        request=lambda body, up: openai_converse.request(body, up.model),
        response=lambda data, created, up: openai_converse.response(
            data, created, openai_id(), up.model
        ),
        error=openai_converse.error,
        stream=lambda created, usage, up: openai_converse.stream(
            created, usage, openai_id(), up.model
        ),
    ),
    (WireFormat.ANTHROPIC, WireFormat.CONVERSE): Translation(
        request=lambda body, up: anthropic_converse.request(body, up.model),
        response=lambda data, created, up: anthropic_converse.response(
            data, anthropic_id(), up.model
        ),
        error=anthropic_converse.error,
        stream=lambda created, usage, up: anthropic_converse.stream(anthropic_id(), up.model),
    ),
    (WireFormat.OPENAI, WireFormat.GEMINI): Translation(
        request=lambda body, up: openai_gemini.request(body, up.model),
        response=lambda data, created, up: openai_gemini.response(
            data, created, openai_id(), up.model
        ),
        error=openai_gemini.error,
        stream=lambda created, usage, up: openai_gemini.stream(
            created, usage, openai_id(), up.model
        ),
    ),
    (WireFormat.ANTHROPIC, WireFormat.GEMINI): Translation(
        request=lambda body, up: anthropic_gemini.request(body, up.model),
        response=lambda data, created, up: anthropic_gemini.response(
            data, anthropic_id(), up.model
        ),
        error=anthropic_gemini.error,
        stream=lambda created, usage, up: anthropic_gemini.stream(anthropic_id(), up.model),
    ),
}


@dataclass(frozen=True, slots=True)
class EmbeddingsTranslation:
    """OpenAI's embeddings request spoken to a credential of another format."""

    operation: Operation
    request: Callable[[bytes, Upstream], bytes]
    usage: UsageReader
    response: Callable[[bytes, Upstream, bytes], bytes]
    """The provider's answer as OpenAI's list, given the credential and the client's request."""
    error: Callable[[int, bytes], bytes]


def _encoding(body: bytes) -> str | None:
    return openai_embeddings.fields_of(body, "").encoding_format


def _google_model(upstream: Upstream) -> str | None:
    """Google AI Studio names the model in each request of a batch; Vertex AI does not."""
    if upstream.kind != "gemini":
        return None
    return upstream.model if "/" in upstream.model else "models/" + upstream.model


EMBEDDINGS: dict[WireFormat, EmbeddingsTranslation] = {
    WireFormat.CONVERSE: EmbeddingsTranslation(
        operation=Operation.INVOKE,
        request=lambda body, up: openai_embeddings.bedrock_request(body, up.model),
        usage=openai_embeddings.bedrock_usage,
        response=lambda data, up, body: openai_embeddings.bedrock_response(
            data, up.model, _encoding(body)
        ),
        error=openai_converse.error,
    ),
    WireFormat.GEMINI: EmbeddingsTranslation(
        operation=Operation.BATCH_EMBED_CONTENTS,
        request=lambda body, up: openai_embeddings.google_request(body, _google_model(up)),
        usage=openai_embeddings.google_usage,
        response=lambda data, up, body: openai_embeddings.google_response(
            data, up.model, _encoding(body)
        ),
        error=openai_gemini.error,
    ),
}
"""OpenAI embeddings to Bedrock's InvokeModel and to Google's `batchEmbedContents`."""
