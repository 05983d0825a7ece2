"""The change feed across control plane replicas, and long-polls that hold no connection."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from litestar import Litestar

from controlplane.app import create_app
from controlplane.db import Database, is_sqlite
from controlplane.feed.listener import PostgresFeedListener
from controlplane.feed.service import FeedNotifier
from controlplane.settings import ControlPlaneSettings
from tests.conftest import Internal, serve_in_loop
from tests.support.api import ADMIN
from tests.support.clock import ManualClock

CHANGES = "/api/internal/gateway/changes"


def _without_periodic_reread(settings: ControlPlaneSettings) -> ControlPlaneSettings:
    # An hour: only a wake-up can end a poll early, so a returned poll proves the wake-up.
    return dataclasses.replace(settings, feed_poll_interval_s=3600)


async def _until_waiting(app: Litestar, count: int) -> None:
    """Yield to the loop until `count` polls of `app` wait; bounded at about ten seconds."""
    for _ in range(2_000):
        if app.state["vk"].notifier.waiting >= count:
            return
        await asyncio.sleep(0.005)  # the polls' first reads run on database threads
    raise AssertionError(f"{count} polls never started waiting")


async def _create_mock_provider(client: httpx.AsyncClient) -> str:
    org = await client.post("/api/admin/organizations", json={"name": "acme"}, headers=ADMIN)
    provider = await client.post(
        "/api/admin/providers",
        json={"organization_id": org.json()["id"], "name": "m", "kind": "mock"},
        headers=ADMIN,
    )
    assert provider.status_code == 201, provider.text
    provider_id: str = provider.json()["id"]
    return provider_id


async def test_write_through_one_replica_wakes_a_poll_on_another(
    settings: ControlPlaneSettings, clean_database: Database, clock: ManualClock
) -> None:
    if is_sqlite(settings.database_url):
        pytest.skip("replicas share a PostgreSQL database; SQLite is single-node")
    slow = _without_periodic_reread(settings)
    writer_app = create_app(slow, clock=clock, database=clean_database)
    poller_app = create_app(slow, clock=clock, database=clean_database)
    async with (
        serve_in_loop(writer_app, "http://a.test") as writer,
        serve_in_loop(poller_app, "http://b.test") as poller,
    ):
        poll = asyncio.create_task(
            Internal(poller, clock).call("GET", f"{CHANGES}?since=0&timeout_s=20")
        )
        await _until_waiting(poller_app, 1)
        provider_id = await _create_mock_provider(writer)
        answer = await asyncio.wait_for(poll, 10)
    assert answer.status_code == 200
    events = answer.json()["events"]
    assert [e["kind"] for e in events] == ["MODEL_PROVIDER_UPDATED"]
    assert events[0]["entity_id"] == provider_id


async def test_more_waiting_polls_than_pooled_connections_do_not_block_writes(
    settings: ControlPlaneSettings, clean_database: Database, clock: ManualClock
) -> None:
    waiting = 40  # above both pools' size plus overflow (SQLite 5+10, PostgreSQL 10+10)
    app = create_app(_without_periodic_reread(settings), clock=clock, database=clean_database)
    async with serve_in_loop(app, "http://cp.test") as client:
        internal = Internal(client, clock)
        polls = [
            asyncio.create_task(internal.call("GET", f"{CHANGES}?since=0&timeout_s=20"))
            for _ in range(waiting)
        ]
        await _until_waiting(app, waiting)
        provider_id = await asyncio.wait_for(_create_mock_provider(client), 10)
        answers = await asyncio.wait_for(asyncio.gather(*polls), 10)
        metrics = (await client.get("/metrics")).text
    assert {a.status_code for a in answers} == {200}
    assert all(a.json()["events"][0]["entity_id"] == provider_id for a in answers)
    assert "vkgate_controlplane_feed_waiting_polls 0.0" in metrics


async def test_a_listener_started_twice_is_refused_and_stop_leaves_no_task_behind(
    settings: ControlPlaneSettings,
) -> None:
    if is_sqlite(settings.database_url):
        pytest.skip("the listener is PostgreSQL's")
    listener = PostgresFeedListener(settings.database_url, FeedNotifier())
    await listener.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            await listener.start()
    finally:
        await listener.stop()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "feed-listener"]
