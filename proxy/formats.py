"""How a request in the client's wire format travels to a provider speaking the same or the other.

Same format: the body passes through with only `model` patched, and the answer comes back as
the provider's bytes. Different formats: the request, the answer, a provider's error and every
stream event go through the pure translators in `proxy.translate`. Either way the usage and the
served model are read off the provider's answer for the spend record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from proxy import body as B
from proxy import usage as U
from proxy.errors import ProxyError, invalid
from proxy.providers import Operation, Upstream
from proxy.providers.base import WireFormat
from proxy.responses.exchange import stream_error as responses_stream_error
from proxy.sse import UsageChunkFilter
from proxy.translations import EMBEDDINGS, TRANSLATIONS, USAGE
from proxy.usage import TokenUsage

_CHAT_OPERATION = {
    WireFormat.OPENAI: Operation.CHAT,
    WireFormat.ANTHROPIC: Operation.MESSAGES,
    WireFormat.CONVERSE: Operation.CONVERSE,
    WireFormat.GEMINI: Operation.GENERATE_CONTENT,
}
_STREAM_OPERATION = {
    **_CHAT_OPERATION,
    WireFormat.CONVERSE: Operation.CONVERSE_STREAM,
    WireFormat.GEMINI: Operation.STREAM_GENERATE_CONTENT,
}


class StreamPipe(Protocol):
    """What a provider's stream goes through on its way to the client."""

    @property
    def usage(self) -> TokenUsage | None: ...

    @property
    def model(self) -> str | None: ...

    @property
    def errored(self) -> bool:
        """The provider's stream reported an error or ended before it finished."""
        ...

    def feed(self, data: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class Exchange(Protocol):
    """One client request, ready to be sent to any credential of its chain."""

    client: WireFormat
    stream: bool
    estimates_output: bool
    """Whether a plain answer's text stands for its output tokens when the provider reports no
    usage (an embedding's vector does not)."""
    same_format_headers: Mapping[str, str]
    """Client headers a provider speaking the client's format gets too (Anthropic's version)."""

    def operation(self, upstream: Upstream) -> Operation: ...

    def body_for(self, upstream: Upstream) -> bytes: ...

    def usage_of(
        self, upstream: Upstream, status: int, data: bytes
    ) -> tuple[TokenUsage | None, str | None]:
        """What a plain answer used, and the model that served it: read before `render`, so a
        paid answer that cannot be rendered is still accounted for."""
        ...

    def render(self, upstream: Upstream, status: int, data: bytes) -> bytes:
        """A plain answer (or a provider's error) in the client's format."""
        ...

    def pipe(self, upstream: Upstream) -> StreamPipe: ...


class _OpenAIStream:
    """An OpenAI stream passed through to an OpenAI client, its usage chunk read on the way."""

    __slots__ = ("_filter",)

    def __init__(self, drop_usage: bool) -> None:
        self._filter = UsageChunkFilter(drop=drop_usage)

    @property
    def usage(self) -> TokenUsage | None:
        return self._filter.usage

    @property
    def model(self) -> str | None:
        return self._filter.model

    errored = False

    def feed(self, data: bytes) -> bytes:
        return self._filter.feed(data)

    def finish(self) -> bytes:
        return self._filter.flush()


class _AnthropicStream:
    """An Anthropic stream passed through untouched; `message_start`/`message_delta` are read."""

    __slots__ = ("_tap",)

    def __init__(self) -> None:
        self._tap = U.AnthropicStreamUsage()

    @property
    def usage(self) -> TokenUsage | None:
        return self._tap.usage

    @property
    def model(self) -> str | None:
        return self._tap.model

    errored = False

    def feed(self, data: bytes) -> bytes:
        self._tap.feed(data)
        return data

    def finish(self) -> bytes:
        return b""


def stream_error(client: WireFormat, error: ProxyError, pipe: StreamPipe | None = None) -> bytes:
    """The last event of a stream that broke after it started, in the client's format (a
    Responses stream's numbered after the last event `pipe` passed on)."""
    if client is WireFormat.ANTHROPIC:
        return b"event: error\ndata: " + error.anthropic_body() + b"\n\n"
    if client is WireFormat.RESPONSES:
        return responses_stream_error(pipe, error)
    if client is WireFormat.GEMINI:
        return b"data: " + error.google_body() + b"\n\n"
    return b"data: " + error.openai_body() + b"\n\n"


class ChatExchange:
    """`POST /v1/chat/completions` (OpenAI's format) or `POST /v1/messages` (Anthropic's)."""

    estimates_output = True

    __slots__ = (
        "_body",
        "_client_wants_usage",
        "_created",
        "_requested",
        "_translated",
        "_with_usage",
        "client",
        "same_format_headers",
        "stream",
    )

    def __init__(
        self,
        client: WireFormat,
        body: bytes,
        requested: str,
        *,
        stream: bool,
        client_wants_usage: bool,
        with_usage: bytes,
        created: int,
        same_format_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.stream = stream
        self.same_format_headers = same_format_headers or {}
        self._body = body
        self._requested = requested
        self._client_wants_usage = client_wants_usage
        self._with_usage = with_usage
        """The OpenAI body asking a stream for usage (the body itself when not streaming)."""
        self._created = created
        self._translated: dict[tuple[WireFormat, bytes], bytes] | None = None
        """Made only when a credential of the other format is tried (not on the common path)."""

    def operation(self, upstream: Upstream) -> Operation:
        return (_STREAM_OPERATION if self.stream else _CHAT_OPERATION)[upstream.wire]

    def body_for(self, upstream: Upstream) -> bytes:
        if upstream.wire is self.client:
            source = self._with_usage if upstream.stream_usage else self._body
            return B.patch_model(source, self._requested, upstream.model_json)
        key = (upstream.wire, upstream.model_json)
        if self._translated is None:
            self._translated = {}
        translated = self._translated.get(key)
        if translated is None:
            # Raises a 400 naming the field when the other format has no place for it.
            try:
                translated = TRANSLATIONS[self.client, upstream.wire].request(self._body, upstream)
            except RecursionError:
                # Read once already, less deep in the stack; here a little deeper is too deep.
                raise invalid(B.TOO_DEEP) from None
            self._translated[key] = translated
        return translated

    def usage_of(
        self, upstream: Upstream, status: int, data: bytes
    ) -> tuple[TokenUsage | None, str | None]:
        if status >= 300:
            return None, None
        return USAGE[upstream.wire](data)

    def render(self, upstream: Upstream, status: int, data: bytes) -> bytes:
        if upstream.wire is self.client:
            return data
        translation = TRANSLATIONS[self.client, upstream.wire]
        if status >= 300:
            return translation.error(status, data)
        return translation.response(data, self._created, upstream)

    def pipe(self, upstream: Upstream) -> StreamPipe:
        if upstream.wire is self.client:
            if upstream.wire is WireFormat.ANTHROPIC:
                return _AnthropicStream()
            return _OpenAIStream(drop_usage=upstream.stream_usage and not self._client_wants_usage)
        translation = TRANSLATIONS[self.client, upstream.wire]
        return translation.stream(self._created, self._client_wants_usage, upstream)


class EmbeddingsExchange:
    """`POST /v1/embeddings`, in OpenAI's format: passed through to an OpenAI-format credential,
    translated for Bedrock's and Google's embedding models; a credential that cannot embed is
    skipped."""

    __slots__ = ("_body", "_requested")
    client = WireFormat.OPENAI
    stream = False
    estimates_output = False
    same_format_headers: Mapping[str, str] = {}

    def __init__(self, body: bytes, requested: str) -> None:
        self._body = body
        self._requested = requested

    def operation(self, upstream: Upstream) -> Operation:
        translation = EMBEDDINGS.get(upstream.wire)
        return Operation.EMBEDDINGS if translation is None else translation.operation

    def body_for(self, upstream: Upstream) -> bytes:
        if upstream.wire is WireFormat.OPENAI:
            return B.patch_model(self._body, self._requested, upstream.model_json)
        return EMBEDDINGS[upstream.wire].request(self._body, upstream)

    def usage_of(
        self, upstream: Upstream, status: int, data: bytes
    ) -> tuple[TokenUsage | None, str | None]:
        if status >= 300:
            return None, None
        if upstream.wire is WireFormat.OPENAI:
            return U.openai_answer(data)
        return EMBEDDINGS[upstream.wire].usage(data)

    def render(self, upstream: Upstream, status: int, data: bytes) -> bytes:
        if upstream.wire is WireFormat.OPENAI:
            return data
        translation = EMBEDDINGS[upstream.wire]
        if status >= 300:
            return translation.error(status, data)
        return translation.response(data, upstream, self._body)

    def pipe(self, upstream: Upstream) -> StreamPipe:
        raise AssertionError("embeddings are never streamed")
