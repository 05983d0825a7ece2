"""`GET changes`: the global, gap-free change feed and its long-poll, woken by admin writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from litestar import Litestar

from controlplane.db import Database
from controlplane.feed import service as feed_service
from tests.conftest import Internal, World, signed_get
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from vkgate.wire import EventKind

CHANGES = "/api/internal/gateway/changes"
KEYS = "/api/admin/virtual-keys"
MAX_EVENTS = 500


async def changes(internal: Internal, query: str) -> httpx.Response:
    return await internal.call("GET", f"{CHANGES}?{query}")


async def all_events(internal: Internal, since: int = 0) -> list[dict[str, Any]]:
    response = await changes(internal, f"since={since}&timeout_s=0")
    if response.status_code == 204:
        return []
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


async def patch_key(client: httpx.AsyncClient, vk_id: str, rpm: int) -> None:
    response = await client.patch(f"{KEYS}/{vk_id}", json={"limits": {"rpm": rpm}}, headers=ADMIN)
    assert response.status_code == 200, response.text


async def append_key_updates(
    database: Database, clock: ManualClock, organization_id: str, vk_id: str, count: int
) -> None:
    """`count` events in one transaction through the feed's own append: many PATCHes, cheaply."""
    async with database.transaction() as session:
        for _ in range(count):
            await feed_service.append(
                session,
                clock=clock,
                kind=EventKind.VK_CONFIG_UPDATED,
                organization_id=organization_id,
                entity_kind="virtual_key",
                entity_id=vk_id,
                vk_id=vk_id,
            )


async def second_org_with_key(client: httpx.AsyncClient) -> tuple[str, str]:
    async def post(path: str, body: dict[str, Any]) -> str:
        response = await client.post(path, json=body, headers=ADMIN)
        assert response.status_code == 201, response.text
        ident: str = response.json()["id"]
        return ident

    org = await post("/api/admin/organizations", {"name": "globex"})
    project = await post("/api/admin/projects", {"organization_id": org, "name": "web"})
    provider = await post(
        "/api/admin/providers", {"organization_id": org, "name": "demo", "kind": "mock"}
    )
    policy = await post(
        "/api/admin/routing-policies",
        {
            "organization_id": org,
            "name": "p",
            "aliases": {"fast": [{"provider_id": provider, "model": "m"}]},
        },
    )
    key = await post(KEYS, {"project_id": project, "name": "k", "routing_policy_id": policy})
    return org, key


# --- reading the feed ---------------------------------------------------------------------------


async def test_events_after_since_come_in_revision_order_with_the_current_revision(
    internal: Internal, world: World, clock: ManualClock
) -> None:
    # `world` appended: provider created, policy created, key created.
    everything = await changes(internal, "since=0&timeout_s=0")
    assert everything.status_code == 200
    body = everything.json()
    assert [(e["revision"], e["kind"]) for e in body["events"]] == [
        (1, "MODEL_PROVIDER_UPDATED"),
        (2, "ROUTING_POLICY_UPDATED"),
        (3, "VK_CREATED"),
    ]
    assert body["current_revision"] == 3

    later = (await changes(internal, "since=1&timeout_s=0")).json()
    assert [e["revision"] for e in later["events"]] == [2, 3]
    assert later["current_revision"] == 3


async def test_events_name_what_changed(internal: Internal, world: World) -> None:
    provider, policy, key = await all_events(internal)

    assert provider == {
        "revision": 1,
        "kind": "MODEL_PROVIDER_UPDATED",
        "organization_id": world.org,
        "entity_kind": "provider",
        "entity_id": world.provider,
        "at": "2026-03-10T12:00:00Z",
        "vk_id": None,
    }
    assert (policy["entity_kind"], policy["entity_id"], policy["vk_id"]) == (
        "routing_policy",
        world.policy,
        None,
    )
    assert (key["entity_kind"], key["entity_id"], key["vk_id"]) == (
        "virtual_key",
        world.key_id,
        world.key_id,
    )


async def test_revisions_rise_by_one_with_no_gaps_even_around_refused_writes(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    await patch_key(client, world.key_id, 10)
    refused = await client.patch(
        f"{KEYS}/{world.key_id}", json={"allowed_models": ["nope"]}, headers=ADMIN
    )
    assert refused.status_code == 422
    await client.post(
        "/api/admin/budgets",
        json={
            "organization_id": world.org,
            "scope": {"kind": "organization"},
            "window": "day",
            "limit_usd": "5",
        },
        headers=ADMIN,
    )
    await client.post(f"{KEYS}/{world.key_id}/rotate", headers=ADMIN)
    await client.post(f"{KEYS}/{world.key_id}/disable", headers=ADMIN)
    await client.post(f"{KEYS}/{world.key_id}/disable", headers=ADMIN)  # no-op: no event
    await patch_key(client, world.key_id, 20)

    revisions = [e["revision"] for e in await all_events(internal)]
    assert revisions == list(range(1, 9))


async def test_organization_id_narrows_the_events_but_not_the_revision(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    other_org, other_key = await second_org_with_key(client)
    await patch_key(client, world.key_id, 5)

    mine = (await changes(internal, f"since=0&timeout_s=0&organization_id={world.org}")).json()
    theirs = (await changes(internal, f"since=0&timeout_s=0&organization_id={other_org}")).json()
    both = (await changes(internal, "since=0&timeout_s=0")).json()

    assert {e["organization_id"] for e in mine["events"]} == {world.org}
    assert {e["organization_id"] for e in theirs["events"]} == {other_org}
    assert [e["vk_id"] for e in theirs["events"] if e["vk_id"]] == [other_key]
    assert len(mine["events"]) + len(theirs["events"]) == len(both["events"])
    latest = both["events"][-1]["revision"]
    assert mine["current_revision"] == theirs["current_revision"] == latest


async def test_a_filtered_poll_with_nothing_for_its_organization_times_out_at_the_revision(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    other_org, _ = await second_org_with_key(client)
    current = (await changes(internal, "since=0&timeout_s=0")).json()["current_revision"]
    await patch_key(client, world.key_id, 5)

    response = await changes(internal, f"since={current}&timeout_s=0&organization_id={other_org}")

    assert response.status_code == 204
    assert response.headers["x-vkgate-revision"] == str(current + 1)


async def test_at_most_500_events_come_back_and_current_revision_says_where_they_stop(
    internal: Internal, world: World, clean_database: Database, clock: ManualClock
) -> None:
    await append_key_updates(clean_database, clock, world.org, world.key_id, 520)
    total = 3 + 520

    first = (await changes(internal, "since=0&timeout_s=0")).json()
    assert len(first["events"]) == MAX_EVENTS
    assert first["current_revision"] == first["events"][-1]["revision"] == MAX_EVENTS

    rest = (await changes(internal, f"since={first['current_revision']}&timeout_s=0")).json()
    assert [e["revision"] for e in rest["events"]] == list(range(MAX_EVENTS + 1, total + 1))
    assert rest["current_revision"] == total


async def test_a_filtered_page_that_fills_up_stops_at_its_last_event(
    client: httpx.AsyncClient,
    internal: Internal,
    world: World,
    clean_database: Database,
    clock: ManualClock,
) -> None:
    _, other_key = await second_org_with_key(client)
    await append_key_updates(clean_database, clock, world.org, world.key_id, 503)
    await patch_key(client, other_key, 1)  # after everything of world.org

    page = (await changes(internal, f"since=0&timeout_s=0&organization_id={world.org}")).json()

    assert len(page["events"]) == MAX_EVENTS
    assert page["current_revision"] == page["events"][-1]["revision"]
    following = (
        await changes(
            internal, f"since={page['current_revision']}&timeout_s=0&organization_id={world.org}"
        )
    ).json()
    assert len(following["events"]) == 3 + 503 - MAX_EVENTS
    assert {e["organization_id"] for e in following["events"]} == {world.org}


# --- waiting and timing out ---------------------------------------------------------------------


@pytest.mark.parametrize("timeout_s", ["0", "0.05"])
async def test_a_poll_with_no_new_events_ends_in_204_with_the_current_revision(
    internal: Internal, world: World, timeout_s: str
) -> None:
    response = await changes(internal, f"since=3&timeout_s={timeout_s}")

    assert response.status_code == 204
    assert response.content == b""
    assert response.headers["x-vkgate-revision"] == "3"


async def test_an_empty_feed_times_out_at_revision_zero(
    internal: Internal, clean_database: Database
) -> None:
    response = await changes(internal, "since=0&timeout_s=0")
    assert response.status_code == 204
    assert response.headers["x-vkgate-revision"] == "0"


async def test_a_since_ahead_of_the_feed_answers_at_once_so_the_proxy_resyncs(
    internal: Internal, world: World
) -> None:
    response = await changes(internal, "since=1000&timeout_s=20")

    assert response.status_code == 200
    assert response.json() == {"events": [], "current_revision": 3}


@pytest.mark.parametrize(
    "query",
    ["since=-1&timeout_s=0", "since=0&timeout_s=-1", "since=x&timeout_s=0"],
    ids=["negative-since", "negative-timeout", "since-not-a-number"],
)
async def test_a_malformed_poll_is_refused(internal: Internal, world: World, query: str) -> None:
    response = await changes(internal, query)
    assert response.status_code in (400, 422)
    assert response.json()["error"]["code"] in ("invalid_request", "validation_error")


# --- waking ---------------------------------------------------------------------------------------
# An app that re-reads the feed only hourly, so a poll that ends early was woken. It runs in the
# test's loop without its lifespan, so PostgreSQL's cross-replica listener (test_feed_replicas.py)
# is not started: what wakes these polls is the in-process wake-up of a committed write alone.


@pytest.fixture
async def concurrent(waking_app: Litestar) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=waking_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://controlplane.test") as c:
        yield c


async def test_a_waiting_poll_is_woken_by_an_admin_write_and_returns_its_event(
    concurrent: httpx.AsyncClient, parked: asyncio.Queue[None], clock: ManualClock, world: World
) -> None:
    poll = asyncio.create_task(signed_get(concurrent, clock, f"{CHANGES}?since=3&timeout_s=20"))
    await asyncio.wait_for(parked.get(), 5)

    await patch_key(concurrent, world.key_id, 7)
    response = await asyncio.wait_for(poll, 5)

    assert response.status_code == 200, response.text
    body = response.json()
    assert [(e["kind"], e["vk_id"]) for e in body["events"]] == [
        ("VK_CONFIG_UPDATED", world.key_id)
    ]
    assert body["current_revision"] == 4


async def test_every_waiting_poll_is_woken_by_one_write(
    concurrent: httpx.AsyncClient, parked: asyncio.Queue[None], clock: ManualClock, world: World
) -> None:
    polls = [
        asyncio.create_task(signed_get(concurrent, clock, f"{CHANGES}?since=3&timeout_s=20"))
        for _ in range(3)
    ]
    for _ in polls:
        await asyncio.wait_for(parked.get(), 5)

    await patch_key(concurrent, world.key_id, 7)
    responses = await asyncio.wait_for(asyncio.gather(*polls), 5)

    assert [r.json()["current_revision"] for r in responses] == [4, 4, 4]


async def test_a_woken_poll_with_nothing_for_its_organization_waits_on(
    client: httpx.AsyncClient,
    concurrent: httpx.AsyncClient,
    parked: asyncio.Queue[None],
    clock: ManualClock,
    world: World,
) -> None:
    other_org, other_key = await second_org_with_key(client)
    current = len(await all_events(Internal(client, clock)))
    poll = asyncio.create_task(
        signed_get(
            concurrent,
            clock,
            f"{CHANGES}?since={current}&timeout_s=20&organization_id={world.org}",
        )
    )
    await asyncio.wait_for(parked.get(), 5)

    await patch_key(concurrent, other_key, 1)  # wakes the poll, which finds nothing of its own
    await asyncio.wait_for(parked.get(), 5)
    assert not poll.done()
    await patch_key(concurrent, world.key_id, 1)
    response = await asyncio.wait_for(poll, 5)

    events = response.json()["events"]
    assert [(e["organization_id"], e["vk_id"]) for e in events] == [(world.org, world.key_id)]
    assert other_org != world.org


async def test_a_write_committing_while_the_poll_reads_the_feed_still_wakes_it(
    concurrent: httpx.AsyncClient,
    clock: ManualClock,
    world: World,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The write lands after the poll has read the feed and before it starts waiting: the
    # wake-up it sends must not be lost, or the poll sleeps through it.
    read = feed_service.read
    writes: list[int] = []

    async def read_then_write(*args: Any, **kwargs: Any) -> list[Any]:
        rows = await read(*args, **kwargs)
        if not writes:
            writes.append(1)
            await patch_key(concurrent, world.key_id, 9)
        return rows

    monkeypatch.setattr(feed_service, "read", read_then_write)
    response = await asyncio.wait_for(
        signed_get(concurrent, clock, f"{CHANGES}?since=3&timeout_s=20"), 5
    )

    assert response.status_code == 200
    assert [e["kind"] for e in response.json()["events"]] == ["VK_CONFIG_UPDATED"]
