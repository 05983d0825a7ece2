"""`POST spend-commands`: a proxy's spool segment becomes priced, idempotent ledger rows."""

from __future__ import annotations

import dataclasses
import gzip
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import genai_prices
import httpx
import msgspec
import pytest
from genai_prices import Usage, calc_price
from litestar import Litestar

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.settings import ControlPlaneSettings
from controlplane.spend import routes as spend_routes
from tests.conftest import Internal, World, serve_in_loop
from tests.support.api import ADMIN, create, error_of
from tests.support.clock import ManualClock
from tests.support.ledger import (
    SPEND_COMMANDS,
    ledger_rows,
    record,
    request,
    segment,
    ship,
    shipped,
    spend_report,
)
from vkgate.money import nanos_to_usd
from vkgate.spend import SpendRecord
from vkgate.wire import SPEND_MOVED

Client = httpx.AsyncClient
SERVED = "gpt-4o-mini-2024-07-18"


def genai_nanos(record: SpendRecord, provider_id: str | None = "openai") -> int:
    """What genai-prices itself says the record costs, rounded as the ledger documents."""
    from datetime import datetime

    price = calc_price(
        Usage(
            input_tokens=record.input_tokens,
            output_tokens=record.output_tokens,
            cache_read_tokens=record.cache_read_tokens,
            cache_write_tokens=record.cache_write_tokens,
        ),
        model_ref=record.served_model or "",
        provider_id=provider_id,
        genai_request_timestamp=datetime.fromisoformat(record.at),
    )
    return int((price.total_price * 10**9).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def served(world: World, clock: ManualClock, **fields: Any) -> list[SpendRecord]:
    """A request the world's key made and its OpenAI provider served."""
    values: dict[str, Any] = {
        "organization_id": world.org,
        "team_id": world.team,
        "project_id": world.project,
        "virtual_key_id": world.key_id,
        "model": "fast",
        "upstream_model": "gpt-4o-mini",
        "served_model": SERVED,
        "provider_id": world.provider,
        "provider_kind": "openai",
        "input_tokens": 1200,
        "cache_read_tokens": 200,
        "output_tokens": 300,
        "attempts": 1,
        "latency_ms": 812.5,
        "ttfb_ms": 95.25,
    }
    values.update(fields)
    return request(clock.now() - timedelta(minutes=5), **values)


async def add_provider(client: Client, org: str, name: str, kind: str, **fields: Any) -> str:
    body = {"organization_id": org, "name": name, "kind": kind, **fields}
    return str((await create(client, "/api/admin/providers", body))["id"])


# --- pricing ------------------------------------------------------------------------------------


async def test_served_request_is_priced_as_genai_prices_prices_it(
    client: Client, world: World, clock: ManualClock
) -> None:
    records = served(world, clock)
    ack = await shipped(client, clock, segment(records))
    assert (ack.accepted, ack.duplicates) == (2, 0)

    (row,) = await ledger_rows(client, world.org)
    outcome = records[1]
    assert row["cost_usd"] == nanos_to_usd(genai_nanos(outcome))
    assert row["cost_usd"] != "0"
    assert row["price_source"] == "genai-prices"
    assert row["price_version"] == genai_prices.__version__


async def test_ledger_row_keeps_every_field_of_the_record(
    client: Client, world: World, clock: ManualClock
) -> None:
    records = served(world, clock, end_user="alice", stream=True, reasoning_tokens=40)
    seg = segment(records)
    await shipped(client, clock, seg)

    (row,) = await ledger_rows(client, world.org)
    for field in SpendRecord.__struct_fields__:
        if field == "audio_seconds":
            # An exact decimal in the ledger, to the millisecond.
            assert Decimal(row[field]) == Decimal(str(records[1].audio_seconds))
            continue
        if field == "saved_nano_usd":
            # Money leaves as decimal USD, as the cost does.
            assert Decimal(row["saved_usd"]) == Decimal(records[1].saved_nano_usd) / 10**9
            continue
        assert row[field] == getattr(records[1], field), field
    assert row["segment_id"] == seg.segment_id
    assert row["ingested_at"] == "2026-03-10T12:00:00Z"


async def test_provider_override_wins_over_genai_prices(
    client: Client, world: World, clock: ManualClock
) -> None:
    response = await client.patch(
        f"/api/admin/providers/{world.provider}",
        json={
            "price_overrides": {
                "gpt-4o-mini": {
                    "input_per_mtok": "0.1",
                    "output_per_mtok": "0.4",
                    "cache_read_per_mtok": "0.05",
                }
            }
        },
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    await shipped(client, clock, segment(served(world, clock)))

    (row,) = await ledger_rows(client, world.org)
    # 1000 uncached input at 0.1, 200 cache reads at 0.05, 300 output at 0.4, per million
    assert row["cost_usd"] == "0.00023"
    assert row["price_source"] == "override"
    assert row["price_version"] == response.json()["updated_at"]


async def test_override_without_cache_rates_prices_cached_input_at_the_input_rate(
    client: Client, world: World, clock: ManualClock
) -> None:
    vllm = await add_provider(
        client,
        world.org,
        "vllm",
        "openai_compatible",
        base_url="http://vllm.internal/v1",
        price_overrides={"llama-3.1-8b": {"input_per_mtok": "2", "output_per_mtok": "3"}},
    )
    records = served(
        world,
        clock,
        provider_id=vllm,
        provider_kind="openai_compatible",
        upstream_model=None,
        served_model="llama-3.1-8b",
        input_tokens=1000,
        cache_read_tokens=100,
        cache_write_tokens=50,
        output_tokens=10,
    )
    await shipped(client, clock, segment(records))
    (row,) = await ledger_rows(client, world.org)
    assert row["cost_usd"] == "0.00203"  # (1000 * 2 + 10 * 3) / 1e6
    assert row["price_source"] == "override"


async def test_unknown_model_is_written_at_zero_as_unpriced(
    client: Client, world: World, clock: ManualClock
) -> None:
    vllm = await add_provider(
        client, world.org, "vllm", "openai_compatible", base_url="http://vllm.internal/v1"
    )
    records = served(
        world,
        clock,
        provider_id=vllm,
        provider_kind="openai_compatible",
        upstream_model="acme-internal-llm",
        served_model="acme-internal-llm",
    )
    ack = await shipped(client, clock, segment(records))
    assert ack.accepted == 2

    (row,) = await ledger_rows(client, world.org)
    assert (row["cost_usd"], row["price_source"]) == ("0", "unpriced")
    assert row["price_version"] == genai_prices.__version__
    assert row["input_tokens"] == 1200
    report = await spend_report(client, world.org, group_by="served_model")
    assert report["rows"][0]["served_model"] == "acme-internal-llm"
    assert report["rows"][0]["requests"] == 1


async def test_mock_provider_costs_nothing(
    client: Client, world: World, clock: ManualClock
) -> None:
    mock = await add_provider(client, world.org, "offline", "mock")
    records = served(world, clock, provider_id=mock, provider_kind="mock", served_model="gpt-4o")
    await shipped(client, clock, segment(records))
    (row,) = await ledger_rows(client, world.org)
    assert (row["cost_usd"], row["price_source"]) == ("0", "mock")


async def test_mock_provider_with_price_overrides_is_priced_by_them(
    client: Client, world: World, clock: ManualClock
) -> None:
    prices = {"mock-chat": {"input_per_mtok": "0.15", "output_per_mtok": "0.6"}}
    mock = await add_provider(client, world.org, "demo", "mock", price_overrides=prices)
    records = served(
        world,
        clock,
        provider_id=mock,
        provider_kind="mock",
        upstream_model="mock-chat",
        served_model="mock-chat",
    )
    await shipped(client, clock, segment(records))
    (row,) = await ledger_rows(client, world.org)
    # 1200 input tokens at $0.15 and 300 output at $0.6 per million.
    assert (row["cost_usd"], row["price_source"]) == ("0.00036", "override")


async def test_refusal_has_nothing_to_price(
    client: Client, world: World, clock: ManualClock
) -> None:
    records = request(
        clock.now(),
        kind="fail",
        organization_id=world.org,
        virtual_key_id=world.key_id,
        model="fast",
        status=429,
        error_code="rate_limited",
        refused=True,
        usage_source="none",
    )
    await shipped(client, clock, segment(records))
    (row,) = await ledger_rows(client, world.org)
    assert (row["cost_usd"], row["price_source"], row["kind"]) == ("0", "none", "fail")


async def test_request_refused_before_its_key_was_known_is_still_written(
    client: Client, world: World, clock: ManualClock
) -> None:
    records = request(
        clock.now(), kind="fail", status=401, error_code="invalid_api_key", refused=True
    )
    ack = await shipped(client, clock, segment(records))
    assert (ack.accepted, ack.duplicates) == (2, 0)


# --- idempotency --------------------------------------------------------------------------------


async def test_the_same_segment_twice_leaves_the_ledger_unchanged(
    client: Client, world: World, clock: ManualClock
) -> None:
    records = [
        *served(world, clock),
        *served(world, clock, output_tokens=900),
        *served(world, clock, kind="fail", status=502, error_code="provider_error"),
    ]
    seg = segment(records)
    first = await shipped(client, clock, seg)
    rows_once = await ledger_rows(client, world.org)
    report_once = await spend_report(client, world.org, group_by="model")

    again = await shipped(client, clock, seg)

    assert (first.accepted, first.duplicates) == (6, 0)
    assert (again.segment_id, again.accepted, again.duplicates) == (seg.segment_id, 0, 6)
    assert await ledger_rows(client, world.org) == rows_once
    assert await spend_report(client, world.org, group_by="model") == report_once


async def test_a_partly_overlapping_segment_adds_only_its_new_records(
    client: Client, world: World, clock: ManualClock
) -> None:
    records = [r for _ in range(3) for r in served(world, clock)]  # 3 requests, 6 records
    await shipped(client, clock, segment(records[:4]))
    ack = await shipped(client, clock, segment(records[2:]))
    assert (ack.accepted, ack.duplicates) == (2, 2)
    rows = await ledger_rows(client, world.org)
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in records if r.kind != "admit")


async def test_records_another_replica_numbered_alike_at_the_same_time_are_not_duplicates(
    client: Client, world: World, clock: ManualClock
) -> None:
    mine = served(world, clock)
    # Another replica's records: the same numbers and times, ids of their own.
    theirs = [msgspec.structs.replace(r, id=r.id[::-1], replica_id="replica-b") for r in mine]
    await shipped(client, clock, segment(mine))
    ack = await shipped(client, clock, segment(theirs))
    # Shipped again under another segment id (as a process adopting a spool would).
    again = await shipped(client, clock, segment(theirs, segment_id="seg-adopted"))
    assert (ack.accepted, ack.duplicates) == (2, 0)
    assert (again.accepted, again.duplicates) == (0, 2)
    assert len(await ledger_rows(client, world.org)) == 2


async def test_a_record_repeated_within_a_segment_is_written_once(
    client: Client, world: World, clock: ManualClock
) -> None:
    records = served(world, clock)
    ack = await shipped(client, clock, segment([*records, records[1]]))
    assert (ack.accepted, ack.duplicates) == (2, 1)
    assert len(await ledger_rows(client, world.org)) == 1


async def test_a_record_id_reused_with_other_contents_refuses_the_segment(
    client: Client, world: World, clock: ManualClock
) -> None:
    records = served(world, clock)
    twin = msgspec.structs.replace(records[1], output_tokens=1)
    response = await ship(client, clock, segment([*records, twin]))
    error_of(response, 422, "validation_error", "records[2].id")
    assert await ledger_rows(client, world.org) == []


# --- malformed segments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"at": "yesterday"}, "records[3].at"),
        ({"at": "2026-03-10T12:00:00"}, "records[3].at"),
        ({"at": "2026-02-30T12:00:00.000000Z"}, "records[3].at"),
        ({"at": "2026-02-30T12:00:00.5+01:00"}, "records[3].at"),
        ({"at": "0001-01-01T00:30:00+01:00"}, "records[3].at"),
        ({"kind": "refund"}, "records[3].kind"),
        ({"seq": 0}, "records[3].seq"),
        ({"replica_id": "someone-else"}, "records[3].replica_id"),
        ({"usage_source": "guess"}, "records[3].usage_source"),
        ({"input_tokens": -1}, "records[3].input_tokens"),
        ({"cache_read_tokens": 5000}, "records[3].cache_read_tokens"),
        ({"latency_ms": -2.0}, "records[3].latency_ms"),
        ({"id": ""}, "records[3].id"),
    ],
)
async def test_a_malformed_record_refuses_the_whole_segment_naming_it(
    client: Client, world: World, clock: ManualClock, change: dict[str, Any], param: str
) -> None:
    records = [*served(world, clock), *served(world, clock)]
    records[3] = msgspec.structs.replace(records[3], **change)
    response = await ship(client, clock, segment(records))
    error = error_of(response, 422, "validation_error", param)
    assert param in error["message"]
    assert await ledger_rows(client, world.org) == []


async def test_a_field_of_the_wrong_type_is_refused_naming_it(
    client: Client, world: World, clock: ManualClock
) -> None:
    body = msgspec.to_builtins(segment(served(world, clock)))
    body["records"][1]["output_tokens"] = "many"
    response = await ship(client, clock, msgspec.json.encode(body))
    error_of(response, 422, "validation_error", "records[1].output_tokens")
    assert await ledger_rows(client, world.org) == []


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_request"),
        (b"", 400, "invalid_request"),
        (b'{"replica_id": "r", "records": []}', 422, "validation_error"),
    ],
)
async def test_a_body_that_is_no_segment_is_refused(
    client: Client, clock: ManualClock, body: bytes, status: int, code: str
) -> None:
    error_of(await ship(client, clock, body), status, code)


async def test_a_gzip_segment_is_the_same_segment(
    client: Client, world: World, clock: ManualClock
) -> None:
    seg = segment(served(world, clock))
    response = await ship(client, clock, seg, encoding="gzip")
    assert response.status_code == 200, response.text
    # Said on every answer of the internal API, so a proxy knows it may compress.
    assert response.headers["accept-encoding"] == "gzip"
    first = msgspec.json.decode(response.content)
    again = await shipped(client, clock, seg)
    assert (first["accepted"], first["duplicates"]) == (2, 0)
    assert (again.accepted, again.duplicates) == (0, 2)
    assert len(await ledger_rows(client, world.org)) == 1


@pytest.mark.parametrize(
    ("encoding", "body", "message"),
    [
        ("br", b"{}", "Content-Encoding 'br'"),
        ("gzip", b'{"replica_id": "r"}', "not valid gzip"),
        ("gzip", gzip.compress(b'{"segment_id": "s"}', mtime=0)[:-6], "truncated"),
        ("gzip", gzip.compress(b"{}", mtime=0) + b"more", "trailing bytes"),
        ("", b"not json", "not JSON"),
    ],
    ids=["brotli", "not-gzip", "truncated", "trailing-bytes", "empty-coding"],
)
async def test_a_body_in_another_coding_or_broken_gzip_is_refused(
    client: Client, clock: ManualClock, encoding: str, body: bytes, message: str
) -> None:
    response = await ship(client, clock, body, encoding=encoding)
    error = error_of(response, 400, "invalid_request")
    assert message in error["message"]
    # Said on a refusal too: the proxy knows the body was read, and does not send it again.
    assert response.headers["accept-encoding"] == "gzip"


async def test_a_gzip_body_inflating_past_the_limit_is_refused_unwritten(
    client: Client, world: World, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [r for _ in range(20) for r in served(world, clock)]
    body = gzip.compress(msgspec.json.encode(segment(records)))
    monkeypatch.setattr(spend_routes, "SPEND_SEGMENT_MAX_BYTES", 4 * len(body))
    error = error_of(await ship(client, clock, body, encoding="gzip"), 413, "payload_too_large")
    assert "inflates past" in error["message"]
    assert await ledger_rows(client, world.org) == []


async def test_an_unsigned_segment_is_refused_and_not_written(
    client: Client, world: World, clock: ManualClock
) -> None:
    response = await client.post(
        SPEND_COMMANDS, content=msgspec.json.encode(segment(served(world, clock)))
    )
    error_of(response, 401, "bad_signature")
    assert await ledger_rows(client, world.org) == []


async def test_an_empty_segment_is_acknowledged(client: Client, clock: ManualClock) -> None:
    ack = await shipped(client, clock, segment([]))
    assert (ack.accepted, ack.duplicates) == (0, 0)


async def test_a_segment_may_be_larger_than_the_admin_body_limit(
    settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> None:
    small = dataclasses.replace(settings, max_body_bytes=4096)
    app: Litestar = create_app(small, clock=clock, database=clean_database)
    async with serve_in_loop(app, "http://cp.test") as http:
        org = (await create(http, "/api/admin/organizations", {"name": "bulk"}))["id"]
        records = [
            r
            for i in range(100)
            for r in request(
                clock.now(), organization_id=org, served_model=SERVED, input_tokens=i + 1
            )
        ]
        body = msgspec.json.encode(segment(records))
        assert len(body) > 10 * small.max_body_bytes
        ack = await shipped(http, clock, segment(records))
        assert ack.accepted == 200
        big_admin_body = {"name": "x" * 5000}
        refused = await http.post("/api/admin/organizations", json=big_admin_body, headers=ADMIN)
        error_of(refused, 413, "payload_too_large")


# --- budgets announced --------------------------------------------------------------------------


async def test_budget_updated_is_appended_for_each_budget_the_new_rows_count_in(
    client: Client, internal: Internal, world: World, clock: ManualClock
) -> None:
    other_project = (
        await create(client, "/api/admin/projects", {"organization_id": world.org, "name": "b"})
    )["id"]
    other_provider = await add_provider(client, world.org, "offline", "mock")

    async def budget(kind: str, scope_id: str | None = None, **fields: Any) -> str:
        scope = {"kind": kind} if scope_id is None else {"kind": kind, "id": scope_id}
        body = {"organization_id": world.org, "scope": scope, "window": "month", "limit_usd": "5"}
        return str((await create(client, "/api/admin/budgets", {**body, **fields}))["id"])

    touched = {
        await budget("organization"),
        await budget("team", world.team),
        await budget("project", world.project),
        await budget("virtual_key", world.key_id),
        await budget("end_user"),
        await budget("end_user", "alice"),
        await budget("organization", provider_id=world.provider),
    }
    untouched = {
        await budget("project", other_project),
        await budget("end_user", "bob"),
        await budget("organization", provider_id=other_provider),
    }
    since = await internal.revision()

    await shipped(client, clock, segment(served(world, clock, end_user="alice")))

    events = await internal.events_since(since)
    assert {e for e in events if e[0] != "BUDGET_UPDATED"} == set()
    assert sorted(e[2] for e in events) == sorted(touched)
    assert not untouched & {e[2] for e in events}
    assert {e[1] for e in events} == {SPEND_MOVED}


async def test_rows_that_cost_nothing_announce_no_budget(
    client: Client, internal: Internal, world: World, clock: ManualClock
) -> None:
    await create(
        client,
        "/api/admin/budgets",
        {
            "organization_id": world.org,
            "scope": {"kind": "organization"},
            "window": "day",
            "limit_usd": "1",
        },
    )
    since = await internal.revision()
    refusal = request(clock.now(), kind="fail", organization_id=world.org, refused=True, status=402)
    await shipped(client, clock, segment(refusal))
    assert await internal.events_since(since) == []


async def test_shipping_again_announces_the_budgets_again(
    client: Client, internal: Internal, world: World, clock: ManualClock
) -> None:
    """A control plane that died between its ledger write and its events leaves rows nobody
    announced; the proxy ships the segment again, and this time the events go out."""
    budget = await create(
        client,
        "/api/admin/budgets",
        {
            "organization_id": world.org,
            "scope": {"kind": "organization"},
            "window": "day",
            "limit_usd": "1",
        },
    )
    seg = segment(served(world, clock))
    await shipped(client, clock, seg)
    since = await internal.revision()
    await shipped(client, clock, seg)
    assert await internal.events_since(since) == [("BUDGET_UPDATED", SPEND_MOVED, budget["id"])]


# --- admits without outcomes --------------------------------------------------------------------


async def test_an_admit_without_an_outcome_is_found_as_unfinished(
    app: Litestar, client: Client, world: World, clock: ManualClock
) -> None:
    finished = served(world, clock)
    killed = record("admit", at=clock.now() - timedelta(minutes=1), replica_id="replica-k")
    await shipped(client, clock, segment(finished))
    await shipped(client, clock, segment([killed]))

    ledger = app.state["vk"].ledger
    found = await ledger.unfinished(clock.now() - timedelta(hours=1), clock.now())
    request_ids = {row["request_id"] for row in found}
    assert killed.request_id in request_ids
    assert finished[0].request_id not in request_ids
