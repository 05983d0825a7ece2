"""OpenTelemetry tracing: a span per request and per provider attempt, `traceparent` passed on,
and `X-Request-ID` equal to the trace id; exported over real OTLP/HTTP to a collector."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from aiohttp import web
from litestar import Litestar
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy.asgi import Head
from proxy.telemetry.tracing import Tracing
from tests.proxy.conftest import CHAT_ALIAS, Tenant, proxy_settings, serve_proxy
from tests.support.clock import ManualClock
from tests.support.fake_openai import FakeOpenAI
from tests.support.processes import free_port

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
PROMPT = "a-prompt-no-span-may-carry-4e1d"
CHAT = {"model": CHAT_ALIAS, "messages": [{"role": "user", "content": PROMPT}]}


async def test_a_request_and_each_attempt_get_spans_and_providers_get_their_traceparent(
    app: Litestar,
    client: httpx.AsyncClient,
    clock: ManualClock,
    failover: Tenant,
    fake_openai: FakeOpenAI,
) -> None:
    exporter = InMemorySpanExporter()
    async with (
        serve_proxy(app, clock, proxy_settings(), span_exporter=exporter) as proxy,
        proxy.http() as http,
    ):
        answer = await http.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={
                "Authorization": f"Bearer {failover.key}",
                "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
                "X-Request-ID": "the-callers-own-id",
            },
        )
    assert answer.status_code == 200
    # The caller's own id is kept: many requests can share one caller's trace.
    assert answer.headers["x-request-id"] == "the-callers-own-id"

    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    attempts = sorted(
        (s for s in spans if s.kind is SpanKind.CLIENT),
        key=lambda s: s.attributes["vkgate.attempt"],
    )
    assert server.name == "POST /v1/chat/completions"
    assert f"{server.context.trace_id:032x}" == CALLER_TRACE
    assert server.parent is not None and f"{server.parent.span_id:016x}" == CALLER_SPAN
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["vkgate.vk_id"] == failover.key_id
    assert server.attributes["vkgate.attempts"] == 2
    assert server.attributes["vkgate.request_id"] == "the-callers-own-id"

    dead, live = attempts
    assert dead.attributes["vkgate.provider"] == "dead"
    assert dead.status.status_code is StatusCode.ERROR
    assert dead.attributes["vkgate.error_code"] == "provider_error"
    assert live.attributes["vkgate.provider"] == "live"
    assert live.attributes["http.response.status_code"] == 200
    for attempt in attempts:
        assert attempt.parent is not None and attempt.parent.span_id == server.context.span_id

    # The provider got the live attempt's own span as its parent.
    sent = fake_openai.received[-1].header("traceparent")
    assert sent == f"00-{CALLER_TRACE}-{live.context.span_id:016x}-01"

    for span in spans:
        assert PROMPT not in str(span.attributes) and failover.key not in str(span.attributes)


async def test_a_request_with_no_id_and_no_trace_is_known_by_its_trace_id(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, failover: Tenant
) -> None:
    exporter = InMemorySpanExporter()
    async with (
        serve_proxy(app, clock, proxy_settings(), span_exporter=exporter) as proxy,
        proxy.http() as http,
    ):
        refused = await http.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope"}
        )
    assert refused.status_code == 401
    (server,) = exporter.get_finished_spans()
    assert refused.headers["x-request-id"] == f"{server.context.trace_id:032x}"
    assert server.parent is None
    assert server.attributes["vkgate.error_code"] == "invalid_api_key"


@asynccontextmanager
async def collector() -> AsyncIterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """An OTLP/HTTP collector on loopback that keeps every export it receives."""
    received: list[ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        received.append(export)
        return web.Response(body=b"", content_type="application/x-protobuf")

    server = web.Application()
    server.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(server, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        await runner.cleanup()


async def test_spans_reach_an_otlp_collector_by_the_time_the_proxy_has_stopped(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, tenant: Tenant
) -> None:
    async with collector() as (url, received):
        settings = proxy_settings(otel_endpoint=url, otel_service_name="vkgate-under-test")
        async with serve_proxy(app, clock, settings) as proxy, proxy.http() as http:
            answer = await http.post(
                "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {tenant.key}"}
            )
            assert answer.status_code == 200
        # Stopping the proxy flushed its exporter: nothing is waited for here.
    spans = [
        (resource, span)
        for export in received
        for resource in export.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    names = {span.name for _, span in spans}
    assert "POST /v1/chat/completions" in names
    trace_ids = {span.trace_id.hex() for _, span in spans}
    assert answer.headers["x-request-id"] in trace_ids
    service = {
        attribute.value.string_value
        for resource, _ in spans
        for attribute in resource.resource.attributes
        if attribute.key == "service.name"
    }
    assert service == {"vkgate-under-test"}


async def test_requests_in_one_callers_trace_keep_ids_of_their_own(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, tenant: Tenant
) -> None:
    exporter = InMemorySpanExporter()
    headers = {
        "Authorization": f"Bearer {tenant.key}",
        "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
    }
    async with (
        serve_proxy(app, clock, proxy_settings(), span_exporter=exporter) as proxy,
        proxy.http() as http,
    ):
        ids = [
            (await http.post("/v1/chat/completions", json=CHAT, headers=headers)).headers[
                "x-request-id"
            ]
            for _ in range(2)
        ]
    assert len(set(ids)) == 2 and CALLER_TRACE not in ids
    servers = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert sorted(s.attributes["vkgate.request_id"] for s in servers) == sorted(ids)
    assert {f"{s.context.trace_id:032x}" for s in servers} == {CALLER_TRACE}


async def test_a_disabled_sdk_leaves_requests_served_and_untraced(
    app: Litestar,
    client: httpx.AsyncClient,
    clock: ManualClock,
    tenant: Tenant,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # OTEL_SDK_DISABLED makes every span a no-op: no ids, nothing to inject.
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    async with (
        serve_proxy(app, clock, proxy_settings(), span_exporter=InMemorySpanExporter()) as proxy,
        proxy.http() as http,
    ):
        answer = await http.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {tenant.key}"}
        )
    assert answer.status_code == 200
    assert answer.headers["x-request-id"] != "0" * 32
    assert fake_openai.received[-1].header("traceparent") is None


async def test_a_collector_that_never_answers_cannot_hold_up_the_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    silent = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    tracing = Tracing(proxy_settings(otel_endpoint=f"http://127.0.0.1:{port}"))
    span = tracing.start_request("POST", "/v1/chat/completions", Head({"headers": []}))
    assert span is not None
    span.end(200, None, vk_id=None, model=None, provider=None, attempts=0, end_user_hash=None)
    logger = logging.getLogger("vkgate.proxy.tracing")
    logger.addHandler(caplog.handler)
    try:
        async with silent:
            # Bounded by its own timeout, not by the collector.
            await asyncio.to_thread(tracing.shutdown, 0.2)
    finally:
        logger.removeHandler(caplog.handler)
    assert any("were not exported within 0.2 s" in r.getMessage() for r in caplog.records)
