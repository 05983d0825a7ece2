"""OpenTelemetry tracing of the proxy, off unless `VKGATE_OTEL_ENDPOINT` names a collector.

A span per request (SERVER) and one per provider attempt (CLIENT, its child); each attempt
sends the provider a W3C `traceparent` naming its own span, and a caller's `traceparent` is
the request span's parent. A request that brought neither an id nor a trace is known by its
trace id (`X-Request-ID`), so a request id from a client's error report finds the trace.
Tracing never fails a request: a span that cannot be made or ended is logged and skipped.

The SDK is imported only when tracing is on (it is the `otel` extra), and the tracer provider
is the proxy's own, not the global one: a library the proxy uses cannot add spans to it or
change where they go.

Span attributes are ids, codes and names from configuration: never a prompt, a key, a
credential or an end user as sent (an end user is the telemetry HMAC, or absent).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from proxy.asgi import Head
from proxy.providers import Upstream
from vkgate.errors import ErrorCode

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Span, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

    from proxy.settings import ProxySettings


log = logging.getLogger("vkgate.proxy.tracing")

FLUSH_TIMEOUT_S = 3.0
"""At shutdown, what the last spans' export may take (part of the stop's time budget)."""


class TracingUnavailable(Exception):
    """Tracing was asked for and its packages are not installed."""


def require_sdk() -> None:
    """Raise `TracingUnavailable` unless the SDK and its OTLP exporter can be imported."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise TracingUnavailable(_MISSING) from None


_MISSING = (
    "VKGATE_OTEL_ENDPOINT is set but OpenTelemetry is not installed: pip install 'vkgate[otel]'"
)


class Tracing:
    """The proxy's tracer: request spans, attempt spans, and the headers that carry them."""

    def __init__(self, settings: ProxySettings, exporter: SpanExporter | None = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise TracingUnavailable(_MISSING) from None
        import vkgate

        self._provider: TracerProvider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(settings.otel_sample_ratio)),
            resource=Resource.create(
                {
                    "service.name": settings.otel_service_name,
                    "service.version": vkgate.__version__,
                }
            ),
            shutdown_on_exit=False,
        )
        if exporter is not None:
            self._provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            endpoint = f"{settings.otel_endpoint}/v1/traces"  # the settings took off any suffix
            # Batched, exported from the SDK's own thread: never on the event loop.
            self._provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=2))
            )
        self._tracer: Tracer = self._provider.get_tracer("vkgate.proxy", vkgate.__version__)
        self._propagator = TraceContextTextMapPropagator()

    def start_request(self, method: str, route: str, head: Head) -> RequestSpan | None:
        """The request's span, its caller's `traceparent` as parent; None when none could be
        made (never raises: the request goes on untraced).

        A request that brought no id of its own and no trace is known by the trace's id, so
        the id a client reports finds the trace. Otherwise the id stays the client's (or one
        of its own per request: many requests may share one caller's trace) and the span
        carries it as `vkgate.request_id`.
        """
        try:
            from opentelemetry.trace import SpanKind, set_span_in_context

            traceparent = head.traceparent
            carrier = {"traceparent": traceparent.decode("latin-1")} if traceparent else {}
            parent = self._propagator.extract(carrier)
            span = self._tracer.start_span(
                f"{method} {route}",
                context=parent,
                kind=SpanKind.SERVER,
                attributes={"http.request.method": method, "http.route": route},
            )
            context = span.get_span_context()
            if head.generated_id and traceparent is None and context.is_valid:
                head.request_id = f"{context.trace_id:032x}".encode()
            span.set_attribute("vkgate.request_id", head.request_id.decode("latin-1"))
            return RequestSpan(self, span, set_span_in_context(span))
        except Exception:
            log.exception("could not start a request's span")
            return None

    def shutdown(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Export what is buffered and stop; blocks for `timeout_s` at most.

        The SDK's own flush does not keep to a timeout (it exports every queued batch, each
        up to the exporter's timeout), so it runs in a daemon thread that is waited for only
        so long: a collector that does not answer cannot hold up the process's exit.
        """
        worker = threading.Thread(
            target=self._provider.shutdown, name="vkgate-tracing-shutdown", daemon=True
        )
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            log.warning("tracing: the last spans were not exported within %g s", timeout_s)


class RequestSpan:
    """One request's span, and the parent of its attempts' spans."""

    __slots__ = ("_context", "_tracing", "span")

    def __init__(self, tracing: Tracing, span: Any, context: Any) -> None:
        self._tracing = tracing
        self.span: Span = span
        self._context = context

    def attempt(self, upstream: Upstream, number: int) -> tuple[Any, str | None]:
        """A span for one provider attempt, and the `traceparent` that names it; (None, None)
        when no span could be made (never raises: the request goes on untraced)."""
        try:
            from opentelemetry.trace import SpanKind, set_span_in_context

            span = self._tracing._tracer.start_span(
                f"provider {upstream.provider_name}",
                context=self._context,
                kind=SpanKind.CLIENT,
                attributes={
                    "vkgate.provider": upstream.provider_name,
                    "vkgate.provider_id": upstream.provider_id,
                    "vkgate.attempt": number,
                    "gen_ai.request.model": upstream.model,
                },
            )
            carrier: dict[str, str] = {}
            self._tracing._propagator.inject(carrier, context=set_span_in_context(span))
        except Exception:
            log.exception("could not start a provider attempt's span")
            return None, None
        # A disabled SDK (OTEL_SDK_DISABLED) makes no-op spans, which inject nothing.
        return span, carrier.get("traceparent")

    def end(
        self,
        status: int,
        code: ErrorCode | None,
        *,
        vk_id: str | None,
        model: str | None,
        provider: str | None,
        attempts: int,
        end_user_hash: str | None,
    ) -> None:
        """End the request's span with what became of the request (never raises)."""
        try:
            from opentelemetry.trace import Status, StatusCode

            span = self.span
            span.set_attribute("http.response.status_code", status)
            span.set_attribute("vkgate.attempts", attempts)
            for name, value in (
                ("vkgate.vk_id", vk_id),
                ("vkgate.model", model),
                ("vkgate.provider", provider),
                ("vkgate.end_user_hash", end_user_hash),
                ("vkgate.error_code", code.value if code is not None else None),
            ):
                if value:
                    span.set_attribute(name, value)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, code.value if code is not None else None))
            span.end()
        except Exception:
            log.exception("could not end a request's span")


def end_attempt(span: Any, status: int | None, code: ErrorCode | None) -> None:
    """End an attempt's span with the provider's status, or why it gave no answer (never
    raises; nothing to do without a span)."""
    if span is None:
        return
    try:
        from opentelemetry.trace import Status, StatusCode

        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if code is not None:
            span.set_attribute("vkgate.error_code", code.value)
            span.set_status(Status(StatusCode.ERROR, code.value))
        span.end()
    except Exception:
        log.exception("could not end a provider attempt's span")
