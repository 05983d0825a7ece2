"""The `/v1` API as one raw ASGI app: the request pipeline, in the contract's order.

Raw ASGI rather than Litestar handlers: measured, a Litestar handler alone costs a third of
what a Python forwarder can do per second (see the contract's "Hot path").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import msgspec

from proxy import body as B
from proxy.asgi import (
    JSON,
    ClientGone,
    Head,
    Receive,
    Scope,
    Send,
    disconnect_watch,
    read_body,
    respond,
    respond_error,
)
from proxy.auth import AuthCache
from proxy.breaker import Breakers
from proxy.cache.service import CachedRequest, ResponseCache
from proxy.clients import InvalidKeyThrottle, KeyGuard
from proxy.dispatch import Dispatcher, Outcome, Recheck
from proxy.documents import Shape
from proxy.errors import ProxyError, invalid
from proxy.formats import ChatExchange, EmbeddingsExchange
from proxy.gemini_api import METHODS as GEMINI_METHODS
from proxy.gemini_api import GeminiApi
from proxy.guardrails import (
    REQUEST,
    AnswerScreen,
    RemoteChecks,
    request_passes,
    screen_request,
    skipped,
    warnings,
)
from proxy.limits.budgets import BucketSpendSource, BudgetGuard, Worst, check_end_user
from proxy.limits.cost import Prompt
from proxy.limits.counters import LocalCounters
from proxy.limits.guard import Governor, Hold
from proxy.limits.store import Counters
from proxy.media import audio, images
from proxy.pace import Pace
from proxy.prepared import Prepared
from proxy.providers import Upstream
from proxy.providers.base import WireFormat
from proxy.responses import stored
from proxy.responses.exchange import ResponsesExchange, narrowed, opened_previous
from proxy.responses.ids import ResponseIds
from proxy.rules import PolicyViolation, model_denied
from proxy.runtime import KeyRuntime
from proxy.settings import ProxySettings
from proxy.spend import records
from proxy.spend.spool import SpendSpool, SpoolError
from proxy.telemetry.metrics import ProxyMetrics
from proxy.telemetry.observe import RequestObserver
from proxy.telemetry.tracing import RequestSpan, Tracing
from vkgate.clock import Clock, SystemClock
from vkgate.errors import ErrorCode
from vkgate.keys import VIRTUAL_KEY_PREFIX

log = logging.getLogger("vkgate.proxy")
_encode_model = msgspec.json.Encoder().encode


def chain_for(runtime: KeyRuntime, model: str) -> tuple[Upstream, ...]:
    """Policy, then model resolution: the alias must be the key's to use."""
    chain = runtime.chains.get(model)
    if chain is None:
        if model in runtime.denied:
            raise model_denied(model, runtime.denied[model])
        if model in runtime.not_allowed:
            raise ProxyError(
                ErrorCode.MODEL_NOT_ALLOWED,
                f"this key may not use model {model!r}",
                param="model",
            )
        raise ProxyError(
            ErrorCode.MODEL_NOT_FOUND,
            f"model {model!r} is not available to this key; GET /v1/models lists the ones that are",
            param="model",
        )
    if not chain:
        raise ProxyError(
            ErrorCode.PROVIDER_ERROR,
            f"no provider this proxy can call serves model {model!r}",
            param="model",
        )
    return chain


def _models_body(runtime: KeyRuntime) -> bytes:
    return runtime.models_body


MODELS_ROUTE = "/v1/models"
MODEL_ROUTE = "/v1/models/{id}"
_MODEL_PREFIX = "/models/"
OTHER_ROUTE = "other"
"""The route label of a path `/v1` does not serve: never the path itself (unbounded)."""


def _route_label(path: str) -> str:
    if path == "/models":
        return MODELS_ROUTE
    return MODEL_ROUTE if path.startswith(_MODEL_PREFIX) else OTHER_ROUTE


def model_body(runtime: KeyRuntime, alias: str) -> bytes:
    """`GET /v1/models/{id}`: one alias this key may use, as OpenAI's model object; 404 in
    OpenAI's shape otherwise (outside `allowed_models` too: it is not this key's to see)."""
    chain = runtime.chains.get(alias)
    if not chain:
        raise ProxyError(
            ErrorCode.MODEL_NOT_FOUND,
            f"model {alias!r} is not available to this key; GET /v1/models lists the ones that are",
            param="model",
        )
    return _encode_model(
        {"id": alias, "object": "model", "created": 0, "owned_by": chain[0].provider_name}
    )


def _provider_headers(head: Head) -> dict[str, str]:
    headers = {"X-Request-ID": head.request_id.decode()}
    if head.traceparent is not None:
        headers["traceparent"] = head.traceparent.decode()
    return headers


def _answer_code(outcome: Outcome) -> ErrorCode | None:
    """The error code of an answer that started: a guardrail's block, or a broken stream."""
    if outcome.blocked:
        return ErrorCode.GUARDRAIL_BLOCKED
    return ErrorCode.PROVIDER_ERROR if outcome.broke else None


Prepare = Callable[[KeyRuntime, Head, bytes], Prepared]


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    """As the spend record names it: `/v1/…`."""
    prepare: Prepare
    client: WireFormat = WireFormat.OPENAI
    """The format the route answers in, its errors included."""
    shape: Shape = Shape.CHAT
    """What its request body is, for policy rules and guardrails."""


Listing = Callable[[KeyRuntime], bytes]
"""A `GET` route's answer for a key: the models it may use."""


class Gateway:
    """What `/v1` serves, with everything wired once at start-up."""

    def __init__(
        self,
        settings: ProxySettings,
        cache: AuthCache,
        spool: SpendSpool,
        *,
        clock: Clock | None = None,
        counters: Counters | None = None,
        spend_source: BucketSpendSource | None = None,
        metrics: ProxyMetrics | None = None,
        tracing: Tracing | None = None,
        pace: Pace | None = None,
        remote_checks: RemoteChecks | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        """`pace` is its event loop's (`pace_of`): the gateway counts its requests in flight
        there, where the loop's server and provider client read them; a `Pace` of its own
        without one."""
        clock = clock or SystemClock()
        self._tracing = tracing
        self._remote = remote_checks
        self._keys = KeyGuard(
            InvalidKeyThrottle(settings.invalid_keys_per_minute, clock),
            settings.trusted_proxy_cidrs,
        )
        counters = counters or LocalCounters()
        # Reservations and slots are held under an id of our own, unique across replicas and
        # restarts: a client's X-Request-ID may repeat, and must not share a reservation.
        self._holds = itertools.count(1)
        self._hold_prefix = f"{spool.replica_id}.{os.urandom(4).hex()}."
        self._governor = Governor(
            counters,
            BudgetGuard(
                counters,
                clock,
                spend_source=spend_source,
                default_output_tokens=settings.budget_default_output_tokens,
            ),
            clock,
            # A reservation outlives the longest a request may take.
            lease_s=settings.total_timeout_s + 60.0,
        )
        self.budgets = self._governor.budgets
        self._max_body = settings.max_body_bytes
        self._max_in_flight = settings.max_in_flight
        self._pace = pace or Pace()
        self._cache = cache
        self._responses_cache = response_cache
        self._spool = spool
        self._now = clock.monotonic
        self._clock = clock
        self.breakers = Breakers(
            settings.circuit_threshold,
            settings.circuit_window_s,
            settings.circuit_cooldown_s,
            clock,
        )
        self._dispatcher = Dispatcher(self.breakers, clock.monotonic)
        self.metrics = metrics or ProxyMetrics()
        self._observer = RequestObserver(
            self.metrics,
            clock.monotonic,
            log_requests=settings.log_requests,
            telemetry_key=settings.telemetry_key,
        )
        self._response_ids = ResponseIds(settings.internal_secrets)
        self._stored = stored.StoredResponses(self._response_ids)
        self._routes: dict[str, Route] = {
            "/chat/completions": Route("/v1/chat/completions", self._chat),
            "/messages": Route(
                "/v1/messages", self._messages, WireFormat.ANTHROPIC, Shape.MESSAGES
            ),
            "/embeddings": Route("/v1/embeddings", self._embeddings, shape=Shape.EMBEDDINGS),
            "/audio/speech": Route("/v1/audio/speech", audio.speech, shape=Shape.SPEECH),
            "/audio/transcriptions": Route(
                "/v1/audio/transcriptions", audio.transcription, shape=Shape.UPLOAD
            ),
            "/audio/translations": Route(
                "/v1/audio/translations", audio.translation, shape=Shape.UPLOAD
            ),
            "/images/generations": Route(
                "/v1/images/generations", images.generation, shape=Shape.IMAGES
            ),
            "/images/edits": Route("/v1/images/edits", images.edit, shape=Shape.UPLOAD),
            "/responses": Route("/v1/responses", self._responses, shape=Shape.RESPONSES),
        }
        self.gemini = GeminiApi(self)
        """Google's Gemini API under `/v1beta`, served by the same pipeline."""

    @property
    def in_flight(self) -> int:
        """Paid requests admitted and not yet finished."""
        return self._pace.in_flight

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        head: Head | None = None,
        route: Route | None = None,
        label: str = "",
        *,
        client: WireFormat = WireFormat.OPENAI,
        listing: Listing | None = None,
        call: stored.Call | None = None,
        prefix: str = "/v1",
    ) -> None:
        """A `/v1` request (the ASGI call); or, with its `head` read, one of another route family
        (`GeminiApi`): a paid `route` down the pipeline, a `listing` of the key's models (GET), a
        `call` on a stored response, or else a 404, answered (errors too) in the route's format
        or else `client`'s. `label` names the route in metrics and traces, `prefix` the family in
        a 404's message.

        One method rather than one per family calling a shared one: a coroutine more per
        request costs every request."""
        started = self._now()
        path = scope["path"].rstrip("/")
        if head is None:
            route = self._routes.get(path)
            if route is not None:
                label = route.path
            else:
                label = _route_label(path)
                if path == "/models":
                    listing = _models_body
                elif path.startswith(_MODEL_PREFIX):
                    if path.rpartition(":")[2] in GEMINI_METHODS:
                        # A Gemini API method (`/v1/models/{model}:generateContent`):
                        # google-genai's default version.
                        await self.gemini(scope, receive, send, prefix="/v1")
                        return
                    listing = partial(model_body, alias=path.removeprefix(_MODEL_PREFIX))
                else:
                    call = stored.route(path, scope["method"])
                    if call is not None:
                        label = call.label
            head = Head(scope)
        if route is not None:
            client = route.client
        trace = (
            self._tracing.start_request(scope["method"], label, head)
            if self._tracing is not None
            else None
        )
        status: int = 500
        code: ErrorCode | None = ErrorCode.INTERNAL_ERROR
        error: ProxyError | None = None
        runtime: KeyRuntime | None = None
        piped = False
        try:
            if route is not None:
                self._allow(scope, "POST")
                piped = True  # the pipeline observes its own end, whatever it is
                await self._serve(route, scope, head, receive, send, started, trace)
            elif listing is not None:
                self._allow(scope, "GET")
                runtime = await self._authenticate(scope, head)
                await respond(
                    send,
                    200,
                    listing(runtime),
                    [(b"content-type", JSON), (b"x-request-id", head.request_id)],
                )
                status, code = 200, None
            elif call is not None:
                stored.allowed(call, scope["method"])
                runtime = await self._authenticate(scope, head)
                status = await self._serve_stored(call, scope, runtime, head, send)
                code = None
            else:
                raise ProxyError(ErrorCode.NOT_FOUND, f"no route {prefix}{path}")
        except ProxyError as exc:
            status, code, error = exc.status, exc.code, exc
            await respond_error(send, exc, head.request_id, client)
        except (ClientGone, asyncio.CancelledError) as exc:
            status, code = records.CLIENT_CLOSED, None
            if isinstance(exc, asyncio.CancelledError):
                raise
        except Exception:
            # A bug, not a refusal: logged (never the body), and answered in the route's shape.
            log.exception("unexpected error serving %s", label)  # a route label: /v1/…, or "other"
            bug = ProxyError(ErrorCode.INTERNAL_ERROR, "internal error in the gateway")
            # If the answer had already started, a second start is refused: nothing more to say.
            with contextlib.suppress(Exception):
                await respond_error(send, bug, head.request_id, client)
        finally:
            if not piped:
                self._observer.completed(
                    label,
                    status,
                    code,
                    started,
                    head.request_id,
                    runtime=runtime,
                    error=error,
                    trace=trace,
                )
            # The error's traceback holds this frame, which would hold the error: a reference
            # cycle that only the garbage collector frees, with the request's objects in it.
            error = None

    @staticmethod
    def _allow(scope: Scope, method: str) -> None:
        if scope["method"] != method:
            raise ProxyError(
                ErrorCode.METHOD_NOT_ALLOWED,
                f"this route takes {method}, not {scope['method']}",
                # RFC 9110: a 405 says which method the route does take.
                headers=((b"allow", method.encode()),),
            )

    async def _authenticate(self, scope: Scope, head: Head) -> KeyRuntime:
        if head.key is None:
            raise ProxyError(
                ErrorCode.INVALID_API_KEY,
                "no virtual key: send it as `Authorization: Bearer vk-…` or `x-api-key` "
                "(to the Gemini API, also `x-goog-api-key` or `?key=`)",
            )
        if not head.key.startswith(VIRTUAL_KEY_PREFIX):
            # Refused here: a stray bearer token costs no control-plane round trip.
            raise ProxyError(ErrorCode.INVALID_API_KEY, "invalid virtual key")
        # A throttled client address is refused only where a lookup would reach the control
        # plane: cached keys keep working behind a shared address.
        admission = self._keys.admission(scope)
        invalid = False
        try:
            return await self._cache.authenticate(head.key, admission)
        except ProxyError as exc:
            if exc.code is ErrorCode.INVALID_API_KEY:
                invalid = True
                self._keys.failed(scope, admission)
            raise
        finally:
            if not invalid:
                self._keys.release(admission)

    def _ticket(self, route: Route, head: Head) -> records.Ticket:
        """Spend admission: the request's admit record, or a refusal when none can be written."""
        spool = self._spool
        if spool.at_bound:
            spool.count_refused()
            raise ProxyError(
                ErrorCode.SPEND_SPOOL_FULL,
                "the gateway cannot record spend right now (spool full); retry later",
                headers=((b"retry-after", b"5"),),
            )
        try:
            return records.Ticket(spool, route.path, head.request_id, self._now())
        except SpoolError:
            # Nothing could be recorded: refused rather than served unrecorded.
            spool.count_refused()
            raise ProxyError(
                ErrorCode.SPEND_SPOOL_FULL,
                "the gateway cannot record spend right now (spool not writable); retry later",
                headers=((b"retry-after", b"5"),),
            ) from None

    async def _serve(
        self,
        route: Route,
        scope: Scope,
        head: Head,
        receive: Receive,
        send: Send,
        started: float,
        trace: RequestSpan | None,
    ) -> None:
        """The pipeline for a paid route; spend admission wraps it, outermost."""
        outcome = Outcome()
        ticket: records.Ticket | None = None
        status: int = 500
        code: ErrorCode | None = ErrorCode.INTERNAL_ERROR
        hold: Hold | None = None
        admitted = False
        runtime: KeyRuntime | None = None
        prepared: Prepared | None = None
        error: ProxyError | None = None
        refused: ProxyError | None = None
        try:
            ticket = self._ticket(route, head)
            outcome.on_answered = self._settle_on_answer(ticket, outcome)
            runtime = ticket.runtime = await self._authenticate(scope, head)
            self._admit()
            admitted = True
            body = await read_body(receive, self._max_body, head.content_length)
            prepared = ticket.request = route.prepare(runtime, head, body)
            try:
                if runtime.rules is not None:
                    capped = runtime.rules.check(route.shape, body, head.content_type)
                    if capped is not None:
                        body = capped
                        prepared = ticket.request = route.prepare(runtime, head, body)
                chain = chain_for(runtime, prepared.model)
                if prepared.narrow is not None:
                    chain = prepared.narrow(chain)
            except ProxyError as exc:
                # Rate limits come before policy: the request is counted, then refused.
                chain, refused = (), exc
            extra: tuple[tuple[bytes, bytes], ...] = ()
            cached: CachedRequest | None = None
            if runtime.cache_scopes and refused is None and self._responses_cache is not None:
                cached = await self._responses_cache.lookup(
                    scope, head, runtime, route.path, prepared
                )
                if cached is not None and cached.hit is not None:
                    # A hit is counted by the key's request rate limits, never by its budgets
                    # (it costs nothing), and answered without a provider call.
                    check_end_user(runtime.budget_rules, prepared.end_user)
                    hold = await self._rate_hold(runtime)
                    headers = hold.headers if hold is not None else ()
                    hit_screen = self._hit_screen(runtime, ticket, route, prepared.model)
                    await cached.serve(
                        send, head.request_id, headers, outcome, self._now, hit_screen
                    )
                    status, code = 200, None
                    return
            if runtime.rate_plan is not None or runtime.budget_rules:
                estimate, worst = prepared.estimate, prepared.worst
                if worst is None:
                    prompt = Prompt.of(body)
                    estimate, worst = prompt.typical, Worst(prompt.at_most, prepared.max_output)
                hold = await self._governor.admit(
                    f"{self._hold_prefix}{next(self._holds)}",
                    runtime.rate_plan,
                    runtime.budget_rules,
                    estimate,
                    worst,
                    chain,
                    prepared.end_user,
                )
                chain, extra = hold.chain, hold.headers
            if refused is not None:
                raise refused
            screen: AnswerScreen | None = None
            guardrails = runtime.guardrails
            if guardrails is not None:
                verdicts = ticket.guardrails = {}
                if not request_passes(guardrails, verdicts, prepared.messages):
                    screened = await screen_request(
                        guardrails,
                        self._remote,
                        verdicts,
                        route.shape,
                        body,
                        prepared.model,
                        looked=prepared.messages is not None,
                    )
                    if screened is not None:
                        body = screened
                        prepared = ticket.request = route.prepare(runtime, head, body)
                if guardrails.warns:
                    extra = (*extra, *warnings(verdicts))
                screen = AnswerScreen.of(
                    guardrails, self._remote, verdicts, route.shape, prepared.model
                )
            if cached is not None:
                extra = (*extra, cached.header)
            await self._dispatcher.forward(
                chain,
                prepared.exchange,
                _provider_headers(head),
                receive,
                send if cached is None else cached.recording(send),
                head.request_id,
                self._recheck(head, runtime, prepared.model),
                outcome,
                extra,
                trace,
                disconnect_watch(scope),
                alias=prepared.model,
                screen=screen,
            )
            status = outcome.status
            code = _answer_code(outcome)
            if cached is not None:
                await self._keep(cached, outcome, ticket)
        except ProxyError as exc:
            status, code, error = exc.status, exc.code, exc
            if isinstance(exc, PolicyViolation) and ticket is not None:
                ticket.policy_rule = exc.rule
            if hold is not None and hold.headers:
                # Every answer to a limited key says where its limits stand.
                exc.headers = (*exc.headers, *hold.headers)
            raise
        except ClientGone:
            outcome.cancelled = True
            status, code = records.CLIENT_CLOSED, None
            raise
        except asyncio.CancelledError:
            if outcome.first_byte_at is not None:
                # Stopped mid-answer (the server shutting down): served, and cut short.
                outcome.cancelled = True
                status, code = outcome.status, None
            raise
        finally:
            # The callback holds the outcome: left in place, the two would make a reference
            # cycle, and a request's dozen objects would wait for the garbage collector.
            outcome.on_answered = None
            # Exactly one outcome record per admitted request, whatever happened; a refusal's
            # is written before the refusal is sent, an answer's before its last byte.
            if ticket is not None:
                ticket.settle(outcome, status, code, self._now())
            if admitted:
                self._pace.in_flight -= 1
            try:
                if hold is not None and ticket is not None:
                    await self._finish(hold, ticket, outcome)
            finally:
                # Observed even when cancelled again while the limits settle.
                if ticket is not None and ticket.guardrails:
                    self._observer.guardrails(ticket.guardrails)
                self._observer.completed(
                    route.path,
                    status,
                    code,
                    started,
                    head.request_id,
                    runtime=runtime,
                    model=prepared.model if prepared is not None else None,
                    outcome=outcome,
                    error=error,
                    end_user=prepared.end_user if prepared is not None else None,
                    trace=trace,
                )
                # As in `__call__`: no cycle through an error's traceback.
                error = refused = None

    async def _rate_hold(self, runtime: KeyRuntime) -> Hold | None:
        """The key's rate limits alone, for a request that costs nothing (no budget moves)."""
        if runtime.rate_plan is None:
            return None
        return await self._governor.admit(
            f"{self._hold_prefix}{next(self._holds)}",
            runtime.rate_plan,
            (),
            0,
            Worst(0, 0),
            (),
            None,
        )

    def _hit_screen(
        self, runtime: KeyRuntime, ticket: records.Ticket, route: Route, model: str
    ) -> AnswerScreen | None:
        """The response guardrails a cache hit's replay passes through. The request stage is
        skipped (the body is the one the stored answer came from, and no provider sees it);
        the response stage applies as it stands now, so a guardrail added after the entry was
        stored still holds what leaves."""
        guardrails = runtime.guardrails
        if guardrails is None:
            return None
        verdicts = ticket.guardrails = {}
        skipped(guardrails.request, verdicts, REQUEST)
        return AnswerScreen.of(guardrails, self._remote, verdicts, route.shape, model)

    async def _keep(
        self, cached: CachedRequest, outcome: Outcome, ticket: records.Ticket | None
    ) -> None:
        """Store a miss's answer; the client has it whole already, and a store that fails
        costs only the entry."""
        try:
            await cached.store(outcome, ticket.record if ticket is not None else None)
        except Exception:
            log.exception("response cache: could not store an answer")

    def _settle_on_answer(self, ticket: records.Ticket, outcome: Outcome) -> Callable[[], None]:
        """The outcome record, written once the answer is known and before its last byte."""

        def answered() -> None:
            code = _answer_code(outcome)
            ticket.settle(outcome, outcome.status, code, self._now())

        return answered

    def _admit(self) -> None:
        """Admission control: a bounded number of requests in flight in this process, so an
        overload is refused at once (and another replica tried) instead of queueing until
        every request times out."""
        if self._pace.in_flight >= self._max_in_flight:
            raise ProxyError(
                ErrorCode.GATEWAY_BUSY,
                f"this gateway process is serving its limit of {self._max_in_flight} requests; "
                "retry shortly",
                headers=((b"retry-after", b"1"),),
            )
        self._pace.in_flight += 1

    async def _finish(self, hold: Hold, ticket: records.Ticket, outcome: Outcome) -> None:
        """Release what the request held and count what it spent, from its outcome record."""
        served = outcome.upstream if 0 < outcome.status < 300 else None
        try:
            await self._governor.finish(hold, ticket.record, served)
        except Exception:
            # Reservations and slots lapse by their leases; the ledger still gets the record.
            log.exception("could not settle the limits of request %s", ticket.request_id)

    def _chat(self, runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
        fields = B.chat_fields(body)
        stream = bool(fields.stream)
        options = fields.stream_options
        wants_usage = isinstance(options, B.StreamOptions) and bool(options.include_usage)
        with_usage = body if not stream or wants_usage else B.ask_for_usage(body, fields)
        exchange = ChatExchange(
            WireFormat.OPENAI,
            body,
            fields.model,
            stream=stream,
            client_wants_usage=wants_usage,
            with_usage=with_usage,
            created=int(self._clock.time()),
        )
        cap = fields.max_completion_tokens or fields.max_tokens
        return Prepared(
            fields.model,
            exchange,
            head.end_user or fields.user or None,
            body,
            None if cap is None else cap * (fields.n or 1),
            messages=fields.messages,
        )

    def _messages(self, runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
        fields = B.messages_fields(body)
        # The body was written for the client's API version and betas: a provider of the same
        # format gets them with it; a translated request gets the credential's own.
        same_format = {}
        if head.anthropic_version is not None:
            same_format["anthropic-version"] = head.anthropic_version.decode("latin-1")
        if head.anthropic_beta is not None:
            same_format["anthropic-beta"] = head.anthropic_beta.decode("latin-1")
        exchange = ChatExchange(
            WireFormat.ANTHROPIC,
            body,
            fields.model,
            stream=bool(fields.stream),
            client_wants_usage=True,
            with_usage=body,
            created=int(self._clock.time()),
            same_format_headers=same_format,
        )
        user = fields.metadata.user_id if fields.metadata is not None else None
        return Prepared(
            fields.model, exchange, head.end_user or user or None, body, fields.max_tokens
        )

    def _embeddings(self, runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
        fields = B.embedding_fields(body)
        exchange = EmbeddingsExchange(body, fields.model)
        # Embeddings answer with no output tokens.
        return Prepared(fields.model, exchange, head.end_user or fields.user or None, body, 0)

    def _responses(self, runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
        fields = B.responses_fields(body)
        if fields.background:
            raise invalid(
                "background responses are not served: the gateway meters and settles each "
                "response when it ends, while its request is open",
                param="background",
            )
        previous = None
        if fields.previous_response_id is not None:
            previous = opened_previous(
                self._response_ids, fields.previous_response_id, runtime.organization_id
            )
        exchange = ResponsesExchange(
            body,
            fields.model,
            stream=bool(fields.stream),
            stored=fields.store is not False,
            ids=self._response_ids,
            organization_id=runtime.organization_id,
            created=int(self._clock.time()),
            previous=previous,
            previous_id=fields.previous_response_id,
        )
        return Prepared(
            fields.model,
            exchange,
            head.end_user or fields.user or fields.safety_identifier or None,
            body,
            fields.max_output_tokens,
            narrow=narrowed(previous, fields.model) if previous is not None else None,
        )

    async def _serve_stored(
        self, call: stored.Call, scope: Scope, runtime: KeyRuntime, head: Head, send: Send
    ) -> int:
        """A stored response's call: counted by the key's rate limits, never priced."""
        hold = await self._rate_hold(runtime)
        try:
            query = scope.get("query_string", b"").decode("latin-1")
            return await self._stored.serve(
                call, query, runtime, head, send, hold.headers if hold is not None else ()
            )
        except ProxyError as exc:
            if hold is not None and hold.headers:
                exc.headers = (*exc.headers, *hold.headers)
            raise
        finally:
            if hold is not None:
                await self._governor.finish(hold, None, None)

    def _recheck(self, head: Head, runtime: KeyRuntime, model: str) -> Recheck:
        """Before a further paid attempt, whether the key may still be used for `model`.

        A cache hit costs no network call; a key the change feed evicted meanwhile (revoked or
        disabled) is resolved again, and its refusal ends the walk. When the key's revision
        changed, the model must still be one it may use.
        """
        key = head.key
        assert key is not None  # authenticated before any handler runs

        async def recheck() -> None:
            current = await self._cache.authenticate(key)
            if current.revision != runtime.revision:
                chain_for(current, model)

        return recheck
