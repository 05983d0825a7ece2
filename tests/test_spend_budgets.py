"""Budgets' spend from the ledger: in the config bundle, and per end user on request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.conftest import Internal, World
from tests.support.api import ADMIN, create, error_of
from tests.support.clock import ManualClock
from tests.support.ledger import record, segment, shipped

Client = httpx.AsyncClient
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)  # a Tuesday: the week began on Monday the 9th
BUCKET = "/api/internal/gateway/budget-bucket-spend"


async def priced_at_one_dollar_per_million(client: Client, world: World) -> None:
    """The world's provider at 1 USD per million tokens, in and out: a token is a micro-dollar."""
    response = await client.patch(
        f"/api/admin/providers/{world.provider}",
        json={"price_overrides": {"gpt-4o-mini": {"input_per_mtok": "1", "output_per_mtok": "1"}}},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text


def spent(world: World, at: datetime, micro_usd: int, **fields: Any) -> Any:
    """A served request of the world's key costing `micro_usd` micro-dollars."""
    values: dict[str, Any] = {
        "organization_id": world.org,
        "team_id": world.team,
        "project_id": world.project,
        "virtual_key_id": world.key_id,
        "provider_id": world.provider,
        "provider_kind": "openai",
        "model": "fast",
        "upstream_model": "gpt-4o-mini",
        "served_model": "gpt-4o-mini",
        "input_tokens": micro_usd,
    }
    values.update(fields)
    return record(at=at, **values)


async def add_budget(
    client: Client, org: str, kind: str, window: str, scope_id: str | None = None, **extra: Any
) -> str:
    scope = {"kind": kind} if scope_id is None else {"kind": kind, "id": scope_id}
    body = {"organization_id": org, "scope": scope, "window": window, "limit_usd": "100", **extra}
    return str((await create(client, "/api/admin/budgets", body))["id"])


async def budgets_of(internal: Internal, vk_id: str) -> dict[str, dict[str, Any]]:
    response = await internal.call("GET", f"/api/internal/gateway/config/{vk_id}")
    assert response.status_code == 200, response.text
    return {b["budget_id"]: b for b in response.json()["budgets"]}


async def test_bundle_carries_each_budgets_spend_in_its_calendar_window(
    client: Client, internal: Internal, world: World, clock: ManualClock
) -> None:
    await priced_at_one_dollar_per_million(client, world)
    windows = {w: await add_budget(client, world.org, "organization", w) for w in
               ("day", "week", "month", "total")}  # fmt: skip
    await shipped(
        client,
        clock,
        segment(
            [
                spent(world, NOW - timedelta(hours=3), 1),  # today
                spent(world, datetime(2026, 3, 9, 0, 0, tzinfo=UTC), 20),  # Monday: this week
                spent(world, datetime(2026, 3, 8, 23, 59, tzinfo=UTC), 300),  # last week
                spent(world, datetime(2026, 3, 1, tzinfo=UTC), 4000),  # this month
                spent(world, datetime(2026, 2, 28, 23, 0, tzinfo=UTC), 50000),  # last month
            ]
        ),
    )

    got = await budgets_of(internal, world.key_id)

    assert got[windows["day"]]["spent_usd"] == "0.000001"
    assert got[windows["week"]]["spent_usd"] == "0.000021"
    assert got[windows["month"]]["spent_usd"] == "0.004321"
    assert got[windows["total"]]["spent_usd"] == "0.054321"
    assert (got[windows["day"]]["window_start"], got[windows["day"]]["window_end"]) == (
        "2026-03-10T00:00:00Z",
        "2026-03-11T00:00:00Z",
    )
    assert got[windows["week"]]["window_start"] == "2026-03-09T00:00:00Z"
    assert got[windows["month"]]["window_end"] == "2026-04-01T00:00:00Z"
    assert got[windows["total"]]["window_start"] is None


async def test_bundle_spend_follows_each_budgets_scope_and_provider_filter(
    client: Client, internal: Internal, world: World, clock: ManualClock
) -> None:
    await priced_at_one_dollar_per_million(client, world)
    mock = (
        await create(
            client,
            "/api/admin/providers",
            {"organization_id": world.org, "name": "offline", "kind": "mock"},
        )
    )["id"]
    ids = {
        "org": await add_budget(client, world.org, "organization", "day"),
        "team": await add_budget(client, world.org, "team", "day", world.team),
        "project": await add_budget(client, world.org, "project", "day", world.project),
        "key": await add_budget(client, world.org, "virtual_key", "day", world.key_id),
        "alice": await add_budget(client, world.org, "end_user", "day", "alice"),
        "openai": await add_budget(client, world.org, "organization", "day", provider_id=world.provider),
        "mock": await add_budget(client, world.org, "organization", "day", provider_id=mock),
        "per_user": await add_budget(client, world.org, "end_user", "day"),
    }  # fmt: skip
    today = NOW - timedelta(hours=1)
    await shipped(
        client,
        clock,
        segment(
            [
                spent(world, today, 1, end_user="alice"),
                spent(world, today, 20, end_user="bob"),
                # Another key of another project and team, same organization:
                spent(world, today, 300, team_id="t_x", project_id="p_x", virtual_key_id="vk_x"),
            ]
        ),
    )

    by_id = await budgets_of(internal, world.key_id)
    got = {name: by_id[budget_id]["spent_usd"] for name, budget_id in ids.items()}
    assert got == {
        "org": "0.000321",
        "team": "0.000021",
        "project": "0.000021",
        "key": "0.000021",
        "alice": "0.000001",
        "openai": "0.000321",
        "mock": "0",
        "per_user": "0",  # one bucket per end user: asked for with budget-bucket-spend
    }


async def test_bundle_etag_changes_only_when_spend_does(
    client: Client, internal: Internal, world: World, clock: ManualClock
) -> None:
    await priced_at_one_dollar_per_million(client, world)
    await add_budget(client, world.org, "organization", "month")
    path = f"/api/internal/gateway/config/{world.key_id}"
    first = await internal.call("GET", path)
    etag = first.headers["etag"]
    # When the spend was read: a proxy counts what the ledger took later on top of it.
    assert first.json()["budgets"][0]["spent_as_of"] == "2026-03-10T12:00:00Z"

    # Read again later, the same spend keeps its tag.
    clock.advance(30)
    unchanged = await internal.call("GET", path, headers={"If-None-Match": etag})
    assert unchanged.status_code == 304

    refusal = record(at=NOW, kind="fail", organization_id=world.org, refused=True, status=402)
    await shipped(client, clock, segment([refusal]))
    assert (await internal.call("GET", path, headers={"If-None-Match": etag})).status_code == 304

    await shipped(client, clock, segment([spent(world, NOW, 7)]))
    changed = await internal.call("GET", path, headers={"If-None-Match": etag})
    assert changed.status_code == 200
    assert changed.headers["etag"] != etag
    assert changed.json()["budgets"][0]["spent_usd"] == "0.000007"


async def test_bucket_spend_is_one_end_users_spend_in_the_window(
    client: Client, internal: Internal, world: World, clock: ManualClock
) -> None:
    await priced_at_one_dollar_per_million(client, world)
    per_user = await add_budget(client, world.org, "end_user", "day")
    yesterday = NOW - timedelta(days=1)
    await shipped(
        client,
        clock,
        segment(
            [
                spent(world, NOW, 1, end_user="alice"),
                spent(world, NOW, 20, end_user="alice"),
                spent(world, yesterday, 300, end_user="alice"),
                spent(world, NOW, 4000, end_user="bob"),
            ]
        ),
    )

    alice = await internal.call("GET", f"{BUCKET}?budget_id={per_user}&end_user=alice")
    carol = await internal.call("GET", f"{BUCKET}?budget_id={per_user}&end_user=carol")

    assert alice.status_code == 200, alice.text
    assert alice.json() == {
        "budget_id": per_user,
        "end_user": "alice",
        "spent_usd": "0.000021",
        "window_start": "2026-03-10T00:00:00Z",
        "as_of": "2026-03-10T12:00:00Z",
        "window_end": "2026-03-11T00:00:00Z",
    }
    assert carol.json()["spent_usd"] == "0"


async def test_bucket_spend_counts_only_the_budgets_provider(
    client: Client, internal: Internal, world: World, clock: ManualClock
) -> None:
    await priced_at_one_dollar_per_million(client, world)
    other = (
        await create(
            client,
            "/api/admin/providers",
            {"organization_id": world.org, "name": "offline", "kind": "mock"},
        )
    )["id"]
    openai_only = await add_budget(
        client, world.org, "end_user", "total", provider_id=world.provider
    )
    await shipped(
        client,
        clock,
        segment(
            [
                spent(world, NOW, 5, end_user="alice"),
                spent(world, NOW, 60, end_user="alice", provider_id=other, served_model="x"),
            ]
        ),
    )
    answer = await internal.call("GET", f"{BUCKET}?budget_id={openai_only}&end_user=alice")
    assert answer.json()["spent_usd"] == "0.000005"
    assert answer.json()["window_start"] is None


@pytest.mark.parametrize(
    ("query", "status", "param"),
    [
        ("budget_id={team}&end_user=alice", 422, "budget_id"),
        ("budget_id={bob}&end_user=alice", 422, "end_user"),
        ("budget_id=bud_missing&end_user=alice", 404, "budget_id"),
        ("budget_id={bob}", 422, "end_user"),
        ("end_user=alice", 422, "budget_id"),
    ],
)
async def test_bucket_spend_refuses_what_is_not_an_end_user_bucket(
    client: Client, internal: Internal, world: World, query: str, status: int, param: str
) -> None:
    team = await add_budget(client, world.org, "team", "day", world.team)
    bob = await add_budget(client, world.org, "end_user", "day", "bob")
    response = await internal.call("GET", f"{BUCKET}?{query.format(team=team, bob=bob)}")
    error = error_of(response, status, "validation_error" if status == 422 else "not_found")
    assert error["param"] == param


async def test_bucket_spend_is_signed_like_every_internal_route(client: Client) -> None:
    response = await client.get(f"{BUCKET}?budget_id=b&end_user=alice")
    error_of(response, 401, "bad_signature")
