"""The spend ledger in tests: one embedded chDB per test session, and spend records to ship.

chDB is an embedded engine with process-wide state: a process can have one ledger directory
open at a time, so the whole session shares one (tests keep apart by their organizations'
random ids). The server path (HTTP) runs against the ClickHouse server
VKGATE_TEST_CLICKHOUSE_URL names, or else against chDB behind ClickHouse's HTTP interface.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import os
import secrets
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec

from controlplane.ledger.client import connect
from controlplane.ledger.migrate import upgrade
from controlplane.settings import LedgerLocation, ledger_location
from tests.support import clickhouse_http
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from tests.support.env import INTERNAL_SECRET
from vkgate import signing
from vkgate.clock import rfc3339
from vkgate.money import usd_to_nanos
from vkgate.spend import SpendAck, SpendRecord, SpendSegment
from vkgate.wire import INTERNAL_PREFIX

SPEND_COMMANDS = f"{INTERNAL_PREFIX}/spend-commands"
CLICKHOUSE_URL_VARIABLE = "VKGATE_TEST_CLICKHOUSE_URL"
_seq = itertools.count(1)


@contextmanager
def embedded_ledger(directory: Path) -> Iterator[LedgerLocation]:
    """The session's chDB ledger, migrated, with one client held open throughout so the
    engine is not shut down and restarted each time a test's app closes its own."""
    location = LedgerLocation(kind="chdb", path=directory)
    upgrade(location)
    keeper = connect(location)
    summed_from_the_start(keeper)
    try:
        yield location
    finally:
        keeper.close()


@contextmanager
def ledger_server() -> Iterator[LedgerLocation]:
    """The ClickHouse server VKGATE_TEST_CLICKHOUSE_URL names, else chDB behind ClickHouse's
    HTTP interface in a process of its own (tests/support/clickhouse_http.py)."""
    url = os.environ.get(CLICKHOUSE_URL_VARIABLE)
    if url:
        yield ledger_location({"VKGATE_LEDGER_URL": url}, Path("."))
        return
    with (
        tempfile.TemporaryDirectory(prefix="vkgate-ch-") as directory,
        clickhouse_http.running(Path(directory)) as url,
    ):
        yield ledger_location({"VKGATE_LEDGER_URL": url}, Path("."))


@contextmanager
def server_database(server: LedgerLocation) -> Iterator[LedgerLocation]:
    """A database of its own on `server` (not made yet: migrating makes it), dropped after."""
    location = dataclasses.replace(server, database=f"vkgate_test_{secrets.token_hex(6)}")
    try:
        yield location
    finally:
        admin = connect(server, create_database=True)
        try:
            admin.command(f"DROP DATABASE IF EXISTS {location.database}")
        finally:
            admin.close()


def summed_from_the_start(client: Any) -> None:
    """Budgets' and the overview's daily sums as in a ledger migrated long ago: every row the
    tests write reaches them (a migration that just ran sends a minute of rows to the ledger's
    own part)."""
    for table in ("ledger_spend_daily_since", "ledger_usage_daily_since"):
        client.command(f"TRUNCATE TABLE {table}")
        client.command(f"INSERT INTO {table} VALUES ('2000-01-01 00:00:00')")


def record(
    kind: str = "confirm",
    *,
    at: datetime,
    replica_id: str = "replica-a",
    request_id: str | None = None,
    **fields: Any,
) -> SpendRecord:
    """A record as a proxy writes it; `fields` fill the rest (organization_id, tokens, …)."""
    values: dict[str, Any] = {"route": "/v1/chat/completions", "usage_source": "provider"}
    if kind == "confirm":
        values["status"] = 200
    values.update(fields)
    return SpendRecord(
        id=uuid.uuid4().hex,
        kind=kind,
        replica_id=replica_id,
        seq=next(_seq),
        request_id=request_id or f"req-{uuid.uuid4().hex[:12]}",
        at=rfc3339(at),
        **values,
    )


def request(at: datetime, **fields: Any) -> list[SpendRecord]:
    """An admit and its outcome, a millisecond apart, as one served request leaves them."""
    admit = record("admit", at=at, route=fields.get("route", "/v1/chat/completions"))
    outcome = record(
        fields.pop("kind", "confirm"),
        at=at + timedelta(milliseconds=1),
        request_id=admit.request_id,
        **fields,
    )
    return [admit, outcome]


def segment(records: list[SpendRecord], segment_id: str | None = None) -> SpendSegment:
    return SpendSegment(
        replica_id=records[0].replica_id if records else "replica-a",
        segment_id=segment_id or f"seg-{uuid.uuid4().hex[:12]}",
        records=records,
    )


async def ship(
    client: httpx.AsyncClient,
    clock: ManualClock,
    body: SpendSegment | bytes,
    *,
    encoding: str | None = None,
) -> httpx.Response:
    """POST a segment to spend-commands, signed as a proxy signs it; with `encoding`, the
    body (already in that coding when given as bytes, gzipped here when a segment) is sent
    with that `Content-Encoding`."""
    raw = body if isinstance(body, bytes) else msgspec.json.encode(body)
    headers = {"content-type": "application/json"}
    if encoding is not None:
        headers["content-encoding"] = encoding
        if not isinstance(body, bytes):
            raw = gzip.compress(raw)
    signed = signing.signed_headers(INTERNAL_SECRET, "POST", SPEND_COMMANDS, raw, clock.time())
    return await client.post(SPEND_COMMANDS, content=raw, headers={**signed, **headers})


async def shipped(client: httpx.AsyncClient, clock: ManualClock, body: SpendSegment) -> SpendAck:
    """Ship a segment that must be acknowledged; its acknowledgement."""
    response = await ship(client, clock, body)
    assert response.status_code == 200, response.text
    return msgspec.json.decode(response.content, type=SpendAck)


async def ledger_rows(
    client: httpx.AsyncClient, org: str, *, headers: dict[str, str] = ADMIN, **params: str
) -> list[dict[str, Any]]:
    """Every ledger row of the organization, walked page by page (`limit` as given)."""
    rows: list[dict[str, Any]] = []
    query = {"organization_id": org, "limit": "1000", **params}
    while True:
        response = await client.get("/api/spend/ledger", params=query, headers=headers)
        assert response.status_code == 200, response.text
        body = response.json()
        rows.extend(body["data"])
        if body["next_cursor"] is None:
            return rows
        query["cursor"] = body["next_cursor"]


async def spend_report(
    client: httpx.AsyncClient, org: str, *, headers: dict[str, str] = ADMIN, **params: str
) -> dict[str, Any]:
    response = await client.get(
        "/api/spend/report", params={"organization_id": org, **params}, headers=headers
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def nanos(usd: str) -> int:
    return usd_to_nanos(usd)
