"""Concurrent admin writes: none lost, duplicates refused once, feed revisions without gaps."""

from __future__ import annotations

import asyncio

import httpx

from tests.conftest import Internal, World
from tests.support.api import ADMIN

KEYS = "/api/admin/virtual-keys"


async def test_concurrent_key_creations_all_land_with_gapless_revisions(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    before = (await internal.call("GET", "/api/internal/gateway/health")).json()["revision"]
    answers = await asyncio.gather(
        *(
            client.post(
                KEYS,
                json={
                    "project_id": world.project,
                    "name": f"k{i}",
                    "routing_policy_id": world.policy,
                },
                headers=ADMIN,
            )
            for i in range(25)
        )
    )
    assert [a.status_code for a in answers] == [201] * 25
    revisions = sorted(a.json()["revision"] for a in answers)
    assert revisions == list(range(before + 1, before + 26))
    feed = await internal.call("GET", f"/api/internal/gateway/changes?since={before}&timeout_s=0")
    assert [e["revision"] for e in feed.json()["events"]] == revisions


async def test_concurrent_creations_of_one_name_yield_one_key_and_conflicts(
    client: httpx.AsyncClient, world: World
) -> None:
    body = {"project_id": world.project, "name": "same", "routing_policy_id": world.policy}
    answers = await asyncio.gather(
        *(client.post(KEYS, json=body, headers=ADMIN) for _ in range(10))
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] + [409] * 9
    listed = await client.get(KEYS, params={"project_id": world.project}, headers=ADMIN)
    assert [k["name"] for k in listed.json()["data"]].count("same") == 1
