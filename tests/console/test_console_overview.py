"""The overview's figures: daily sums for what was ingested after they began, the ledger's
own rows for what came before, together equal to the report of the same month."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.ledger.client import connect
from controlplane.ledger.store import Ledger
from controlplane.settings import ControlPlaneSettings, LedgerLocation
from tests.conftest import World, serve_in_loop
from tests.console.support import sign_in
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.env import ADMIN_TOKEN
from tests.support.ledger import (
    nanos,
    request,
    segment,
    shipped,
    spend_report,
    summed_from_the_start,
)
from vkgate.money import nanos_to_usd

SINCE = datetime(2026, 3, 10, tzinfo=UTC)
"""When the overview's daily sums began, in this test."""


@pytest.fixture
def sums_began_on_the_tenth(ledger_location: LedgerLocation) -> Iterator[None]:
    client = connect(ledger_location)
    try:
        client.command("TRUNCATE TABLE ledger_usage_daily_since")
        client.command(f"INSERT INTO ledger_usage_daily_since VALUES ('{SINCE:%Y-%m-%d %H:%M:%S}')")
        yield
    finally:
        summed_from_the_start(client)
        client.close()


async def test_the_overview_adds_the_ledgers_rows_from_before_its_sums_to_the_sums(
    client: httpx.AsyncClient, world: World, clock: ManualClock, sums_began_on_the_tenth: None
) -> None:
    def served(at: datetime, tokens: int, **fields: object) -> list[object]:
        return request(
            at,
            organization_id=world.org,
            team_id=world.team,
            project_id=world.project,
            virtual_key_id=world.key_id,
            model="fast",
            upstream_model="gpt-4o-mini",
            served_model="gpt-4o-mini",
            provider_id=world.provider,
            provider_kind="openai",
            input_tokens=tokens,
            output_tokens=tokens // 10,
            **fields,
        )

    # Ingested on the 9th, before the sums began: only the ledger's own rows hold these.
    clock.set(SINCE - timedelta(hours=12))
    before = served(SINCE - timedelta(hours=13), 1000) + served(
        SINCE - timedelta(hours=13), 0, kind="fail", status=429, refused=True
    )
    await shipped(client, clock, segment(before))  # type: ignore[arg-type]
    # Ingested on the 10th, after: only the sums hold these.
    clock.set(SINCE + timedelta(hours=12))
    after = served(SINCE + timedelta(hours=11), 5000) + served(
        SINCE + timedelta(hours=11), 0, kind="fail", status=502, error_code="provider_error"
    )
    await shipped(client, clock, segment(after))  # type: ignore[arg-type]

    month = await spend_report(client, world.org, **{"from": "2026-03-01", "to": "2026-04-01"})
    today = await spend_report(client, world.org, **{"from": "2026-03-10", "to": "2026-03-11"})
    assert (month["totals"]["requests"], month["totals"]["refused"]) == (2, 1)
    assert month["totals"]["failed"] == 1

    # A token of this organization's: the ledger is shared by the session's tests, and the top
    # keys of every organization could be other tests' keys.
    bound = await create(
        client,
        "/api/admin/tokens",
        {"name": "overview", "role": "admin", "organization_id": world.org},
    )
    await sign_in(client, bound["token"])
    page = await client.get("/console/")
    assert page.status_code == 200
    row = page.text.split(">acme</a></td>", 1)[1].split("</tr>", 1)[0]
    cells = [c.split("</td>")[0].strip() for c in re.split(r'<td class="num[^"]*">', row)[1:]]
    assert cells == [
        "1",  # today: served
        "0",  # refused (on the 9th)
        "1",  # failed
        f"${today['totals']['cost_usd']}",
        "2",
        "1",
        "1",
        f"${month['totals']['cost_usd']}",
    ]
    top_keys = page.text.split("Top keys this month", 1)[1].split("</table>", 1)[0]
    assert world.key_id in top_keys and f"${month['totals']['cost_usd']}<" in top_keys


def _served(world: World, at: datetime, tokens: int) -> list[object]:
    return request(
        at,
        organization_id=world.org,
        team_id=world.team,
        project_id=world.project,
        virtual_key_id=world.key_id,
        model="fast",
        upstream_model="gpt-4o-mini",
        served_model="gpt-4o-mini",
        provider_id=world.provider,
        provider_kind="openai",
        input_tokens=tokens,
        output_tokens=tokens // 10,
    )


def _nearest(page: str) -> list[list[str]]:
    """The rows of "Budgets nearest their limit": name, window, limit, spent, left."""
    table = page.split("Budgets nearest their limit", 1)[1].split("</tbody>", 1)[0]
    rows = []
    for row in table.split("<tr>")[2:]:
        name = row.split("</a>", 1)[0].rsplit(">", 1)[1]
        cells = [c.split("</td>", 1)[0] for c in row.split("<td")[2:6]]
        rows.append([name, *(c.split(">", 1)[1] for c in cells)])
    return rows


async def test_the_overview_lists_the_budgets_nearest_their_limit_with_their_spend(
    client: httpx.AsyncClient, world: World, clock: ManualClock
) -> None:
    # Yesterday and today (the 10th) on one key: the month's spend and the day's differ.
    await shipped(client, clock, segment(_served(world, clock.now() - timedelta(days=1), 3000)))  # type: ignore[arg-type]
    await shipped(client, clock, segment(_served(world, clock.now() - timedelta(hours=1), 1000)))  # type: ignore[arg-type]
    month = await spend_report(client, world.org, **{"from": "2026-03-01", "to": "2026-04-01"})
    today = await spend_report(client, world.org, **{"from": "2026-03-10", "to": "2026-03-11"})
    month_nanos, today_nanos = (nanos(r["totals"]["cost_usd"]) for r in (month, today))
    assert 0 < today_nanos < month_nanos
    budgets = [
        ("org month", {"kind": "organization"}, "month", "1000"),
        ("key month", {"kind": "virtual_key", "id": world.key_id}, "month", "0.01"),
        ("team day", {"kind": "team", "id": world.team}, "day", nanos_to_usd(today_nanos // 2)),
        ("project week", {"kind": "project", "id": world.project}, "week", "5"),
        ("each end user", {"kind": "end_user"}, "month", "0.000001"),
    ]
    for name, scope, window, limit in budgets:
        body = {"organization_id": world.org, "name": name, "scope": scope, "window": window}
        await create(client, "/api/admin/budgets", {**body, "limit_usd": limit})

    await sign_in(client, ADMIN_TOKEN)
    page = await client.get("/console/")
    assert page.status_code == 200
    assert "cannot be read" not in page.text

    def row(name: str, window: str, limit: str, spent: int) -> list[str]:
        left = max(0, nanos(limit) - spent)
        return [name, window, f"${limit}", f"${nanos_to_usd(spent)}", f"${nanos_to_usd(left)}"]

    # Most used first; a budget of each end user has no one figure and is left out.
    assert _nearest(page.text) == [
        row("team day", "day", nanos_to_usd(today_nanos // 2), today_nanos),
        row("key month", "month", "0.01", month_nanos),
        row("project week", "week", "5", month_nanos),  # the week began on Monday the 9th
        row("org month", "month", "1000", month_nanos),
    ]


async def test_the_overview_answers_while_the_ledger_is_away_and_says_figures_are_missing(
    settings: ControlPlaneSettings, clean_database: Database, clock: ManualClock, world: World
) -> None:
    away = Ledger(LedgerLocation(kind="http", host="127.0.0.1", port=9, database="spend"))
    app = create_app(settings, clock=clock, database=clean_database, ledger=away)
    try:
        async with serve_in_loop(app, "http://controlplane.test") as browser:
            await sign_in(browser, ADMIN_TOKEN)
            page = await browser.get("/console/")
    finally:
        await away.close()
    assert page.status_code == 200
    assert "The spend ledger cannot be read right now; figures are missing." in page.text
    assert "Budgets nearest their limit" in page.text
