"""Operating the control plane: health, readiness, metrics access, conditional config fetches."""

from __future__ import annotations

import dataclasses

import httpx

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.settings import ControlPlaneSettings
from tests.conftest import Internal, World, serve_in_loop
from tests.support.clock import ManualClock


async def test_health_and_readiness_answer_without_a_token(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ok"}


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
