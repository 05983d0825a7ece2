"""The same ledger on a ClickHouse server over HTTP (set VKGATE_TEST_CLICKHOUSE_URL to run)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.ledger import migrate
from controlplane.ledger.store import Ledger
from controlplane.settings import ControlPlaneSettings, LedgerLocation
from tests.conftest import serve_in_loop
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.ledger import (
    CLICKHOUSE_URL_VARIABLE,
    ledger_rows,
    request,
    segment,
    server_ledger,
    shipped,
    spend_report,
)


@pytest.fixture(scope="module")
def server() -> Iterator[LedgerLocation]:
    with server_ledger() as location:
        if location is None:
            pytest.skip(f"{CLICKHOUSE_URL_VARIABLE} names no ClickHouse server")
        yield location


@pytest.fixture
async def on_server(
    server: LedgerLocation,
    settings: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
) -> AsyncIterator[httpx.AsyncClient]:
    ledger = Ledger(server)
    app = create_app(settings, clock=clock, database=clean_database, ledger=ledger)
    try:
        async with serve_in_loop(app, "http://cp.test") as http:
            yield http
    finally:
        await ledger.close()


def test_server_ledger_is_migrated_once(server: LedgerLocation) -> None:
    assert migrate.is_current(server)
    assert migrate.upgrade(server) == []


async def test_server_ledger_ingests_idempotently_and_reports(
    on_server: httpx.AsyncClient, clock: ManualClock
) -> None:
    org = (await create(on_server, "/api/admin/organizations", {"name": "ch"}))["id"]
    records = [
        r
        for i in range(20)
        for r in request(
            clock.now(),
            organization_id=org,
            model="m",
            served_model="gpt-4o-mini",
            provider_kind="openai",
            input_tokens=100 + i,
            output_tokens=10,
        )
    ]
    seg = segment(records)
    first = await shipped(on_server, clock, seg)
    again = await shipped(on_server, clock, seg)
    assert (first.accepted, again.accepted, again.duplicates) == (40, 0, 40)

    rows = await ledger_rows(on_server, org, limit="6")
    report = await spend_report(on_server, org, group_by="model,day")
    assert len(rows) == 20
    assert report["totals"]["requests"] == 20
    assert report["totals"]["input_tokens"] == sum(100 + i for i in range(20))
