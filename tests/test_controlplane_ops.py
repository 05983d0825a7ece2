"""Operating the control plane: health, readiness, metrics access, conditional config fetches."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from pathlib import Path

import httpx
import pytest
from litestar import Litestar

from controlplane import readiness
from controlplane.app import create_app
from controlplane.db import Database, create_engine
from controlplane.ledger.store import Ledger
from controlplane.settings import ControlPlaneSettings, LedgerLocation
from tests.conftest import Internal, World, serve_in_loop
from tests.support.clock import ManualClock


async def test_health_and_readiness_answer_without_a_token(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ok", "database": "ok", "ledger": "ok"}


async def test_an_unreachable_ledger_leaves_the_control_plane_ready_and_says_so_without_naming_it(
    settings: ControlPlaneSettings, clean_database: Database, clock: ManualClock
) -> None:
    down = LedgerLocation(
        kind="http",
        host="127.0.0.1",
        port=9,
        database="spend",
        username="spender",
        password="ledger-password-7f3a",
    )
    ledger = Ledger(down)
    app = create_app(settings, clock=clock, database=clean_database, ledger=ledger)
    try:
        async with serve_in_loop(app, "http://cp.test") as client:
            ready = await client.get("/readyz")
            alive = await client.get("/healthz")
    finally:
        await ledger.close()
    # Keys still resolve and the feed still runs: spend waits in the proxies' spools.
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "degraded"
    assert body["database"] == "ok"
    assert body["ledger"].startswith("unavailable (")
    for leak in ("127.0.0.1", "spender", "ledger-password-7f3a", "http"):
        assert leak not in ready.text
    assert alive.status_code == 200


async def test_an_unreachable_database_makes_the_control_plane_unready_without_naming_it(
    settings: ControlPlaneSettings, clock: ManualClock, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-directory" / "controlplane.db"
    broken = Database(create_engine(f"sqlite:///{missing}"))
    app = create_app(settings, clock=clock, database=broken)
    try:
        async with serve_in_loop(app, "http://cp.test") as client:
            ready = await client.get("/readyz")
    finally:
        await broken.close()
    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "unavailable"
    assert body["database"] == "unavailable (OperationalError)"
    assert body["ledger"] == "ok"
    assert "no-such-directory" not in ready.text


async def test_a_store_that_does_not_answer_in_time_is_reported_as_a_timeout(
    app: Litestar, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def hung() -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(readiness, "CHECK_TIMEOUT_S", 0.05)
    monkeypatch.setattr(app.state["vk"].ledger, "ping", hung)
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "degraded", "database": "ok", "ledger": "timeout"}


async def test_metrics_are_open_without_a_metrics_token(client: httpx.AsyncClient) -> None:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert "vkgate_controlplane_internal_auth_failures_total" in response.text


async def test_metrics_token_guards_the_metrics(
    settings: ControlPlaneSettings, clean_database: Database, clock: ManualClock
) -> None:
    token = "metrics-token-0123456789abcdef0123456789"
    app = create_app(
        dataclasses.replace(settings, metrics_token=token), clock=clock, database=clean_database
    )
    async with serve_in_loop(app, "http://cp.test") as client:
        refused = await client.get("/metrics")
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        allowed = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == wrong.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert allowed.status_code == 200


async def test_config_if_none_match_takes_weak_tags_lists_and_star(
    world: World, internal: Internal
) -> None:
    path = f"/api/internal/gateway/config/{world.key_id}"
    etag = (await internal.call("GET", path)).headers["etag"]
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        response = await internal.call("GET", path, headers={"If-None-Match": header})
        assert response.status_code == 304, header
        assert response.content == b""
    changed = await internal.call("GET", path, headers={"If-None-Match": '"other"'})
    assert changed.status_code == 200


async def test_the_server_freezes_what_start_up_built_and_a_test_app_does_not(
    settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> None:
    gc.unfreeze()
    app = create_app(settings, clock=clock, database=clean_database)
    async with serve_in_loop(app, "http://cp.test") as client:
        assert (await client.get("/healthz")).status_code == 200
    assert gc.get_freeze_count() == 0
    server = create_app(settings, clock=clock, database=clean_database, freeze_heap=True)
    try:
        async with serve_in_loop(server, "http://cp.test") as client:
            # Frozen once started, before the first request is served.
            assert gc.get_freeze_count() > 0
            assert (await client.get("/healthz")).status_code == 200
    finally:
        gc.unfreeze()
