"""The cache step of the pipeline: after model resolution, before the budget precheck.

A request whose key has a cache rule for its alias is looked up by an exact-match key (the
organization, the rule's scope, the route, the alias and the body normalised); a hit is
answered here, without a provider call, plain as stored or replayed as a stream in the route's
format. A miss is recorded on its way to the client and, when it was a whole 2xx, stored in a
canonical form (the plain answer) from which either form is rendered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from proxy.asgi import JSON, Head, Message, Scope, Send
from proxy.cache import _anthropic, _openai
from proxy.cache._events import NotAnAnswer
from proxy.cache.rules import CacheScope
from proxy.cache.stores import CacheStore
from proxy.digests import sha256_held
from proxy.guardrails import warnings
from proxy.providers.base import WireFormat
from proxy.telemetry.metrics import Tally

if TYPE_CHECKING:
    from proxy.dispatch import Outcome
    from proxy.guardrails import AnswerScreen
    from proxy.prepared import Prepared
    from proxy.runtime import KeyRuntime
    from vkgate.spend import SpendRecord

HEADER = b"x-vkgate-cache"
CACHED_ROUTES = frozenset({"/v1/chat/completions", "/v1/messages", "/v1/embeddings"})
"""The routes whose answers are cached: chat completions, Anthropic messages, embeddings."""
_LEFT_OUT = ("stream", "user", "stream_options")
"""Request fields that do not change the answer (how it is delivered, who asked)."""
_KEY_VERSION = b"vkgate-cache-v1\x00"
STREAM_RECORDING_FACTOR = 4
"""A stream is recorded up to this many times `VKGATE_CACHE_MAX_ENTRY_BYTES`."""
_normal = msgspec.json.Encoder(order="sorted")


class CachedAnswer(msgspec.Struct, frozen=True, array_like=True):
    """What an entry holds: the plain answer in the route's format, and what its spend record
    needs on a hit (who made it, and what it cost)."""

    format: str
    body: bytes
    """The whole plain answer (JSON) as a non-streaming client gets it."""
    stored_at: float
    """Unix seconds: a hit's `Age`."""
    provider_id: str
    provider_kind: str
    upstream_model: str
    served_model: str | None
    saved_nano_usd: int
    """The price of the call that made the answer: what each hit spares."""


_encode_entry = msgspec.msgpack.Encoder().encode
_decode_entry = msgspec.msgpack.Decoder(CachedAnswer).decode


class Recorder:
    """The client's `send`, keeping a copy of the answer (up to `limit` bytes) on the way."""

    __slots__ = ("_limit", "_send", "ended", "overflowed", "parts", "size", "status")

    def __init__(self, send: Send, limit: int) -> None:
        self._send = send
        self._limit = limit
        self.status = 0
        self.parts: list[bytes] = []
        self.size = 0
        self.overflowed = False
        self.ended = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            body: bytes = message.get("body", b"")
            if not self.overflowed:
                self.size += len(body)
                if self.size > self._limit:
                    self.overflowed = True
                    self.parts.clear()
                else:
                    self.parts.append(body)
            if not message.get("more_body", False):
                self.ended = True
        await self._send(message)


class CachedRequest:
    """One cacheable request's place in the cache: its key, what the client asked of the
    cache (`mode`), and the entry found, if any."""

    __slots__ = ("_cache", "_doc", "hit", "key", "mode", "recorder", "scope", "stream", "wire")

    def __init__(
        self,
        cache: ResponseCache,
        key: bytes,
        scope: CacheScope,
        mode: str,
        wire: WireFormat,
        stream: bool,
        doc: dict[str, Any],
    ) -> None:
        self._cache = cache
        self._doc = doc
        self.key = key
        self.scope = scope
        self.mode = mode
        """`hit`, `miss`, `refresh` (`Cache-Control: no-cache`) or `bypass` (`no-store`)."""
        self.wire = wire
        self.stream = stream
        self.hit: CachedAnswer | None = None
        self.recorder: Recorder | None = None

    @property
    def header(self) -> tuple[bytes, bytes]:
        return (HEADER, self.mode.encode())

    def recording(self, send: Send) -> Send:
        """`send`, recording the answer when it may be stored."""
        if self.mode == "bypass":
            return send
        limit = self._cache.max_entry_bytes
        if self.stream:
            # A stream's events take several times the bytes of the answer they add up to;
            # the entry made of them is held to the bound itself.
            limit *= STREAM_RECORDING_FACTOR
        self.recorder = Recorder(send, limit)
        return self.recorder

    async def serve(
        self,
        send: Send,
        request_id: bytes,
        extra: Sequence[tuple[bytes, bytes]],
        outcome: Outcome,
        now: Callable[[], float],
        screen: AnswerScreen | None = None,
    ) -> None:
        """Answer from the entry found: plain as stored, or replayed as a stream, through
        `screen` (the key's response guardrails as they stand now). A block raises before
        anything is sent."""
        hit = self.hit
        assert hit is not None
        if self.stream:
            answer = msgspec.json.decode(hit.body)
            if self.wire is WireFormat.ANTHROPIC:
                body = _anthropic.replay(answer)
            else:
                options = self._doc.get("stream_options")
                wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
                body = _openai.replay(answer, with_usage=wants_usage)
            content_type = b"text/event-stream"
        else:
            body, content_type = hit.body, JSON
        if screen is not None:
            if self.stream:
                guard = screen.stream()
                body = await guard.close(body)
            elif not screen.passes(body):
                body = await screen.plain(body)
        age = max(0, int(self._cache.wall() - hit.stored_at))
        headers = [
            (b"content-type", content_type),
            (b"x-request-id", request_id),
            (HEADER, b"hit"),
            (b"age", str(age).encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        if self.stream:
            headers.append((b"cache-control", b"no-cache"))
        headers.extend(extra)
        if screen is not None:
            headers.extend(warnings(screen.verdicts))
        outcome.status = 200
        outcome.cached = hit
        outcome.first_byte_at = now()
        # The spend record is written before the answer's last byte, as for a provider's.
        outcome.answered()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def store(self, outcome: Outcome, record: SpendRecord | None) -> None:
        """Keep the answer the client just got, when it was whole and 2xx."""
        recorder, upstream = self.recorder, outcome.upstream
        if recorder is None:
            return
        if recorder.overflowed:
            self._cache.kept("too_large")
            return
        if (
            upstream is None
            or not 200 <= recorder.status < 300
            or not recorder.ended
            or outcome.broke
            or outcome.cancelled
            # A stream a response guardrail cut short ends in its refusal: never replayed.
            or outcome.blocked
        ):
            self._cache.kept("not_stored")
            return
        data = b"".join(recorder.parts)
        try:
            if self.stream:
                if self.wire is WireFormat.ANTHROPIC:
                    answer = _anthropic.assemble(data)
                else:
                    answer = _openai.assemble(data, outcome.usage)
                body = msgspec.json.encode(answer)
            else:
                if not isinstance(msgspec.json.decode(data), dict):
                    raise NotAnAnswer("not a JSON object")
                body = data
        except (NotAnAnswer, msgspec.DecodeError, KeyError, TypeError, AttributeError):
            # An answer this cache cannot read back whole is served, and not kept.
            self._cache.kept("unreadable")
            return
        saved = 0
        if record is not None and upstream.rates is not None:
            saved = upstream.rates.spent(record)
        entry = CachedAnswer(
            format=self.wire.value,
            body=body,
            stored_at=self._cache.wall(),
            provider_id=upstream.provider_id,
            provider_kind=upstream.kind,
            upstream_model=upstream.model,
            served_model=outcome.served_model,
            saved_nano_usd=saved,
        )
        encoded = _encode_entry(entry)
        if len(encoded) > self._cache.max_entry_bytes:
            self._cache.kept("too_large")
            return
        await self._cache.store.put(self.key, encoded, self.scope.ttl_s)
        self._cache.kept("stored")


class ResponseCache:
    """The process's response cache over one store."""

    def __init__(
        self,
        store: CacheStore,
        *,
        max_entry_bytes: int,
        wall: Callable[[], float] = time.time,
        lookups: Tally | None = None,
        stores: Tally | None = None,
    ) -> None:
        self.store = store
        self.max_entry_bytes = max_entry_bytes
        self.wall = wall
        self._lookups = lookups
        self._stores = stores

    def counted(self, request: CachedRequest) -> None:
        if self._lookups is not None:
            self._lookups.add((request.mode,))

    def kept(self, result: str) -> None:
        if self._stores is not None:
            self._stores.add((result,))

    async def lookup(
        self, scope: Scope, head: Head, runtime: KeyRuntime, route: str, prepared: Prepared
    ) -> CachedRequest | None:
        """The request's place in the cache, its entry looked up unless the client said not
        to; None when no rule covers it (or it is not of a cached route)."""
        rule = runtime.cache_scopes.get(prepared.model)
        if rule is None or route not in CACHED_ROUTES:
            return None
        doc = _decoded(prepared.body)
        if doc is None:
            return None
        wire = WireFormat.ANTHROPIC if route == "/v1/messages" else WireFormat.OPENAI
        stream = bool(doc.get("stream"))
        key = cache_key(
            runtime.organization_id,
            rule.namespace,
            route,
            prepared.model,
            doc,
            prepared.exchange.same_format_headers,
        )
        mode, max_age = ("miss", None) if head.cache_control is None else _directives(scope)
        request = CachedRequest(self, key, rule, mode, wire, stream, doc)
        if mode == "miss":
            found = await self.store.get(key)
            if found is not None:
                entry = _entry(found)
                if entry is not None and entry.format == wire.value:
                    if max_age is not None and self.wall() - entry.stored_at > max_age:
                        # Older than the client takes: asked again, and replaced.
                        request.mode = "refresh"
                    else:
                        request.hit = entry
                        request.mode = "hit"
        self.counted(request)
        return request

    async def close(self) -> None:
        await self.store.close()


def _decoded(body: bytes) -> dict[str, Any] | None:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _entry(data: bytes) -> CachedAnswer | None:
    try:
        return _decode_entry(data)
    except msgspec.DecodeError:
        # Written by another release, or not by us: a miss, then overwritten.
        return None


def cache_key(
    organization_id: str,
    namespace: bytes,
    route: str,
    alias: str,
    doc: dict[str, Any],
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """The entry's key: a SHA-256 of everything that decides the answer and its scope. The body
    is normalised (key order, whitespace) with the fields that do not change the answer left
    out: `stream`, `user`, `stream_options`, and Anthropic's `metadata.user_id`. `headers` are
    the client's headers that shape the answer too (Anthropic's version and betas)."""
    normal = {k: v for k, v in doc.items() if k not in _LEFT_OUT}
    metadata = normal.get("metadata")
    if route == "/v1/messages" and isinstance(metadata, dict) and "user_id" in metadata:
        rest = {k: v for k, v in metadata.items() if k != "user_id"}
        if rest:
            normal["metadata"] = rest
        else:
            del normal["metadata"]
    parts = [organization_id.encode(), namespace, route.encode(), alias.encode()]
    if headers:
        parts.append(_normal.encode(dict(headers)))
    parts.append(_normal.encode(normal))
    # One buffer hashed in one call: on a request path each hashlib call costs more than the
    # bytes it reads.
    digest: str = sha256_held(_KEY_VERSION + b"\x00".join(parts)).hexdigest()
    return digest.encode()


def _directives(scope: Scope) -> tuple[str, int | None]:
    """What the request's `Cache-Control` asks (RFC 9111), and the oldest answer it takes in
    seconds: `no-store` bypasses the cache, `no-cache` (or `max-age=0`) refreshes the entry,
    `max-age=N` refreshes one older than N seconds; anything else may be served from it."""
    mode, max_age = "miss", None
    for name, value in scope["headers"]:
        if name == b"cache-control":
            for token in value.decode("latin-1").lower().split(","):
                directive = token.strip()
                if directive == "no-store":
                    return "bypass", None
                if directive == "no-cache":
                    mode = "refresh"
                elif directive.startswith("max-age="):
                    seconds = directive[8:].strip().strip('"')
                    if seconds.isdigit():
                        max_age = int(seconds) if max_age is None else min(max_age, int(seconds))
    if max_age == 0:
        mode = "refresh"
    return mode, max_age
