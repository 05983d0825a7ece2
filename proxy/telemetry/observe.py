"""What a finished request leaves for operators: its metrics and its `request_completed` line.

Called once per request, at its end, with the facts the pipeline already holds (status, code,
outcome of the chain walk); nothing here is on the way of the answer. The log line's fields
are ids, codes and durations: never the prompt, the answer, the key or the end user as sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from proxy.dispatch import Outcome
from proxy.errors import ProxyError
from proxy.runtime import KeyRuntime
from proxy.telemetry.metrics import ProxyMetrics
from proxy.telemetry.tracing import RequestSpan
from vkgate.errors import ErrorCode
from vkgate.logs import Event, emit, pseudonym

log = logging.getLogger("vkgate.proxy.requests")

MODEL_FIELD_MAX = 128
"""A requested model the key does not know is logged cut to this length (metrics leave it out)."""


class RequestCompleted(Event):
    """The line of a finished request."""

    EVENT = "request_completed"

    route: str
    status: int
    code: str | None = None
    duration_ms: float | None = None
    ttfb_ms: float | None = None
    request_id: str | None = None
    vk_id: str | None = None
    organization_id: str | None = None
    model: str | None = None
    provider: str | None = None
    attempts: int | None = None
    end_user_hash: str | None = None


class RequestObserver:
    """Counts and logs finished requests for one gateway."""

    __slots__ = ("_log_requests", "_metrics", "_now", "_telemetry_key")

    def __init__(
        self,
        metrics: ProxyMetrics,
        now: Callable[[], float],
        *,
        log_requests: bool = True,
        telemetry_key: bytes | None = None,
    ) -> None:
        self._metrics = metrics
        self._now = now
        self._log_requests = log_requests
        self._telemetry_key = telemetry_key

    def completed(
        self,
        route: str,
        status: int,
        code: ErrorCode | None,
        started: float,
        request_id: bytes,
        *,
        runtime: KeyRuntime | None = None,
        model: str | None = None,
        outcome: Outcome | None = None,
        error: ProxyError | None = None,
        end_user: str | None = None,
        trace: RequestSpan | None = None,
    ) -> None:
        """Count, trace and log a finished request. Never raises: a failure here is logged,
        and never becomes the client's answer."""
        try:
            now = self._now()
            metrics = self._metrics
            upstream = outcome.upstream if outcome is not None else None
            provider = upstream.provider_name if upstream is not None else ""
            # Only an alias the key's policy names is a label: a client may send any string.
            alias = (
                model
                if model is not None and runtime is not None and model in runtime.chains
                else ""
            )
            code_text = code.value if code is not None else ""
            metrics.requests.add((route, status, code_text, alias, provider))
            metrics.duration.observe((route,), now - started)
            first_byte_at = None
            if outcome is not None:
                first_byte_at = outcome.first_byte_at
                if first_byte_at is not None:
                    metrics.first_byte.observe((route,), first_byte_at - started)
                self._attempts(outcome, alias, provider)
            if error is not None:
                self._refusal(error)
            end_user_hash = pseudonym(self._telemetry_key, end_user) if end_user else None
            if trace is not None:
                trace.end(
                    status,
                    code,
                    vk_id=runtime.vk_id if runtime is not None else None,
                    model=alias or None,
                    provider=provider or None,
                    attempts=outcome.calls if outcome is not None else 0,
                    end_user_hash=end_user_hash,
                )
            if self._log_requests and log.isEnabledFor(logging.INFO):
                emit(
                    log,
                    RequestCompleted(
                        route=route,
                        status=status,
                        code=code_text or None,
                        duration_ms=_centis(now - started),
                        ttfb_ms=None if first_byte_at is None else _centis(first_byte_at - started),
                        request_id=request_id.decode("latin-1"),
                        vk_id=runtime.vk_id if runtime is not None else None,
                        organization_id=runtime.organization_id if runtime is not None else None,
                        model=alias or (model[:MODEL_FIELD_MAX] if model else None),
                        provider=provider or None,
                        attempts=outcome.calls if outcome is not None else 0,
                        end_user_hash=end_user_hash,
                    ),
                )
        except Exception:
            log.exception("could not record request %s", request_id.decode("latin-1"))

    def _attempts(self, outcome: Outcome, alias: str, provider: str) -> None:
        metrics = self._metrics
        names = metrics.provider_names
        for cause in outcome.causes:
            metrics.attempts.add((cause.provider, cause.code.value))
            names[cause.provider_id] = cause.provider
        upstream = outcome.upstream
        if upstream is None:
            return
        names[upstream.provider_id] = provider
        # The provider's own status: the client's may differ (499 when it went away).
        answered = outcome.status
        metrics.attempts.add((provider, "ok" if answered < 400 else f"{answered // 100}xx"))
        if outcome.causes:
            metrics.fallbacks.add((alias,), len(outcome.causes))
        if outcome.sent_at is not None and outcome.committed_at is not None:
            metrics.upstream.observe((provider,), outcome.committed_at - outcome.sent_at)

    def _refusal(self, error: ProxyError) -> None:
        if error.code is ErrorCode.RATE_LIMITED and error.reason:
            self._metrics.limit_refusals.add((error.reason,))
        elif error.code is ErrorCode.BUDGET_EXCEEDED and error.details:
            self._metrics.budget_refusals.add((error.details.get("budget_scope", ""),))
        elif error.code is ErrorCode.POLICY_VIOLATION and error.details:
            self._metrics.policy_refusals.add((error.details.get("rule", ""),))

    def guardrails(self, verdicts: dict[str, str]) -> None:
        """Each guardrail outcome of a request, by name, stage and outcome."""
        self._metrics.guardrails.add_verdicts(verdicts)


def _centis(seconds: float) -> float:
    """`seconds` in milliseconds, to 0.01 ms (half up): a third of `round(ms, 2)`'s cost, which
    formats the number to round it; the float is the one nearest the two-place decimal."""
    return int(seconds * 100_000 + 0.5) / 100
