"""A key with budgets resolves while the ledger is down: its bundle carries the last spend the
control plane read of each budget, and says how old that figure is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from litestar import Litestar
from sqlalchemy import select

from controlplane.db import Database
from controlplane.ledger.client import LedgerError
from controlplane.ledger.store import SpendReading
from controlplane.models import BudgetSpendReading
from controlplane.spend.readings import SAVE_EVERY_S
from tests.conftest import Internal, World, create
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from vkgate.keys import key_sha256

RESOLVE = "/api/internal/gateway/resolve-key"
SPENT_NANOS = 7_250_000_000  # $7.25


class Ledger:
    """The ledger's spend reads, switched between answering and failing."""

    def __init__(self) -> None:
        self.down = False
        self.nanos = SPENT_NANOS

    async def spend(self, organization_id: str, filters: Any, as_of: datetime) -> SpendReading:
        if self.down:
            raise LedgerError("connection refused", cause="ConnectError")
        return SpendReading(tuple(self.nanos for _ in filters), as_of)


@pytest.fixture
def ledger(app: Litestar, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    fake = Ledger()
    monkeypatch.setattr(app.state["vk"].ledger, "spend", fake.spend)
    return fake


async def budgeted(client: httpx.AsyncClient, world: World, window: str = "month") -> str:
    body = {
        "organization_id": world.org,
        "scope": {"kind": "virtual_key", "id": world.key_id},
        "window": window,
        "limit_usd": "25",
    }
    return str((await create(client, "/api/admin/budgets", body))["id"])


async def config(internal: Internal, world: World) -> httpx.Response:
    return await internal.call("GET", f"/api/internal/gateway/config/{world.key_id}")


async def readings(database: Database) -> list[tuple[str, int, datetime]]:
    async with database.transaction() as session:
        rows = await session.scalars(select(BudgetSpendReading))
        return [(r.budget_id, r.spent_nano_usd, r.read_at) for r in rows]


async def test_with_the_ledger_down_a_key_resolves_with_its_budgets_last_spend_and_its_age(
    client: httpx.AsyncClient,
    internal: Internal,
    world: World,
    ledger: Ledger,
    clock: ManualClock,
) -> None:
    budget = await budgeted(client, world)
    read_at = clock.now()
    assert (await config(internal, world)).status_code == 200  # the ledger answers: saved
    clock.advance(300)
    ledger.down = True

    resolved = await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(world.key)})
    fetched = await config(internal, world)

    assert resolved.status_code == fetched.status_code == 200, fetched.text
    bundle = resolved.json()["bundle"]
    assert bundle == fetched.json()
    (state,) = bundle["budgets"]
    assert state["budget_id"] == budget
    assert state["spent_usd"] == "7.25"
    assert state["spent_from"] == "last_reading"
    assert datetime.fromisoformat(state["spent_as_of"]) == read_at
    assert resolved.json()["etag"] == fetched.headers["etag"]


async def test_a_fresh_read_says_it_came_from_the_ledger(
    client: httpx.AsyncClient, internal: Internal, world: World, ledger: Ledger
) -> None:
    await budgeted(client, world)
    (state,) = (await config(internal, world)).json()["budgets"]
    assert state["spent_from"] == "ledger"


async def test_a_budget_never_read_still_leaves_its_key_unresolvable_while_the_ledger_is_down(
    client: httpx.AsyncClient, internal: Internal, world: World, ledger: Ledger
) -> None:
    await budgeted(client, world)
    ledger.down = True
    resolved = await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(world.key)})
    assert resolved.json()["bundle"] is None
    assert (await config(internal, world)).status_code == 503


async def test_a_reading_of_a_window_since_ended_counts_the_new_window_from_zero_at_its_start(
    client: httpx.AsyncClient,
    internal: Internal,
    world: World,
    ledger: Ledger,
    clock: ManualClock,
) -> None:
    clock.set(datetime(2026, 3, 10, 23, 59, tzinfo=UTC))
    await budgeted(client, world, window="day")
    await config(internal, world)
    clock.set(datetime(2026, 3, 11, 0, 30, tzinfo=UTC))
    ledger.down = True
    (state,) = (await config(internal, world)).json()["budgets"]
    assert state["spent_usd"] == "0"
    assert datetime.fromisoformat(state["spent_as_of"]) == datetime(2026, 3, 11, tzinfo=UTC)
    assert state["spent_from"] == "last_reading"


async def test_readings_are_saved_at_most_once_a_minute_per_budget_unless_the_window_moves(
    client: httpx.AsyncClient,
    internal: Internal,
    world: World,
    ledger: Ledger,
    clock: ManualClock,
    clean_database: Database,
) -> None:
    clock.freeze()
    budget = await budgeted(client, world)
    first = clock.now()
    await config(internal, world)
    clock.elapse(SAVE_EVERY_S / 2)
    ledger.nanos = 9_000_000_000
    await config(internal, world)
    assert await readings(clean_database) == [(budget, SPENT_NANOS, first)]
    clock.elapse(SAVE_EVERY_S / 2)
    await config(internal, world)
    assert await readings(clean_database) == [(budget, 9_000_000_000, first + timedelta(minutes=1))]


async def test_a_deleted_budget_takes_its_reading_with_it(
    client: httpx.AsyncClient,
    internal: Internal,
    world: World,
    ledger: Ledger,
    clean_database: Database,
) -> None:
    budget = await budgeted(client, world)
    await config(internal, world)
    assert await readings(clean_database)
    deleted = await client.delete(f"/api/admin/budgets/{budget}", headers=ADMIN)
    assert deleted.status_code in (200, 204), deleted.text
    assert await readings(clean_database) == []
