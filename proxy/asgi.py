"""ASGI primitives for the raw `/v1` handlers: the request head, the body, and responses."""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from proxy.errors import ProxyError
from proxy.providers.base import WireFormat
from vkgate.errors import ErrorCode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Watch = Callable[[Callable[[], None] | None], None]
"""`watch(callback)`: have `callback()` called once if the client goes away before its answer
is complete; `watch(None)`: stop."""

ON_DISCONNECT = "vkgate.on_disconnect"
"""The scope extension (`{"watch": Watch}`) of the proxy's own HTTP/1.1 protocol
(`proxy.http1`): a stream learns that its client left from a callback, not from a task waiting
on `receive` (a task and its cancellation per stream cost more than the rest of the pump).
Under another server there is no such extension, and the task waits on `receive` instead."""

JSON = b"application/json"
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
_TRACEPARENT = re.compile(rb"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


class ClientGone(Exception):
    """The client disconnected before its request was read."""


class Head:
    """What the pipeline needs from the request's headers, found in one pass."""

    __slots__ = (
        "anthropic_beta",
        "anthropic_version",
        "cache_control",
        "content_length",
        "content_type",
        "end_user",
        "generated_id",
        "key",
        "request_id",
        "traceparent",
    )

    def __init__(self, scope: Scope) -> None:
        # Made in C, then eight lookups: a Python loop comparing every header with each name
        # wanted took 1.5 µs for an SDK's 16 headers, this 0.75 µs.
        get = dict(scope["headers"]).get  # the last of a name wins
        key = get(b"authorization")
        api_key = get(b"x-api-key")
        request_id = get(b"x-request-id")
        traceparent = get(b"traceparent")
        length = get(b"content-length")
        end_user = get(b"x-vkgate-end-user")
        self.anthropic_beta: bytes | None = get(b"anthropic-beta")
        self.anthropic_version: bytes | None = get(b"anthropic-version")
        self.content_type: bytes | None = get(b"content-type")
        """Read by the upload routes (multipart/form-data and its boundary)."""
        self.cache_control: bytes | None = get(b"cache-control")
        """Whether the client said anything to the response cache (every such header is
        read when one is there)."""
        self.key = _bearer(key) if key is not None else None
        if self.key is None and api_key:
            self.key = api_key.decode("latin-1").strip() or None
        if request_id is not None and _REQUEST_ID.fullmatch(request_id):
            self.request_id: bytes = request_id
            self.generated_id = False
        else:
            self.request_id = os.urandom(16).hex().encode()
            self.generated_id = True
            """The request id is ours, not the client's: a trace the proxy starts lends its."""
        self.traceparent = (
            traceparent if traceparent is not None and _TRACEPARENT.fullmatch(traceparent) else None
        )
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.end_user = end_user.decode("latin-1").strip() or None if end_user is not None else None


def disconnect_watch(scope: Scope) -> Watch | None:
    """The server's `ON_DISCONNECT` extension, if it has one."""
    extensions = scope.get("extensions")
    found = extensions.get(ON_DISCONNECT) if extensions else None
    return found["watch"] if found else None


def _bearer(value: bytes) -> str | None:
    scheme, _, token = value.decode("latin-1").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


async def read_body(receive: Receive, limit: int, content_length: int | None) -> bytes:
    """The whole request body; 413 as soon as it is known to exceed `limit` bytes."""
    if content_length is not None and content_length > limit:
        raise too_large(limit)
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > limit:
            raise too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


def too_large(limit: int) -> ProxyError:
    return ProxyError(
        ErrorCode.PAYLOAD_TOO_LARGE,
        f"request body is larger than {limit} bytes (VKGATE_MAX_BODY_BYTES)",
        # The rest of the body is not read: the connection ends with the answer.
        headers=((b"connection", b"close"),),
    )


async def respond(
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
) -> None:
    # With its length known the server need not chunk the answer.
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def respond_error(
    send: Send, error: ProxyError, request_id: bytes, client: WireFormat = WireFormat.OPENAI
) -> None:
    """The error in the route's format: Anthropic's for `/v1/messages`, Google's for the
    Gemini API, OpenAI's elsewhere."""
    headers = [(b"content-type", JSON), (b"x-request-id", request_id), *error.headers]
    if client is WireFormat.ANTHROPIC:
        body = error.anthropic_body()
    elif client is WireFormat.GEMINI:
        body = error.google_body()
    else:
        body = error.openai_body()
    await respond(send, error.status, body, headers)
