"""The same ledger on a ClickHouse server over HTTP: the one VKGATE_TEST_CLICKHOUSE_URL names,
or else chDB behind ClickHouse's HTTP interface (tests/support/clickhouse_http.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.ledger import migrate, queries
from controlplane.ledger.client import LedgerError, connect
from controlplane.ledger.store import Ledger
from controlplane.settings import ControlPlaneSettings, LedgerLocation
from tests.conftest import serve_in_loop
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.ledger import (
    ledger_rows,
    request,
    segment,
    server_database,
    shipped,
    spend_report,
    summed_from_the_start,
)


@pytest.fixture(scope="module")
def server(clickhouse_server: LedgerLocation) -> Iterator[LedgerLocation]:
    with server_database(clickhouse_server) as location:
        migrate.upgrade(location)
        client = connect(location)
        try:
            summed_from_the_start(client)
        finally:
            client.close()
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


async def test_a_statement_the_server_refuses_is_a_ledger_error_with_its_message(
    clickhouse_server: LedgerLocation,
) -> None:
    with server_database(clickhouse_server) as location:
        connect(location, create_database=True).close()  # a database, never migrated
        ledger = Ledger(location)
        try:
            with pytest.raises(LedgerError) as refused:
                await ledger.report(queries.Period("org_none"), [])
        finally:
            await ledger.close()
    assert str(refused.value).startswith(f"the ledger at {location.display} failed: ")
    assert "Code: 60" in str(refused.value)
    assert "ledger_rows" in str(refused.value)
    assert refused.value.cause == "DatabaseError"
