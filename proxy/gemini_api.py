"""Google's Gemini API under `/v1beta`, for Gemini clients (the `google-genai` SDK and the like).

Routes, as Google's own: `POST /v1beta/models/{model}:generateContent`,
`:streamGenerateContent?alt=sse`, `:countTokens`, `:embedContent`, `:batchEmbedContents`;
`GET /v1beta/models` and `GET /v1beta/models/{model}`. The same methods are served under `/v1`
(`POST /v1/models/{model}:generateContent`, …), where google-genai goes unless told `v1beta`;
`GET /v1/models` stays OpenAI's list. `{model}` is an alias of the key's
routing policy, served by its `gemini` and `vertex_ai` credentials (the others of its chain are
passed over); bodies pass through as the client sent them (the model is in the URL), answers
come back as the provider sent them, and everything else (limits, budgets, failover, spend
read from `usageMetadata`) is the one pipeline's. Errors are in Google's shape.

The key is read from `x-goog-api-key` (what google-genai sends), `?key=`, or as on `/v1`. The
query string is read here and nowhere else: no log line or trace carries it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import msgspec

from proxy import body as B
from proxy.asgi import Head, Receive, Scope, Send
from proxy.documents import Shape
from proxy.errors import ProxyError, invalid
from proxy.prepared import Prepared
from proxy.providers.base import Operation, Upstream, WireFormat
from proxy.sse import EventReader
from proxy.translate import _gemini, openai_embeddings
from proxy.usage import TokenUsage
from vkgate.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.formats import StreamPipe
    from proxy.gateway import Gateway, Route
    from proxy.runtime import KeyRuntime

# The gateway makes this family (`Gateway.gemini`), so what this module needs of the gateway's
# (its `Route`, `Prepared` and `chain_for`) is imported where it is used, once it is loaded.

PREFIX = "/v1beta"
METHODS: dict[str, Operation] = {
    "generateContent": Operation.GENERATE_CONTENT,
    "streamGenerateContent": Operation.STREAM_GENERATE_CONTENT,
    "countTokens": Operation.COUNT_TOKENS,
    "embedContent": Operation.EMBED_CONTENT,
    "batchEmbedContents": Operation.BATCH_EMBED_CONTENTS,
}
LABELS = {
    prefix: {name: f"{prefix}/models/*:{name}" for name in METHODS} for prefix in (PREFIX, "/v1")
}
"""Route labels (metrics, traces, spend records): never the model, whose names are unbounded."""
MODELS_LABEL = f"{PREFIX}/models"
OTHER_LABEL = "other"
"""A path neither family serves: the one label of all of them, as on `/v1`."""
_GENERATION = frozenset({Operation.GENERATE_CONTENT, Operation.STREAM_GENERATE_CONTENT})
_EMBEDDING = frozenset({Operation.EMBED_CONTENT, Operation.BATCH_EMBED_CONTENTS})
_encode = msgspec.json.Encoder().encode
_object = msgspec.json.Decoder(dict[str, Any])


class _GenerationConfig(msgspec.Struct):
    maxOutputTokens: int | None = None
    candidateCount: int | None = None


class _Generate(msgspec.Struct):
    """What the pipeline reads of a generateContent body: its output cap, for budgets."""

    generationConfig: _GenerationConfig | None = None


_generate = msgspec.json.Decoder(_Generate)


class GeminiApi:
    """The `/v1beta` route family, its requests handed to the gateway's pipeline."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, prefix: str = PREFIX
    ) -> None:
        """A request whose path (`scope["path"]`) is below `prefix`."""
        from proxy.gateway import Route

        head = Head(scope)
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if head.key is None:
            header = dict(scope["headers"]).get(b"x-goog-api-key")
            if header:
                head.key = header.decode("latin-1").strip() or None
            elif query.get("key"):
                head.key = query["key"][0].strip() or None
        path = scope["path"].rstrip("/")
        route: Route | None = None
        label = OTHER_LABEL
        listing: Callable[[KeyRuntime], bytes] | None = None
        name, colon, method = path.removeprefix("/models/").rpartition(":")
        if path.startswith("/models/") and colon and method in METHODS:
            operation = METHODS[method]
            label = LABELS[prefix][method]
            stream = operation is Operation.STREAM_GENERATE_CONTENT
            if stream and query.get("alt") != ["sse"]:
                prepare = partial(
                    _refuse, invalid("only `alt=sse` streams are served", param="alt")
                )
            else:
                prepare = partial(_prepare, name, operation)
            shape = Shape.GEMINI if operation in _GENERATION else Shape.GEMINI_EMBED
            route = Route(label, prepare, WireFormat.GEMINI, shape)
        elif prefix != PREFIX:
            pass  # under /v1, only the methods are Gemini's
        elif path == "/models":
            label, listing = MODELS_LABEL, _listing
        elif path.startswith("/models/") and not colon:
            label, listing = MODELS_LABEL, partial(_one_model, path.removeprefix("/models/"))
        await self._gateway(
            scope,
            receive,
            send,
            head,
            route,
            label,
            client=WireFormat.GEMINI,
            listing=listing,
            prefix=prefix,
        )


def _refuse(error: ProxyError, runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
    raise error


def _prepare(
    model: str, operation: Operation, runtime: KeyRuntime, head: Head, body: bytes
) -> Prepared:
    max_output: int | None = 0
    if operation in _GENERATION:
        try:
            config = _generate.decode(body).generationConfig
        except msgspec.ValidationError as exc:
            raise invalid(f"request body: {exc}") from None
        except msgspec.DecodeError as exc:
            raise invalid(f"request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise invalid(B.TOO_DEEP) from None
        max_output = None
        if config is not None and config.maxOutputTokens is not None:
            max_output = config.maxOutputTokens * (config.candidateCount or 1)
    exchange = GeminiExchange(operation, body)
    return Prepared(model, exchange, head.end_user, body, max_output)


def _served(chain: tuple[Upstream, ...]) -> bool:
    return any(upstream.wire is WireFormat.GEMINI for upstream in chain)


def _model(alias: str) -> dict[str, Any]:
    return {
        "name": f"models/{alias}",
        "displayName": alias,
        "supportedGenerationMethods": list(METHODS),
    }


def _listing(runtime: KeyRuntime) -> bytes:
    """The key's aliases a Gemini credential serves, as Google lists models."""
    models = [_model(alias) for alias, chain in sorted(runtime.chains.items()) if _served(chain)]
    return _encode({"models": models})


def _one_model(name: str, runtime: KeyRuntime) -> bytes:
    from proxy.gateway import chain_for

    alias = name.removeprefix("models/")
    if not _served(chain_for(runtime, alias)):
        raise ProxyError(
            ErrorCode.MODEL_NOT_FOUND,
            f"model {alias!r} is not served by a Gemini credential",
            param="model",
        )
    return _encode(_model(alias))


class GeminiExchange:
    """A Gemini API request, passed through to `gemini` and `vertex_ai` credentials."""

    __slots__ = ("_body", "_operation", "estimates_output", "stream")
    client = WireFormat.GEMINI
    same_format_headers: Mapping[str, str] = {}

    def __init__(self, operation: Operation, body: bytes) -> None:
        self._operation = operation
        self._body = body
        self.stream = operation is Operation.STREAM_GENERATE_CONTENT
        self.estimates_output = operation in _GENERATION

    def operation(self, upstream: Upstream) -> Operation:
        # Only a Gemini credential has the Gemini API's operations: the others are passed over.
        return self._operation

    def body_for(self, upstream: Upstream) -> bytes:
        if self._operation is Operation.BATCH_EMBED_CONTENTS:
            return _batch_for(self._body, upstream)
        if self._operation is Operation.COUNT_TOKENS and b"generateContentRequest" in self._body:
            return _count_for(self._body, upstream)
        return self._body

    def usage_of(
        self, upstream: Upstream, status: int, data: bytes
    ) -> tuple[TokenUsage | None, str | None]:
        if status >= 300:
            return None, None
        if self._operation in _EMBEDDING:
            return openai_embeddings.google_usage(data)
        return _gemini.usage_of(data)

    def render(self, upstream: Upstream, status: int, data: bytes) -> bytes:
        return data

    def pipe(self, upstream: Upstream) -> StreamPipe:
        return GeminiStream()


def _model_name(upstream: Upstream) -> str | None:
    """How a request inside a body names the credential's model: Google AI Studio wants
    `models/…`; Vertex AI takes the model from the URL, and none in the body."""
    if upstream.kind != "gemini":
        return None
    return upstream.model if "/" in upstream.model else "models/" + upstream.model


def _decoded(body: bytes) -> dict[str, Any]:
    try:
        return _object.decode(body)
    except msgspec.DecodeError as exc:
        raise invalid(f"request body is not a JSON object: {exc}") from None


def _batch_for(body: bytes, upstream: Upstream) -> bytes:
    """Each request of a batch names its model: the credential's, not the alias."""
    payload = _decoded(body)
    requests = payload.get("requests")
    if not isinstance(requests, list):
        raise invalid("`requests` must be a list", param="requests")
    model = _model_name(upstream)
    for request in requests:
        if isinstance(request, dict):
            if model is None:
                request.pop("model", None)
            else:
                request["model"] = model
    return _encode(payload)


def _count_for(body: bytes, upstream: Upstream) -> bytes:
    payload = _decoded(body)
    inner = payload.get("generateContentRequest")
    if isinstance(inner, dict) and "model" in inner:
        model = _model_name(upstream)
        if model is None:
            del inner["model"]
        else:
            inner["model"] = model
    return _encode(payload)


class GeminiStream:
    """A Gemini SSE stream passed through untouched. Every event carries the usage so far, so
    only the last one is read, once the stream has ended."""

    __slots__ = ("_last", "_reader", "errored", "model", "usage")

    def __init__(self) -> None:
        self._reader = EventReader()
        self._last = b""
        self.usage: TokenUsage | None = None
        self.model: str | None = None
        self.errored = False

    def feed(self, data: bytes) -> bytes:
        events = self._reader.feed(data)
        if events:
            self._last = events[-1].data
        return data

    def finish(self) -> bytes:
        events = self._reader.flush()
        if events:
            self._last = events[-1].data
        last = _last_event(self._last)
        if last is None or last.error is not None:
            self.errored = True
            return b""
        if last.usageMetadata is not None:
            self.usage = _gemini.token_usage(last.usageMetadata)
        self.model = last.modelVersion or None
        finished = any(c.finishReason for c in last.candidates)
        self.errored = not finished and not last.promptFeedback
        return b""


class _Finish(msgspec.Struct):
    finishReason: str | None = None


class _Last(msgspec.Struct):
    candidates: list[_Finish] = []
    usageMetadata: _gemini.UsageMetadata | None = None
    modelVersion: str = ""
    promptFeedback: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


_last = msgspec.json.Decoder(_Last)


def _last_event(data: bytes) -> _Last | None:
    if not data:
        return None
    try:
        return _last.decode(data)
    except msgspec.DecodeError:
        return None
