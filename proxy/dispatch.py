"""Sending a request along an alias's credential chain and passing the answer back.

An attempt falls through to the next credential on a connect error, a timeout before the
answer, a 429 or a 5xx; a provider's other 4xx is the answer. Nothing falls through once a
byte reached the client. Streams go out chunk by chunk as the provider sends them, and a client
that goes away cancels the provider's request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

import msgspec

from proxy.asgi import Receive, Send, respond
from proxy.errors import ProxyError
from proxy.providers import Operation, ProviderTimeout, ProviderUnreachable, Upstream
from proxy.providers.base import Reply
from proxy.sse import UsageChunkFilter
from vkgate.errors import ERRORS, ErrorCode

BodyFor = Callable[[Upstream], bytes]
_encode = msgspec.json.Encoder().encode


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


async def _first_answer(
    chain: tuple[Upstream, ...],
    operation: Operation,
    body_for: BodyFor,
    headers: Mapping[str, str],
) -> tuple[Upstream, Reply]:
    """The first reply worth giving the client, walking the chain."""
    failure: ProxyError | None = None
    last = len(chain) - 1
    for index, upstream in enumerate(chain):
        try:
            reply = await upstream.adapter.send(
                upstream, operation, body_for(upstream), {**upstream.headers, **headers}
            )
        except ProviderTimeout:
            failure = ProxyError(
                ErrorCode.PROVIDER_TIMEOUT,
                f"provider {upstream.provider_name} did not answer in time",
            )
            continue
        except ProviderUnreachable:
            failure = ProxyError(
                ErrorCode.PROVIDER_ERROR, f"provider {upstream.provider_name} could not be reached"
            )
            continue
        if index < last and _retryable(reply.status):
            reply.close()
            failure = None
            continue
        return upstream, reply
    assert failure is not None
    raise failure


def _answer_headers(
    upstream: Upstream, reply: Reply, request_id: bytes
) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", reply.content_type),
        (b"x-request-id", request_id),
        (b"x-vkgate-provider", upstream.provider_name.encode()),
    ]
    if reply.retry_after is not None:
        headers.append((b"retry-after", reply.retry_after))
    return headers


async def _pass_failure(upstream: Upstream, reply: Reply, send: Send, request_id: bytes) -> None:
    """A provider's non-2xx answer: 4xx passed through as sent, 5xx as our 502."""
    try:
        data = await reply.read()
    finally:
        reply.close()
    if reply.status < 500:
        await respond(send, reply.status, data, _answer_headers(upstream, reply, request_id))
        return
    raise ProxyError(
        ErrorCode.PROVIDER_ERROR,
        f"provider {upstream.provider_name} failed with HTTP {reply.status}",
    )


async def forward(
    chain: tuple[Upstream, ...],
    operation: Operation,
    body_for: BodyFor,
    headers: Mapping[str, str],
    send: Send,
    request_id: bytes,
) -> None:
    upstream, reply = await _first_answer(chain, operation, body_for, headers)
    if reply.status >= 300:
        await _pass_failure(upstream, reply, send, request_id)
        return
    try:
        data = await reply.read()
    except ProviderTimeout:
        raise ProxyError(
            ErrorCode.PROVIDER_TIMEOUT, f"provider {upstream.provider_name} did not answer in time"
        ) from None
    except ProviderUnreachable:
        raise ProxyError(
            ErrorCode.PROVIDER_ERROR,
            f"provider {upstream.provider_name} broke off its answer",
        ) from None
    finally:
        reply.close()
    await respond(send, reply.status, data, _answer_headers(upstream, reply, request_id))


async def forward_stream(
    chain: tuple[Upstream, ...],
    body_for: BodyFor,
    headers: Mapping[str, str],
    strip_usage: Callable[[Upstream], bool],
    receive: Receive,
    send: Send,
    request_id: bytes,
) -> None:
    upstream, reply = await _first_answer(chain, Operation.CHAT, body_for, headers)
    if reply.status >= 300:
        await _pass_failure(upstream, reply, send, request_id)
        return
    answer_headers = _answer_headers(upstream, reply, request_id)
    answer_headers.append((b"cache-control", b"no-cache"))
    pump = asyncio.ensure_future(
        _pump(reply, UsageChunkFilter() if strip_usage(upstream) else None, send, answer_headers)
    )
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((pump, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (pump, watcher):
            if not task.done():
                task.cancel()
        # The pump closes the provider's response on any exit, cancellation included.
        with contextlib.suppress(asyncio.CancelledError):
            await pump
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        reply.close()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _pump(
    reply: Reply,
    usage_filter: UsageChunkFilter | None,
    send: Send,
    headers: list[tuple[bytes, bytes]],
) -> None:
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    try:
        async for chunk in reply.chunks():
            data = usage_filter.feed(chunk) if usage_filter is not None else chunk
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})
        tail = usage_filter.flush() if usage_filter is not None else b""
    except (ProviderTimeout, ProviderUnreachable) as exc:
        # Headers went out: the error travels in the stream, the way OpenAI reports one.
        code = (
            ErrorCode.PROVIDER_TIMEOUT
            if isinstance(exc, ProviderTimeout)
            else ErrorCode.PROVIDER_ERROR
        )
        message = "the provider's stream broke off before it finished"
        error = {"message": message, "type": ERRORS[code].openai_type, "code": code, "param": None}
        tail = b"data: " + _encode({"error": error}) + b"\n\n"
    finally:
        reply.close()
    await send({"type": "http.response.body", "body": tail, "more_body": False})
