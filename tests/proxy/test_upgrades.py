"""A proxy and a control plane of different releases: they tell each other their versions on
every signed call; one minor version apart they work as ever; further apart `/health` (and
`vkgate doctor`) name the mismatch. And a key with budgets that no proxy has cached resolves
while the ledger is down."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import msgspec
import pytest
from litestar import Litestar

import vkgate
from controlplane.ledger.client import LedgerError
from tests.conftest import Internal
from tests.proxy.conftest import (
    CHAT_ALIAS,
    Tenant,
    add_key,
    proxy_settings,
    serve_proxy,
)
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.fake_openai import FakeOpenAI
from vkgate.wire import INTERNAL_PREFIX, VERSION_HEADER

CHAT = {"model": CHAT_ALIAS, "messages": [{"role": "user", "content": "hi"}]}


class Release(httpx.AsyncBaseTransport):
    """The road to the control plane, with the control plane claiming to run `version`; and
    what the proxy said it runs."""

    def __init__(self, app: Litestar, version: str) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self._version = version
        self.proxy_versions: set[str | None] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.proxy_versions.add(request.headers.get(VERSION_HEADER))
        response = await self._inner.handle_async_request(request)
        body = await response.aread()
        headers = dict(response.headers)
        if VERSION_HEADER.lower() in headers:
            headers[VERSION_HEADER.lower()] = self._version
        if request.url.path == f"{INTERNAL_PREFIX}/health" and response.status_code == 200:
            health = msgspec.json.decode(body)
            body = msgspec.json.encode({**health, "version": self._version})
            headers.pop("content-length", None)
        return httpx.Response(response.status_code, headers=headers, content=body)


def release(offset: int) -> str:
    major, minor, *_ = vkgate.__version__.split(".")
    return f"{major}.{int(minor) + offset}.0"


async def test_a_control_plane_one_minor_version_ahead_serves_the_proxy_and_health_says_ok(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, tenant: Tenant
) -> None:
    road = Release(app, release(1))
    async with (
        serve_proxy(None, clock, proxy_settings(), control_transport=road) as proxy,
        proxy.http() as http,
    ):
        answer = await http.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {tenant.key}"}
        )
        health = await http.get("/health")
    assert answer.status_code == 200, answer.text
    assert health.status_code == 200
    assert health.json()["version"] == vkgate.__version__
    assert health.json()["controlplane"]["version"] == release(1)
    assert road.proxy_versions == {vkgate.__version__}


async def test_health_names_a_control_plane_two_minor_versions_away(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, tenant: Tenant
) -> None:
    road = Release(app, release(2))
    async with (
        serve_proxy(None, clock, proxy_settings(), control_transport=road) as proxy,
        proxy.http() as http,
    ):
        health = await http.get("/health")
        # Named, not enforced: what is cached and what resolves keeps being served.
        answer = await http.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {tenant.key}"}
        )
    assert health.status_code == 503
    body = health.json()
    assert body["status"] == "version_mismatch"
    assert body["controlplane"]["cause"] == "version"
    assert (
        f"proxy {vkgate.__version__} and control plane {release(2)} are more than 1 minor "
        "version apart"
    ) in body["controlplane"]["detail"]
    assert "one minor version at a time" in body["controlplane"]["fix"]
    assert answer.status_code == 200


async def test_the_control_plane_counts_calls_by_the_proxys_release_and_logs_a_far_one_once(
    app: Litestar, internal: Internal, caplog: pytest.LogCaptureFixture
) -> None:
    far = release(3)
    with caplog.at_level(logging.WARNING, logger="vkgate.controlplane.internal"):
        for _ in range(3):
            answer = await internal.call(
                "GET", f"{INTERNAL_PREFIX}/health", headers={VERSION_HEADER: far}
            )
            assert answer.headers[VERSION_HEADER] == vkgate.__version__
        await internal.call("GET", f"{INTERNAL_PREFIX}/health")
    mismatches = [r for r in caplog.records if r.getMessage() == "proxy_version_mismatch"]
    assert len(mismatches) == 1
    metrics = app.state["vk"].metrics.registry
    assert metrics.get_sample_value("vkgate_controlplane_proxy_calls_total", {"version": far}) == 3
    assert (
        metrics.get_sample_value("vkgate_controlplane_proxy_calls_total", {"version": "unknown"})
        == 1
    )


async def test_a_budgeted_key_no_proxy_cached_resolves_while_the_ledger_is_down(
    app: Litestar,
    client: httpx.AsyncClient,
    clock: ManualClock,
    tenant: Tenant,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body: dict[str, Any] = {
        "organization_id": tenant.org,
        "scope": {"kind": "project", "id": tenant.project},
        "window": "month",
        "limit_usd": "50",
    }
    await create(client, "/api/admin/budgets", body)
    _, key = await add_key(client, tenant)
    # One proxy resolves a key of the project: the control plane reads, and saves, the
    # budget's spend.
    async with serve_proxy(app, clock, proxy_settings()) as first, first.http() as http:
        answer = await http.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {tenant.key}"}
        )
        assert answer.status_code == 200, answer.text

    async def down(*args: object) -> None:
        raise LedgerError("connection refused", cause="ConnectError")

    monkeypatch.setattr(app.state["vk"].ledger, "spend", down)
    # A new proxy, with nothing cached, and another key under the same budget.
    async with serve_proxy(app, clock, proxy_settings()) as fresh, fresh.http() as http:
        answer = await http.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
        )
    assert answer.status_code == 200, answer.text
    registry = app.state["vk"].metrics.registry
    assert registry.get_sample_value("vkgate_controlplane_stale_spend_bundles_total")
