"""Sending a request along an alias's credential chain and passing the answer back.

An attempt falls through to the next credential on a connect error, a timeout before the
answer, a 429 or a 5xx; a provider's other 4xx is the answer. Nothing falls through once a
byte reached the client, and before each further (paid) attempt the caller checks that the key
may still be used. Streams go out chunk by chunk as the provider sends them, and a client
that goes away cancels the provider's request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from proxy.asgi import Receive, Send, respond
from proxy.errors import ProxyError
from proxy.providers import Operation, ProviderTimeout, ProviderUnreachable, Upstream
from proxy.providers.base import Reply
from proxy.sse import UsageChunkFilter
from vkgate.errors import ErrorCode

BodyFor = Callable[[Upstream], bytes]
Recheck = Callable[[], Awaitable[None]]
"""Raises the key's refusal when it may no longer be used (revoked or disabled meanwhile)."""
log = logging.getLogger("vkgate.proxy")


async def _first_answer(
    chain: tuple[Upstream, ...],
    operation: Operation,
    body_for: BodyFor,
    headers: Mapping[str, str],
    recheck: Recheck,
) -> tuple[Upstream, Reply]:
    """The first reply worth giving the client, walking the chain: a 2xx or a provider's 4xx.

    A 429 falls through while another credential is left; the last one's 429 is the answer.
    When every credential of a longer chain failed, the error keeps each attempt's cause.
    """
    causes: list[str] = []
    failure: ProxyError | None = None
    last = len(chain) - 1
    for index, upstream in enumerate(chain):
        name = upstream.provider_name
        if index > 0:
            await recheck()
        try:
            reply = await upstream.adapter.send(
                upstream, operation, body_for(upstream), {**upstream.headers, **headers}
            )
        except ProviderTimeout:
            failure = ProxyError(
                ErrorCode.PROVIDER_TIMEOUT, f"provider {name} did not answer in time"
            )
        except ProviderUnreachable:
            failure = ProxyError(ErrorCode.PROVIDER_ERROR, f"provider {name} could not be reached")
        else:
            if reply.status < 500 and (reply.status != 429 or index == last):
                return upstream, reply
            reply.close()
            failure = ProxyError(
                ErrorCode.PROVIDER_ERROR, f"provider {name} failed with HTTP {reply.status}"
            )
        causes.append(failure.message)
    assert failure is not None
    if len(causes) > 1:
        raise ProxyError(
            ErrorCode.CHAIN_EXHAUSTED,
            "every provider for this model failed: " + "; ".join(causes),
        )
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


async def _read(upstream: Upstream, reply: Reply) -> bytes:
    """The whole of a provider's answer, its failures mapped to ours; the reply is closed."""
    try:
        return await reply.read()
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


async def forward(
    chain: tuple[Upstream, ...],
    operation: Operation,
    body_for: BodyFor,
    headers: Mapping[str, str],
    send: Send,
    request_id: bytes,
    recheck: Recheck,
) -> None:
    """A plain answer, or a provider's own 4xx, passed back whole."""
    upstream, reply = await _first_answer(chain, operation, body_for, headers, recheck)
    data = await _read(upstream, reply)
    await respond(send, reply.status, data, _answer_headers(upstream, reply, request_id))


async def forward_stream(
    chain: tuple[Upstream, ...],
    body_for: BodyFor,
    headers: Mapping[str, str],
    strip_usage: Callable[[Upstream], bool],
    receive: Receive,
    send: Send,
    request_id: bytes,
    recheck: Recheck,
) -> None:
    upstream, reply = await _first_answer(chain, Operation.CHAT, body_for, headers, recheck)
    if reply.status >= 300:
        # A provider's refusal is a JSON body, not a stream: passed back whole.
        data = await _read(upstream, reply)
        await respond(send, reply.status, data, _answer_headers(upstream, reply, request_id))
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
            task.cancel()
        # Both are awaited and the provider's response closed whatever either raised.
        outcomes = await asyncio.gather(pump, watcher, return_exceptions=True)
        reply.close()
    failure = outcomes[0]
    if isinstance(failure, Exception):
        # Once the answer started nothing else can be sent; usually the client went away.
        log.warning("stream ended early: %s", type(failure).__name__)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _pump(
    reply: Reply,
    usage_filter: UsageChunkFilter | None,
    send: Send,
    headers: list[tuple[bytes, bytes]],
) -> None:
    try:
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
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
        error = ProxyError(code, "the provider's stream broke off before it finished")
        tail = b"data: " + error.openai_body() + b"\n\n"
    finally:
        reply.close()
    await send({"type": "http.response.body", "body": tail, "more_body": False})
