"""The overview's figures: daily sums for what was ingested after they began, the ledger's
own rows for what came before, together equal to the report of the same month."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from controlplane.ledger.client import connect
from controlplane.settings import LedgerLocation
from tests.conftest import World
from tests.console.support import sign_in
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.ledger import request, segment, shipped, spend_report, summed_from_the_start

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
    cells = [c.split("</td>")[0].strip() for c in row.split('<td class="num">')[1:]]
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
