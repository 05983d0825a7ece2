"""Sending a request along an alias's credential chain and passing the answer back.

The walk falls through to the next credential on a connect error, a timeout before the answer,
a 429, a 401 or 403 (the provider refused the gateway's credential: another may hold the
access it lacks) or a 5xx; a provider's other 4xx is the answer. A lone 429, 401 or 403, when
no other credential was called, is passed back as the provider gave it, and so is the last
401 or 403 when every credential refused the gateway's. A credential whose
circuit breaker is open, or whose provider asked to be left alone (`Retry-After`), is skipped
without a call.
Nothing falls through once a byte reached the client: a stream is committed only when its
first chunk arrived, and one that breaks later ends with an error event in the client's format.
Before each further (paid) attempt the caller checks that the key may still be used. A client
that goes away cancels the provider's request.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from proxy.asgi import JSON, Receive, Send, Watch, respond
from proxy.breaker import Breakers, CircuitBreaker
from proxy.errors import Cause, ProxyError
from proxy.formats import Exchange, StreamPipe, stream_error
from proxy.guardrails import AnswerScreen, GuardrailBlocked, StreamScreen
from proxy.providers import Operation, ProviderTimeout, ProviderUnreachable, Upstream
from proxy.providers.base import Reply
from proxy.spend.estimate import estimate_tokens
from proxy.telemetry.tracing import RequestSpan, end_attempt
from proxy.usage import MalformedAnswer, TokenUsage
from vkgate.errors import ErrorCode
from vkgate.logs import event

if TYPE_CHECKING:
    from proxy.cache.service import CachedAnswer

Recheck = Callable[[], Awaitable[None]]
"""Raises the key's refusal when it may no longer be used (revoked or disabled meanwhile)."""
log = logging.getLogger("vkgate.proxy")

_CALL_FAILURES = (ProviderTimeout, ProviderUnreachable)
_CREDENTIAL_REFUSED = frozenset({401, 403})


@dataclass(slots=True)
class Outcome:
    """What happened to one request on its way through the chain: the spend record's facts."""

    causes: list[Cause] = field(default_factory=list)
    """Every credential passed over, in order, and why."""
    calls: int = 0
    """Provider calls made (each one may be paid for)."""
    upstream: Upstream | None = None
    """The credential whose answer the client got."""
    status: int = 0
    usage: TokenUsage | None = None
    served_model: str | None = None
    first_byte_at: float | None = None
    """Monotonic time the answer's first byte went to the client."""
    sent_at: float | None = None
    """Monotonic time the walk down the chain began."""
    committed_at: float | None = None
    """Monotonic time an answer was committed to (read whole, or a stream's first chunk)."""
    cancelled: bool = False
    broke: bool = False
    """A stream that broke off after it started."""
    blocked: bool = False
    """A response guardrail ended the stream."""
    estimated_output_tokens: int = 0
    """For a provider that reports no usage: chunks streamed (most send one token per
    chunk), or a tokenizer's count of a plain answer."""
    cached: CachedAnswer | None = None
    """The response-cache entry the answer came from, on a hit (no provider was called)."""
    on_answered: Callable[[], None] | None = None
    """Called once the answer is known and before its last byte goes out: the spend record is
    on disk before the client has the whole answer, so a killed process cannot lose it."""

    def answered(self) -> None:
        if self.on_answered is not None:
            self.on_answered()


@dataclass(slots=True)
class _Committed:
    """The answer the client gets; for a stream, its first chunk and the iterator of the rest."""

    upstream: Upstream
    reply: Reply
    data: bytes | None = None
    """A plain answer's whole body, read before it was committed to."""
    used: tuple[TokenUsage | None, str | None] = (None, None)
    """What the plain answer used, and the model that served it."""
    first: bytes = b""
    rest: AsyncIterator[bytes] | None = None


def _cause(upstream: Upstream, status: int | None, code: ErrorCode) -> Cause:
    return Cause(upstream.provider_name, upstream.provider_id, status, code)


def _failure_code(exc: BaseException) -> ErrorCode:
    return (
        ErrorCode.PROVIDER_TIMEOUT if isinstance(exc, ProviderTimeout) else ErrorCode.PROVIDER_ERROR
    )


class _Walk:
    """One walk down a chain; holds a lone provider 429, 401 or 403 in case it is the only
    answer."""

    __slots__ = (
        "_alias",
        "_breakers",
        "_exchange",
        "_headers",
        "_held",
        "_operation",
        "_outcome",
        "_recheck",
        "_trace",
        "_untranslatable",
    )

    def __init__(
        self,
        exchange: Exchange,
        headers: Mapping[str, str],
        breakers: Breakers,
        recheck: Recheck,
        outcome: Outcome,
        trace: RequestSpan | None = None,
        alias: str = "",
    ) -> None:
        self._exchange = exchange
        self._alias = alias
        self._operation: Operation | None = None
        """The operation a credential was passed over for not serving."""
        self._trace = trace
        self._headers = headers
        self._breakers = breakers
        self._recheck = recheck
        self._outcome = outcome
        self._held: tuple[Upstream, Reply] | None = None
        self._untranslatable: ProxyError | None = None
        """The first 400 a credential of the other format gave the request: the answer when
        no credential could take it."""

    async def first_answer(self, chain: tuple[Upstream, ...]) -> _Committed:
        """The first reply worth giving the client: a 2xx or a provider's own 4xx.

        For a stream the first chunk is waited for too (returned), so a provider that accepts
        and then fails before sending anything is still fallen through.
        """
        outcome = self._outcome
        try:
            for upstream in chain:
                answer = await self._try(upstream)
                if answer is not None:
                    return answer
            held, self._held = self._held, None
            if held is not None and (
                (outcome.calls == 1 and len(outcome.causes) == 1)
                or all(cause.status in _CREDENTIAL_REFUSED for cause in outcome.causes)
            ):
                # The one provider called refused (429, 401, 403), or every one refused the
                # gateway's credential: the last one's own answer, passed through, not a 5xx.
                outcome.causes.pop()
                return _Committed(*held)
            raise _exhausted(outcome.causes, self._breakers, self._untranslatable, self._unserved())
        finally:
            if self._held is not None:
                self._held[1].close()

    def _unserved(self) -> str:
        """The words for a chain none of whose credentials serves the route."""
        operation = self._operation.value if self._operation is not None else "this route"
        model = f"model {self._alias!r}" if self._alias else "this model"
        return f"no provider of {model} serves {operation}"

    async def _try(self, upstream: Upstream) -> _Committed | None:
        outcome, exchange = self._outcome, self._exchange
        operation = exchange.operation(upstream)
        if operation not in upstream.urls:
            self._operation = operation
            outcome.causes.append(_cause(upstream, None, ErrorCode.UNSUPPORTED_OPERATION))
            return None
        breaker = self._breakers[upstream.provider_id]
        if breaker.resting():
            outcome.causes.append(_cause(upstream, 429, ErrorCode.PROVIDER_RATE_LIMITED))
            return None
        if outcome.calls:
            # Before paying for a further attempt: the key may have been revoked meanwhile.
            await self._recheck()
        if not breaker.admit():
            outcome.causes.append(_cause(upstream, None, ErrorCode.CIRCUIT_OPEN))
            return None
        if self._trace is not None:
            return await self._traced(upstream, operation, breaker, self._trace)
        try:
            return await self._call(upstream, operation, breaker)
        except BaseException:
            breaker.released()
            raise

    async def _traced(
        self, upstream: Upstream, operation: Operation, breaker: CircuitBreaker, trace: RequestSpan
    ) -> _Committed | None:
        """`_call` inside a span of its own, whose `traceparent` the provider gets."""
        causes = self._outcome.causes
        before = len(causes)
        # Neither call raises: a tracing failure costs the trace, never the request.
        span, traceparent = trace.attempt(upstream, self._outcome.calls + 1)
        try:
            answer = await self._call(upstream, operation, breaker, traceparent)
        except BaseException:
            breaker.released()
            end_attempt(span, None, ErrorCode.INTERNAL_ERROR)
            raise
        if answer is not None:
            end_attempt(span, answer.reply.status, None)
        else:
            cause = causes[-1] if len(causes) > before else None
            end_attempt(span, *((cause.status, cause.code) if cause is not None else (None, None)))
        return answer

    async def _call(
        self,
        upstream: Upstream,
        operation: Operation,
        breaker: CircuitBreaker,
        traceparent: str | None = None,
    ) -> _Committed | None:
        outcome, exchange = self._outcome, self._exchange
        try:
            body = exchange.body_for(upstream)
        except ProxyError as exc:
            # The request has a field this credential's format has no place for: another
            # credential of the chain may still take it.
            breaker.released()
            outcome.causes.append(_cause(upstream, None, ErrorCode.INVALID_REQUEST))
            if self._untranslatable is None:
                self._untranslatable = exc
            return None
        headers = {**upstream.headers, **self._headers}
        if traceparent is not None:
            headers["traceparent"] = traceparent
        if exchange.same_format_headers and upstream.wire is exchange.client:
            headers.update(exchange.same_format_headers)
        outcome.calls += 1
        try:
            reply = await upstream.adapter.send(upstream, operation, body, headers)
        except _CALL_FAILURES as exc:
            self._failed(upstream, breaker, None, _failure_code(exc), str(exc))
            return None
        status = reply.status
        if status == 429 or status in _CREDENTIAL_REFUSED:
            if status == 429:
                breaker.rate_limited(reply.retry_after)
                outcome.causes.append(_cause(upstream, 429, ErrorCode.PROVIDER_RATE_LIMITED))
            else:
                # Neither a failure of the provider's (the breaker is not told) nor the client's.
                outcome.causes.append(_cause(upstream, status, ErrorCode.PROVIDER_ERROR))
            breaker.released()
            if self._held is not None:
                self._held[1].close()
            self._held = (upstream, reply)
            return None
        if status >= 500:
            reply.close()
            self._failed(upstream, breaker, status, ErrorCode.PROVIDER_ERROR)
            return None
        if not exchange.stream or status >= 300:
            # Read whole before committing: a provider that breaks off its answer is fallen
            # through like one that never answered; nothing reached the client yet.
            try:
                data = await reply.read()
            except _CALL_FAILURES as exc:
                self._failed(upstream, breaker, status, _failure_code(exc), str(exc))
                return None
            finally:
                reply.close()
            try:
                used = exchange.usage_of(upstream, status, data)
            except MalformedAnswer:
                # A 2xx that is no answer (an HTML error page, a body cut short): fallen
                # through and counted a failure, as a 5xx would be.
                self._failed(upstream, breaker, status, ErrorCode.PROVIDER_ERROR)
                return None
            breaker.succeeded()
            return _Committed(upstream, reply, data=data, used=used)
        rest = reply.chunks()
        try:
            first = await _first_chunk(rest)
        except _CALL_FAILURES as exc:
            reply.close()
            self._failed(upstream, breaker, status, _failure_code(exc), str(exc))
            return None
        except BaseException:
            reply.close()
            raise
        if not first:
            # A 200 with an empty stream answered nothing: fallen through, counted a failure.
            reply.close()
            self._failed(upstream, breaker, status, ErrorCode.PROVIDER_ERROR)
            return None
        breaker.succeeded()
        return _Committed(upstream, reply, first=first, rest=rest)

    def _failed(
        self,
        upstream: Upstream,
        breaker: CircuitBreaker,
        status: int | None,
        code: ErrorCode,
        reason: str | None = None,
    ) -> None:
        """`reason`: what the provider client said of a call that got no whole answer (the
        connection, TLS, a proxy's refusal, a timeout): never the request or the answer."""
        self._outcome.causes.append(_cause(upstream, status, code))
        event(
            log,
            "provider_attempt_failed",
            logging.WARNING,
            provider=upstream.provider_name,
            provider_id=upstream.provider_id,
            status=status,
            code=code.value,
            reason=reason,
        )
        if breaker.failed():
            _breaker_opened(upstream)


def _breaker_opened(upstream: Upstream) -> None:
    event(
        log,
        "breaker_opened",
        logging.WARNING,
        provider=upstream.provider_name,
        provider_id=upstream.provider_id,
    )


async def _first_chunk(chunks: AsyncIterator[bytes]) -> bytes:
    """The stream's first non-empty chunk, or b"" for a stream that ends without one."""
    async for chunk in chunks:
        if chunk:
            return chunk
    return b""


def _exhausted(
    causes: list[Cause],
    breakers: Breakers,
    untranslatable: ProxyError | None,
    unserved: str = "no provider for this model serves this route",
) -> ProxyError:
    """The error for a chain none of whose credentials answered; it keeps every cause."""
    codes = {cause.code for cause in causes}
    headers: tuple[tuple[bytes, bytes], ...] = ()
    waits = [breakers[cause.provider_id].retry_after_s() for cause in causes]
    if waits and min(waits) > 0:
        headers = ((b"retry-after", str(max(1, math.ceil(min(waits)))).encode()),)
    if untranslatable is not None and codes <= _NOT_FOR_THIS_REQUEST:
        # No credential could take the request as it is: the client's to change.
        untranslatable.causes = causes
        error = untranslatable
    elif codes == {ErrorCode.UNSUPPORTED_OPERATION}:
        error = ProxyError(ErrorCode.INVALID_REQUEST, unserved, param="model", causes=causes)
    elif codes == {ErrorCode.PROVIDER_RATE_LIMITED}:
        error = ProxyError(
            ErrorCode.PROVIDER_RATE_LIMITED,
            "every provider for this model is rate limiting its requests",
            headers=headers,
            causes=causes,
        )
    elif codes <= {ErrorCode.CIRCUIT_OPEN, ErrorCode.PROVIDER_RATE_LIMITED}:
        error = ProxyError(
            ErrorCode.CIRCUIT_OPEN,
            "every provider for this model is failing or rate limited; calls are paused",
            headers=headers,
            causes=causes,
        )
    elif len(causes) == 1 or codes == {ErrorCode.PROVIDER_TIMEOUT}:
        code = causes[0].code if len(causes) == 1 else ErrorCode.PROVIDER_TIMEOUT
        error = ProxyError(code, "; ".join(_told(c) for c in causes), causes=causes)
    else:
        error = ProxyError(
            ErrorCode.CHAIN_EXHAUSTED,
            "every provider for this model failed: " + "; ".join(_told(c) for c in causes),
            causes=causes,
        )
    event(
        log,
        "chain_exhausted",
        logging.WARNING,
        code=error.code.value,
        causes=",".join(f"{c.provider_id}:{c.status or '-'}:{c.code}" for c in causes),
    )
    return error


_NOT_FOR_THIS_REQUEST = frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_OPERATION})
_TOLD = {
    ErrorCode.INVALID_REQUEST: "cannot take this request in its format",
    ErrorCode.PROVIDER_TIMEOUT: "did not answer in time",
    ErrorCode.PROVIDER_RATE_LIMITED: "is rate limiting (429)",
    ErrorCode.CIRCUIT_OPEN: "is paused (circuit open)",
    ErrorCode.UNSUPPORTED_OPERATION: "does not serve this route",
}


def _told(cause: Cause) -> str:
    """One cause in words, for the error's message."""
    if cause.code in _TOLD:
        return f"provider {cause.provider} {_TOLD[cause.code]}"
    if cause.status in _CREDENTIAL_REFUSED:
        return f"provider {cause.provider} refused the gateway's credential (HTTP {cause.status})"
    if cause.status is not None:
        return f"provider {cause.provider} failed with HTTP {cause.status}"
    return f"provider {cause.provider} could not be reached"


def _answer_headers(
    upstream: Upstream, reply: Reply, request_id: bytes, fallbacks: int, content_type: bytes
) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", content_type),
        (b"x-request-id", request_id),
        (b"x-vkgate-provider", upstream.provider_name.encode()),
        (b"x-vkgate-fallback-count", str(fallbacks).encode()),
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


class Dispatcher:
    """Walks chains for the gateway, with the process's breakers and clock."""

    def __init__(self, breakers: Breakers, now: Callable[[], float]) -> None:
        self._breakers = breakers
        self._now = now

    async def forward(
        self,
        chain: tuple[Upstream, ...],
        exchange: Exchange,
        headers: Mapping[str, str],
        receive: Receive,
        send: Send,
        request_id: bytes,
        recheck: Recheck,
        outcome: Outcome,
        extra: Sequence[tuple[bytes, bytes]] = (),
        trace: RequestSpan | None = None,
        watch: Watch | None = None,
        *,
        alias: str = "",
        screen: AnswerScreen | None = None,
    ) -> None:
        """Answer the client from the first credential of `chain` that answers; `extra`
        headers go on the answer (rate-limit state, budget warnings). A stream learns that its
        client left from `watch` (the server's `ON_DISCONNECT`), or else from `receive`.
        `screen` holds the response guardrails the answer passes through before the client."""
        walk = _Walk(exchange, headers, self._breakers, recheck, outcome, trace, alias)
        outcome.sent_at = self._now()
        committed = await walk.first_answer(chain)
        outcome.committed_at = self._now()
        upstream, reply = committed.upstream, committed.reply
        outcome.upstream, outcome.status = upstream, reply.status
        fallbacks = len(outcome.causes)
        if committed.rest is not None:
            await self._stream(
                exchange,
                committed,
                fallbacks,
                receive,
                watch,
                send,
                request_id,
                outcome,
                extra,
                screen,
            )
            return
        data = committed.data
        if data is None:  # a lone 429, passed through
            data = await _read(upstream, reply)
        outcome.usage, outcome.served_model = committed.used
        if outcome.usage is None and reply.status < 300 and exchange.estimates_output:
            outcome.estimated_output_tokens = estimate_tokens(data.decode("utf-8", "replace"))
        body = exchange.render(upstream, reply.status, data)
        if screen is not None and reply.status < 300 and not screen.passes(body):
            # A block raises: the provider was paid, so the outcome keeps its usage.
            body = await screen.plain(body)
        content_type = reply.content_type if upstream.wire is exchange.client else JSON
        headers_out = _answer_headers(upstream, reply, request_id, fallbacks, content_type)
        headers_out.extend(extra)
        if screen is not None:
            headers_out.extend(screen.warnings())
        outcome.first_byte_at = self._now()
        outcome.answered()
        await respond(send, reply.status, body, headers_out)

    async def _stream(
        self,
        exchange: Exchange,
        committed: _Committed,
        fallbacks: int,
        receive: Receive,
        watch: Watch | None,
        send: Send,
        request_id: bytes,
        outcome: Outcome,
        extra: Sequence[tuple[bytes, bytes]],
        screen: AnswerScreen | None,
    ) -> None:
        upstream, reply = committed.upstream, committed.reply
        pipe = exchange.pipe(upstream)
        guard = screen.stream() if screen is not None else None
        # Passed through, a stream keeps the provider's type (audio is no event stream); a
        # translated one, or one whose provider named no type (or JSON), is events.
        content_type = reply.content_type
        if upstream.wire is not exchange.client or content_type.startswith(JSON):
            content_type = b"text/event-stream"
        headers = _answer_headers(upstream, reply, request_id, fallbacks, content_type)
        headers.append((b"cache-control", b"no-cache"))
        headers.extend(extra)
        # The stream is pumped in this task; a client that leaves meanwhile ends it from the
        # server's callback (or a watcher task), which closes the provider's answer under the
        # pump.
        watcher: asyncio.Future[None] | None = None
        if watch is not None:
            watch(partial(_client_left, outcome, reply))
        else:
            watcher = asyncio.ensure_future(_left(receive, outcome, reply))
            watcher.add_done_callback(_retrieved)
        try:
            await self._pump(exchange, committed, pipe, send, headers, outcome, guard)
        except Exception as exc:
            # Once the answer started nothing else can be sent; usually the client went away.
            if not outcome.cancelled:
                outcome.cancelled = True
                log.warning("stream ended early: %s", type(exc).__name__)
        finally:
            if watch is not None:
                watch(None)
            elif watcher is not None:
                watcher.cancel()
            reply.close()
            outcome.usage, outcome.served_model = pipe.usage, pipe.model

    async def _pump(
        self,
        exchange: Exchange,
        committed: _Committed,
        pipe: StreamPipe,
        send: Send,
        headers: list[tuple[bytes, bytes]],
        outcome: Outcome,
        guard: StreamScreen | None = None,
    ) -> None:
        upstream, reply = committed.upstream, committed.reply
        rest = committed.rest
        assert rest is not None
        chunk: bytes | None = committed.first
        # What is passed on as it comes, unless the provider's answer has already ended in
        # full: then its last bytes go out with the stream's end, in one write instead of two.
        pending = b""
        try:
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            outcome.first_byte_at = self._now()
            while chunk is not None:
                # One event is about one token for a provider that reports no usage.
                outcome.estimated_output_tokens += chunk.count(b"\n\n") or 1
                out = pipe.feed(chunk)
                if guard is not None:
                    # Held back through the guardrails' window, redacted where it must be.
                    out = await guard.feed(out)
                pending += out
                if pending and not reply.drained:
                    await send({"type": "http.response.body", "body": pending, "more_body": True})
                    pending = b""
                chunk = await anext(rest, None)
            tail = pending + pipe.finish()
            if guard is not None:
                tail = pending + await guard.close(tail[len(pending) :])
            if pipe.errored:
                # The provider said so in its stream (an error event, or an early end).
                outcome.broke = True
                self._count_failure(upstream)
        except GuardrailBlocked as exc:
            # What the guardrail refused is held back: the stream ends with the refusal.
            outcome.blocked = True
            released = guard.released if guard is not None else b""
            tail = pending + released + stream_error(exchange.client, exc, pipe)
        except _CALL_FAILURES as exc:
            if outcome.cancelled:
                raise  # the client left, and its watcher closed the answer: no provider fault
            # Headers went out: the error travels in the stream, in the client's format.
            outcome.broke = True
            self._count_failure(upstream)
            error = ProxyError(
                _failure_code(exc), "the provider's stream broke off before it finished"
            )
            tail = pending + stream_error(exchange.client, error, pipe)
        finally:
            reply.close()
        outcome.usage, outcome.served_model = pipe.usage, pipe.model
        outcome.answered()
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    def _count_failure(self, upstream: Upstream) -> None:
        if self._breakers[upstream.provider_id].failed():
            _breaker_opened(upstream)


def _retrieved(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


async def _left(receive: Receive, outcome: Outcome, reply: Reply) -> None:
    """Wait for the client to leave; then the stream is cancelled, and the provider's answer
    closed under whoever reads it."""
    while (await receive())["type"] != "http.disconnect":
        pass
    _client_left(outcome, reply)


def _client_left(outcome: Outcome, reply: Reply) -> None:
    outcome.cancelled = True
    reply.close()
