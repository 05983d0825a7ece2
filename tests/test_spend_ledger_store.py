"""The ledger store itself: VKGATE_LEDGER_URL, its migrations, chDB's one directory, pricing."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import secrets
import shutil
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from genai_prices import Usage, calc_price
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.ledger import migrate, queries, store
from controlplane.ledger.client import LedgerError, connect
from controlplane.ledger.queries import SINCE, SpendFilter
from controlplane.ledger.queries import spend as spend_query
from controlplane.ledger.rows import ADMIT_COLUMNS, LEDGER_COLUMNS, Entry, Price, PricedEntry
from controlplane.ledger.store import SINCE_TTL_S, Ledger, Written
from controlplane.settings import ControlPlaneSettings, LedgerLocation, ledger_location
from controlplane.spend.pricing import Pricer, ProviderPricing, Rates, Tokens, to_nanos
from tests.conftest import serve_in_loop
from tests.support.api import ADMIN, create, error_of
from tests.support.clock import ManualClock
from tests.support.env import secrets_env
from tests.support.ledger import request, segment, server_database, ship
from tests.support.processes import clean_env, vkgate
from vkgate import env as E
from vkgate.spend import SpendRecord

AT = datetime(2026, 3, 10, 12, tzinfo=UTC)

# --- VKGATE_LEDGER_URL --------------------------------------------------------------------------


def test_ledger_defaults_to_chdb_under_vkgate_home(tmp_path: Path) -> None:
    env = {**secrets_env("sqlite:///cp.db"), "VKGATE_HOME": str(tmp_path)}
    ledger = ControlPlaneSettings.from_env(env).ledger
    assert (ledger.kind, ledger.path, ledger.database) == ("chdb", tmp_path / "ledger", "vkgate")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("chdb:///var/lib/vkgate/ledger", {"kind": "chdb", "path": Path("/var/lib/vkgate/ledger")}),
        ("chdb://ledger", {"kind": "chdb", "path": Path("ledger")}),
        (
            "http://clickhouse:8123/spend",
            {"kind": "http", "host": "clickhouse", "port": 8123, "database": "spend"},
        ),
        ("http://clickhouse", {"port": 8123, "database": "vkgate", "secure": False}),
        ("https://ch.example.com/spend", {"port": 8443, "secure": True}),
        (
            "https://vk%40gate:p%2Fss@ch.example.com:9440/spend",
            {"username": "vk@gate", "password": "p/ss", "port": 9440},
        ),
    ],
)  # fmt: skip
def test_ledger_url_forms_are_parsed(url: str, expected: dict[str, object]) -> None:
    location = ledger_location({"VKGATE_LEDGER_URL": url}, Path(".vkgate"))
    for name, value in expected.items():
        assert getattr(location, name) == value, name


def test_ledger_password_is_kept_out_of_messages() -> None:
    location = ledger_location(
        {"VKGATE_LEDGER_URL": "https://vk:hunter2-secret@ch:8443/spend"}, Path(".")
    )
    assert "hunter2" not in location.display
    assert "hunter2" not in repr(location)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("clickhouse://ch:9000/spend", "VKGATE_LEDGER_URL must be http(s)://"),
        ("chdb://", "VKGATE_LEDGER_URL: chdb:// needs the ledger's directory"),
        ("chdb://:memory:", "VKGATE_LEDGER_URL: chdb:// needs the ledger's directory"),
        ("http://ch:8123/spend-db", "the database name must be letters, digits and _"),
        ("http://ch:8123/spend?secure=1", "VKGATE_LEDGER_URL takes no query string"),
        ("http://ch:99999/spend", "VKGATE_LEDGER_URL is malformed"),
    ],
)
def test_bad_ledger_url_is_refused_naming_the_variable(url: str, message: str) -> None:
    with pytest.raises(E.SettingError, match=re.escape(message)):
        ControlPlaneSettings.from_env({**secrets_env("sqlite:///cp.db"), "VKGATE_LEDGER_URL": url})


# --- tables and migrations ----------------------------------------------------------------------


def test_every_field_of_a_spend_record_is_a_ledger_column() -> None:
    assert set(SpendRecord.__struct_fields__) <= set(LEDGER_COLUMNS)
    assert {"cost_nano_usd", "price_source", "price_version", "ingested_at"} <= set(LEDGER_COLUMNS)
    assert {"id", "replica_id", "seq", "request_id", "at"} <= set(ADMIT_COLUMNS)


@pytest.fixture(params=["chdb", "server"])
def fresh_database(
    request: pytest.FixtureRequest, ledger_location: LedgerLocation
) -> Iterator[LedgerLocation]:
    """A database of its own in the session's chDB (a second chDB directory cannot be opened),
    or on a ClickHouse server over HTTP."""
    if request.param == "server":
        with server_database(request.getfixturevalue("clickhouse_server")) as location:
            yield location
        return
    location = dataclasses.replace(ledger_location, database=f"fresh_{secrets.token_hex(4)}")
    yield location
    client = connect(ledger_location)
    try:
        client.command(f"DROP DATABASE IF EXISTS {location.database}")
    finally:
        client.close()


def test_migrations_apply_once_in_order_and_then_nothing(fresh_database: LedgerLocation) -> None:
    assert not migrate.is_current(fresh_database)
    applied = migrate.upgrade(fresh_database)
    assert applied == [m.name for m in migrate.available()]
    assert applied[0] == "0001_ledger.sql"
    assert migrate.is_current(fresh_database)
    assert migrate.upgrade(fresh_database) == []

    client = connect(fresh_database)
    try:
        tables = {row[0] for row in client.query("SHOW TABLES").result_rows}
    finally:
        client.close()
    assert {"ledger_rows", "ledger_admits", migrate.TABLE} <= tables


def test_a_new_migration_file_is_applied_after_the_others(
    fresh_database: LedgerLocation, tmp_path: Path
) -> None:
    for path in migrate.DIRECTORY.glob("*.sql"):
        shutil.copy(path, tmp_path / path.name)
    migrate.upgrade(fresh_database, tmp_path)
    (tmp_path / "9001_extra.sql").write_text(
        "-- a test table\nCREATE TABLE IF NOT EXISTS extra (x UInt8) ENGINE = MergeTree ORDER BY x;\n"
    )
    assert not migrate.is_current(fresh_database, tmp_path)
    assert migrate.upgrade(fresh_database, tmp_path) == ["9001_extra.sql"]
    assert migrate.upgrade(fresh_database, tmp_path) == []


def test_an_applied_migration_that_changed_is_refused(
    fresh_database: LedgerLocation, tmp_path: Path
) -> None:
    (tmp_path / "0001_t.sql").write_text(
        "CREATE TABLE IF NOT EXISTS t (x UInt8) ENGINE = MergeTree ORDER BY x;"
    )
    migrate.upgrade(fresh_database, tmp_path)
    (tmp_path / "0001_t.sql").write_text(
        "CREATE TABLE IF NOT EXISTS t (x UInt16) ENGINE = MergeTree ORDER BY x;"
    )
    with pytest.raises(LedgerError, match=re.escape("0001_t.sql changed after it was applied")):
        migrate.upgrade(fresh_database, tmp_path)


def _priced(org: str, day: datetime, cost: int, **fields: str) -> PricedEntry:
    outcome = request(day + timedelta(hours=3), organization_id=org, **fields)[1]
    entry = Entry(outcome, datetime.fromisoformat(outcome.at), "seg-daily")
    return PricedEntry(entry, Price(cost, "test", "v1"))


async def test_budgets_count_every_row_once_across_the_start_of_the_daily_sums(
    fresh_database: LedgerLocation, tmp_path: Path
) -> None:
    (tmp_path / "0001").mkdir()
    shutil.copy(migrate.DIRECTORY / "0001_ledger.sql", tmp_path / "0001")
    migrate.upgrade(fresh_database, tmp_path / "0001")
    # The ledger's rows as this control plane writes them (every column), from before the
    # daily sums: the columns of later files are added by hand, and again by the upgrade.
    client = connect(fresh_database)
    try:
        for later in migrate.available()[3:]:
            for statement in later.statements:
                client.command(statement)
    finally:
        client.close()
    ledger = Ledger(fresh_database)
    org, day = f"org_{secrets.token_hex(4)}", datetime(2026, 3, 10, tzinfo=UTC)

    def summed_daily() -> int:
        client = connect(fresh_database)
        try:
            query = "SELECT sum(cost_nano_usd) FROM ledger_spend_daily WHERE organization_id = {o:String}"
            return int(client.query(query, parameters={"o": org}).result_rows[0][0])
        finally:
            client.close()

    try:
        held = [_priced(org, day, 700, virtual_key_id="vk_a") for _ in range(2)]
        await ledger.write([*held, _priced(org, day, 0)], [], AT)
        assert migrate.upgrade(fresh_database) == [m.name for m in migrate.available()[1:]]
        # Ingested after the view was made but stamped before `since` (an insert that was
        # under way): the ledger's part counts it, the sums do not.
        await ledger.write([_priced(org, day, 3, virtual_key_id="vk_a")], [], datetime.now(UTC))
        # Ingested from `since` on (a minute after the migration): the daily sums count it.
        since = datetime.now(UTC) + timedelta(seconds=61)
        await ledger.write([_priced(org, day, 50, virtual_key_id="vk_b")], [], since)
        await ledger.write([_priced(org, day + timedelta(days=1), 9)], [], since)
        await ledger.write(held, [], since)  # shipped again: the ledger knows them
        windows = [
            SpendFilter(start=day, end=day + timedelta(days=1)),
            SpendFilter(start=day, end=day + timedelta(days=1), virtual_key_id="vk_a"),
            SpendFilter(start=day + timedelta(days=1), end=day + timedelta(days=2)),
            SpendFilter(),
        ]
        assert (await ledger.spend(org, windows, AT)).nanos == (1453, 1403, 9, 1462)
        # The console's grouped read of many organizations' budgets gives the same sums.
        other = [("org_other", SpendFilter(start=day, end=day + timedelta(days=1)))]
        assert await ledger.spend_across([*((org, w) for w in windows), *other]) == (
            (1453, 1403, 9, 1462, 0)
        )
        assert summed_daily() == 59

        # The file run again, as after a failure half-way: nothing is counted twice.
        client = connect(fresh_database)
        try:
            for statement in migrate.available()[1].statements:
                client.command(statement)
        finally:
            client.close()
        assert (await ledger.spend(org, windows, AT)).nanos == (1453, 1403, 9, 1462)
    finally:
        await ledger.close()


async def test_budgets_of_many_organizations_read_together_are_each_one_read_alone(
    fresh_database: LedgerLocation,
) -> None:
    migrate.upgrade(fresh_database)
    ledger = Ledger(fresh_database)
    day = datetime(2026, 3, 10, tzinfo=UTC)
    orgs = [f"org_{secrets.token_hex(4)}" for _ in range(3)]
    priced = []
    for n, org in enumerate(orgs):
        for d in range(3):
            for k in range(3):
                fields = {
                    "virtual_key_id": f"vk_{k}",
                    "team_id": f"team_{k % 2}",
                    "project_id": f"proj_{k}",
                    "provider_id": f"prov_{d % 2}",
                    "end_user": f"user_{k}",
                }
                cost = 1_000_003 * (n + 1) + 10_007 * d + 101 * k
                priced.append(_priced(org, day + timedelta(days=d), cost, **fields))
        priced.append(_priced(org, day, 7))  # no key, team, project, provider or end user
    try:
        # Ingested from the daily sums' start on: budgets read the sums, as in service.
        await ledger.write(priced, [], datetime.now(UTC) + timedelta(seconds=61))
        kinds = [
            SpendFilter(),
            SpendFilter(start=day),
            SpendFilter(start=day, end=day + timedelta(days=1)),
            SpendFilter(start=day + timedelta(days=1), virtual_key_id="vk_1"),
            SpendFilter(start=day, virtual_key_id="vk_2", provider_id="prov_0"),
            SpendFilter(team_id="team_0"),
            SpendFilter(start=day, project_id="proj_0", end=day + timedelta(days=2)),
            SpendFilter(start=day, end_user="user_1"),
            SpendFilter(start=day, provider_id="prov_1"),
            SpendFilter(start=day, virtual_key_id="vk_none"),
        ]
        alone = []
        for org in orgs:
            alone += (await ledger.spend(org, kinds, AT)).nanos
        together = await ledger.spend_across([(org, k) for org in orgs for k in kinds])
        assert together == tuple(alone)
        assert sum(1 for n in together if n) == 27
        # A budget of an organization with no spend, among them, in any order.
        mixed = [("org_none", kinds[1]), (orgs[1], kinds[3]), (orgs[0], kinds[3])]
        assert await ledger.spend_across(mixed) == (0, alone[13], alone[3])
        with pytest.raises(ValueError, match="whole UTC days"):
            await ledger.spend_across([(orgs[0], SpendFilter(start=day + timedelta(hours=1)))])
    finally:
        await ledger.close()


async def test_a_spend_read_asked_while_the_same_one_runs_shares_it(
    fresh_database: LedgerLocation,
) -> None:
    migrate.upgrade(fresh_database)
    ledger = Ledger(fresh_database)
    org, day = f"org_{secrets.token_hex(4)}", datetime(2026, 3, 10, tzinfo=UTC)
    window = [SpendFilter(start=day, end=day + timedelta(days=1))]
    reads = 0
    read = ledger._read_spend

    async def counted(organization_id: str, filters: Sequence[SpendFilter]) -> tuple[int, ...]:
        nonlocal reads
        reads += 1
        return await read(organization_id, filters)

    ledger._read_spend = counted  # type: ignore[method-assign]
    try:
        await ledger.write([_priced(org, day, 700)], [], AT)
        first, second, other = await asyncio.gather(
            ledger.spend(org, window, AT),
            ledger.spend(org, window, AT + timedelta(seconds=1)),
            ledger.spend(org, [SpendFilter(start=day, end=day + timedelta(days=2))], AT),
        )
        assert reads == 2  # the two alike shared one; the other window read on its own
        assert first.nanos == second.nanos == other.nanos == (700,)
        # The later caller joined a read that may have begun before its moment: its reading
        # is as of the first caller's.
        assert first.as_of == second.as_of == AT

        # Once a read is over, the next is a read of its own: nothing is kept.
        await ledger.write([_priced(org, day, 50)], [], AT)
        after = await ledger.spend(org, window, AT + timedelta(seconds=2))
        assert after.nanos == (750,)
        assert after.as_of == AT + timedelta(seconds=2)
        assert reads == 3
    finally:
        await ledger.close()


async def _written_while_busy(
    ledger: Ledger, writes: Sequence[tuple[list[PricedEntry], list[Entry]]]
) -> list[Written | BaseException]:
    """`writes` asked for while the ledger's thread is busy with something else: the first
    waits for it alone, and the rest, asked while the first waits, wait for the first."""
    gate = threading.Event()
    busy = asyncio.ensure_future(ledger._run(lambda client: gate.wait(30)))
    try:
        asked = [asyncio.ensure_future(ledger.write(*writes[0], AT))]
        await asyncio.sleep(0)  # the first has its batch to itself
        asked += [asyncio.ensure_future(ledger.write(*w, AT)) for w in writes[1:]]
        await asyncio.sleep(0)
    finally:
        gate.set()
    await busy
    return await asyncio.gather(*asked, return_exceptions=True)


async def test_writes_asked_for_during_a_write_go_together_and_each_learns_its_own(
    fresh_database: LedgerLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(fresh_database)
    ledger = Ledger(fresh_database)
    org, day = f"org_{secrets.token_hex(4)}", datetime(2026, 3, 10, tzinfo=UTC)
    batches: list[int] = []
    together = store._write_together

    def counted(client: Any, batch: Sequence[Any]) -> list[Written]:
        batches.append(len(batch))
        return together(client, batch)

    monkeypatch.setattr(store, "_write_together", counted)
    lookups: list[int] = []
    stored_ids = queries.stored_ids

    def looked_up(table: str, ranges: Sequence[Any], organizations: Any = None) -> Any:
        lookups.append(len(ranges))
        return stored_ids(table, ranges, organizations)

    monkeypatch.setattr(queries, "stored_ids", looked_up)

    def admit(priced: PricedEntry) -> Entry:
        record = priced.entry.record
        admitted = msgspec.structs.replace(record, id=f"admit-{record.id}", kind="admit")
        return Entry(admitted, priced.entry.at, "seg-b")

    first, shared, second = (_priced(org, day, cost) for cost in (1, 20, 300))
    third = _priced(org, day, 4_000, replica_id="replica-b")  # another replica's
    try:
        results = await _written_while_busy(
            ledger,
            [
                ([first], []),
                ([shared, second], [admit(second)]),
                ([shared], [admit(second)]),  # both again
                ([first, third], []),  # the first again
            ],
        )
    finally:
        await ledger.close()
    assert all(isinstance(r, Written) for r in results), results
    a, b, c, d = results
    assert batches == [1, 3]
    # One lookup per table and batch, however many replicas: the first batch's rows (it has
    # no admits), then the second's rows of two replicas, and its admits.
    assert lookups == [1, 2, 1]
    assert (a.rows, a.duplicate_rows) == ([first], [])
    assert (b.rows, b.duplicate_rows, b.admits, b.duplicate_admits) == ([shared, second], [], 1, 0)
    assert (c.rows, c.duplicate_rows, c.admits, c.duplicate_admits) == ([], [shared], 0, 1)
    assert (d.rows, d.duplicate_rows) == ([third], [first])
    ledger = Ledger(fresh_database)
    try:
        [total] = (await ledger.spend(org, [SpendFilter()], AT)).nanos
    finally:
        await ledger.close()
    assert total == 4_321  # each row once


async def test_a_failed_write_fails_every_write_that_went_with_it(
    fresh_database: LedgerLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(fresh_database)
    ledger = Ledger(fresh_database)
    org, day = f"org_{secrets.token_hex(4)}", datetime(2026, 3, 10, tzinfo=UTC)

    def refused(client: Any, batch: Sequence[Any]) -> list[Written]:
        raise LedgerError("the ledger is full", cause="full")

    monkeypatch.setattr(store, "_write_together", refused)
    try:
        outcomes = await _written_while_busy(
            ledger, [([_priced(org, day, n)], []) for n in (1, 2, 3)]
        )
        assert [type(o) for o in outcomes] == [LedgerError] * 3
        # The next write is a write of its own again.
        monkeypatch.undo()
        written = await ledger.write([_priced(org, day, 7)], [], AT)
        assert len(written.rows) == 1
    finally:
        await ledger.close()


def test_a_table_changed_under_a_running_control_plane_takes_the_next_insert_as_it_is(
    fresh_database: LedgerLocation,
) -> None:
    migrate.upgrade(fresh_database)
    client = connect(fresh_database)
    try:
        client.command("CREATE TABLE scratch (id String, n UInt32) ENGINE = MergeTree ORDER BY id")
        store._insert(client, "scratch", ("id", "n"), [["a", 1], ["b", 2]])
        client.command("ALTER TABLE scratch MODIFY COLUMN n String")
        store._insert(client, "scratch", ("id", "n"), [["c", "three"]])
        rows = client.query("SELECT id, n FROM scratch ORDER BY id").result_rows
        assert rows == [("a", "1"), ("b", "2"), ("c", "three")]
    finally:
        client.close()


async def test_a_row_holds_every_value_of_its_record_as_the_proxy_wrote_it(
    fresh_database: LedgerLocation,
) -> None:
    migrate.upgrade(fresh_database)
    ledger = Ledger(fresh_database)
    org, day = f"org_{secrets.token_hex(4)}", datetime(2026, 3, 10, tzinfo=UTC)
    priced = _priced(org, day, 2**62, end_user='a "quoted", \\ back-slashed\nline \u00e9\U0001f600')
    record = msgspec.structs.replace(
        priced.entry.record,
        input_tokens=2**53 - 1,
        cache_read_tokens=2**52,
        reasoning_tokens=7,
        latency_ms=0.125,
        ttfb_ms=None,
        team_id=None,
        error_code=None,
        refused=True,
        stream=True,
        policy_rule="no-gpt4",
        guardrails={"pii": "redacted", "secrets": "passed"},
    )
    priced = PricedEntry(Entry(record, priced.entry.at, "seg-values"), priced.price)
    admitted = msgspec.structs.replace(record, id=f"admit-{secrets.token_hex(4)}", kind="admit")
    admit = Entry(admitted, priced.entry.at, "seg-values")
    try:
        written = await ledger.write([priced], [admit], AT)
    finally:
        await ledger.close()
    assert (len(written.rows), written.admits) == (1, 1)
    client = connect(fresh_database)
    try:
        (stored,) = client.query(f"SELECT * FROM {store.LEDGER_TABLE}").named_results()
        (stored_admit,) = client.query(f"SELECT * FROM {store.ADMIT_TABLE}").named_results()
    finally:
        client.close()
    assert stored_admit == {
        name: getattr(admitted, name) for name in ADMIT_COLUMNS if hasattr(admitted, name)
    } | {"at": priced.entry.at, "segment_id": "seg-values", "ingested_at": AT}
    expected = {name: getattr(record, name) for name in LEDGER_COLUMNS if hasattr(record, name)}
    expected |= {
        "at": priced.entry.at,
        "segment_id": "seg-values",
        "cost_nano_usd": 2**62,
        "price_source": "test",
        "price_version": "v1",
        "ingested_at": AT,
    }
    assert stored == expected


async def test_a_row_keeps_its_ingestion_time_to_the_microsecond(
    fresh_database: LedgerLocation,
) -> None:
    migrate.upgrade(fresh_database)
    ledger = Ledger(fresh_database)
    org, day = f"org_{secrets.token_hex(4)}", datetime(2026, 3, 10, tzinfo=UTC)
    priced = _priced(org, day, 5)
    admit = Entry(
        msgspec.structs.replace(
            priced.entry.record, id=f"admit-{secrets.token_hex(4)}", kind="admit"
        ),
        priced.entry.at,
        "seg-a",
    )
    ingested_at = datetime(2026, 3, 10, 16, 30, 1, 123456, tzinfo=timezone(timedelta(hours=2)))
    try:
        await ledger.write([priced], [admit], ingested_at)
    finally:
        await ledger.close()
    client = connect(fresh_database)
    try:
        stored = [
            client.query(f"SELECT ingested_at FROM {table}").result_rows
            for table in (store.LEDGER_TABLE, store.ADMIT_TABLE)
        ]
    finally:
        client.close()
    assert stored == [[(ingested_at,)], [(ingested_at,)]]


def test_a_first_day_spend_read_skips_the_rows_ingested_after_the_sums_began(
    fresh_database: LedgerLocation,
) -> None:
    migrate.upgrade(fresh_database)
    org, day = f"org_{secrets.token_hex(4)}", datetime(2026, 3, 10, tzinfo=UTC)
    later = 40_000  # five granules of 8,192 rows

    def insert(client: Any, rows: int, at: str, ingested_at: str, cost: int) -> None:
        client.command(
            "INSERT INTO ledger_rows (id, kind, replica_id, seq, segment_id, request_id, at, "
            "route, organization_id, status, usage_source, latency_ms, cost_nano_usd, "
            "price_source, price_version, ingested_at) "
            "SELECT toString(generateUUIDv4()), 'confirm', 'r', number + 1, 's', "
            f"toString(number), {at}, '/v1/chat/completions', {{org:String}}, 200, 'provider', "
            f"1.0, {cost}, 'test', 'v1', {ingested_at} FROM numbers({rows})",
            parameters={"org": org},
        )

    client = connect(fresh_database)
    try:
        # Ingested in the minute before the daily sums began: only the ledger's part counts it.
        insert(client, 1, "toDateTime64('2026-03-10 01:00:00', 6, 'UTC')", "now64(6)", 5)
        # A first day's rows, ingested after: the daily sums count them.
        insert(
            client,
            later,
            "toDateTime64('2026-03-10 02:00:00', 6, 'UTC') + toIntervalMillisecond(number)",
            f"{SINCE} + toIntervalSecond(1)",
            1,
        )
        read = spend_query(org, [SpendFilter(start=day, end=day + timedelta(days=1))])
        # With the index a granule at most of the later rows is read; without it, every one.
        bounded = f" SETTINGS max_rows_to_read = {later // 2}, read_overflow_mode = 'throw'"
        indexed = client.query(read.sql + bounded, parameters=read.parameters)
        assert indexed.result_rows[0][0] == 5 + later
        with pytest.raises(Exception, match="TOO_MANY_ROWS"):
            client.query(read.sql + bounded + ", use_skip_indexes = 0", parameters=read.parameters)

        # The file run again, as after a failure half-way: nothing changes.
        for statement in migrate.available()[2].statements:
            client.command(statement)
        again = client.query(read.sql, parameters=read.parameters)
        assert again.result_rows == indexed.result_rows
    finally:
        client.close()


async def test_windows_a_day_past_the_start_of_the_daily_sums_are_read_from_them_alone(
    fresh_database: LedgerLocation,
) -> None:
    migrate.upgrade(fresh_database)
    now = 0.0
    ledger = Ledger(fresh_database, monotonic=lambda: now)
    org, day = f"org_{secrets.token_hex(4)}", datetime(2026, 3, 10, tzinfo=UTC)
    window = [SpendFilter(start=day, end=day + timedelta(days=1))]
    client = connect(fresh_database)

    def sums_began(moment: str) -> None:
        client.command("TRUNCATE TABLE ledger_spend_daily_since")
        client.command(f"INSERT INTO ledger_spend_daily_since VALUES ('{moment}')")

    def ledger_rows_aside(aside: bool) -> None:
        names = ("ledger_rows", "ledger_rows_aside")
        client.command("RENAME TABLE {} TO {}".format(*(names if aside else names[::-1])))

    try:
        sums_began("2026-03-01 00:00:00")
        await ledger.write([_priced(org, day, 700), _priced(org, day, 50)], [], AT)
        ledger_rows_aside(True)
        # Nothing of the window can be in the ledger's own part: it is not read at all.
        assert (await ledger.spend(org, window, AT)).nanos == (750,)

        # The sums made anew, later (a ledger created again): the reading of when they began
        # is used until it is due to be read again, then the window needs the ledger's part.
        sums_began("2026-03-10 00:00:00")
        now = SINCE_TTL_S - 1
        assert (await ledger.spend(org, window, AT)).nanos == (750,)
        now = SINCE_TTL_S
        with pytest.raises(LedgerError, match="ledger_rows"):
            await ledger.spend(org, window, AT)
        ledger_rows_aside(False)
        assert (await ledger.spend(org, window, AT)).nanos == (750,)
    finally:
        client.close()
        await ledger.close()


def test_a_spend_read_leaves_the_ledger_rows_out_only_a_day_after_the_sums_began() -> None:
    since = datetime(2026, 3, 1, 12, tzinfo=UTC)
    day = datetime(2026, 3, 2, tzinfo=UTC)
    filters = [SpendFilter(start=day, end=day + timedelta(days=1))]
    assert "ledger_rows" in spend_query("org", filters).sql  # not known
    assert "ledger_rows" in spend_query("org", filters, since).sql  # 12 h after
    assert "ledger_rows" not in spend_query("org", filters, since - timedelta(hours=12)).sql
    # A window with no start reaches back before the sums.
    assert "ledger_rows" in spend_query("org", [SpendFilter()], since - timedelta(days=9)).sql


def test_a_budget_window_not_of_whole_days_is_refused() -> None:
    with pytest.raises(ValueError, match="whole UTC days"):
        spend_query("org", [SpendFilter(start=AT)])


def test_a_migration_file_badly_named_is_refused(tmp_path: Path) -> None:
    (tmp_path / "add-things.sql").write_text("SELECT 1;")
    with pytest.raises(LedgerError, match=re.escape("NNNN_lowercase_name.sql")):
        migrate.available(tmp_path)


def test_statements_are_split_and_comments_dropped() -> None:
    text = "-- heading; with a semicolon\nCREATE TABLE a (x UInt8);\n\n  -- more\nSELECT 1;\n"
    assert migrate.statements_of(text) == ("CREATE TABLE a (x UInt8)", "SELECT 1")


def test_a_second_chdb_directory_in_one_process_is_refused_by_name(
    ledger_location: LedgerLocation, tmp_path: Path
) -> None:
    other = LedgerLocation(kind="chdb", path=tmp_path / "other-ledger")
    with pytest.raises(LedgerError, match="one ledger directory per process"):
        connect(other)


def test_vkgate_migrate_creates_the_ledger_and_a_second_run_changes_nothing(
    tmp_path: Path,
) -> None:
    env = clean_env(VKGATE_HOME=str(tmp_path))
    first = vkgate("migrate", env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "applied 0001_ledger.sql" in first.stdout
    assert (tmp_path / "ledger").is_dir()
    second = vkgate("migrate", env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "migrations applied" in second.stdout
    assert "0001_ledger.sql" not in second.stdout


def test_controlplane_refuses_a_ledger_that_was_never_migrated(tmp_path: Path) -> None:
    env = clean_env(
        **secrets_env(f"sqlite:///{tmp_path / 'cp.db'}"),
        VKGATE_HOME=str(tmp_path),
        VKGATE_LEDGER_URL=f"chdb://{tmp_path / 'elsewhere'}",
    )
    migrated = vkgate("migrate", env={**env, "VKGATE_LEDGER_URL": f"chdb://{tmp_path / 'ledger'}"})
    assert migrated.returncode == 0, migrated.stderr
    refused = vkgate("controlplane", env=env, cwd=tmp_path)
    assert refused.returncode == 1
    assert "spend ledger (VKGATE_LEDGER_URL) is not at the newest schema" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "elsewhere").exists(), "checking a ledger must not create one"


def test_an_unreachable_ledger_server_is_a_message_naming_the_variable(tmp_path: Path) -> None:
    env = clean_env(VKGATE_HOME=str(tmp_path), VKGATE_LEDGER_URL="http://127.0.0.1:9/spend")
    result = vkgate("migrate", env=env, cwd=tmp_path)
    assert result.returncode == 1
    assert "VKGATE_LEDGER_URL" in result.stderr
    assert "Traceback" not in result.stderr


# --- pricing ------------------------------------------------------------------------------------


def outcome(**fields: object) -> SpendRecord:
    values: dict[str, object] = {"input_tokens": 1000, "output_tokens": 100}
    values.update(fields)
    return SpendRecord(
        id="r", kind="confirm", replica_id="p", seq=1, request_id="q", at="", route="/", **values
    )  # type: ignore[arg-type]


def exact(usd: Decimal) -> int:
    return int((usd * 10**9).quantize(Decimal(1), rounding=ROUND_HALF_UP))


@pytest.mark.parametrize(
    ("usd", "nanos"),
    [
        (Decimal("0.0000000005"), 1),  # half a nano-dollar rounds up
        (Decimal("0.0000000004999"), 0),
        (Decimal("0.0000000015"), 2),
        (Decimal("0.0000000025"), 3),  # not to even: halves always go up
        (Decimal("12.3456789014"), 12_345_678_901),
        (Decimal(0), 0),
    ],
)
def test_a_price_rounds_once_to_the_nearest_nano_dollar_halves_up(usd: Decimal, nanos: int) -> None:
    assert to_nanos(usd) == nanos


# Up to a million USD a token and a billion tokens of each kind: every exact price stays
# within the 28 digits `to_nanos`'s rounding works in.
_RATE = st.builds(
    lambda digits, exponent: Decimal(digits).scaleb(exponent),
    st.integers(min_value=0, max_value=10**12),
    st.integers(min_value=-24, max_value=-6),
)
_COUNT = st.integers(min_value=0, max_value=10**9)


@settings(max_examples=300, deadline=None)
@given(rates=st.tuples(_RATE, _RATE, _RATE, _RATE), counts=st.tuples(_COUNT, _COUNT, _COUNT))
def test_a_price_in_integers_is_the_decimal_price_to_the_nano_dollar(
    rates: tuple[Decimal, Decimal, Decimal, Decimal], counts: tuple[int, int, int]
) -> None:
    uncached, output, cache_read = counts
    cache_write = cache_read // 3
    tokens = Tokens(uncached + cache_read + cache_write, output, cache_read, cache_write)
    priced = Rates(*rates)
    assert priced.nanos(tokens) == to_nanos(priced.usd(tokens))


@pytest.mark.parametrize(
    ("rate", "tokens", "nanos"),
    [
        ("0.0000000005", 1, 1),  # half a nano-dollar: up
        ("0.0000000005", 3, 2),  # one and a half: up, not to even
        ("0.00000000049999", 1, 0),
        ("0.15", 7, 1_050_000_000),
        ("2", 3, 6_000_000_000),  # a rate with no places at all
        ("-0.0000000015", 1, -2),  # halves away from zero both ways, as `to_nanos`
        ("1." + "0" * 90 + "5", 1, 1_000_000_000),  # more digits than EXACT keeps
    ],
)
def test_a_price_in_integers_rounds_as_to_nanos(rate: str, tokens: int, nanos: int) -> None:
    rates = Rates(Decimal(rate), Decimal(0), Decimal(0), Decimal(0))
    assert rates.nanos(Tokens(tokens, 0, 0, 0)) == nanos


@pytest.mark.parametrize(
    ("kind", "model", "genai_provider", "at"),
    [
        ("openai", "gpt-4o-mini-2024-07-18", "openai", AT),
        ("openai", "o3", "openai", AT),
        ("azure_openai", "gpt-4o", "azure", AT),
        ("anthropic", "claude-3-5-sonnet-20241022", "anthropic", AT),
        # Tiered: the whole request's rate changes past 200k input tokens.
        ("openai_compatible", "gemini-2.5-pro", None, AT),
        # Off-peak hours are cheaper: the record's own time picks the rate.
        ("openai_compatible", "deepseek-chat", None, AT.replace(hour=17)),
        ("openai_compatible", "deepseek-chat", None, AT.replace(hour=3)),
    ],
)
def test_pricer_agrees_with_calc_price_to_the_nano_dollar(
    kind: str, model: str, genai_provider: str | None, at: datetime
) -> None:
    pricer = Pricer()
    for i, (tokens_in, cached, written, out) in enumerate(
        [(1_000, 0, 0, 100), (250_000, 20_000, 5_000, 9_999), (7, 3, 1, 1), (123_457, 0, 0, 0)]
    ):
        record = outcome(
            served_model=model,
            provider_kind=kind,
            input_tokens=tokens_in,
            cache_read_tokens=cached,
            cache_write_tokens=written,
            output_tokens=out,
        )
        when = at + timedelta(seconds=i)
        want = calc_price(
            Usage(
                input_tokens=tokens_in,
                output_tokens=out,
                cache_read_tokens=cached,
                cache_write_tokens=written,
            ),
            model_ref=model,
            provider_id=genai_provider,
            genai_request_timestamp=when,
        )
        price = pricer.price(record, when, None)
        assert price.cost_nano_usd == exact(want.total_price), (model, tokens_in)
        assert price.source == "genai-prices"


def test_pricer_prefers_an_override_of_the_upstream_model_then_of_the_served_one() -> None:
    pricer = Pricer()
    provider = ProviderPricing(
        kind="openai",
        overrides={
            "gpt-4o-mini": {"input_per_mtok": "1", "output_per_mtok": "2"},
            "gpt-4o-mini-2024-07-18": {"input_per_mtok": "10", "output_per_mtok": "20"},
        },
        version="2026-03-01T00:00:00Z",
    )
    by_upstream = outcome(upstream_model="gpt-4o-mini", served_model="gpt-4o-mini-2024-07-18")
    by_served = outcome(served_model="gpt-4o-mini-2024-07-18")
    assert (
        pricer.price(by_upstream, AT, provider).cost_nano_usd == 1_200_000
    )  # 1000 at $1/M + 100 at $2/M
    assert pricer.price(by_served, AT, provider).cost_nano_usd == 12_000_000
    assert pricer.price(by_served, AT, provider).version == "2026-03-01T00:00:00Z"


def test_pricer_takes_the_provider_kind_from_its_row_over_the_record() -> None:
    mock = ProviderPricing(kind="mock", overrides={}, version="")
    price = Pricer().price(outcome(provider_kind="openai", served_model="gpt-4o"), AT, mock)
    assert (price.cost_nano_usd, price.source) == (0, "mock")


# --- the app and its ledger ---------------------------------------------------------------------


async def test_an_app_that_never_touches_spend_never_opens_its_ledger(
    settings: ControlPlaneSettings, tmp_path: Path
) -> None:
    elsewhere = LedgerLocation(kind="chdb", path=tmp_path / "never-opened")
    app = create_app(dataclasses.replace(settings, ledger=elsewhere))
    async with serve_in_loop(app, "http://cp.test") as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/api/admin/organizations", headers=ADMIN)).status_code == 200
    assert not elsewhere.path or not elsewhere.path.exists()


async def test_a_ledger_outage_leaves_the_segment_unacknowledged(
    settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> None:
    down = LedgerLocation(kind="http", host="127.0.0.1", port=9, database="spend")
    ledger = Ledger(down)
    app = create_app(settings, clock=clock, database=clean_database, ledger=ledger)
    try:
        async with serve_in_loop(app, "http://cp.test") as http:
            org = (await create(http, "/api/admin/organizations", {"name": "o"}))["id"]
            response = await ship(http, clock, segment(request(clock.now(), organization_id=org)))
            report = await http.get(
                "/api/spend/report", params={"organization_id": org}, headers=ADMIN
            )
    finally:
        await ledger.close()
    error = error_of(response, 503, "store_unavailable")
    assert "spend ledger is unavailable" in error["message"]
    assert "127.0.0.1:9" in error["message"]
    error_of(report, 503, "store_unavailable")
